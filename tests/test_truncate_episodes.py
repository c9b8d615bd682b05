"""``ReplayBuffer.truncate_episodes``: an episode ended after the fact equals one truncated when added.

A user who resets envs mid-episode (or restarts a crashed worker) ends their running episodes with
``truncate_episodes``; the buffer must then hold exactly what it would hold had that step been added
with ``truncated=True``: the same rows, stream tables, samples and checkpoints.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlbuf import ConfigError, EpisodeStats, Hindsight, ReplayBuffer, ShapeError, StreamError
from rlbuf.gym import Recorder

NUM_ENVS = 2


def stream(seed: int, steps: int, frame_stack: int) -> list[dict[str, Any]]:
    """Steps of ``NUM_ENVS`` envs with uint8 frames ``[frame_stack, 3]``, random ends, and random resets
    by the user (``cut``: the env's episode is reset after this step, which did not end it)."""
    rng = np.random.default_rng(seed)
    counter = 0
    stacks: list[np.ndarray | None] = [None] * NUM_ENVS
    recorded = []
    for _ in range(steps):
        obs, next_obs = np.zeros((2, NUM_ENVS, frame_stack, 3), np.uint8)
        for env in range(NUM_ENVS):
            if stacks[env] is None:                                   # an episode starts: reset padding
                counter += 1
                stacks[env] = np.tile(np.array([counter % 251, env, 7], np.uint8), (frame_stack, 1))
            counter += 1
            obs[env] = stacks[env]
            next_obs[env] = np.concatenate([stacks[env][1:], [[counter % 251, env, 9]]])
            stacks[env] = next_obs[env]
        terminated, truncated = rng.random(NUM_ENVS) < 0.08, rng.random(NUM_ENVS) < 0.05
        cut = ~(terminated | truncated) & (rng.random(NUM_ENVS) < 0.1)
        for env in np.flatnonzero(terminated | truncated | cut):
            stacks[env] = None
        recorded.append({"obs": obs, "action": rng.integers(0, 4, NUM_ENVS), "reward": rng.normal(size=NUM_ENVS),
                         "next_obs": next_obs, "terminated": terminated, "truncated": truncated, "cut": cut})
    return recorded


def fed(buffer: ReplayBuffer, steps: list[dict[str, Any]], *, after_the_fact: bool) -> ReplayBuffer:
    """``buffer`` fed ``steps``: each user reset as ``truncate_episodes`` after the step, or as ``truncated=True``."""
    for step in steps:
        cut = step["cut"]
        truncated = step["truncated"] if after_the_fact else step["truncated"] | cut
        buffer.add(step["obs"], step["action"], step["reward"], step["next_obs"], step["terminated"],
                   truncated=truncated)
        if after_the_fact and cut.any():
            buffer.truncate_episodes(cut)
    return buffer


def assert_same_batches(ours: ReplayBuffer, reference: ReplayBuffer) -> None:
    """Every transition, and a sample of two buffers of one seed and one history."""
    mine, theirs = ours.sample_all(), reference.sample_all()
    for name in ("obs", "action", "reward", "next_obs", "terminated", "truncated", "done", "discount"):
        assert torch.equal(getattr(mine, name), getattr(theirs, name)), name
    assert torch.equal(ours.sample(16).next_obs, reference.sample(16).next_obs)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), frame_stack=st.sampled_from([1, 3]), n_step=st.sampled_from([1, 3]),
       capacity=st.sampled_from([12, 64]), compression=st.sampled_from([None, "lz4"]))
def test_a_cut_after_the_fact_equals_a_truncation_given_with_the_step(seed: int, frame_stack: int, n_step: int,
                                                                      capacity: int, compression: str | None) -> None:
    """Across wraps, episode ends, frame stacks, n-step and compressed frames."""
    if frame_stack == 1 and n_step == 1:
        n_step = 2  # the compact layout needs one of the two
    steps = stream(seed, 40, frame_stack)
    options: dict[str, Any] = {"obs_shape": (frame_stack, 3), "obs_dtype": torch.uint8, "action_shape": (),
                               "action_dtype": torch.int64, "num_envs": NUM_ENVS, "n_step": n_step,
                               "frame_stack": frame_stack, "compression": compression, "seed": 0}
    ours = fed(ReplayBuffer(capacity, **options), steps, after_the_fact=True)
    reference = fed(ReplayBuffer(capacity, **options), steps, after_the_fact=False)
    assert_same_batches(ours, reference)
    mine, theirs = ours.state_dict()["extra"]["streams"], reference.state_dict()["extra"]["streams"]
    for name in ("back", "next", "terminated", "truncated", "env", "last", "expected"):
        assert torch.equal(mine[name], theirs[name]), name
    # The kept final frames are the same for every row (which slot holds one is the allocator's choice).
    kept = mine["final_slot"] >= 0
    assert torch.equal(kept, theirs["final_slot"] >= 0)
    if compression is None:
        assert torch.equal(mine["finals"]["frames"][mine["final_slot"][kept]],
                           theirs["finals"]["frames"][theirs["final_slot"][kept]])
    for name, field in ours.state_dict()["fields"].items():
        assert torch.equal(field, reference.state_dict()["fields"][name]), name


def test_a_cut_buffer_saves_and_loads_through_the_load_check(tmp_path: Path) -> None:
    """The load check derives the stream tables from the rows and cross-checks them: a cut passes it."""
    steps = stream(5, 30, 3)
    options: dict[str, Any] = {"obs_shape": (3, 3), "obs_dtype": torch.uint8, "action_shape": (), "action_dtype": torch.int64,
                               "num_envs": NUM_ENVS, "n_step": 3, "frame_stack": 3, "seed": 0}
    ours = fed(ReplayBuffer(64, **options), steps, after_the_fact=True)
    assert any(step["cut"].any() for step in steps)
    ours.save(tmp_path / "cut")
    assert_same_batches(ReplayBuffer.load(tmp_path / "cut"), fed(ReplayBuffer(64, **options), steps,
                                                                  after_the_fact=False))


def test_the_next_step_of_a_reset_env_is_refused_without_the_call_and_taken_with_it() -> None:
    buffer = ReplayBuffer(16, obs_shape=(2, 1), action_shape=(), frame_stack=2, seed=0, stats=EpisodeStats(1))
    buffer.add(np.array([[0.0], [0.0]]), 0.0, 1.0, np.array([[0.0], [1.0]]), False, truncated=False)
    restarted = (np.array([[5.0], [5.0]]), 0.0, 2.0, np.array([[5.0], [6.0]]), False)
    with pytest.raises(StreamError, match="differs from the next_obs"):
        buffer.add(*restarted, truncated=False)
    buffer.truncate_episodes()
    buffer.add(*restarted, truncated=False)
    buffer.add(np.array([[5.0], [6.0]]), 0.0, 3.0, np.array([[6.0], [7.0]]), True, truncated=False)
    data = buffer.sample_all()
    assert data.truncated.tolist() == [True, False, False] and data.next_obs[0, :, 0].tolist() == [0.0, 1.0]
    assert buffer.stats is not None and buffer.stats.recent_returns() == [5.0]   # the cut episode is not one


def test_a_refused_call_changes_nothing_and_an_ended_episode_is_left_as_it_is() -> None:
    buffer = ReplayBuffer(16, obs_shape=(1,), action_shape=(), n_step=2, num_envs=2, seed=0)
    buffer.add(np.zeros((2, 1)), np.zeros(2), np.ones(2), np.ones((2, 1)), np.array([True, False]), truncated=False)
    before = buffer.state_dict()["extra"]["streams"]
    with pytest.raises(ShapeError, match=r"env_mask: expected 2 bools"):
        buffer.truncate_episodes([True, False, True])
    after = buffer.state_dict()["extra"]["streams"]
    assert all(torch.equal(after[k], v) for k, v in before.items() if isinstance(v, torch.Tensor))
    buffer.truncate_episodes([True, False])                          # env 0's episode had ended: no change
    assert buffer.sample_all().terminated.tolist() == [True] and buffer.sample_all().truncated.tolist() == [False]
    buffer.truncate_episodes(np.array([False, True]))
    assert buffer.sample_all().truncated.tolist() == [False, True]


def test_a_buffer_of_whole_transitions_marks_each_envs_newest_row_and_forgets_its_statistics() -> None:
    """As if added truncated: the rows, and sequences that no longer cross the reset; an env whose
    episode ended is left as it is; the running episode leaves no statistics."""
    steps = [(np.full((2, 1), float(t)), np.zeros(2), np.ones(2), np.full((2, 1), t + 1.0), np.array([t == 2, False]))
             for t in range(3)]
    ours, reference = (ReplayBuffer(8, obs_shape=(1,), action_shape=(), num_envs=2, seed=0, stats=EpisodeStats(2))
                       for _ in range(2))
    for t, (obs, action, reward, next_obs, terminated) in enumerate(steps):
        ours.add(obs, action, reward, next_obs, terminated, truncated=False)
        reference.add(obs, action, reward, next_obs, terminated, truncated=np.array([False, t == 2]))
    ours.truncate_episodes()
    assert ours.sample_all().truncated.tolist() == reference.sample_all().truncated.tolist() == [
        False, False, False, False, False, True]
    assert ours.sample_all().done.tolist() == reference.sample_all().done.tolist()
    assert ours.stats is not None and ours.stats.recent_returns() == [3.0]     # env 0's episode only
    ours.add(np.zeros((2, 1)), np.zeros(2), np.ones(2), np.ones((2, 1)), np.zeros(2, bool), truncated=False)
    reference.add(np.zeros((2, 1)), np.zeros(2), np.ones(2), np.ones((2, 1)), np.zeros(2, bool), truncated=False)
    mine, theirs = ours.sample_sequences(64, 2), reference.sample_sequences(64, 2)
    assert torch.equal(mine.obs, theirs.obs) and torch.equal(mine.truncated, theirs.truncated)


def test_a_hindsight_buffer_never_relabels_across_a_cut() -> None:
    """Goals come from the episode of the row: after a cut, the next episode's goals are never drawn."""
    def step(x: float) -> dict[str, torch.Tensor]:
        return {"observation": torch.tensor([x]), "achieved_goal": torch.tensor([x]), "desired_goal": torch.tensor([50.0])}

    buffer = ReplayBuffer(64, obs_shape={"observation": 1, "achieved_goal": 1, "desired_goal": 1}, action_shape=(),
                          hindsight=Hindsight("episode", 1.0, lambda a, d, i: -np.abs(a - d).sum(-1)), seed=0)
    for x in range(3):
        buffer.add(step(float(x)), 0.0, -1.0, step(x + 1.0), False, truncated=False)
    buffer.truncate_episodes()
    for x in range(10, 13):
        buffer.add(step(float(x)), 0.0, -1.0, step(x + 1.0), False, truncated=x == 12)
    batch = buffer.sample(256)
    first = batch.obs["observation"][:, 0] < 10
    goals = batch.obs["desired_goal"][:, 0]
    assert (goals[first] <= 3).all() and (goals[~first] >= 11).all()
    assert batch.truncated[batch.obs["observation"][:, 0] == 2].all()


def test_recorder_reset_mid_episode_ends_the_running_episodes() -> None:
    """``envs.reset()`` in the middle of a run, then ``recorder.reset()``: recording goes on."""
    envs = gym.vector.SyncVectorEnv([lambda: gym.wrappers.FrameStackObservation(gym.make("CartPole-v1"), 2)] * 2,
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    buffer = ReplayBuffer(256, observation_space=envs.single_observation_space,
                          action_space=envs.single_action_space, num_envs=2, frame_stack=2, n_step=2, seed=0)
    recorder = Recorder(envs, buffer)
    obs, _ = envs.reset(seed=0)
    for _ in range(3):
        action = envs.action_space.sample()
        next_obs, reward, terminated, truncated, info = envs.step(action)
        recorder.record(obs, action, reward, next_obs, terminated, truncated, info)
        obs = next_obs
    obs, _ = envs.reset(seed=1)
    recorder.reset()
    action = envs.action_space.sample()
    next_obs, reward, terminated, truncated, info = envs.step(action)
    recorder.record(obs, action, reward, next_obs, terminated, truncated, info)
    # Per env: the steps before the reset (t = 0, 1, 2), the one after; with n_step=2 the transitions
    # of t = 1 and 2 end at the cut (truncated), the one of t = 0 does not, the new episode's is open.
    assert len(buffer) == 8 and buffer.sample_all().truncated.tolist() == [False, False, True, True, True, True]


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), capacity=st.sampled_from([6, 40]),
       calls=st.lists(st.sampled_from(["full", "masked", "extend_env_major", "extend_time_major", "extend_square",
                                       "cut"]),
                      min_size=1, max_size=14))
def test_the_newest_row_of_each_env_is_cut_after_any_adds_masks_and_extends(seed: int, capacity: int,
                                                                           calls: list[str]) -> None:
    """Against a reference that remembers which row each env wrote last (the ring overwrites the oldest first)."""
    from tensordict import TensorDict

    num_envs, rng = 3, np.random.default_rng(seed)
    buffer = ReplayBuffer(capacity, obs_shape=(1,), action_shape=(), num_envs=num_envs, seed=0)
    envs_of: list[int] = []   # the env of every row ever written, by write serial
    cut: set[int] = set()     # the serials the reference marks truncated

    def rows(envs: list[int], ended: np.ndarray[Any, Any]) -> None:
        for env, end in zip(envs, ended, strict=True):
            envs_of.append(env)
            if end:
                cut.discard(len(envs_of) - 1)
    for call in calls:
        ended = rng.random(num_envs * 3) < 0.2
        if call in ("full", "masked"):
            mask = np.ones(num_envs, bool) if call == "full" else rng.random(num_envs) < 0.5
            buffer.add(np.zeros((num_envs, 1), np.float32), np.zeros(num_envs), np.zeros(num_envs),
                       np.zeros((num_envs, 1), np.float32), ended[:num_envs], truncated=False,
                       env_mask=None if call == "full" else mask)
            rows([e for e in range(num_envs) if mask[e]], ended[:num_envs][mask])
        elif call.startswith("extend"):
            steps = num_envs if call == "extend_square" else 2  # a collector's [num_envs, T], T == num_envs too
            lead, envs = ((num_envs, steps), [e for e in range(num_envs) for _ in range(steps)]) \
                if call != "extend_time_major" else ((2, num_envs), [e for _ in range(2) for e in range(num_envs)])
            ended = ended[:math.prod(lead)]
            flags = torch.from_numpy(ended.reshape(lead))
            buffer.extend(TensorDict({"observation": torch.zeros(*lead, 1), "action": torch.zeros(lead),
                                      "next": {"observation": torch.zeros(*lead, 1), "reward": torch.zeros(lead),
                                               "terminated": flags, "truncated": torch.zeros(lead, dtype=torch.bool)}},
                                     batch_size=list(lead)))
            rows(envs, ended)
        else:
            envs = rng.random(num_envs) < 0.6
            buffer.truncate_episodes(envs)
            stored = range(max(0, len(envs_of) - capacity), len(envs_of))
            for env in np.flatnonzero(envs):
                newest = [serial for serial in stored if envs_of[serial] == env]
                if newest:
                    cut.add(newest[-1])
    count = len(envs_of)
    stored = list(range(max(0, count - capacity), count))
    fields = buffer.state_dict()["fields"]  # by ring position
    truncated, terminated = fields["truncated"].reshape(-1), fields["terminated"].reshape(-1)
    for serial in stored:
        position = serial % capacity
        expected = serial in cut and not bool(terminated[position])
        assert bool(truncated[position]) == expected, (serial, calls)


@pytest.mark.parametrize("lead", [(2, 2), (2, 2, 1), (1, 2, 2)])
def test_an_env_major_batch_with_dims_of_one_is_read_env_by_env(lead: tuple[int, ...]) -> None:
    # [num_envs, T, 1] with T == num_envs was taken for one step of each env at a time: sample_sequences
    # returned "sequences" jumping between envs, and truncate_episodes marked env 1's row for env 0 (helper 46).
    from tensordict import TensorDict

    n = steps = 2
    code = (torch.arange(n).view(n, 1) * 100 + torch.arange(steps).view(1, steps)).float().reshape(lead)  # env*100+t
    flags = torch.zeros(*lead, 1, dtype=torch.bool)
    buf = ReplayBuffer(16, obs_shape=(1,), action_shape=(), num_envs=n, seed=0)
    buf.extend(TensorDict({"observation": code.unsqueeze(-1), "action": torch.zeros(lead),
                           "next": {"observation": code.unsqueeze(-1) + 1, "reward": torch.zeros(*lead, 1),
                                    "terminated": flags, "truncated": flags}}, batch_size=list(lead)))
    with pytest.raises(ConfigError, match="steps of one env are not num_envs rows apart"):
        buf.sample_sequences(4, 2)
    buf.truncate_episodes(torch.tensor([True, False]))
    batch = buf.sample_all()
    assert batch.obs[batch.truncated, 0].tolist() == [1.0]          # env 0's newest step, not env 1's


def test_a_time_major_batch_with_a_middle_dim_of_one_stays_one_step_of_each_env_at_a_time() -> None:
    from tensordict import TensorDict

    n = steps = 2
    code = (torch.arange(steps).view(steps, 1, 1) + torch.arange(n).view(1, 1, n) * 100).float()  # [T, 1, N]
    flags = torch.zeros(steps, 1, n, 1, dtype=torch.bool)
    buf = ReplayBuffer(16, obs_shape=(1,), action_shape=(), num_envs=n, seed=0)
    buf.extend(TensorDict({"observation": code.unsqueeze(-1), "action": torch.zeros(steps, 1, n),
                           "next": {"observation": code.unsqueeze(-1) + 1, "reward": torch.zeros(steps, 1, n, 1),
                                    "terminated": flags, "truncated": flags}}, batch_size=[steps, 1, n]))
    sequences = buf.sample_sequences(8, 2).obs[..., 0]
    assert all(row in ([0.0, 1.0], [100.0, 101.0]) for row in sequences.tolist())   # never across envs
    buf.truncate_episodes(torch.tensor([True, False]))
    batch = buf.sample_all()
    assert batch.obs[batch.truncated, 0].tolist() == [1.0]
