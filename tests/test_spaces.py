"""Buffers built from gymnasium spaces and TorchRL specs; the dtype kind rule."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from torchrl.data import Binary, Bounded, Categorical, Composite, OneHot, Unbounded

from rlbuf import ConfigError, DistillationBuffer, DtypeError, ReplayBuffer, RolloutBuffer
from rlbuf.spaces import field_of

SPACES = [
    (gym.spaces.Box(-1, 1, (3,), np.float32), (3,), torch.float32),
    (gym.spaces.Box(-1, 1, (2,), np.float64), (2,), torch.float64),
    (gym.spaces.Box(0, 255, (84, 84, 4), np.uint8), (84, 84, 4), torch.uint8),
    (gym.spaces.Discrete(6), (), torch.int64),
    (gym.spaces.MultiDiscrete([3, 4, 2]), (3,), torch.int64),
    (gym.spaces.MultiBinary(5), (5,), torch.int8),
    (gym.spaces.MultiBinary([2, 3]), (2, 3), torch.int8),
    (Bounded(-2.0, 2.0, (1,)), (1,), torch.float32),
    (Unbounded((7,)), (7,), torch.float32),
    (OneHot(4), (4,), torch.bool),
    (Categorical(4), (), torch.int64),
    (Binary(3), (3,), torch.int8),
    (Composite(observation=Unbounded((8, 3)), shape=(8,)), (3,), torch.float32),
]


def buffers(**options: Any) -> list[Any]:
    return [ReplayBuffer(16, num_envs=2, **options), RolloutBuffer(4, 2, **options),
            DistillationBuffer(16, num_envs=2, **options)]


@pytest.mark.parametrize(("space", "shape", "dtype"), SPACES, ids=lambda v: type(v).__name__)
def test_every_buffer_stores_what_the_space_describes(space: Any, shape: tuple[int, ...], dtype: torch.dtype) -> None:
    assert field_of(space, "observation_space") == (shape, dtype)
    action_space = Composite(action=space["observation"], shape=space.shape) if isinstance(space, Composite) else space
    for buffer in buffers(observation_space=space, action_space=action_space):
        stored = {spec.name: (spec.shape, spec.dtype) for spec in buffer.fields}
        action = "expert_action" if isinstance(buffer, DistillationBuffer) else "action"
        assert stored["obs"] == stored[action] == (shape, dtype)


def test_samples_of_the_spaces_go_in_unchanged() -> None:
    obs_space = gym.spaces.Box(0, 255, (4, 4), np.uint8)
    for action_space in (gym.spaces.Discrete(3), gym.spaces.MultiDiscrete([2, 5]), gym.spaces.MultiBinary(4)):
        buffer = ReplayBuffer(8, observation_space=obs_space, action_space=action_space)
        obs, action = obs_space.sample(), action_space.sample()
        buffer.add(obs, action, 1.0, obs_space.sample(), False, truncated=False)
        batch = buffer.sample_all()
        assert torch.equal(batch.obs[0], torch.from_numpy(obs))
        assert torch.equal(batch.action[0], torch.as_tensor(action).to(batch.action.dtype))


def test_vector_env_single_spaces() -> None:
    envs = gym.make_vec("CartPole-v1", num_envs=3, vectorization_mode="sync")
    buffer = ReplayBuffer(10, observation_space=envs.single_observation_space,
                          action_space=envs.single_action_space, num_envs=3)
    obs, _ = envs.reset(seed=0)
    action = envs.action_space.sample()
    next_obs, reward, terminated, truncated, _ = envs.step(action)
    buffer.add(obs, action, reward, next_obs, terminated, truncated)
    assert buffer.sample_all().action.dtype == torch.int64


def test_torchrl_env_specs() -> None:
    from torchrl.envs import GymEnv

    env = GymEnv("CartPole-v1", categorical_action_encoding=True)
    buffer = RolloutBuffer(4, 1, observation_space=env.observation_spec, action_space=env.action_spec)
    fields = {spec.name: (spec.shape, spec.dtype) for spec in buffer.fields}
    assert fields["obs"] == ((4,), torch.float32) and fields["action"] == ((), torch.int64)
    one_hot = GymEnv("CartPole-v1")
    assert field_of(one_hot.action_spec, "action_space") == ((2,), torch.int64)
    assert field_of(one_hot.full_action_spec, "action_space") == ((2,), torch.int64)


@pytest.mark.parametrize("space", [
    gym.spaces.Tuple((gym.spaces.Discrete(2),)),
    gym.spaces.Text(5),
    "Box(3,)",
])
def test_unsupported_spaces_are_refused_by_name(space: Any) -> None:
    with pytest.raises(ConfigError, match=f"observation_space: a {type(space).__name__} space"):
        ReplayBuffer(10, observation_space=space, action_shape=())


def test_composite_without_the_entry_and_nested_composites_are_refused() -> None:
    with pytest.raises(ConfigError, match="no 'observation' entry"):
        field_of(Composite(pixels=Unbounded((3,))), "observation_space")
    with pytest.raises(ConfigError, match="itself a Composite"):
        field_of(Composite(observation=Composite(a=Unbounded((3,)))), "observation_space")


def test_a_space_and_a_shape_together_are_refused() -> None:
    with pytest.raises(ConfigError, match="observation_space, obs_shape: give one of them"):
        ReplayBuffer(10, observation_space=gym.spaces.Box(-1, 1, (3,)), obs_shape=(3,), action_shape=())
    with pytest.raises(ConfigError, match="action_shape: required"):
        RolloutBuffer(4, 2, obs_shape=(3,))


def test_a_dtype_may_override_the_spaces() -> None:
    buffer = ReplayBuffer(10, observation_space=gym.spaces.Box(-1, 1, (3,), np.float64), obs_dtype=torch.float32,
                          action_space=gym.spaces.Discrete(2))
    assert buffer.fields[0].dtype == torch.float32


@pytest.mark.parametrize("kind", [ReplayBuffer, RolloutBuffer, DistillationBuffer])
def test_checkpoints_rebuild_a_buffer_built_from_spaces(kind: Any, tmp_path: Path) -> None:
    spaces = {"observation_space": gym.spaces.Box(0, 255, (2, 2), np.uint8), "action_space": gym.spaces.Discrete(3)}
    buffer = kind(4, 1, **spaces) if kind is RolloutBuffer else kind(4, **spaces)
    assert "observation_space" not in buffer.state_dict(data=False)["options"]
    buffer.save(tmp_path / "ckpt")
    restored = kind.load(tmp_path / "ckpt")
    assert [s.to_json() for s in restored.fields] == [s.to_json() for s in buffer.fields]


def test_integer_actions_into_a_float_action_buffer_are_refused_with_the_fix() -> None:
    buffer = ReplayBuffer(10, obs_shape=(3,), action_shape=(), num_envs=2)
    for action in (np.array([0, 1]), torch.tensor([0, 1]), [0, 1]):
        with pytest.raises(DtypeError, match=r"action_dtype=torch\.int64 or action_space="):
            buffer.add(np.zeros((2, 3), np.float32), action, np.ones(2), np.zeros((2, 3), np.float32),
                       np.zeros(2, bool), truncated=False)
    single = DistillationBuffer(10, obs_shape=(3,), action_shape=())
    for action in (1, np.int64(1)):
        with pytest.raises(DtypeError, match="action_space="):
            single.add(np.zeros(3, np.float32), action)
    assert len(buffer) == len(single) == 0


def test_integer_observations_into_a_float_buffer_are_refused_kinds_never_change() -> None:
    buffer = RolloutBuffer(2, 2, obs_shape=(3,), action_shape=())
    with pytest.raises(DtypeError, match=r"obs: .* got uint8; store them as they come with obs_dtype=torch.uint8"):
        buffer.add(np.zeros((2, 3), np.uint8), np.zeros(2, np.float32), np.ones(2), np.zeros(2, bool),
                   np.zeros(2, np.float32), np.zeros(2, np.float32), truncated=False)
    assert buffer.steps == 0


def test_rewards_and_values_still_take_integers_but_not_bools() -> None:
    buffer = RolloutBuffer(2, 2, obs_shape=(3,), action_shape=())
    buffer.add(np.zeros((2, 3), np.float32), np.zeros(2, np.float32), np.array([1, 2]), np.zeros(2, bool),
               np.array([0, 1]), np.zeros(2, np.float32), truncated=False)
    assert buffer.view("reward")[0].tolist() == [1.0, 2.0]
    with pytest.raises(DtypeError, match="reward"):
        buffer.add(np.zeros((2, 3), np.float32), np.zeros(2, np.float32), np.array([True, False]),
                   np.zeros(2, bool), np.zeros(2, np.float32), np.zeros(2, np.float32), truncated=False)


def goal_space(dtype: Any = np.float64) -> gym.spaces.Dict:
    """gymnasium's GoalEnv layout: a key named "observation" beside the goals."""
    return gym.spaces.Dict({"observation": gym.spaces.Box(-1, 1, (6,), dtype),
                            "achieved_goal": gym.spaces.Box(-1, 1, (3,), np.float32),
                            "desired_goal": gym.spaces.Box(-1, 1, (3,), np.float32)})


@pytest.mark.parametrize("build", [
    lambda **kw: ReplayBuffer(10, action_shape=(), **kw),
    lambda **kw: RolloutBuffer(4, 1, action_shape=(), **kw),
    lambda **kw: DistillationBuffer(10, action_shape=(), **kw),
], ids=["replay", "rollout", "distill"])
def test_a_goal_env_dict_space_gives_the_same_fields_as_observation_space_and_as_obs_shape(build: Any) -> None:
    by_space, by_shape = build(observation_space=goal_space()), build(obs_shape=goal_space())
    assert [s.to_json() for s in by_space.fields] == [s.to_json() for s in by_shape.fields]
    obs = {s.name: (s.shape, s.dtype) for s in by_space.fields if s.name.startswith("obs[")}
    assert obs == {'obs["achieved_goal"]': ((3,), torch.float32), 'obs["desired_goal"]': ((3,), torch.float32),
                   'obs["observation"]': ((6,), torch.float64)}


def test_a_float64_leaf_keeps_its_dtype_as_a_flat_float64_box_does() -> None:
    flat = ReplayBuffer(10, observation_space=gym.spaces.Box(-1, 1, (6,), np.float64), action_shape=())
    nested = ReplayBuffer(10, observation_space=gym.spaces.Dict({"a": gym.spaces.Box(-1, 1, (6,), np.float64)}),
                          action_shape=())
    assert flat.fields[0].dtype is nested.fields[0].dtype is torch.float64
    converted = ReplayBuffer(10, observation_space=goal_space(), obs_dtype=torch.float32, action_shape=())
    assert {s.dtype for s in converted.fields if s.name.startswith("obs[")} == {torch.float32}
    one_key = ReplayBuffer(10, observation_space=goal_space(), obs_dtype={"observation": torch.float32},
                           action_shape=())
    assert one_key.fields[2].describe() == 'obs["observation"]: (6,) float32'


def test_a_goal_env_buffer_stores_float64_observations_exactly() -> None:
    buffer = ReplayBuffer(10, observation_space=goal_space(), action_shape=(), seed=0)
    obs = {"observation": np.full(6, 0.1), "achieved_goal": np.zeros(3, np.float32),
           "desired_goal": np.ones(3, np.float32)}
    buffer.add(obs, 0.0, 1.0, obs, False, False)
    assert buffer.sample_all().obs["observation"][0].tolist() == [0.1] * 6


@pytest.mark.parametrize("spec", [
    Composite(observation=Unbounded((3,))),
    Composite(observation=Unbounded((4, 3)), shape=(4,)),
    Composite(observation=Composite(a=Unbounded((2,)), b=Bounded(0, 255, (1,), dtype=torch.uint8))),
    Composite(a=Unbounded((2,)), b=Composite(c=Unbounded((1,)))),
], ids=["observation entry", "batched", "nested observation entry", "observation keys"])
def test_a_composite_spec_gives_the_same_fields_as_obs_shape_and_as_observation_space(spec: Composite) -> None:
    by_space = ReplayBuffer(10, observation_space=spec, action_shape=())
    by_shape = ReplayBuffer(10, obs_shape=spec, action_shape=())
    assert [s.to_json() for s in by_space.fields] == [s.to_json() for s in by_shape.fields]
