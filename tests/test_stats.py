"""Tests of rlbuf.stats.EpisodeStats: bookkeeping, summaries, checkpoint state, validation."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlbuf.errors import (
    CheckpointError,
    DtypeError,
)
from rlbuf.stats import EpisodeStats

T = True
F = False


def flags(*values: bool) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.bool)


def rewards(*values: float) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def snapshot(stats: EpisodeStats) -> dict[str, Any]:
    """Everything observable about the tracker, as plain comparable values."""
    state = stats.state_dict()
    state["running_return"] = state["running_return"].tolist()
    state["running_length"] = state["running_length"].tolist()
    return {"state": state, "summary": stats.summary(), "repr": repr(stats)}


# --- bookkeeping -------------------------------------------------------------------------


def test_known_sequence_single_env() -> None:
    stats = EpisodeStats(1)
    for reward, terminated in [(1.0, F), (2.0, F), (3.0, T), (0.5, F)]:
        stats.update(reward, terminated)
    stats.update(0.25, False, True)
    assert stats.recent_returns() == [6.0, 0.75]
    assert stats.recent_lengths() == [3, 2]
    assert stats.episodes_finished == 2
    assert stats.summary()["reasons"] == {"terminated": 1, "truncated": 1}


def test_two_envs_finish_on_the_same_step() -> None:
    stats = EpisodeStats(3)
    stats.update(rewards(1.0, 10.0, 100.0), flags(F, F, F))
    stats.update(rewards(2.0, 20.0, 200.0), flags(T, F, F), flags(F, F, F))
    stats.update(rewards(3.0, 30.0, 300.0), flags(T, F, T), flags(F, T, F))
    # Step order, then env order within a step.
    assert stats.recent_returns() == [3.0, 3.0, 60.0, 600.0]
    assert stats.recent_lengths() == [2, 1, 3, 3]
    assert stats.summary()["reasons"] == {"terminated": 3, "truncated": 1}
    stats.update(rewards(1.0, 1.0, 1.0), flags(T, T, T))
    assert stats.recent_lengths()[-3:] == [1, 1, 1]


def test_episode_spans_rollouts() -> None:
    stats = EpisodeStats(2)
    for _ in range(3):
        stats.update(rewards(1.0, 2.0), flags(F, F))
    # Between "rollouts" a trainer reads statistics, checkpoints, and so on: nothing resets.
    assert stats.summary()["episodes"] == 0
    stats.state_dict()
    repr(stats)
    for _ in range(2):
        stats.update(rewards(1.0, 2.0), flags(F, F))
    stats.update(rewards(1.0, 2.0), flags(T, F))
    assert stats.recent_returns() == [6.0]
    assert stats.recent_lengths() == [6]
    stats.update(rewards(1.0, 2.0), flags(F, T))
    assert stats.recent_returns() == [6.0, 14.0]
    assert stats.recent_lengths() == [6, 7]


def test_termination_wins_over_truncation() -> None:
    stats = EpisodeStats(3)
    stats.update(rewards(1.0, 1.0, 1.0), flags(T, F, T), flags(F, T, T))
    assert stats.summary()["reasons"] == {"terminated": 2, "truncated": 1}
    assert stats.state_dict()["reasons"] == ["terminated", "truncated", "terminated"]


def test_reasons_sequence_and_mapping() -> None:
    stats = EpisodeStats(3)
    stats.update(
        rewards(1.0, 1.0, 1.0),
        flags(T, F, T),
        flags(F, T, F),
        reasons=["fell", None, "unused"],  # env 2 ends with its own reason too
    )
    assert stats.state_dict()["reasons"] == ["fell", "truncated", "unused"]
    # Mapping entries for envs that do not end now are ignored.
    stats.update(rewards(1.0, 1.0, 1.0), flags(F, T, F), reasons={1: "goal", 2: "ignored"})
    stats.update(rewards(1.0, 1.0, 1.0), flags(F, F, T), reasons={0: "ignored"})
    assert stats.state_dict()["reasons"][3:] == ["goal", "terminated"]
    assert stats.summary()["reasons"] == {
        "fell": 1,
        "truncated": 1,
        "unused": 1,
        "goal": 1,
        "terminated": 1,
    }


def test_reasons_from_numpy_array() -> None:
    stats = EpisodeStats(2)
    stats.update(rewards(1.0, 1.0), flags(T, T), reasons=np.array(["a", "b"]))
    reasons = stats.state_dict()["reasons"]
    assert reasons == ["a", "b"]
    assert all(type(r) is str for r in reasons)


@pytest.mark.parametrize("reasons", [np.array("a"), np.array([["a"], ["b"]])], ids=["0-d", "2-d"])
def test_reasons_as_an_array_of_another_rank_are_refused_by_name(reasons: np.ndarray) -> None:
    stats = EpisodeStats(2)
    before = snapshot(stats)
    with pytest.raises(DtypeError, match="reasons: expected a sequence of 2 str or None"):
        stats.update(rewards(1.0, 1.0), flags(T, T), reasons=reasons)
    assert snapshot(stats) == before


def test_custom_metrics_read_for_ending_envs() -> None:
    stats = EpisodeStats(3)
    # NaN for envs that do not end is fine: those values are never read.
    stats.update(
        rewards(0.0, 0.0, 0.0),
        flags(T, F, T),
        metrics={"score": np.array([10, -1, 30]), "success": flags(T, F, F)},
    )
    stats.update(
        rewards(0.0, 0.0, 0.0),
        flags(F, T, F),
        metrics={"score": torch.tensor([math.nan, 20.0, math.nan])},
    )
    summary = stats.summary()
    assert summary["score"] == {
        "mean": 20.0,
        "std": math.sqrt(200 / 3),
        "min": 10.0,
        "max": 30.0,
        "count": 3,
    }
    assert summary["success"] == {"mean": 0.5, "std": 0.5, "min": 0.0, "max": 1.0, "count": 2}
    assert list(summary) == ["return", "length", "score", "success", "reasons", "episodes"]
    assert stats.state_dict()["metrics"] == {
        "score": [10.0, 30.0, 20.0],
        "success": [1.0, 0.0, None],
    }


def test_window_keeps_only_last_k() -> None:
    stats = EpisodeStats(1, window=3)
    for i in range(5):
        stats.update(float(i), True, metrics={"score": i * 10})
    assert stats.recent_returns() == [2.0, 3.0, 4.0]
    assert stats.recent_returns(2) == [3.0, 4.0]
    assert stats.recent_lengths(10) == [1, 1, 1]
    assert stats.episodes_finished == 5
    summary = stats.summary()
    assert summary["return"]["count"] == 3
    assert summary["score"]["min"] == 20.0
    assert summary["episodes"] == 5
    assert repr(stats) == "EpisodeStats(num_envs=1, window=3, episodes_finished=5, kept=3)"


def test_summary_over_last() -> None:
    stats = EpisodeStats(1)
    for reward in [1.0, 2.0, 3.0, 6.0]:
        stats.update(reward, True)
    assert stats.summary(last=2)["return"] == {
        "mean": 4.5,
        "std": 1.5,
        "min": 3.0,
        "max": 6.0,
        "count": 2,
    }
    assert stats.summary(last=1)["return"]["std"] == 0.0
    assert stats.summary(last=100) == stats.summary()
    assert stats.summary()["return"]["mean"] == 3.0


def test_metric_only_in_some_episodes_counts_them() -> None:
    stats = EpisodeStats(1)
    stats.update(1.0, True, metrics={"score": 5.0})
    stats.update(1.0, True)
    stats.update(1.0, True, metrics={"score": 7.0})
    assert stats.summary()["score"]["count"] == 2
    assert stats.summary(last=1)["score"]["mean"] == 7.0
    assert stats.summary(last=2)["score"]["count"] == 1
    stats.update(1.0, True)
    assert "score" not in stats.summary(last=1)


def test_empty_summary_is_defined_and_json_serialisable() -> None:
    stats = EpisodeStats(4)
    stats.update(torch.ones(4), torch.zeros(4, dtype=torch.bool))
    empty = {"mean": None, "std": None, "min": None, "max": None, "count": 0}
    assert stats.summary() == {"return": empty, "length": empty, "reasons": {}, "episodes": 0}
    json.dumps(stats.summary(), allow_nan=False)


def test_summary_holds_plain_python_numbers() -> None:
    stats = EpisodeStats(2)
    stats.update(
        torch.tensor([1.5, 2.5], dtype=torch.float32),
        flags(T, T),
        metrics={"score": torch.tensor([3, 4])},
    )
    summary = stats.summary()
    json.dumps(summary, allow_nan=False)
    for key in ("return", "score"):
        assert all(type(summary[key][s]) is float for s in ("mean", "std", "min", "max"))
    assert type(summary["length"]["min"]) is int
    assert type(summary["length"]["mean"]) is float
    assert type(summary["return"]["count"]) is int
    assert type(summary["episodes"]) is int


def test_input_kinds_agree() -> None:
    kinds: list[Callable[[list[float], list[bool]], tuple[Any, Any]]] = [
        lambda r, d: (torch.tensor(r, dtype=torch.float64), torch.tensor(d)),
        lambda r, d: (np.array(r), np.array(d)),
        lambda r, d: (r, d),
        lambda r, d: (torch.tensor(r[0], dtype=torch.float64), torch.tensor(d[0])),
        lambda r, d: (r[0], d[0]),
        lambda r, d: (np.float64(r[0]), np.bool_(d[0])),
    ]
    steps = [([0.5], [False]), ([1.25], [False]), ([2.0], [True]), ([-1.0], [False])]
    snapshots = []
    for kind in kinds:
        stats = EpisodeStats(1)
        for r, d in steps:
            stats.update(*kind(r, d))
        snapshots.append(snapshot(stats))
    assert all(s == snapshots[0] for s in snapshots)
    assert snapshots[0]["state"]["returns"] == [3.75]
    assert snapshots[0]["state"]["running_return"] == [-1.0]


def test_int_and_float32_rewards() -> None:
    stats = EpisodeStats(2)
    stats.update(np.array([1, 2], dtype=np.int32), np.array([F, F]))
    stats.update(torch.tensor([0.5, 0.25], dtype=torch.bfloat16), flags(T, T))
    assert stats.recent_returns() == [1.5, 2.25]


def test_gradients_are_not_kept() -> None:
    stats = EpisodeStats(2)
    reward = torch.ones(2, requires_grad=True)
    stats.update(reward * 2, flags(F, F))
    stats.update(reward, flags(T, F))
    assert stats.recent_returns() == [3.0]
    assert not stats.state_dict()["running_return"].requires_grad


def test_reset_forgets_everything() -> None:
    stats = EpisodeStats(2, window=5)
    stats.update(rewards(1.0, 2.0), flags(T, F))
    stats.reset()
    assert snapshot(stats) == snapshot(EpisodeStats(2, window=5))
    stats.update(rewards(1.0, 2.0), flags(F, T))
    assert stats.recent_returns() == [2.0]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_inputs_match_cpu_inputs() -> None:
    on_cpu, on_gpu = EpisodeStats(2), EpisodeStats(2)
    for r, d in [((1.0, 2.0), (F, T)), ((3.0, 4.0), (T, F))]:
        on_cpu.update(rewards(*r), flags(*d), metrics={"m": rewards(*r)})
        on_gpu.update(rewards(*r).cuda(), flags(*d).cuda(), metrics={"m": rewards(*r).cuda()})
    assert snapshot(on_cpu) == snapshot(on_gpu)


# --- property: recorded episodes equal a per-env reference ----------------------------------


@st.composite
def rollouts(draw: st.DrawFn) -> tuple[int, int, list[tuple[list[float], list[bool], list[bool]]]]:
    num_envs = draw(st.integers(1, 4))
    window = draw(st.integers(1, 8))
    num_steps = draw(st.integers(0, 25))
    finite = st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False)
    vec = st.lists
    steps = [
        (
            draw(vec(finite, min_size=num_envs, max_size=num_envs)),
            draw(vec(st.booleans(), min_size=num_envs, max_size=num_envs)),
            draw(vec(st.booleans(), min_size=num_envs, max_size=num_envs)),
        )
        for _ in range(num_steps)
    ]
    return num_envs, window, steps


@settings(max_examples=60, deadline=None)
@given(rollouts(), st.randoms(use_true_random=False))
def test_recorded_episodes_match_reference(
    case: tuple[int, int, list[tuple[list[float], list[bool], list[bool]]]], rng: Any
) -> None:
    num_envs, window, steps = case
    stats = EpisodeStats(num_envs, window=window)
    running = [0.0] * num_envs
    length = [0] * num_envs
    expected: list[tuple[float, int, str]] = []
    for reward, terminated, truncated in steps:
        form = rng.randrange(3 if num_envs == 1 else 2)
        if form == 0:
            stats.update(
                torch.tensor(reward, dtype=torch.float64),
                torch.tensor(terminated),
                torch.tensor(truncated),
            )
        elif form == 1:
            stats.update(np.array(reward), np.array(terminated), np.array(truncated))
        else:
            stats.update(reward[0], terminated[0], truncated[0])
        if rng.random() < 0.2:  # a rollout boundary: reads in between change nothing
            stats.summary()
            stats.state_dict()
        for env in range(num_envs):
            running[env] += reward[env]
            length[env] += 1
            if terminated[env] or truncated[env]:
                reason = "terminated" if terminated[env] else "truncated"
                expected.append((running[env], length[env], reason))
                running[env], length[env] = 0.0, 0
    kept = expected[-window:]
    assert stats.episodes_finished == len(expected)
    assert stats.recent_returns() == [e[0] for e in kept]
    assert stats.recent_lengths() == [e[1] for e in kept]
    assert stats.state_dict()["reasons"] == [e[2] for e in kept]
    assert stats.state_dict()["running_return"].tolist() == running
    assert stats.state_dict()["running_length"].tolist() == length
    summary = stats.summary()
    assert summary["return"]["count"] == len(kept)
    if kept:
        assert summary["return"]["mean"] == pytest.approx(sum(e[0] for e in kept) / len(kept))
        assert summary["length"]["max"] == max(e[1] for e in kept)


# --- checkpoint state -------------------------------------------------------------------


def _play(stats: EpisodeStats, seed: int, num_steps: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for _ in range(num_steps):
        n = stats.num_envs
        stats.update(
            torch.randn(n, generator=gen),
            torch.rand(n, generator=gen) < 0.2,
            torch.rand(n, generator=gen) < 0.1,
            metrics={"score": torch.randint(0, 100, (n,), generator=gen)},
            reasons={0: "env0"},
        )


def _assert_plain(value: Any) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            assert isinstance(key, str)
            _assert_plain(item)
    elif isinstance(value, list):
        for item in value:
            _assert_plain(item)
    else:
        assert value is None or type(value) in (int, float, str, torch.Tensor)


def test_state_dict_round_trip_continues_identically() -> None:
    original = EpisodeStats(3, window=10)
    _play(original, seed=0, num_steps=40)
    state = original.state_dict()
    _assert_plain(state)
    json.dumps({k: v for k, v in state.items() if not isinstance(v, torch.Tensor)})

    resumed = EpisodeStats(3, window=10)
    resumed.load_state_dict(state)
    assert snapshot(resumed) == snapshot(original)
    _play(original, seed=1, num_steps=30)
    _play(resumed, seed=1, num_steps=30)
    assert snapshot(resumed) == snapshot(original)


def test_state_dict_is_a_copy() -> None:
    stats = EpisodeStats(2)
    stats.update(rewards(1.0, 1.0), flags(F, F))
    state = stats.state_dict()
    stats.update(rewards(1.0, 1.0), flags(T, F))
    assert state["running_return"].tolist() == [1.0, 1.0]
    assert state["returns"] == []


def test_load_into_smaller_window_keeps_newest() -> None:
    original = EpisodeStats(1, window=10)
    for reward in range(6):
        original.update(float(reward), True)
    small = EpisodeStats(1, window=2)
    small.load_state_dict(original.state_dict())
    assert small.recent_returns() == [4.0, 5.0]
    assert small.episodes_finished == 6


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: s.pop("returns"), "stats state: missing key 'returns'"),
        (lambda s: s.update(num_envs=3), "stats state: expected num_envs=2, got 3"),
        (
            lambda s: s.update(running_return=torch.zeros(3)),
            "stats state: running_return: expected shape (2,), got (3,)",
        ),
        (
            lambda s: s.update(running_length=torch.zeros(2)),
            "stats state: running_length: expected dtype torch.int64, got torch.float32",
        ),
        (lambda s: s.update(lengths=[1]), "stats state: lengths: expected length 2, got 1"),
        (lambda s: s.update(reasons=["a", 3]), "stats state: reasons: unexpected item 3"),
        (
            lambda s: s.update(metrics={"score": [1.0]}),
            "stats state: metrics['score']: expected length 2, got 1",
        ),
        (lambda s: s.update(episodes_finished=1), "episodes_finished: expected an int >= 2, got 1"),
    ],
)
def test_bad_state_raises_and_changes_nothing(
    change: Callable[[dict[str, Any]], Any], message: str
) -> None:
    source = EpisodeStats(2)
    source.update(rewards(1.0, 2.0), flags(T, T), metrics={"score": rewards(3.0, 4.0)})
    state = source.state_dict()
    change(state)
    target = EpisodeStats(2)
    target.update(rewards(5.0, 6.0), flags(T, F))
    before = snapshot(target)
    with pytest.raises(CheckpointError) as info:
        target.load_state_dict(state)
    assert message in str(info.value)
    assert snapshot(target) == before
