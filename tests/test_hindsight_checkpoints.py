"""Checkpoints of a hindsight buffer: the episode index a load derives equals the live one, the same
relabelled batches resume, forged episode tables and running episodes are refused unchanged, a loaded
buffer refuses what its live twin refuses; ``rlbuf inspect`` and ``nbytes`` of one.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from _hindsight_reference import (
    MASKED_ENDS,
    SENTINEL,
    STRATEGIES,
    add_step,
    fill,
    fill_into,
    goal_buffer,
    reached,
    steps,
)
from _snapshot import same, snapshot
from hypothesis import given, settings
from hypothesis import strategies as st

from rlbuf import CheckpointError, ConfigError, ReplayBuffer, StreamError
from rlbuf._replay_layout import human_bytes


@MASKED_ENDS
@settings(max_examples=30, deadline=None)
@given(steps, st.sampled_from(STRATEGIES), st.lists(st.booleans(), min_size=3, max_size=3))
def test_a_checkpoint_derives_the_index_the_live_buffer_keeps(case: Any, strategy: str, reset: list[bool]) -> None:
    """Loaded, the same goal and n-step rows for every stored row, and ``truncate_episodes`` marks the
    same rows (an extend that wraps the ring once left the live index behind)."""
    n, capacity, plan = case
    buf, _ = fill(n, capacity, plan, strategy)
    loaded = goal_buffer(capacity, n, strategy)
    loaded.load_state_dict(buf.state_dict())
    live, derived = (b._relabeller.episodes for b in (buf, loaded))  # type: ignore[union-attr]
    positions = buf.sample_all().index.numpy()
    uniform = np.random.default_rng(0).random(len(positions))
    for name in STRATEGIES:
        assert np.array_equal(live.goal_rows(positions, name, uniform), derived.goal_rows(positions, name, uniform))
    assert all(np.array_equal(a, b) for a, b in zip(live.window(positions, 3), derived.window(positions, 3), strict=True))
    for target in (buf, loaded):
        target.truncate_episodes(torch.tensor(reset[:n]))
    assert torch.equal(buf.sample_all().truncated, loaded.sample_all().truncated)


def test_checkpoints_resume_the_same_relabelled_batches(tmp_path: Path) -> None:
    buf, _ = fill(3, 20, [([True, e % 2 == 0, True], [e % 4, 1, e % 5], [True, False, False]) for e in range(30)])
    buf.save(tmp_path / "ckpt")
    loaded = ReplayBuffer.load(tmp_path / "ckpt", reward_fn=reached)
    for _ in range(3):
        a, b = buf.sample(16), loaded.sample(16)
        assert torch.equal(a.index, b.index) and torch.equal(a.reward, b.reward)
        assert torch.equal(a.obs["desired_goal"], b.obs["desired_goal"])
    live, derived = (x._relabeller.episodes for x in (buf, loaded))  # type: ignore[union-attr]
    positions, uniform = np.arange(20), np.random.default_rng(1).random(20)
    for strategy in STRATEGIES:
        assert np.array_equal(live.goal_rows(positions, strategy, uniform), derived.goal_rows(positions, strategy, uniform))
    with pytest.raises(CheckpointError, match=r"reward_fn=env\.unwrapped\.compute_reward"):
        ReplayBuffer.load(tmp_path / "ckpt")


def test_a_reward_fn_that_is_no_function_is_refused_before_the_checkpoint_is_read(tmp_path: Path) -> None:
    buf, _ = fill(1, 8, [([True], [1], [False])] * 3)
    buf.save(tmp_path / "ckpt")
    for path in (tmp_path / "ckpt", tmp_path / "nothing here"):
        with pytest.raises(ConfigError, match=r"^reward_fn: expected the hindsight reward function .* got 5$"):
            ReplayBuffer.load(path, reward_fn=5)


@pytest.mark.parametrize("forge", ["out of range", "wrong length", "missing", "float"])
def test_forged_episode_tables_are_refused(forge: str) -> None:
    buf, _ = fill(2, 12, [([True, True], [1, 2], [False, False])] * 8)
    state = buf.state_dict()
    env = state["extra"]["episodes"]["env"]
    state["extra"]["episodes"] = {"out of range": {"env": env + 2}, "wrong length": {"env": env[:-1]},
                                  "missing": {}, "float": {"env": env.double()}}[forge]
    target = goal_buffer(12, 2)
    before = snapshot(target)
    with pytest.raises(CheckpointError, match="hindsight"):
        target.load_state_dict(state)
    assert same(before, snapshot(target))


def test_a_checkpoint_whose_envs_break_an_episode_is_refused() -> None:
    buf, _ = fill(2, 12, [([True, True], [1, 2], [False, False])] * 4)
    state = buf.state_dict()
    env = state["extra"]["episodes"]["env"].clone()
    env[2], env[3] = env[3].item(), env[2].item()   # two rows handed to the other env: envs still in range
    state["extra"]["episodes"] = {"env": env}
    with pytest.raises(CheckpointError, match="does not continue row"):
        goal_buffer(12, 2).load_state_dict(state)


def fresh_step(buf: ReplayBuffer, env: int, n: int) -> bool:
    """Add a step of ``env`` alone that continues nothing; whether the buffer took it."""
    start = torch.full((n, 2), 1000.0 + env)
    obs = {"observation": start[:, :1], "achieved_goal": start, "desired_goal": torch.full((n, 2), SENTINEL)}
    try:
        buf.add(obs, torch.zeros(n), torch.zeros(n), obs, torch.arange(n) == env, False,
                env_mask=torch.arange(n) == env)
    except StreamError:
        return False
    return True


@MASKED_ENDS
@settings(max_examples=30, deadline=None)
@given(steps)
def test_a_loaded_buffer_refuses_the_steps_its_live_twin_refuses(case: Any) -> None:
    """Also for an env whose running episode has no stored row left (all overwritten)."""
    n, capacity, plan = case
    buf, _ = fill(n, capacity, plan)
    loaded = goal_buffer(capacity, n)
    loaded.load_state_dict(buf.state_dict())
    for env in range(n):
        assert fresh_step(buf, env, n) == fresh_step(loaded, env, n), env


def test_a_running_episode_whose_rows_were_all_overwritten_survives_a_checkpoint(tmp_path: Path) -> None:
    buf, ref = fill(2, 4, [([True, True], [1, 1], [False, False])])      # env 1's episode runs on
    fill_into(buf, ref, [([True, False], [1, 1], [False, False])] * 5)  # env 1 left out: its row overwritten
    buf.save(tmp_path / "ckpt")
    loaded = ReplayBuffer.load(tmp_path / "ckpt", reward_fn=reached)
    assert not fresh_step(buf, 1, 2) and not fresh_step(loaded, 1, 2)
    add_step(loaded, ref, [True, True], [False, False], [False, False])  # env 1's episode goes on
    assert len(loaded) == 4


def _flip_running(state: dict[str, Any]) -> None:
    state["running"][1] = ~state["running"][1]


FORGED_RUNNING = {
    "running flipped": _flip_running,
    "next_obs changed": lambda state: state["next_obs"]['next_obs["observation"]'][1].add_(1.0),
    "not zeros": lambda state: state["next_obs"]['next_obs["achieved_goal"]'][0].fill_(3.0),
    "running dtype": lambda state: state.update(running=state["running"].long()),
    "next_obs shape": lambda state: state["next_obs"].update({'next_obs["observation"]': torch.zeros(2, 2)}),
    "next_obs key": lambda state: state["next_obs"].pop('next_obs["desired_goal"]'),
    "next_obs missing": lambda state: state.pop("next_obs"),
}


@pytest.mark.parametrize("forge", list(FORGED_RUNNING))
def test_forged_running_episodes_are_refused(forge: str) -> None:
    """Each env's running flag and next_obs are its newest stored row's: any other is refused."""
    buf, _ = fill(2, 12, [([True, True], [1, 2], [False, False])] * 3 + [([True, True], [0, 2], [False, False])])
    state = buf.state_dict()
    FORGED_RUNNING[forge](state["extra"]["episodes"])
    target = goal_buffer(12, 2)
    before = snapshot(target)
    with pytest.raises(CheckpointError, match=r"hindsight: .*episodes"):
        target.load_state_dict(state)
    assert same(before, snapshot(target))


def test_a_running_flag_for_an_env_that_never_stored_a_row_is_refused() -> None:
    buf, _ = fill(2, 12, [([True, False], [1, 1], [False, False])] * 3)
    state = buf.state_dict()
    state["extra"]["episodes"]["running"][1] = True
    with pytest.raises(CheckpointError, match="env 1's episode runs, but no row of it was ever stored"):
        goal_buffer(12, 2).load_state_dict(state)


def test_a_checkpoint_of_only_the_envs_loads_its_running_episodes_from_the_stored_rows() -> None:
    """Checkpoints saved before the running episodes were: the episodes running in the stored rows go on."""
    buf, ref = fill(2, 12, [([True, True], [1, 1], [False, False])] * 3)
    state = buf.state_dict()
    state["extra"]["episodes"] = {"env": state["extra"]["episodes"]["env"]}
    loaded = goal_buffer(12, 2)
    loaded.load_state_dict(state)
    assert not fresh_step(loaded, 0, 2)
    add_step(loaded, ref, [True, True], [False, False], [False, False])
    assert len(loaded) == 8


def test_rlbuf_inspect_names_the_hindsight_settings_and_how_to_load(tmp_path: Path) -> None:
    from rlbuf._inspect import format_report, inspect_checkpoint

    buf, _ = fill(2, 12, [([True, True], [1, 2], [False, False])] * 3, "final", 0.5)
    buf.save(tmp_path / "ckpt")
    report = inspect_checkpoint(tmp_path / "ckpt")
    assert report["ok"] and report["hindsight"] == {"strategy": "final", "ratio": 0.5}
    assert "hindsight   final, ratio 0.5  (load with ReplayBuffer.load(path, reward_fn=...))" in format_report(report)


def test_rlbuf_inspect_counts_a_hindsight_buffer_with_n_step_as_not_compact(tmp_path: Path) -> None:
    from rlbuf._inspect import inspect_checkpoint

    buf = goal_buffer(16, 2, n_step=3)
    assert not buf.compact
    buf.save(tmp_path / "ckpt")
    estimate = inspect_checkpoint(tmp_path / "ckpt")["bytes_per_transition"]
    assert f"bytes_per_transition~{human_bytes(estimate)}," in repr(buf)
    assert estimate == sum(math.prod(spec.shape) * spec.dtype.itemsize for spec in buf._ring.specs)


def test_nbytes_counts_the_episode_index() -> None:
    buf = goal_buffer(64, 2)
    plain = ReplayBuffer(64, obs_shape={"observation": 1, "achieved_goal": 2, "desired_goal": 2}, action_shape=(),
                         num_envs=2)
    index = buf._relabeller.episodes  # type: ignore[union-attr]
    assert buf.nbytes - plain.nbytes >= index.nbytes > 64 * 8 * 4
