"""Declared per-step metrics of EpisodeStats (``metrics={"x": "last", "energy": "sum"}``): against a plain
reference, refused whole before anything changes, round-tripped exactly by state_dict and checkpoints."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlbuf import CheckpointError, EpisodeStats, ReplayBuffer
from rlbuf.errors import ConfigError, DtypeError, NonFiniteError, ShapeError

MODES = {"energy": "sum", "x": "last"}


class Reference:
    """EpisodeStats with declared metrics, in plain Python: one env at a time."""

    def __init__(self, num_envs: int, window: int) -> None:
        self.window = window
        self.running = [{"return": 0.0, "length": 0, "energy": 0.0, "x": 0.0} for _ in range(num_envs)]
        self.episodes: list[dict[str, Any]] = []

    def step(self, reward: list[float], ended: list[bool], mask: list[bool], energy: list[float],
             x: list[float]) -> None:
        for env, run in enumerate(self.running):
            if not mask[env]:
                continue
            run["return"] += reward[env]
            run["length"] += 1
            run["energy"] += energy[env]
            run["x"] = x[env]
            if ended[env]:
                self.episodes.append(dict(run))
                run.update({"return": 0.0, "length": 0, "energy": 0.0, "x": 0.0})
        self.episodes = self.episodes[-self.window:]


values = st.floats(-1e3, 1e3, allow_nan=False).map(lambda v: round(v, 3))


@st.composite
def runs(draw: st.DrawFn) -> tuple[int, int, list[tuple[list[Any], ...]]]:
    num_envs, window = draw(st.integers(1, 4)), draw(st.integers(1, 6))
    per_env = st.lists(values, min_size=num_envs, max_size=num_envs)
    flags = st.lists(st.booleans(), min_size=num_envs, max_size=num_envs)
    steps = draw(st.lists(st.tuples(per_env, flags, flags, flags, per_env, per_env), min_size=1, max_size=25))
    return num_envs, window, steps


def _feed(stats: EpisodeStats, step: tuple[list[Any], ...]) -> None:
    reward, terminated, truncated, mask, energy, x = step
    stats.update(torch.tensor(reward, dtype=torch.float64), torch.tensor(terminated), np.array(truncated),
                 env_mask=mask if not all(mask) else None, metrics={"energy": np.array(energy), "x": torch.tensor(x, dtype=torch.float64)})


def _same(stats: EpisodeStats, reference: Reference) -> None:
    episodes = reference.episodes
    assert stats.recent_lengths() == [e["length"] for e in episodes]
    for got, want in zip(stats.recent_returns(), [e["return"] for e in episodes], strict=True):
        assert math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-9)
    for got, want in zip(stats.recent_metric("energy"), [e["energy"] for e in episodes], strict=True):
        assert got is not None and math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-9)
    assert stats.recent_metric("x") == [e["x"] for e in episodes]  # the last value, exactly
    summary = stats.summary()
    if episodes:
        assert summary["x"]["count"] == len(episodes) and summary["x"]["max"] == max(e["x"] for e in episodes)
        assert math.isclose(summary["energy"]["mean"], math.fsum(e["energy"] for e in episodes) / len(episodes),
                            rel_tol=1e-9, abs_tol=1e-9)
    else:
        assert "x" not in summary and stats.recent_metric("x") == []


@settings(max_examples=80, deadline=None)
@given(runs(), st.integers(0, 25))
def test_declared_metrics_match_a_plain_reference_and_resume_exactly(run: tuple[int, int, list[Any]], cut: int) -> None:
    num_envs, window, steps = run
    stats, reference = EpisodeStats(num_envs, window=window, metrics=MODES), Reference(num_envs, window)
    for step in steps[:cut]:
        _feed(stats, step)
        reference.step(step[0], [a or b for a, b in zip(step[1], step[2], strict=True)], step[3], step[4], step[5])
    resumed = EpisodeStats(num_envs, window=window, metrics=MODES)
    resumed.load_state_dict(copy.deepcopy(stats.state_dict()))
    for step in steps[cut:]:
        _feed(stats, step)
        _feed(resumed, step)
        reference.step(step[0], [a or b for a, b in zip(step[1], step[2], strict=True)], step[3], step[4], step[5])
    _same(stats, reference)
    _same(resumed, reference)
    assert _equal_states(resumed.state_dict(), stats.state_dict())


def _equal_states(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal_states(a[k], b[k]) for k in a)
    return bool(a == b)


def _two_envs() -> EpisodeStats:
    stats = EpisodeStats(2, metrics=MODES)
    stats.update([1.0, 2.0], [False, False], [False, False], metrics={"energy": [1.0, 2.0], "x": [0.1, 0.2]})
    return stats


@pytest.mark.parametrize(("metrics", "error", "match"), [
    ({"energy": [1.0, 1.0]}, ConfigError, r"metrics: \['x'\] declared .* but not given"),
    (None, ConfigError, r"\['energy', 'x'\] declared"),
    ({"energy": [1.0, 1.0, 1.0], "x": [0.0, 0.0]}, ShapeError, r"metrics\['energy'\]: expected shape \(2,\)"),
    ({"energy": ["a", "b"], "x": [0.0, 0.0]}, DtypeError, r"metrics\['energy'\]: expected bool, int or float"),
    ({"energy": np.array([1j, 1j]), "x": [0.0, 0.0]}, DtypeError, r"metrics\['energy'\]: expected bool, int or float"),
    ({"energy": [1.0, float("nan")], "x": [0.0, 0.0]}, NonFiniteError, r"metrics\['energy'\]: .* nan at env 1"),
    ({"energy": [1.0, 1.0], "x": [float("inf"), 0.0]}, NonFiniteError, r"metrics\['x'\]: .* inf at env 0"),
    ({"energy": [1.0, 1.7e308], "x": [0.0, 0.0]}, NonFiniteError, r"past the largest float64"),
])
def test_a_refused_step_changes_nothing(metrics: Any, error: type[Exception], match: str) -> None:
    stats = _two_envs()
    stats.update([0.0, 0.0], [False, False], metrics={"energy": [0.0, 1.7e308], "x": [0.0, 0.0]})
    before = stats.state_dict()
    with pytest.raises(error, match=match):
        stats.update([1.0, 1.0], [True, True], metrics=metrics)
    assert _equal_states(stats.state_dict(), before) and stats.episodes_finished == 0


def test_a_masked_env_keeps_its_running_metrics_and_an_ended_one_starts_again() -> None:
    stats = _two_envs()
    stats.update([1.0, 1.0], [True, False], metrics={"energy": [5.0, 7.0], "x": [0.9, 0.8]},
                 env_mask=[True, False])
    assert stats.recent_metric("energy") == [6.0] and stats.recent_metric("x") == [0.9]
    state = stats.state_dict()["running_metrics"]
    assert state["energy"].tolist() == [0.0, 2.0] and state["x"].tolist() == [0.0, 0.2]
    assert stats.summary()["energy"] == {"mean": 6.0, "std": 0.0, "min": 6.0, "max": 6.0, "count": 1}


def test_undeclared_metrics_are_still_read_at_the_episode_end() -> None:
    stats = EpisodeStats(1, metrics={"energy": "sum"})
    stats.update(1.0, False, metrics={"energy": 1.0})
    stats.update(1.0, True, metrics={"energy": 2.0, "score": 30})
    assert stats.recent_metric("score") == [30.0] and stats.recent_metric("energy") == [3.0]


@pytest.mark.parametrize(("metrics", "match"), [
    ({"energy": "mean"}, r"metrics\['energy'\]: expected 'sum' or 'last', got 'mean'"),
    ({"return": "sum"}, r"name 'return' is not allowed"),
    ({1: "sum"}, r"name 1 is not allowed"),
    (["energy"], r"expected a mapping name -> 'sum' or 'last'"),
])
def test_a_bad_declaration_is_refused(metrics: Any, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        EpisodeStats(2, metrics=metrics)


def test_recent_metric_of_an_unknown_name_is_refused() -> None:
    with pytest.raises(ConfigError, match="metric 'nope': not declared"):
        _two_envs().recent_metric("nope")


def _forged(edit: Any) -> dict[str, Any]:
    stats = _two_envs()
    stats.update([1.0, 1.0], [True, False], metrics={"energy": [1.0, 1.0], "x": [0.5, 0.5]})
    state = copy.deepcopy(stats.state_dict())
    edit(state)
    return state


FORGERIES = {
    "NaN running sum": (lambda s: s["running_metrics"]["energy"].__setitem__(1, float("nan")),
                        r"running_metrics\['energy'\]: expected finite values, got nan at env 1"),
    "wrong shape": (lambda s: s["running_metrics"].__setitem__("x", torch.zeros(3, dtype=torch.float64)),
                    r"running_metrics\['x'\]: expected shape \(2,\)"),
    "other modes": (lambda s: s["metric_modes"].__setitem__("x", "sum"), r"metric_modes: .* in the state"),
    "missing running value": (lambda s: s["running_metrics"].pop("x"), r"running_metrics: expected \['energy', 'x'\]"),
    "a value where no episode runs": (lambda s: (s["running_length"].__setitem__(1, 0),
                                                 s["running_return"].__setitem__(1, 0.0)),
                                      r"running_metrics\['energy'\]: env 1 has 3.0 but no step"),
    "an episode without a declared metric": (lambda s: s["metrics"]["x"].__setitem__(0, None),
                                             r"metrics\['x'\]: declared, so every finished episode has a value"),
    "NaN in a finished episode": (lambda s: s["metrics"]["energy"].__setitem__(0, float("nan")),
                                  r"metrics\['energy'\]: expected finite values"),
    "a mode that is no mode": (lambda s: s.__setitem__("metric_modes", {"energy": "max", "x": "last"}),
                               r"metric_modes: expected a mapping"),
}


@pytest.mark.parametrize("case", sorted(FORGERIES))
def test_a_forged_state_is_refused_and_changes_nothing(case: str) -> None:
    edit, match = FORGERIES[case]
    target = _two_envs()
    before = target.state_dict()
    with pytest.raises(CheckpointError, match=match):
        target.load_state_dict(_forged(edit))
    assert _equal_states(target.state_dict(), before)


def test_a_state_without_declared_metrics_loads_into_a_tracker_without_them() -> None:
    old = EpisodeStats(1)
    old.update(1.0, True, metrics={"score": 3})
    state = old.state_dict()
    assert state["metric_modes"] == {} and state["running_metrics"] == {}
    del state["metric_modes"], state["running_metrics"]  # as rlbuf 0.4 wrote it
    new = EpisodeStats(1)
    new.load_state_dict(state)
    assert new.recent_metric("score") == [3.0]
    with pytest.raises(CheckpointError, match="metric_modes"):
        EpisodeStats(1, metrics={"energy": "sum"}).load_state_dict(state)


def test_a_buffer_checkpoint_keeps_the_declared_metrics_exactly(tmp_path: Path) -> None:
    buf = ReplayBuffer(16, obs_shape=(2,), action_shape=(), num_envs=2, stats=EpisodeStats(2, metrics=MODES))
    record = buf._planned_stats(torch.ones(2), torch.tensor([True, False]), torch.zeros(2, dtype=torch.bool),
                                metrics={"energy": torch.tensor([0.1, 0.2]), "x": [1.0 / 3, 2.0]})
    assert record is not None and buf.stats is not None and buf.stats.episodes_finished == 0  # checked, not recorded
    record()
    buf.stats.update([1.0, 1.0], [False, False], metrics={"energy": [0.3, 0.4], "x": [0.5, 0.6]})
    buf.save(tmp_path / "ckpt")
    loaded = ReplayBuffer.load(tmp_path / "ckpt")
    assert loaded.stats is not None and loaded.stats.metrics == MODES
    assert _equal_states(loaded.stats.state_dict(), buf.stats.state_dict())
    assert loaded.stats.recent_metric("x") == [1.0 / 3]
