"""EpisodeStats: every input checked by name before any state changes."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from test_stats import F, T, flags, rewards, snapshot

from rlbuf.errors import (
    ConfigError,
    DtypeError,
    NonFiniteError,
    RlbufError,
    ShapeError,
)
from rlbuf.stats import EpisodeStats

# --- validation -------------------------------------------------------------------------

GOOD_R = rewards(1.0, 2.0, 3.0, 4.0)
NONE_DONE = flags(F, F, F, F)
ONE_DONE = flags(F, T, F, F)

BAD_UPDATES: list[tuple[dict[str, Any], type[RlbufError], str]] = [
    (
        {"reward": torch.zeros(4, 1)},
        ShapeError,
        "reward: expected shape (4,), got (4, 1)",
    ),
    ({"reward": np.zeros(3)}, ShapeError, "reward: expected shape (4,), got (3,)"),
    ({"reward": 1.0}, ShapeError, "reward: expected shape (4,), got ()"),
    (
        {"terminated": flags(F, F, F, F, F)},
        ShapeError,
        "terminated: expected shape (4,), got (5,)",
    ),
    (
        {"truncated": flags(F, F)},
        ShapeError,
        "truncated: expected shape (4,), got (2,)",
    ),
    (
        {"reward": torch.zeros(4, dtype=torch.bool)},
        DtypeError,
        "reward: expected a float or int dtype, got bool",
    ),
    (
        {"reward": torch.zeros(4, dtype=torch.complex64)},
        DtypeError,
        "reward: expected a bool, int or float dtype, got torch.complex64",
    ),
    ({"reward": ["a", "b", "c", "d"]}, DtypeError, "reward: expected bool, int or float values, got <U1"),
    (
        {"terminated": torch.zeros(4)},
        DtypeError,
        "terminated: expected dtype bool, got float32",
    ),
    (
        {"truncated": np.zeros(4, dtype=np.int64)},
        DtypeError,
        "truncated: expected dtype bool, got int64",
    ),
    (
        {"reward": rewards(1.0, 2.0, math.nan, 4.0)},
        NonFiniteError,
        "reward: expected finite values, got nan at env 2",
    ),
    (
        {"reward": rewards(1.0, -math.inf, 3.0, 4.0), "terminated": ONE_DONE},
        NonFiniteError,
        "reward: expected finite values, got -inf at env 1",
    ),
    (
        {"metrics": {"score": torch.zeros(2)}},
        ShapeError,
        "metrics['score']: expected shape (4,), got (2,)",
    ),
    (
        {"metrics": {"score": np.array(["x"] * 4)}},
        DtypeError,
        "metrics['score']: expected bool, int or float values",
    ),
    ({"metrics": {"return": torch.zeros(4)}}, ConfigError, "metrics: name 'return' is not allowed"),
    ({"metrics": {3: torch.zeros(4)}}, ConfigError, "metrics: name 3 is not allowed"),
    (
        {"terminated": ONE_DONE, "metrics": {"score": rewards(0.0, math.nan, 0.0, 0.0)}},
        NonFiniteError,
        "metrics['score']: expected finite values for ending episodes, got nan at env 1",
    ),
    ({"reasons": ["a", "b", "c"]}, ShapeError, "reasons: expected length 4, got 3"),
    ({"reasons": "fell"}, DtypeError, "reasons: expected a sequence of 4 str or None"),
    ({"reasons": {4: "fell"}}, ShapeError, "reasons: expected env indices in [0, 4), got 4"),
    ({"reasons": {-1: "fell"}}, ShapeError, "reasons: expected env indices in [0, 4), got -1"),
    (
        {"terminated": ONE_DONE, "reasons": [None, 7, None, None]},
        DtypeError,
        "reasons[1]: expected str or None, got int",
    ),
    (
        {"terminated": ONE_DONE, "reasons": {1: b"fell"}},
        DtypeError,
        "reasons[1]: expected str or None, got bytes",
    ),
]


@pytest.mark.parametrize(("bad", "error", "message"), BAD_UPDATES)
def test_bad_update_raises_and_changes_nothing(
    bad: dict[str, Any], error: type[RlbufError], message: str
) -> None:
    stats = EpisodeStats(4, window=5)
    stats.update(GOOD_R, flags(T, F, F, F), metrics={"score": GOOD_R})
    stats.update(GOOD_R, NONE_DONE)
    before = snapshot(stats)
    kwargs: dict[str, Any] = {"reward": GOOD_R, "terminated": NONE_DONE, "truncated": NONE_DONE}
    kwargs.update(bad)
    with pytest.raises(error) as info:
        stats.update(**kwargs)
    assert message in str(info.value)
    assert snapshot(stats) == before


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        ((math.nan, False), NonFiniteError, "reward: expected finite values, got nan at env 0"),
        ((math.inf, True), NonFiniteError, "reward: expected finite values, got inf at env 0"),
        ((True, False), DtypeError, "reward: expected a float or int dtype, got bool"),
        ((1.0, 0), DtypeError, "terminated: expected dtype bool, got int64"),
        ((1.0, False, 1), DtypeError, "truncated: expected dtype bool, got int64"),
        ((np.zeros(2), False), ShapeError, "reward: expected shape (1,) or (), got (2,)"),
        ((1.0, flags(F, F)), ShapeError, "terminated: expected shape (1,) or (), got (2,)"),
    ],
)
def test_bad_single_env_update(
    args: tuple[Any, ...], error: type[RlbufError], message: str
) -> None:
    stats = EpisodeStats(1)
    stats.update(2.0, False)
    before = snapshot(stats)
    with pytest.raises(error) as info:
        stats.update(*args)
    assert message in str(info.value)
    assert snapshot(stats) == before


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_envs": 0}, "num_envs: expected a positive int, got 0"),
        ({"num_envs": 2.0}, "num_envs: expected a positive int, got 2.0"),
        ({"num_envs": True}, "num_envs: expected a positive int, got True"),
        ({"num_envs": 2, "window": 0}, "window: expected a positive int, got 0"),
    ],
)
def test_bad_construction(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        EpisodeStats(**kwargs)


def test_bad_counts_for_readers() -> None:
    stats = EpisodeStats(1)
    with pytest.raises(ConfigError, match="last: expected a positive int, got 0"):
        stats.summary(last=0)
    with pytest.raises(ConfigError, match="k: expected a positive int, got -1"):
        stats.recent_returns(-1)
    with pytest.raises(ConfigError, match="k: expected a positive int, got 0"):
        stats.recent_lengths(0)


def test_errors_are_builtin_subclasses() -> None:
    stats = EpisodeStats(2)
    with pytest.raises(ValueError):
        stats.update(rewards(1.0), flags(F, F))
    with pytest.raises(TypeError):
        stats.update(rewards(1.0, 1.0), torch.zeros(2))


def test_env_mask_leaves_the_masked_envs_as_they_were() -> None:
    stats = EpisodeStats(3)
    stats.update(rewards(1.0, 1.0, 1.0), flags(F, F, F))
    # Env 1 takes no step of its episode (a NEXT_STEP reset step): its reward and end flag are ignored.
    stats.update(rewards(2.0, 50.0, 2.0), flags(F, T, F), env_mask=flags(T, F, T))
    assert stats.episodes_finished == 0
    stats.update(rewards(4.0, 8.0, 0.5), flags(T, T, F), flags(F, F, T), env_mask=np.array([T, T, T]))
    assert sorted(zip(stats.recent_lengths(), stats.recent_returns(), strict=True)) == [(2, 9.0), (3, 3.5), (3, 7.0)]


@pytest.mark.parametrize(("env_mask", "error", "message"), [
    (flags(T, F), ShapeError, r"env_mask: expected shape \(3,\), got \(2,\)"),
    (np.ones(3, np.int64), DtypeError, "env_mask: expected dtype bool"),
])
def test_a_bad_env_mask_is_refused_before_anything_changes(env_mask: Any, error: type[RlbufError],
                                                         message: str) -> None:
    stats = EpisodeStats(3)
    stats.update(rewards(1.0, 1.0, 1.0), flags(F, F, F))
    before = snapshot(stats)
    with pytest.raises(error, match=message):
        stats.update(rewards(1.0, 1.0, 1.0), flags(T, F, F), env_mask=env_mask)
    assert snapshot(stats) == before
