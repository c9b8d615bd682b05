"""Attacks on the compact layout: dict observations with an image key, the compiled sample path, and a
writer and a sampler on two threads.

The property test holds ``sample_all``/``sample``/``sample_by_index`` of a compact buffer (single-tensor
and dict observations, ``frame_stack`` 1-4, ``n_step`` 1-4, both paddings, uint8/int16/float32 frames of
sizes that are and are not whole 8-byte words, memory and memmap storage, wrapping capacities,
``env_mask``) to a plain Python model of whole transitions written here, independent of rlbuf's own
reference: the obs stack as added, the ``next_obs`` added with the transition's last step (a final
observation where the episode ended), ``sum(gamma**i * r_i)`` summed in step order in float64 and
rounded to float32, ``gamma**m`` or 0 when terminated.
"""

from __future__ import annotations

import contextlib
import copy
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from _snapshot import same, snapshot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensordict import TensorDict
from test_forged_checkpoints import _behaviour, _forge, _manifest, _refused_or_alike, _rewrite

from rlbuf import (
    CheckpointError,
    DtypeError,
    EmptyBufferError,
    MissingFieldError,
    ReplayBuffer,
    RlbufError,
    ShapeError,
    StoredIndexError,
    StreamError,
)

REWARDS = (-1.5, -0.0, 0.0, 0.25, 2.0, -3.0, 7.0)


# -- a plain model of whole transitions -----------------------------------------------------------------
class Envs:
    """``num_envs`` envs of frame stacks (gymnasium's FrameStackObservation), a ``state`` key beside the
    image for dict observations; every frame drawn at random."""

    def __init__(self, num_envs: int, frame_stack: int, frame: tuple[int, ...], dtype: np.dtype[Any], padding: str,
                 end_chance: float, seed: int, with_state: bool) -> None:
        self.rng = np.random.default_rng(seed)
        self.k, self.frame, self.dtype, self.padding = frame_stack, frame, np.dtype(dtype), padding
        self.end_chance, self.with_state = end_chance, with_state
        self.steps = 0
        self.stacks = [self._reset() for _ in range(num_envs)]

    def _frame(self) -> np.ndarray[Any, Any]:
        if self.dtype.kind == "f":
            return self.rng.standard_normal(self.frame).astype(self.dtype)
        info = np.iinfo(self.dtype)
        return self.rng.integers(info.min, info.max, self.frame, endpoint=True).astype(self.dtype)

    def _one(self) -> dict[str, np.ndarray[Any, Any]]:
        self.steps += 1
        return {"image": self._frame(), "state": np.array([self.steps, -self.steps, 0.5], np.float32)}

    def _reset(self) -> list[dict[str, np.ndarray[Any, Any]]]:
        first = self._one()
        pad = first if self.padding == "reset" else {key: np.zeros_like(v) for key, v in first.items()}
        return [pad] * (self.k - 1) + [first]

    def _obs(self, stack: list[dict[str, np.ndarray[Any, Any]]]) -> Any:
        keys = ("image", "state") if self.with_state else ("image",)
        out = {key: (np.stack([f[key] for f in stack]) if self.k > 1 else stack[0][key]) for key in keys}
        return out if self.with_state else out["image"]

    def step(self, keep: np.ndarray[Any, Any]) -> list[dict[str, Any]]:
        """One step of every env; the rows of envs not in ``keep`` are junk (left out by ``env_mask``) and their
        streams do not advance."""
        rows = []
        for env, stack in enumerate(self.stacks):
            obs = self._obs(stack)
            if not keep[env]:
                junk = self._obs([{key: np.zeros_like(v) for key, v in stack[0].items()}] * self.k)
                rows.append({"env": env, "obs": junk, "next_obs": junk, "reward": 0.0, "terminated": False,
                             "truncated": False})
                continue
            after = [*stack[1:], self._one()]
            ended = bool(self.rng.random() < self.end_chance)
            terminated = ended and bool(self.rng.random() < 0.5)
            rows.append({"env": env, "obs": obs, "next_obs": self._obs(after),
                         "reward": float(REWARDS[int(self.rng.integers(0, len(REWARDS)))]),
                         "terminated": terminated, "truncated": ended and not terminated})
            self.stacks[env] = self._reset() if ended else after
        return rows


def batched(rows: list[dict[str, Any]]) -> tuple[Any, ...]:
    def stack(key: str) -> Any:
        first = rows[0][key]
        if isinstance(first, dict):
            return {name: np.stack([row[key][name] for row in rows]) for name in first}
        return np.stack([row[key] for row in rows])
    return (stack("obs"), np.zeros(len(rows), np.float32), np.array([row["reward"] for row in rows], np.float32),
            stack("next_obs"), np.array([row["terminated"] for row in rows]),
            np.array([row["truncated"] for row in rows]))


def model(kept: list[dict[str, Any]], capacity: int, k: int, n: int, gamma: float) -> dict[int, dict[str, Any] | None]:
    """Position -> the whole transition a buffer holding ``kept`` (rows in write order) returns there, or None
    where the transition is not complete (its n steps not added yet, or its stack's oldest rows overwritten)."""
    total = len(kept)
    oldest = total - min(total, capacity)
    later: dict[int, int] = {}   # serial -> the env's next serial
    episode_pos: list[int] = []  # each row's index in its episode
    first_of: list[int] = []
    open_: dict[int, tuple[int, int]] = {}   # env -> (its last serial, its index in the episode) of an open episode
    history: dict[int, list[int]] = {}
    for serial, row in enumerate(kept):
        env = row["env"]
        if env in open_:
            previous, at = open_[env]
            later[previous] = serial
            episode_pos.append(at + 1)
        else:
            episode_pos.append(0)
        history.setdefault(env, []).append(serial)
        first_of.append(history[env][-1 - episode_pos[-1]])
        if row["terminated"] or row["truncated"]:
            open_.pop(env, None)
        else:
            open_[env] = (serial, episode_pos[-1])
    out: dict[int, dict[str, Any] | None] = {}
    for serial in range(oldest, total):
        env_rows = history[kept[serial]["env"]]
        at = env_rows.index(serial)
        older = env_rows[at - min(k - 1, episode_pos[serial]):at + 1]
        complete = older[0] >= oldest   # every row of its stack (from the episode's first) still stored
        steps = [serial]
        ended = False
        for step in range(1, n + 1):
            row = kept[steps[-1]]
            if row["terminated"] or row["truncated"]:
                ended = True
                break
            if steps[-1] not in later:
                complete = False
                break
            if step < n:
                steps.append(later[steps[-1]])
        if not complete:
            out[serial % capacity] = None
            continue
        total_reward = 0.0
        for i, s in enumerate(steps):
            total_reward += float(np.float32(kept[s]["reward"])) * (gamma ** i)
        last = kept[steps[-1]]
        terminated = ended and last["terminated"]
        out[serial % capacity] = {
            "obs": kept[serial]["obs"], "next_obs": last["next_obs"], "reward": np.float32(total_reward),
            "terminated": terminated, "truncated": ended and last["truncated"], "done": ended,
            "discount": np.float32(0.0 if terminated else gamma ** len(steps)), "serial": serial}
    return out


def _leaf(value: Any, key: str | None) -> np.ndarray[Any, Any]:
    return np.asarray(value if key is None else value[key])


def check_rows(batch: Any, expected: dict[int, dict[str, Any] | None], dict_obs: bool) -> None:
    """Every row of ``batch`` is the model's transition at its position, bit for bit."""
    keys: list[str | None] = ["image", "state"] if dict_obs else [None]
    for row, position in enumerate(batch.index.tolist()):
        want = expected[position]
        assert want is not None, f"position {position} is not complete in the model but was sampled"
        where = f"position {position} (serial {want['serial']})"
        for key in keys:
            got_obs = (batch.obs if key is None else batch.obs[key])[row].numpy()
            got_next = (batch.next_obs if key is None else batch.next_obs[key])[row].numpy()
            assert got_obs.tobytes() == _leaf(want["obs"], key).tobytes(), f"obs {key} at {where}"
            assert got_next.tobytes() == _leaf(want["next_obs"], key).tobytes(), f"next_obs {key} at {where}"
        got_reward = np.float32(batch.reward[row].item())
        assert got_reward == want["reward"], f"reward at {where}: {got_reward} != {want['reward']}"
        assert np.float32(batch.discount[row].item()) == want["discount"], f"discount at {where}"
        assert bool(batch.terminated[row]) == want["terminated"], f"terminated at {where}"
        assert bool(batch.truncated[row]) == want["truncated"], f"truncated at {where}"
        assert bool(batch.done[row]) == want["done"], f"done at {where}"


# -- 2. the compiled compact sample path against the model ---------------------------------------------
@st.composite
def scenarios(draw: Any) -> dict[str, Any]:
    dtype = draw(st.sampled_from(["uint8", "int16", "float32"]))
    dict_obs = draw(st.booleans())
    return {
        "k": draw(st.integers(1, 4)), "n": draw(st.integers(1, 4)), "num_envs": draw(st.integers(1, 3)),
        "capacity": draw(st.integers(3, 14)), "padding": draw(st.sampled_from(["reset", "zero"])),
        "dtype": dtype, "frame": draw(st.sampled_from([(3, 5), (2, 4), (1, 3)])),
        "dict_obs": dict_obs and dtype == "uint8",  # a dict's followed key is a uint8 image
        "storage": draw(st.sampled_from(["memory", "memmap"])),
        "compression": draw(st.sampled_from([None, None, "lz4"])) if dtype == "uint8" else None,
        "gamma": draw(st.sampled_from([0.0, 0.5, 0.99, 1.0])), "end_chance": draw(st.sampled_from([0.0, 0.2, 0.5])),
        "mask_chance": draw(st.sampled_from([0.0, 0.0, 0.3])), "steps": draw(st.integers(1, 16)),
        "prioritized": draw(st.booleans()), "seed": draw(st.integers(0, 2**16)),
    }


def _buffer(s: dict[str, Any], scratch: Path | None) -> ReplayBuffer:
    k, frame = s["k"], s["frame"]
    image = (k, *frame) if k > 1 else frame
    dtype = getattr(torch, s["dtype"])
    options: dict[str, Any] = {}
    if s["dict_obs"]:
        options.update(obs_shape={"image": image, "state": (k, 3) if k > 1 else (3,)}, obs_dtype={"image": dtype},
                       compact_key="image")
    else:
        options.update(obs_shape=image, obs_dtype=dtype)
    if s["storage"] == "memmap":
        options.update(storage="memmap", scratch_dir=scratch)
    return ReplayBuffer(s["capacity"], action_shape=(), num_envs=s["num_envs"], frame_stack=k, n_step=s["n"],
                        gamma=s["gamma"], padding_type=s["padding"], compact=True, compression=s["compression"],
                        prioritized=s["prioritized"], seed=0, **options)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(s=scenarios())
def test_compact_sampling_equals_a_model_of_whole_transitions(s: dict[str, Any]) -> None:
    scratch = Path(tempfile.mkdtemp(prefix="rlbuf-attack-"))
    try:
        buffer = _buffer(s, scratch)
        envs = Envs(s["num_envs"], s["k"], s["frame"], np.dtype(s["dtype"]), s["padding"], s["end_chance"],
                    s["seed"], s["dict_obs"])
        mask_rng = np.random.default_rng(s["seed"] + 1)
        kept: list[dict[str, Any]] = []
        for _ in range(s["steps"]):
            keep = mask_rng.random(s["num_envs"]) >= s["mask_chance"]
            rows = envs.step(keep)
            buffer.add(*batched(rows), env_mask=None if keep.all() else keep)
            kept += [row for row, kept_row in zip(rows, keep, strict=True) if kept_row]
        expected = model(kept, s["capacity"], s["k"], s["n"], s["gamma"])
        assert len(buffer) == min(len(kept), s["capacity"])
        complete = sorted((want["serial"], position) for position, want in expected.items() if want is not None)
        if not complete:
            with pytest.raises(EmptyBufferError):
                buffer.sample_all()
            with pytest.raises(EmptyBufferError):
                buffer.sample(2)
        else:
            everything = buffer.sample_all()
            assert everything.index.tolist() == [position for _, position in complete]
            check_rows(everything, expected, s["dict_obs"])
            for _ in range(2):
                batch = buffer.sample(5)
                check_rows(batch, expected, s["dict_obs"])
                if s["prioritized"]:
                    buffer.update_priority(batch.index, (batch.index % 3 + 1).to(torch.float64))
            check_rows(buffer.sample_by_index(everything.index.flip(0)), expected, s["dict_obs"])
        incomplete = [position for position, want in expected.items() if want is None]
        if incomplete:
            before = snapshot(buffer)
            with pytest.raises(StoredIndexError, match=f"position {incomplete[0]} is not complete"):
                buffer.sample_by_index(torch.tensor(incomplete[:1]))
            assert same(snapshot(buffer), before)
        assert buffer.check_valid() == (True, "")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# -- 3. a writer and a sampler on two threads ----------------------------------------------------------
IMAGE = (6, 5)


def _ends(env: int, frame_id: int) -> bool:
    """Env 0 terminates after frames 6, 13, 20 ...; env 1 is truncated after frames 4, 9, 14 ..."""
    return frame_id % 7 == 6 if env == 0 else frame_id % 5 == 4


def _reward(frame_id: int) -> float:
    return float(frame_id % 8) - 3.5


class IdEnvs:
    """Two envs whose every frame carries its id (per env, counting resets): the image ``(2 * id + env) % 256``,
    the state ``[id, env, the episode's first id]``; ends and rewards follow from the ids."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.ids = [0, 0]
        self.first = [0, 0]

    def _stack(self, env: int, newest: int) -> dict[str, np.ndarray[Any, Any]]:
        ids = [max(newest - (self.k - 1 - j), self.first[env]) for j in range(self.k)]
        return {"image": np.stack([np.full(IMAGE, (2 * i + env) % 256, np.uint8) for i in ids]),
                "state": np.array([[i, env, self.first[env]] for i in ids], np.float32)}

    def step(self, keep: tuple[bool, bool] = (True, True)) -> tuple[Any, ...]:
        """One step of both envs; an env not in ``keep`` gives a junk row (for ``env_mask``) and does not advance."""
        obs, next_obs, reward, terminated, truncated = [], [], [], [], []
        for env in range(2):
            newest = self.ids[env]
            if not keep[env]:
                junk = self._stack(env, newest)
                obs.append(junk)
                next_obs.append(junk)
                reward.append(0.0)
                terminated.append(False)
                truncated.append(False)
                continue
            obs.append(self._stack(env, newest))
            next_obs.append(self._stack(env, newest + 1))
            reward.append(_reward(newest))
            end = _ends(env, newest)
            terminated.append(end and env == 0)
            truncated.append(end and env == 1)
            self.ids[env] = newest + 1
            if end:  # a reset: a new first frame
                self.ids[env] = self.first[env] = newest + 2
        return ({key: np.stack([o[key] for o in obs]) for key in ("image", "state")}, np.zeros(2, np.float32),
                np.array(reward, np.float32), {key: np.stack([o[key] for o in next_obs]) for key in ("image", "state")},
                np.array(terminated), np.array(truncated))


def check_id_batch(batch: Any, k: int, n: int, gamma: float) -> None:
    """Every sampled row is the transition its ids say, whole: stacks, next stacks, reward, flags, discount."""
    state, after = batch.obs["state"].numpy(), batch.next_obs["state"].numpy()
    image, next_image = batch.obs["image"].numpy(), batch.next_obs["image"].numpy()
    for row in range(len(state)):
        newest, env, first = (int(v) for v in state[row, -1])
        m = next((i for i in range(1, n + 1) if _ends(env, newest + i - 1)), n)
        ended = _ends(env, newest + m - 1)
        for stack, pixels, top in ((state[row], image[row], newest), (after[row], next_image[row], newest + m)):
            ids = [max(top - (k - 1 - j), first) for j in range(k)]
            assert stack.tolist() == [[i, env, first] for i in ids], (row, stack.tolist(), ids)
            assert [int(p[0, 0]) for p in pixels] == [(2 * i + env) % 256 for i in ids], row
            assert (pixels == pixels[:, :1, :1]).all(), row
        total = 0.0
        for i in range(m):
            total += float(np.float32(_reward(newest + i))) * gamma**i
        assert np.float32(batch.reward[row].item()) == np.float32(total), row
        assert bool(batch.terminated[row]) == (ended and env == 0)
        assert bool(batch.truncated[row]) == (ended and env == 1)
        assert np.float32(batch.discount[row].item()) == np.float32(0.0 if ended and env == 0 else gamma**m)


@pytest.mark.parametrize(("compression", "prioritized", "masked"),
                         [(None, False, False), ("zstd", True, False), ("lz4", False, True), (None, True, True)])
def test_a_writer_and_a_sampler_on_two_threads(monkeypatch: pytest.MonkeyPatch, compression: str | None,
                                                prioritized: bool, masked: bool) -> None:
    import rlbuf._frames as frames_module
    monkeypatch.setattr(frames_module, "DICTIONARY_AFTER", 40)  # a dictionary trained while the sampler reads
    k, n, gamma = 3, 3, 0.5
    buffer = ReplayBuffer(48, obs_shape={"image": (k, *IMAGE), "state": (k, 3)}, obs_dtype={"image": torch.uint8},
                          action_shape=(), num_envs=2, frame_stack=k, n_step=n, gamma=gamma, compression=compression,
                          prioritized=prioritized, seed=0)
    envs = IdEnvs(k)
    for _ in range(4):
        buffer.add(*envs.step())
    errors: list[BaseException] = []
    done = threading.Event()
    checked = [0]

    def write() -> None:
        try:
            for t in range(300):
                keep = (t % 3 != 1, t % 4 != 2) if masked else (True, True)
                buffer.add(*envs.step(keep), env_mask=np.array(keep) if masked else None)
        except BaseException as error:
            errors.append(error)
        finally:
            done.set()

    def sample() -> None:
        try:
            while not done.is_set() or checked[0] < 20:
                batch = buffer.sample(16)
                check_id_batch(batch, k, n, gamma)
                if prioritized:
                    buffer.update_priority(batch.index, torch.rand(16, dtype=torch.float64) + 0.1)
                # the rows may have been overwritten since: refused, or whole transitions of other steps
                with contextlib.suppress(StoredIndexError):
                    check_id_batch(buffer.sample_by_index(batch.index), k, n, gamma)
                checked[0] += 1
        except BaseException as error:
            errors.append(error)
            done.set()

    threads = [threading.Thread(target=write), threading.Thread(target=sample)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    assert checked[0] >= 20
    check_id_batch(buffer.sample_all(), k, n, gamma)
    assert buffer.check_valid() == (True, "")


# -- 1. dict observations in the compact layout ---------------------------------------------------------
def _dict_buffer(compression: str | None = None, n_step: int = 2, **options: Any) -> ReplayBuffer:
    return ReplayBuffer(24, obs_shape={"image": (3, *IMAGE), "state": (3, 3)}, obs_dtype={"image": torch.uint8},
                        action_shape=(), num_envs=2, frame_stack=3, n_step=n_step, gamma=0.5, compression=compression,
                        seed=0, **options)


def _broken(step: tuple[Any, ...], part: int, change: Any) -> tuple[Any, ...]:
    """``step`` with its part ``part`` (0: obs ... 5: truncated) replaced by ``change(copy of it)``."""
    parts = list(copy.deepcopy(step))
    parts[part] = change(parts[part])
    return tuple(parts)


def _with(key: str, value: Any) -> Any:
    return lambda obs: {**obs, key: value(obs[key]) if callable(value) else value}


def _without(key: str) -> Any:
    return lambda obs: {name: v for name, v in obs.items() if name != key}


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


def _collected(envs: IdEnvs, steps: int, nested: bool) -> TensorDict:
    """``steps`` steps as a collector's ``[num_envs, T]`` TensorDict."""
    parts = [envs.step() for _ in range(steps)]

    def stacked(part: int, key: str | None = None) -> torch.Tensor:
        return torch.from_numpy(np.stack([p[part] if key is None else p[part][key] for p in parts], 1))
    where = ("observation",) if nested else ()
    td = TensorDict({}, batch_size=[2, steps])
    for key in ("image", "state"):
        td[(*where, key)] = stacked(0, key)
        td[("next", *where, key)] = stacked(3, key)
    td["action"] = stacked(1)
    td["next", "reward"] = stacked(2)
    td["next", "terminated"] = stacked(4)
    td["next", "truncated"] = stacked(5)
    return td


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


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_state_dicts_taken_while_a_writer_adds_load_whole(monkeypatch: pytest.MonkeyPatch,
                                                          compression: str | None) -> None:
    """A thread takes state dicts while another adds (a dictionary trained meanwhile): each loads into a fresh
    buffer, passes its checks and samples whole transitions."""
    import rlbuf._frames as frames_module
    monkeypatch.setattr(frames_module, "DICTIONARY_AFTER", 30)
    buffer = _dict_buffer(compression)
    envs = IdEnvs(3)
    for _ in range(3):
        buffer.add(*envs.step())
    states: list[dict[str, Any]] = []
    errors: list[BaseException] = []
    done = threading.Event()

    def write() -> None:
        try:
            for _ in range(120):
                buffer.add(*envs.step())
        except BaseException as error:
            errors.append(error)
        finally:
            done.set()

    def take() -> None:
        try:
            while len(states) < 12 and not (done.is_set() and states):
                states.append(copy.deepcopy(buffer.state_dict()))
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=write), threading.Thread(target=take)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    for state in states:
        loaded = _dict_buffer(compression)
        loaded.load_state_dict(state)
        assert loaded.check_valid() == (True, "")
        with contextlib.suppress(EmptyBufferError):   # a state taken before any transition was complete
            check_id_batch(loaded.sample_all(), 3, 2, 0.5)


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
def test_sample_all_while_another_thread_adds(compression: str | None) -> None:
    """Deterministic: another thread's add is started right after sample_all has listed the complete transitions
    (and given a second to go in); sample_all must still return whole transitions of one state."""
    buffer = _dict_buffer(compression)
    envs = IdEnvs(3)
    for _ in range(15):   # 30 rows in a ring of 24
        buffer.add(*envs.step())
    layout = buffer._compact
    assert layout is not None
    listed = layout.complete_index
    writers: list[threading.Thread] = []
    errors: list[BaseException] = []

    def add() -> None:
        try:
            buffer.add(*envs.step())
        except BaseException as error:
            errors.append(error)

    def listed_then_an_add() -> torch.Tensor:
        index = listed()
        writer = threading.Thread(target=add)
        writers.append(writer)
        writer.start()
        writer.join(timeout=1.0)   # goes in now unless sample_all holds the buffer's lock
        return index

    layout.complete_index = listed_then_an_add  # type: ignore[method-assign]
    try:
        batch = buffer.sample_all()
    finally:
        layout.complete_index = listed  # type: ignore[method-assign]
        for writer in writers:
            writer.join()
    assert not errors, errors
    check_id_batch(batch, 3, 2, 0.5)


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


@pytest.mark.parametrize("case", ["nothing complete", "nothing complete, prioritized", "huge priorities waiting"])
def test_a_refused_sample_leaves_the_random_state_as_it_was(case: str) -> None:
    prioritized = case != "nothing complete"
    buffer, twin = _dict_buffer(prioritized=prioritized), _dict_buffer(prioritized=prioritized)
    envs = IdEnvs(3)
    step = envs.step()
    buffer.add(*step)
    twin.add(*step)
    if case == "huge priorities waiting":   # nothing complete, the waiting rows' priorities huge: still refused
        for target in (buffer, twin):
            target.update_priority(torch.arange(len(target)), torch.full((len(target),), 1e12, dtype=torch.float64))
    before = snapshot(buffer)
    with pytest.raises(EmptyBufferError):
        buffer.sample(4)
    refused_alike = same(snapshot(buffer), before)
    for _ in range(6):
        step = envs.step()
        buffer.add(*step)
        twin.add(*step)
    assert refused_alike, "the refused sample changed the buffer's state"
    assert torch.equal(buffer.sample(8).index, twin.sample(8).index)


def test_complete_transitions_of_almost_no_priority_mass_are_drawn_not_refused() -> None:
    buffer = _dict_buffer(prioritized=True)
    envs = IdEnvs(3)
    for _ in range(6):
        buffer.add(*envs.step())
    complete = buffer.sample_all().index
    rest = torch.tensor([p for p in range(len(buffer)) if p not in complete.tolist()])
    buffer.update_priority(complete, torch.full((len(complete),), 1e-12, dtype=torch.float64))
    buffer.update_priority(rest, torch.full((len(rest),), 1e12, dtype=torch.float64))
    assert set(buffer.sample(64).index.tolist()) <= set(complete.tolist())


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
