"""The Recorder checks every final observation as a direct add checks a row, before anything is written.

Each example drives a Recorder (every autoreset mode; flat float32, uint8 and dict
observations; replay and rollout buffers) through a few valid steps, then records a step whose
``info["final_obs"]`` for one ended env is drawn from hostile values (``None``, scalars and
one-element arrays that would broadcast, ``1e300``, complex, strings, wrong lengths, 2-D rows,
object, dict and ragged rows, the meta device, floats into ``uint8``, out-of-range integers),
from arrays and tensors of any shape, dtype and fill, or from valid rows. A refused step raises an rlbuf error naming ``info["final_obs"][env]`` and
leaves the buffer, its statistics and the Recorder exactly as they were (full snapshots); an
accepted one stores the row exactly. Outside ``SAME_STEP``, an ``info`` that carries final
observations contradicts the mode and is refused the same way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch
from _snapshot import same, snapshot
from gymnasium.vector import AutoresetMode
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlbuf import (
    ConfigError,
    DeviceError,
    DtypeError,
    EpisodeStats,
    MissingFieldError,
    NonFiniteError,
    ReplayBuffer,
    RlbufError,
    RolloutBuffer,
    ShapeError,
)
from rlbuf.gym import Recorder, isaac_step, sb3_step

NUM_ENVS = 2
ENDED = 1  # the env whose episode ends at the recorded step
OBS_KINDS = ["flat", "uint8", "dict"]
FUZZ = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@dataclass(frozen=True)
class Candidate:
    """A value for ``info["final_obs"][ENDED]``; ``stored`` is what a valid one stores (``None``: refused)."""

    label: str
    value: Any
    stored: Any = None


def leaf_rows(obs_kind: str) -> list[Candidate]:
    """Hostile and valid rows of a single-tensor leaf: float32 ``(3,)`` or uint8 ``(3,)``."""
    meta = torch.zeros(3, device="meta")
    ragged = [[1.0, 2.0], [3.0]]
    hostile = [
        Candidate("None", None), Candidate("scalar", 5.0), Candidate("int", 5),
        Candidate("one-element", np.array([1.0], np.float32)), Candidate("2-D", np.zeros((1, 3), np.float32)),
        Candidate("short", np.zeros(2, np.float32)), Candidate("long", np.zeros(4, np.float32)),
        Candidate("complex", np.array([1 + 2j, 0, 0])), Candidate("strings", np.array(["1", "2", "3"])),
        Candidate("string", "1 2 3"), Candidate("object", np.array([object(), 1, 2], dtype=object)),
        Candidate("dict", {"a": np.zeros(3)}), Candidate("ragged", ragged), Candidate("meta", meta),
        Candidate("complex tensor", torch.zeros(3, dtype=torch.cfloat)),
    ]
    if obs_kind == "uint8":
        hostile += [Candidate("floats into uint8", np.array([3.7, 300.0, -1.0])),
                    Candidate("300 into uint8", np.array([3, 300, 1])), Candidate("-1 into uint8", np.array([3, -1, 1])),
                    Candidate("float tensor into uint8", torch.tensor([1.0, 2.0, 3.0]))]
        valid = [Candidate("uint8", np.array([3, 44, 255], np.uint8), [3, 44, 255]),
                 Candidate("int64 in range", np.array([0, 1, 255]), [0, 1, 255]),
                 Candidate("list", [7, 8, 9], [7, 8, 9]),
                 Candidate("tensor", torch.tensor([1, 2, 3], dtype=torch.uint8), [1, 2, 3]),
                 Candidate("bools (an integer field takes them)", np.array([True, False, True]), [1, 0, 1])]
    else:
        hostile += [Candidate("bools into float", np.array([True, False, True])),
                    Candidate("1e300", np.array([1e300, 0.0, 0.0])), Candidate("ints into float", np.array([1, 2, 3])),
                    Candidate("-1e300 tensor", torch.tensor([-1e300, 0.0, 0.0], dtype=torch.float64))]
        valid = [Candidate("float32", np.array([1.5, -2.0, 3.0], np.float32), [1.5, -2.0, 3.0]),
                 Candidate("float64", np.array([0.25, 1e30, -4.0]), [0.25, float(np.float32(1e30)), -4.0]),
                 Candidate("nan and inf", np.array([math.nan, math.inf, 0.0], np.float32), [math.nan, math.inf, 0.0]),
                 Candidate("tensor", torch.tensor([1.0, 2.0, 3.0]), [1.0, 2.0, 3.0]),
                 Candidate("list", [0.5, 0.25, 0.125], [0.5, 0.25, 0.125])]
    return hostile + valid


def dict_rows() -> list[Candidate]:
    """Hostile and valid dict observations ``{"pos": (3,) float32, "cam": {"px": (2,) uint8}}``."""
    good = {"pos": np.array([1.0, 2.0, 3.0], np.float32), "cam": {"px": np.array([4, 5], np.uint8)}}
    stored = {"pos": [1.0, 2.0, 3.0], "px": [4, 5]}
    return [
        Candidate("None", None), Candidate("array", np.zeros(3, np.float32)), Candidate("list", [1, 2]),
        Candidate("missing key", {"pos": good["pos"]}),
        Candidate("unknown key", {**good, "extra": np.zeros(1)}),
        Candidate("scalar leaf", {"pos": 1.0, "cam": good["cam"]}),
        Candidate("1e300 leaf", {"pos": np.array([1e300, 0, 0]), "cam": good["cam"]}),
        Candidate("float into uint8 leaf", {"pos": good["pos"], "cam": {"px": np.array([1.5, 2.0])}}),
        Candidate("300 into uint8 leaf", {"pos": good["pos"], "cam": {"px": np.array([300, 2])}}),
        Candidate("None leaf", {"pos": None, "cam": good["cam"]}),
        Candidate("not a dict below", {"pos": good["pos"], "cam": np.zeros(2, np.uint8)}),
        Candidate("valid", good, stored),
        Candidate("valid tensors", {"pos": torch.tensor([1.0, 2.0, 3.0]), "cam": {"px": torch.tensor([4, 5], dtype=torch.uint8)}},
                  stored),
    ]


def candidates(obs_kind: str) -> list[Candidate]:
    return dict_rows() if obs_kind == "dict" else leaf_rows(obs_kind)


_DTYPES = [np.float16, np.float32, np.float64, np.int8, np.int32, np.int64, np.uint8, np.bool_, np.complex64]
_FILLS = [0, 1, -1, 0.5, 3.7, 255, 256, 300, -129, 2**40, 1e38, 3.5e38, 1e300, math.nan, math.inf]
_SHAPES = [(), (1,), (2,), (3,), (4,), (1, 3), (3, 1), (0,)]
_FLOAT32_MAX = float(np.finfo(np.float32).max)


@st.composite
def generated(draw: st.DrawFn, obs_kind: str) -> Candidate:
    """An array (or tensor) of any shape, dtype and fill; what a direct add does with it decides ``stored``."""
    shape, dtype, fill = draw(st.sampled_from(_SHAPES)), draw(st.sampled_from(_DTYPES)), draw(st.sampled_from(_FILLS))
    with np.errstate(all="ignore"):
        array = np.full(shape, fill).astype(dtype)
    value: Any = torch.from_numpy(array) if draw(st.booleans(), label="as a tensor") else array
    kind = array.dtype.kind
    stored: Any = None
    if shape == (3,) and obs_kind == "uint8" and kind in "biu" and array.min() >= 0 and array.max() <= 255:
        stored = array.astype(np.uint8).tolist()
    finite = array[np.isfinite(array)].astype(np.float64) if kind == "f" else array
    if shape == (3,) and obs_kind != "uint8" and kind == "f" and (finite.size == 0 or np.abs(finite).max() <= _FLOAT32_MAX):
        stored = array.astype(np.float32).tolist()
    if obs_kind == "dict":
        return Candidate(f"pos {dtype.__name__}{shape}={fill}", {"pos": value, "cam": {"px": np.array([4, 5], np.uint8)}},
                         None if stored is None else {"pos": stored, "px": [4, 5]})
    return Candidate(f"{dtype.__name__}{shape}={fill}", value, stored)


class Envs:
    """Just what the Recorder reads of a vector env."""

    num_envs = NUM_ENVS

    def __init__(self, mode: AutoresetMode) -> None:
        self.metadata = {"autoreset_mode": mode}


def observation(obs_kind: str, fill: float) -> Any:
    """A valid ``[NUM_ENVS, ...]`` observation of the kind."""
    if obs_kind == "dict":
        return {"pos": np.full((NUM_ENVS, 3), fill, np.float32), "cam": {"px": np.full((NUM_ENVS, 2), fill, np.uint8)}}
    return np.full((NUM_ENVS, 3), fill, np.uint8 if obs_kind == "uint8" else np.float32)


def build(kind: str, obs_kind: str) -> ReplayBuffer | RolloutBuffer:
    shape: Any = {"pos": (3,), "cam": {"px": (2,)}} if obs_kind == "dict" else (3,)
    dtype: Any = {"cam": {"px": torch.uint8}} if obs_kind == "dict" else (
        torch.uint8 if obs_kind == "uint8" else torch.float32)
    stats = EpisodeStats(NUM_ENVS)
    if kind == "replay":
        return ReplayBuffer(100, obs_shape=shape, obs_dtype=dtype, action_shape=(), num_envs=NUM_ENVS, stats=stats,
                            seed=0)
    return RolloutBuffer(8, NUM_ENVS, obs_shape=shape, obs_dtype=dtype, action_shape=(), stats=stats, seed=0)


def bootstrap(final: Any) -> torch.Tensor:
    rows = final["pos"] if isinstance(final, dict) else final
    return torch.nan_to_num(torch.as_tensor(np.asarray(rows, np.float32)), 0.0, 0.0, 0.0).sum(-1)


def step(recorder: Recorder, obs_kind: str, *, ended: bool, final: Any = None, info: Any = None) -> None:
    flags = np.array([False, ended])
    extra = {"value": np.zeros(NUM_ENVS, np.float32), "log_prob": np.zeros(NUM_ENVS, np.float32)} if isinstance(
        recorder.buffer, RolloutBuffer) else {}
    if info is None and ended:
        entries = np.empty(NUM_ENVS, dtype=object)
        entries[ENDED] = final
        info = {"final_obs": entries, "_final_obs": flags.copy()}
    # next_obs equal to obs: each step continues the one before, as the Recorder checks
    recorder.record(observation(obs_kind, 1), np.zeros(NUM_ENVS, np.float32), np.ones(NUM_ENVS, np.float32),
                    observation(obs_kind, 1), np.zeros(NUM_ENVS, bool), flags, info, **extra)


def valid_final(obs_kind: str) -> Any:
    return next(c.value for c in candidates(obs_kind) if c.stored is not None)


def state(recorder: Recorder) -> Any:
    buffer = recorder.buffer
    return (snapshot(buffer), snapshot(buffer.stats), recorder._resetting.tolist(), recorder.skipped)


def stored_row(buffer: ReplayBuffer, obs_kind: str) -> Any:
    next_obs = buffer.sample_all().next_obs
    if obs_kind == "dict":
        return {"pos": next_obs["pos"][-1].tolist(), "px": next_obs["cam", "px"][-1].tolist()}
    return next_obs[-1].tolist()


def same_values(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_values(a[k], b[k]) for k in a)
    return len(a) == len(b) and all(x == y or (x != x and y != y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("obs_kind", OBS_KINDS)
@pytest.mark.parametrize("kind", ["replay", "rollout"])
@pytest.mark.parametrize("mode", list(AutoresetMode), ids=lambda m: m.name)
@FUZZ
@given(data=st.data())
def test_a_final_observation_is_checked_like_a_direct_add_and_a_refusal_changes_nothing(
        mode: AutoresetMode, kind: str, obs_kind: str, data: st.DataObject) -> None:
    if kind == "rollout" and mode is AutoresetMode.NEXT_STEP:
        pytest.skip("a RolloutBuffer refuses NEXT_STEP envs (tests/test_gym.py)")
    candidate = data.draw(st.one_of(st.sampled_from(candidates(obs_kind)), generated(obs_kind)), label="final_obs")
    warm_up = data.draw(st.integers(0, 3), label="valid steps before")
    buffer = build(kind, obs_kind)
    recorder = Recorder(Envs(mode), buffer, bootstrap=bootstrap if kind == "rollout" else None)
    for i in range(warm_up):
        ended = i % 2 == 1
        if mode is AutoresetMode.SAME_STEP:
            step(recorder, obs_kind, ended=ended, final=valid_final(obs_kind))
        else:
            step(recorder, obs_kind, ended=ended, info={})
    before = state(recorder)
    refused = candidate.stored is None or mode is not AutoresetMode.SAME_STEP
    if not refused:
        step(recorder, obs_kind, ended=True, final=candidate.value)
        if kind == "replay":
            assert same_values(stored_row(buffer, obs_kind), candidate.stored)
        return
    with pytest.raises(RlbufError) as caught:
        step(recorder, obs_kind, ended=True, final=candidate.value)
    message = str(caught.value)
    if mode is AutoresetMode.SAME_STEP:
        assert f'info["final_obs"][{ENDED}]' in message and f"env {ENDED}" in message, message
        assert isinstance(caught.value, ShapeError | DtypeError | DeviceError | MissingFieldError), message
    else:
        assert isinstance(caught.value, ConfigError) and "same_step" in message, message
    assert same(state(recorder), before)


@pytest.mark.parametrize("info", [[1, 2], "final_obs", 5, ("a", "b")], ids=repr)
def test_an_info_that_is_not_a_dict_is_refused_by_name(info: Any) -> None:
    recorder = Recorder(Envs(AutoresetMode.SAME_STEP), build("replay", "flat"))
    before = state(recorder)
    with pytest.raises(ShapeError, match=r"info: expected the info dict of this envs\.step"):
        step(recorder, "flat", ended=True, info=info)
    assert same(state(recorder), before)


@pytest.mark.parametrize("final", [5, "abc", np.zeros(3), np.empty(3, dtype=object), [None], {"0": None}],
                         ids=["int", "str", "3 rows", "3 entries", "1 entry", "dict"])
def test_a_final_obs_without_one_entry_per_env_is_refused(final: Any) -> None:
    recorder = Recorder(Envs(AutoresetMode.SAME_STEP), build("replay", "flat"))
    before = state(recorder)
    with pytest.raises(ShapeError, match=r'info\["final_obs"\]: expected one entry per env \(2'):
        step(recorder, "flat", ended=True, info={"final_obs": final, "_final_obs": np.array([False, True])})
    assert same(state(recorder), before)


def test_next_step_envs_whose_info_carries_final_observations_are_refused_with_the_fix() -> None:
    recorder = Recorder(Envs(AutoresetMode.NEXT_STEP), build("replay", "flat"))
    entries = np.empty(NUM_ENVS, dtype=object)
    entries[ENDED] = np.zeros(3, np.float32)
    with pytest.raises(ConfigError) as caught:
        step(recorder, "flat", ended=True, info={"final_obs": entries, "_final_obs": np.array([False, True])})
    assert str(caught.value) == (
        "info['final_obs']: the Recorder was built for NEXT_STEP envs, but this step's info carries final "
        "observations, which only envs that reset in the same step return: their next_obs holds reset observations "
        "and would be stored as the ends of episodes; set envs.metadata['autoreset_mode'] to 'SameStep' (or, where "
        "it names no mode, pass autoreset_mode='same_step')")
    assert len(recorder.buffer) == 0 and recorder.skipped == 0


def test_the_exact_message_of_a_uint8_final_observation_out_of_range() -> None:
    recorder = Recorder(Envs(AutoresetMode.SAME_STEP), build("replay", "uint8"))
    with pytest.raises(DtypeError) as caught:
        step(recorder, "uint8", ended=True, final=np.array([3.7, 300, -1]))
    assert str(caught.value) == (
        'info["final_obs"][1]: expected dtype torch.uint8 (or one that converts to it without changing kind), got '
        "float64; env 1's final observation is its next_obs (stored, or passed to bootstrap): give it as the envs "
        "give observations, one row of (3,) uint8 (nothing is broadcast or converted)")


def test_a_final_observation_tensor_of_a_batched_env_is_read_row_by_row() -> None:
    recorder = Recorder(Envs(AutoresetMode.SAME_STEP), build("replay", "flat"))
    final = torch.tensor([[9.0, 9.0, 9.0], [1.0, 2.0, 3.0]])
    _, _, info = isaac_step(torch.tensor([False, True]), {}, final_obs=final)
    step(recorder, "flat", ended=True, info=info)
    assert recorder.buffer.sample_all().next_obs.tolist() == [[1.0] * 3, [1.0, 2.0, 3.0]]


@pytest.mark.parametrize(("dones", "infos", "error", "message"), [
    (np.array([True, False]), [{}], ShapeError, r"infos: expected one info dict per env \(2, as many as dones\), got 1"),
    (np.array([True, False]), "ab", ShapeError, "infos: expected one info dict per env"),
    (np.array([True, False]), [{}, "x"], ShapeError, r"infos\[1\]: expected the info dict of env 1"),
    (np.array([1, 0]), [{}, {}], DtypeError, "dones: expected bools, got int64"),
    (np.zeros((2, 2), bool), [{}, {}], ShapeError, r"dones: expected shape \(num_envs,\)"),
    (np.array([True]), [{"TimeLimit.truncated": np.array([1, 2])}], DtypeError,
     r"infos\[0\]\['TimeLimit.truncated'\]: expected True or False"),
])
def test_sb3_step_refuses_what_it_cannot_read_by_name(dones: Any, infos: Any, error: type[Exception],
                                                        message: str) -> None:
    with pytest.raises(error, match=message):
        sb3_step(dones, infos)


@pytest.mark.parametrize(("dones", "extras", "error", "message"), [
    (np.array([True]), {}, DtypeError, "dones: expected a tensor of flags, got ndarray"),
    (torch.tensor([0.5, 1.0]), {}, DtypeError, "dones: expected bools"),
    (torch.tensor([2, 1]), {}, DtypeError, "dones: expected bools"),
    (torch.tensor([True, False]), [1], ShapeError, "extras: expected the env's extras dict"),
    (torch.tensor([True, False]), {"time_outs": torch.tensor([True])}, ShapeError,
     r"extras\['time_outs'\]: expected a tensor of shape \(2,\)"),
])
def test_isaac_step_refuses_what_it_cannot_read_by_name(dones: Any, extras: Any, error: type[Exception],
                                                          message: str) -> None:
    with pytest.raises(error, match=message):
        isaac_step(dones, extras)


def test_isaac_step_takes_integer_dones_as_flags() -> None:
    terminated, truncated, _ = isaac_step(torch.tensor([1, 0, 1]), {"time_outs": torch.tensor([[True], [False], [False]])})
    assert terminated.tolist() == [False, False, True] and truncated.tolist() == [True, False, False]


def test_a_bootstrap_that_returns_bools_or_text_is_refused_before_anything_is_stored() -> None:
    for returned, error in ((torch.tensor([True]), DtypeError), (["a"], DtypeError), (None, ShapeError),
                            (torch.zeros(1, device="meta"), DeviceError), (torch.zeros(1, dtype=torch.cfloat), DtypeError),
                            (np.array([1e300]), DtypeError), (torch.tensor([float("nan")]), NonFiniteError)):
        buffer = build("rollout", "flat")
        recorder = Recorder(Envs(AutoresetMode.SAME_STEP), buffer, bootstrap=lambda final, r=returned: r)
        before = state(recorder)
        with pytest.raises(error, match="bootstrap"):  # bootstrap_value, once the add checks the values
            step(recorder, "flat", ended=True, final=np.zeros(3, np.float32))
        assert same(state(recorder), before)


@pytest.mark.parametrize(("obs_kind", "next_obs", "error", "message"), [
    ("flat", np.array([[0.0, 0.0, 0.0], [1e300, 0.0, 0.0]]), DtypeError, r"next_obs\[1\]: values up to 1e\+300"),
    ("uint8", np.array([[0.0, 0.0, 0.0], [3.7, 300.0, -1.0]]), DtypeError, r"next_obs\[1\]: expected dtype torch\.uint8"),
    ("flat", np.zeros((2, 4), np.float32), ShapeError, r"next_obs: expected shape \(2, 3\), got \(2, 4\)"),
    ("dict", {"pos": np.zeros((2, 3), np.float32)}, MissingFieldError, r'next_obs\["cam"\]: missing'),
])
def test_disabled_envs_final_observations_are_checked_before_bootstrap_reads_them(
        obs_kind: str, next_obs: Any, error: type[Exception], message: str) -> None:
    read: list[Any] = []
    buffer = build("rollout", obs_kind)
    recorder = Recorder(Envs(AutoresetMode.DISABLED), buffer, bootstrap=lambda final: read.append(final) or bootstrap(final))
    before = state(recorder)
    with pytest.raises(error, match=message):
        recorder.record(observation(obs_kind, 1), np.zeros(NUM_ENVS, np.float32), np.ones(NUM_ENVS, np.float32),
                        next_obs, np.zeros(NUM_ENVS, bool), np.array([False, True]), {},
                        value=np.zeros(NUM_ENVS, np.float32), log_prob=np.zeros(NUM_ENVS, np.float32))
    assert read == [] and same(state(recorder), before)


def test_a_compact_buffer_refuses_a_hostile_final_observation_and_stores_a_valid_one() -> None:
    buffer = ReplayBuffer(100, obs_shape=(3,), action_shape=(), num_envs=NUM_ENVS, compact=True, seed=0,
                          stats=EpisodeStats(NUM_ENVS))
    recorder = Recorder(Envs(AutoresetMode.SAME_STEP), buffer)
    first, second = np.zeros((2, 3), np.float32), np.ones((2, 3), np.float32)
    recorder.record(first, np.zeros(2, np.float32), np.ones(2, np.float32), second, np.zeros(2, bool),
                    np.zeros(2, bool), {})
    reset = np.full((2, 3), 7.0, np.float32)

    def end_env_1(final: Any) -> None:
        entries = np.empty(2, dtype=object)
        entries[1] = final
        recorder.record(second, np.zeros(2, np.float32), np.ones(2, np.float32), reset, np.zeros(2, bool),
                        np.array([False, True]), {"final_obs": entries, "_final_obs": np.array([False, True])})

    before = state(recorder)
    for hostile in (None, 5.0, np.array([1e300, 0.0, 0.0]), np.zeros((1, 3)), [[1.0], [2.0, 3.0]]):
        with pytest.raises(RlbufError, match=r'info\["final_obs"\]\[1\]'):
            end_env_1(hostile)
        assert same(state(recorder), before)
    end_env_1(np.array([2.0, 2.0, 2.0], np.float32))
    assert buffer.sample_all().next_obs[-1].tolist() == [2.0, 2.0, 2.0]
