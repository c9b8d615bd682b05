"""from_minari's chunk-wide check (``columns_valid``) passes a chunk exactly when ``check_episode`` passes each
of its episodes, and a chunk that fails is refused naming the episode and field as ``check_episode`` does.

Datasets for the end-to-end cases are made with Minari's own ``create_dataset_from_buffers`` (HDF5: its
chunks are the ones read straight into their columns) in a temporary ``MINARI_DATASETS_PATH``.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

minari = pytest.importorskip("minari")

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from minari.data_collector import EpisodeBuffer  # noqa: E402

import rlbuf.offline  # noqa: E402
from rlbuf import ReplayBuffer  # noqa: E402
from rlbuf._minari_read import Spaces, check_episode, columns_valid  # noqa: E402
from rlbuf.errors import RlbufError  # noqa: E402
from rlbuf.offline import from_minari  # noqa: E402

_IDS = itertools.count()
SPACES: dict[str, tuple[Any, Any]] = {
    "flat": (gym.spaces.Box(-np.inf, np.inf, (3,), np.float64), gym.spaces.Box(-1, 1, (2,), np.float32)),
    "bounded": (gym.spaces.Box(-2, 2, (2,), np.float32), gym.spaces.Discrete(3)),
    "dict": (gym.spaces.Dict({"observation": gym.spaces.Box(-5, 5, (2,), np.float32),
                              "goal": gym.spaces.Dict({"xy": gym.spaces.Box(-1, 1, (2,), np.float64)}),
                              "count": gym.spaces.Discrete(4)}), gym.spaces.MultiBinary(2)),
}
# What a damaged episode holds (its shapes and dtypes kept: such an episode is read into a chunk's columns).
DAMAGE = ["nan_obs", "inf_obs", "outside_obs", "nan_action", "inf_action", "outside_action", "nan_reward",
          "huge_reward", "early_end", "unfinished"]


pytestmark = pytest.mark.usefixtures("minari_root")  # every test in a temporary Minari root


def _sample(space: Any, rows: int, rng: np.random.Generator) -> Any:
    if isinstance(space, gym.spaces.Dict):
        return {key: _sample(sub, rows, rng) for key, sub in space.spaces.items()}
    if isinstance(space, gym.spaces.Discrete):
        return rng.integers(space.start, space.start + space.n, rows).astype(space.dtype)
    if isinstance(space, gym.spaces.MultiBinary):
        return rng.integers(0, 2, (rows, *space.shape)).astype(space.dtype)
    return rng.uniform(-1, 1, (rows, *space.shape)).astype(space.dtype)


def _episode(kind: str, steps: int, end: str, rng: np.random.Generator) -> dict[str, Any]:
    observation_space, action_space = SPACES[kind]
    last = np.arange(steps) == steps - 1
    return {"observations": _sample(observation_space, steps + 1, rng), "actions": _sample(action_space, steps, rng),
            "rewards": rng.standard_normal(steps), "terminations": last & (end != "truncated"),
            "truncations": last & (end != "terminated")}


def _leaves(tree: Any) -> list[np.ndarray[Any, Any]]:
    return [leaf for sub in tree.values() for leaf in _leaves(sub)] if isinstance(tree, dict) else [tree]


def _damage(episode: dict[str, Any], damage: str, at: float) -> None:
    """Damage the episode in place at a row picked by ``at`` in [0, 1) (nothing where its spaces allow no such
    damage: no float leaf for a NaN, no discrete one for a value outside, one step for an early end)."""
    steps = len(episode["rewards"])
    value, _, field = damage.partition("_")
    if field in ("obs", "action"):
        leaves = [leaf for leaf in _leaves(episode["observations" if field == "obs" else "actions"])
                  if (leaf.dtype.kind == "f") == (value != "outside")]
        if leaves:
            leaf = leaves[int(at * len(leaves))]
            leaf[int(at * len(leaf))] = {"nan": np.nan, "inf": np.inf, "outside": 7}[value]
    elif field == "reward":
        episode["rewards"][int(at * steps)] = np.nan if value == "nan" else 1e39  # 1e39: an infinity as float32
    elif damage == "early_end" and steps > 1:
        episode["terminations"][int(at * (steps - 1))] = True
    elif damage == "unfinished":
        episode["terminations"][-1] = episode["truncations"][-1] = False


def _columns(episodes: list[dict[str, Any]], spaces: Spaces) -> tuple[Any, Any, Any]:
    """The episodes joined a field at a time, as the HDF5 reader reads a chunk."""
    def leaf(tree: Any, path: tuple[str, ...]) -> Any:
        for key in path:
            tree = tree[key]
        return tree

    observations = {path: np.concatenate([leaf(episode["observations"], path) for episode in episodes])
                    for path, _ in spaces.obs}
    steps = {name: np.concatenate([episode[name] for episode in episodes])
             for name in ("actions", "rewards", "terminations", "truncations")}
    return observations, steps, np.array([len(episode["rewards"]) for episode in episodes])


def _first_refusal(episodes: list[dict[str, Any]], spaces: Spaces) -> RlbufError | None:
    for number, episode in enumerate(episodes):
        try:
            check_episode({**episode, "id": number}, spaces)
        except RlbufError as error:
            return error
    return None


shapes_strategy = st.lists(st.tuples(st.integers(1, 6), st.sampled_from(["terminated", "truncated", "both"])),
                           min_size=1, max_size=5)


@settings(max_examples=200, deadline=None)
@given(kind=st.sampled_from(sorted(SPACES)), shapes=shapes_strategy, damage=st.sampled_from([None, *DAMAGE]),
       which=st.floats(0, 1, exclude_max=True), at=st.floats(0, 1, exclude_max=True), seed=st.integers(0, 2**16))
def test_a_chunk_passes_exactly_when_each_of_its_episodes_passes(kind: str, shapes: list[tuple[int, str]],
                                                                 damage: str | None, which: float, at: float,
                                                                 seed: int) -> None:
    rng = np.random.default_rng(seed)
    spaces = Spaces.of(*SPACES[kind])
    episodes = [_episode(kind, steps, end, rng) for steps, end in shapes]
    if damage is not None:
        _damage(episodes[int(which * len(episodes))], damage, at)
    assert columns_valid(*_columns(episodes, spaces), spaces) == (_first_refusal(episodes, spaces) is None)


def test_a_chunk_of_an_empty_episode_or_of_rewards_that_are_no_numbers_is_left_to_check_episode() -> None:
    spaces = Spaces.of(*SPACES["flat"])
    episode = _episode("flat", 2, "terminated", np.random.default_rng(0))
    observations, steps, lengths = _columns([episode], spaces)
    assert columns_valid(observations, steps, lengths, spaces)
    assert not columns_valid(observations, steps, np.array([0, 2]), spaces)
    assert not columns_valid(observations, {**steps, "rewards": steps["rewards"].astype(bool)}, lengths, spaces)


def _minari_dataset(episodes: list[dict[str, Any]], kind: str) -> Any:
    observation_space, action_space = SPACES[kind]
    buffers = [EpisodeBuffer(seed=number, observations=episode["observations"], actions=episode["actions"],
                             rewards=episode["rewards"], terminations=episode["terminations"],
                             truncations=episode["truncations"]) for number, episode in enumerate(episodes)]
    with pytest.warns(UserWarning):  # Minari's reminders of metadata (author, code_permalink ...)
        return minari.create_dataset_from_buffers(f"rlbuf-test/checks{next(_IDS)}-v0", buffers,
                                                  observation_space=observation_space, action_space=action_space)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(sorted(SPACES)), shapes=shapes_strategy, damage=st.sampled_from(DAMAGE),
       which=st.floats(0, 1, exclude_max=True), at=st.floats(0, 1, exclude_max=True), seed=st.integers(0, 2**16))
def test_a_damaged_episode_amid_an_hdf5_chunk_is_refused_as_check_episode_refuses_it(
        kind: str, shapes: list[tuple[int, str]], damage: str, which: float, at: float, seed: int,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """One chunk of HDF5 episodes, one damaged: the error check_episode gives for it (its episode, field and
    row named), and no buffer; the same episodes undamaged load as Minari's own reader reads them."""
    rng = np.random.default_rng(seed)
    episodes = [_episode(kind, steps, end, rng) for steps, end in shapes]
    spaces = Spaces.of(*SPACES[kind])
    good = from_minari(_minari_dataset(episodes, kind))
    expected = np.concatenate([episode["rewards"] for episode in episodes])
    assert good.sample_all().extras["dataset_reward"].numpy().tobytes() == expected.tobytes()
    _damage(episodes[int(which * len(episodes))], damage, at)
    refusal = _first_refusal(episodes, spaces)
    dataset = _minari_dataset(episodes, kind)
    closed = []
    monkeypatch.setattr(ReplayBuffer, "close", lambda self: closed.append(self))
    if refusal is None:  # damage the spaces allow (an infinity in an unbounded Box, say)
        assert len(from_minari(dataset)) == len(expected)
        return
    with pytest.raises(type(refusal)) as raised:
        from_minari(dataset)
    # the buffer taking the chunk is closed; an error in the first episode comes before any buffer is made
    assert str(raised.value) == str(refusal) and len(closed) == (not str(refusal).startswith("episode 0:"))


def test_a_chunk_is_checked_a_field_at_a_time_not_episode_by_episode(monkeypatch: pytest.MonkeyPatch) -> None:
    """HDF5 episodes that pass go into the buffer without check_episode (the first one is checked alone,
    as the probe that sets the buffer's fields)."""
    episodes = [_episode("flat", 3, "truncated", np.random.default_rng(number)) for number in range(3)]
    dataset = _minari_dataset(episodes, "flat")
    checked = []
    monkeypatch.setattr(rlbuf.offline, "check_episode", lambda episode, spaces: checked.append(episode["id"]) or 3)
    assert len(from_minari(dataset)) == 9 and checked == [0]
