"""EpisodeStats refuses what it cannot hold: too many envs, forged states, returns past float64."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from _snapshot import same, snapshot
from hypothesis import given, settings
from hypothesis import strategies as st

from rlbuf import CheckpointError, ConfigError, EpisodeStats, NonFiniteError
from rlbuf.storage import available_ram


@pytest.mark.parametrize("num_envs", [10**12, 2**62])
def test_more_envs_than_memory_holds_is_a_config_error_before_anything_is_allocated(num_envs: int) -> None:
    with pytest.raises(ConfigError, match=rf"num_envs: {num_envs} envs need {16 * num_envs} bytes of running "
                                          r"returns and lengths, but only \d+ bytes of RAM are available"):
        EpisodeStats(num_envs)
    assert 16 * num_envs > available_ram()


def played() -> EpisodeStats:
    stats = EpisodeStats(2)
    stats.update(torch.tensor([1.0, 2.0]), torch.tensor([True, False]), metrics={"score": torch.tensor([3.0, 4.0])})
    stats.update(torch.tensor([1.0, 2.0]), torch.tensor([False, False]))
    return stats


NAN, INF = float("nan"), float("inf")
FORGED: list[tuple[Callable[[dict[str, Any]], Any], str]] = [
    (lambda s: s.update(running_return=torch.tensor([NAN, 1.0], dtype=torch.float64)),
     "stats state: running_return: expected finite values, got nan at env 0"),
    (lambda s: s.update(running_return=torch.tensor([1.0, -INF], dtype=torch.float64)),
     "stats state: running_return: expected finite values, got -inf at env 1"),
    (lambda s: s.update(running_length=torch.tensor([1, -3])),
     "stats state: running_length: expected counts in [0, 2**63 - 1), got -3 at env 1"),
    # helper 45: the next step wrapped int64; 10**30 steps, an int return beyond float64, num_envs 2.0
    (lambda s: s.update(running_length=torch.tensor([1, 2**63 - 1])),
     "stats state: running_length: expected counts in [0, 2**63 - 1), got 9223372036854775807 at env 1"),
    (lambda s: s.update(lengths=[10**30]), "stats state: lengths: expected episodes of 1 to 2**63 - 1 steps"),
    (lambda s: s.update(returns=[10**400]), "stats state: returns: expected finite values, got an int of 1329 bits"),
    (lambda s: s.update(num_envs=2.0), "stats state: expected num_envs=2, got 2.0"),
    (lambda s: s.update(running_length=torch.tensor([0, 2])),
     "stats state: running_return: env 0 has a return of 1.0 but no step in its running episode"),
    (lambda s: s.update(returns=[INF]), "stats state: returns: expected finite values, got inf at episode 0"),
    (lambda s: s.update(returns=[NAN]), "stats state: returns: expected finite values, got nan at episode 0"),
    (lambda s: s.update(lengths=[-1]), "stats state: lengths: expected episodes of 1 to 2**63 - 1 steps, got -1"),
    (lambda s: s.update(lengths=[0]), "stats state: lengths: expected episodes of 1 to 2**63 - 1 steps, got 0"),
    (lambda s: s.update(metrics={"score": [NAN]}), "stats state: metrics['score']: expected finite values, got nan"),
    (lambda s: s.update(running_return=torch.zeros(2, device="meta", dtype=torch.float64)),
     "stats state: running_return: expected a tensor, got Tensor"),
    (lambda s: s.update(running_return=torch.zeros(2, dtype=torch.complex64)),
     "stats state: running_return: expected dtype torch.float64, got torch.complex64"),
]


@pytest.mark.parametrize(("forge", "message"), FORGED, ids=[m.split(": ")[1] + str(i) for i, (_, m) in enumerate(FORGED)])
def test_a_forged_state_is_refused_naming_the_key_and_changes_nothing(
        forge: Callable[[dict[str, Any]], Any], message: str) -> None:
    state = played().state_dict()
    forge(state)
    target = played()
    target.update(torch.tensor([5.0, 6.0]), torch.tensor([False, True]))
    before = snapshot(target)
    with pytest.raises(CheckpointError) as caught:
        target.load_state_dict(state)
    assert message in str(caught.value)
    assert same(snapshot(target), before)


def test_a_state_as_a_json_file_holds_it_loads() -> None:
    state = played().state_dict()
    state["running_return"], state["running_length"] = state["running_return"].tolist(), state["running_length"].tolist()
    loaded = EpisodeStats(2)
    loaded.load_state_dict(state)
    assert same(snapshot(loaded), snapshot(played()))


@pytest.mark.parametrize("as_tensor", [False, True])
def test_a_return_that_would_overflow_float64_is_refused_and_changes_nothing(as_tensor: bool) -> None:
    stats = EpisodeStats(2)
    big = np.array([1e308, 1.0])
    stats.update(torch.as_tensor(big) if as_tensor else big, np.array([False, False]))
    before = snapshot(stats)
    with pytest.raises(NonFiniteError, match=r"reward: 1e\+308 at env 0 would take its running return \(1e\+308\) "
                                             r"past the largest float64"):
        stats.update(torch.as_tensor(big) if as_tensor else big, np.array([True, True]))
    assert same(snapshot(stats), before)


def test_one_env_of_plain_floats_refuses_an_overflow_too() -> None:
    stats = EpisodeStats(1)
    stats.update(1.7e308, False)
    before = snapshot(stats)
    with pytest.raises(NonFiniteError, match="past the largest float64"):
        stats.update(1.7e308, False)
    assert same(snapshot(stats), before)
    stats.update(-1.7e308, True)
    assert stats.recent_returns() == [0.0]


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(st.lists(st.floats(-1e308, 1e308, allow_nan=False), min_size=1, max_size=6))
def test_running_returns_stay_finite_or_the_update_changes_nothing(rewards: list[float]) -> None:
    stats = EpisodeStats(1)
    for reward in rewards:
        before = snapshot(stats)
        try:
            stats.update(np.array([reward]), np.array([False]))
        except NonFiniteError:
            assert same(snapshot(stats), before)
        assert np.isfinite(stats.state_dict()["running_return"].numpy()).all()
