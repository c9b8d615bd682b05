"""``read_only``: every write refused before it changes anything; reads, samples and priorities go on."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from _snapshot import same, snapshot
from tensordict import TensorDict

from rlbuf import (
    ConfigError,
    DistillationBuffer,
    Hindsight,
    ReadOnlyError,
    ReplayBuffer,
    RolloutBuffer,
)
from rlbuf.mixing import MixedReplay

ENVS = 2


def replay_step(buf: ReplayBuffer, t: int) -> None:
    """One step of each env; each env's observation continues from its previous next_obs."""
    obs = torch.full((ENVS, 3), float(t)) + torch.arange(ENVS)[:, None] * 100
    buf.add(obs, torch.zeros(ENVS), torch.ones(ENVS), obs + 1, torch.zeros(ENVS, dtype=torch.bool),
            truncated=torch.tensor([t % 4 == 3] * ENVS))


def goal_reward(achieved: np.ndarray, desired: np.ndarray, info: Any) -> np.ndarray:
    return -(achieved != desired).any(-1).astype(np.float32)


def goal_step(buf: ReplayBuffer, t: int) -> None:
    def goal_obs(x: float) -> dict[str, torch.Tensor]:
        return {"observation": torch.full((ENVS, 2), x), "achieved_goal": torch.full((ENVS, 2), x),
                "desired_goal": torch.full((ENVS, 2), 9.0)}
    buf.add(goal_obs(float(t)), torch.zeros(ENVS), torch.full((ENVS,), -1.0), goal_obs(t + 1.0),
            torch.zeros(ENVS, dtype=torch.bool), truncated=torch.tensor([t % 4 == 3] * ENVS))


REPLAYS: dict[str, Callable[[], ReplayBuffer]] = {
    "plain": lambda: ReplayBuffer(16, obs_shape=(3,), action_shape=(), num_envs=ENVS, seed=0),
    "prioritized": lambda: ReplayBuffer(16, obs_shape=(3,), action_shape=(), num_envs=ENVS, prioritized=True,
                                        seed=0),
    "compact": lambda: ReplayBuffer(16, obs_shape=(3,), action_shape=(), num_envs=ENVS, n_step=2, seed=0),
}


def replay_writes(buf: ReplayBuffer, t: int) -> dict[str, Callable[[], Any]]:
    """Each public write of a replay buffer, with values it would otherwise take (step ``t`` of each env)."""
    state = buf.state_dict()
    obs = torch.full((ENVS, 3), float(t)) + torch.arange(ENVS)[:, None] * 100
    td = TensorDict({"observation": obs, "action": torch.zeros(ENVS),
                     "next": {"observation": obs + 1, "reward": torch.ones(ENVS, 1),
                              "terminated": torch.zeros(ENVS, 1, dtype=torch.bool),
                              "truncated": torch.zeros(ENVS, 1, dtype=torch.bool)}},
                    batch_size=[ENVS])
    writes: dict[str, Callable[[], Any]] = {
        "add": lambda: replay_step(buf, t),
        "extend": lambda: buf.extend(td.unsqueeze(1) if buf.compact else td),
        "truncate_episodes": buf.truncate_episodes,
        "load_state_dict": lambda: buf.load_state_dict(state),
        "clear": buf.clear,
    }
    if not buf.compact:
        writes |= {"torchrl.extend": lambda: buf.torchrl.extend(td), "torchrl.add": lambda: buf.torchrl.add(td[0]),
                   "torchrl.__setitem__": lambda: buf.torchrl.__setitem__(0, td[0]),
                   "torchrl.empty": buf.torchrl.empty}
    return writes


def assert_refused(buf: Any, writes: dict[str, Callable[[], Any]]) -> None:
    """Mark ``buf`` read-only; each write must raise ``ReadOnlyError`` naming its call and change nothing."""
    buf.read_only = True
    before = snapshot(buf)
    for call, write in writes.items():
        with pytest.raises(ReadOnlyError, match=rf"^{call.removeprefix('torchrl.')}: this buffer is read-only"):
            write()
        assert same(snapshot(buf), before), call


@pytest.mark.parametrize("kind", list(REPLAYS))
def test_a_read_only_replay_refuses_every_write_and_changes_nothing(kind: str, tmp_path: Path) -> None:
    buf = REPLAYS[kind]()
    for t in range(6):
        replay_step(buf, t)
    writes = replay_writes(buf, 6)
    assert_refused(buf, writes)
    # Reads go on: samples (with their generator), saves, priorities.
    batch = buf.sample(4)
    buf.save(tmp_path / "saved")
    if buf.prioritized:
        buf.update_priority(batch.index, torch.full((4,), 5.0))
    assert buf.read_only and len(buf) == len(ReplayBuffer.load(tmp_path / "saved"))
    buf.read_only = False  # writable again: the same writes are taken
    writes["add"]()
    writes["truncate_episodes"]()
    replay_writes(buf, 0)["extend"]()  # after the cut, each env's stream starts anew
    writes["clear"]()
    assert len(buf) == 0


def test_a_read_only_hindsight_buffer_refuses_every_write() -> None:
    buf = ReplayBuffer(16, obs_shape={"observation": (2,), "achieved_goal": (2,), "desired_goal": (2,)},
                       action_shape=(), num_envs=ENVS, hindsight=Hindsight("future", 0.5, goal_reward), seed=0)
    for t in range(6):
        goal_step(buf, t)
    assert_refused(buf, {"add": lambda: goal_step(buf, 6), "truncate_episodes": buf.truncate_episodes,
                        "clear": buf.clear})
    assert len(buf.sample(8)) == 8


def test_a_read_only_rollout_refuses_every_write_and_changes_nothing() -> None:
    buf = RolloutBuffer(2, ENVS, obs_shape=(3,), action_shape=(), seed=0)

    def step() -> None:
        buf.add(torch.zeros(ENVS, 3), torch.zeros(ENVS), torch.ones(ENVS), torch.zeros(ENVS, dtype=torch.bool),
                torch.zeros(ENVS), torch.zeros(ENVS), truncated=False)

    step()
    td = TensorDict({"observation": torch.zeros(ENVS, 1, 3), "action": torch.zeros(ENVS, 1),
                     "state_value": torch.zeros(ENVS, 1, 1), "sample_log_prob": torch.zeros(ENVS, 1),
                     "next": {"reward": torch.ones(ENVS, 1, 1), "terminated": torch.zeros(ENVS, 1, 1, dtype=torch.bool),
                              "truncated": torch.zeros(ENVS, 1, 1, dtype=torch.bool)}}, batch_size=[ENVS, 1])
    step()
    state = buf.state_dict()
    writes = {"compute_returns_and_advantages": lambda: buf.compute_returns_and_advantages(torch.zeros(ENVS)),
              "set_extras": lambda: buf.set_extras({"old_mu": torch.zeros(2, ENVS)}),
              "clear": buf.clear, "load_state_dict": lambda: buf.load_state_dict(state),
              "add": step, "extend": lambda: buf.extend(td)}  # full: refused as read-only, not as full
    assert_refused(buf, writes)
    buf.read_only = False
    buf.clear()
    assert_refused(buf, {"add": step, "extend": lambda: buf.extend(td)})  # an empty rollout takes both otherwise
    assert buf.steps == 0


def test_a_read_only_distillation_buffer_refuses_every_write() -> None:
    buf = DistillationBuffer(8, obs_shape=(3,), action_shape=(), seed=0)
    buf.add(torch.zeros(3), 1.0)
    td = TensorDict({"observation": torch.zeros(2, 3), "expert_action": torch.ones(2)}, batch_size=[2])
    assert_refused(buf, {"add": lambda: buf.add(torch.zeros(3), 1.0), "extend": lambda: buf.extend(td),
                         "clear": buf.clear})
    assert buf.sample(2).expert_action.tolist() == [1.0, 1.0]


def test_read_only_takes_a_flag_only() -> None:
    buf = REPLAYS["plain"]()
    assert buf.read_only is False
    with pytest.raises(ConfigError, match="read_only"):
        buf.read_only = "yes"  # type: ignore[assignment]
    assert buf.read_only is False


def test_mixing_makes_the_dataset_read_only_and_catches_a_write_once_lifted(tmp_path: Path) -> None:
    offline, online = REPLAYS["plain"](), REPLAYS["plain"]()
    for t in range(8):  # the dataset fills its buffer: an add would overwrite its oldest row, not grow it
        replay_step(offline, t)
    replay_step(online, 0)
    mixed = MixedReplay(offline, online, offline_fraction=0.5, seed=0)
    assert offline.read_only and not online.read_only
    with pytest.raises(ReadOnlyError, match=r"^add: this buffer is read-only"):
        replay_step(offline, 8)
    replay_step(online, 1)
    mixed.sample(8)
    # The mixer's own restore of its pair writes the dataset, and leaves it read-only.
    state = mixed.state_dict()
    mixed.load_state_dict(state)
    assert offline.read_only
    mixed.save(tmp_path / "pair")
    assert MixedReplay.load(tmp_path / "pair").offline.read_only
    # Lifted by hand, a write to the full dataset changes no row count; the mixer still refuses to go on.
    offline.read_only = False
    replay_step(offline, 8)
    assert len(offline) == 16
    with pytest.raises(ConfigError, match="offline: the offline buffer is read-only while mixing, but it changed"):
        mixed.sample(8)


@pytest.mark.parametrize("change", ["clear and refill", "truncate_episodes", "set a row through torchrl"])
def test_a_mixer_refuses_a_dataset_changed_with_the_same_row_and_write_counts(change: str) -> None:
    offline, online = REPLAYS["plain"](), REPLAYS["plain"]()
    for t in range(3):
        replay_step(offline, t)
    replay_step(online, 0)
    mixed = MixedReplay(offline, online, offline_fraction=0.5, seed=0)
    offline.read_only = False
    if change == "clear and refill":  # a buffer that is not full comes back to the same counts
        offline.clear()
        for t in range(3):
            replay_step(offline, t + 50)
    elif change == "truncate_episodes":
        offline.truncate_episodes()
    else:
        offline.torchrl[0] = offline.torchrl[1]
    offline.read_only = True
    assert not mixed.check_valid()[0]
    with pytest.raises(ConfigError, match=r"offline: the offline buffer is read-only while mixing, but it changed "
                                          r"\(6 rows, 6 writes and \d+ rewrites when mixing began, 6, 6 and \d+ now\)"):
        mixed.sample(8)
