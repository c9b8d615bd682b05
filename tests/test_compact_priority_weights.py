"""A prioritized compact buffer (frame stacks, n-step returns) normalises its importance weights over the
transitions it can draw: ``(N * P(i)) ** -beta / max_j (N * P(j)) ** -beta`` with ``j`` over the complete
transitions only, as a buffer storing whole transitions would (it holds no row of an incomplete one). Rows
that wait for their next steps, or whose older frames were overwritten, are never drawn, so their priorities
(set by the user, or kept from when the row was complete) must not scale the weights."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_pixels import FRAME, Envs, add_steps, reference, serial_of

from rlbuf import ReplayBuffer


def _weights(q: dict[int, float], complete: list[int], serials: list[int], beta: float) -> list[float]:
    """Plain ``(q_i / min_j q_j) ** -beta``, ``j`` over the complete transitions."""
    smallest = min(q[serial] for serial in complete)
    return [(q[serial] / smallest) ** -beta for serial in serials]


def _close(got: list[float], want: list[float]) -> bool:
    tiny = float(torch.finfo(torch.float32).tiny)
    return all(math.isclose(g, w, rel_tol=1e-5, abs_tol=tiny) for g, w in zip(got, want, strict=True))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    num_envs=st.integers(1, 2),
    frame_stack=st.sampled_from([1, 2, 3]),
    n_step=st.sampled_from([1, 2, 3]),
    capacity=st.integers(3, 14),
    alpha=st.sampled_from([0.6, 1.0]),
    beta=st.sampled_from([0.4, 1.0]),
    end_chance=st.sampled_from([0.0, 0.3]),
    chunks=st.lists(st.tuples(st.integers(1, 6), st.lists(st.tuples(st.integers(0, 13), st.floats(0.1, 50.0)),
                                                           max_size=6)), min_size=1, max_size=5),
    seed=st.integers(0, 2**16),
)
def test_weights_are_normalised_over_the_complete_transitions(
    num_envs: int, frame_stack: int, n_step: int, capacity: int, alpha: float, beta: float, end_chance: float,
    chunks: list[tuple[int, list[tuple[int, float]]]], seed: int,
) -> None:
    capacity = max(capacity, num_envs)
    envs = Envs(num_envs, frame_stack, "reset", end_chance, np.random.default_rng(seed))
    buf = ReplayBuffer(capacity, obs_shape=(frame_stack, *FRAME) if frame_stack > 1 else FRAME, action_shape=(),
                       num_envs=num_envs, obs_dtype=torch.uint8, frame_stack=frame_stack, n_step=n_step, gamma=0.9,
                       compact=True, prioritized=True, alpha=alpha, beta=beta, seed=seed)
    eps = float(buf._ring.rb.sampler.state_dict()["eps"])
    written: list[Any] = []
    priority: dict[int, float] = {}  # raw priority by serial; new rows get the largest seen, 1 at first (TorchRL's)
    largest = 1.0
    for rounds, updates in chunks:
        before = len(written)
        written += add_steps(buf, [envs.step() for _ in range(rounds)], use_extend=False)
        for serial in range(before, len(written)):
            priority[serial] = largest
        for row, value in updates:  # any stored row, complete or not (e.g. a priority set for every stored row)
            if row < len(buf):
                buf.update_priority([row], [value])
                priority[serial_of(row, len(written), capacity)] = value
                largest = max(largest, value)
    complete = sorted(reference(written, capacity, frame_stack, n_step, 0.9))
    if not complete:
        return
    q = {serial: (p + eps) ** alpha for serial, p in priority.items()}
    batch = buf.sample(32)
    serials = [serial_of(position, len(written), capacity) for position in batch.index.tolist()]
    assert _close(batch.weight.tolist(), _weights(q, complete, serials, beta))
    positions = [position % capacity for position in complete]
    assert _close(buf.sample_by_index(positions).weight.tolist(), _weights(q, complete, complete, beta))


def test_a_small_priority_on_a_row_that_waits_for_its_next_steps_leaves_the_weights_alone() -> None:
    buf = ReplayBuffer(16, obs_shape=(2, 1), action_shape=(), frame_stack=2, n_step=3, gamma=0.9, compact=True,
                       prioritized=True, alpha=1.0, beta=0.5, seed=0)
    for t in range(10):
        buf.add(torch.tensor([[max(t - 1.0, 0.0)], [float(t)]]), 0.0, 1.0, torch.tensor([[float(t)], [t + 1.0]]),
                False, truncated=False)
    assert buf.sample_all().index.tolist() == list(range(7))  # rows 7-9 wait for their n steps
    buf.update_priority(list(range(10)), [4.0] * 7 + [0.01] * 3)
    assert buf.sample(8).weight.tolist() == [1.0] * 8  # every drawable transition is equally likely
