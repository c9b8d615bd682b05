"""The Recorder and env_mask on compact buffers (frame stacks, n-step): the Atari case, against a naive buffer."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_gym import MODES, NUM_ENVS, STEPS, check_episodes, drive, make

from rlbuf import (
    EmptyBufferError,
    EpisodeStats,
    NonFiniteError,
    ReplayBuffer,
    ShapeError,
    StreamError,
)

# -- env_mask on compact buffers (frame stacks, n-step): the Atari case ------------------------------
STACK = 4


def make_stacked(env_id: int) -> Any:
    return lambda: gym.wrappers.FrameStackObservation(make(env_id)(), STACK)


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_compact_frame_stacked_n_step_buffer_stores_exactly_the_real_transitions(mode: AutoresetMode) -> None:
    gamma, n_step = 0.5, 3
    envs = gym.vector.SyncVectorEnv([make_stacked(i) for i in range(NUM_ENVS)], autoreset_mode=mode)
    buffer = ReplayBuffer(10_000, num_envs=NUM_ENVS, observation_space=envs.single_observation_space,
                          action_space=envs.single_action_space, frame_stack=STACK, n_step=n_step, gamma=gamma,
                          stats=EpisodeStats(NUM_ENVS))
    recorder = drive(envs, buffer)
    assert buffer.compact and len(buffer) == NUM_ENVS * STEPS - recorder.skipped
    assert (recorder.skipped > 0) == (mode == AutoresetMode.NEXT_STEP)
    data = buffer.sample_all()
    newest, after = data.obs[:, -1].numpy().astype(int), data.next_obs[:, -1].numpy().astype(int)
    check_episodes(newest)
    assert (after[:, :2] == newest[:, :2]).all()      # same env, same episode: never a reset observation
    steps = after[:, 2] - newest[:, 2]
    assert ((steps >= 1) & (steps <= n_step)).all() and data.done[steps < n_step].all()
    for row, (stack, start, m) in enumerate(zip(data.obs.numpy().astype(int), newest[:, 2], steps, strict=True)):
        assert [frame[2] for frame in stack] == [max(0, start - k) for k in range(STACK - 1, -1, -1)]
        assert (stack[:, :2] == newest[row, :2]).all()  # the stack's older frames are of the same episode
        assert data.reward[row].item() == sum(gamma**j * (start + j + 1) for j in range(m))
        assert data.discount[row].item() == (0.0 if data.terminated[row] else gamma**m)
    ended_here = data.done.numpy() & (steps == 1)     # an episode's last step (n-step windows end there too)
    assert buffer.stats is not None and buffer.stats.episodes_finished == int(ended_here.sum())


@st.composite
def masked_streams(draw: st.DrawFn) -> dict[str, Any]:
    return {"num_envs": draw(st.integers(1, 3)), "frame_stack": draw(st.sampled_from([1, 2, 4])),
            "n_step": draw(st.sampled_from([1, 2, 3])), "capacity": draw(st.integers(3, 24)),
            "padding_type": draw(st.sampled_from(["reset", "zero"])), "end_chance": draw(st.sampled_from([0.15, 0.5])),
            "gamma": draw(st.sampled_from([0.5, 1.0])), "rounds": draw(st.integers(1, 30)),
            "seed": draw(st.integers(0, 2**16))}


class NextStepStreams:
    """Frame-stacked toy envs that autoreset as gymnasium's ``NEXT_STEP``: after an episode ends,
    the env's next step is a reset step (``obs`` the final stack, ``next_obs`` the reset one)."""

    def __init__(self, num_envs: int, frame_stack: int, padding_type: str, end_chance: float, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.frame_stack, self.padding_type, self.end_chance = frame_stack, padding_type, end_chance
        self.stacks = [self._reset() for _ in range(num_envs)]
        self.resetting = [False] * num_envs

    def _reset(self) -> list[np.ndarray]:
        first = self.rng.integers(0, 256, (2,), dtype=np.uint8)
        pad = first if self.padding_type == "reset" else np.zeros(2, np.uint8)
        return [pad] * (self.frame_stack - 1) + [first]

    def _obs(self, stack: list[np.ndarray]) -> np.ndarray:
        return np.stack(stack) if self.frame_stack > 1 else stack[0]

    def step(self) -> tuple[list[dict[str, Any]], np.ndarray]:
        """One step of every env (a row each) and the mask of the real ones."""
        rows, keep = [], []
        for env, stack in enumerate(self.stacks):
            obs, junk = self._obs(stack), self.resetting[env]
            if junk:                              # reward 0, no flags, next_obs a reset
                self.stacks[env], self.resetting[env] = self._reset(), False
                row = {"obs": obs, "next_obs": self._obs(self.stacks[env]), "ended": False, "terminated": False}
            else:
                self.stacks[env] = stack = [*stack[1:], self.rng.integers(0, 256, (2,), dtype=np.uint8)]
                ended = bool(self.rng.random() < self.end_chance)
                self.resetting[env] = ended
                row = {"obs": obs, "next_obs": self._obs(stack), "ended": ended,
                       "terminated": ended and bool(self.rng.random() < 0.5)}
            rows.append({**row, "env": env, "action": int(self.rng.integers(0, 4)),
                         "reward": float(self.rng.integers(-8, 8)) / 4})
            keep.append(not junk)
        return rows, np.array(keep)


def expected_transitions(kept: list[dict[str, Any]], capacity: int, frame_stack: int, n_step: int,
                         gamma: float) -> dict[int, dict[str, Any]]:
    """The complete transitions still stored, by serial, built naively from the kept rows."""
    oldest = max(0, len(kept) - capacity)
    result = {}
    by_env: dict[int, list[int]] = defaultdict(list)
    for serial, row in enumerate(kept):
        by_env[row["env"]].append(serial)
    for serials in by_env.values():
        start = 0
        for i, serial in enumerate(serials):
            if i > 0 and kept[serials[i - 1]]["ended"]:
                start = i
            if serial < oldest or serials[max(start, i - frame_stack + 1)] < oldest:
                continue  # overwritten, or the oldest frame of its stack is
            following = [kept[s] for s in serials[i:i + n_step]]
            ends = [j for j, row in enumerate(following) if row["ended"]]
            m = ends[0] + 1 if ends else n_step
            if not ends and (len(following) < n_step or i + n_step >= len(serials)):
                continue  # the steps after it (and the observation after them) are not all added yet
            last = following[m - 1]
            terminated = bool(ends) and last["terminated"]
            result[serial] = {"obs": kept[serial]["obs"], "next_obs": last["next_obs"],
                              "action": kept[serial]["action"], "terminated": terminated,
                              "truncated": bool(ends) and not terminated,
                              "reward": np.float32(sum(gamma**j * following[j]["reward"] for j in range(m))),
                              "discount": np.float32(0.0 if terminated else gamma**m)}
    return result


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=masked_streams())
def test_env_mask_on_a_compact_buffer_equals_a_naive_buffer_of_the_kept_rows(scenario: dict[str, Any]) -> None:
    n, k, capacity = scenario["num_envs"], scenario["frame_stack"], scenario["capacity"]
    envs = NextStepStreams(n, k, scenario["padding_type"], scenario["end_chance"], scenario["seed"])
    obs_shape = (k, 2) if k > 1 else (2,)
    options = {"obs_shape": obs_shape, "obs_dtype": torch.uint8, "action_shape": (), "action_dtype": torch.int64,
               "num_envs": n, "seed": 0}
    buffer = ReplayBuffer(max(capacity, n), frame_stack=k, padding_type=scenario["padding_type"],
                          n_step=scenario["n_step"], gamma=scenario["gamma"], compact=True, **options)
    plain = ReplayBuffer(max(capacity, n), compact=False, **options)  # whole stacks, next_obs stored
    kept: list[dict[str, Any]] = []
    for _ in range(scenario["rounds"]):
        rows, keep = envs.step()
        values = [np.stack([row[name] for row in rows]) for name in ("obs", "action", "reward", "next_obs")]
        flags = np.array([row["terminated"] for row in rows]), np.array([r["ended"] and not r["terminated"] for r in rows])
        for buf in (buffer, plain):
            buf.add(*values, *flags, env_mask=keep)
        kept += [row for row, kept_row in zip(rows, keep, strict=True) if kept_row]
    assert len(buffer) == len(plain) == min(len(kept), max(capacity, n))
    expected = expected_transitions(kept, max(capacity, n), k, scenario["n_step"], scenario["gamma"])
    if not expected:
        with pytest.raises(EmptyBufferError):
            buffer.sample_all()
        return
    data = buffer.sample_all()
    written = len(kept)
    serials = [written - 1 - ((written - 1 - p) % len(buffer)) for p in data.index.tolist()]
    assert sorted(serials) == sorted(expected)
    for row, serial in enumerate(serials):
        want = expected[serial]
        assert np.array_equal(data.obs[row].numpy(), want["obs"])
        assert np.array_equal(data.next_obs[row].numpy(), want["next_obs"])
        for name in ("action", "terminated", "truncated", "reward", "discount"):
            assert getattr(data, name)[row].item() == want[name], name
    if scenario["n_step"] == 1:                       # one-step transitions: the plain buffer holds the same
        truth = plain.sample_by_index(data.index)
        for name in ("obs", "action", "reward", "next_obs", "terminated", "truncated", "done"):
            assert torch.equal(getattr(data, name), getattr(truth, name)), name


def test_env_mask_on_a_compact_buffer_validates_every_row_before_storing_any() -> None:
    buffer = ReplayBuffer(10, obs_shape=(2, 1), action_shape=(), num_envs=2, frame_stack=2)
    stack = np.zeros((2, 2, 1), np.float32)
    keep = np.array([True, False])
    buffer.add(stack, np.zeros(2), np.ones(2), stack, np.zeros(2, bool), env_mask=keep, truncated=False)
    bad_reward = np.array([1.0, np.nan])               # a left-out row is still checked
    with pytest.raises(NonFiniteError, match="reward"):
        buffer.add(stack, np.zeros(2), bad_reward, stack, np.zeros(2, bool), env_mask=keep, truncated=False)
    with pytest.raises(ShapeError, match="env_mask"):
        buffer.add(stack, np.zeros(2), np.ones(2), stack, np.zeros(2, bool), env_mask=np.array([True]), truncated=False)
    broken = stack.copy()
    broken[0, 0] = 5.0                                 # env 0's obs does not continue its stream
    with pytest.raises(StreamError):
        buffer.add(broken, np.zeros(2), np.ones(2), stack, np.zeros(2, bool), env_mask=keep, truncated=False)
    assert len(buffer) == 1
    buffer.add(stack, np.zeros(2), np.ones(2), stack, np.zeros(2, bool), env_mask=np.array([False, False]), truncated=False)
    buffer.add(stack, np.zeros(2), np.ones(2), stack, np.zeros(2, bool), env_mask=np.array([True, True]), truncated=False)
    assert len(buffer) == 3 and len(buffer.sample_all()) == 1  # env 0's first row is complete now
