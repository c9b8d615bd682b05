"""to_minari: every episode checked before anything is written, images lossless, a buffer's
complete episodes exported per env, and what Minari could not read back refused by name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

minari = pytest.importorskip("minari")

import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from _minari import (  # noqa: E402
    ACTIONS,
    BOX,
    GOOD,
    SPACES,
    _assert_same_episodes,
    _assert_same_tree,
    _episode,
    _minari_dataset,
    _new_id,
    _rows,
    _with,
)

from rlbuf import ReplayBuffer  # noqa: E402
from rlbuf.errors import (  # noqa: E402
    ConfigError,
    DtypeError,
    OutOfRangeError,
    ShapeError,
    StreamError,
)
from rlbuf.offline import from_minari, to_minari  # noqa: E402

pytestmark = pytest.mark.usefixtures("minari_root")  # every test in a temporary Minari root


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
