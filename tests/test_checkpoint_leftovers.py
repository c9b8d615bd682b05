"""What killed saves leave beside a checkpoint is removed by the next load or save of that path, and
never what a live save (another thread, another process) is still writing; saves keep no spare by default."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _versions import loaded_version, versioned_state

from rlbuf import ReplayBuffer
from rlbuf import checkpoint as checkpoint_module
from rlbuf.checkpoint import RowFiles, load_state, remove_stale_saves, save_state

ROOT = Path(__file__).resolve().parents[1]

# Saves version 1, then versions 2, 3, ... of a buffer large enough that a save takes a while;
# prints each version once it is saved.
SAVER = """
import sys, torch
from rlbuf import ReplayBuffer
path = sys.argv[1]
buffer = ReplayBuffer(8192, obs_shape=(512,), action_shape=(), num_envs=1024, seed=0)
for version in range(1, 1_000_000):
    for start in range(0, 8192, 1024):
        buffer.add(torch.full((1024, 512), float(version)), torch.zeros(1024), torch.full((1024,), float(version)),
                   torch.zeros(1024, 512), torch.zeros(1024, dtype=torch.bool), torch.zeros(1024, dtype=torch.bool))
    buffer.save(path)
    print(version, flush=True)
"""


def _siblings(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir() if p.name.startswith(f".{path.name}."))


def _kill_mid_save(path: Path) -> tuple[int, list[str]]:
    """Run SAVER, SIGKILL it while a ``.<name>.tmp-*`` of its second or later save is being written;
    the last version it reported and what it left."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for _ in range(20):
        process = subprocess.Popen([sys.executable, "-c", SAVER, str(path)],
                                   stdout=subprocess.PIPE, env=env, text=True)
        assert process.stdout is not None
        try:
            assert int(process.stdout.readline()) >= 1  # one whole checkpoint exists
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # until the next save writes its tensor files
                temporaries = list(path.parent.glob(f".{path.name}.tmp-*/tensors/*"))
                if temporaries:
                    break
                time.sleep(0.001)
        finally:
            process.send_signal(signal.SIGKILL)
            process.wait()
        last = max(int(line) for line in [1, *process.stdout.read().split()])
        left = _siblings(path)
        if any(".tmp-" in name for name in left):
            return last, left
    pytest.fail("no kill landed within a save in 20 tries")


def test_a_load_removes_what_a_save_killed_mid_way_left(tmp_path: Path) -> None:
    path = tmp_path / "ckpt"
    last, left = _kill_mid_save(path)
    assert any(name.startswith(".ckpt.lock-") for name in left)  # its lock file, no longer locked by anyone
    loaded = ReplayBuffer.load(path)
    assert _siblings(path) == []  # every temporary and lock file of the killed save is gone
    batch = loaded.sample_all()
    version = float(batch.reward[0])
    assert version in (last, last + 1)  # the last reported save, or one killed after its swap
    assert bool((batch.reward == version).all()) and bool((batch.obs == version).all())  # one whole version
    assert len(loaded) == 8192 and loaded.check_valid() == (True, "")


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
