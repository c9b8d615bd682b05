"""Holes found by the attacker of issue 20: extras a checkpoint cannot write, returns that overflow,
``num_envs`` and shapes beyond what can be allocated, masked arrays.

Each refusal is an rlbuf error naming the field, and a refused call leaves the buffer as it was.
"""

from __future__ import annotations

import tracemalloc
from typing import Any

import numpy as np
import pytest
import torch
from _snapshot import same, snapshot
from tensordict import TensorDict

from rlbuf import (
    GAE,
    ConfigError,
    DistillationBuffer,
    DtypeError,
    NonFiniteError,
    ReplayBuffer,
    RlbufError,
    RolloutBuffer,
)
from rlbuf.gae import compute_gae


def rollout(reward: float = 1.0, value: float = 0.0, *, computed: bool = True) -> RolloutBuffer:
    buf = RolloutBuffer(4, 2, obs_shape=(3,), action_shape=(), seed=0)
    for _ in range(4):
        buf.add(torch.zeros(2, 3), torch.zeros(2), torch.full((2,), reward), torch.zeros(2, dtype=torch.bool),
                torch.full((2,), value), torch.zeros(2), truncated=False)
    if computed and abs(reward) < 1e30 and abs(value) < 1e30:
        buf.compute_returns_and_advantages(torch.zeros(2))
    return buf


# -- 1. set_extras: only dtypes a buffer stores (and a checkpoint writes) ----------------------------------

UNSTORABLE = [torch.complex64, torch.bfloat16, torch.uint16, torch.float8_e5m2, torch.uint32]


@pytest.mark.parametrize("dtype", UNSTORABLE, ids=str)
def test_set_extras_refuses_a_dtype_a_checkpoint_cannot_write(dtype: torch.dtype) -> None:
    buf = rollout()
    buf.set_extras({"kept": torch.ones(4, 2)})
    before = snapshot(buf)
    with pytest.raises(DtypeError, match=r"^q: expected one of the dtypes a buffer stores .*torch.float32.*got "
                       + str(dtype).replace(".", r"\.")):
        buf.set_extras({"q": torch.zeros(4, 2).to(dtype)})
    assert same(before, snapshot(buf))


def test_set_extras_refuses_a_sparse_extra_and_keeps_storable_ones(tmp_path: Any) -> None:
    buf = rollout()
    before = snapshot(buf)
    with pytest.raises(DtypeError, match=r"^q: expected a dense"):
        buf.set_extras({"q": torch.zeros(4, 2).to_sparse()})
    assert same(before, snapshot(buf))
    buf.set_extras({"q": torch.arange(8, dtype=torch.int16).reshape(4, 2)})
    buf.save(tmp_path / "ck")
    loaded = RolloutBuffer.load(tmp_path / "ck")
    assert loaded.check_valid() == (True, "")


# -- 2. advantages and returns beyond float32 are refused before they are written -------------------------

@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize(("reward", "value", "last"), [(3e38, 0.0, 0.0), (1.0, -3e38, 3e38)])
def test_returns_that_overflow_are_refused_and_the_advantages_kept(reward: float, value: float, last: float,
                                                                   normalize: bool) -> None:
    buf = rollout(reward, value, computed=False)
    buf.set_extras({"advantage": torch.full((4, 2), 0.5), "returns": torch.full((4, 2), 0.25)})
    before = snapshot(buf)
    with pytest.raises(NonFiniteError, match=r"^(advantage|returns): the computed values do not fit torch\.float32 "
                       r"\(got -?inf at step \d, env \d\).*scale the rewards"):
        buf.compute_returns_and_advantages(torch.full((2,), last), gamma=1.0, gae_lambda=1.0,
                                           normalize_advantages=normalize)
    assert same(before, snapshot(buf))
    assert buf.view("advantage").eq(0.5).all() and buf.advantages_ready


def test_normalizing_advantages_spread_beyond_float32_is_refused() -> None:
    buf = RolloutBuffer(8, 1, obs_shape=(1,), action_shape=(), seed=0)
    for reward in (-3e38, *[3e38] * 7):  # each step its own episode: the advantages are the rewards
        buf.add(torch.zeros(1, 1), torch.zeros(1), torch.tensor([reward]), torch.tensor([True]), torch.zeros(1),
                torch.zeros(1), truncated=False)
    before = snapshot(buf)
    with pytest.raises(NonFiniteError, match=r"^advantage: normalizing gave NaN or inf"):
        buf.compute_returns_and_advantages(torch.zeros(1), normalize_advantages=True)
    assert same(before, snapshot(buf))
    buf.compute_returns_and_advantages(torch.zeros(1))  # unnormalized they fit
    assert buf.view("advantage").flatten().tolist() == pytest.approx([-3e38, *[3e38] * 7])


@pytest.mark.parametrize("backend", ["torch", "numba"])
def test_compute_gae_refuses_results_that_overflow(backend: str) -> None:
    reward = torch.full((3, 2), 3e38)
    value = torch.zeros(3, 2)
    out = (torch.full((3, 2), 7.0), torch.full((3, 2), 8.0))
    with pytest.raises(NonFiniteError, match=r"^advantage: the computed values do not fit torch\.float32"):
        compute_gae(reward, value, torch.zeros(3, 2, dtype=torch.bool), None, torch.zeros(2), gamma=1.0,
                    gae_lambda=1.0, backend=backend, out=out)  # type: ignore[arg-type]
    _, returns = compute_gae(reward.double(), value.double(), torch.zeros(3, 2, dtype=torch.bool), None,
                                     torch.zeros(2, dtype=torch.float64), gamma=1.0, gae_lambda=1.0, backend=backend)
    assert bool(torch.isfinite(returns).all())  # the fix the message gives: float64


def test_the_gae_transform_refuses_values_targets_beyond_float32() -> None:
    td = TensorDict({"state_value": torch.full((3,), -3e38), ("next", "reward"): torch.zeros(3),
                     ("next", "state_value"): torch.full((3,), 3e38),
                     ("next", "terminated"): torch.zeros(3, dtype=torch.bool),
                     ("next", "truncated"): torch.zeros(3, dtype=torch.bool)}, batch_size=[3])
    with pytest.raises(NonFiniteError, match=r"^advantage: the computed values do not fit"):
        GAE(gamma=1.0, lmbda=1.0)(td)
    assert td.get("advantage", None) is None


# -- 3. num_envs refused before anything is allocated --------------------------------------------------------

@pytest.mark.parametrize("num_envs", [10**12, 2**63, 10**9])
@pytest.mark.parametrize("kind", ["replay", "rollout", "distill"])
def test_num_envs_beyond_the_capacity_or_limit_is_refused_before_allocating(kind: str, num_envs: int) -> None:
    build = {
        "replay": lambda: ReplayBuffer(10, obs_shape=(3,), action_shape=(), num_envs=num_envs),
        "rollout": lambda: RolloutBuffer(2, num_envs, obs_shape=(3,), action_shape=()),
        "distill": lambda: DistillationBuffer(10, obs_shape=(3,), action_shape=(), num_envs=num_envs),
    }[kind]
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError, match=r"^(num_envs: expected an int in \[1, 2147483647\]|capacity)"):
            build()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 50 * 2**20


# -- 4. shapes torch cannot hold with the batch dims --------------------------------------------------------

@pytest.mark.parametrize(("options", "name"), [
    ({"obs_shape": (1,) * 63}, "obs_shape"),
    ({"action_shape": (1,) * 70}, "action_shape"),
    ({"obs_shape": {"a": (2,), "b": (1,) * 64}}, r"obs_shape\['b'\]"),
    ({"hidden_state_shape": (1,) * 63}, "hidden_state_shape"),
    ({"extra_fields": {"q": ((1,) * 65, torch.float32)}}, r"extra_fields\['q'\]"),
])
def test_shapes_of_more_than_62_dims_are_refused_by_name(options: dict[str, Any], name: str) -> None:
    settings: dict[str, Any] = {"obs_shape": (3,), "action_shape": (), **options}
    for build in (ReplayBuffer, RolloutBuffer):
        if build is RolloutBuffer and "hidden_state_shape" in options:
            continue
        args = (10,) if build is ReplayBuffer else (2, 2)
        with pytest.raises(ConfigError, match=rf"^{name}: expected at most 62 dims .*got \d+; flatten"):
            build(*args, **settings)


def test_62_dims_fill_torch_with_two_batch_dims() -> None:
    shape = (1,) * 62
    buf = ReplayBuffer(8, obs_shape=shape, action_shape=(), seed=0)
    for _ in range(4):
        buf.add(torch.zeros(shape), 0.0, 1.0, torch.zeros(shape), False, truncated=False)
    assert buf.sample_sequences(2, 2).obs.dim() == 64


# -- 5. masked arrays ----------------------------------------------------------------------------------------

def replay() -> ReplayBuffer:
    buf = ReplayBuffer(8, obs_shape=(3,), action_shape=(), seed=0, num_envs=2)
    buf.add(torch.zeros(2, 3), torch.zeros(2), torch.ones(2), torch.zeros(2, 3), torch.tensor([False, False]), truncated=False)
    return buf


@pytest.mark.parametrize("field", ["obs", "reward", "action"])
def test_a_masked_array_with_masked_entries_is_refused(field: str) -> None:
    buf = replay()
    values: dict[str, Any] = {"obs": np.zeros((2, 3), np.float32), "action": np.zeros(2, np.float32),
                              "reward": np.ones(2, np.float32)}
    values[field] = np.ma.masked_array(values[field], mask=np.zeros(values[field].shape, bool))
    values[field].mask.flat[0] = True
    before = snapshot(buf)
    with pytest.raises(DtypeError, match=rf"^{field}: expected plain values, got a masked array with 1 masked "
                       r"entries .*\.filled\("):
        buf.add(values["obs"], values["action"], values["reward"], np.zeros((2, 3), np.float32),
                np.zeros(2, bool), truncated=False)
    assert same(before, snapshot(buf))


def test_a_masked_array_with_nothing_masked_is_stored_as_its_values() -> None:
    buf = replay()
    buf.add(np.zeros((2, 3)), np.zeros(2), np.ma.masked_array([1.5, 2.5]), np.zeros((2, 3)), np.zeros(2, bool), truncated=False)
    buf.add(np.zeros((2, 3)), np.zeros(2), np.ma.masked_array([3.5, 4.5], mask=[False, False]), np.zeros((2, 3)),
            np.zeros(2, bool), truncated=False)
    assert buf.sample_all().reward.tolist()[-4:] == [1.5, 2.5, 3.5, 4.5]


def test_every_refusal_here_is_an_rlbuf_error() -> None:
    for error in (ConfigError, DtypeError, NonFiniteError):
        assert issubclass(error, RlbufError)


# -- 6. values that round to the largest finite float are stored, values that round to inf refused -----------

@pytest.mark.parametrize("value", [
    torch.tensor([65519.0]), np.array([65519.0], np.float32), [65519.0], torch.tensor([65519.99], dtype=torch.float64),
])
def test_a_value_rounding_to_float16s_largest_is_stored_as_it(value: Any) -> None:
    buf = ReplayBuffer(8, obs_shape=(1,), action_shape=(), seed=0, obs_dtype=torch.float16)
    buf.add(value, 0.0, 0.0, torch.zeros(1), False, truncated=False)
    assert buf.sample_all().obs.tolist() == [[65504.0]]


@pytest.mark.parametrize("value", [
    torch.tensor([65520.0]), np.array([65520.0], np.float32), [65520.0],
    torch.tensor([65519.999], dtype=torch.float64),  # torch rounds it through float32: 65520, inf
])
def test_a_value_rounding_to_inf_in_float16_is_refused(value: Any) -> None:
    buf = ReplayBuffer(8, obs_shape=(1,), action_shape=(), seed=0, obs_dtype=torch.float16)
    before = snapshot(buf)
    with pytest.raises(DtypeError, match=r"^obs: values up to 6\.552e\+04 in magnitude do not fit torch\.float16"):
        buf.add(value, 0.0, 0.0, torch.zeros(1), False, truncated=False)
    assert same(before, snapshot(buf))


@pytest.mark.parametrize("reward", [3.4028235e38, np.float64(3.4028235e38), np.array([3.4028235e38]),
                                    torch.tensor([3.4028235e38], dtype=torch.float64)])
def test_a_float64_rounding_to_float32s_largest_is_stored(reward: Any) -> None:
    buf = ReplayBuffer(8, obs_shape=(1,), action_shape=(), seed=0)
    buf.add(torch.zeros(1), 0.0, reward, torch.zeros(1), False, truncated=False)
    assert buf.sample_all().reward.tolist() == [float(np.finfo(np.float32).max)]
    with pytest.raises(DtypeError, match=r"^reward: .*do not fit torch\.float32|^reward: .*does not fit"):
        buf.add(torch.zeros(1), 0.0, 3.4028235677973366e38, torch.zeros(1), False, truncated=False)
    assert len(buf) == 1
