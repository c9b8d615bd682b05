"""Dict observations in the compact layout (one image key frame by frame, the other keys whole with each row):
what ``sample`` gives equals a plain reference of whole transitions, through env_mask, wraps, priorities,
compression, the Recorder, extend and checkpoints; refusals leave the buffer as it was."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from _snapshot import same, snapshot
from gymnasium.vector import AutoresetMode
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensordict import TensorDict
from test_gym import MODES, NUM_ENVS, DictCountingEnv, time_limit
from test_gym_compact import expected_transitions

import rlbuf._frames as frames_module
from rlbuf import (
    CheckpointError,
    ConfigError,
    EmptyBufferError,
    Hindsight,
    MissingFieldError,
    ReplayBuffer,
    ShapeError,
    StreamError,
)
from rlbuf._inspect import inspect_checkpoint
from rlbuf.gym import Recorder

FRAME = (6, 5)
STATE = (3,)


@pytest.fixture(autouse=True)
def small_dictionary_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dictionaries trained after 40 frames, so that the tests' short streams have one."""
    monkeypatch.setattr(frames_module, "DICTIONARY_AFTER", 40)


class DictEnvs:
    """Toy envs of dict observations ``{"image": uint8 frames, "state": float32}``, every key stacked as
    gymnasium's ``FrameStackObservation`` stacks a ``Dict`` space; with ``next_step``, gymnasium's
    ``NEXT_STEP`` autoreset: after an episode ends, the env's next step is a reset step (left out)."""

    def __init__(self, num_envs: int, frame_stack: int, padding_type: str, end_chance: float, next_step: bool,
                 seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.frame_stack, self.padding_type, self.end_chance = frame_stack, padding_type, end_chance
        self.next_step = next_step
        self.stacks = [self._reset() for _ in range(num_envs)]
        self.resetting = [False] * num_envs

    def _one(self) -> dict[str, np.ndarray]:
        kind = int(self.rng.integers(0, 3))   # a flat colour, a pattern with a dot, noise
        if kind == 0:
            image = np.full(FRAME, self.rng.integers(0, 4), np.uint8)
        elif kind == 1:
            image = np.tile(np.arange(FRAME[1], dtype=np.uint8), (FRAME[0], 1))
            image[self.rng.integers(0, FRAME[0]), self.rng.integers(0, FRAME[1])] = 255
        else:
            image = self.rng.integers(0, 256, FRAME, dtype=np.uint8)
        return {"image": image, "state": self.rng.standard_normal(STATE).astype(np.float32)}

    def _reset(self) -> list[dict[str, np.ndarray]]:
        first = self._one()
        pad = first if self.padding_type == "reset" else {key: np.zeros_like(v) for key, v in first.items()}
        return [pad] * (self.frame_stack - 1) + [first]

    def _obs(self, stack: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        if self.frame_stack == 1:
            return dict(stack[0])
        return {key: np.stack([frame[key] for frame in stack]) for key in ("image", "state")}

    def step(self) -> tuple[list[dict[str, Any]], np.ndarray]:
        """One step of every env (a row each) and the mask of the real ones."""
        rows, keep = [], []
        for env, stack in enumerate(self.stacks):
            obs, junk = self._obs(stack), self.resetting[env]
            if junk:                              # reward 0, no flags, next_obs a reset
                self.stacks[env], self.resetting[env] = self._reset(), False
                row = {"obs": obs, "next_obs": self._obs(self.stacks[env]), "ended": False, "terminated": False}
            else:
                self.stacks[env] = stack = [*stack[1:], self._one()]
                ended = bool(self.rng.random() < self.end_chance)
                row = {"obs": obs, "next_obs": self._obs(stack), "ended": ended,
                       "terminated": ended and bool(self.rng.random() < 0.5)}
                if ended and self.next_step:
                    self.resetting[env] = True
                elif ended:
                    self.stacks[env] = self._reset()
            rows.append({**row, "env": env, "action": int(self.rng.integers(0, 4)),
                         "reward": float(self.rng.integers(-8, 8)) / 4})
            keep.append(not junk)
        return rows, np.array(keep)


def _batched(rows: list[dict[str, Any]]) -> tuple[Any, ...]:
    obs = {key: np.stack([row["obs"][key] for row in rows]) for key in ("image", "state")}
    next_obs = {key: np.stack([row["next_obs"][key] for row in rows]) for key in ("image", "state")}
    terminated = np.array([row["terminated"] for row in rows])
    truncated = np.array([row["ended"] and not row["terminated"] for row in rows])
    return (obs, np.array([row["action"] for row in rows]), np.array([row["reward"] for row in rows]), next_obs,
            terminated, truncated)


def _shapes(frame_stack: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return ((frame_stack, *FRAME), (frame_stack, *STATE)) if frame_stack > 1 else (FRAME, STATE)


def _dict_buffer(capacity: int, num_envs: int, frame_stack: int, **options: Any) -> ReplayBuffer:
    image, state = _shapes(frame_stack)
    return ReplayBuffer(capacity, obs_shape={"image": image, "state": state}, obs_dtype={"image": torch.uint8},
                        action_shape=(), action_dtype=torch.int64, num_envs=num_envs, frame_stack=frame_stack,
                        compact=True, seed=0, **options)


def _draws(buffer: ReplayBuffer, prioritized: bool) -> list[Any]:
    """Every complete transition, then three seeded draws (priorities set from each draw's positions)."""
    try:
        seen = [buffer.sample_all()]
    except EmptyBufferError:
        return ["empty"]
    for _ in range(3):
        seen.append(buffer.sample(6))
        if prioritized:
            buffer.update_priority(seen[-1].index, (seen[-1].index % 5 + 1).to(torch.float64))
    return seen


def _leaves(batch: Any) -> dict[Any, torch.Tensor]:
    return dict(batch.to_tensordict().items(include_nested=True, leaves_only=True))


def _same_batches(a: list[Any], b: list[Any]) -> bool:
    if a == ["empty"] or b == ["empty"]:
        return a == b
    for x, y in zip(a, b, strict=True):
        left, right = _leaves(x), _leaves(y)
        if left.keys() != right.keys():
            return False
        for key, value in left.items():
            if value.dtype != right[key].dtype or not torch.equal(value, right[key]):
                return False
    return True


def _check_against_references(draws: list[Any], twin: list[Any], plain: ReplayBuffer | None,
                              expected: dict[int, dict[str, Any]], written: int, size: int) -> None:
    """Each batch row against the naive whole transition of its serial; the image against a single-tensor
    compact buffer of the image alone (same draws); one-step batches against a plain buffer's rows."""
    if draws == ["empty"]:
        assert twin == ["empty"] and not expected
        return
    for batch, image_batch in zip(draws, twin, strict=True):
        assert torch.equal(batch.index, image_batch.index) and torch.equal(batch.weight, image_batch.weight)
        assert torch.equal(batch.obs["image"], image_batch.obs)
        assert torch.equal(batch.next_obs["image"], image_batch.next_obs)
        for name in ("action", "reward", "terminated", "truncated", "done", "discount"):
            assert torch.equal(getattr(batch, name), getattr(image_batch, name)), name
        serials = [written - 1 - ((written - 1 - p) % size) for p in batch.index.tolist()]
        for row, serial in enumerate(serials):
            want = expected[serial]
            for key in ("image", "state"):
                assert np.array_equal(batch.obs[key][row].numpy(), want["obs"][key])
                assert np.array_equal(batch.next_obs[key][row].numpy(), want["next_obs"][key])
            for name in ("action", "terminated", "truncated", "reward", "discount"):
                assert getattr(batch, name)[row].item() == want[name], name
        if plain is not None:  # one-step transitions: a buffer of whole transitions holds the same rows
            truth = plain.sample_by_index(batch.index)
            for name in ("obs", "next_obs", "action", "reward", "terminated", "truncated", "done", "discount"):
                assert (getattr(batch, name) == getattr(truth, name)).all(), name
    assert sorted({written - 1 - ((written - 1 - p) % size) for p in draws[0].index.tolist()}) == sorted(expected)


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, Any]:
    return {"num_envs": draw(st.integers(1, 3)), "frame_stack": draw(st.sampled_from([1, 2, 4])),
            "n_step": draw(st.sampled_from([1, 2, 3])), "capacity": draw(st.integers(3, 24)),
            "padding_type": draw(st.sampled_from(["reset", "zero"])), "end_chance": draw(st.sampled_from([0.15, 0.5])),
            "gamma": draw(st.sampled_from([0.5, 1.0])), "rounds": draw(st.integers(1, 40)),
            "compression": draw(st.sampled_from([None, "zstd", "lz4"])), "prioritized": draw(st.booleans()),
            "next_step": draw(st.booleans()), "checkpoint_at": draw(st.integers(0, 40)),
            "seed": draw(st.integers(0, 2**16))}


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(scenario=scenarios())
def test_a_compact_dict_buffer_gives_exactly_what_a_buffer_of_whole_transitions_gives(
        scenario: dict[str, Any]) -> None:
    n, k, n_step = scenario["num_envs"], scenario["frame_stack"], scenario["n_step"]
    capacity, prioritized = max(scenario["capacity"], n), scenario["prioritized"]
    layout = {"padding_type": scenario["padding_type"], "n_step": n_step, "gamma": scenario["gamma"],
              "prioritized": prioritized}
    options = {**layout, "compression": scenario["compression"]}
    buffer = _dict_buffer(capacity, n, k, **options)
    twin = ReplayBuffer(capacity, obs_shape=_shapes(k)[0], obs_dtype=torch.uint8, action_shape=(),
                        action_dtype=torch.int64, num_envs=n, frame_stack=k, compact=True, seed=0, **layout)
    plain = None if n_step > 1 else ReplayBuffer(
        capacity, obs_shape={"image": _shapes(k)[0], "state": _shapes(k)[1]}, obs_dtype={"image": torch.uint8},
        action_shape=(), action_dtype=torch.int64, num_envs=n, gamma=scenario["gamma"], compact=False)
    envs = DictEnvs(n, k, scenario["padding_type"], scenario["end_chance"], scenario["next_step"], scenario["seed"])
    kept: list[dict[str, Any]] = []
    loaded: ReplayBuffer | None = None
    for round_ in range(scenario["rounds"]):
        if round_ == scenario["checkpoint_at"]:  # mid-stream: a copy from the checkpoint continues alike
            loaded = _dict_buffer(capacity, n, k, **options)
            loaded.load_state_dict(buffer.state_dict())
            assert loaded.check_valid() == (True, "")
        rows, keep = envs.step()
        obs, action, reward, next_obs, terminated, truncated = _batched(rows)
        twin.add(obs["image"], action, reward, next_obs["image"], terminated, truncated, env_mask=keep)
        for target in (buffer, plain, loaded):
            if target is not None:
                target.add(obs, action, reward, next_obs, terminated, truncated, env_mask=keep)
        kept += [row for row, kept_row in zip(rows, keep, strict=True) if kept_row]
    assert len(buffer) == len(twin) == min(len(kept), capacity)
    expected = expected_transitions(kept, capacity, k, n_step, scenario["gamma"])
    draws = _draws(buffer, prioritized)
    _check_against_references(draws, _draws(twin, prioritized), plain, expected, len(kept), max(len(buffer), 1))
    if loaded is not None:
        assert _same_batches(_draws(loaded, prioritized), draws)
        assert repr(loaded) == repr(buffer)


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_memmap_storage_and_a_saved_checkpoint_resume_exactly(tmp_path: Path, compression: str | None) -> None:
    options = {"n_step": 3, "gamma": 0.5, "prioritized": True, "compression": compression}
    buffer = _dict_buffer(30, 2, 4, storage="memmap", scratch_dir=tmp_path / "scratch", **options)
    envs = DictEnvs(2, 4, "reset", 0.2, True, 7)
    for _ in range(25):
        rows, keep = envs.step()
        buffer.add(*_batched(rows), env_mask=keep)
    buffer.save(tmp_path / "ckpt")
    loaded = ReplayBuffer.load(tmp_path / "ckpt")
    assert loaded.compact and loaded.fields == buffer.fields and repr(loaded) == repr(buffer)
    for _ in range(20):  # both continue alike, through the wrap
        rows, keep = envs.step()
        for target in (buffer, loaded):
            target.add(*_batched(rows), env_mask=keep)
    assert _same_batches(_draws(loaded, True), _draws(buffer, True))
    report = inspect_checkpoint(tmp_path / "ckpt")
    assert report["ok"] and report["size"] == 30
    names = [field["name"] for field in report["fields"]]
    assert names[:2] == ['obs["image"]', 'obs["state"]'] and 'next_obs["state"]' in names
    assert 'next_obs["image"]' not in names


def test_forged_checkpoints_are_refused() -> None:
    buffer = _dict_buffer(20, 2, 2, n_step=2, compression="lz4")
    envs = DictEnvs(2, 2, "reset", 0.2, False, 3)
    for _ in range(15):
        rows, keep = envs.step()
        buffer.add(*_batched(rows), env_mask=keep)
    fresh = _dict_buffer(20, 2, 2, n_step=2, compression="lz4")
    before = snapshot(fresh)

    def forged(change: Any) -> dict[str, Any]:
        state = copy.deepcopy(buffer.state_dict())  # its options are the buffer's own dict
        change(state)
        return state

    def other_key(state: dict[str, Any]) -> None:
        state["options"]["compact_key"] = "state"

    def state_shape(state: dict[str, Any]) -> None:
        state["fields"]['obs["state"]'] = state["fields"]['obs["state"]'][:, :1]

    def frame_bytes(state: dict[str, Any]) -> None:
        state["extra"]["frames"]["bytes"][3] ^= 0xFF

    def no_streams(state: dict[str, Any]) -> None:
        del state["extra"]["streams"]

    for change in (other_key, state_shape, frame_bytes, no_streams):
        with pytest.raises(CheckpointError):
            fresh.load_state_dict(forged(change))
        assert same(snapshot(fresh), before), change.__name__
    fresh.load_state_dict(buffer.state_dict())
    assert fresh.check_valid() == (True, "")


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
@pytest.mark.parametrize("compression", [None, "lz4"])
def test_the_recorder_stores_exactly_the_real_transitions(mode: AutoresetMode, compression: str | None) -> None:
    """gymnasium's FrameStackObservation of a Dict space: every key stacked; n-step returns never cross an end."""
    stack, n_step, gamma = 4, 3, 0.5
    makers = [lambda i=i: gym.wrappers.FrameStackObservation(
        gym.wrappers.TimeLimit(DictCountingEnv(i), max_episode_steps=time_limit(i)), stack) for i in range(NUM_ENVS)]
    envs = gym.vector.SyncVectorEnv(makers, autoreset_mode=mode)
    buffer = ReplayBuffer(1000, num_envs=NUM_ENVS, observation_space=envs.single_observation_space,
                          action_space=envs.single_action_space, frame_stack=stack, n_step=n_step, gamma=gamma,
                          compression=compression)
    assert buffer.compact and buffer.fields[0].name == 'obs["camera"]'
    recorder = Recorder(envs, buffer)
    obs, _ = envs.reset(seed=0)
    rng = np.random.default_rng(0)
    for _ in range(40):
        action = rng.integers(0, 2, NUM_ENVS)
        next_obs, reward, terminated, truncated, info = envs.step(action)
        recorder.record(obs, action, reward, next_obs, terminated, truncated, info)
        obs = next_obs
        if mode == AutoresetMode.DISABLED and (terminated | truncated).any():
            obs, _ = envs.reset(options={"reset_mask": terminated | truncated})
            recorder.reset(terminated | truncated)
    data = buffer.sample_all()
    state, after = data.obs["state"].numpy().astype(int), data.next_obs["state"].numpy().astype(int)
    newest, next_newest = state[:, -1], after[:, -1]
    assert (next_newest[:, :2] == newest[:, :2]).all()   # same env, same episode: never a reset observation
    steps = next_newest[:, 2] - newest[:, 2]
    assert ((steps >= 1) & (steps <= n_step)).all() and data.done[steps < n_step].all()
    for key, values in (("obs", state), ("next_obs", after)):
        camera = getattr(data, key)["camera"].numpy()
        assert (camera[:, :, 0, 0] == values[:, :, 2] % 256).all()   # each frame of the stack its step's
    for row in range(len(data)):
        start, m = newest[row, 2], steps[row]
        assert [s[2] for s in state[row]] == [max(0, start - j) for j in range(stack - 1, -1, -1)]
        assert data.reward[row].item() == sum(gamma**j * (start + j + 1) for j in range(m))
    envs.close()


def test_extend_reads_the_keys_where_torchrl_puts_them() -> None:
    """A collector's ``[num_envs, T]`` batch, a Dict space's keys at the top level (TorchRL's GymEnv) or nested."""
    envs = DictEnvs(2, 2, "reset", 0.0, False, 1)
    steps = [_batched(envs.step()[0]) for _ in range(6)]

    def stacked(part: int, key: str | None = None) -> torch.Tensor:
        values = [step[part] if key is None else step[part][key] for step in steps]
        return torch.from_numpy(np.stack(values, 1))

    buffers = [_dict_buffer(40, 2, 2) for _ in range(3)]
    top = {"image": stacked(0, "image"), "state": stacked(0, "state"), "action": stacked(1),
           ("next", "image"): stacked(3, "image"), ("next", "state"): stacked(3, "state"),
           ("next", "reward"): stacked(2), ("next", "terminated"): stacked(4), ("next", "truncated"): stacked(5)}
    moved = {"image": ("observation", "image"), "state": ("observation", "state"),
             ("next", "image"): ("next", "observation", "image"), ("next", "state"): ("next", "observation", "state")}
    nested = {moved.get(key, key): value for key, value in top.items()}
    buffers[0].extend(TensorDict(top, batch_size=[2, 6]))
    buffers[1].extend(TensorDict(nested, batch_size=[2, 6]))
    for step in steps:
        buffers[2].add(*step)
    assert len(buffers[0]) == 12

    # Rows go in env-major order by extend and step by step by add: compare the transitions, not positions.
    def by_state(buffer: ReplayBuffer) -> list[Any]:
        data = buffer.sample_all()
        order = sorted(range(len(data)), key=lambda row: data.obs["state"][row].flatten().tolist())
        return [[data.obs[key][row] for key in ("image", "state")] + [data.next_obs[key][row] for key in
                                                                     ("image", "state")] for row in order]
    reference = by_state(buffers[2])
    for buffer in buffers[:2]:
        assert all(torch.equal(x, y) for a, b in zip(by_state(buffer), reference, strict=True)
                   for x, y in zip(a, b, strict=True))


def test_nested_keys_and_the_inferred_key() -> None:
    buffer = ReplayBuffer(10, obs_shape={"sensors": {"camera": (2, 4, 4), "imu": (6,)}, "goal": (2,)},
                          obs_dtype={"sensors": {"camera": torch.uint8}}, action_shape=(), frame_stack=2)
    assert [spec.name for spec in buffer.fields][:3] == ['obs["sensors"]["camera"]', 'obs["sensors"]["imu"]',
                                                         'obs["goal"]']
    assert buffer.state_dict(data=False)["options"]["compact_key"] == ["sensors", "camera"]
    given_key = ReplayBuffer(10, obs_shape={"sensors": {"camera": (2, 4, 4), "imu": (6,)}, "goal": (2,)},
                             obs_dtype={"sensors": {"camera": torch.uint8}}, action_shape=(), frame_stack=2,
                             compact_key=("sensors", "camera"))
    assert given_key.fields == buffer.fields
    frame = np.zeros((2, 4, 4), np.uint8)
    obs = {"sensors": {"camera": frame, "imu": np.zeros(6, np.float32)}, "goal": np.ones(2, np.float32)}
    nxt = {"sensors": {"camera": frame + 0, "imu": np.ones(6, np.float32)}, "goal": np.ones(2, np.float32)}
    buffer.add(obs, 0.0, 1.0, nxt, False, truncated=True)
    batch = buffer.sample(2)
    assert batch.obs["sensors", "camera"].shape == (2, 2, 4, 4) and batch.next_obs["sensors", "imu"].sum() == 12


@pytest.mark.parametrize(("options", "match"), [
    ({"compact_key": "camera"}, r"compact_key='camera': not a key of the observation; keys are \['image', 'state'\]"),
    ({"compact_key": "state"}, r"compact_key='state': expected an image key .* got obs\[\"state\"\]: \(4, 3\) float32"),
    ({"compact_key": 3}, "compact_key: expected a key"),
    ({"compact_key": ()}, "compact_key: expected a key"),
    ({"obs_dtype": None}, r"compact_key: .* no key is a uint8 image"),
    ({"obs_dtype": torch.uint8}, r"compact_key: .* 2 keys could be it"),
    ({"compact_key": "image", "frame_stack": 1, "compact": None}, r"this buffer is not compact"),
    ({"frame_stack": 3}, r"obs_shape\[\"image\"\]: with frame_stack=3 the first dim holds the stack"),
    ({"hidden_state_shape": (1, 8)}, "the compact layout stores no hidden states"),
])
def test_bad_options_are_refused(options: dict[str, Any], match: str) -> None:
    built = {"obs_shape": {"image": (4, *FRAME), "state": (4, 3)}, "obs_dtype": {"image": torch.uint8},
             "action_shape": (), "frame_stack": 4, **options}
    if built["obs_dtype"] is torch.uint8:
        built["obs_shape"] = {"image": (4, *FRAME), "other": (4, *FRAME)}
    with pytest.raises(ConfigError, match=match):
        ReplayBuffer(10, **built)
    with pytest.raises(ConfigError, match=match):
        ReplayBuffer.bytes_per_transition(**{name: value for name, value in built.items()})


def test_other_refusals() -> None:
    with pytest.raises(ConfigError, match=r"compact_key='x': .* only for dict observations"):
        ReplayBuffer(10, obs_shape=(4, *FRAME), action_shape=(), frame_stack=4, compact_key="x")
    with pytest.raises(ConfigError, match="a group of keys"):
        ReplayBuffer(10, obs_shape={"sensors": {"camera": FRAME, "depth": FRAME}}, action_shape=(), compact=True,
                     compact_key="sensors")
    goal_env = {"observation": (2, *FRAME), "achieved_goal": (2,), "desired_goal": (2,)}
    with pytest.raises(ConfigError, match="hindsight: relabels whole transitions"):
        ReplayBuffer(10, obs_shape=goal_env, obs_dtype={"observation": torch.uint8}, action_shape=(), frame_stack=2,
                     hindsight=Hindsight("future", reward_fn=lambda achieved, desired, info: np.zeros(len(achieved))))


def test_bytes_per_transition_counts_the_frame_once_and_the_other_keys_twice() -> None:
    options = {"obs_shape": {"image": (4, 84, 84), "state": (4, 7)}, "obs_dtype": {"image": torch.uint8},
               "action_shape": (), "action_dtype": torch.int64}
    compact = ReplayBuffer.bytes_per_transition(**options, frame_stack=4, episode_length=1000)
    # one frame, the state stack twice, action, reward, flags, the stream links, a final frame per episode
    assert compact == 84 * 84 + 2 * 4 * 7 * 4 + 8 + 4 + 3 + (8 * 3 + 8 + 8 + 8 + 2) + 84 * 84 / 1000
    buffer = ReplayBuffer(10, **options, frame_stack=4)
    assert "bytes_per_transition~7.345 kB" in repr(buffer)  # the same, final frames aside


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_a_refused_add_leaves_the_buffer_as_it_was(compression: str | None) -> None:
    buffer = _dict_buffer(12, 2, 2, n_step=2, compression=compression)
    envs = DictEnvs(2, 2, "reset", 0.2, True, 0)
    for _ in range(8):
        rows, keep = envs.step()
        buffer.add(*_batched(rows), env_mask=keep)
    rows, keep = envs.step()
    obs, action, reward, next_obs, terminated, truncated = _batched(rows)
    before = snapshot(buffer)
    bad_state = {**next_obs, "state": next_obs["state"][:, :, :2]}
    broken = {**obs, "image": obs["image"] + 1}
    cases: list[tuple[type[Exception], str, tuple[Any, ...]]] = [
        (ShapeError, r'next_obs\["state"\]', (obs, action, reward, bad_state, terminated, truncated)),
        (MissingFieldError, r'obs\["state"\]: missing', ({"image": obs["image"]}, action, reward, next_obs,
                                                          terminated, truncated)),
        (MissingFieldError, r'obs\["depth"\]: not a key', ({**obs, "depth": obs["image"]}, action, reward, next_obs,
                                                            terminated, truncated)),
        (StreamError, r'obs\["image"\]: env \d.* differs from the next_obs\["image"\]',
         (broken, action, reward, next_obs, terminated, truncated)),
    ]
    for error, match, args in cases:
        for mask in (None, keep):
            with pytest.raises(error, match=match):
                buffer.add(*args, env_mask=mask)
            assert same(snapshot(buffer), before), match
    buffer.add(obs, action, reward, next_obs, terminated, truncated, env_mask=keep)
    assert buffer.check_valid() == (True, "")


def test_a_compact_dict_buffer_mixes_with_an_offline_buffer_of_whole_transitions() -> None:
    from rlbuf.mixing import MixedReplay

    envs = DictEnvs(1, 2, "reset", 0.1, False, 4)
    offline = ReplayBuffer(40, obs_shape={"image": (2, *FRAME), "state": (2, *STATE)}, obs_dtype={"image": torch.uint8},
                           action_shape=(), action_dtype=torch.int64)
    online = _dict_buffer(40, 1, 2, n_step=2, compression="zstd")
    for _ in range(30):
        rows, _ = envs.step()
        for target in (offline, online):
            target.add(*_batched(rows))
    batch = MixedReplay(offline, online, offline_fraction=0.5).sample(8)
    assert batch.obs["image"].shape == (8, 2, *FRAME) and batch.next_obs["state"].shape == (8, 2, *STATE)


def test_a_saved_checkpoint_with_another_image_key_is_refused(tmp_path: Path) -> None:
    """Two image keys of one shape: a manifest naming the other one rebuilds a buffer whose fields differ."""
    frame = np.zeros((2, *FRAME), np.uint8)
    buffer = ReplayBuffer(10, obs_shape={"a": (2, *FRAME), "b": (2, *FRAME)}, obs_dtype=torch.uint8,
                          action_shape=(), frame_stack=2, compact_key="a")
    for _ in range(4):
        buffer.add({"a": frame, "b": frame}, 0.0, 1.0, {"a": frame, "b": frame}, False, truncated=False)
    buffer.save(tmp_path / "ckpt")
    manifest = tmp_path / "ckpt" / "manifest.json"
    saved = json.loads(manifest.read_text())
    assert saved["state"]["options"]["compact_key"] == "a"
    saved["state"]["options"]["compact_key"] = "b"
    manifest.write_text(json.dumps(saved))
    with pytest.raises(CheckpointError, match=r"fields .* differ from this buffer's"):
        ReplayBuffer.load(tmp_path / "ckpt")


def test_sample_by_index_gathers_the_keys_asked_for() -> None:
    buffer = _dict_buffer(20, 2, 2, n_step=2)
    envs = DictEnvs(2, 2, "reset", 0.2, False, 9)
    for _ in range(10):
        buffer.add(*_batched(envs.step()[0]))
    full = buffer.sample_all()
    only = buffer.sample_by_index(full.index, fields=['obs["image"]', 'next_obs["state"]', "reward"])
    assert torch.equal(only.extras['obs["image"]'], full.obs["image"])
    assert torch.equal(only.extras['next_obs["state"]'], full.next_obs["state"])
    assert torch.equal(only.reward, full.reward)
    with pytest.raises(MissingFieldError, match="unknown"):
        buffer.sample_by_index(full.index, fields=["obs"])


@pytest.mark.parametrize("masked", [False, True])
def test_extra_fields_are_stored_with_each_row(masked: bool) -> None:
    buffer = _dict_buffer(20, 2, 2, n_step=2, extra_fields={"code": ((2,), torch.int64)})
    envs = DictEnvs(2, 2, "reset", 0.0, False, 2)
    for t in range(6):
        codes = torch.tensor([[t, 0], [t, 1]])
        buffer.add(*_batched(envs.step()[0]), code=codes, env_mask=np.ones(2, bool) if masked else None)
    data = buffer.sample_all()  # the complete ones: each env's last n_step steps wait for the steps after them
    serials = data.index.tolist()
    assert data.extras["code"].tolist() == [[serial // 2, serial % 2] for serial in serials]
