"""Attacks on the compact layout with dict observations (an image key followed as a stream, a state key
stored as added): hostile adds and extends refused unchanged, forged checkpoints, the Recorder with
zero-padded stacks, mixing, goal-env extends, episode statistics, states of another layout.

The compiled sample path against a plain model is in ``tests/test_attack_compact_sampling.py``, a writer and
a sampler on two threads in ``tests/test_attack_compact_threads.py``; the envs whose frames carry their ids in
``tests/_compact_envs.py``.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from _compact_envs import (
    IMAGE,
    IdEnvs,
    _broken,
    _collected,
    _dict_buffer,
    _with,
    _without,
    check_id_batch,
)
from _snapshot import same, snapshot
from tensordict import TensorDict
from test_forged_checkpoints import _behaviour, _forge, _manifest, _refused_or_alike, _rewrite

from rlbuf import (
    CheckpointError,
    DtypeError,
    MissingFieldError,
    ReplayBuffer,
    RlbufError,
    ShapeError,
    StreamError,
)

HOSTILE: dict[str, tuple[int, Any, type[Exception], str]] = {
    # name: (part, change, error, what the message names)
    "state_shape": (0, _with("state", lambda v: v[..., :2]), ShapeError, r'obs\["state"\]'),
    "next_state_shape": (3, _with("state", lambda v: v[:, :2]), ShapeError, r'next_obs\["state"\]'),
    "state_int": (0, _with("state", lambda v: v.astype(np.int64)), DtypeError, r'obs\["state"\]'),
    "state_too_big": (3, _with("state", lambda v: v.astype(np.float64) * 1e300), DtypeError, r'next_obs\["state"\]'),
    "image_float": (0, _with("image", lambda v: v.astype(np.float32)), DtypeError, r'obs\["image"\]'),
    "image_overflow": (3, _with("image", lambda v: v.astype(np.int64) + 256), DtypeError, r'next_obs\["image"\]'),
    "image_frame_shape": (0, _with("image", lambda v: v[..., :4]), ShapeError, r'obs\["image"\]'),
    "image_stack_shape": (3, _with("image", lambda v: v[:, 1:]), ShapeError, r'next_obs\["image"\]'),
    "no_image": (3, _without("image"), MissingFieldError, r'next_obs\["image"\]'),
    "no_state": (0, _without("state"), MissingFieldError, r'obs\["state"\]'),
    "extra_key": (0, _with("depth", np.zeros((2, 3))), MissingFieldError, r'obs\["depth"\]'),
    "nested_extra": (3, _with("more", {"x": np.zeros((2, 1))}), MissingFieldError, r'next_obs\["more"\]'),
    "state_nested": (0, _with("state", lambda v: {"inner": v}), RlbufError, r'obs\["state"\]'),
    "image_nested": (3, _with("image", lambda v: {"inner": v}), RlbufError, r'next_obs\["image"\]'),
    "obs_tensor": (0, lambda obs: obs["image"], ShapeError, "obs"),
    "obs_none": (3, lambda obs: None, RlbufError, "next_obs"),
    "image_stream_broken": (0, _with("image", lambda v: v ^ 1), StreamError, "obs"),
    "image_not_shifted": (3, _with("image", lambda v: v[:, ::-1].copy()), StreamError, "next_obs|shift|frames"),
    "reward_nan": (2, lambda r: np.array([np.nan, 0.0], np.float32), RlbufError, "reward"),
    "flags_shape": (4, lambda t: np.zeros(3, bool), ShapeError, "terminated"),
}


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_a_refused_add_changes_nothing_and_the_stream_goes_on(compression: str | None,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Each hostile step, with and without env_mask, is refused naming the field; the buffer equals, state and
    behaviour, a twin never given the refused steps (also once a dictionary is trained and the ring wraps)."""
    import rlbuf._frames as frames_module
    monkeypatch.setattr(frames_module, "DICTIONARY_AFTER", 20)
    buffer, twin = _dict_buffer(compression), _dict_buffer(compression)
    envs = IdEnvs(3)
    for round_ in range(3):
        for _ in range(9):
            step = envs.step()
            buffer.add(*step)
            twin.add(*step)
        step = envs.step()
        for name, (part, change, error, field) in HOSTILE.items():
            for mask in (None, np.array([True, False]), np.array([False, True])):
                before = snapshot(buffer)
                with pytest.raises(error, match=field):
                    buffer.add(*_broken(step, part, change), env_mask=mask)
                assert same(snapshot(buffer), before), (name, mask, round_)
        buffer.add(*step)
        twin.add(*step)
    assert same(snapshot(buffer), snapshot(twin))
    assert _behaviour(buffer) == _behaviour(twin)
    check_id_batch(buffer.sample_all(), 3, 2, 0.5)


def test_the_state_key_is_stored_as_added_and_the_image_key_is_checked() -> None:
    """docs/pixels.md: only the image is checked as a stream. A state stack that does not continue is stored as
    given (sampled back exactly); an image stack that does not continue is refused though the state continues."""
    buffer = _dict_buffer()
    envs = IdEnvs(3)
    steps = [envs.step() for _ in range(5)]
    odd = _broken(steps[2], 0, _with("state", lambda v: v + 100))   # the state breaks its stream
    for step in (*steps[:2], odd, *steps[3:]):
        buffer.add(*step)
    data = buffer.sample_by_index(torch.tensor([4, 5]))  # the rows of step 2 (both envs)
    assert np.array_equal(data.obs["state"].numpy(), odd[0]["state"])
    assert np.array_equal(data.next_obs["state"].numpy(), steps[3][3]["state"])  # 2 steps on, as added
    before = snapshot(buffer)
    next_step = envs.step()
    with pytest.raises(StreamError):   # the image breaks, the state continues
        buffer.add(*_broken(next_step, 0, _with("image", lambda v: np.roll(v, 1, axis=1))))
    assert same(snapshot(buffer), before)
    buffer.add(*next_step)


@pytest.mark.parametrize("compression", [None, "lz4"])
def test_a_refused_extend_changes_nothing(compression: str | None) -> None:
    buffer = _dict_buffer(compression)
    envs = IdEnvs(3)
    buffer.extend(_collected(envs, 6, nested=True))
    good = _collected(envs, 5, nested=True)
    forged = {
        "no_state": lambda td: td.exclude(("next", "observation", "state")),
        "state_shape": lambda td: td.set(("observation", "state"), td["observation", "state"][..., :2]),
        "state_int": lambda td: td.set(("observation", "state"), td["observation", "state"].long()),
        "image_float": lambda td: td.set(("next", "observation", "image"), td["next", "observation", "image"].float()),
        "image_broken": lambda td: td.set(("observation", "image"), td["observation", "image"] ^ 1),
        "image_later_broken": lambda td: td.set(("next", "observation", "image"),
                                                td["next", "observation", "image"].roll(1, dims=1)),
        "reward_nan": lambda td: td.set(("next", "reward"), td["next", "reward"] * float("nan")),
        "one_env": lambda td: td[:1],
    }
    for name, change in forged.items():
        before = snapshot(buffer)
        with pytest.raises(RlbufError):
            buffer.extend(change(good.clone()))
        assert same(snapshot(buffer), before), name
    buffer.extend(good)
    check_id_batch(buffer.sample_all(), 3, 2, 0.5)
    top = _dict_buffer(compression)   # the keys at the top level, as TorchRL's GymEnv puts a Dict space's
    again = IdEnvs(3)
    top.extend(_collected(again, 6, nested=False))
    top.extend(_collected(again, 5, nested=False))
    assert _behaviour(top) == _behaviour(buffer)


def _truncate_frames(path: Path) -> None:
    """The image's frame file one row short (its manifest entry and checksum to match)."""
    manifest = _manifest(path)
    [rel] = [rel for rel in manifest["files"] if "fields.obs_image" in rel]
    entry = manifest["files"][rel]
    data = (path / rel).read_bytes()
    row = len(data) // entry["shape"][0]
    (path / rel).write_bytes(data[:-row])
    entry["shape"][0] -= 1
    entry["bytes"] = len(data) - row
    _rewrite(path, manifest)


def _swap_state_and_image_files(path: Path) -> None:
    manifest = _manifest(path)
    fields = manifest["state"]["fields"]
    fields['obs["image"]'], fields['obs["state"]'] = fields['obs["state"]'], fields['obs["image"]']
    _rewrite(path, manifest)


def _rename_field(path: Path) -> None:
    manifest = _manifest(path)
    fields = manifest["state"]["fields"]
    fields['obs["camera"]'] = fields.pop('obs["image"]')
    _rewrite(path, manifest)


MUST_REFUSE: dict[str, Any] = {
    "compact_key state": {"state": {("options", "compact_key"): "state"}},
    "compact_key unknown": {"state": {("options", "compact_key"): "camera"}},
    "compact_key a number": {"state": {("options", "compact_key"): 3}},
    "compact_key a nested path": {"state": {("options", "compact_key"): ["image", "x"]}},
    "state shape": {"state": {("options", "obs_shape", "state"): [3, 4]}},
    "image frame shape": {"state": {("options", "obs_shape", "image"): [3, 5, 6]}},
    "image stack": {"state": {("options", "obs_shape", "image"): [2, *IMAGE], ("options", "frame_stack"): 2}},
    "state dtype": {"state": {("options", "obs_dtype", "state"): "dtype:float64"}},
    "image dtype": {"state": {("options", "obs_dtype", "image"): "dtype:int16"}},
    "no state key": {"state": {("options", "obs_shape"): {"image": [3, *IMAGE]}}},
    "a third key": {"state": {("options", "obs_shape", "depth"): [3, 2]}},
    "frames truncated": _truncate_frames,
    "state and image files swapped": _swap_state_and_image_files,
    "image field renamed": _rename_field,
}
MAY_LOAD_ALIKE: dict[str, Any] = {
    "compact_key as a list": {"state": {("options", "compact_key"): ["image"]}},
    "compact_key inferred": {"state": {("options", "compact_key"): None}},
    "keys reordered": {"state": {("options", "obs_shape"): {"state": [3, 3], "image": [3, *IMAGE]}}},
}


@pytest.mark.parametrize("storage", ["memory", "memmap"])
@pytest.mark.parametrize("compression", [None, "zstd"])
def test_forged_dict_checkpoints_on_disk(tmp_path: Path, storage: str, compression: str | None) -> None:
    options = {"storage": "memmap", "scratch_dir": tmp_path / "scratch"} if storage == "memmap" else {}
    buffer = _dict_buffer(compression, prioritized=True, **options)
    envs = IdEnvs(3)
    for _ in range(16):   # wraps the 24 rows
        buffer.add(*envs.step())
    buffer.update_priority(torch.arange(8), torch.arange(1, 9, dtype=torch.float64))
    genuine = tmp_path / "genuine"
    buffer.save(genuine)
    expected = _behaviour(ReplayBuffer.load(genuine))
    assert expected == _behaviour(buffer)
    for number, (name, forgery) in enumerate({**MUST_REFUSE, **MAY_LOAD_ALIKE}.items()):
        path = tmp_path / f"forged{number}"
        shutil.copytree(genuine, path)
        if callable(forgery):
            forgery(path)
        else:
            _forge(path, **forgery)
        if name in MUST_REFUSE:
            with pytest.raises(CheckpointError):
                ReplayBuffer.load(path)
        else:
            _refused_or_alike(path, ReplayBuffer, expected)
    fresh = _dict_buffer(compression, prioritized=True)  # load_state_dict of a forged state: refused, unchanged
    before = snapshot(fresh)
    state = buffer.state_dict()
    for change in ({"compact_key": "state"}, {"compact_key": ["image", "x"]}, {"frame_stack": 2}):
        forged = {**state, "options": {**state["options"], **change}}
        with pytest.raises(CheckpointError):
            fresh.load_state_dict(forged)
        assert same(snapshot(fresh), before), change


@pytest.mark.parametrize("mode", ["NEXT_STEP", "SAME_STEP", "DISABLED"])
def test_the_recorder_with_zero_padded_dict_stacks(mode: str) -> None:
    """gymnasium's FrameStackObservation(padding_type="zero") of a Dict space, every autoreset mode, zstd:
    every sampled transition is whole (its stack zero-padded before the episode's start)."""
    import gymnasium as gym
    from gymnasium.vector import AutoresetMode
    from test_gym import NUM_ENVS, DictCountingEnv, time_limit

    from rlbuf.gym import Recorder

    stack, n_step, gamma = 3, 2, 0.5
    autoreset = getattr(AutoresetMode, mode)
    makers = [lambda i=i: gym.wrappers.FrameStackObservation(
        gym.wrappers.TimeLimit(DictCountingEnv(i), max_episode_steps=time_limit(i)), stack, padding_type="zero")
        for i in range(NUM_ENVS)]
    envs = gym.vector.SyncVectorEnv(makers, autoreset_mode=autoreset)
    buffer = ReplayBuffer(200, num_envs=NUM_ENVS, observation_space=envs.single_observation_space,
                          action_space=envs.single_action_space, frame_stack=stack, n_step=n_step, gamma=gamma,
                          padding_type="zero", compression="zstd", seed=0)
    recorder = Recorder(envs, buffer)
    obs, _ = envs.reset(seed=0)
    rng = np.random.default_rng(0)
    for _ in range(30):
        action = rng.integers(0, 2, NUM_ENVS)
        next_obs, reward, terminated, truncated, info = envs.step(action)
        recorder.record(obs, action, reward, next_obs, terminated, truncated, info)
        obs = next_obs
        if autoreset == AutoresetMode.DISABLED and (terminated | truncated).any():
            obs, _ = envs.reset(options={"reset_mask": terminated | truncated})
            recorder.reset(terminated | truncated)
    data = buffer.sample_all()
    assert len(data) > 20
    for row in range(len(data)):
        state, after = data.obs["state"][row].numpy(), data.next_obs["state"][row].numpy()
        env, episode, step = (int(v) for v in state[-1])
        m = int(after[-1, 2]) - step
        assert 1 <= m <= n_step and (m == n_step or bool(data.done[row]))
        assert tuple(after[-1, :2]) == (env, episode)
        for stacked, camera, newest in ((state, data.obs["camera"][row], step),
                                        (after, data.next_obs["camera"][row], step + m)):
            for j in range(stack):
                at = newest - (stack - 1 - j)
                want = [env, episode, at] if at >= 0 else [0, 0, 0]
                assert stacked[j].tolist() == want, (row, j, stacked.tolist())
                assert (camera[j].numpy() == (at % 256 if at >= 0 else 0)).all(), (row, j)
        assert data.reward[row].item() == sum(gamma**j * (step + j + 1) for j in range(m))
    envs.close()


def test_mixing_a_compact_dict_buffer_with_an_offline_buffer_keeps_each_row_whole() -> None:
    from rlbuf.mixing import MixedReplay

    k, n, gamma = 3, 1, 0.5
    online = _dict_buffer("zstd", n_step=n)
    offline = ReplayBuffer(60, obs_shape={"image": (k, *IMAGE), "state": (k, 3)}, obs_dtype={"image": torch.uint8},
                           action_shape=(), num_envs=2, gamma=gamma, compact=False, seed=1)
    envs = IdEnvs(k)
    for _ in range(25):
        step = envs.step()
        online.add(*step)
        offline.add(*step)
    mixed = MixedReplay(offline, online, offline_fraction=0.5)
    for _ in range(3):
        batch = mixed.sample(10)
        assert batch.obs["image"].shape == (10, k, *IMAGE) and batch.next_obs["state"].shape == (10, k, 3)
        check_id_batch(batch, k, n, gamma)


@pytest.mark.parametrize("compact", [True, False])
def test_extend_of_a_goal_env_batch_in_gymenv_layout(compact: bool) -> None:
    k = 2 if compact else 1
    image, goal = ((k, 4, 4), (k, 2)) if compact else ((4, 4), (2,))
    options: dict[str, Any] = {"frame_stack": k, "compact": True} if compact else {}
    shapes = {"observation": image, "achieved_goal": goal, "desired_goal": goal}
    buffer = ReplayBuffer(20, obs_shape=shapes, obs_dtype={"observation": torch.uint8}, action_shape=(), seed=0,
                          **options)
    steps = 4
    obs = {key: torch.zeros(1, steps, *shape, dtype=torch.uint8 if key == "observation" else torch.float32)
           for key, shape in shapes.items()}
    td = TensorDict({**obs, "action": torch.zeros(1, steps),
                     "next": {**{key: value.clone() for key, value in obs.items()},
                              "reward": torch.ones(1, steps, 1), "terminated": torch.zeros(1, steps, 1, dtype=torch.bool),
                              "truncated": torch.zeros(1, steps, 1, dtype=torch.bool)}}, batch_size=[1, steps])
    before = snapshot(buffer)
    try:
        buffer.extend(td)
    except RlbufError:   # refused by name is acceptable too
        assert same(snapshot(buffer), before)
        return
    assert len(buffer) == steps


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_refused_steps_leave_the_episode_statistics_as_they_were(compression: str | None) -> None:
    from rlbuf import EpisodeStats

    buffer = _dict_buffer(compression, stats=EpisodeStats(2))
    envs = IdEnvs(3)
    buffer.extend(_collected(envs, 6, nested=True))
    for _ in range(3):
        buffer.add(*envs.step())
    good = _collected(envs, 5, nested=False)
    bad = good.clone()
    bad["image"] = bad["image"] ^ 1
    before = snapshot(buffer)
    stats = buffer.stats
    assert stats is not None
    stats_before = snapshot(stats)
    with pytest.raises(StreamError):
        buffer.extend(bad)
    step = envs.step()
    with pytest.raises(StreamError):
        buffer.add(*_broken(step, 0, _with("image", lambda v: v ^ 1)), env_mask=np.array([True, False]))
    assert same(snapshot(buffer), before) and same(snapshot(stats), stats_before)
    buffer.extend(good)
    buffer.add(*step)
    assert stats.state_dict()["episodes_finished"] > 0
    check_id_batch(buffer.sample_all(), 3, 2, 0.5)


def test_a_state_of_another_compression_or_layout_is_refused_unchanged() -> None:
    buffers = {name: _dict_buffer(name) for name in (None, "zstd", "lz4")}
    buffers["whole"] = ReplayBuffer(24, obs_shape={"image": (3, *IMAGE), "state": (3, 3)},
                                    obs_dtype={"image": torch.uint8}, action_shape=(), num_envs=2, gamma=0.5,
                                    compact=False, seed=0)
    envs = IdEnvs(3)
    for _ in range(10):
        step = envs.step()
        for buffer in buffers.values():
            buffer.add(*step)
    for source, saved in buffers.items():
        for target_name, target in buffers.items():
            if source == target_name:
                continue
            before = snapshot(target)
            with pytest.raises(CheckpointError):
                target.load_state_dict(saved.state_dict())
            assert same(snapshot(target), before), (source, target_name)


@pytest.mark.parametrize("compact", [True, False])
def test_an_empty_extend_changes_nothing(compact: bool) -> None:
    buffer = _dict_buffer() if compact else ReplayBuffer(
        24, obs_shape={"image": (3, *IMAGE), "state": (3, 3)}, obs_dtype={"image": torch.uint8}, action_shape=(),
        num_envs=2, gamma=0.5, compact=False, seed=0)
    envs = IdEnvs(3)
    for _ in range(6):
        buffer.add(*envs.step())
    empty = _collected(IdEnvs(3), 1, nested=True)[:, :0]
    before = snapshot(buffer)
    buffer.extend(empty)
    assert same(snapshot(buffer), before)
    if not compact:
        buffer.sample_sequences(2, 2)


def test_extend_of_one_step_per_env_keeps_sequences_available() -> None:
    buffer = ReplayBuffer(24, obs_shape={"image": (3, *IMAGE), "state": (3, 3)}, obs_dtype={"image": torch.uint8},
                          action_shape=(), num_envs=2, gamma=0.5, compact=False, seed=0)
    twin = ReplayBuffer(24, obs_shape={"image": (3, *IMAGE), "state": (3, 3)}, obs_dtype={"image": torch.uint8},
                        action_shape=(), num_envs=2, gamma=0.5, compact=False, seed=0)
    envs, again = IdEnvs(3), IdEnvs(3)
    for _ in range(4):
        buffer.extend(_collected(envs, 1, nested=True))
        twin.add(*again.step())
    assert _behaviour(buffer) == _behaviour(twin)
    assert torch.equal(buffer.sample_sequences(2, 2).obs["state"], twin.sample_sequences(2, 2).obs["state"])
