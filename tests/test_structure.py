"""Dict and nested observations in every buffer: storage keys, validation, batches, checkpoints."""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
import pytest
import torch
from tensordict import TensorDict
from torchrl.data import Bounded, Composite, Unbounded

from rlbuf import DistillationBuffer, EpisodeStats, ReplayBuffer, RolloutBuffer
from rlbuf.errors import ConfigError, DtypeError, MissingFieldError, ShapeError

OBS_SHAPE = {"camera": (3, 4, 4), "proprio": (5,), "sensors": {"imu": (2,)}}
OBS_DTYPE = {"camera": torch.uint8}
N = 3


def make_obs(n: int = N, value: float = 0.0) -> dict[str, Any]:
    return {"camera": torch.full((n, 3, 4, 4), int(value) % 256, dtype=torch.uint8),
            "proprio": torch.full((n, 5), float(value)), "sensors": {"imu": torch.full((n, 2), float(value))}}


def replay(**kwargs: Any) -> ReplayBuffer:
    options: dict[str, Any] = {"obs_shape": OBS_SHAPE, "obs_dtype": OBS_DTYPE, "action_shape": (), "num_envs": N,
                               "seed": 0}
    return ReplayBuffer(32, **(options | kwargs))


def add_steps(buf: ReplayBuffer, steps: int) -> None:
    for t in range(steps):
        buf.add(make_obs(value=t), torch.full((N,), float(t)), torch.full((N,), float(t)), make_obs(value=t + 1),
                torch.zeros(N, dtype=torch.bool), truncated=False)


def test_each_leaf_is_a_field_at_a_nested_torchrl_key() -> None:
    keys = {spec.name: spec.key for spec in replay().fields}
    assert keys['obs["camera"]'] == ("observation", "camera")
    assert keys['obs["sensors"]["imu"]'] == ("observation", "sensors", "imu")
    assert keys['next_obs["proprio"]'] == ("next", "observation", "proprio")
    dtypes = {spec.name: spec.dtype for spec in replay().fields}
    assert dtypes['obs["camera"]'] is torch.uint8 and dtypes['obs["proprio"]'] is torch.float32


def test_batch_obs_is_a_tensordict_with_the_stored_values() -> None:
    buf = replay()
    add_steps(buf, 4)
    batch = buf.sample(8)
    assert isinstance(batch.obs, TensorDict)
    assert set(batch.obs.keys()) == {"camera", "proprio", "sensors"}
    assert batch.obs.batch_size == torch.Size([8])
    assert batch.obs["camera"].dtype is torch.uint8 and batch.obs["camera"].shape == (8, 3, 4, 4)
    # Every leaf of a row comes from the same step: reward t was added with obs t, next_obs t + 1.
    torch.testing.assert_close(batch.obs["proprio"][:, 0], batch.reward)
    torch.testing.assert_close(batch.next_obs["sensors", "imu"][:, 0], batch.reward + 1)
    assert batch.obs[:2]["proprio"].shape == (2, 5)
    assert batch.obs.to(torch.float64)["proprio"].dtype is torch.float64
    assert batch.to_tensordict()["next", "observation", "camera"].shape == (8, 3, 4, 4)


def test_a_flat_observation_stays_a_plain_tensor() -> None:
    buf = ReplayBuffer(8, obs_shape=(2,), action_shape=())
    buf.add(torch.zeros(2), 0.0, 1.0, torch.zeros(2), False, truncated=False)
    assert type(buf.sample(2).obs) is torch.Tensor


def test_a_wrong_leaf_shape_names_the_key_and_stores_nothing() -> None:
    buf = replay()
    add_steps(buf, 1)
    before = buf.state_dict()
    bad = make_obs()
    bad["proprio"] = torch.zeros(N, 6)
    with pytest.raises(ShapeError, match=r'obs\["proprio"\]: expected shape \(3, 5\), got \(3, 6\)'):
        buf.add(bad, torch.zeros(N), torch.zeros(N), make_obs(), torch.zeros(N, dtype=torch.bool), truncated=False)
    nested_bad = make_obs()
    nested_bad["sensors"]["imu"] = torch.zeros(N, 2, dtype=torch.float32).numpy().astype(np.complex64)
    with pytest.raises(DtypeError, match=r'next_obs\["sensors"\]\["imu"\]'):
        buf.add(make_obs(), torch.zeros(N), torch.zeros(N), nested_bad, torch.zeros(N, dtype=torch.bool), truncated=False)
    after = buf.state_dict()
    assert after["size"] == before["size"] and after["cursor"] == before["cursor"]
    assert torch.equal(after["rng"]["sample"], before["rng"]["sample"])


def test_missing_and_unknown_keys_are_refused_by_name() -> None:
    buf = replay()
    missing = make_obs()
    del missing["sensors"]["imu"]
    with pytest.raises(MissingFieldError, match=r'obs\["sensors"\]\["imu"\]: missing'):
        buf.add(missing, torch.zeros(N), torch.zeros(N), make_obs(), torch.zeros(N, dtype=torch.bool), truncated=False)
    unknown = make_obs() | {"lidar": torch.zeros(N, 3)}
    with pytest.raises(MissingFieldError, match=r'obs\["lidar"\]: not a key'):
        buf.add(unknown, torch.zeros(N), torch.zeros(N), make_obs(), torch.zeros(N, dtype=torch.bool), truncated=False)
    with pytest.raises(ShapeError, match="obs: expected a dict or TensorDict"):
        buf.add(torch.zeros(N, 5), torch.zeros(N), torch.zeros(N), make_obs(), torch.zeros(N, dtype=torch.bool), truncated=False)
    assert len(buf) == 0


def test_dtype_options_are_checked() -> None:
    with pytest.raises(ConfigError, match="obs_dtype: keys"):
        replay(obs_dtype={"lidar": torch.uint8})
    with pytest.raises(ConfigError, match="obs_dtype: a mapping of dtypes needs a mapping"):
        ReplayBuffer(8, obs_shape=(2,), obs_dtype={"a": torch.uint8}, action_shape=())
    with pytest.raises(ConfigError, match="obs_shape"):
        ReplayBuffer(8, obs_shape={"a": "big"}, action_shape=())


def test_obs_may_be_a_tensordict_and_numpy_leaves_work() -> None:
    buf = replay()
    obs = TensorDict(make_obs(), batch_size=[N])
    numpy_obs = {"camera": np.zeros((N, 3, 4, 4), np.uint8), "proprio": np.ones((N, 5)),
                 "sensors": {"imu": np.ones((N, 2), np.float32)}}
    buf.add(obs, torch.zeros(N), torch.zeros(N), numpy_obs, torch.zeros(N, dtype=torch.bool), truncated=False)
    assert buf.sample_all().next_obs["proprio"].eq(1).all()


@pytest.mark.parametrize("source", ["composite", "gymnasium"])
def test_composite_specs_and_gymnasium_dict_spaces_give_the_same_fields(source: str) -> None:
    if source == "composite":
        obs_shape: Any = Composite(camera=Bounded(0, 255, shape=(3, 4, 4), dtype=torch.uint8),
                                   proprio=Unbounded(shape=(5,)), sensors=Composite(imu=Unbounded(shape=(2,))))
    else:
        box = gymnasium.spaces.Box
        obs_shape = gymnasium.spaces.Dict({
            "camera": box(0, 255, (3, 4, 4), np.uint8), "proprio": box(-1, 1, (5,), np.float32),
            "sensors": gymnasium.spaces.Dict({"imu": box(-1, 1, (2,), np.float32)})})
    built = ReplayBuffer(32, obs_shape=obs_shape, action_shape=(), num_envs=N)
    assert [s.to_json() for s in built.fields] == [s.to_json() for s in replay().fields]


def test_a_batched_composite_spec_gives_the_shape_of_one_env() -> None:
    spec = Composite(camera=Bounded(0, 255, shape=(N, 3, 4, 4), dtype=torch.uint8), proprio=Unbounded(shape=(N, 5)),
                     sensors=Composite(imu=Unbounded(shape=(N, 2)), shape=(N,)), shape=(N,))
    built = ReplayBuffer(32, obs_shape=spec, action_shape=(), num_envs=N)
    assert [s.to_json() for s in built.fields] == [s.to_json() for s in replay().fields]


def test_extend_reads_nested_keys_and_torchrl_env_layout() -> None:
    rows = 4
    obs = TensorDict(make_obs(rows), batch_size=[rows])
    nested = TensorDict({"observation": obs, "action": torch.zeros(rows),
                         "next": {"observation": obs.clone(), "reward": torch.arange(rows, dtype=torch.float32),
                                  "terminated": torch.zeros(rows, 1, dtype=torch.bool), "truncated": torch.zeros(rows, 1, dtype=torch.bool)}}, batch_size=[rows])
    # TorchRL's GymEnv puts a Dict space's keys at the top level (no "observation" level).
    env_layout = TensorDict({**make_obs(rows), "action": torch.zeros(rows),
                             "next": {**make_obs(rows), "reward": torch.arange(rows, dtype=torch.float32),
                                      "terminated": torch.zeros(rows, 1, dtype=torch.bool), "truncated": torch.zeros(rows, 1, dtype=torch.bool)}}, batch_size=[rows])
    for td, imu in ((nested, nested["observation", "sensors", "imu"]), (env_layout, env_layout["sensors", "imu"])):
        buf = replay()
        buf.extend(td)
        assert torch.equal(buf.sample_all().obs["sensors", "imu"], imu)
    missing = nested.exclude(("next", "observation", "camera"))
    with pytest.raises(MissingFieldError, match=r'next_obs\["camera"\]'):
        replay().extend(missing)


def test_fast_add_and_extend_store_the_same_rows() -> None:
    stepwise, bulk = replay(), replay()
    add_steps(stepwise, 5)
    obs = torch.stack([TensorDict(make_obs(value=t), [N]) for t in range(5)])
    nxt = torch.stack([TensorDict(make_obs(value=t + 1), [N]) for t in range(5)])
    td = TensorDict({"observation": obs, "action": torch.arange(5.0)[:, None].expand(5, N),
                     "next": {"observation": nxt, "reward": torch.arange(5.0)[:, None].expand(5, N),
                              "terminated": torch.zeros(5, N, dtype=torch.bool), "truncated": torch.zeros(5, N, dtype=torch.bool)}}, batch_size=[5, N])
    bulk.extend(td)
    a, b = stepwise.state_dict(), bulk.state_dict()
    for name in a["fields"]:
        assert torch.equal(a["fields"][name], b["fields"][name]), name


@pytest.mark.parametrize("storage", ["memory", "memmap"])
def test_checkpoint_round_trip_resumes_exactly(tmp_path: Any, storage: str) -> None:
    buf = replay(storage=storage, prioritized=True)
    add_steps(buf, 6)
    buf.update_priority([0, 1, 2], [5.0, 0.1, 3.0])
    iterator = buf.epochs(batch_size=4, n_epochs=2)
    next(iterator)
    buf.save(tmp_path / "ckpt")
    restored = ReplayBuffer.load(tmp_path / "ckpt")
    assert [s.to_json() for s in restored.fields] == [s.to_json() for s in buf.fields]
    for mine, theirs in ((buf.sample(6), restored.sample(6)),
                         (next(iterator), next(restored.current_epochs))):  # type: ignore[arg-type]
        assert torch.equal(mine.index, theirs.index)
        assert (mine.obs == theirs.obs).all()
        assert torch.equal(mine.weight, theirs.weight)


def test_composite_options_are_saved_as_plain_shapes(tmp_path: Any) -> None:
    spec = Composite(camera=Bounded(0, 255, shape=(3, 4, 4), dtype=torch.uint8), proprio=Unbounded(shape=(5,)),
                     sensors=Composite(imu=Unbounded(shape=(2,))))
    buf = ReplayBuffer(16, obs_shape=spec, action_shape=(), num_envs=N)
    add_steps(buf, 2)  # type: ignore[arg-type]
    buf.save(tmp_path / "ckpt", data=False)
    with pytest.warns(UserWarning):
        restored = ReplayBuffer.load(tmp_path / "ckpt")
    assert [s.to_json() for s in restored.fields] == [s.to_json() for s in buf.fields]


def test_rollout_buffer_with_dict_observations() -> None:
    buf = RolloutBuffer(4, N, obs_shape=OBS_SHAPE, obs_dtype=OBS_DTYPE, action_shape=(), privileged_obs_shape=(7,),
                        seed=0)
    for t in range(4):
        buf.add(make_obs(value=t), torch.zeros(N), torch.ones(N), torch.zeros(N, dtype=torch.bool), torch.zeros(N),
                torch.zeros(N), privileged_obs=torch.full((N, 7), float(t)), truncated=False)
    buf.compute_returns_and_advantages(torch.zeros(N))
    batches = list(buf.minibatches(num_minibatches=2))
    for batch in batches:
        assert isinstance(batch.obs, TensorDict) and len(batch) == batch.obs.batch_size[0]
        torch.testing.assert_close(batch.obs["proprio"][:, 0], batch.privileged_obs[:, 0])  # type: ignore[index]
    assert buf.get_all_data().to_tensordict()["observation", "camera"].dtype is torch.uint8
    assert buf.view("obs")["proprio"][:, :, 0].tolist() == [[float(t)] * N for t in range(4)]
    bad = make_obs()
    bad["proprio"] = torch.zeros(N, 4)
    buf.clear()
    with pytest.raises(ShapeError, match=r'obs\["proprio"\]: expected shape \(3, 5\), got \(3, 4\)'):
        buf.add(bad, torch.zeros(N), torch.ones(N), torch.zeros(N, dtype=torch.bool), torch.zeros(N), torch.zeros(N),
                privileged_obs=torch.zeros(N, 7), truncated=False)
    assert buf.steps == 0


def test_rollout_extend_takes_a_collector_rollout_with_nested_observations() -> None:
    td = TensorDict({"observation": TensorDict(make_obs(N * 4), [N * 4]).reshape(N, 4),
                     "action": torch.zeros(N, 4), "state_value": torch.zeros(N, 4, 1),
                     "sample_log_prob": torch.zeros(N, 4),
                     "next": {"reward": torch.ones(N, 4, 1), "terminated": torch.zeros(N, 4, 1, dtype=torch.bool), "truncated": torch.zeros(N, 4, 1, dtype=torch.bool)}},
                    batch_size=[N, 4])
    td["observation", "proprio"] = torch.arange(N * 4, dtype=torch.float32).reshape(N, 4, 1).expand(N, 4, 5)
    td["next", "terminated"][1, 2] = True
    stats = EpisodeStats(N)
    buf = RolloutBuffer(4, N, obs_shape=OBS_SHAPE, obs_dtype=OBS_DTYPE, action_shape=(), stats=stats)
    buf.extend(td)
    assert stats.episodes_finished == 1 and stats.summary()["return"]["mean"] == 3.0  # env 1 ended at its step 2
    buf.compute_returns_and_advantages(torch.zeros(N))
    # Row t * num_envs + n holds env n's step t.
    assert buf.get_all_data().obs["proprio"][:, 0].tolist() == td["observation", "proprio"][:, :, 0].T.flatten().tolist()


def test_distillation_buffer_with_dict_observations() -> None:
    buf = DistillationBuffer(8, obs_shape={"a": (2,), "b": ()}, obs_dtype={"b": torch.int64}, action_shape=(),
                             num_envs=2, seed=0)
    buf.add({"a": torch.ones(2, 2), "b": torch.tensor([3, 4])}, torch.zeros(2))
    obs, _ = buf.sample(4)
    assert isinstance(obs, TensorDict) and obs["b"].dtype is torch.int64
    assert set(obs["b"].tolist()) <= {3, 4}
    with pytest.raises(ShapeError, match=r'obs\["a"\]: expected shape \(B, 2\) for B rows, or \(2,\) for one row, got \(2, 3\)'):
        buf.add({"a": torch.ones(2, 3), "b": torch.tensor([3, 4])}, torch.zeros(2))
