"""Hindsight relabelling against a plain reference: goals only from the row's own episode, as
each strategy says, on vector envs with interleaved and masked rows, across the ring's wrap,
through the Recorder in every autoreset mode; reward functions, options that cannot relabel and refused
steps. Checkpoints of a hindsight buffer: ``tests/test_hindsight_checkpoints.py``; the reference:
``tests/_hindsight_reference.py``.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from _hindsight_reference import (
    MASKED_ENDS,
    SENTINEL,
    STRATEGIES,
    Extend,
    Reference,
    add_step,
    extend_steps,
    fill,
    fill_into,
    goal_buffer,
    reached,
    steps,
)
from _snapshot import same, snapshot
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from rlbuf import (
    ConfigError,
    DeviceError,
    DtypeError,
    Hindsight,
    NonFiniteError,
    ReplayBuffer,
    RlbufError,
    ShapeError,
    StreamError,
)
from rlbuf._episodes import EpisodeIndex
from rlbuf.demos.bitflip import BitFlipEnv
from rlbuf.gym import Recorder


@MASKED_ENDS
@settings(max_examples=60, deadline=None)
@given(steps, st.sampled_from(STRATEGIES), st.integers(0, 2**31))
def test_goal_rows_equal_the_reference_for_every_stored_row(case: Any, strategy: str, seed: int) -> None:
    """The index picks, for the same uniform draw, the row a plain loop over episodes picks."""
    n, capacity, plan = case
    buf, ref = fill(n, capacity, plan, strategy)
    index: EpisodeIndex = buf._relabeller.episodes  # type: ignore[union-attr]
    stored = ref.stored()
    positions = np.array([s % capacity for s in stored], np.int64)
    uniform = np.random.default_rng(seed).random(len(stored))
    got = index.goal_rows(positions, strategy, uniform)  # type: ignore[arg-type]
    for serial, u, position in zip(stored, uniform, got, strict=True):
        candidates = ref.candidates(serial, strategy)
        assert position == candidates[math.floor(u * len(candidates))] % capacity, (serial, candidates)


@MASKED_ENDS
@settings(max_examples=40, deadline=None)
@given(steps, st.sampled_from(STRATEGIES))
def test_sampled_goals_come_from_the_rows_own_episode_and_rewards_follow(case: Any, strategy: str) -> None:
    n, capacity, plan = case
    buf, ref = fill(n, capacity, plan, strategy)
    batch = buf.sample(64)
    real = buf.sample_by_index(batch.index)
    goal = batch.obs["desired_goal"]
    assert torch.equal(goal, batch.next_obs["desired_goal"])
    for row in range(64):
        serial, env = (int(v) for v in real.next_obs["achieved_goal"][row])
        goal_serial, goal_env = (int(v) for v in goal[row])
        assert goal_env == env and goal_serial in ref.candidates(serial, strategy)
        assert batch.reward[row] == (0.0 if goal_serial == serial else -1.0)
    for name in ("action", "terminated", "truncated", "done"):  # a time limit still bootstraps
        assert torch.equal(getattr(batch, name), getattr(real, name))
    assert torch.equal(batch.obs["observation"], real.obs["observation"])


def test_an_extend_that_wraps_the_ring_leaves_no_row_to_an_env_it_overwrote() -> None:
    """8 rows into 4: env 1's rows overwrite all of env 0's; a reset of env 0 marks no row."""
    buf, ref = goal_buffer(4, 2), Reference(4)
    extend_steps(buf, ref, Extend(4, [[False] * 4] * 2, [[False] * 4] * 2))
    buf.truncate_episodes(torch.tensor([True, False]))
    rows = buf.sample_all()
    assert rows.next_obs["achieved_goal"][:, 1].tolist() == [1.0] * 4 and not bool(rows.truncated.any())


def test_the_relabelled_share_is_the_ratio_within_binomial_error() -> None:
    rng = np.random.default_rng(0)
    buf = goal_buffer(500, 2, "future", 0.3)
    ref = Reference(500)
    for _ in range(300):
        add_step(buf, ref, [True, True], list(rng.random(2) < 0.1), [False, False])
    draws = 20 * 512
    relabelled = sum(int((buf.sample(512).obs["desired_goal"][:, 0] != SENTINEL).sum()) for _ in range(20))
    assert abs(relabelled - 0.3 * draws) < 5 * math.sqrt(draws * 0.3 * 0.7)


def test_ratio_zero_relabels_nothing_and_equals_the_stored_rows() -> None:
    buf, _ = fill(2, 16, [([True, True], [1, 0], [False, True])] * 10, ratio=0.0)
    batch = buf.sample(32)
    assert torch.equal(batch.reward, buf.sample_by_index(batch.index).reward)
    assert bool((batch.obs["desired_goal"] == SENTINEL).all())


def test_extend_env_first_batches_index_each_envs_episodes() -> None:
    buf = goal_buffer(64, 2, "final")
    T = 5
    code = torch.tensor([[[t * 2 + e, e] for t in range(T)] for e in range(2)], dtype=torch.float32)
    ended = torch.tensor([[False, True, False, False, True], [False, False, False, False, False]])
    start = torch.cat([torch.full((2, 1, 2), -1.0), code[:, :-1]], dim=1)   # each step continues the last
    td = TensorDict({"observation": {"observation": start[..., :1], "achieved_goal": start,
                                     "desired_goal": torch.full((2, T, 2), SENTINEL)},
                     "action": torch.zeros(2, T),
                     "next": {"observation": {"observation": code[..., :1], "achieved_goal": code,
                                              "desired_goal": torch.full((2, T, 2), SENTINEL)},
                              "reward": torch.zeros(2, T, 1), "terminated": ended[..., None],
                              "truncated": torch.zeros(2, T, 1, dtype=torch.bool)}}, batch_size=[2, T])
    buf.extend(td)
    finals = buf._relabeller.episodes.goal_rows(np.arange(10), "final", np.zeros(10))  # type: ignore[union-attr]
    # rows are env-major: env 0 at 0..4 (episodes 0-1 and 2-4), env 1 at 5..9 (one running episode)
    assert finals.tolist() == [1, 1, 4, 4, 4, 9, 9, 9, 9, 9]
    with pytest.raises(ShapeError, match="hindsight buffer follows each env's episodes"):
        buf.extend(td.reshape(-1))


def test_a_step_that_does_not_continue_its_running_episode_is_refused_and_nothing_changes() -> None:
    buf, ref = goal_buffer(16, 2), Reference(16)
    add_step(buf, ref, [True, True], [False, True], [False, False])
    before = snapshot(buf)
    wrong = {"observation": torch.zeros(2, 1), "achieved_goal": torch.zeros(2, 2), "desired_goal": torch.zeros(2, 2)}
    with pytest.raises(StreamError, match="env 0's obs is not the next_obs of its previous row") as refused:
        buf.add(wrong, torch.zeros(2), torch.zeros(2), wrong, torch.tensor([False, False]), False)
    assert "call buffer.truncate_episodes(), or recorder.reset(), first" in str(refused.value)   # the fix for a reset
    assert same(before, snapshot(buf))
    add_step(buf, Reference(16), [False, True], [False, False], [False, False])   # env 1's episode ended: any obs
    assert len(buf) == 3


@pytest.mark.parametrize("returned", [np.zeros(3), np.zeros((64, 2)), np.array(["a"] * 64), np.full(64, np.nan),
                                      np.zeros(64, bool), torch.zeros(64, dtype=torch.bool), torch.zeros(64) + 1j,
                                      torch.zeros(64, device="meta"), [[0.0]] * 32 + [0.0] * 32,
                                      [torch.zeros((), requires_grad=True)] * 64])
def test_a_bad_reward_fn_result_is_refused_and_sampling_state_kept(returned: Any) -> None:
    buf = ReplayBuffer(32, obs_shape={"observation": 1, "achieved_goal": 2, "desired_goal": 2}, action_shape=(),
                       seed=0, hindsight=Hindsight("future", 1.0, lambda a, d, i: returned[:len(a)]))
    ref = Reference(32)
    for t in range(5):
        add_step(buf, ref, [True], [t == 4], [False])
    before = snapshot(buf)
    with pytest.raises((ShapeError, NonFiniteError, DtypeError, DeviceError), match="hindsight reward_fn"):
        buf.sample(64)
    assert same(before, snapshot(buf))


@pytest.mark.parametrize("n_step", [1, 3])
def test_a_reward_fn_gets_copies_and_its_tensors_are_read_by_value(n_step: int) -> None:
    """A reward_fn that writes into its arguments changes no batch; one returning a tensor that needs grad, or of
    bfloat16, gives its values."""
    def scribbling(achieved: Any, desired: Any, info: Any) -> Any:
        rewards = reached(achieved, desired, info)
        achieved[:] = desired[:] = 7.0
        return torch.tensor(rewards, dtype=torch.bfloat16, requires_grad=False).float().requires_grad_()

    batches = []
    for reward_fn in (reached, scribbling):
        buf = ReplayBuffer(32, obs_shape={"observation": 1, "achieved_goal": 2, "desired_goal": 2}, action_shape=(),
                           seed=0, n_step=n_step, hindsight=Hindsight("future", 1.0, reward_fn))
        ref = Reference(32)
        for t in range(6):
            add_step(buf, ref, [True], [t == 5], [False])
        batches.append(buf.sample(16))
    plain, scribbled = batches
    assert torch.equal(plain.reward, scribbled.reward)
    for key in ("achieved_goal", "desired_goal"):
        assert torch.equal(plain.obs[key], scribbled.obs[key]) and torch.equal(plain.next_obs[key], scribbled.next_obs[key])
    assert not bool((scribbled.obs["desired_goal"] == 7.0).any())


def test_options_and_layouts_that_cannot_relabel_are_refused() -> None:
    with pytest.raises(ConfigError, match="strategy"):
        Hindsight("past", 0.5, reached)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="ratio"):
        Hindsight("future", True, reached)
    with pytest.raises(ConfigError, match="reward_fn"):
        Hindsight("future", 0.5, None)
    with pytest.raises(ConfigError, match="missing"):
        ReplayBuffer(8, obs_shape=(3,), action_shape=(), hindsight=Hindsight("future", 0.5, reached))
    with pytest.raises(ConfigError, match="match in shape"):
        ReplayBuffer(8, obs_shape={"observation": 1, "achieved_goal": 2, "desired_goal": 3}, action_shape=(),
                     hindsight=Hindsight("future", 0.5, reached))
    with pytest.raises(ConfigError, match="hindsight"):
        goal_buffer(8, 1).torchrl  # noqa: B018
    for nested in ({"achieved_goal": {"x": 2}, "desired_goal": {"x": 2}}, {"observation": {"x": 1}}):
        with pytest.raises(ConfigError, match=r"must each be one tensor .*got a dict of tensors") as refused:
            ReplayBuffer(8, obs_shape={"observation": 1, "achieved_goal": 2, "desired_goal": 2, **nested},
                         action_shape=(), hindsight=Hindsight("future", 0.5, reached))
        assert f"obs {list(nested)} must each be one tensor" in str(refused.value)
    for compression in ("zstd", "lz4"):  # the compact layout's frames: no frame_stack or compact=True to add
        with pytest.raises(ConfigError, match="which a hindsight buffer does not use") as refused:
            goal_buffer(8, 1, compression=compression)
        assert "frame_stack" not in str(refused.value) and "compact=True" not in str(refused.value)


@pytest.mark.parametrize("mode", list(gym.vector.AutoresetMode))
def test_the_recorder_stores_whole_episodes_in_every_autoreset_mode(mode: gym.vector.AutoresetMode) -> None:
    """Each stored row's episode, as the index finds it, chains obs to next_obs from a reset to its end."""
    envs = gym.vector.SyncVectorEnv([lambda: BitFlipEnv(3)] * 3, autoreset_mode=mode)
    buf = ReplayBuffer(60, observation_space=envs.single_observation_space, action_space=envs.single_action_space,
                       num_envs=3, seed=0, hindsight=Hindsight("episode", 1.0, BitFlipEnv.compute_reward))
    recorder = Recorder(envs, buf)
    obs, _ = envs.reset(seed=0)
    rng = np.random.default_rng(0)
    for _ in range(50):
        action = rng.integers(0, 3, 3)
        next_obs, reward, terminated, truncated, info = envs.step(action)
        recorder.record(obs, action, reward, next_obs, terminated, truncated, info)
        obs = next_obs
        if mode == gym.vector.AutoresetMode.DISABLED and (terminated | truncated).any():
            obs, _ = envs.reset(options={"reset_mask": terminated | truncated})
    index = buf._relabeller.episodes  # type: ignore[union-attr]
    rows = buf.sample_all()
    by_position = {int(p): i for i, p in enumerate(rows.index)}
    for position in rows.index.tolist():
        episode = index.episode_rows(np.array(position)).tolist()
        chain = [by_position[p] for p in episode]
        for a, b in itertools.pairwise(chain):
            assert torch.equal(rows.next_obs["observation"][a], rows.obs["observation"][b])
            assert not rows.done[a]
        assert rows.obs["desired_goal"][chain].unique(dim=0).shape[0] == 1   # one goal per episode
    batch = buf.sample(128)
    achieved = buf.sample_by_index(batch.index).next_obs["achieved_goal"]
    expected = BitFlipEnv.compute_reward(achieved.numpy(), batch.obs["desired_goal"].numpy(), {})
    assert np.array_equal(batch.reward.numpy(), expected)


@MASKED_ENDS
@settings(max_examples=30, deadline=None)
@given(steps, st.sampled_from(STRATEGIES), st.integers(2, 4))
def test_n_step_transitions_sum_the_relabelled_rewards_of_their_own_episode(case: Any, strategy: str,
                                                                            n_step: int) -> None:
    """Against a plain loop: the next m <= n rows of the row's episode, rewards for the sampled goal."""
    n, capacity, plan = case
    buf, ref = goal_buffer(capacity, n, strategy, 0.5, n_step=n_step, gamma=0.5), Reference(capacity)
    buf, ref = fill_into(buf, ref, plan)
    batch = buf.sample(64)
    stored = buf.sample_all()
    by_serial = {int(s): i for i, s in enumerate(stored.next_obs["achieved_goal"][:, 0])}
    for row in range(64):
        serial = int(buf.sample_by_index(batch.index[row:row + 1]).next_obs["achieved_goal"][0, 0])
        episode = ref.candidates(serial, "future")[:n_step]   # this row and the ones after it
        goal = batch.obs["desired_goal"][row]
        relabelled = bool(goal[0] != SENTINEL)
        rewards = [(0.0 if int(goal[0]) == s else -1.0) if relabelled else -1.0 for s in episode]
        assert math.isclose(float(batch.reward[row]), sum(r * 0.5**k for k, r in enumerate(rewards)), abs_tol=1e-6)
        end = by_serial[episode[-1]]
        assert int(batch.next_obs["achieved_goal"][row, 0]) == episode[-1]
        assert bool(batch.terminated[row]) == bool(stored.terminated[end])
        assert bool(batch.truncated[row]) == bool(stored.truncated[end])
        expected = 0.0 if bool(stored.terminated[end]) else 0.5 ** len(episode)
        assert math.isclose(float(batch.discount[row]), expected)
        assert torch.equal(batch.next_obs["desired_goal"][row], goal if relabelled else torch.full((2,), SENTINEL))


def test_prioritized_hindsight_samples_by_priority_and_relabels_from_that_rows_episode() -> None:
    buf, ref = goal_buffer(32, 2, "episode", 1.0, prioritized=True), Reference(32)
    buf, ref = fill_into(buf, ref, [([True, True], [t % 3, 1], [False, False]) for t in range(10)])
    priorities = torch.zeros(len(buf))
    priorities[7] = 1.0
    buf.update_priority(torch.arange(len(buf)), priorities)
    batch = buf.sample(32)
    assert batch.index.tolist() == [7] * 32 and bool((batch.weight == batch.weight[0]).all())
    serial = int(buf.sample_by_index([7]).next_obs["achieved_goal"][0, 0])
    assert {int(g) for g in batch.obs["desired_goal"][:, 0]} <= set(ref.candidates(serial, "episode"))


REFUSALS = {
    "obs shape": lambda o, n: ({**o, "observation": torch.zeros(2, 3)}, n, {}),
    "goal dtype": lambda o, n: ({**o, "desired_goal": torch.zeros(2, 2, dtype=torch.int64)}, n, {}),
    "broken chain": lambda o, n: ({**o, "observation": o["observation"] + 100}, n, {}),
    "env_mask": lambda o, n: (o, n, {"env_mask": torch.tensor([True])}),
    "nan reward": lambda o, n: (o, n, {"reward": torch.tensor([float("nan"), 0.0])}),
}


@pytest.mark.parametrize("refusal", list(REFUSALS))
def test_a_refused_step_leaves_the_buffer_as_its_twin_that_never_saw_it(refusal: str) -> None:
    """Refused anywhere in the pipeline: state snapshot unchanged, and the next steps and samples
    equal a twin's that was never given the refused step."""
    (buf, ref), (twin, twin_ref) = (fill(2, 10, [([True, True], [1, 2], [False, False])] * 6) for _ in range(2))
    before = snapshot(buf)
    start = torch.stack([ref.running[e] for e in range(2)])
    obs = {"observation": start[:, :1], "achieved_goal": start, "desired_goal": torch.full((2, 2), SENTINEL)}
    nxt = {**obs, "observation": obs["observation"] + 0.25}
    given, given_next, options = REFUSALS[refusal](obs, nxt)
    reward = options.pop("reward", torch.zeros(2))
    with pytest.raises(RlbufError):
        buf.add(given, torch.zeros(2), reward, given_next, torch.zeros(2, dtype=torch.bool), False, **options)
    assert same(before, snapshot(buf))
    for target, target_ref in ((buf, ref), (twin, twin_ref)):
        fill_into(target, target_ref, [([True, True], [0, 3], [True, False])] * 3)
    for _ in range(3):
        a, b = buf.sample(16), twin.sample(16)
        assert torch.equal(a.index, b.index) and torch.equal(a.reward, b.reward)
        assert torch.equal(a.obs["desired_goal"], b.obs["desired_goal"])
