"""Attacks on the spare and the locks of saves: loads racing saves, full disks, files that cannot be
rewritten, links swapped in mid-save, saves killed in each phase of reusing the spare.

Every save here keeps the spare (``keep_spare=True``; off by default): the spare is what these tests attack."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from _replays import filled, same_state
from _versions import loaded_version, versioned_state

from rlbuf import DistillationBuffer, ReplayBuffer, RolloutBuffer
from rlbuf import checkpoint as checkpoint_module
from rlbuf._inspect import inspect_checkpoint
from rlbuf._manifest import read_manifest
from rlbuf.checkpoint import RowFiles, load_state
from rlbuf.errors import CheckpointError


def save_state(state: dict[str, Any] | Callable[[RowFiles], dict[str, Any]], path: Path) -> None:
    """``rlbuf.checkpoint.save_state`` keeping the spare (looked up at each call: tests patch the module)."""
    checkpoint_module.save_state(state, path, keep_spare=True)


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    path = tmp_path / "ckpt"
    filled(prioritized=True, stats=True).save(path, keep_spare=True)
    return path


# -- the spare: saves that rewrite the replaced version's files in place -------------------------




def _saving_on_open(path: Path, name: str, version: int, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Make ``os.open`` of a file called ``name`` save ``version`` to ``path`` first (once)."""
    real_open, saved = os.open, []

    def open_after_a_save(file: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if not saved and Path(file).name == name and not flags & (os.O_WRONLY | os.O_RDWR):
            saved.append(version)
            save_state(versioned_state(version, odd_names=True), path)
        return real_open(file, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", open_after_a_save)
    return saved


@pytest.mark.parametrize("reader", ["load_state", "read_manifest"])
def test_a_save_swapping_in_other_file_names_mid_load_is_read_again(tmp_path: Path, reader: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "ckpt"
    save_state(versioned_state(1, odd_names=True), path)  # lists state.odd.bin; version 2 lists state.even.bin
    saved = _saving_on_open(path, "state.odd.bin", 2, monkeypatch)
    if reader == "load_state":
        assert loaded_version(path) == 2  # not FileNotFoundError: the file vanished with its version
    else:
        assert "tensors/state.even.bin" in read_manifest(path)["files"]  # not a spurious "missing"
    assert saved == [2]


def test_a_save_swapping_in_a_new_version_mid_read_manifest_is_no_corruption(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "ckpt"
    save_state(versioned_state(1), path)
    saved = _saving_on_open(path, "state.x.bin", 2, monkeypatch)
    manifest = read_manifest(path)
    assert saved == [2] and manifest == json.loads((path / "manifest.json").read_text())


@pytest.mark.parametrize("code", [errno.EACCES, errno.ELOOP, errno.ENXIO, errno.ETXTBSY])
def test_a_spare_file_that_cannot_be_opened_for_writing_is_replaced(tmp_path: Path, code: int,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A read-only file (``chmod a-w``; root ignores it, hence the stand-in), a link or FIFO raced in."""
    path = tmp_path / "ckpt"
    save_state(versioned_state(1), path)
    save_state(versioned_state(2), path)
    real_open, created = os.open, []

    def refusing(file: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if flags & os.O_CREAT:
            created.append(Path(file).name)
        elif flags & os.O_WRONLY and Path(file).name == "state.x.bin":
            raise OSError(code, os.strerror(code), str(file))
        return real_open(file, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", refusing)
    save_state(versioned_state(3), path)
    monkeypatch.undo()
    assert loaded_version(path) == 3
    assert "state.x.bin" in created and "state.even.bin" not in created  # a new file; the other rewritten


def _failing_write(code: int, after: int) -> Callable[..., int]:
    real_write, calls = os.write, [0]

    def write(fd: int, data: Any) -> int:
        calls[0] += 1
        if calls[0] > after:
            raise OSError(code, os.strerror(code))
        return real_write(fd, data)
    return write


@pytest.mark.parametrize("after", [0, 1, 2])
def test_a_full_disk_while_rewriting_the_spare_leaves_the_checkpoint_whole(tmp_path: Path, after: int,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "ckpt"
    for version in (1, 2):
        save_state(versioned_state(version), path)
    monkeypatch.setattr(os, "write", _failing_write(errno.ENOSPC, after))
    with pytest.raises(CheckpointError, match="the disk is full; the previous checkpoint, if any, is untouched"):
        save_state(versioned_state(3), path)
    monkeypatch.undo()
    assert loaded_version(path) == 2
    # The first write is the lock file's (the spare is not claimed yet); later ones rewrite the
    # claimed spare, which goes with the failed save.
    assert sorted(p.name for p in tmp_path.iterdir()) == ([".ckpt.spare"] if after == 0 else []) + ["ckpt"]
    save_state(versioned_state(4), path)
    assert loaded_version(path) == 4


def test_a_full_disk_when_taking_the_save_lock_is_a_checkpoint_error(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "ckpt"
    save_state(versioned_state(1), path)
    real_open = os.open

    def full(file: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if ".lock-" in Path(file).name:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(file))
        return real_open(file, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", full)
    with pytest.raises(CheckpointError, match="the disk is full"):
        save_state(versioned_state(2), path)
    monkeypatch.undo()
    assert loaded_version(path) == 1 and sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def _inodes(directory: Path) -> set[int]:
    return {p.stat().st_ino for p in (directory / "tensors").iterdir()}


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc")
def test_saves_and_loads_failing_or_not_leave_no_descriptor_or_lock_behind(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "ckpt"
    save_state(versioned_state(0), path)
    before = _open_fds()
    for version in range(1, 4):
        save_state(versioned_state(version, odd_names=True), path)
        assert loaded_version(path) == version
        with pytest.raises(CheckpointError, match="not a Other"):
            load_state(path, kind="Other")
        read_manifest(path)
    with monkeypatch.context() as patch:  # a save failing mid-rewrite, a load retried once
        patch.setattr(os, "write", _failing_write(errno.ENOSPC, 2))
        with pytest.raises(CheckpointError, match="disk is full"):
            save_state(versioned_state(9), path)
    with monkeypatch.context() as patch:
        _saving_on_open(path, "state.odd.bin", 4, patch)
        assert loaded_version(path) == 4
    broken = tmp_path / "broken"
    save_state(versioned_state(5), broken)
    (broken / "tensors" / "state.x.bin").write_bytes(bytes(300 * 4 * 4))
    with pytest.raises(CheckpointError, match="mismatch"):
        load_state(broken, kind="Demo")
    assert _open_fds() == before  # every descriptor closed, so every shared lock released
    spare = _inodes(tmp_path / ".ckpt.spare")
    save_state(versioned_state(7, odd_names=True), path)  # the spare's file names (version 3's)
    assert _inodes(path) == spare  # nothing holds a lock on the spare: its files were rewritten in place


@pytest.mark.parametrize("storage", ["memory", "memmap"])
def test_a_loaded_buffer_holds_no_lock_on_its_checkpoint(tmp_path: Path, storage: str) -> None:
    path = tmp_path / "ckpt"
    buffer = ReplayBuffer(16, obs_shape=(3,), action_shape=(), seed=0, storage=storage,  # type: ignore[arg-type]
                          scratch_dir=tmp_path / "scratch" if storage == "memmap" else None)
    buffer.add(torch.ones(3), 0.0, 1.0, torch.ones(3), False, truncated=False)
    buffer.save(path, keep_spare=True)
    loaded = ReplayBuffer.load(path)
    first = _inodes(path)
    buffer.save(path, keep_spare=True)
    buffer.save(path, keep_spare=True)  # rewrites the files of the version `loaded` came from: it keeps no map of them
    assert _inodes(path) == first
    assert len(loaded) == 1 and torch.equal(loaded.sample_all().obs, torch.ones(1, 3))






def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _arm(phase: str) -> None:
    """In a forked child: SIGKILL this process at ``phase`` of its next save (or remove_spare)."""
    import rlbuf.checkpoint as checkpoint
    if phase == "claimed":  # the spare renamed to this save's staging directory, nothing rewritten
        claim = checkpoint.claim_spare
        checkpoint.claim_spare = lambda *args: (claim(*args), _die())  # type: ignore[assignment]
    elif phase == "rewriting":  # the spare's first file rewritten in place, the second not yet
        write, calls = os.write, [0]

        def dying_write(fd: int, data: Any) -> int:
            calls[0] += 1
            if calls[0] == 3:  # 1: the lock file, 2: the first tensor
                _die()
            return write(fd, data)
        os.write = dying_write
    elif phase == "swapped":  # the new version in place, the replaced one not yet the spare
        checkpoint.keep_as_spare = lambda *args: _die()
    elif phase in ("demoting", "removing"):  # manifest gone, not yet renamed / spare set aside, not removed
        rename = os.rename

        def dying_rename(source: Any, target: Any) -> None:
            rename(source, target)
            name = Path(target).name
            if name.endswith(".spare") if phase == "demoting" else ".old-" in name:
                _die()
        os.rename = dying_rename  # type: ignore[assignment]


KILL_PHASES = {"claimed": 2, "rewriting": 2, "swapped": 3, "demoting": 3, "removing": 2}


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.parametrize("phase", sorted(KILL_PHASES))
def test_a_save_killed_in_each_phase_of_reusing_the_spare(tmp_path: Path, phase: str) -> None:
    path = tmp_path / "ckpt"
    states = [versioned_state(version, odd_names=True) for version in range(5)]
    save_state(states[1], path)
    save_state(states[2], path)  # version 1 is now the spare
    child = os.fork()
    if child == 0:  # pragma: no cover (the child is killed)
        try:
            _arm(phase)
            if phase == "removing":
                checkpoint_module.remove_spare(path)
            else:
                save_state(states[3], path)
        finally:
            os._exit(1)
    _, status = os.waitpid(child, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    assert loaded_version(path) == KILL_PHASES[phase]  # whole: before the swap the old version, after it the new one
    save_state(states[4], path)  # cleans up what the kill left
    assert loaded_version(path) == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == [".ckpt.spare", "ckpt"]
    assert not (tmp_path / ".ckpt.spare" / "manifest.json").exists()


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim"
    victim.mkdir()
    for name in ("state.x.bin", "state.even.bin", "precious.txt"):
        (victim / name).write_text("mine")
    return victim


def _untouched(victim: Path) -> bool:
    return sorted(os.listdir(victim)) == ["precious.txt", "state.even.bin", "state.x.bin"] and all(
        (victim / name).read_text() == "mine" for name in os.listdir(victim))


SPARE_FORGERIES: dict[str, Callable[[Path, Path], None]] = {
    "tensors/ a link to another directory": lambda spare, victim: (
        _rmtree(spare / "tensors"), (spare / "tensors").symlink_to(victim)),
    "a file hard-linked to another": lambda spare, victim: (
        (spare / "tensors" / "state.x.bin").unlink(), os.link(victim / "state.x.bin", spare / "tensors" / "state.x.bin")),
    "a directory named like a tensor file": lambda spare, victim: (
        (spare / "tensors" / "state.x.bin").unlink(), (spare / "tensors" / "state.x.bin").mkdir(),
        (spare / "tensors" / "state.x.bin" / "inner.bin").symlink_to(victim / "precious.txt")),
    "a socket named like a tensor file": lambda spare, victim: (
        (spare / "tensors" / "state.x.bin").unlink(), _bind(spare / "tensors" / "state.x.bin")),
    "a link to a file in a directory named like a tensor file": lambda spare, victim: (
        (spare / "tensors" / "state.x.bin").unlink(), (spare / "tensors" / "state.x.bin").symlink_to(victim)),
    "tensors/ a regular file": lambda spare, victim: (_rmtree(spare / "tensors"), (spare / "tensors").write_text("x")),
    "the spare a regular file": lambda spare, victim: (_rmtree(spare), spare.write_text("x")),
    "the spare a link to a checkpoint": lambda spare, victim: (
        _rmtree(spare), save_state(versioned_state(7), victim.parent / "other"), spare.symlink_to(victim.parent / "other")),
    "a stale manifest and a pickle in the spare": lambda spare, victim: (
        (spare / "manifest.json").write_text((victim.parent / "ckpt" / "manifest.json").read_text()),
        (spare / "tensors" / "evil.pt").write_bytes(b"pickle")),
}


def _rmtree(path: Path) -> None:
    import shutil
    shutil.rmtree(path)


def _bind(path: Path) -> None:
    import socket
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.close()


@pytest.mark.parametrize("case", sorted(SPARE_FORGERIES))
def test_a_forged_spare_is_never_written_through_nor_loaded(tmp_path: Path, case: str) -> None:
    path, victim = tmp_path / "ckpt", _victim(tmp_path)
    save_state(versioned_state(1), path)
    save_state(versioned_state(2), path)
    SPARE_FORGERIES[case](tmp_path / ".ckpt.spare", victim)
    other = sorted(os.listdir(tmp_path / "other" / "tensors")) if (tmp_path / "other").exists() else None
    save_state(versioned_state(3), path)
    save_state(versioned_state(4), path)
    assert _untouched(victim) and loaded_version(path) == 4
    if other is not None:  # the checkpoint the link named is left whole
        assert sorted(os.listdir(tmp_path / "other" / "tensors")) == other and loaded_version(tmp_path / "other") == 7
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [".ckpt.spare", "ckpt", "victim", *(["other"] if other is not None else [])])


def _swap_for_link(where: str, staging: Path, victim: Path) -> None:
    """Replace ``staging/tensors`` or ``staging`` itself by a link to ``victim`` (a racing process)."""
    moved = victim.parent / f"moved-{where}"
    if where == "tensors":
        os.rename(staging / "tensors", moved)
        (staging / "tensors").symlink_to(victim)
    else:
        os.rename(staging, moved)
        (victim / "tensors").symlink_to(victim)
        staging.symlink_to(victim)


def _staging(tmp_path: Path) -> Path:
    [staging] = tmp_path.glob(".ckpt.tmp-*")
    return staging


@pytest.mark.parametrize("where", ["tensors", "staging"])
@pytest.mark.parametrize("moment", ["after the claim", "before the patch", "before removing unlisted files"])
def test_a_link_swapped_in_during_a_save_never_leads_it_outside_its_directory(
        tmp_path: Path, where: str, moment: str, monkeypatch: pytest.MonkeyPatch) -> None:
    path, victim = tmp_path / "ckpt", _victim(tmp_path)
    (victim / "state.fields.x.bin").write_text("mine")
    save_state(versioned_state(1), path)
    save_state(versioned_state(2), path)  # version 1, the spare, has state.x.bin and state.even.bin
    state: Any = versioned_state(3)
    if moment == "after the claim":
        claim = checkpoint_module.claim_spare

        def racing_claim(checkpoint: Path, staging: Path) -> None:
            claim(checkpoint, staging)
            _swap_for_link(where, staging, victim)
        monkeypatch.setattr(checkpoint_module, "claim_spare", racing_claim)
    elif moment == "before the patch":
        def state(rows: checkpoint_module.RowFiles) -> dict[str, Any]:
            leaves = {"x": torch.full((300, 4), 3.0)}
            rows.copy(leaves, 300)
            _swap_for_link(where, _staging(tmp_path), victim)
            return {"kind": "Demo", "x": rows.patch(leaves, [(0, 10)], 300)["x"]}
    else:
        write, calls = checkpoint_module._write_tensor, []

        def racing_write(tensor: torch.Tensor, target: Path) -> dict[str, Any]:
            calls.append(target)
            entry = write(tensor, target)
            if len(calls) == 2:  # the last file written: next, the spare's unlisted files are removed
                _swap_for_link(where, _staging(tmp_path), victim)
            return entry
        monkeypatch.setattr(checkpoint_module, "_write_tensor", racing_write)
    with pytest.raises(CheckpointError):
        save_state(state, path)
    monkeypatch.undo()
    names = sorted(os.listdir(victim))
    assert {"precious.txt", "state.x.bin", "state.even.bin", "state.fields.x.bin"} <= set(names)
    assert all((victim / name).read_text() == "mine" for name in names if not (victim / name).is_symlink())
    assert loaded_version(path) == 2


@pytest.mark.parametrize("code", [errno.EPERM, errno.EBUSY, errno.EACCES])
def test_a_spare_that_cannot_be_claimed_never_fails_a_save(tmp_path: Path, code: int,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """E.g. a ``.ckpt.spare`` of another user in a sticky directory (/tmp), or a mount point."""
    path = tmp_path / "ckpt"
    save_state(versioned_state(1), path)
    save_state(versioned_state(2), path)
    real_rename = os.rename

    def refusing(source: Any, target: Any) -> None:
        if Path(source).name == ".ckpt.spare":
            raise OSError(code, os.strerror(code), str(source))
        real_rename(source, target)

    monkeypatch.setattr(os, "rename", refusing)
    save_state(versioned_state(3), path)  # writes new files; the version it replaces cannot become the spare either
    monkeypatch.undo()
    assert loaded_version(path) == 3 and sorted(p.name for p in tmp_path.iterdir()) == [".ckpt.spare", "ckpt"]


@pytest.mark.parametrize("code", [errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP])
def test_a_checkpoint_on_a_file_system_without_locks_still_loads_and_inspects(
        saved: Path, code: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """NFS without lockd (ENOLCK), Lustre mounted without ``flock`` (ENOSYS): loads worked before the spare."""
    def no_locks(fd: int, operation: int) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    assert len(ReplayBuffer.load(saved)) == 10
    assert inspect_checkpoint(saved)["ok"] is True and read_manifest(saved)["format"] == "rlbuf-checkpoint"
    with pytest.raises(CheckpointError, match="saving failed"):  # saves need locks: none runs there
        filled().save(saved)


def test_three_threads_saving_to_one_path_while_another_loads_and_frees_the_spare(tmp_path: Path) -> None:
    path = tmp_path / "ckpt"
    save_state(versioned_state(0, odd_names=True), path)
    errors: list[BaseException] = []
    done = threading.Event()

    def guarded(work: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                work()
            except BaseException as error:  # reported below
                errors.append(error)
        return run

    def saves(first: int) -> Callable[[], None]:
        return guarded(lambda: [save_state(versioned_state(version, odd_names=True), path) for version in range(first, first + 30)])

    def loads() -> None:
        while not done.is_set():
            loaded_version(path)
            checkpoint_module.remove_spare(path)

    savers = [threading.Thread(target=saves(1 + 100 * i)) for i in range(3)]
    loader = threading.Thread(target=guarded(loads))
    for thread in [loader, *savers]:
        thread.start()
    for thread in savers:
        thread.join()
    done.set()
    loader.join()
    assert errors == []
    assert loaded_version(path) % 100 == 30
    assert set(os.listdir(tmp_path)) <= {".ckpt.spare", "ckpt"}


def test_a_spare_left_by_another_kind_size_storage_or_a_data_free_save_is_reused_correctly(tmp_path: Path) -> None:
    path = tmp_path / "ckpt"
    replay = filled(prioritized=True, stats=True)
    memmap = ReplayBuffer(64, obs_shape=(5,), action_shape=(), storage="memmap", scratch_dir=tmp_path / "scratch", seed=1)
    for i in range(40):
        memmap.add(torch.full((5,), float(i)), 1.0, float(i), torch.zeros(5), False, truncated=False)
    rollout = RolloutBuffer(4, 2, obs_shape=(3,), action_shape=())
    rollout.add(torch.ones(2, 3), torch.zeros(2), torch.ones(2), torch.zeros(2, dtype=torch.bool), torch.ones(2),
                torch.zeros(2), truncated=False)
    distill = DistillationBuffer(32, obs_shape=(3,), action_shape=())
    distill.add(torch.full((3,), 2.0), 1.0)
    sequence: list[tuple[Any, bool]] = [(replay, True), (memmap, True), (rollout, True), (replay, False),
                                        (distill, True), (memmap, False), (memmap, True), (replay, True)]
    for step, (buffer, data) in enumerate(sequence):
        buffer.save(path, data=data, keep_spare=True)
        if data:
            loaded = type(buffer).load(path)
            assert len(loaded) == len(buffer) and loaded.check_valid() == (True, "")
            assert same_state(loaded.state_dict(), buffer.state_dict())
        else:
            with pytest.warns(Warning, match="data=False"):
                assert len(type(buffer).load(path)) == 0
        assert sorted(p.name for p in tmp_path.iterdir() if p.name != "scratch") == [".ckpt.spare"] * (step > 0) + ["ckpt"]


def test_two_first_saves_to_one_path_both_succeed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The other save makes the checkpoint between this one's check that there is none and its rename."""
    path, real_rename, raced = tmp_path / "ckpt", os.rename, []

    def racing(source: Any, target: Any) -> None:
        if Path(target) == path and not raced:
            raced.append(True)
            save_state(versioned_state(1), path)
        real_rename(source, target)

    monkeypatch.setattr(os, "rename", racing)
    save_state(versioned_state(2), path)
    monkeypatch.undo()
    assert raced and loaded_version(path) == 2 and sorted(os.listdir(tmp_path)) == [".ckpt.spare", "ckpt"]


def test_a_directory_made_at_the_path_mid_save_is_never_replaced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path, real_rename = tmp_path / "ckpt", os.rename

    def racing(source: Any, target: Any) -> None:
        if Path(target) == path and not path.exists():
            path.mkdir()
            (path / "results.csv").write_text("mine")
        real_rename(source, target)

    monkeypatch.setattr(os, "rename", racing)
    with pytest.raises(CheckpointError, match="not an rlbuf checkpoint"):
        save_state(versioned_state(2), path)
    monkeypatch.undo()
    assert os.listdir(path) == ["results.csv"] and sorted(os.listdir(tmp_path)) == ["ckpt"]


def test_a_short_write_while_patching_rows_never_loses_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``write`` on an unbuffered file may take part of what it is given (a signal, a nearly full disk)."""
    real_open = open

    class ShortWrites:
        def __init__(self, file: Any) -> None:
            self._file = file

        def __enter__(self) -> ShortWrites:
            return self

        def __exit__(self, *exc: object) -> None:
            self._file.close()

        def write(self, data: Any) -> int:
            return int(self._file.write(bytes(data)[:max(1, len(data) // 2)]))

        def __getattr__(self, name: str) -> Any:
            return getattr(self._file, name)

    def opening(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        opened = real_open(file, mode, *args, **kwargs)
        return ShortWrites(opened) if mode == "r+b" else opened

    def state(rows: checkpoint_module.RowFiles) -> dict[str, Any]:
        leaves = {"x": torch.zeros(100, 4)}
        rows.copy(leaves, 100)
        leaves["x"][10:60] = 7.0  # rows a writer changed during the copy
        return {"kind": "Demo", "x": rows.patch(leaves, [(10, 60)], 100)["x"]}

    monkeypatch.setattr(checkpoint_module, "open", opening, raising=False)
    save_state(state, tmp_path / "ckpt")
    monkeypatch.undo()
    expected = torch.zeros(100, 4)
    expected[10:60] = 7.0
    assert torch.equal(load_state(tmp_path / "ckpt", kind="Demo")["x"], expected)


def test_a_lock_file_left_by_a_save_killed_while_taking_it_is_removed_once_old(tmp_path: Path) -> None:
    path = tmp_path / "ckpt"
    old, fresh = tmp_path / ".ckpt.lock-0123456789ab.new", tmp_path / ".ckpt.lock-aaaaaaaaaaaa.new"
    old.write_text("123")
    fresh.write_text("456")  # may be a live save's, about to lock and rename it
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    filled().save(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [fresh.name, "ckpt"]
