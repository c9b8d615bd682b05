"""rlbuf.offline: Minari → rlbuf → Minari → rlbuf is the identity; reset options, infos and the rows
each episode gives; datasets found by id, path and filter.

Datasets are made with Minari's own ``create_dataset_from_buffers`` (both backends) in a temporary
``MINARI_DATASETS_PATH`` (``tests/_minari.py``); nothing is downloaded.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

minari = pytest.importorskip("minari")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from _minari import (  # noqa: E402
    ACTIONS,
    BOX,
    SPACES,
    _assert_same_episodes,
    _assert_same_rows,
    _assert_same_tree,
    _episode,
    _minari_dataset,
    _new_id,
    _rows,
)
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from minari.data_collector import EpisodeBuffer  # noqa: E402

from rlbuf.errors import (  # noqa: E402
    ConfigError,
    DtypeError,
    MissingFieldError,
    ShapeError,
)
from rlbuf.offline import from_minari, to_minari  # noqa: E402

pytestmark = pytest.mark.usefixtures("minari_root")  # every test in a temporary Minari root

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
    step = {name: rows[name][0] for name in ("obs", "action", "reward", "next_obs")}
    with pytest.raises(MissingFieldError, match=r"^episode_id: missing; .*expected shape \(\) int64 per row\): pass "
                                                r"episode_id= to add \(from_minari's exact import .* exact=False"):
        buffer.add(**step, terminated=False, truncated=False)  # adding online to the exact import
    assert len(buffer) == 5


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
