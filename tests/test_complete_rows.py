"""A compact buffer's incomplete rows (rlbuf/_complete_rows.py): found exactly near the ring's ends, never drawn,
and never in the way: ``sample`` draws in exact proportion to ``priority ** alpha`` among the complete transitions
whatever the incomplete rows hold, and a Ray shard reports the complete transitions' mass alone."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import torch
from _snapshot import same, snapshot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_pixels import FRAME, Envs, Step, reference

from rlbuf import EmptyBufferError, ReplayBuffer
from rlbuf._complete_rows import complete_mass, incomplete_positions


def _filled_shard(num_envs: int, frame_stack: int, n_step: int, capacity: int, rounds: int, seed: int,
                  **options: Any) -> tuple[Any, list[Step]]:
    """A compact Ray shard's host object after ``rounds`` adds of every env, and the steps written. Made without Ray
    running (its module imports Ray: skipped where Ray is not installed, as in the stress session)."""
    pytest.importorskip("ray")
    from rlbuf._ray_shard import ShardHost

    capacity = max(capacity, num_envs)
    shard = ShardHost(capacity=capacity, obs_shape=(frame_stack, *FRAME) if frame_stack > 1 else FRAME,
                      action_shape=(), num_envs=num_envs, obs_dtype=torch.uint8, frame_stack=frame_stack,
                      n_step=n_step, gamma=0.9, compact=True, seed=seed, **options)
    envs = Envs(num_envs, frame_stack, "reset", 0.1, np.random.default_rng(seed))
    written: list[Step] = []
    for _ in range(rounds):
        written += _add(shard.buffer, envs, [True] * num_envs)
    return shard, written


def _buffer(capacity: int, num_envs: int, frame_stack: int, n_step: int, **options: Any) -> ReplayBuffer:
    return ReplayBuffer(capacity, obs_shape=(frame_stack, *FRAME) if frame_stack > 1 else FRAME, action_shape=(),
                        num_envs=num_envs, obs_dtype=torch.uint8, frame_stack=frame_stack, n_step=n_step, gamma=0.9,
                        compact=True, **options)


def _add(buf: ReplayBuffer, envs: Envs, mask: list[bool]) -> list[Step]:
    """One add of the envs in ``mask`` (the others' rows are left out, their streams stay where they were)."""
    steps = {env: envs.step_one(env) for env in range(envs.num_envs) if mask[env]}
    idle = envs._obs(envs.stacks[0])  # any stack of the right shape: rows left out are not read
    rows = [steps.get(env) for env in range(envs.num_envs)]
    buf.add(torch.stack([idle if s is None else s.obs for s in rows]),
            torch.tensor([0.0 if s is None else float(s.action) for s in rows]),
            torch.tensor([0.0 if s is None else s.reward for s in rows]),
            torch.stack([idle if s is None else s.next_obs for s in rows]),
            torch.tensor([False if s is None else s.terminated for s in rows]),
            torch.tensor([False if s is None else s.truncated for s in rows]), env_mask=np.array(mask))
    return [steps[env] for env in sorted(steps)]


def _truncate(buf: ReplayBuffer, envs: Envs, written: list[Step], mask: list[bool]) -> None:
    """``truncate_episodes`` of the envs in ``mask``: the newest step of each, unless it ended its episode, is
    truncated, and the env resets."""
    buf.truncate_episodes(np.array(mask))
    for env in np.flatnonzero(mask).tolist():
        newest = max((serial for serial, step in enumerate(written) if step.env == env), default=None)
        if newest is not None and not (written[newest].terminated or written[newest].truncated):
            written[newest] = replace(written[newest], truncated=True)
        envs.stacks[env] = envs._reset()


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    num_envs=st.integers(1, 3),
    frame_stack=st.sampled_from([1, 2, 3]),
    n_step=st.sampled_from([1, 2, 3]),
    capacity=st.integers(4, 90),
    end_chance=st.sampled_from([0.0, 0.15]),
    rounds=st.integers(1, 150),
    left_out=st.sampled_from([0.0, 0.25]),
    idle_from=st.integers(0, 150),
    away=st.tuples(st.integers(0, 150), st.integers(0, 120)),
    truncate_chance=st.sampled_from([0.0, 0.05]),
    reload_at=st.integers(0, 150),
    seed=st.integers(0, 2**16),
)
def test_incomplete_positions_are_exactly_the_stored_rows_that_are_no_complete_transition(
    num_envs: int, frame_stack: int, n_step: int, capacity: int, end_chance: float, rounds: int, left_out: float,
    idle_from: int, away: tuple[int, int], truncate_chance: float, reload_at: int, seed: int,
) -> None:
    """Checked after every round: envs that stop adding (the last from ``idle_from``: from the start, it never
    adds) or are left out of adds for long (the first, ``away``: from round, for rounds), episodes truncated,
    the ring wrapped, a checkpoint loaded into a fresh buffer."""
    capacity = max(capacity, num_envs)
    rng = np.random.default_rng(seed)
    envs = Envs(num_envs, frame_stack, "reset", end_chance, rng)
    buf = _buffer(capacity, num_envs, frame_stack, n_step)
    written: list[Step] = []
    for round_ in range(rounds):
        mask = (rng.random(num_envs) >= left_out).tolist()
        mask[-1] = mask[-1] and round_ < idle_from  # the last env may stop adding
        mask[0] = mask[0] and not away[0] <= round_ < away[0] + away[1]  # the first may be left out for long
        if any(mask):
            written += _add(buf, envs, mask)
        if rng.random() < truncate_chance:
            _truncate(buf, envs, written, (rng.random(num_envs) < 0.5).tolist())
        if round_ == reload_at:
            fresh = _buffer(capacity, num_envs, frame_stack, n_step)
            fresh.load_state_dict(buf.state_dict())
            buf = fresh
        complete = {serial % capacity for serial in reference(written, capacity, frame_stack, n_step, 0.9)}
        want = sorted(set(range(len(buf))) - complete)
        with buf._ring.lock:
            buf._ring.flush()
            assert incomplete_positions(buf._compact).tolist() == want, round_


def _waiting_buffer(alpha: float, **options: Any) -> ReplayBuffer:
    """Rows 0-8 complete, rows 9-11 waiting for their n steps (frame_stack=2, n_step=3, one env)."""
    buf = _buffer(16, 1, 2, 3, prioritized=True, alpha=alpha, beta=0.5, seed=3, **options)
    envs = Envs(1, 2, "reset", 0.0, np.random.default_rng(0))
    for _ in range(12):
        _add(buf, envs, [True])
    assert buf.sample_all().index.tolist() == list(range(9))
    return buf


@pytest.mark.parametrize(("alpha", "waiting"), [(0.6, 1e90), (1.0, 1e3), (1.0, 60.0)],
                         ids=["nearly-all-mass-waits", "most-mass-waits", "some-slots-redrawn"])
def test_sample_draws_in_exact_proportion_among_complete_transitions_whatever_waiting_rows_hold(
    alpha: float, waiting: float,
) -> None:
    buf = _waiting_buffer(alpha)
    complete = np.arange(1.0, 10.0)  # rows 0-8
    buf.update_priority(list(range(12)), [*complete.tolist(), waiting, waiting, waiting])
    counts = np.zeros(16, np.int64)
    for _ in range(40):
        batch = buf.sample(512)
        np.add.at(counts, batch.index.numpy(), 1)
        # weights normalised over the complete transitions, as sample_by_index gives them
        assert torch.equal(batch.weight, buf.sample_by_index(batch.index).weight)
    assert counts[9:].sum() == 0
    q = (complete + 1e-8) ** alpha
    expected = counts.sum() * q / q.sum()
    chi_square = float((((counts[:9] - expected) ** 2) / expected).sum())
    assert chi_square < 33.7  # the 0.9999 quantile with 8 degrees of freedom (seeded: the same draws every run)


def test_the_weights_of_a_draw_among_complete_transitions_are_those_sample_by_index_gives() -> None:
    buf = _waiting_buffer(1.0)
    buf.update_priority(list(range(12)), [*[2.0] * 8, 0.5, 1e90, 1e90, 1e90])
    batch = buf.sample(64)
    assert set(batch.index.tolist()) <= set(range(9))
    want = {position: (1.0 if position == 8 else (2.0 / 0.5) ** -0.5) for position in range(9)}
    assert batch.weight.tolist() == pytest.approx([want[p] for p in batch.index.tolist()], rel=1e-6)


def test_a_sample_with_no_complete_transition_is_refused_and_changes_nothing() -> None:
    buf = _buffer(16, 1, 2, 3, prioritized=True, seed=0)
    envs = Envs(1, 2, "reset", 0.0, np.random.default_rng(0))
    for _ in range(3):
        _add(buf, envs, [True])
    buf.update_priority([0, 1, 2], [1e90, 1e90, 1e90])
    before = snapshot(buf)
    with pytest.raises(EmptyBufferError, match="no transition is complete yet"):
        buf.sample(8)
    assert same(snapshot(buf), before)


def test_a_uniform_buffer_draws_uniformly_among_complete_transitions_when_most_rows_wait() -> None:
    buf = _buffer(16, 6, 1, 2, seed=0)  # n_step=2: rows 0 and 1 complete, the other 12 wait for their next steps
    envs = Envs(6, 1, "reset", 0.0, np.random.default_rng(0))
    for mask in ([True] * 6, [True] * 6, [True, True, False, False, False, False]):
        _add(buf, envs, mask)
    assert buf.sample_all().index.tolist() == [0, 1]
    counts = np.bincount(buf.sample(4096).index.numpy(), minlength=16)
    assert np.flatnonzero(counts).tolist() == [0, 1]
    assert float(((counts[:2] - 2048) ** 2 / 2048).sum()) < 15.1  # the 0.9999 quantile, 1 dof (seeded)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    num_envs=st.integers(1, 2),
    frame_stack=st.sampled_from([1, 2, 3]),
    n_step=st.sampled_from([1, 2, 3]),
    capacity=st.integers(4, 60),
    rounds=st.integers(1, 50),
    priorities=st.lists(st.floats(0.0, 1e6), min_size=1, max_size=60),
    seed=st.integers(0, 2**16),
)
def test_a_compact_shard_reports_the_mass_of_its_complete_transitions_alone(
    num_envs: int, frame_stack: int, n_step: int, capacity: int, rounds: int, priorities: list[float], seed: int,
) -> None:
    shard, written = _filled_shard(num_envs, frame_stack, n_step, capacity, rounds, seed, prioritized=True, alpha=0.7)
    capacity, buf = max(capacity, num_envs), shard.buffer
    stored = len(buf)
    raw = (priorities * stored)[:stored]
    buf.update_priority(list(range(stored)), raw)
    complete = [serial % capacity for serial in reference(written, capacity, frame_stack, n_step, 0.9)]
    want = sum((raw[position] + 1e-8) ** 0.7 for position in complete)
    assert shard.shard_stats()["mass"] == pytest.approx(want, rel=1e-9, abs=1e-300)


def test_the_complete_mass_is_summed_over_the_complete_rows_when_waiting_rows_hold_nearly_all_of_it() -> None:
    buf = _waiting_buffer(1.0)
    buf.update_priority(list(range(12)), [1.0] * 9 + [1e90] * 3)
    sampler = buf._ring.rb.sampler
    _, total, _ = sampler.sampled_mass(buf._ring.rb.storage)
    assert complete_mass(buf._compact, sampler, total) == pytest.approx(9 * (1.0 + 1e-8))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    num_envs=st.integers(1, 3),
    frame_stack=st.sampled_from([1, 2, 3]),
    n_step=st.sampled_from([1, 2, 3]),
    capacity=st.integers(4, 60),
    rounds=st.integers(1, 50),
    seed=st.integers(0, 2**16),
)
def test_a_uniform_compact_shard_reports_the_count_of_its_complete_transitions_as_its_mass(
    num_envs: int, frame_stack: int, n_step: int, capacity: int, rounds: int, seed: int,
) -> None:
    """The service splits a uniform batch by the shards' masses: a shard's rows waiting for their n steps (or whose
    stacks were overwritten) are never drawn, so they weigh nothing; a shard holding none complete is not asked."""
    shard, written = _filled_shard(num_envs, frame_stack, n_step, capacity, rounds, seed)
    capacity = max(capacity, num_envs)
    complete = {serial % capacity for serial in reference(written, capacity, frame_stack, n_step, 0.9)}
    stats = shard.shard_stats()
    assert (stats["size"], stats["mass"]) == (len(shard.buffer), float(len(complete)))


def test_a_row_whose_stack_reaches_an_overwritten_row_from_the_ring_middle_is_found_incomplete() -> None:
    """An env left out of many adds (env_mask) then ending its episode: its row sits in the ring's middle, past both
    windows, with its stack's older frame overwritten; the oldest window holding none of that env's rows sends the
    search over every row."""
    buf = _buffer(40, 2, 2, 1)
    envs = Envs(2, 2, "reset", 0.0, np.random.default_rng(0))
    _add(buf, envs, [True, True])             # serials 0, 1
    for _ in range(49):
        _add(buf, envs, [True, False])        # serials 2-50: env 0 alone
    envs.end_chance = 1.0
    _add(buf, envs, [False, True])            # serial 51: env 1's episode ends; its stack's older frame is serial 1
    envs.end_chance = 0.0
    for _ in range(20):
        _add(buf, envs, [True, False])        # serial 51 now in the middle: oldest 32, written 72
    with buf._ring.lock:
        buf._ring.flush()
        assert 51 % 40 in incomplete_positions(buf._compact).tolist()


def test_the_oldest_row_waiting_for_its_next_steps_is_found_when_an_env_never_adds() -> None:
    """The oldest stored row starts an open episode whose second row is the newest: it waits for its n steps and
    its stack reaches nothing overwritten; env 1 never adds, so the rows whose stacks reach overwritten rows are
    found by a scan, not among the oldest rows, and the waiting row is found from its episode's newest row alone."""
    buf = _buffer(40, 3, 2, 2)
    envs = Envs(3, 2, "reset", 1.0, np.random.default_rng(0))
    written = _add(buf, envs, [True, False, False])           # serial 0: env 0's episode ends
    envs.end_chance = 0.0
    written += _add(buf, envs, [True, False, False])          # serial 1: env 0's episode starts
    for _ in range(38):
        written += _add(buf, envs, [False, False, True])      # serials 2-39: env 2 alone
    written += _add(buf, envs, [True, False, False])          # serial 40: env 0's second row; oldest 1
    complete = {serial % 40 for serial in reference(written, 40, 2, 2, 0.9)}
    with buf._ring.lock:
        buf._ring.flush()
        found = incomplete_positions(buf._compact).tolist()
    assert 1 in found
    assert found == sorted(set(range(40)) - complete)


@pytest.mark.parametrize("frame_stack", [1, 2])
@pytest.mark.parametrize("n_step", [1, 2, 3])
@pytest.mark.parametrize("back_at", [None, 10, 15])
def test_an_env_away_since_the_oldest_row_has_its_waiting_rows_found(frame_stack: int, n_step: int,
                                                                     back_at: int | None) -> None:
    """Env 1 adds the oldest row (serial 0), then env 0 alone, then env 1 again (at ``back_at``, or never): env 1's
    open episode ends at the oldest row, or its newest row's predecessor lies far before the newest rows."""
    buf = _buffer(20, 2, frame_stack, n_step)
    envs = Envs(2, frame_stack, "reset", 0.0, np.random.default_rng(0))
    written = _add(buf, envs, [False, True])
    for serial in range(1, 20):
        written += _add(buf, envs, [serial != back_at, serial == back_at])
    complete = {serial % 20 for serial in reference(written, 20, frame_stack, n_step, 0.9)}
    with buf._ring.lock:
        buf._ring.flush()
        found = incomplete_positions(buf._compact).tolist()
    assert (0 in found) == (back_at is None or n_step > 1)
    assert found == sorted(set(range(20)) - complete)
