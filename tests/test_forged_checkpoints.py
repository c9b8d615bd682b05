"""Forged checkpoints of every layout, checksums recomputed: each is refused with ``CheckpointError``,
or (where the edit describes another state rlbuf could have written) loads a buffer that samples
exactly like a genuine one. Genuine checkpoints of every layout load and resume exactly, and a
refused ``load_state_dict`` leaves the target buffer exactly as it was.

Layouts: plain, compact (``frame_stack=4, n_step=3``; ``n_step=3`` alone), dict observations,
hidden state, prioritized, memmap storage, ``RolloutBuffer``, ``DistillationBuffer``.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import xxhash
from _snapshot import same, snapshot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlbuf import CheckpointError, DistillationBuffer, ReplayBuffer, RolloutBuffer, _torchrl
from rlbuf.checkpoint import load_state

Buffer = Any
CAPACITY = 16


# -- genuine buffers of every layout ------------------------------------------------------------
def _replay_steps(buffer: ReplayBuffer, steps: int, obs: Callable[[torch.Tensor], Any], **extras: Any) -> None:
    n = buffer.num_envs
    for t in range(steps):
        value = torch.arange(n, dtype=torch.float32) * 100 + t + 1
        buffer.add(obs(value), torch.full((n,), float(t % 3)), value, obs(value + 0.5),
                   torch.tensor([t % 5 == 4, False][:n]), torch.tensor([False, t % 6 == 5][:n]),
                   **{name: make(value) for name, make in extras.items()})


def _stacked_steps(buffer: ReplayBuffer, steps: int, frame_stack: int) -> None:
    """Frame stacks as gymnasium's ``FrameStackObservation`` gives them (reset padding), two envs:
    env 0 terminates every 5 steps, env 1 is truncated every 6 (its last step starts an episode)."""
    n = buffer.num_envs
    frames = [[float(100 * e + 1)] * frame_stack for e in range(n)]
    for t in range(steps):
        terminated = torch.tensor([t % 5 == 4, False][:n])
        truncated = torch.tensor([False, t % 6 == 5][:n])
        obs = torch.tensor([[[f, -f] for f in frames[e]] for e in range(n)])
        new = [float(100 * e + t + 2) for e in range(n)]
        next_frames = [[*frames[e][1:], new[e]] for e in range(n)]
        next_obs = torch.tensor([[[f, -f] for f in next_frames[e]] for e in range(n)])
        if frame_stack == 1:
            obs, next_obs = obs[:, 0], next_obs[:, 0]
        buffer.add(obs, torch.full((n,), float(t % 3)), torch.arange(n) + t * 0.5, next_obs, terminated, truncated)
        for e in range(n):
            reset = float(100 * e + 50 + t) if bool(terminated[e] | truncated[e]) else None
            frames[e] = [reset] * frame_stack if reset is not None else next_frames[e]


def plain(storage: str = "memory") -> ReplayBuffer:
    buffer = ReplayBuffer(CAPACITY, obs_shape=(3,), action_shape=(), num_envs=2, seed=0, storage=storage,  # type: ignore[arg-type]
                          extra_fields={"cost": ((), torch.float32)})
    _replay_steps(buffer, 11, lambda v: v[:, None].expand(-1, 3).clone(), cost=lambda v: v * 2)
    return buffer


def compact(frame_stack: int = 4, n_step: int = 3, padding_type: str = "reset", gamma: float = 0.9,
            compression: str | None = None) -> ReplayBuffer:
    shape = (frame_stack, 2) if frame_stack > 1 else (2,)
    buffer = ReplayBuffer(CAPACITY, obs_shape=shape, action_shape=(), num_envs=2, frame_stack=frame_stack,
                          n_step=n_step, gamma=gamma, padding_type=padding_type, seed=0, compact=True,  # type: ignore[arg-type]
                          compression=compression)
    _stacked_steps(buffer, 13, frame_stack)
    return buffer


def structured() -> ReplayBuffer:
    buffer = ReplayBuffer(CAPACITY, obs_shape={"a": (2,), "b": (3,)}, action_shape=(), num_envs=2, seed=0)
    _replay_steps(buffer, 11, lambda v: {"a": v[:, None].expand(-1, 2).clone(), "b": -v[:, None].expand(-1, 3).clone()})
    return buffer


def hidden() -> ReplayBuffer:
    buffer = ReplayBuffer(CAPACITY, obs_shape=(3,), action_shape=(), num_envs=2, seed=0,
                          hidden_state_shape={"h": (2,), "c": (2,)})
    _replay_steps(buffer, 11, lambda v: v[:, None].expand(-1, 3).clone(),
                  hidden_state=lambda v: {"h": v[:, None].expand(-1, 2).clone(), "c": -v[:, None].expand(-1, 2).clone()})
    return buffer


def prioritized() -> ReplayBuffer:
    buffer = ReplayBuffer(CAPACITY, obs_shape=(3,), action_shape=(), num_envs=2, seed=0, prioritized=True)
    _replay_steps(buffer, 11, lambda v: v[:, None].expand(-1, 3).clone())
    buffer.update_priority(torch.arange(CAPACITY), torch.arange(CAPACITY, dtype=torch.float64) + 0.5)
    return buffer


def rollout() -> RolloutBuffer:
    buffer = RolloutBuffer(4, 2, obs_shape=(3,), action_shape=(), seed=0)
    for t in range(4):
        value = torch.tensor([t + 1.0, -t - 1.0])
        buffer.add(value[:, None].expand(-1, 3), torch.zeros(2), value, torch.tensor([t == 2, False]), value * 0.1,
                   -value.abs(), truncated=torch.tensor([False, t == 1]), bootstrap_value=torch.tensor([0.0, 0.5]))
    buffer.compute_returns_and_advantages(torch.zeros(2))
    iterator = buffer.minibatches(batch_size=3, n_epochs=2)
    next(iter(iterator))
    return buffer


def distillation() -> DistillationBuffer:
    buffer = DistillationBuffer(CAPACITY, obs_shape=(3,), action_shape=(), action_dtype=torch.int64, seed=0,
                                extra_fields={"expert_logits": ((2,), torch.float32)})
    for t in range(7):
        obs = torch.full((3, 3), float(t))
        buffer.add(obs, torch.tensor([t, t + 1, t + 2]), expert_logits=torch.full((3, 2), t / 2))
    return buffer


LAYOUTS: dict[str, Callable[[], Buffer]] = {
    "plain": plain,
    "compact": compact,
    "compact n_step only": lambda: compact(frame_stack=1),
    "compressed zstd": lambda: compact(compression="zstd"),
    "compressed lz4, n_step only": lambda: compact(frame_stack=1, compression="lz4"),
    "dict observations": structured,
    "hidden state": hidden,
    "prioritized": prioritized,
    "memmap": lambda: plain("memmap"),
    "rollout": rollout,
    "distillation": distillation,
}


def _behaviour(buffer: Buffer) -> Any:
    """What a user sees of a buffer: every readable row, then the next draws and batches."""
    seen: list[Any] = [buffer.sample_all()]
    if isinstance(buffer, RolloutBuffer):
        iterator = buffer.current_epochs
        seen += [] if iterator is None else list(iterator)
    else:
        seen += [buffer.sample(8) for _ in range(3)]
    return [_frozen(batch) for batch in seen]


def _frozen(batch: Any) -> Any:
    if hasattr(batch, "to_tensordict"):
        batch = batch.to_tensordict()
    return snapshot_of_tensordict(batch)


def snapshot_of_tensordict(td: Any) -> Any:
    return {str(key): (str(value.dtype), tuple(value.shape), value.detach().cpu().contiguous().view(-1).tolist())
            for key, value in sorted(td.items(include_nested=True, leaves_only=True), key=lambda kv: str(kv[0]))}


def _saved(tmp_path: Path, layout: str) -> tuple[Path, Buffer]:
    buffer = LAYOUTS[layout]()
    path = tmp_path / "ckpt"
    buffer.save(path)
    return path, buffer


# -- forging ------------------------------------------------------------------------------------
def _rewrite(path: Path, manifest: dict[str, Any]) -> None:
    """Write ``manifest`` back with every checksum recomputed (format 1: SHA-256, 2: XXH3-128)."""
    for rel, entry in manifest["files"].items():
        data = (path / rel).read_bytes()
        if manifest["format_version"] == 1:
            entry.pop("xxh3_128", None)
            entry["sha256"] = hashlib.sha256(data).hexdigest()
        else:
            entry["xxh3_128"] = xxhash.xxh3_128(data).hexdigest()
    (path / "manifest.json").write_text(json.dumps(manifest))


def _manifest(path: Path) -> dict[str, Any]:
    return json.loads((path / "manifest.json").read_text())  # type: ignore[no-any-return]


def _file_of(manifest: dict[str, Any], suffix: str) -> str:
    [rel] = [rel for rel in manifest["files"] if rel.endswith(suffix)]
    return rel


def _edit_tensor(path: Path, manifest: dict[str, Any], suffix: str, edit: Callable[[torch.Tensor], None]) -> None:
    rel = _file_of(manifest, suffix)
    entry = manifest["files"][rel]
    tensor = torch.frombuffer(bytearray((path / rel).read_bytes()), dtype=getattr(torch, entry["dtype"]))
    tensor = tensor.reshape(entry["shape"]).clone()
    edit(tensor)
    (path / rel).write_bytes(tensor.contiguous().numpy().tobytes())


def _set(manifest: dict[str, Any], keys: tuple[str, ...], value: Any) -> None:
    target = manifest["state"]
    for key in keys[:-1]:
        target = target[key]
    target[keys[-1]] = value


def _forge(path: Path, version: int = 2, *, state: dict[tuple[str, ...], Any] | None = None,
           tensors: dict[str, Callable[[torch.Tensor], None]] | None = None) -> None:
    manifest = _manifest(path)
    manifest["format_version"] = version
    for keys, value in (state or {}).items():
        _set(manifest, keys, value)
    for suffix, edit in (tensors or {}).items():
        _edit_tensor(path, manifest, suffix, edit)
    _rewrite(path, manifest)


def _refused_or_alike(path: Path, kind: type, genuine: Any) -> bool:
    """True when the forged checkpoint is refused; else it must behave exactly like the genuine one."""
    try:
        loaded = kind.load(path)
    except CheckpointError:
        return True
    assert loaded.check_valid() == (True, "")
    assert _behaviour(loaded) == genuine, "a forged checkpoint loaded and behaves otherwise"
    return False


# -- genuine checkpoints resume exactly --------------------------------------------------------
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_a_genuine_checkpoint_of_each_layout_loads_and_resumes_exactly(tmp_path: Path, layout: str) -> None:
    path, original = _saved(tmp_path, layout)
    for version in (2, 1):
        _forge(path, version)  # format 1: the same files with SHA-256 checksums
        loaded = type(original).load(path)
        assert loaded.check_valid() == (True, "")
        assert _behaviour(loaded) == _behaviour(type(original).load(path))
    assert _behaviour(type(original).load(path)) == _behaviour(original)


# -- the forgeries of issue 20, on the compact layout ------------------------------------------
def _flip(position: int) -> Callable[[torch.Tensor], None]:
    def edit(tensor: torch.Tensor) -> None:
        flat = tensor.view(-1)
        flat[position] = ~flat[position] if tensor.dtype == torch.bool else flat[position] + 1
    return edit


COMPACT_FORGERIES: dict[str, dict[str, Any]] = {
    "stream back, a link moved": {"tensors": {"streams.back.bin": _flip(5)}},
    "stream back, a link to an older row": {"tensors": {"streams.back.bin": lambda t: t.view(-1).__setitem__(7, 3)}},
    "stream back, a start marked elsewhere": {"tensors": {"streams.back.bin": lambda t: t.__setitem__(slice(None), -1)}},
    "stream next, a link moved": {"tensors": {"streams.next.bin": _flip(4)}},
    "stream next, a link cut": {"tensors": {"streams.next.bin": lambda t: t.__setitem__(4, -1)}},
    "final_slot moved": {"tensors": {"streams.final_slot.bin": lambda t: t.__setitem__(t.argmax(), t.max() + 1)}},
    "final_slot swapped": {"tensors": {"streams.final_slot.bin": lambda t: t.copy_(torch.where(
        t >= 0, t.max() - t.clamp(min=0), t))}},
    "final_slot on a row that did not end": {"tensors": {"streams.final_slot.bin": lambda t: t.__setitem__(
        int((t < 0).nonzero()[0]), 0)}},
    "stream terminated flipped": {"tensors": {"streams.terminated.bin": _flip(3)}},
    "stream truncated flipped": {"tensors": {"streams.truncated.bin": _flip(3)}},
    "stream last moved": {"tensors": {"streams.last.bin": _flip(0)}},
    "stream env of a row changed": {"tensors": {"streams.env.bin": lambda t: t.__setitem__(5, 1 - t[5])}},
    "stream env out of range": {"tensors": {"streams.env.bin": lambda t: t.__setitem__(5, 2)}},
    "stream expected stack": {"tensors": {"streams.expected.bin": lambda t: t.__setitem__((0, 0), 77.0)}},
    "final_slot shared by two rows": {"tensors": {"streams.final_slot.bin": lambda t: t.__setitem__(
        int((t >= 0).nonzero()[1]), t[int((t >= 0).nonzero()[0])])}},
    "cursor + 1": {"state": {("cursor",): 11}},
    "cursor 0": {"state": {("cursor",): 0}},
    "write_count + 1": {"state": {("write_count",): 27}},
    "write_count + capacity": {"state": {("write_count",): 26 + CAPACITY}},
    "write_count and cursor + 2": {"state": {("write_count",): 28, ("cursor",): 12}},
    "write_count - capacity": {"state": {("write_count",): 26 - CAPACITY}},
    "size": {"state": {("size",): 15}},
    "n_step 0": {"state": {("options", "n_step"): 0}},
    "n_step -1": {"state": {("options", "n_step"): -1}},
    "n_step 10**12": {"state": {("options", "n_step"): 10**12}},
    "n_step 2**64": {"state": {("options", "n_step"): 2**64}},
    "n_step 2**62": {"state": {("options", "n_step"): 2**62}},
    "n_step beyond the limit": {"state": {("options", "n_step"): 10_001}},
    "n_step 1.5": {"state": {("options", "n_step"): 1.5}},
    "n_step true": {"state": {("options", "n_step"): True}},
    "n_step '3'": {"state": {("options", "n_step"): "3"}},
    "gamma 2": {"state": {("options", "gamma"): 2.0}},
    "gamma -0.5": {"state": {("options", "gamma"): -0.5}},
    "gamma NaN": {"state": {("options", "gamma"): math.nan}},
    "gamma '0.9'": {"state": {("options", "gamma"): "0.9"}},
    "padding_type zero": {"state": {("options", "padding_type"): "zero"}},
    "padding_type other": {"state": {("options", "padding_type"): "edge"}},
    "frame_stack 3": {"state": {("options", "frame_stack"): 3}},
    "compact false": {"state": {("options", "compact"): False}},
    "streams dropped": {"state": {("extra", "streams"): None}},
}


@pytest.mark.parametrize("layout", ["compact", "compressed zstd"])
@pytest.mark.parametrize("version", [2, 1])
@pytest.mark.parametrize("case", sorted(COMPACT_FORGERIES))
def test_a_forged_compact_checkpoint_is_refused(tmp_path: Path, case: str, version: int, layout: str) -> None:
    path, _ = _saved(tmp_path, layout)
    _forge(path, version, **COMPACT_FORGERIES[case])
    with pytest.raises(CheckpointError):
        ReplayBuffer.load(path)


def test_a_compact_checkpoint_without_env_table_still_loads(tmp_path: Path) -> None:
    """The first compact checkpoints stored no env per row: they load, checked without it."""
    path, original = _saved(tmp_path, "compact")
    manifest = _manifest(path)
    rel = _file_of(manifest, "streams.env.bin")
    del manifest["state"]["extra"]["streams"]["env"], manifest["files"][rel]
    (path / rel).unlink()
    _rewrite(path, manifest)
    assert _behaviour(ReplayBuffer.load(path)) == _behaviour(original)


@pytest.mark.parametrize(("option", "value"), [("n_step", 2), ("n_step", 1), ("gamma", 0.5)])
def test_a_compact_checkpoint_with_another_valid_option_is_one_rlbuf_could_write(tmp_path: Path, option: str,
                                                                                 value: Any) -> None:
    """The stream tables do not depend on ``n_step`` or ``gamma``: the forged checkpoint is exactly
    the one a buffer built with the other value and fed the same steps writes."""
    path, _ = _saved(tmp_path, "compact")
    _forge(path, state={("options", option): value})
    loaded = ReplayBuffer.load(path)
    genuine = compact(**{option: value})
    assert loaded.check_valid() == (True, "")
    assert _behaviour(loaded) == _behaviour(genuine)


def test_padding_type_shows_through_a_young_open_episode(tmp_path: Path) -> None:
    """``padding_type`` shows in the stored state through an open episode younger than the stack
    (env 1 starts one at the last step): its stack kept for the next add holds the padding."""
    path, _ = _saved(tmp_path, "compact")
    manifest = _manifest(path)
    assert manifest["state"]["options"]["padding_type"] == "reset"
    _forge(path, state={("options", "padding_type"): "zero"})
    with pytest.raises(CheckpointError, match="padding_type"):
        ReplayBuffer.load(path)


# -- random edits of every table and counter, every layout ------------------------------------
INDEX_FILES = ("streams.back.bin", "streams.next.bin", "streams.terminated.bin", "streams.truncated.bin",
               "streams.final_slot.bin", "streams.last.bin", "streams.env.bin", "sampler.sum_leaves.bin",
               "sampler.min_leaves.bin", "fields.done.bin", "finals.free.bin")
COUNTERS = (("size",), ("cursor",), ("write_count",))


@pytest.fixture(scope="module")
def genuine_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Any]]:
    made = {}
    for layout in LAYOUTS:
        path, buffer = _saved(tmp_path_factory.mktemp(layout.replace(" ", "-")), layout)
        made[layout] = (path, _behaviour(type(buffer).load(path)))
    return made


def _copy(source: Path, target: Path) -> Path:
    target.mkdir()
    (target / "tensors").mkdir()
    for item in source.rglob("*"):
        if item.is_file():
            (target / item.relative_to(source)).write_bytes(item.read_bytes())
    return target


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(layout=st.sampled_from(sorted(LAYOUTS)), data=st.data())
def test_a_random_edit_of_a_table_or_counter_is_refused_or_changes_nothing(
        genuine_checkpoints: dict[str, tuple[Path, Any]], tmp_path_factory: pytest.TempPathFactory, layout: str,
        data: st.DataObject) -> None:
    source, genuine = genuine_checkpoints[layout]
    path = _copy(source, tmp_path_factory.mktemp("forged") / "ckpt")
    manifest = _manifest(path)
    files = [rel for rel in manifest["files"] if rel.endswith(INDEX_FILES) and manifest["files"][rel]["bytes"]]
    target = data.draw(st.sampled_from([*files, *COUNTERS]))
    if isinstance(target, tuple):
        value = data.draw(st.integers(-2, 3 * CAPACITY) | st.sampled_from([True, 1.0, None, "1", 2**64]))
        _set(manifest, target, value)
        _rewrite(path, manifest)
    else:
        entry = manifest["files"][target]
        count = math.prod(entry["shape"])
        position = data.draw(st.integers(0, count - 1))
        if entry["dtype"] == "bool":
            new: Any = data.draw(st.booleans())
        elif entry["dtype"].startswith("float"):
            new = data.draw(st.floats(allow_nan=True, allow_infinity=True, width=32))
        else:
            new = data.draw(st.integers(-3 * CAPACITY, 3 * CAPACITY))
        _edit_tensor(path, manifest, target, lambda t: t.view(-1).__setitem__(position, new))
        _rewrite(path, manifest)
    kind = {"rollout": RolloutBuffer, "distillation": DistillationBuffer}.get(layout, ReplayBuffer)
    _refused_or_alike(path, kind, genuine)


# -- a refused load_state_dict changes nothing ------------------------------------------------
def _state_edits(layout: str) -> dict[str, Callable[[dict[str, Any]], None]]:
    edits: dict[str, Callable[[dict[str, Any]], None]] = {
        "cursor": lambda s: s.__setitem__("cursor", (s["cursor"] + 1) % s["capacity"]),
        "write count": lambda s: s.__setitem__("write_count", s["write_count"] + 1),
        "an option": lambda s: s["options"].__setitem__("num_envs", 7),
        "extra state key": lambda s: s["extra"].__setitem__("surprise", True),
        "rng": lambda s: s["rng"].__setitem__("sample", torch.zeros(5056, dtype=torch.uint8)),
        "rng of no device's size": lambda s: s["rng"].__setitem__("epochs", torch.zeros(3, dtype=torch.uint8)),
        "done": lambda s: s["fields"]["done"].__setitem__(0, ~s["fields"]["done"][0]) if "done" in s["fields"]
        else s["fields"].pop("obs"),
    }
    if layout.startswith("compact"):
        edits["stream next"] = lambda s: s["extra"]["streams"]["next"].__setitem__(2, 99)
        edits["stream terminated"] = lambda s: s["extra"]["streams"]["terminated"].__setitem__(
            0, ~s["extra"]["streams"]["terminated"][0])
        edits["final slot"] = lambda s: s["extra"]["streams"]["final_slot"].fill_(-1)
        edits["no final slot but -1"] = lambda s: s["extra"]["streams"]["final_slot"].masked_fill_(
            s["extra"]["streams"]["final_slot"] == -1, -101)
        edits["more final slots than rows"] = _more_final_slots_than_rows
    if layout == "prioritized":
        edits["priority of an empty row"] = lambda s: s["sampler"]["sum_leaves"].__setitem__(-1, 1.0)
        edits["alpha"] = lambda s: s["sampler"].__setitem__("alpha", 0.9)
    if layout == "rollout":
        edits["attached of other length"] = lambda s: s["extra"]["attached"].__setitem__("x", torch.zeros(3))
        edits["advantages flag"] = lambda s: s["extra"].__setitem__("advantages_ready", 1)
    return edits


def _more_final_slots_than_rows(state: dict[str, Any]) -> None:
    """Free final-observation slots past the capacity: one rlbuf never keeps (a row releases its slot first)."""
    finals, extra = state["extra"]["streams"]["finals"], state["capacity"] + 1
    top = finals["frames"].shape[0]
    finals["frames"] = torch.cat((finals["frames"], torch.zeros((extra, *finals["frames"].shape[1:]),
                                                                  dtype=finals["frames"].dtype)))
    finals["free"] = torch.cat((finals["free"], torch.arange(top, top + extra)))


@pytest.mark.parametrize(("layout", "case"), [(layout, case) for layout in sorted(LAYOUTS)
                                              for case in sorted(_state_edits(layout))])
def test_a_refused_load_state_dict_leaves_the_buffer_exactly_as_it_was(layout: str, case: str) -> None:
    state = LAYOUTS[layout]().state_dict()
    _state_edits(layout)[case](state)
    target = LAYOUTS[layout]()
    if not isinstance(target, RolloutBuffer):
        target.sample(4)
    before = snapshot(target)
    with pytest.raises(CheckpointError):
        target.load_state_dict(state)
    assert same(snapshot(target), before)
    assert target.check_valid() == (True, "")


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_check_valid_finds_what_a_load_refuses(layout: str) -> None:
    """``check_valid`` runs the load check: tables damaged in place are found."""
    buffer = LAYOUTS[layout]()
    assert buffer.check_valid() == (True, "")
    ring = buffer._ring
    ring.flush()
    if layout.startswith("compact"):
        buffer._compact.streams.terminated[0] ^= True
    elif layout == "prioritized":
        ring.rb.sampler._leaves()[0][-1] = 3.0
    else:
        size, cursor, count = ring.counters()
        _torchrl.set_counts(ring.rb, cursor=(cursor + 1) % ring.capacity, write_count=count, size=size)
    valid, reason = buffer.check_valid()
    assert not valid and reason


def test_load_state_reads_a_forged_checkpoint_only_after_its_checksums(tmp_path: Path) -> None:
    path, _ = _saved(tmp_path, "compact")
    manifest = _manifest(path)
    _edit_tensor(path, manifest, "streams.back.bin", _flip(5))  # checksum not recomputed
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="mismatch"):
        load_state(path, kind="ReplayBuffer")


def test_a_state_with_a_part_rlbuf_never_writes_is_refused(tmp_path: Path) -> None:
    path, _ = _saved(tmp_path, "plain")
    _forge(path, state={("prefetch",): {"module": "os", "call": "system"}})
    with pytest.raises(CheckpointError, match="prefetch"):
        ReplayBuffer.load(path)


INSPECT_FORGERIES: dict[str, tuple[dict[tuple[Any, ...], Any], str]] = {
    "size": ({("size",): 5}, r"state: size 5, cursor 6, write count 22 do not fit capacity 16"),
    "capacity option": ({("options", "capacity"): 100}, r"state: capacity 16, but the options .* make it 100"),
    "field dtype": ({("spec", 0, "dtype"): "float64"},
                    r"state: field 'obs' is stored as \('float32', \[16, 3\]\), expected float64 of shape \[16, 3\]"),
    "kind": ({("kind",): "RolloutBuffer"}, r"state: options of a RolloutBuffer: num_steps must be an int"),
    "size NaN": ({("size",): math.nan}, r"state: size must be an int in \[0, 2\*\*63\), got nan"),
    "field key": ({("spec", 0, "key"): [1, 2]}, r"state: spec\[0\]: expected a name, a key \(a str or list of str\)"),
    "versions": ({}, r"versions: expected a table of package names to version strings, got \[1, 2\]"),
}


@pytest.mark.parametrize("case", sorted(INSPECT_FORGERIES))
def test_rlbuf_inspect_refuses_a_forged_manifest_load_refuses(tmp_path: Path, case: str,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    from rlbuf.cli import main

    path, _ = _saved(tmp_path, "plain")
    state, reason = INSPECT_FORGERIES[case]
    _forge(path, state=state)
    if case == "versions":
        manifest = _manifest(path)
        _rewrite(path, {**manifest, "versions": [1, 2]})
    with pytest.raises(CheckpointError):
        ReplayBuffer.load(path)
    assert main(["inspect", str(path)]) == 1
    out = capsys.readouterr().out
    assert re.search(rf"^status      FAILED: {re.escape(str(path / 'manifest.json'))}: {reason}", out, re.MULTILINE)
    assert main(["inspect", str(path), "--json"]) == 1
    report = json.loads(capsys.readouterr().out, parse_constant=lambda constant: pytest.fail(f"not JSON: {constant}"))
    assert report["ok"] is False and re.search(reason, report["error"])


@pytest.mark.parametrize("data", [True, False])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_rlbuf_inspect_passes_a_genuine_checkpoint_of_each_layout(tmp_path: Path, layout: str, data: bool) -> None:
    from rlbuf._inspect import inspect_checkpoint

    buffer = LAYOUTS[layout]()
    buffer.save(tmp_path / "ckpt", data=data)
    report = inspect_checkpoint(tmp_path / "ckpt")
    assert (report["ok"], report["error"], report["size"]) == (True, None, len(buffer))


def test_an_iterator_its_method_would_not_make_of_the_state_is_refused_before_any_row_changes() -> None:
    """The load makes the saved iterator again once the rows are in: the check must refuse first what that call
    would refuse (epochs() of a compact buffer, minibatches() of a rollout without advantages)."""
    def compact(reward: float) -> ReplayBuffer:
        buffer = ReplayBuffer(16, obs_shape=(1,), action_shape=(), compact=True, seed=0)
        for t in range(6):
            buffer.add(torch.full((1,), float(t)), 0.0, reward, torch.full((1,), t + 1.0), t == 5, truncated=False)
        return buffer

    plain = ReplayBuffer(16, obs_shape=(1,), action_shape=(), seed=0)
    for _ in range(2):
        plain.add(torch.zeros(1), 0.0, 0.0, torch.zeros(1), False, truncated=False)
    plain.epochs(batch_size=2)
    state, target = compact(1.0).state_dict(), compact(2.0)
    state["iterator"] = plain.state_dict()["iterator"]
    before = snapshot(target)
    with pytest.raises(CheckpointError, match=r"an epochs\(\) iterator of a compact buffer"):
        target.load_state_dict(state)
    assert same(snapshot(target), before)
    rollout = RolloutBuffer(2, 1, obs_shape=(1,), action_shape=())
    for _ in range(2):
        rollout.add(torch.zeros(1, 1), torch.zeros(1), torch.ones(1), torch.zeros(1, dtype=torch.bool), torch.zeros(1),
                    torch.zeros(1), truncated=False)
    rollout.compute_returns_and_advantages(torch.zeros(1))
    rollout.minibatches(batch_size=1)
    state = rollout.state_dict()
    state["extra"]["advantages_ready"] = False
    with pytest.raises(CheckpointError, match=r"a minibatches\(\) iterator of a rollout whose advantages are not"):
        RolloutBuffer(2, 1, obs_shape=(1,), action_shape=()).load_state_dict(state)
