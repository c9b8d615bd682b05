"""Checkpoint saves: killed at any moment, replacing only checkpoints, a full disk, the spare that
the next save rewrites in place, loads during saves."""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import queue
import random
import re
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from _lockstep import add_steps, assert_same, make
from _versions import loaded_version, versioned_state, whole_version

from rlbuf import (
    CheckpointError,
    ReplayBuffer,
)
from rlbuf import checkpoint as checkpoint_module
from rlbuf._manifest import read_manifest
from rlbuf.checkpoint import MANIFEST, load_state

REPO = Path(__file__).resolve().parents[1]


# -- saves killed at any moment -----------------------------------------------------------------
_SAVER = r"""
import logging, os, sys
import torch
torch.set_num_threads(1)  # no thread pool before fork
logging.getLogger("torchrl").setLevel(logging.WARNING)
import rlbuf.checkpoint
from rlbuf import ReplayBuffer

rows = int(sys.argv[1])
buf = ReplayBuffer(rows, obs_shape=(48,), action_shape=(4,), num_envs=rows, seed=0)
swap = rlbuf.checkpoint.exchange

def crash_before_swap(a, b):
    os._exit(0)

def crash_after_swap(a, b):
    swap(a, b)
    os._exit(0)

def save(mode, version, path):
    # runs in a forked child: saves version, version + 1, ... to path ('loop') or one version
    if mode == "crash-before-swap":
        rlbuf.checkpoint.exchange = crash_before_swap
    if mode == "crash-after-swap":
        rlbuf.checkpoint.exchange = crash_after_swap
    while True:
        value = torch.full((rows,), float(version))
        buf.add(obs=value[:, None].expand(rows, 48), action=value[:, None].expand(rows, 4), reward=value,
                next_obs=value[:, None].expand(rows, 48), terminated=torch.zeros(rows, dtype=torch.bool), truncated=False)
        buf.save(path)
        print(version, flush=True)
        if mode != "loop":
            os._exit(0)
        version += 1

child = 0
for line in sys.stdin:
    if line.strip() == "sync":  # answered after every line a dead child wrote: the pipe keeps order
        print("synced", flush=True)
        continue
    if child:
        os.waitpid(child, 0)
    mode, version, path = line.split(maxsplit=2)
    child = os.fork()
    if child == 0:
        save(mode, int(version), path.strip())
    print("forked", child, flush=True)
"""


class Saver:
    """A process that forks children saving numbered versions of a buffer, to kill at any moment.

    Forking from one process that has imported torch already keeps each kill point cheap.
    Version ``v`` holds ``v`` in every row of every float field.
    """

    rows = 60_000  # 24 MB per save

    def __init__(self, log: Path) -> None:
        self._log = log
        self._process = subprocess.Popen(
            [sys.executable, "-c", _SAVER, str(self.rows)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=log.open("w"), text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
        self._lines: queue.Queue[str] = queue.Queue()
        self.saved: list[int] = []  # versions reported saved, in order
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            self._lines.put(line.strip())
        self._lines.put("")

    def _next(self) -> str:
        line = self._lines.get(timeout=120)
        assert line, f"the saver process ended: {self._log.read_text()[-2000:]}"
        if line.isdigit():
            self.saved.append(int(line))
        return line

    def start(self, mode: str, version: int, path: Path) -> int:
        """Fork a child saving from ``version`` on; return a pidfd for it."""
        assert self._process.stdin is not None
        self._process.stdin.write(f"{mode} {version} {path}\n")
        self._process.stdin.flush()
        while not (line := self._next()).startswith("forked"):
            pass
        return os.pidfd_open(int(line.split()[1]))

    def wait_saved(self, version: int) -> None:
        while version not in self.saved:
            self._next()

    def sync(self) -> None:
        """Read every line that children which have ended wrote."""
        assert self._process.stdin is not None
        self._process.stdin.write("sync\n")
        self._process.stdin.flush()
        while self._next() != "synced":
            pass

    def close(self) -> None:
        assert self._process.stdin is not None
        self._process.stdin.close()
        self._process.wait(timeout=60)


def wait_dead(pidfd: int) -> None:
    ready, _, _ = select.select([pidfd], [], [], 60)
    os.close(pidfd)
    assert ready, "the saving child did not end"


def kill(pidfd: int) -> None:
    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    wait_dead(pidfd)


def version_at(path: Path) -> int:
    """The version a checkpoint holds, checking that every row of every field is of that one version."""
    loaded = ReplayBuffer.load(path)
    batch = loaded.sample_all()
    loaded.close()
    version = batch.reward[0].item()
    assert len(batch) == Saver.rows
    for name in ("obs", "action", "reward", "next_obs"):
        assert bool((getattr(batch, name) == version).all()), f"{name} mixes versions"
    return int(version)


def leftovers(path: Path) -> list[Path]:
    """Temporary directories of killed saves (their lock files are not checkpoints, the spare is no leftover)."""
    return sorted(p for p in path.parent.iterdir()
                  if p.name.startswith(f".{path.name}.") and p.is_dir() and p.name != f".{path.name}.spare")


@pytest.fixture(scope="module")
def saver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Saver]:
    if not hasattr(os, "pidfd_open") or not hasattr(os, "fork"):
        pytest.skip("needs Linux (fork, pidfd)")
    probe = tmp_path_factory.mktemp("exchange")
    (probe / "a").mkdir()
    (probe / "b").mkdir()
    if not checkpoint_module.exchange(probe / "a", probe / "b"):
        pytest.skip("this filesystem cannot swap directories atomically (no RENAME_EXCHANGE)")
    process = Saver(tmp_path_factory.mktemp("saver") / "stderr.txt")
    yield process
    process.close()


def test_a_save_killed_at_any_moment_leaves_one_whole_version(saver: Saver, tmp_path: Path) -> None:
    path = tmp_path / "ckpt"
    rng = random.Random(7)
    found: list[tuple[int, int]] = []
    for round_ in range(1, 8):
        first = 1000 * round_
        pidfd = saver.start("loop", first, path)
        saver.wait_saved(first + rng.randrange(3))
        time.sleep(rng.uniform(0, 0.08))  # a seeded moment within the next save or two
        kill(pidfd)
        version = version_at(path)
        found.append((first, version))
        for leftover in leftovers(path):
            with pytest.raises(CheckpointError, match="left by an interrupted save"):
                ReplayBuffer.load(leftover)
            os.rename(leftover, tmp_path / "renamed")
            with contextlib.suppress(CheckpointError):  # unfinished, or whole: the next version
                # (killed before its swap) or the one it replaced
                assert version_at(tmp_path / "renamed") in (version - 1, version + 1)
            shutil.rmtree(tmp_path / "renamed")
    saver.sync()
    for first, version in found:
        last = max(v for v in saver.saved if first <= v < first + 1000)
        assert version in (last, last + 1)  # the last reported save, or one killed after its swap


def test_a_save_killed_just_before_or_after_the_swap(saver: Saver, tmp_path: Path) -> None:
    path = tmp_path / "ckpt"
    wait_dead(saver.start("once", 1, path))
    assert version_at(path) == 1
    wait_dead(saver.start("crash-before-swap", 2, path))
    [unfinished] = leftovers(path)  # looked at before a load of path removes it
    with pytest.raises(CheckpointError, match=rf"{re.escape(str(unfinished))}: left by an interrupted save .* the "
                                              rf"checkpoint is {re.escape(str(path))} \(rename"):
        read_manifest(unfinished)
    os.rename(unfinished, tmp_path / "never-swapped-in")
    assert version_at(path) == 1
    assert version_at(tmp_path / "never-swapped-in") == 2  # whole, but not the checkpoint
    wait_dead(saver.start("crash-after-swap", 3, path))
    [superseded] = leftovers(path)
    with pytest.raises(CheckpointError, match="left by an interrupted save"):
        ReplayBuffer.load(superseded)
    os.rename(superseded, tmp_path / "superseded")
    assert version_at(path) == 3
    assert version_at(tmp_path / "superseded") == 1
    wait_dead(saver.start("once", 4, path))  # a later save swaps in over the debris
    assert version_at(path) == 4


# -- refusing to overwrite, a full disk -------------------------------------------------------------
def test_save_replaces_only_a_checkpoint_or_an_empty_directory(tmp_path: Path) -> None:
    buf = make("replay")
    add_steps([buf], "replay", torch.Generator().manual_seed(0), 3)
    results = tmp_path / "results"
    results.mkdir()
    (results / "notes.txt").write_text("mine")
    with pytest.raises(CheckpointError, match=rf"{re.escape(str(results))}: exists and is not an rlbuf checkpoint"):
        buf.save(results)
    (results / MANIFEST).write_text('{"name": "a web app"}')
    with pytest.raises(CheckpointError, match=rf"{re.escape(str(results))}: exists and is not an rlbuf checkpoint"):
        buf.save(results)
    (tmp_path / "file").write_text("mine")
    with pytest.raises(CheckpointError, match="exists and is not a directory"):
        buf.save(tmp_path / "file")
    assert sorted(os.listdir(results)) == [MANIFEST, "notes.txt"]
    assert (tmp_path / "file").read_text() == "mine"
    (tmp_path / "empty").mkdir()
    buf.save(tmp_path / "empty")
    buf.save(tmp_path / "empty")  # now a checkpoint: replaced
    assert len(ReplayBuffer.load(tmp_path / "empty")) == len(buf)
    assert sorted(os.listdir(tmp_path)) == ["empty", "file", "results"]  # the replaced one removed: no spare by default


def test_saving_through_a_symlink_replaces_the_link_and_leaves_its_target(tmp_path: Path) -> None:
    buf = make("replay")
    data = torch.Generator().manual_seed(0)
    add_steps([buf], "replay", data, 2)
    buf.save(tmp_path / "run-1")
    (tmp_path / "latest").symlink_to(tmp_path / "run-1")
    add_steps([buf], "replay", data, 2)
    buf.save(tmp_path / "latest")
    assert len(ReplayBuffer.load(tmp_path / "latest")) == 8
    assert len(ReplayBuffer.load(tmp_path / "run-1")) == 4
    assert sorted(os.listdir(tmp_path)) == ["latest", "run-1"]


@pytest.mark.parametrize("second_rename_fails", [False, True])
def test_without_an_atomic_swap_a_save_replaces_the_checkpoint_or_keeps_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, second_rename_fails: bool
) -> None:
    monkeypatch.setattr(checkpoint_module, "exchange", lambda a, b: False)  # a filesystem without RENAME_EXCHANGE
    buf = make("replay")
    data = torch.Generator().manual_seed(0)
    add_steps([buf], "replay", data, 2)
    path = tmp_path / "ckpt"
    buf.save(path)
    before = buf.sample_all()
    add_steps([buf], "replay", data, 2)
    if second_rename_fails:
        rename = os.rename

        def rename_once(source: Any, target: Any) -> None:
            if Path(target) == path and Path(source).name.startswith(".ckpt.tmp-"):  # the second of the two
                raise enospc(str(target))
            rename(source, target)
        monkeypatch.setattr(os, "rename", rename_once)
        with pytest.raises(CheckpointError, match="the disk is full"):
            buf.save(path)
        monkeypatch.undo()
    else:
        buf.save(path)
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]  # the replaced version removed, or the failed save's files
    assert_same([ReplayBuffer.load(path).sample_all(), before if second_rename_fails else buf.sample_all()])


def test_state_that_is_not_json_or_tensors_is_refused_before_writing(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"state\.extra\.1: cannot store a object in a checkpoint"):
        checkpoint_module.save_state({"kind": "Demo", "extra": [1, object()]}, tmp_path / "ckpt")
    assert os.listdir(tmp_path) == []


def enospc(where: str) -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), where)


@pytest.mark.parametrize("failing", ["tensor write", "tensor fsync", "manifest fsync"])
def test_a_full_disk_fails_the_save_and_keeps_the_previous_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    buf = make("prioritized", capacity=32, num_envs=4)
    data = torch.Generator().manual_seed(0)
    add_steps([buf], "prioritized", data, 5)
    path = tmp_path / "ckpt"
    buf.save(path)
    before = ReplayBuffer.load(path).sample_all()
    files = len(read_manifest(path)["files"])
    add_steps([buf], "prioritized", data, 3)  # new contents, partly written when the disk fills
    calls = itertools.count()
    if failing == "tensor write":
        write = checkpoint_module._write_tensor

        def write_until_full(tensor: torch.Tensor, target: Path) -> dict[str, Any]:
            if next(calls) == 2:
                target.write_bytes(b"\0" * 7)
                raise enospc(str(target))
            return write(tensor, target)
        monkeypatch.setattr(checkpoint_module, "_write_tensor", write_until_full)
    else:
        fsync, fail_at = os.fsync, 1 if failing == "tensor fsync" else files

        def fsync_until_full(fd: int) -> None:
            if next(calls) == fail_at:
                raise enospc("fsync")
            fsync(fd)
        monkeypatch.setattr(os, "fsync", fsync_until_full)
    with pytest.raises(CheckpointError, match=rf"{re.escape(str(path))}: saving failed: the disk is full; the "
                                              rf"previous checkpoint, if any, is untouched"):
        buf.save(path)
    assert next(calls) > (2 if failing == "tensor write" else fail_at)  # the failure did happen where meant
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ["ckpt"]  # no temporary directory left
    assert_same([ReplayBuffer.load(path).sample_all(), before])
    buf.save(path)  # space again: the new contents go in
    assert_same([ReplayBuffer.load(path).sample_all(), buf.sample_all()])


def test_a_full_disk_on_a_first_save_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    buf = make("replay")
    add_steps([buf], "replay", torch.Generator().manual_seed(0), 2)

    def full(tensor: torch.Tensor, target: Path) -> dict[str, Any]:
        raise enospc(str(target))
    monkeypatch.setattr(checkpoint_module, "_write_tensor", full)
    with pytest.raises(CheckpointError, match="the disk is full"):
        buf.save(tmp_path / "ckpt")
    assert os.listdir(tmp_path) == []


# -- the spare: the replaced version's files, rewritten in place by the next save ----------------
def _inodes(path: Path) -> dict[str, int]:
    return {p.name: p.stat().st_ino for p in (path / "tensors").iterdir()}


def test_a_save_rewrites_the_files_of_the_version_it_replaced_one_save_earlier(tmp_path: Path) -> None:
    path = tmp_path / "ckpt"
    checkpoint_module.save_state(versioned_state(1), path)
    first = _inodes(path)
    checkpoint_module.save_state(versioned_state(2), path, keep_spare=True)
    spare = tmp_path / ".ckpt.spare"
    assert _inodes(spare) == first and not (spare / MANIFEST).exists()  # kept, and never loadable
    checkpoint_module.save_state(versioned_state(3), path, keep_spare=True)
    assert _inodes(path) == first  # the same files, rewritten in place: their disk blocks reused
    assert loaded_version(path) == 3
    assert checkpoint_module.remove_spare(path) and sorted(os.listdir(tmp_path)) == ["ckpt"]
    checkpoint_module.save_state(versioned_state(4), path, keep_spare=True)  # without a spare: new files
    assert loaded_version(path) == 4 and sorted(os.listdir(tmp_path)) == [".ckpt.spare", "ckpt"]
    spared = _inodes(spare)
    checkpoint_module.save_state(versioned_state(5), path)  # rewrites the spare's files; keeps no spare
    assert _inodes(path) == spared and sorted(os.listdir(tmp_path)) == ["ckpt"] and loaded_version(path) == 5


def test_saves_keep_no_spare_by_default(tmp_path: Path) -> None:
    path = tmp_path / "ckpt"
    for version in (1, 2, 3):
        checkpoint_module.save_state(versioned_state(version), path)
        assert sorted(os.listdir(tmp_path)) == ["ckpt"] and loaded_version(path) == version
    buf = make("replay")
    add_steps([buf], "replay", torch.Generator().manual_seed(0), 2)
    buf.save(path)
    buf.save(path, keep_spare=True)
    assert sorted(os.listdir(tmp_path)) == [".ckpt.spare", "ckpt"]
    buf.save(path)
    assert sorted(os.listdir(tmp_path)) == ["ckpt"] and len(ReplayBuffer.load(path)) == len(buf)


def test_a_save_never_rewrites_files_a_load_still_maps(tmp_path: Path) -> None:
    path = tmp_path / "ckpt"
    checkpoint_module.save_state(versioned_state(1), path, keep_spare=True)
    held = load_state(path, kind="Demo")  # maps of version 1's files, e.g. a load still copying
    first = _inodes(path)
    checkpoint_module.save_state(versioned_state(2), path, keep_spare=True)
    checkpoint_module.save_state(versioned_state(3), path, keep_spare=True)  # would rewrite version 1's files in place
    assert whole_version(held) == 1
    assert not set(_inodes(path).values()) & set(first.values())
    assert loaded_version(path) == 3
    del held
    checkpoint_module.save_state(versioned_state(4), path, keep_spare=True)  # version 2's files are free: rewritten
    assert loaded_version(path) == 4


def test_a_hard_linked_backup_of_a_checkpoint_survives_later_saves(tmp_path: Path) -> None:
    path, backup = tmp_path / "ckpt", tmp_path / "backup"
    checkpoint_module.save_state(versioned_state(1), path, keep_spare=True)
    shutil.copytree(path, backup, copy_function=os.link)  # `cp -al`: the same inodes
    for version in (2, 3, 4):
        checkpoint_module.save_state(versioned_state(version), path, keep_spare=True)
    assert loaded_version(backup) == 1 and loaded_version(path) == 4


def test_a_forged_spare_is_never_written_through(tmp_path: Path) -> None:
    path, victim_dir = tmp_path / "ckpt", tmp_path / "victim"
    victim_dir.mkdir()
    victim = victim_dir / "precious.txt"
    victim.write_text("mine")
    checkpoint_module.save_state(versioned_state(1), path, keep_spare=True)
    checkpoint_module.save_state(versioned_state(2), path, keep_spare=True)
    spare = tmp_path / ".ckpt.spare"
    names = sorted(os.listdir(spare / "tensors"))
    (spare / "tensors" / names[0]).unlink()
    (spare / "tensors" / names[0]).symlink_to(victim)          # a link where a tensor file was
    (spare / "tensors" / names[1]).unlink()
    os.mkfifo(spare / "tensors" / names[1])                      # a FIFO where another was
    (spare / "tensors" / "state.extra.bin").write_bytes(b"junk")  # a file no save writes
    (spare / "notes").mkdir()
    checkpoint_module.save_state(versioned_state(3), path, keep_spare=True)
    assert victim.read_text() == "mine" and loaded_version(path) == 3
    shutil.rmtree(tmp_path / ".ckpt.spare")
    (tmp_path / ".ckpt.spare").symlink_to(victim_dir)           # the spare itself a link
    checkpoint_module.save_state(versioned_state(4), path, keep_spare=True)
    checkpoint_module.save_state(versioned_state(5), path, keep_spare=True)
    assert os.listdir(victim_dir) == ["precious.txt"] and victim.read_text() == "mine"
    assert loaded_version(path) == 5


def test_loads_during_saves_each_get_one_whole_version(tmp_path: Path) -> None:
    path = tmp_path / "ckpt"
    checkpoint_module.save_state(versioned_state(1), path)
    stop, versions, errors = threading.Event(), [], []

    def load_repeatedly() -> None:
        while not stop.is_set():
            try:
                versions.append(loaded_version(path))
            except BaseException as error:  # reported below
                errors.append(error)
                return

    reader = threading.Thread(target=load_repeatedly)
    reader.start()
    try:
        for version in range(2, 40):
            checkpoint_module.save_state(versioned_state(version), path)
    finally:
        stop.set()
        reader.join()
    assert errors == [] and len(versions) > 0 and versions == sorted(versions)
