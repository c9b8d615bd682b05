"""Attacks on checkpoints: forged manifests (checksums recomputed), damaged payloads, escaping paths,
saves killed mid-way, stale temporaries, refused loads, exit status, resource refusals, loads while
other processes save (the spare, locks and races of saves: tests/test_attack_spare.py).

``-m stress`` repeats the SIGKILL and loads-during-saves loops ``RLBUF_STRESS_REPEATS`` times (``nox -s stress``).
"""

from __future__ import annotations

import fcntl
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import xxhash
from _replays import filled, same_state
from _versions import versioned_state, whole_version

from rlbuf import ConfigError, DistillationBuffer, ReplayBuffer, RolloutBuffer
from rlbuf._inspect import inspect_checkpoint
from rlbuf.checkpoint import load_state, remove_stale_saves, save_state
from rlbuf.errors import CheckpointError

REPEATS = int(os.environ.get("RLBUF_STRESS_REPEATS", "20"))
ROOT = Path(__file__).resolve().parents[1]


def _forge(path: Path, edit: Callable[[dict[str, Any]], None],
           payload: Callable[[dict[str, Any]], None] | None = None) -> None:
    """Edit the manifest (and optionally the tensor files), then recompute every checksum."""
    manifest = json.loads((path / "manifest.json").read_text())
    edit(manifest)
    if payload is not None:
        payload(manifest)
    for rel, entry in manifest["files"].items():
        if isinstance(entry, dict) and (path / rel).is_file() and not (path / rel).is_symlink():
            data = (path / rel).read_bytes()
            entry["xxh3_128"] = xxhash.xxh3_128(data).hexdigest()
    (path / "manifest.json").write_text(json.dumps(manifest))


def _file(manifest: dict[str, Any], name: str) -> str:
    return next(rel for rel in manifest["files"] if rel.endswith(f".{name}.bin"))


def _write_tensor(path: Path, manifest: dict[str, Any], name: str, tensor: torch.Tensor) -> None:
    (path / _file(manifest, name)).write_bytes(tensor.contiguous().numpy().tobytes())


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    path = tmp_path / "ckpt"
    filled(prioritized=True, stats=True).save(path)
    return path


def _set(keys: tuple[str, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(manifest: dict[str, Any]) -> None:
        target = manifest["state"]
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = value
    return edit


def _reward_entry(change: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    return lambda manifest: manifest["files"][_file(manifest, "reward")].update(change)


FORGERIES: dict[str, Callable[[dict[str, Any]], None]] = {
    "dtype edited, bytes unchanged": _reward_entry({"dtype": "int32"}),
    "shape edited": _reward_entry({"shape": [5, 2]}),
    "bytes edited": _reward_entry({"bytes": 7}),
    "negative shape": _reward_entry({"shape": [-10]}),
    "size 5.7": _set(("size",), 5.7),
    "size True": _set(("size",), True),
    "size beyond capacity": _set(("size",), 99),
    "cursor outside": _set(("cursor",), 16),
    "write count below size": _set(("write_count",), 3),
    "unknown iterator": _set(("iterator",), {"method": "shutil.rmtree", "arguments": {}, "state": {}}),
    "rng not a tensor": _set(("rng", "sample"), "seed"),
    "sampler not a table": _set(("sampler",), 3),
    "stats not a table": _set(("extra", "stats"), [1, 2]),
    "negative episode length": _set(("extra", "stats", "lengths"), [-3]),
    "kind changed": _set(("kind",), "RolloutBuffer"),
}


@pytest.mark.parametrize("case", sorted(FORGERIES))
def test_a_forged_manifest_with_valid_checksums_is_refused(saved: Path, case: str) -> None:
    _forge(saved, FORGERIES[case])
    with pytest.raises(CheckpointError):
        ReplayBuffer.load(saved)


def _nan_payload(name: str, position: int) -> Callable[[Path], Callable[[dict[str, Any]], None]]:
    def make(path: Path) -> Callable[[dict[str, Any]], None]:
        def payload(manifest: dict[str, Any]) -> None:
            rel = _file(manifest, name)
            entry = manifest["files"][rel]
            dtype = getattr(torch, entry["dtype"])
            tensor = torch.frombuffer(bytearray((path / rel).read_bytes()), dtype=dtype).clone()
            tensor[position] = float("nan") if dtype.is_floating_point else ~tensor[position]
            (path / rel).write_bytes(tensor.numpy().tobytes())
        return payload
    return make


PAYLOADS = {
    "NaN reward": _nan_payload("reward", 2),
    "NaN priority": _nan_payload("sum_leaves", 1),
    "done is not terminated | truncated": _nan_payload("done", 1),
}


@pytest.mark.parametrize("case", sorted(PAYLOADS))
def test_a_forged_payload_with_valid_checksums_is_refused(saved: Path, case: str) -> None:
    _forge(saved, lambda manifest: None, PAYLOADS[case](saved))
    with pytest.raises(CheckpointError):
        ReplayBuffer.load(saved)


def test_deeply_nested_json_gives_checkpoint_error_in_load_and_inspect(saved: Path) -> None:
    (saved / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(CheckpointError, match=r"nested too deeply|nested deeper"):
        ReplayBuffer.load(saved)
    report = inspect_checkpoint(saved)
    assert report["ok"] is False and "nested" in report["error"]


def test_nesting_just_under_the_recursion_limit_is_refused_too(saved: Path) -> None:
    manifest = json.loads((saved / "manifest.json").read_text())
    deep: Any = 0
    for _ in range(200):
        deep = [deep]
    manifest["state"]["extra"]["junk"] = deep
    (saved / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="nested deeper"):
        ReplayBuffer.load(saved)


@pytest.mark.parametrize("escape", ["absolute", "dotdot", "symlink"])
def test_inspect_and_load_never_read_a_file_outside_the_checkpoint(saved: Path, tmp_path: Path, escape: str) -> None:
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"\0" * 40)
    manifest = json.loads((saved / "manifest.json").read_text())
    rel = _file(manifest, "reward")
    entry = manifest["files"].pop(rel)
    entry.update(bytes=40, xxh3_128=xxhash.xxh3_128(secret.read_bytes()).hexdigest())
    if escape == "absolute":
        forged = str(secret)
    elif escape == "dotdot":
        forged = "tensors/../../secret.bin"
    else:
        forged = "tensors/link.bin"
        (saved / forged).symlink_to(secret)
    manifest["files"][forged] = entry
    (saved / "manifest.json").write_text(json.dumps(manifest))
    opened: list[str] = []
    real_open = open

    def spying_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        opened.append(os.path.realpath(file) if isinstance(file, (str, Path)) else str(file))
        return real_open(file, *args, **kwargs)

    import builtins
    builtins.open = spying_open
    try:
        report = inspect_checkpoint(saved)
        with pytest.raises(CheckpointError):
            ReplayBuffer.load(saved)
    finally:
        builtins.open = real_open
    assert report["ok"] is False
    assert str(secret) not in opened
    assert {f["path"]: f["status"] for f in report["files"]}[forged] in ("outside", "missing")


def _fingerprint(buffer: ReplayBuffer) -> list[Any]:
    state = buffer.state_dict()
    ring = buffer._ring
    return [state["size"], state["cursor"], state["write_count"],
            {k: v.clone() for k, v in state["fields"].items()}, state["sampler"], state["rng"],
            ring.generator.get_state(), buffer._epoch_generator.get_state(), buffer.current_epochs,
            None if buffer.stats is None else buffer.stats.state_dict()]


REFUSED_STATES: dict[str, Callable[[dict[str, Any]], None]] = {
    "NaN reward": lambda s: s["fields"]["reward"].__setitem__(0, float("nan")),
    "reward as float64": lambda s: s["fields"].__setitem__("reward", s["fields"]["reward"].double()),
    "missing field": lambda s: s["fields"].pop("obs"),
    "size as float": lambda s: s.__setitem__("size", float(s["size"])),
    "bad sampler": lambda s: s["sampler"].__setitem__("sum_leaves", torch.ones(3)),
    "NaN priority": lambda s: s["sampler"]["sum_leaves"].__setitem__(0, float("nan")),
    "bad rng": lambda s: s["rng"].__setitem__("epochs", torch.zeros(3)),
    "bad stats": lambda s: s["extra"]["stats"].__setitem__("running_length", torch.tensor([-1])),
    "bad iterator state": lambda s: s["iterator"]["state"].__setitem__("n_epochs", 99),
}


@pytest.mark.parametrize("case", sorted(REFUSED_STATES))
def test_a_refused_load_state_dict_leaves_the_buffer_exactly_as_it_was(case: str) -> None:
    source = filled(prioritized=True, stats=True)
    iterator = source.epochs(batch_size=4, n_epochs=2)
    next(iterator)
    state = source.state_dict()
    REFUSED_STATES[case](state)
    target = filled(prioritized=True, stats=True)
    target.add(torch.zeros(3), 1.0, 9.0, torch.zeros(3), False, truncated=False)
    running = target.epochs(batch_size=2)
    next(running)
    before = _fingerprint(target)
    with pytest.raises(CheckpointError):
        target.load_state_dict(state)
    after = _fingerprint(target)
    assert all(same_state(a, b) for a, b in zip(before, after, strict=True))
    assert target.current_epochs is running and target.check_valid() == (True, "")


SAVER = """
import sys, torch
from rlbuf import ReplayBuffer
path, version = sys.argv[1], 0
buffer = ReplayBuffer(4096, obs_shape=(64,), action_shape=(), seed=0, prioritized=True)
while True:
    version += 1
    for _ in range(64):
        buffer.add(torch.full((64,), float(version)), 0.0, float(version), torch.zeros(64), False, truncated=False)
    buffer.save(path, keep_spare=True)
    print(version, flush=True)
"""


SPARE = ".ckpt.spare"


def _cloned(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, dict):
        return {k: _cloned(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_cloned(v) for v in value]
    return value


def _kill_saves(tmp_path: Path, kills: int, seed: int) -> dict[str, int]:
    """Kill a saving process at random moments; the checkpoint always loads, the last whole version,
    and the load removes what the kill left.

    Every version loaded stays mapped (a load still copying) while the later processes save: the
    spare (kept by these saves) has its files rewritten in place, but never those under a live map.
    """
    path, rng = tmp_path / "ckpt", random.Random(seed)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    loads = killed_temporaries = 0
    held: list[tuple[dict[str, Any], Any]] = []
    for _ in range(kills):
        process = subprocess.Popen([sys.executable, "-c", SAVER, str(path)], stdout=subprocess.PIPE, env=env, text=True)
        assert process.stdout is not None
        first = int(process.stdout.readline())  # one whole save exists
        time.sleep(rng.uniform(0, 0.3))  # a random moment within a later save
        process.send_signal(signal.SIGKILL)
        process.wait()
        last = max([first, *(int(line) for line in process.stdout.read().split())])
        # What this kill left beside the checkpoint; the load removes it.
        left = sum(1 for p in tmp_path.iterdir() if p.is_dir() and p.name.startswith(".ckpt.") and p.name != SPARE)
        assert left <= 1  # this kill's one temporary; those of earlier kills are gone: nothing accumulates
        killed_temporaries += left
        loaded = ReplayBuffer.load(path)
        if _age_locks_in_making(tmp_path):
            loaded = ReplayBuffer.load(path)  # older than a minute: no live save's, removed
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".ckpt.") and p.name != SPARE] == []
        version = int(loaded.sample_all().reward.max())
        assert version in (last, last + 1)  # the last reported save, or one killed after its swap
        assert loaded.check_valid() == (True, "")
        mapped = load_state(path, kind="ReplayBuffer")
        held.append((mapped, _cloned(mapped)))
        loads += 1
    filled().save(tmp_path / "other")
    ReplayBuffer(16, obs_shape=(3,), action_shape=()).save(path)  # keeps no spare: removes the one kept
    assert all(same_state(mapped, copy) for mapped, copy in held)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".ckpt.")] == []
    return {"kills": kills, "loads": loads, "temporaries_left_by_kills_then_removed": killed_temporaries}


def test_a_save_killed_at_random_moments_leaves_a_loadable_checkpoint(tmp_path: Path) -> None:
    _kill_saves(tmp_path, kills=2, seed=1)


@pytest.mark.stress
def test_stress_kill_saves(tmp_path: Path) -> None:
    figures = _kill_saves(tmp_path, kills=REPEATS, seed=2)
    print(f"\nSTRESS SIGKILL during save: {figures}")


def test_only_stale_temporaries_are_cleaned_up(tmp_path: Path) -> None:
    path = tmp_path / "ckpt"
    dead = tmp_path / ".ckpt.tmp-0123456789ab"          # no lock file: its save is gone
    (dead / "tensors").mkdir(parents=True)
    unlocked = tmp_path / ".ckpt.old-aaaaaaaaaaaa"      # lock file left, but nobody holds it
    unlocked.mkdir()
    (tmp_path / ".ckpt.lock-aaaaaaaaaaaa").write_text("123")
    live = tmp_path / ".ckpt.tmp-bbbbbbbbbbbb"          # a save in progress holds its lock
    live.mkdir()
    lock = os.open(tmp_path / ".ckpt.lock-bbbbbbbbbbbb", os.O_CREAT | os.O_RDWR)
    other = tmp_path / ".other.tmp-cccccccccccc"        # another checkpoint's: not ours to judge
    other.mkdir()
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        filled().save(path)
        names = sorted(p.name for p in tmp_path.iterdir())
        assert names == [".ckpt.lock-bbbbbbbbbbbb", ".ckpt.tmp-bbbbbbbbbbbb", ".other.tmp-cccccccccccc", "ckpt"]
    finally:
        os.close(lock)
    assert [p.name for p in remove_stale_saves(path)] == [".ckpt.lock-bbbbbbbbbbbb", ".ckpt.tmp-bbbbbbbbbbbb"]


def test_a_save_that_does_not_verify_keeps_the_previous_checkpoint(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "ckpt"
    filled().save(path)
    import rlbuf._manifest as manifest

    def corrupting(*args: Any) -> str:
        return "0" * 32

    monkeypatch.setattr(manifest, "_fd_digest", corrupting)
    with pytest.raises(CheckpointError, match="previous checkpoint"):
        ReplayBuffer(16, obs_shape=(3,), action_shape=()).save(path)
    monkeypatch.undo()
    assert len(ReplayBuffer.load(path)) == 10
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]


EXIT_SCRIPT = """
import torch
from rlbuf import DistillationBuffer, ReplayBuffer, RolloutBuffer
kind, storage, prioritized = {kind!r}, {storage!r}, {prioritized!r}
if kind == "replay":
    buffer = ReplayBuffer(100, obs_shape=(3,), action_shape=(), storage=storage, prioritized=prioritized)
    buffer.add(torch.zeros(3), 0.0, 1.0, torch.zeros(3), False, truncated=False)
elif kind == "rollout":
    buffer = RolloutBuffer(4, 1, obs_shape=(3,), action_shape=(), storage=storage)
    buffer.add(torch.zeros(3), 0.0, 1.0, False, 0.5, -0.1, truncated=False)
else:
    buffer = DistillationBuffer(100, obs_shape=(3,), action_shape=(), storage=storage)
    buffer.add(torch.zeros(3), 0.0)
"""

EXIT_CASES = [("replay", s, p) for s in ("memory", "memmap") for p in (False, True)] + [
    (k, s, False) for k in ("rollout", "distill") for s in ("memory", "memmap")]


def _exit_status(kind: str, storage: str, prioritized: bool) -> subprocess.CompletedProcess[str]:
    script = EXIT_SCRIPT.format(kind=kind, storage=storage, prioritized=prioritized)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False)


def test_a_script_whose_last_call_is_add_on_a_prioritized_buffer_exits_cleanly() -> None:
    result = _exit_status("replay", "memory", True)
    assert result.returncode == 0, result.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "storage", "prioritized"), EXIT_CASES)
def test_every_buffer_kind_exits_cleanly_after_an_add(kind: str, storage: str, prioritized: bool) -> None:
    result = _exit_status(kind, storage, prioritized)
    assert result.returncode == 0, result.stderr[-2000:]


@pytest.mark.parametrize("storage", ["memory", "memmap"])
def test_a_capacity_the_machine_cannot_hold_is_refused_before_allocating(tmp_path: Path, storage: str) -> None:
    scratch = tmp_path / "scratch"
    with pytest.raises(ConfigError, match=r"capacity: 1000000000000 rows of \d+ bytes need \d+ bytes, but only \d+"):
        ReplayBuffer(10**12, obs_shape=(64,), action_shape=(), storage=storage,  # type: ignore[arg-type]
                     scratch_dir=scratch if storage == "memmap" else None)
    assert not scratch.exists() or not any(scratch.rglob("*"))


def test_rollout_and_distillation_buffers_are_refused_too() -> None:
    with pytest.raises(ConfigError, match="bytes"):
        RolloutBuffer(10**9, 1000, obs_shape=(64,), action_shape=())
    with pytest.raises(ConfigError, match="bytes"):
        DistillationBuffer(10**12, obs_shape=(64,), action_shape=())


def _age_locks_in_making(directory: Path) -> bool:
    """Make each ``.ckpt.lock-<hex>.new`` in ``directory`` a minute old; whether there was one.

    A save killed between creating its lock file and locking it leaves one unlocked: a cleanup
    removes it only once it is older than a minute (it may be a live save's, about to lock it).
    """
    making = [p for p in directory.iterdir() if p.name.startswith(".ckpt.lock-") and p.name.endswith(".new")]
    for lock in making:
        os.utime(lock, (time.time() - 61, time.time() - 61))
    return bool(making)


# -- loads while other processes save ---------------------------------------------------------
def _sized_state(version: int) -> dict[str, Any]:
    """A versioned state of its own size and file names per version (the spare's files grow, shrink, go)."""
    return versioned_state(version, rows=100 + version % 7 * 50, odd_names=True)


def _fork_saver(path: Path, versions: list[int]) -> int:
    """A forked process saving ``versions`` to ``path`` in turn until killed; returns once one save is whole."""
    states = [_sized_state(version) for version in versions]  # made before the fork: the child only saves
    ready, tell = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover (killed by the parent)
        try:
            os.close(ready)
            for turn in itertools.count():
                save_state(states[turn % len(states)], path, keep_spare=True)
                if turn == 0:
                    os.write(tell, b"1")
        finally:
            os._exit(1)
    os.close(tell)
    try:
        assert os.read(ready, 1) == b"1"
    finally:
        os.close(ready)
    return child


def _loads_during_saves(tmp_path: Path, loads: int, savers: int) -> dict[str, int]:
    """Processes save to one path while this one loads, holding some loads' maps across saves."""
    path = tmp_path / "ckpt"
    held: list[tuple[int, dict[str, Any]]] = []
    seen: set[int] = set()
    children: list[int] = []
    try:
        for first in range(1, savers + 1):
            children.append(_fork_saver(path, list(range(first, first + 14 * savers, savers))))
        for i in range(loads):
            state = load_state(path, kind="Demo")  # must not fail: only saves run meanwhile
            seen.add(whole_version(state))
            if i % 8 == 0:
                held.append((whole_version(state), state))  # maps kept while later saves run
        for version, state in held:
            assert whole_version(state) == version  # no save rewrote the bytes behind a live map
        # Every saver still runs: no load removed a live save's temporaries (a save would fail, and its child exit).
        assert [os.waitpid(child, os.WNOHANG) for child in children] == [(0, 0)] * savers
    finally:
        for child in children:
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
    del held
    assert whole_version(load_state(path, kind="Demo")) > 0
    _age_locks_in_making(tmp_path)
    save_state(_sized_state(0), path)  # cleans up what the kills left, and keeps no spare
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    return {"savers": savers, "loads": loads, "versions_seen": len(seen)}


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_loads_in_one_process_while_two_others_save_to_the_same_path(tmp_path: Path) -> None:
    figures = _loads_during_saves(tmp_path, loads=60, savers=2)
    assert figures["versions_seen"] > 1


@pytest.mark.stress
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_stress_loads_during_saves(tmp_path: Path) -> None:
    print(f"\nSTRESS loads during saves: {_loads_during_saves(tmp_path, loads=40 * REPEATS, savers=3)}")
