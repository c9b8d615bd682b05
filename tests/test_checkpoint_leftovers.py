"""What killed saves leave beside a checkpoint is removed by the next load or save of that path, and
never what a live save (another thread, another process) is still writing; saves keep no spare by default."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _versions import loaded_version, versioned_state

from rlbuf import ReplayBuffer
from rlbuf import checkpoint as checkpoint_module
from rlbuf.checkpoint import RowFiles, load_state, remove_stale_saves, save_state

ROOT = Path(__file__).resolve().parents[1]

# Saves version 1 of a buffer, then starts saving version 2 and stops after two of its tensor files
# are written, saying so: the parent then kills it with SIGKILL.
SAVER = """
import sys, torch
import rlbuf.checkpoint as checkpoint
from rlbuf import ReplayBuffer
path = sys.argv[1]
buffer = ReplayBuffer(256, obs_shape=(64,), action_shape=(), num_envs=64, seed=0)

def fill(version):
    for _ in range(4):
        buffer.add(torch.full((64, 64), float(version)), torch.zeros(64), torch.full((64,), float(version)),
                   torch.full((64, 64), float(version)), torch.zeros(64, dtype=torch.bool),
                   torch.zeros(64, dtype=torch.bool))

fill(1)
buffer.save(path)
fill(2)
write, calls = checkpoint._write_tensor, []

def write_then_stop(tensor, target):
    entry = write(tensor, target)
    calls.append(target)
    if len(calls) == 2:
        print("mid-save", flush=True)
        sys.stdin.read()  # never returns: the parent kills this process here
    return entry

checkpoint._write_tensor = write_then_stop
buffer.save(path)
"""


def _siblings(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir() if p.name.startswith(f".{path.name}."))


def _kill_mid_save(path: Path) -> list[str]:
    """Run SAVER and SIGKILL it in the middle of its second save; what it left beside ``path``."""
    process = subprocess.Popen([sys.executable, "-c", SAVER, str(path)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)}, text=True)
    assert process.stdout is not None
    try:
        assert process.stdout.readline() == "mid-save\n"
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    assert process.returncode == -signal.SIGKILL
    return _siblings(path)


def test_a_load_removes_what_a_save_killed_mid_way_left(tmp_path: Path) -> None:
    path = tmp_path / "ckpt"
    left = _kill_mid_save(path)
    [temporary] = [name for name in left if ".tmp-" in name]
    assert len(os.listdir(tmp_path / temporary / "tensors")) == 2  # the two files it wrote before the kill
    assert [name for name in left if ".lock-" in name] == [temporary.replace(".tmp-", ".lock-")]  # no longer locked
    loaded = ReplayBuffer.load(path)
    assert _siblings(path) == []  # the temporary and the lock file of the killed save are gone
    batch = loaded.sample_all()
    assert len(loaded) == 256 and loaded.check_valid() == (True, "")
    assert bool((batch.reward == 1.0).all()) and bool((batch.obs == 1.0).all())  # version 1, whole
    assert bool((batch.next_obs == 1.0).all())


def test_a_save_removes_what_a_save_killed_mid_way_left(tmp_path: Path) -> None:
    path = tmp_path / "ckpt"
    _kill_mid_save(path)
    save_state(versioned_state(7), path)
    assert _siblings(path) == [] and loaded_version(path) == 7


def _blocking_state(entered: Callable[[], None], wait: Callable[[], None]) -> Callable[[RowFiles], dict[str, Any]]:
    """A save's state that, once its temporary directory and lock exist, waits before being written."""
    def make(rows: RowFiles) -> dict[str, Any]:
        del rows
        entered()
        wait()
        return versioned_state(2)
    return make


def test_a_load_never_removes_the_temporaries_of_a_save_running_in_another_thread(tmp_path: Path) -> None:
    path = tmp_path / "ckpt"
    save_state(versioned_state(1), path)
    entered, release, errors = threading.Event(), threading.Event(), []

    def save() -> None:
        try:
            save_state(_blocking_state(entered.set, release.wait), path)
        except BaseException as error:  # reported below
            errors.append(error)

    thread = threading.Thread(target=save)
    thread.start()
    try:
        assert entered.wait(60)
        [temporary] = [name for name in _siblings(path) if ".tmp-" in name]
        assert loaded_version(path) == 1  # a load meanwhile: the previous version, its cleanup skipping the live save
        assert remove_stale_saves(path) == []
        assert temporary in _siblings(path)
    finally:
        release.set()
        thread.join()
    assert errors == [] and loaded_version(path) == 2 and _siblings(path) == []


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_load_never_removes_the_temporaries_of_a_save_running_in_another_process(tmp_path: Path) -> None:
    path = tmp_path / "ckpt"
    save_state(versioned_state(1), path)
    entered_read, entered_write = os.pipe()
    go_read, go_write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover (runs in the child)
        code = 1
        try:
            save_state(_blocking_state(lambda: os.write(entered_write, b"1") and None,
                                       lambda: os.read(go_read, 1) and None), path)
            code = 0
        finally:
            os._exit(code)
    try:
        assert os.read(entered_read, 1) == b"1"
        [temporary] = [name for name in _siblings(path) if ".tmp-" in name]
        assert loaded_version(path) == 1
        assert temporary in _siblings(path)
    finally:
        os.write(go_write, b"1")
        _, status = os.waitpid(child, 0)
        for fd in (entered_read, entered_write, go_read, go_write):
            os.close(fd)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0  # the save finished: nothing pulled from under it
    assert loaded_version(path) == 2 and _siblings(path) == []


def test_a_load_where_leftovers_cannot_be_removed_still_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A read-only directory (root ignores ``chmod``, hence the stand-in): the load is not refused."""
    path = tmp_path / "ckpt"
    save_state(versioned_state(1), path)
    stale = tmp_path / ".ckpt.tmp-0123456789ab"
    (stale / "tensors").mkdir(parents=True)

    def refused(directory: Path) -> None:
        raise PermissionError(13, "Permission denied", str(directory))

    monkeypatch.setattr(checkpoint_module, "remove", refused)
    assert loaded_version(path) == 1 and stale.is_dir()
    monkeypatch.undo()
    assert loaded_version(path) == 1 and not stale.exists()


def test_load_state_of_a_missing_checkpoint_removes_nothing_else(tmp_path: Path) -> None:
    other = tmp_path / ".other.tmp-0123456789ab"
    other.mkdir()
    with pytest.raises(checkpoint_module.CheckpointError):
        load_state(tmp_path / "ckpt", kind="Demo")
    assert other.is_dir()
