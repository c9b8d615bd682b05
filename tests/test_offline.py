"""rlbuf.offline: Minari → rlbuf → Minari → rlbuf is the identity, and inconsistent datasets are refused by name.

Datasets are made here with Minari's own ``create_dataset_from_buffers`` (both backends), in a
temporary ``MINARI_DATASETS_PATH``; nothing is downloaded.
"""

from __future__ import annotations

import itertools
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

minari = pytest.importorskip("minari")

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from minari.data_collector import EpisodeBuffer  # noqa: E402

import rlbuf.offline  # noqa: E402
from rlbuf import ReplayBuffer  # noqa: E402
from rlbuf.errors import (  # noqa: E402
    ConfigError,
    DtypeError,
    MissingFieldError,
    NonFiniteError,
    OutOfRangeError,
    ShapeError,
    StreamError,
)
from rlbuf.offline import from_minari, to_minari  # noqa: E402

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


@pytest.fixture(autouse=True)
def minari_root(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A temporary Minari root for the whole test (hypothesis examples too: ids never repeat)."""
    with tempfile.TemporaryDirectory() as root:
        monkeypatch.setenv("MINARI_DATASETS_PATH", root)
        yield Path(root)


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


episodes_strategy = st.lists(st.tuples(st.integers(1, 5), st.sampled_from(["terminated", "truncated", "both"]),
                                       st.one_of(st.none(), st.integers(0, 2**40))), min_size=1, max_size=4)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(sorted(SPACES)), data_format=st.sampled_from(["hdf5", "arrow"]),
       shapes=episodes_strategy, seed=st.integers(0, 2**16))
def test_minari_rlbuf_minari_rlbuf_is_the_identity(kind: str, data_format: str,
                                                    shapes: list[tuple[int, str, int | None]], seed: int) -> None:
    rng = np.random.default_rng(seed)
    source = _minari_dataset([_episode(kind, *shape, rng) for shape in shapes], kind, data_format)
    first = from_minari(source)
    exported = to_minari(first, _new_id(), data_format=data_format, observation_space=source.observation_space,
                         action_space=source.action_space)
    again = minari.load_dataset(exported.id)  # as any Minari user reads it
    _assert_same_episodes(source, again)
    second = from_minari(exported.id)
    _assert_same_rows(first, second)
    assert len(second) == sum(steps for steps, _, _ in shapes)


def _options_strategy(data_format: str) -> st.SearchStrategy[Any]:
    """One set of option keys and kinds, drawn per episode: what env.reset took (JSON values for Arrow,
    which Minari writes as JSON; numpy values of other dtypes too for HDF5)."""
    floats = st.floats(allow_nan=False, allow_infinity=False)
    leaves: dict[str, st.SearchStrategy[Any]] = {
        "int": st.integers(-2**62, 2**62), "float": floats, "bool": st.booleans(),
        "vector": st.lists(floats, min_size=2, max_size=2), "ints": st.lists(st.integers(-9, 9), min_size=3,
                                                                            max_size=3)}
    leaves["text"] = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\0"), max_size=6)
    if data_format == "hdf5":
        leaves["float32"] = st.floats(width=32, allow_nan=False).map(np.float32)
        leaves["int16"] = st.lists(st.integers(-9, 9), min_size=2, max_size=2).map(lambda v: np.array(v, np.int16))
    names = st.sampled_from(["low", "high", "goal", "level_2", "minari_autoseed"])
    schema = st.dictionaries(names, st.one_of(st.sampled_from(sorted(leaves)), st.dictionaries(
        names, st.sampled_from(sorted(leaves)), min_size=1, max_size=2)), min_size=1, max_size=3)

    def values(kinds: dict[str, Any]) -> st.SearchStrategy[Any]:
        return st.fixed_dictionaries({key: values(kind) if isinstance(kind, dict) else leaves[kind]
                                      for key, kind in kinds.items()})

    return st.one_of(st.none(), schema.map(values))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), data_format=st.sampled_from(["hdf5", "arrow"]), shapes=episodes_strategy,
       seed=st.integers(0, 2**16))
def test_reset_options_asked_for_survive_minari_rlbuf_minari_rlbuf(
        data: st.DataObject, data_format: str, shapes: list[tuple[int, str, int | None]], seed: int) -> None:
    options = data.draw(_options_strategy(data_format))
    rng = np.random.default_rng(seed)
    episodes = [{**_episode("flat", *shape, rng), "options": None if options is None else data.draw(options)}
                for shape in shapes]
    source = _minari_dataset(episodes, "flat", data_format)
    first = from_minari(source, options=True)
    fields = [name for name in _rows(first) if name.startswith(("option_", "str_option_"))]
    assert bool(fields) == (options is not None)
    exported = to_minari(first, _new_id(), data_format=data_format, observation_space=source.observation_space,
                         action_space=source.action_space)
    _assert_same_episodes(source, minari.load_dataset(exported.id))
    _assert_same_rows(first, from_minari(exported.id, options=True))
    lean = from_minari(source, exact=False)  # options are left out unless asked for
    assert not any(name.startswith(("option_", "str_option_")) for name in _rows(lean))


def test_options_are_fields_of_their_episodes_rows_and_only_those_asked_for() -> None:
    rng = np.random.default_rng(11)
    episodes = [{**_episode("flat", n, "truncated", None, rng), "options": {"low": low, "goal": {"xy": [low, 1.0]}}}
                for n, low in [(2, -0.5), (3, 0.25)]]
    dataset = _minari_dataset(episodes)
    rows = _rows(from_minari(dataset, options=True))
    assert rows["option_low"].tolist() == [-0.5, -0.5, 0.25, 0.25, 0.25]
    assert rows["option_low"].dtype == torch.float64
    assert rows["option_goal__xy"].tolist() == [[-0.5, 1.0]] * 2 + [[0.25, 1.0]] * 3
    assert "option_goal__xy" not in _rows(from_minari(dataset, options=["low"]))
    texts = from_minari(_minari_dataset([{**episode, "options": {"task": task}} for episode, task
                                         in zip(episodes, ["reach", "pick-and-placé"], strict=True)]), options=True)
    rows = _rows(texts)
    assert rows["str_option_task"].dtype == torch.uint8 and rows["str_option_task"].shape == (5, 15)
    assert bytes(rows["str_option_task"][-1].tolist()).decode() == "pick-and-placé"
    back = to_minari(texts, _new_id())
    assert [m["options"] for m in back.storage.get_episode_metadata([0, 1])] == [
        {"task": "reach"}, {"task": "pick-and-placé"}]
    with pytest.raises(DtypeError, match=r'episode 1: options\["task"\]: expected a str without "\\0"'):
        from_minari(_minari_dataset(_options_of({"task": "a"}, {"task": "b\0"}), "flat", "arrow"), options=True)
    written = to_minari([{**episodes[0], "options": {"task": "reach", "low": np.float32(2)}}], _new_id())
    assert next(iter(written.storage.get_episode_metadata([0])))["options"] == {"task": "reach", "low": 2.0}


def _options_of(*options: Any) -> list[dict[str, Any]]:
    rng = np.random.default_rng(12)
    return [{**_episode("flat", 2, "terminated", None, rng), "options": option} for option in options]


BAD_OPTIONS = {
    "missing": (_options_of({"low": 1.0}, None), True, MissingFieldError,
                r'episode 1: options\["low"\]: missing \(the first episode has it'),
    "extra": (_options_of({"low": 1.0}, {"low": 2.0, "high": 3.0}), True, ConfigError,
              r'episode 1: options\["high"\]: the first episode has no such option'),
    "text": (_options_of({"task": "reach"}, {"task": 3}), True, DtypeError,
             r"episode 1: options\[\"task\"\]: expected a str \(as the first episode's\), got np.int64\(3\)"),
    "not_text": (_options_of({"task": 3}, {"task": "reach"}), True, DtypeError,
                 r"episode 1: options\[\"task\"\]: expected a number, a bool or an array of them, got 'reach'"),
    "shape": (_options_of({"goal": [1.0, 2.0]}, {"goal": [1.0]}), True, ShapeError,
              r'episode 1: options\["goal"\]: expected shape \(2,\) \(as the first episode\'s\), got \(1,\)'),
    "dtype": (_options_of({"level": 1}, {"level": 1.5}), True, DtypeError,
              r'episode 1: options\["level"\]: expected dtype int64 \(as the first episode\'s\), got float64'),
    "name": (_options_of({"a__b": 1}), True, ConfigError, r"the key 'a__b' cannot name the field option_"),
    "not_there": (_options_of({"low": 1.0}), ["high"], MissingFieldError,
                  r"episode 0: options: no 'high', got \['low'\]"),
    "a_str": (_options_of({"low": 1.0}), "low", ConfigError,
              r"options: expected True, False or a list of keys, got 'low'; pass \['low'\]"),
}


@pytest.mark.parametrize("case", sorted(BAD_OPTIONS))
def test_options_a_buffer_cannot_hold_are_refused_by_name(case: str) -> None:
    episodes, options, error, message = BAD_OPTIONS[case]
    dataset = _minari_dataset(episodes)
    with pytest.raises(error, match=message):
        from_minari(dataset, options=options)
    from_minari(dataset)  # without options=, the dataset loads


def test_to_minari_refuses_options_minari_cannot_read_back() -> None:
    with pytest.raises(DtypeError, match=r'episode 0: options\["low"\]: expected a number, a bool or an array'):
        to_minari(_options_of({"low": None}), _new_id())
    with pytest.raises(ConfigError, match=r"episode 0: options: expected a dict \(what env.reset took\), got list"):
        to_minari(_options_of([1.0]), _new_id())


def test_each_row_is_a_step_and_a_truncated_episode_keeps_its_final_observation() -> None:
    rng = np.random.default_rng(0)
    episodes = [_episode("flat", 3, "truncated", 7, rng), _episode("flat", 2, "terminated", None, rng)]
    buffer = from_minari(_minari_dataset(episodes))
    rows = _rows(buffer)
    observations = np.concatenate([episodes[0]["observations"][:-1], episodes[1]["observations"][:-1]])
    finals = np.concatenate([episodes[0]["observations"][1:], episodes[1]["observations"][1:]])
    assert np.array_equal(rows["obs"].numpy(), observations) and np.array_equal(rows["next_obs"].numpy(), finals)
    assert rows["obs"].dtype == torch.float64  # the space's dtype, exactly
    assert rows["truncated"].tolist() == [False, False, True, False, False]
    assert rows["terminated"].tolist() == [False, False, False, False, True]  # never truncated = done
    assert rows["episode_id"].tolist() == [0, 0, 0, 1, 1]
    assert rows["episode_seed"].tolist() == [7, 7, 7, -1, -1]
    assert rows["dataset_reward"].dtype == torch.float64
    assert np.array_equal(rows["dataset_reward"].numpy(), np.concatenate([e["rewards"] for e in episodes]))
    assert buffer.capacity == 5


@pytest.mark.parametrize("options", [{"compact": True}, {"storage": "memmap"}, {"exact": False}],
                         ids=["compact", "memmap", "not-exact"])
def test_buffer_options_store_the_same_transitions(options: dict[str, Any]) -> None:
    rng = np.random.default_rng(1)
    dataset = _minari_dataset([_episode("flat", n, end, None, rng) for n, end in
                               [(4, "truncated"), (1, "terminated"), (3, "terminated")]])
    plain, other = from_minari(dataset), from_minari(dataset, capacity=20, seed=0, **options)
    one, two = _rows(plain), _rows(other)
    for name in ("obs", "action", "reward", "next_obs", "terminated", "truncated"):
        assert (one[name] == two[name]).all(), name
    assert other.capacity == 20
    if options.get("exact") is False:
        assert two.keys() == {"obs", "action", "reward", "next_obs", "terminated", "truncated"}
    with pytest.raises(ConfigError, match="capacity=5: below the dataset's 8 steps"):
        from_minari(dataset, capacity=5)
    with pytest.raises(ConfigError, match="extra_fields: set by the dataset"):
        from_minari(dataset, extra_fields={"cost": ((), torch.float32)})


@pytest.mark.parametrize("data_format", ["hdf5", "arrow"])
def test_infos_asked_for_are_fields_and_go_back_out(data_format: str) -> None:
    rng = np.random.default_rng(9)
    episodes = [_episode("flat", n, "truncated", None, rng) for n in (3, 2)]
    infos = [{"success": np.arange(n + 1) == n, "distance": rng.random(n + 1).astype(np.float32),
              "contact": rng.random((n + 1, 2))} for n in (3, 2)]
    observation_space, action_space = SPACES["flat"]
    buffers = [EpisodeBuffer(observations=e["observations"], actions=e["actions"], rewards=e["rewards"],
                             terminations=e["terminations"], truncations=e["truncations"],
                             infos={k: list(v) if data_format == "arrow" and v.ndim == 1 else v for k, v in i.items()})
               for e, i in zip(episodes, infos, strict=True)]  # Minari's Arrow reads 1-D infos back from lists only
    with pytest.warns(UserWarning):
        source = minari.create_dataset_from_buffers(_new_id(), buffers, observation_space=observation_space,
                                                    action_space=action_space, data_format=data_format)
    buffer = from_minari(source, infos=True)
    rows = _rows(buffer)
    assert rows["info_success"].tolist() == [False, False, False, False, False]
    assert rows["next_info_success"].tolist() == [False, False, True, False, True]
    assert rows["next_info_contact"].shape == (5, 2) and rows["info_distance"].dtype == torch.float32
    assert "info_contact" not in _rows(from_minari(source, infos=["success", "distance"]))
    exported = to_minari(buffer, _new_id(), data_format=data_format, observation_space=observation_space,
                         action_space=action_space)
    for written, expected in zip(minari.load_dataset(exported.id).iterate_episodes(), infos, strict=True):
        assert written.infos.keys() == expected.keys()
        for key in expected:
            _assert_same_tree(np.asarray(written.infos[key]), expected[key])
    _assert_same_rows(buffer, from_minari(exported.id, infos=True))


def test_options_load_with_infos_an_episode_at_a_time_reads() -> None:
    # A bool info makes HDF5 episodes read one at a time; their options were then taken as missing (helper 41).
    rng = np.random.default_rng(10)
    episodes = [_episode("flat", n, "terminated", seed, rng) for seed, n in enumerate((3, 2))]
    buffers = [EpisodeBuffer(seed=e["seed"], options={"x": 1.5 + e["seed"]}, observations=e["observations"],
                             actions=e["actions"], rewards=e["rewards"], terminations=e["terminations"],
                             truncations=e["truncations"], infos={"success": np.arange(len(e["rewards"]) + 1) > 1})
               for e in episodes]
    with pytest.warns(UserWarning):
        source = minari.create_dataset_from_buffers(_new_id(), buffers, observation_space=BOX, action_space=ACTIONS)
    rows = _rows(from_minari(source, infos=True, options=True))
    assert rows["option_x"].tolist() == [1.5, 1.5, 1.5, 2.5, 2.5]
    assert rows["next_info_success"].tolist() == [False, True, True, False, True]


def test_a_missing_id_is_refused_by_name_with_the_way_to_get_it() -> None:
    with pytest.raises(ConfigError, match=r"'D4RL/door/human-v2': not a local Minari dataset .* `minari download "
                                          r"D4RL/door/human-v2`"):
        from_minari("D4RL/door/human-v2")


def test_a_dataset_is_found_by_id_and_by_path() -> None:
    dataset = _minari_dataset([_episode("flat", 2, "terminated", None, np.random.default_rng(2))])
    by_id, by_path = from_minari(dataset.id), from_minari(Path(os.environ["MINARI_DATASETS_PATH"]) / dataset.id)
    _assert_same_rows(by_id, by_path)


def test_a_filtered_dataset_loads_its_episodes_with_their_ids_and_seeds() -> None:
    rng = np.random.default_rng(8)
    dataset = _minari_dataset([_episode("flat", n, "terminated", seed, rng) for n, seed in [(2, 1), (3, 2), (1, 3)]])
    rows = _rows(from_minari(dataset.filter_episodes(lambda episode: len(episode) != 3)))
    assert rows["episode_id"].tolist() == [0, 0, 2] and rows["episode_seed"].tolist() == [1, 1, 3]


def _with(episode: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {**episode, **changes}


GOOD = _episode("flat", 4, "truncated", None, np.random.default_rng(3))
INCONSISTENT = {
    "lengths": (_with(GOOD, actions=GOOD["actions"][:3]), ShapeError,
                r"episode 1: actions: expected shape \(4, 2\) \(4 steps\), got \(3, 2\)"),
    "final_obs": (_with(GOOD, observations=GOOD["observations"][:4]), ShapeError,
                  r"episode 1: observations: expected 5 rows .* got 4: the final observation is missing"),
    "shape": (_with(GOOD, observations=np.zeros((5, 4))), ShapeError,
              r"episode 1: observations: expected shape \(5, 3\) \(4 steps\), got \(5, 4\)"),
    "unfinished": (_with(GOOD, truncations=np.zeros(4, bool)), StreamError,
                   r"episode 1: terminations, truncations: expected the last step 3 to be terminated or truncated"),
    "early_end": (_with(GOOD, terminations=np.array([False, True, False, False])), StreamError,
                  r"episode 1: terminations: expected no end before the last step 3, got True at step 1"),
    "nan_obs": (_with(GOOD, observations=np.where(np.arange(5)[:, None] == 2, np.nan, GOOD["observations"])),
                NonFiniteError, r"episode 1: observations: NaN at row 2"),
    "nan_reward": (_with(GOOD, rewards=np.array([0.0, np.nan, 0.0, 0.0])), NonFiniteError,
                   r"episode 1: rewards: expected finite float32 values, got nan at step 1"),
    "dtype": (_with(GOOD, actions=GOOD["actions"].astype(np.float64)), DtypeError,
              r"episode 1: actions: expected dtype float32 \(the space's\), got float64"),
}


@pytest.mark.parametrize("case", sorted(INCONSISTENT))
def test_an_inconsistent_dataset_is_refused_by_name_and_nothing_is_returned(
        case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    bad, error, message = INCONSISTENT[case]
    dataset = _minari_dataset([GOOD, bad, GOOD])
    monkeypatch.setattr(rlbuf.offline, "_CHUNK_BYTES", 1)  # one episode a chunk: the good first one goes in
    extended, closed = [], []
    monkeypatch.setattr(ReplayBuffer, "extend", lambda self, td: extended.append(td.batch_size[0]))
    monkeypatch.setattr(ReplayBuffer, "close", lambda self: closed.append(self))
    with pytest.raises(error, match=message):
        from_minari(dataset)
    assert extended == [4] and len(closed) == 1  # the buffer that took the first episode was closed, not returned


@pytest.mark.parametrize("case", sorted(INCONSISTENT))
def test_an_inconsistent_episode_amid_a_chunk_is_refused_by_name(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    bad, error, message = INCONSISTENT[case]
    dataset = _minari_dataset([GOOD, GOOD, bad, GOOD])  # one chunk: the bad episode is read amid good ones
    closed = []
    monkeypatch.setattr(ReplayBuffer, "close", lambda self: closed.append(self))
    with pytest.raises(error, match=message.replace("episode 1", "episode 2")):
        from_minari(dataset)
    assert len(closed) == 1


@pytest.mark.parametrize("data_format", ["hdf5", "arrow"])
@pytest.mark.parametrize("options", [{}, {"compact": True}, {"compact": True, "exact": False}], ids=str)
def test_chunks_of_any_size_store_the_same_rows(data_format: str, options: dict[str, Any],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks reuse their arrays (two sets, alternating): many small chunks store what one chunk stores."""
    rng = np.random.default_rng(5)
    episodes = [_episode(kind, n, end, seed, rng) for kind, n, end, seed in
                [("flat", 3, "terminated", 1), ("flat", 5, "truncated", None), ("flat", 1, "both", 7),
                 ("flat", 4, "truncated", 2), ("flat", 2, "terminated", 3), ("flat", 6, "truncated", 4)]]
    dataset = _minari_dataset(episodes, "flat", data_format)
    whole = from_minari(dataset, **options)
    for chunk_bytes in (1, 120):  # one episode a chunk; about 3 steps a chunk (BOX and ACTIONS: 42 bytes a step)
        monkeypatch.setattr(rlbuf.offline, "_CHUNK_BYTES", chunk_bytes)
        _assert_same_rows(whole, from_minari(dataset, **options))
    assert len(whole) == 21


def test_steps_that_are_not_the_metadatas_total_are_refused() -> None:
    import json

    dataset = _minari_dataset([GOOD, GOOD])
    path = Path(dataset.storage.data_path) / "metadata.json"
    metadata = json.loads(path.read_text())
    path.write_text(json.dumps({**metadata, "total_steps": 5}))
    with pytest.raises(ShapeError, match=r"total_steps: expected the 5 steps its metadata says, got more"):
        from_minari(dataset.id)


def test_a_discrete_value_outside_its_space_is_refused() -> None:
    episode = _episode("dict", 2, "terminated", None, np.random.default_rng(4))
    episode["actions"] = np.array([0, 3])
    with pytest.raises(OutOfRangeError, match=r"episode 0: actions: expected values in \[0, 2\] .* got 3 at row 1"):
        from_minari(_minari_dataset([episode], "dict"))


@pytest.mark.parametrize(("observation_space", "action_space", "change", "error", "message"), [
    # helper 41: MultiBinary and integer Box values were not range-checked; an infinity in a bounded Box loaded.
    (gym.spaces.MultiBinary(2), gym.spaces.Discrete(2), lambda e: e["observations"].__setitem__((1, 1), 2),
     OutOfRangeError, r"episode 0: observations: expected values in \[0, 1\] .* at row 1"),
    (BOX, gym.spaces.MultiBinary(1), lambda e: e["actions"].__setitem__((1, 0), 2),
     OutOfRangeError, r"episode 0: actions: expected values in \[0, 1\]"),
    (gym.spaces.Box(0, 3, (2,), np.int64), gym.spaces.Discrete(2), lambda e: e["observations"].__setitem__((1, 0), 99),
     OutOfRangeError, r"episode 0: observations: expected values in \[0, 3\] .* at row 1"),
    (BOX, gym.spaces.Box(0, 3, (), np.int64), lambda e: e["actions"].__setitem__(0, 9),
     OutOfRangeError, r"episode 0: actions: expected values in \[0, 3\]"),
    (gym.spaces.Box(-1, 1, (2,), np.float32), gym.spaces.Discrete(2),
     lambda e: e["observations"].__setitem__((2, 0), np.inf),
     NonFiniteError, r"episode 0: observations: an infinity at row 2, where its space is bounded"),
])
def test_a_value_outside_a_discrete_or_bounded_space_is_refused_by_episode(
        observation_space: Any, action_space: Any, change: Any, error: type[Exception], message: str) -> None:
    rng = np.random.default_rng(7)
    episode = {"observations": _values(observation_space, 4, rng), "actions": _values(action_space, 3, rng),
               "rewards": np.zeros(3), "terminations": np.array([False, False, True]),
               "truncations": np.zeros(3, bool)}
    to_minari([episode], _new_id(), observation_space=observation_space, action_space=action_space)  # valid: written
    change(episode)
    with pytest.raises(error, match=message):
        to_minari([episode], _new_id(), observation_space=observation_space, action_space=action_space)
    buffers = [EpisodeBuffer(observations=episode["observations"], actions=episode["actions"],
                             rewards=episode["rewards"], terminations=episode["terminations"],
                             truncations=episode["truncations"])]
    with pytest.warns(UserWarning):
        dataset = minari.create_dataset_from_buffers(_new_id(), buffers, observation_space=observation_space,
                                                     action_space=action_space)
    with pytest.raises(error, match=message):
        from_minari(dataset)


def _values(space: Any, rows: int, rng: np.random.Generator) -> np.ndarray[Any, Any]:
    if isinstance(space, (gym.spaces.MultiBinary, gym.spaces.Discrete)) or space.dtype.kind == "i":
        high = 2 if not isinstance(space, gym.spaces.Box) else int(space.high.max()) + 1
        return rng.integers(0, high, (rows, *space.shape)).astype(space.dtype)
    return rng.uniform(-1, 1, (rows, *space.shape)).astype(space.dtype)


def test_small_uint8_data_that_minari_0_5_3_broke_is_refused_with_the_cause() -> None:
    """Minari <= 0.5.3 wrote uint8 rows of 2 dims as JPEG bytes whatever their space (0.5.4 writes them raw)."""
    import h5py

    episode = _episode("small_uint8", 2, "terminated", None, np.random.default_rng(6))
    dataset = _minari_dataset([episode], "small_uint8", "hdf5")
    with h5py.File(Path(dataset.storage.data_path) / "main_data.hdf5", "a") as file:
        del file["episode_0/observations"]
        file["episode_0"].create_dataset("observations", dtype=h5py.vlen_dtype(np.uint8), data=np.array(
            [np.arange(n, dtype=np.uint8) for n in (5, 6, 7)], dtype=object))  # as 0.5.3 left them
    with pytest.raises(ShapeError, match=r"episode 0: observations: expected shape \(3, 4, 4\) \(2 steps\), got "
                                         r"\(3,\) of objects, one a row .* the HDF5 writer of Minari 0.5.3 and older"):
        from_minari(dataset)


def test_to_minari_checks_every_episode_before_writing(minari_root: Path) -> None:
    bad = _with(GOOD, observations=GOOD["observations"][:4])
    with pytest.raises(ShapeError, match=r"episode 1: observations: .* the final observation is missing"):
        to_minari([GOOD, bad], "rlbuf-test/refused-v0", observation_space=BOX, action_space=ACTIONS)
    assert not (minari_root / "rlbuf-test" / "refused-v0").exists()
    to_minari([GOOD], "rlbuf-test/taken-v0")
    with pytest.raises(ConfigError, match="exists already"):
        to_minari([GOOD], "rlbuf-test/taken-v0")
    with pytest.raises(ConfigError, match="autor: not Minari dataset metadata"):
        to_minari([GOOD], "rlbuf-test/other-v0", autor="me")
    for seed in (-4, 2**63, 1.0, True):  # what from_minari would refuse to read back
        with pytest.raises(OutOfRangeError, match=r"episode 1: seed: expected an int in \[0, 2\*\*63\)"):
            to_minari([GOOD, {**GOOD, "seed": seed}], "rlbuf-test/seeded-v0")
    assert not (minari_root / "rlbuf-test" / "seeded-v0").exists()


@pytest.mark.parametrize("data_format", ["hdf5", "arrow"])
@pytest.mark.parametrize("kind", ["image", "gray", "small_uint8"])
def test_images_are_written_losslessly(kind: str, data_format: str) -> None:
    """Noise frames, which JPEG would change, come back from Minari's own reader byte for byte, and from_minari
    reads them as Minari does (with h5py directly for HDF5: they are raw)."""
    spaces = {**SPACES, "gray": (gym.spaces.Box(0, 255, (32, 32, 1), np.uint8), gym.spaces.Discrete(2))}
    observation_space, action_space = spaces[kind]
    rng = np.random.default_rng(5)
    episode = {**_episode("image", 3, "truncated", 1, rng),
               "observations": rng.integers(0, 256, (4, *observation_space.shape), dtype=np.uint8)}
    dataset = to_minari([episode], _new_id(), data_format=data_format, observation_space=observation_space,
                        action_space=action_space, author="rlbuf")
    read = next(minari.load_dataset(dataset.id).iterate_episodes())
    _assert_same_tree(read.observations, episode["observations"])
    rows = _rows(from_minari(dataset.id))
    assert rows["obs"].numpy().tobytes() == episode["observations"][:-1].tobytes()
    assert rows["next_obs"][-1].numpy().tobytes() == episode["observations"][-1].tobytes()


def _add_episode(buffer: ReplayBuffer, start: float, steps: int, *, terminated: bool = True) -> None:
    for t in range(steps):
        last = t == steps - 1
        buffer.add(np.array([start + t], np.float32), 0.0, 1.0, np.array([start + t + 1], np.float32),
                   terminated and last, truncated=last and not terminated)


def test_a_buffer_exports_complete_episodes_only() -> None:
    buffer = ReplayBuffer(8, obs_shape=(1,), action_shape=(), seed=0)
    _add_episode(buffer, 0, 3)
    _add_episode(buffer, 10, 2, terminated=False)
    _add_episode(buffer, 20, 2)  # unfinished: one step of it
    buffer.add(np.array([30], np.float32), 0.0, 1.0, np.array([31], np.float32), False, truncated=False)
    dataset = to_minari(buffer, _new_id())
    episodes = list(dataset.iterate_episodes())
    assert [e.observations[:, 0].tolist() for e in episodes] == [[0, 1, 2, 3], [10, 11, 12], [20, 21, 22]]
    assert [e.truncations.tolist() for e in episodes] == [[False, False, False], [False, True], [False, False]]
    _add_episode(buffer, 31, 2)  # the last episode ends; the ring wraps over the first one's first steps
    wrapped = [e.observations[:, 0].tolist() for e in to_minari(buffer, _new_id()).iterate_episodes()]
    assert wrapped == [[10, 11, 12], [20, 21, 22], [30, 31, 32, 33]]


def test_a_buffer_of_several_envs_exports_each_envs_episodes() -> None:
    buffer = ReplayBuffer(16, obs_shape=(1,), action_shape=(), num_envs=2, seed=0)
    for t in range(4):
        buffer.add(np.array([[t], [100 + t]], np.float32), np.zeros(2), np.ones(2),
                   np.array([[t + 1], [101 + t]], np.float32), np.array([t == 1, False]),
                   truncated=np.array([False, t == 3]))
    episodes = list(to_minari(buffer, _new_id()).iterate_episodes())
    assert [e.observations[:, 0].tolist() for e in episodes] == [[0, 1, 2], [100, 101, 102, 103, 104]]
    assert [e.terminations[-1] for e in episodes] == [True, False]


def test_a_buffer_whose_env_streams_cannot_be_told_apart_is_refused() -> None:
    buffer = ReplayBuffer(16, obs_shape=(1,), action_shape=(), num_envs=2, seed=0)
    buffer.add(np.zeros((2, 1), np.float32), np.zeros(2), np.ones(2), np.ones((2, 1), np.float32),
               np.array([True, False]), truncated=False, env_mask=np.array([True, False]))
    with pytest.raises(ConfigError, match="num_envs=2 whose rows were not all written a whole step at a time"):
        to_minari(buffer, _new_id())


def test_an_n_step_buffer_is_refused_its_rows_are_not_steps(minari_root: Path) -> None:
    # Its rows are n-step transitions: exported, each reward was a 3-step sum and episodes were split (helper 41).
    dataset = _minari_dataset([_episode("flat", 2, "terminated", None, np.random.default_rng(s)) for s in range(3)])
    n_step = from_minari(dataset, n_step=3, gamma=0.5)
    with pytest.raises(ConfigError, match=r"^source: a buffer of n_step=3 gives n-step transitions .* export from a "
                                          r"buffer of n_step=1"):
        to_minari(n_step, "rlbuf-test/n-step-v0", observation_space=BOX, action_space=ACTIONS)
    assert not (minari_root / "rlbuf-test" / "n-step-v0").exists()
    copy = to_minari(from_minari(dataset), _new_id(), observation_space=BOX, action_space=ACTIONS)
    _assert_same_episodes(dataset, copy)


def test_int64_rows_a_float64_space_would_round_are_refused_before_writing(minari_root: Path) -> None:
    episode = {**GOOD, "observations": np.full((5, 3), 2**53, np.int64)}
    exact = to_minari([episode], _new_id(), observation_space=BOX, action_space=ACTIONS)
    assert next(exact.iterate_episodes()).observations[0, 0] == 2**53
    episode["observations"][2, 1] += 1
    with pytest.raises(DtypeError, match=r"episode 0: observations: the rows are int64, the space is float64, which "
                                         r"holds integers exactly only within \+-2\*\*53; got 9007199254740993; "
                                         r"pass a space of dtype int64"):
        to_minari([episode], "rlbuf-test/rounded-v0", observation_space=BOX, action_space=ACTIONS)
    assert not (minari_root / "rlbuf-test" / "rounded-v0").exists()


@pytest.mark.parametrize("data_format", ["hdf5", "arrow"])
def test_uint16_observations_load_widened_where_obs_dtype_asks_and_go_back_out(data_format: str) -> None:
    depth = gym.spaces.Box(0, 65535, (2,), np.uint16)
    episode = {**GOOD, "observations": np.array([[0, 65535], [1, 2], [3, 4], [5, 6], [7, 8]], np.uint16)}
    dataset = to_minari([episode], _new_id(), data_format=data_format, observation_space=depth, action_space=ACTIONS)
    with pytest.raises(ConfigError, match=r"^obs_dtype: the dataset's observations are uint16, which torch does not "
                                          r"store; pass obs_dtype=torch.int32 \(it holds every uint16 value\)"):
        from_minari(dataset)
    with pytest.raises(DtypeError, match=r"^obs_dtype=torch.int16: does not hold every uint16 value"):
        from_minari(dataset, obs_dtype=torch.int16)
    buffer = from_minari(dataset, obs_dtype=torch.int32)
    assert _rows(buffer)["obs"].tolist() == episode["observations"][:4].tolist()
    assert _rows(buffer)["obs"].dtype == torch.int32
    _assert_same_episodes(dataset, to_minari(buffer, _new_id(), data_format=data_format, observation_space=depth,
                                             action_space=ACTIONS))


@pytest.mark.parametrize("space", [gym.spaces.Box(0, 9, (2,), np.uint64),
                                   gym.spaces.Dict({"depth": gym.spaces.Box(0, 9, (2,), np.uint16)})])
def test_to_minari_refuses_observations_from_minari_cannot_store_before_writing(space: Any, minari_root: Path) -> None:
    observations = space.sample()
    rows = ({"depth": np.stack([observations["depth"]] * 5)} if isinstance(space, gym.spaces.Dict)
            else np.stack([observations] * 5))
    with pytest.raises(ConfigError, match=r'^observations(\["depth"\])?: a space of dtype uint(64|16), which no '
                                          r"buffer stores .* use a space of a signed dtype"):
        to_minari([{**GOOD, "observations": rows}], "rlbuf-test/unsigned-v0", observation_space=space,
                  action_space=ACTIONS)
    assert not (minari_root / "rlbuf-test" / "unsigned-v0").exists()


@pytest.mark.parametrize("data_format", ["hdf5", "arrow"])
def test_a_numpy_integer_seed_is_written_as_its_int(data_format: str) -> None:
    dataset = to_minari([{**GOOD, "seed": np.int64(3)}, {**GOOD, "seed": np.uint16(4)}], _new_id(),
                        data_format=data_format, observation_space=BOX, action_space=ACTIONS)
    assert _rows(from_minari(dataset))["episode_seed"].tolist() == [3] * 4 + [4] * 4


@pytest.mark.parametrize("data_format", ["hdf5", "arrow"])
def test_the_chunk_readers_read_what_minaris_reader_reads(data_format: str) -> None:
    """Pins Minari's HDF5 and Arrow layouts, which from_minari reads with h5py and pyarrow directly,
    chunk by chunk into reused arrays (each chunk compared before the next ones are read)."""
    from rlbuf._minari_chunks import _minari_episodes, dataset_chunks, reader
    from rlbuf._minari_read import Spaces

    rng = np.random.default_rng(7)
    for kind in ("flat", "dict"):
        lengths = [(3, 5), (2, None), (4, 1), (1, 2), (5, None), (2, 3)]
        dataset = _minari_dataset([_episode(kind, n, "truncated", seed, rng) for n, seed in lengths], kind,
                                  data_format)
        ids = [int(i) for i in dataset.episode_indices]
        spaces = Spaces.of(dataset.observation_space, dataset.action_space)
        assert reader(dataset, spaces) == data_format
        theirs = _minari_episodes(dataset, ids)
        chunks = 0
        for chunk in dataset_chunks(dataset, spaces, 5):
            chunks += 1
            for number in range(len(chunk.ids)):
                ours, expected = chunk.episode(number, structured=kind == "dict"), next(theirs)
                assert ours["id"] == expected["id"] and ours["seed"] == expected["seed"]
                for name in ("observations", "actions", "rewards", "terminations", "truncations"):
                    _assert_same_tree(ours[name], expected[name])
        assert chunks == 4 and next(theirs, None) is None  # several episodes a chunk, arrays reused


def test_an_arrow_episode_in_several_record_batches_and_files_loads_the_same_rows() -> None:
    """from_minari takes each record batch of an episode's files as a view, and joins several in order
    (Minari writes one batch an episode, and its own reader assumes so)."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    rng = np.random.default_rng(11)
    for kind in ("flat", "dict"):
        dataset = _minari_dataset([_episode(kind, n, "terminated", n, rng) for n in (5, 3, 6)], kind, "arrow")
        whole = from_minari(dataset)
        directory = Path(dataset.storage.data_path) / "1"
        (path,) = directory.glob("*.arrow")
        table = ipc.open_file(pa.py_buffer(path.read_bytes())).read_all()  # in memory: the file is rewritten
        for name, parts in ((path.name, [table.slice(0, 1), table.slice(1, 1)]), ("part-9.arrow", [table.slice(2)])):
            with ipc.new_file(str(directory / name), table.schema) as writer:
                for part in parts:
                    writer.write_table(part)
        _assert_same_rows(whole, from_minari(dataset))
        assert len(whole) == 5 + 3 + 6


def test_arrow_infos_of_an_episode_in_several_record_batches_and_files_load_as_minari_decodes_them() -> None:
    import pyarrow as pa
    import pyarrow.ipc as ipc

    from rlbuf._minari_arrow import arrow_episodes
    from rlbuf._minari_read import Spaces

    rng = np.random.default_rng(12)
    episodes = [{**_episode("flat", n, "terminated", None, rng), "infos": {
        "k": np.arange(n + 1) + 100 * n, "m": rng.random((n + 1, 2, 2)).astype(np.float32)}} for n in (4, 3, 5)]
    dataset = to_minari(episodes, _new_id(), data_format="arrow", observation_space=BOX, action_space=ACTIONS)
    spaces = Spaces.of(dataset.observation_space, dataset.action_space)
    theirs = dataset.storage.get_episodes([0, 1, 2])
    for ours, expected in zip(arrow_episodes(dataset, [0, 1, 2], spaces, True), theirs, strict=True):
        _assert_same_tree(ours["infos"], expected["infos"])  # one record batch an episode: Minari reads it right
    whole = from_minari(dataset, infos=True)
    directory = Path(dataset.storage.data_path) / "0"
    (path,) = directory.glob("*.arrow")
    table = ipc.open_file(pa.py_buffer(path.read_bytes())).read_all()
    for name, parts in ((path.name, [table.slice(0, 1), table.slice(1, 2)]), ("part-9.arrow", [table.slice(3)])):
        with ipc.new_file(str(directory / name), table.schema) as writer:
            for part in parts:
                writer.write_table(part)
    split = from_minari(dataset, infos=True)
    _assert_same_rows(whole, split)
    assert _rows(split)["next_info_k"].tolist() == [401, 402, 403, 404, 301, 302, 303, 501, 502, 503, 504, 505]


def test_an_arrow_observation_that_is_null_is_refused_by_episode() -> None:
    import pyarrow as pa
    import pyarrow.ipc as ipc

    dataset = _minari_dataset([GOOD, GOOD, GOOD], "flat", "arrow")
    (path,) = (Path(dataset.storage.data_path) / "1").glob("*.arrow")
    table = ipc.open_file(pa.py_buffer(path.read_bytes())).read_all()
    column = table.column("observations").combine_chunks()
    holed = pa.FixedSizeListArray.from_arrays(column.values, 3, mask=pa.array(np.arange(len(column)) == 2))
    with ipc.new_file(str(path), table.schema) as writer:
        writer.write_table(table.set_column(0, "observations", holed))
    with pytest.raises(ShapeError, match=r"episode 1: observations: expected shape \(5, 3\) \(4 steps\), got \(12,\)"):
        from_minari(dataset)


def test_an_hdf5_seed_of_another_type_is_read_as_it_is_stored() -> None:
    """Minari's seeds are int64 attributes (read without a new type); others go through h5py's own read."""
    import h5py

    dataset = _minari_dataset([_episode("flat", 2, "terminated", seed, np.random.default_rng(0)) for seed in (4, 5)])
    with h5py.File(Path(dataset.storage.data_path) / "main_data.hdf5", "r+") as file:
        file["episode_1"].attrs["seed"] = np.uint16(7)
    assert _rows(from_minari(dataset))["episode_seed"].tolist() == [4, 4, 7, 7]
    with h5py.File(Path(dataset.storage.data_path) / "main_data.hdf5", "r+") as file:
        file["episode_1"].attrs["seed"] = 7.5
    with pytest.raises(OutOfRangeError, match=r"episode 1: seed: expected an int in \[0, 2\*\*63\), got 7.5"):
        from_minari(dataset)


def test_rows_that_do_not_chain_are_refused() -> None:
    buffer = ReplayBuffer(8, obs_shape=(1,), action_shape=(), seed=0)
    buffer.add(np.array([0], np.float32), 0.0, 1.0, np.array([1], np.float32), False, truncated=False)
    buffer.add(np.array([5], np.float32), 0.0, 1.0, np.array([6], np.float32), True, truncated=False)
    with pytest.raises(StreamError, match=r"rows at positions 0 and 1 .* not consecutive steps of one episode"):
        to_minari(buffer, _new_id())


def test_a_minari_older_than_0_5_4_is_refused_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(minari, "__version__", "0.5.3")  # its writers have no jpeg_encoding: images go lossy
    with pytest.raises(ConfigError, match=r'needs Minari >= 0.5.4 .* got 0.5.3: pip install "rlbuf\[offline\]"'):
        to_minari([GOOD], _new_id())
