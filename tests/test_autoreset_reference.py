"""The NEXT_STEP reset-step warning against a plain reference, whatever types the flags come in.

Reference: an env's step is a reset step when its previous stored row ended (terminated or
truncated), its ``obs`` equals that row's ``next_obs``, its reward is 0 and it has no flag. The
buffer must warn at the first such step and at no other, with flags given as Python bools, numpy
bools, 0-d or 1-d arrays or tensors, mixed within one call.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlbuf import NextStepResetWarning, ReplayBuffer


def _as(kind: str, flag: bool) -> object:
    return {"py": flag, "np": np.bool_(flag), "arr": np.array([flag]), "torch": torch.tensor([flag])}[kind]


flag_kinds = st.sampled_from(["py", "np", "arr", "torch"])
steps = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2), st.sampled_from([0.0, 1.0]), st.booleans(),
                           st.booleans(), flag_kinds, flag_kinds), min_size=1, max_size=25)


@settings(max_examples=150, deadline=None)
@given(steps)
def test_the_warning_comes_exactly_at_the_first_reset_step_of_the_reference(given_steps):
    buffer = ReplayBuffer(100, obs_shape=(1,), action_shape=(), seed=0)
    expected_at = None
    previous: tuple[bool, int] | None = None  # (ended, next_obs) of the last stored row
    for i, (obs, next_obs, reward, terminated, truncated, _, _) in enumerate(given_steps):
        if (expected_at is None and previous is not None and previous[0] and obs == previous[1] and reward == 0.0
                and not terminated and not truncated):
            expected_at = i
        previous = (terminated or truncated, next_obs)
    warned_at = None
    for i, (obs, next_obs, reward, terminated, truncated, kind_te, kind_tr) in enumerate(given_steps):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            buffer.add(np.array([obs], np.float32), 0.0, reward, np.array([next_obs], np.float32),
                       _as(kind_te, terminated), _as(kind_tr, truncated))
        if any(issubclass(w.category, NextStepResetWarning) for w in caught):
            assert warned_at is None, "warned twice"
            warned_at = i
    assert warned_at == expected_at
    assert len(buffer) == len(given_steps)
