"""Attacks on the compiled compact sample path, against a plain model of whole transitions, and refused samples.

The property test holds ``sample_all``/``sample``/``sample_by_index`` of a compact buffer (single-tensor
and dict observations, ``frame_stack`` 1-4, ``n_step`` 1-4, both paddings, uint8/int16/float32 frames of
sizes that are and are not whole 8-byte words, memory and memmap storage, wrapping capacities,
``env_mask``) to a plain Python model of whole transitions written here, independent of rlbuf's own
reference: the obs stack as added, the ``next_obs`` added with the transition's last step (a final
observation where the episode ended), ``sum(gamma**i * r_i)`` summed in step order in float64 and
rounded to float32, ``gamma**m`` or 0 when terminated.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from _compact_envs import IdEnvs, _dict_buffer
from _snapshot import same, snapshot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlbuf import (
    EmptyBufferError,
    ReplayBuffer,
    StoredIndexError,
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


# -- the compiled compact sample path against the model -------------------------------------------------
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
