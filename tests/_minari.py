"""Minari datasets written by Minari itself (both backends) for the offline tests, and how they compare.

Datasets go to a temporary ``MINARI_DATASETS_PATH`` (the ``minari_root`` fixture of ``tests/conftest.py``, which
each offline test module uses for every test); nothing is downloaded.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

minari = pytest.importorskip("minari")

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
from minari.data_collector import EpisodeBuffer  # noqa: E402

from rlbuf import ReplayBuffer  # noqa: E402

_IDS = itertools.count()


BOX = gym.spaces.Box(-np.inf, np.inf, (3,), np.float64)


ACTIONS = gym.spaces.Box(-1, 1, (2,), np.float32)


SPACES: dict[str, tuple[Any, Any]] = {
    "flat": (BOX, ACTIONS),
    "dict": (gym.spaces.Dict({"observation": gym.spaces.Box(-5, 5, (2,), np.float32),
                              "goal": gym.spaces.Dict({"xy": gym.spaces.Box(-1, 1, (2,), np.float64)}),
                              "count": gym.spaces.Discrete(4)}), gym.spaces.Discrete(3)),
    "image": (gym.spaces.Box(0, 255, (32, 32, 3), np.uint8), gym.spaces.Discrete(2)),
    "small_uint8": (gym.spaces.Box(0, 255, (4, 4), np.uint8), gym.spaces.Discrete(2)),
}


def _new_id() -> str:
    return f"rlbuf-test/d{next(_IDS)}-v0"


def _sample(space: Any, rows: int, rng: np.random.Generator) -> Any:
    if isinstance(space, gym.spaces.Dict):
        return {key: _sample(sub, rows, rng) for key, sub in space.spaces.items()}
    if isinstance(space, gym.spaces.Discrete):
        return rng.integers(space.start, space.start + space.n, rows).astype(space.dtype)
    if space.dtype == np.uint8:
        return rng.integers(0, 256, (rows, *space.shape), dtype=np.uint8)
    return rng.uniform(-1, 1, (rows, *space.shape)).astype(space.dtype)


def _episode(kind: str, steps: int, end: str, seed: int | None, rng: np.random.Generator) -> dict[str, Any]:
    observation_space, action_space = SPACES[kind]
    return {"observations": _sample(observation_space, steps + 1, rng),
            "actions": _sample(action_space, steps, rng),
            "rewards": rng.standard_normal(steps),  # float64, as Minari's collector stores them
            "terminations": (np.arange(steps) == steps - 1) & (end != "truncated"),
            "truncations": (np.arange(steps) == steps - 1) & (end != "terminated"),
            "seed": seed}


def _minari_dataset(episodes: list[dict[str, Any]], kind: str = "flat", data_format: str = "hdf5") -> Any:
    """A dataset written by Minari itself (not by rlbuf), images JPEG-encoded as Minari does by default."""
    observation_space, action_space = SPACES[kind]
    buffers = [EpisodeBuffer(seed=episode.get("seed"), options=episode.get("options"),
                             observations=episode["observations"],
                             actions=episode["actions"], rewards=episode["rewards"],
                             terminations=episode["terminations"], truncations=episode["truncations"])
               for episode in episodes]
    with pytest.warns(UserWarning):  # Minari's reminders of metadata (author, code_permalink ...)
        return minari.create_dataset_from_buffers(_new_id(), buffers, observation_space=observation_space,
                                                  action_space=action_space, data_format=data_format)


def _assert_same_tree(first: Any, second: Any) -> None:
    if isinstance(first, dict):
        assert isinstance(second, dict) and first.keys() == second.keys()
        for key in first:
            _assert_same_tree(first[key], second[key])
        return
    assert first.dtype == second.dtype and first.shape == second.shape
    assert first.tobytes() == second.tobytes()


def _assert_same_options(first: Any, second: Any) -> None:
    """Reset options as Minari reads them back, identical: keys, Python or numpy type, dtype and bytes."""
    if isinstance(first, dict):
        assert isinstance(second, dict) and first.keys() == second.keys()
        for key in first:
            _assert_same_options(first[key], second[key])
        return
    assert type(first) is type(second), (first, second)
    assert np.asarray(first).dtype == np.asarray(second).dtype
    assert np.asarray(first).tobytes() == np.asarray(second).tobytes()


def _assert_same_episodes(first: Any, second: Any) -> None:
    """Every episode byte-identical: observations (the final one too), actions, rewards, flags, seed, options."""
    assert first.total_episodes == second.total_episodes and first.total_steps == second.total_steps
    metadata = [list(d.storage.get_episode_metadata(d.episode_indices)) for d in (first, second)]
    assert [m.get("seed") for m in metadata[0]] == [m.get("seed") for m in metadata[1]]
    for one, two in zip(*metadata, strict=True):
        assert ("options" in one) == ("options" in two)
        _assert_same_options(one.get("options"), two.get("options"))
    for one, two in zip(first.iterate_episodes(), second.iterate_episodes(), strict=True):
        _assert_same_tree(one.observations, two.observations)
        for name in ("actions", "rewards", "terminations", "truncations"):
            _assert_same_tree(getattr(one, name), getattr(two, name))


def _rows(buffer: ReplayBuffer) -> dict[str, Any]:
    batch = buffer.sample_all()
    return {"obs": batch.obs, "action": batch.action, "reward": batch.reward, "next_obs": batch.next_obs,
            "terminated": batch.terminated, "truncated": batch.truncated, **batch.extras}


def _assert_same_rows(first: ReplayBuffer, second: ReplayBuffer) -> None:
    one, two = _rows(first), _rows(second)
    assert one.keys() == two.keys()
    for name in one:
        assert (one[name] == two[name]).all(), name


def _with(episode: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {**episode, **changes}


GOOD = _episode("flat", 4, "truncated", None, np.random.default_rng(3))
