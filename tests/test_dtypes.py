"""Dtype options by name, dtype refusals that name the cast, and the habits met when a buffer is built."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch

from rlbuf import (
    BatchedSpaceWarning,
    ConfigError,
    DistillationBuffer,
    DtypeError,
    MemoryWarning,
    ReplayBuffer,
    RlbufWarning,
    RolloutBuffer,
    ShapeError,
)
from rlbuf._dtypes import as_dtype


# -- dtype names -------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["int64", "torch.int64", np.int64, np.dtype("int64"), "i8", torch.int64])
def test_a_dtype_is_taken_by_name_or_numpy_dtype(name: Any) -> None:
    assert as_dtype("action_dtype", name) is torch.int64


@pytest.mark.parametrize("kind", [ReplayBuffer, DistillationBuffer, RolloutBuffer])
def test_every_dtype_option_takes_names(kind: Any, tmp_path: Path) -> None:
    sizes = (4, 2) if kind is RolloutBuffer else (10,)
    buf = kind(*sizes, obs_shape={"pixels": (3,), "state": (2,)}, obs_dtype={"pixels": "uint8", "state": np.float64},
               action_shape=(), action_dtype="int64", extra_fields={"cost": ((), "float16"), "mask": ((2,), np.bool_)})
    dtypes = {spec.name: spec.dtype for spec in buf.fields}
    assert dtypes['obs["pixels"]'] is torch.uint8 and dtypes['obs["state"]'] is torch.float64
    assert dtypes[("expert_action" if kind is DistillationBuffer else "action")] is torch.int64
    assert dtypes["cost"] is torch.float16 and dtypes["mask"] is torch.bool
    buf.save(tmp_path / "buf")  # the recorded options are dtypes: JSON, and the same buffer again
    assert [s.dtype for s in kind.load(tmp_path / "buf").fields] == [s.dtype for s in buf.fields]


@pytest.mark.parametrize(("options", "message"), [
    ({"action_dtype": "int65"}, "action_dtype: unknown dtype 'int65'; give a torch dtype or its name: 'bool', "),
    ({"obs_dtype": "bfloat16"}, "obs_dtype: unknown dtype 'bfloat16'"),
    ({"obs_dtype": np.complex64}, "obs_dtype: unknown dtype"),
    ({"extra_fields": {"w": ((), "float")}}, None),  # numpy's "float" is float64: taken
    ({"extra_fields": {"w": ((), "flaot32")}}, "extra_fields['w']: unknown dtype 'flaot32'"),
])
def test_an_unknown_dtype_name_is_refused_clearly(options: dict[str, Any], message: str | None) -> None:
    if message is None:
        assert ReplayBuffer(10, obs_shape=(3,), action_shape=(), **options).fields[-1].dtype is torch.float64
        return
    with pytest.raises(ConfigError) as error:
        ReplayBuffer(10, obs_shape=(3,), action_shape=(), **options)
    assert str(error.value).startswith(message) and "'int64'" in str(error.value)


def test_bytes_per_transition_takes_dtype_names_too() -> None:
    named = ReplayBuffer.bytes_per_transition(obs_shape=(4, 84, 84), action_shape=(), obs_dtype="uint8",
                                              action_dtype="int64", extra_fields={"w": ((), "float16")})
    assert named == ReplayBuffer.bytes_per_transition(obs_shape=(4, 84, 84), action_shape=(), obs_dtype=torch.uint8,
                                                      action_dtype=torch.int64, extra_fields={"w": ((), torch.float16)})


# -- refusals that name the cast ---------------------------------------------------------------
@pytest.mark.parametrize("as_numpy", [False, True])
def test_float_dones_are_refused_with_bool(as_numpy: bool) -> None:
    buf = ReplayBuffer(10, obs_shape=(3,), action_shape=(), num_envs=2)
    dones = np.zeros(2, np.float32) if as_numpy else torch.zeros(2)
    for field in ("terminated", "truncated"):
        flags: dict[str, Any] = {"terminated": torch.zeros(2, dtype=torch.bool), "truncated": False, field: dones}
        with pytest.raises(DtypeError) as error:
            buf.add(torch.zeros(2, 3), torch.zeros(2), torch.zeros(2), torch.zeros(2, 3), **flags)
        message = str(error.value)
        assert message.startswith(f"{field}: expected dtype torch.bool")
        assert f"{field}.bool()" in message and f"{field}.astype(bool)" in message and "CleanRL" in message
    assert len(buf) == 0


@pytest.mark.parametrize(("dtype", "cast"), [(torch.int64, "action.long()"), (torch.int32, "action.int()"),
                                             (torch.uint8, "action.to(torch.uint8)")])
def test_a_float_action_for_an_integer_field_is_refused_with_its_cast(dtype: torch.dtype, cast: str) -> None:
    buf = ReplayBuffer(10, obs_shape=(3,), action_shape=(), action_dtype=dtype)
    with pytest.raises(DtypeError) as error:
        buf.add(torch.zeros(3), torch.tensor([1.0]), 0.0, torch.zeros(3), False, False)
    assert f"; convert the values: {cast} (numpy: action.astype(np.{str(dtype).removeprefix('torch.')}))" in str(
        error.value)
    rollout = RolloutBuffer(2, 1, obs_shape=(3,), action_shape=(), action_dtype=dtype)
    with pytest.raises(DtypeError, match=f"convert the values: {cast.replace('(', '[(]').replace(')', '[)]')}"):
        rollout.add(torch.zeros(3), np.array([1.0]), 0.0, False, 0.0, 0.0, truncated=False)


# -- capacity required -------------------------------------------------------------------------
@pytest.mark.parametrize(("build", "message"), [
    (lambda: ReplayBuffer(obs_shape=(3,), action_shape=()), "capacity: required (the rows the buffer keeps), e.g. "
                                                             "ReplayBuffer(100_000, "),
    (lambda: DistillationBuffer(obs_shape=(3,), action_shape=()), "capacity: required (the rows the buffer keeps), "
                                                                  "e.g. DistillationBuffer(100_000, "),
    (lambda: RolloutBuffer(num_envs=2, obs_shape=(3,), action_shape=()), "num_steps: required (steps per rollout), "
                                                                         "e.g. RolloutBuffer(num_steps=128, "),
    (lambda: RolloutBuffer(128, obs_shape=(3,), action_shape=()), "num_envs: required (envs stepped together), e.g."),
])
def test_a_size_left_out_is_refused_as_required_with_an_example(build: Any, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        build()
    assert str(error.value).startswith(message)


def test_no_constructor_shows_a_size_of_0() -> None:
    import inspect

    for kind in (ReplayBuffer, DistillationBuffer, RolloutBuffer):
        for parameter in inspect.signature(kind).parameters.values():
            assert parameter.default != 0 or parameter.name not in ("capacity", "num_steps", "num_envs")
        assert "= REQUIRED" in str(inspect.signature(kind))
    with pytest.raises(ConfigError, match="buffer_size: not an option of ReplayBuffer; rlbuf's name is capacity"):
        ReplayBuffer(buffer_size=10, obs_shape=(3,), action_shape=())  # SB3's keyword still gets its answer


# -- the batched space -------------------------------------------------------------------------
def test_a_buffer_built_from_the_batched_space_warns_and_its_add_says_the_fix() -> None:
    envs = gym.make_vec("Pendulum-v1", num_envs=4)
    with pytest.warns(BatchedSpaceWarning) as caught:
        buf = ReplayBuffer(100, observation_space=envs.observation_space, action_space=envs.single_action_space,
                           num_envs=4)
    assert len(caught) == 1 and caught[0].filename == __file__
    message = str(caught[0].message)
    assert message.startswith("observation_space: shape (4, 3) starts with num_envs=4") and (
        "envs.single_observation_space" in message)
    obs, _ = envs.reset(seed=0)
    action = envs.action_space.sample()
    next_obs, reward, terminated, truncated, _ = envs.step(action)
    with pytest.raises(ShapeError) as error:
        buf.add(obs, action, reward, next_obs, terminated, truncated)
    assert str(error.value) == (
        "obs: expected shape (4, 4, 3), got (4, 3); this buffer stores obs of shape (4, 3), whose first dim is "
        "num_envs=4: was it built from envs.observation_space? Build it with "
        "observation_space=envs.single_observation_space (one env's space); or, if that was one env's obs, give "
        "every env's at once")
    assert len(buf) == 0
    cartpole = gym.make_vec("CartPole-v1", num_envs=4)
    with pytest.warns(BatchedSpaceWarning, match="^action_space: shape .4,. starts with num_envs=4.*"
                                                 "envs.single_action_space"):
        rollout = RolloutBuffer(8, 4, observation_space=envs.single_observation_space,
                                action_space=cartpole.action_space)
    with pytest.raises(ShapeError, match=r"action: expected shape \(4, 4\), got \(4,\); this buffer stores action of "
                                         r"shape \(4,\).*action_space=envs.single_action_space"):
        rollout.add(obs, cartpole.action_space.sample(), reward, terminated, np.zeros(4), np.zeros(4), truncated)
    with pytest.warns(BatchedSpaceWarning):  # its add takes any batch: a (4, 3) step would read as one row
        DistillationBuffer(10, observation_space=envs.observation_space, action_space=envs.single_action_space,
                           num_envs=4)
    envs.close()


def test_a_batched_torchrl_spec_warns_with_the_unbatched_one() -> None:
    # SerialEnv(2)'s env.action_spec: Categorical of shape (2,); its extend was refused naming no cause (helper 42).
    from torchrl.data import Bounded, Categorical, OneHot

    for batched in (Categorical(2, shape=(2,)), OneHot(3, shape=(2, 3)), Bounded(-1, 1, shape=(2, 3))):
        with pytest.warns(BatchedSpaceWarning, match=r"^action_space: shape \(2, ?3?\) starts with num_envs=2.*pass "
                                                     r"env.action_spec_unbatched \(one env's spec\)"):
            ReplayBuffer(10, obs_shape=(4,), action_space=batched, num_envs=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RlbufWarning)  # one env's specs: no warning
        for single in (Categorical(2), OneHot(2), Bounded(-1, 1, shape=(2,)),
                       Bounded(torch.tensor([[-1.0], [-2.0]]), 1, shape=(2, 1))):
            ReplayBuffer(10, obs_shape=(4,), action_space=single, num_envs=2)


@pytest.mark.parametrize("space", [gym.spaces.Box(-1, 1, (4,)), gym.spaces.Box(0, 255, (4, 8, 8), np.uint8)])
def test_a_single_space_that_starts_with_num_envs_is_not_the_batched_one(space: Any) -> None:
    # CartPole's (4,) observation with 4 envs; 4 stacked frames with 4 envs and frame_stack=4.
    with warnings.catch_warnings():
        warnings.simplefilter("error", RlbufWarning)
        options = {"frame_stack": 4} if len(space.shape) == 3 else {}
        ReplayBuffer(100, observation_space=space, action_space=gym.spaces.Discrete(2), num_envs=4, **options)


# -- float64 observations ----------------------------------------------------------------------
def test_a_float64_box_warns_that_obs_dtype_halves_the_memory() -> None:
    space = gym.spaces.Box(-np.inf, np.inf, (17,), np.float64)  # MuJoCo's
    with pytest.warns(MemoryWarning) as caught:
        buf = ReplayBuffer(10, observation_space=space, action_shape=(6,))
    assert len(caught) == 1 and "obs_dtype=torch.float32 halves the memory" in str(caught[0].message)
    assert buf.fields[0].dtype is torch.float64
    with warnings.catch_warnings():
        warnings.simplefilter("error", RlbufWarning)
        small = ReplayBuffer(10, observation_space=space, action_shape=(6,), obs_dtype=torch.float32)
        small.add(space.sample(), np.zeros(6), 0.0, space.sample(), False, False)  # float64 observations taken
    assert small.fields[0].dtype is torch.float32


def test_a_float64_action_box_warns_that_action_dtype_matches_a_float32_network() -> None:
    actions = gym.spaces.Box(-1.0, 1.0, (6,), np.float64)
    with pytest.warns(MemoryWarning) as caught:
        buf = ReplayBuffer(10, obs_shape=(3,), action_space=actions)
    assert len(caught) == 1
    assert "action_space" in str(caught[0].message) and "action_dtype=torch.float32" in str(caught[0].message)
    assert buf.fields[1].dtype is torch.float64
    with warnings.catch_warnings():
        warnings.simplefilter("error", RlbufWarning)
        assert ReplayBuffer(10, obs_shape=(3,), action_space=actions, action_dtype="float32").fields[1].dtype \
            is torch.float32


# -- read-only arrays --------------------------------------------------------------------------
def test_read_only_arrays_are_stored_without_torchs_warning() -> None:
    # torch warns once per process: every path runs in a fresh one, with warnings as errors.
    script = textwrap.dedent("""
        import warnings
        import numpy as np
        from rlbuf import DistillationBuffer, ReplayBuffer, RolloutBuffer
        warnings.simplefilter("error")

        def frozen(shape, dtype=np.float32):
            array = np.zeros(shape, dtype)
            array.flags.writeable = False
            return array

        for n in (1, 3, 300):  # one row, several (staged), many (the tensor way)
            for options, mask in (({}, None), ({}, frozen(n, bool) | True), ({"compact": True}, None),
                                  ({"obs_shape": {"a": (4,)}}, None)):
                options = {"obs_shape": (4,), **options}
                buf = ReplayBuffer(1000, action_shape=(2,), num_envs=n, **options)
                obs = {"a": frozen((n, 4))} if isinstance(options["obs_shape"], dict) else frozen((n, 4))
                buf.add(obs, frozen((n, 2)), frozen(n), obs, frozen(n, bool), frozen(n, bool), env_mask=mask)
                if not buf.compact:
                    buf.sample_by_index(frozen(1, np.int64))
            distill = DistillationBuffer(1000, obs_shape=(4,), action_shape=(2,), num_envs=n)
            distill.add(frozen((n, 4)), frozen((n, 2)))
            distill.add(frozen((2, 4)), frozen((2, 2)))
            rollout = RolloutBuffer(2, n, obs_shape=(4,), action_shape=(2,))
            rollout.add(frozen((n, 4)), frozen((n, 2)), frozen(n), frozen(n, bool), frozen(n), frozen(n),
                        truncated=frozen(n, bool))
        print("stored")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "PYTHONPATH": str(Path(__file__).parents[1])})
    assert done.returncode == 0 and done.stdout.strip() == "stored", done.stderr[-2000:]
