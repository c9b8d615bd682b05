"""Real Breakout frames through the compact layout: every sampled transition equals the recorded one.

``tests/data/breakout_steps.npz`` (made by ``benchmarks/make_breakout_steps.py``, 46 KB): two envs
of ale-py's Breakout with the DQN preprocessing, life losses ending episodes and a 60-step time
limit, 300 real transitions each. The stacks rebuilt from it are what gymnasium's
``FrameStackObservation(4)`` gives; the reference is ``test_pixels``' plain one, computed from
whole transitions. Real frames repeat and change little from step to step, as random frames do
not: the stream checks and the compiled compare meet them here.
"""

from __future__ import annotations

from collections import deque
from pathlib import Path

import numpy as np
import pytest
import torch
from test_pixels import Step, add_steps, check_batch, reference, serial_of

from rlbuf import ReplayBuffer

DATA = np.load(Path(__file__).parent / "data" / "breakout_steps.npz")
NUM_ENVS, STEPS = DATA["action"].shape[1], DATA["action"].shape[0]


def breakout_rounds(frame_stack: int) -> list[list[Step]]:
    """The recorded steps, one round (a step of both envs) at a time, as whole stacks."""
    frames = [iter(DATA[f"frames_{env}"]) for env in range(NUM_ENVS)]

    def first_stack(env: int) -> deque[np.ndarray]:
        first = next(frames[env])
        return deque([first] * frame_stack, maxlen=frame_stack)

    def as_obs(stack: deque[np.ndarray]) -> torch.Tensor:
        return torch.from_numpy(np.stack(stack) if frame_stack > 1 else stack[-1])

    stacks = [first_stack(env) for env in range(NUM_ENVS)]
    rounds = []
    for t in range(STEPS):
        steps = []
        for env in range(NUM_ENVS):
            obs = as_obs(stacks[env])
            stacks[env].append(next(frames[env]))
            terminated, truncated = bool(DATA["terminated"][t, env]), bool(DATA["truncated"][t, env])
            steps.append(Step(env, obs, int(DATA["action"][t, env]), float(DATA["reward"][t, env]),
                              as_obs(stacks[env]), terminated, truncated))
            if terminated or truncated:
                stacks[env] = first_stack(env)
        rounds.append(steps)
    return rounds


@pytest.mark.parametrize("frame_stack", [1, 4])
@pytest.mark.parametrize("n_step", [1, 3])
@pytest.mark.parametrize(("prioritized", "use_extend"), [(False, False), (True, False), (False, True)])
def test_every_real_transition_is_sampled_as_recorded(frame_stack: int, n_step: int, prioritized: bool,
                                                      use_extend: bool) -> None:
    capacity, gamma = 250, 0.9  # 600 rows written: the ring wraps twice
    buf = ReplayBuffer(capacity, obs_shape=(frame_stack, 84, 84) if frame_stack > 1 else (84, 84),
                       action_shape=(), obs_dtype=torch.uint8, num_envs=NUM_ENVS, frame_stack=frame_stack,
                       n_step=n_step, gamma=gamma, compact=True, prioritized=prioritized, seed=0)
    rounds = breakout_rounds(frame_stack)
    written = [] if use_extend else add_steps(buf, rounds[:150], use_extend=False)
    written += add_steps(buf, rounds[150:] if not use_extend else rounds, use_extend)
    assert all(sum(s.terminated or s.truncated for s in written if s.env == env) == 8 for env in range(NUM_ENVS))
    expected = reference(written, capacity, frame_stack, n_step, gamma)
    everything = buf.sample_all()
    assert sorted(serial_of(p, len(written), capacity) for p in everything.index.tolist()) == sorted(expected)
    check_batch(everything, expected, len(written), capacity)
    check_batch(buf.sample(64), expected, len(written), capacity)
