"""Actions outside a discrete action space are refused on every way in, and by the load check.

A ``Discrete(2)`` action of ``7`` fits ``int64``: before ``action_range``, it was stored and
sampled as if an env had taken it. The range comes from the action space (``Discrete``,
``MultiDiscrete``, an integer ``Box``, TorchRL's ``Categorical``) or from ``action_range=``,
is recorded in the checkpoint's options and field specs, and every reader of the field checks it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from _snapshot import same, snapshot
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict
from torchrl.data import Categorical

from rlbuf import (
    CheckpointError,
    ConfigError,
    DistillationBuffer,
    OutOfRangeError,
    Recorder,
    ReplayBuffer,
    RolloutBuffer,
)
from rlbuf._bounds import Bounds

OBS = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
DISCRETE = gym.spaces.Discrete(2)


def _replay(num_envs: int = 1, action_space: Any = DISCRETE, **options: Any) -> ReplayBuffer:
    return ReplayBuffer(20, observation_space=OBS, action_space=action_space, num_envs=num_envs, seed=0, **options)


def _step(buffer: ReplayBuffer, action: Any, **kwargs: Any) -> None:
    n = buffer.num_envs
    obs = np.zeros((n, 3), np.float32) if n > 1 else np.zeros(3, np.float32)
    flags = np.zeros(n, np.bool_) if n > 1 else False
    reward = np.zeros(n, np.float32) if n > 1 else 0.0
    buffer.add(obs, action, reward, obs, flags, truncated=flags, **kwargs)


ONE_ENV_BAD_ACTIONS = {
    "int": 7, "negative int": -1, "numpy int": np.int64(2), "0-d array": np.array(7), "1-element array": np.array([7]),
    "cpu tensor": torch.tensor(7), "1-element tensor": torch.tensor([2]), "int32 tensor": torch.tensor(9, dtype=torch.int32),
    "list": [7], "uint8 array": np.array([200], np.uint8),
}


@pytest.mark.parametrize("layout", ["plain", "compact", "n-step", "prioritized", "memmap", "hidden"])
@pytest.mark.parametrize("name", sorted(ONE_ENV_BAD_ACTIONS))
def test_an_action_outside_a_discrete_space_is_refused_and_nothing_changes(tmp_path: Path, layout: str,
                                                                            name: str) -> None:
    options: dict[str, Any] = {
        "plain": {}, "compact": {"compact": True}, "n-step": {"n_step": 3}, "prioritized": {"prioritized": True},
        "memmap": {"storage": "memmap", "scratch_dir": tmp_path}, "hidden": {"hidden_state_shape": (2,)},
    }[layout]
    buffer = _replay(**options)
    extra = {"hidden_state": torch.zeros(2)} if layout == "hidden" else {}
    _step(buffer, 1, **extra)
    before = snapshot(buffer)
    with pytest.raises(OutOfRangeError, match=r"^action: expected values in \[0, 1\], got -?\d+; .*action_range="):
        _step(buffer, ONE_ENV_BAD_ACTIONS[name], **extra)
    assert same(snapshot(buffer), before)
    _step(buffer, 0, **extra)  # the bounds themselves are taken
    _step(buffer, np.int64(1), **extra)


@pytest.mark.parametrize("action", [np.array([0, 1, 2, 0]), torch.tensor([0, 1, 0, -3]), [1, 1, 1, 5]])
def test_a_vector_env_action_outside_the_space_is_named_by_row(action: Any) -> None:
    buffer = _replay(num_envs=4)
    before = snapshot(buffer)
    with pytest.raises(OutOfRangeError, match=r"got (2|-3|5) at row [23];"):
        _step(buffer, action)
    assert same(snapshot(buffer), before)
    with pytest.raises(OutOfRangeError):  # a row the env_mask keeps is checked too
        _step(buffer, action, env_mask=np.array([True, True, True, True]))
    assert same(snapshot(buffer), before)


def test_extend_and_torchrl_writes_refuse_an_action_outside_the_space() -> None:
    buffer = _replay(compact=False)
    td = TensorDict({
        "observation": torch.zeros(2, 3), "action": torch.tensor([0, 5]),
        ("next", "observation"): torch.zeros(2, 3), ("next", "reward"): torch.zeros(2, 1),
        ("next", "terminated"): torch.zeros(2, 1, dtype=torch.bool),
        ("next", "truncated"): torch.zeros(2, 1, dtype=torch.bool), ("next", "done"): torch.zeros(2, 1, dtype=torch.bool),
    }, batch_size=[2])
    before = snapshot(buffer)
    for write, rows in ((buffer.extend, td), (buffer.torchrl.extend, td), (buffer.torchrl.add, td[1])):
        with pytest.raises(OutOfRangeError, match="got 5"):
            write(rows)
        assert same(snapshot(buffer), before)
    td["action"] = torch.tensor([0, 1])
    buffer.extend(td)
    assert sorted(buffer.sample(64).action.unique().tolist()) == [0, 1]


@pytest.mark.parametrize(("space", "good", "bad", "message"), [
    (gym.spaces.Discrete(3, start=-1), [-1, 1], 2, r"\[-1, 1\], got 2"),
    (gym.spaces.MultiDiscrete([3, 4]), [[2, 3], [0, 0]], [2, 4], r"\[0, 3\], got 4 at element 1"),
    (gym.spaces.MultiDiscrete([3, 4], start=[1, 0]), [[1, 0], [3, 3]], [0, 3], r"\[1, 3\], got 0 at element 0"),
    (gym.spaces.MultiDiscrete([[2, 2], [3, 3]]), [[[1, 1], [2, 2]]], [[1, 1], [2, 3]], r"\[0, 2\], got 3 at element 3"),
    (gym.spaces.Box(0, 5, (2,), np.int64), [[0, 5]], [6, 0], r"\[0, 5\], got 6 at element 0"),
    (Categorical(4), [0, 3], 4, r"\[0, 3\], got 4"),
    (gym.spaces.MultiBinary(3), [[0, 1, 1], [1, 0, 0]], [0, 2, 1], r"\[0, 1\], got 2 at element 1"),  # helper 56
])
def test_every_discrete_space_sets_its_range(space: Any, good: list[Any], bad: Any, message: str) -> None:
    buffer = _replay(action_space=space)
    for action in good:
        _step(buffer, np.asarray(action))
    with pytest.raises(OutOfRangeError, match=message):
        _step(buffer, np.asarray(bad))
    assert len(buffer) == len(good)


def test_continuous_spaces_have_no_range() -> None:
    space = gym.spaces.Box(-1, 1, (2,))
    assert Bounds.of_space(space) is None
    assert _replay(action_space=space)._options["action_range"] is None


def _without_range(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` as a version that recorded no range for a MultiBinary space wrote it."""
    spec = [{k: v for k, v in entry.items() if k != "bounds"} for entry in state["spec"]]
    return {**state, "options": {**state["options"], "action_range": None}, "spec": spec}


@pytest.mark.parametrize("dtype", [None, torch.float32, torch.bool, torch.int64])
def test_a_multibinary_state_saved_without_its_range_loads_with_it_and_its_actions_are_held_to_it(
        dtype: torch.dtype | None) -> None:
    binary, options = gym.spaces.MultiBinary(3), {} if dtype is None else {"action_dtype": dtype}
    given = np.int8 if dtype is None else torch.empty(0, dtype=dtype).numpy().dtype
    saved = _replay(action_space=binary, **options)
    _step(saved, np.array([0, 1, 1], given))
    state = _without_range(saved.state_dict())
    buffer = _replay(action_space=binary, **options)
    buffer.load_state_dict(state)
    assert buffer.sample_all().action.tolist() in ([[0, 1, 1]], [[False, True, True]])
    if dtype is torch.bool:
        return  # a bool holds nothing outside [0, 1]
    with pytest.raises(OutOfRangeError):
        _step(buffer, np.array([0, 2, 1], given))
    state["fields"]["action"][0, 1] = 2  # an action the range refuses: so is the state
    with pytest.raises(CheckpointError, match="outside its bounds"):
        _replay(action_space=binary, **options).load_state_dict(state)
    plain = ReplayBuffer(20, observation_space=OBS, action_shape=(3,), action_dtype=torch.int8, seed=0)
    ranged = ReplayBuffer(20, observation_space=OBS, action_shape=(3,), action_dtype=torch.int8, action_range=(0, 2),
                          seed=0)
    with pytest.raises(CheckpointError, match="action_range is None in the state"):  # only [0, 1] is taken so
        ranged.load_state_dict(plain.state_dict())


def test_the_action_range_option_checks_itself() -> None:
    with pytest.raises(ConfigError, match="action_range, action_space: give one of them"):
        ReplayBuffer(10, observation_space=OBS, action_space=DISCRETE, action_range=(0, 1))
    for bad in [(3, 1), (0.0, 1.0), 5, (0, 1, 2), ([0, 0, 0], [1, 1, 1])]:
        with pytest.raises(ConfigError, match="action_range"):
            ReplayBuffer(10, observation_space=OBS, action_shape=(2,), action_dtype="int64", action_range=bad)
    buffer = ReplayBuffer(10, observation_space=OBS, action_shape=(2,), action_dtype="int64",
                          action_range=([0, 1], [4, 9]))
    _step(buffer, np.array([4, 9]))
    with pytest.raises(OutOfRangeError, match=r"\[1, 9\], got 0 at element 1"):
        _step(buffer, np.array([4, 0]))


def test_rollout_and_distillation_buffers_refuse_actions_outside_the_space() -> None:
    rollout = RolloutBuffer(2, 2, observation_space=OBS, action_space=gym.spaces.Discrete(3, start=1))
    step = {"reward": np.zeros(2), "terminated": np.zeros(2, bool), "truncated": np.zeros(2, bool),
            "value": np.zeros(2), "log_prob": np.zeros(2)}
    before = snapshot(rollout)
    with pytest.raises(OutOfRangeError, match=r"\[1, 3\], got 0 at row 0"):
        rollout.add(np.zeros((2, 3), np.float32), np.array([0, 1]), **step)
    assert same(snapshot(rollout), before)
    rollout.add(np.zeros((2, 3), np.float32), np.array([3, 1]), **step)
    distill = DistillationBuffer(10, observation_space=OBS, action_space=gym.spaces.Discrete(6))
    with pytest.raises(OutOfRangeError, match=r"^expert_action: expected values in \[0, 5\], got 6 at row 1"):
        distill.add(np.zeros((2, 3), np.float32), np.array([0, 6]))
    assert len(distill) == 0


def test_the_recorder_refuses_an_action_outside_the_space() -> None:
    envs = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync")
    buffer = ReplayBuffer(100, observation_space=envs.single_observation_space,
                          action_space=envs.single_action_space, num_envs=2)
    recorder = Recorder(envs, buffer)
    obs, _ = envs.reset(seed=0)
    next_obs, reward, terminated, truncated, info = envs.step(np.array([0, 1]))
    with pytest.raises(OutOfRangeError, match="got 2 at row 1"):
        recorder.record(obs, np.array([0, 2]), reward, next_obs, terminated, truncated, info)
    assert len(buffer) == 0
    recorder.record(obs, np.array([0, 1]), reward, next_obs, terminated, truncated, info)
    assert len(buffer) == 2
    envs.close()


# -- checkpoints ---------------------------------------------------------------------------------
def _saved(tmp_path: Path) -> Path:
    buffer = _replay(action_space=gym.spaces.MultiDiscrete([3, 4]))
    for action in ([0, 1], [2, 3], [1, 0]):
        _step(buffer, np.array(action))
    path = tmp_path / "ckpt"
    buffer.save(path)
    return path


def test_a_checkpoint_keeps_the_range(tmp_path: Path) -> None:
    loaded = ReplayBuffer.load(_saved(tmp_path))
    assert loaded._options["action_range"] == [[0, 0], [2, 3]]
    with pytest.raises(OutOfRangeError, match="got 4 at element 1"):
        _step(loaded, np.array([0, 4]))


def _forged(path: Path, edit: Callable[[dict[str, Any], Path], None]) -> None:
    from test_forged_checkpoints import _rewrite

    manifest = json.loads((path / "manifest.json").read_text())
    edit(manifest, path)
    _rewrite(path, manifest)


def test_a_forged_action_outside_the_range_is_refused(tmp_path: Path) -> None:
    path = _saved(tmp_path)

    def edit(manifest: dict[str, Any], path: Path) -> None:
        [rel] = [rel for rel in manifest["files"] if rel.endswith("action.bin")]
        values = np.frombuffer((path / rel).read_bytes(), np.int64).copy()
        values[3] = 4  # row 1, element 1: Discrete(4) allows 0..3
        (path / rel).write_bytes(values.tobytes())

    _forged(path, edit)
    with pytest.raises(CheckpointError, match=r"action.*outside its bounds"):
        ReplayBuffer.load(path)


@pytest.mark.parametrize("forgery", ["range widened, spec kept", "range dropped", "spec bounds dropped"])
def test_a_forged_range_is_refused(tmp_path: Path, forgery: str) -> None:
    path = _saved(tmp_path)

    def edit(manifest: dict[str, Any], path: Path) -> None:
        state = manifest["state"]
        [action] = [spec for spec in state["spec"] if spec["name"] == "action"]
        if forgery == "range widened, spec kept":
            state["options"]["action_range"] = [0, 9]
        elif forgery == "range dropped":
            state["options"]["action_range"] = None
        else:
            del action["bounds"]

    _forged(path, edit)
    with pytest.raises(CheckpointError, match=r"fields .* differ"):
        ReplayBuffer.load(path)


# -- a property against a plain reference --------------------------------------------------------
@pytest.mark.filterwarnings("ignore::rlbuf.BatchedSpaceWarning")
@settings(max_examples=60, deadline=None)
@given(nvec=st.lists(st.integers(1, 5), min_size=1, max_size=3), num_envs=st.integers(1, 3), data=st.data())
def test_an_add_is_refused_exactly_when_an_element_is_outside_its_range(nvec: list[int], num_envs: int,
                                                                        data: st.DataObject) -> None:
    space = gym.spaces.MultiDiscrete(nvec)
    buffer = _replay(num_envs=num_envs, action_space=space)
    for _ in range(3):
        rows = data.draw(st.lists(st.lists(st.integers(-2, 6), min_size=len(nvec), max_size=len(nvec)),
                                  min_size=num_envs, max_size=num_envs))
        action = np.array(rows if num_envs > 1 else rows[0], np.int64)
        as_tensor = data.draw(st.booleans())
        outside = any(not 0 <= v < n for row in rows for v, n in zip(row, nvec, strict=True))
        before, count = snapshot(buffer), len(buffer)
        try:
            _step(buffer, torch.from_numpy(action) if as_tensor else action)
        except OutOfRangeError:
            assert outside
            assert same(snapshot(buffer), before)
        else:
            assert not outside
            assert len(buffer) == count + num_envs


@settings(max_examples=200, deadline=None)
@given(low=st.integers(-5, 5), span=st.integers(0, 5), values=st.lists(st.integers(-12, 12), min_size=1, max_size=20),
       dtype=st.sampled_from([np.int64, np.int8, np.uint8, np.int32]))
def test_a_vector_envs_actions_are_judged_as_the_elementwise_compare_judges_them(low: int, span: int, values: list[int],
                                                                                 dtype: Any) -> None:
    # up to 16 values take a compare of Python ints, more the numpy path: both must refuse exactly what is outside
    bounds, array = Bounds(low, low + span), np.array(values).astype(dtype)
    inside = bool(((array.astype(np.int64) >= low) & (array.astype(np.int64) <= low + span)).all())
    assert (bounds.outside(array, ()) == "") == inside
    assert (bounds.outside(array.reshape(-1, 1), (1,)) == "") == inside
