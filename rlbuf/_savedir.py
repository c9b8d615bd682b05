"""The directory work of a checkpoint save: descriptors that follow no link, the spare, lock files, the swap.

A save marks its temporaries in use with a locked ``.<name>.lock-<hex>``, writes into a
temporary sibling (``.<name>.tmp-<hex>``, made from the previous version's spare when there is
one), and swaps it into place with one ``renameat2(RENAME_EXCHANGE)``; the version it replaced
is removed, or kept as the spare of the next save (``keep_spare=True``).
[`rlbuf.checkpoint`][rlbuf.checkpoint] drives these steps.

Example:
    >>> import tempfile
    >>> path = Path(tempfile.mkdtemp()) / "ckpt"
    >>> staging = path.parent / ".ckpt.tmp-0123456789ab"
    >>> claim_spare(path, staging)                      # no spare yet: a new, empty staging directory
    >>> sorted(p.name for p in staging.iterdir())
    ['tensors']
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import re
import shutil
import stat
import time
from collections.abc import Callable
from pathlib import Path

from rlbuf._manifest import FORMAT, MANIFEST, MAX_MANIFEST_BYTES, parse_manifest
from rlbuf.errors import CheckpointError

TENSOR_DIR = "tensors"


def directory_fd(staging: Path, *inside: str) -> int:
    """A descriptor of ``staging`` (or of a directory inside it), following no link below its parent.

    A save writes and removes files only through such descriptors, so a link that another
    process swaps in for the staging directory or its ``tensors/`` never leads it outside.
    """
    fd = os.open(staging.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    for name in (staging.name, *inside):
        try:
            inner = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
        finally:
            os.close(fd)
        fd = inner
    return fd


def opener(staging: Path) -> Callable[[str, int], int]:
    """An ``opener`` for ``open`` of files in ``staging``, following no link (see ``directory_fd``)."""
    def opener(file: str, flags: int) -> int:
        relative = Path(file).relative_to(staging)
        directory = directory_fd(staging, *relative.parts[:-1])
        try:
            return os.open(relative.name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=directory)
        finally:
            os.close(directory)
    return opener


def prune(staging: Path, *inside: str, keep: Callable[[os.DirEntry[str]], bool]) -> None:
    """Remove the entries of ``staging`` (or of a directory inside it) that ``keep`` refuses."""
    directory = directory_fd(staging, *inside)
    try:
        with os.scandir(directory) as scan:
            entries = list(scan)
        for entry in entries:
            if keep(entry):
                continue
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.name, ignore_errors=True, dir_fd=directory)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.name, dir_fd=directory)
    finally:
        os.close(directory)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)



def open_for_writing(target: Path) -> int:
    """A descriptor to write ``target`` through from its start, holding the file's exclusive lock.

    A file the superseded checkpoint left in a reused spare is rewritten in place: that keeps
    its disk blocks, and writing over allocated blocks is several times faster than allocating
    new ones on many disks (thin-provisioned and ``discard``-mounted ones: benchmarks/checkpoint.py).
    It is replaced by a new file when something else may still read it (a load or a memory map
    of that version holds its shared lock, or another hard link names it), or when it cannot
    be opened for writing (read-only, or no regular file).
    """
    directory = directory_fd(target.parents[1], TENSOR_DIR)  # target is staging/tensors/<name>
    try:
        try:
            fd = os.open(target.name, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=directory)
        except FileNotFoundError:
            pass
        except OSError:
            os.unlink(target.name, dir_fd=directory)
        else:
            try:
                status = os.fstat(fd)
                if stat.S_ISREG(status.st_mode) and status.st_nlink == 1:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return fd
            except BlockingIOError:
                pass
            os.close(fd)
            os.unlink(target.name, dir_fd=directory)
        fd = os.open(target.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                     dir_fd=directory)
        fcntl.flock(fd, fcntl.LOCK_EX)  # a new file: nobody else can hold it
        return fd
    finally:
        os.close(directory)


def exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux ``renameat2``); ``False`` where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    result = renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange)
    if result != 0:
        code = ctypes.get_errno()
        if code in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
            return False
        raise OSError(code, os.strerror(code), str(b))
    return True


def check_replaceable(path: Path) -> None:
    """Refuse to replace anything but nothing, an empty directory, or an rlbuf checkpoint."""
    if not path.exists():
        return
    if not path.is_dir():
        raise CheckpointError(f"{path}: exists and is not a directory; refusing to overwrite it")
    if not any(path.iterdir()):
        return
    manifest = path / MANIFEST
    try:
        ours = (manifest.stat().st_size <= MAX_MANIFEST_BYTES
                and parse_manifest(manifest.read_text(encoding="utf-8"), manifest).get("format") == FORMAT)
    except (OSError, UnicodeDecodeError, CheckpointError, AttributeError):
        ours = False
    if not ours:
        raise CheckpointError(f"{path}: exists and is not an rlbuf checkpoint (no {MANIFEST} of format {FORMAT!r}); "
                              f"refusing to overwrite it")


def remove(staging: Path) -> None:
    """Remove a staging directory, or the superseded checkpoint swapped into it: manifest first."""
    if staging.is_symlink():  # the swap moved a symlinked target path here; the link goes, not its target
        staging.unlink()
        return
    (staging / MANIFEST).unlink(missing_ok=True)
    shutil.rmtree(staging, ignore_errors=True)


def spare_path(path: Path) -> Path:
    return path.parent / f".{path.name}.spare"


def claim_spare(path: Path, staging: Path) -> None:
    """Make the staging directory ``staging``: the spare of ``path`` when there is one, else new.

    The spare is renamed (one save at a time can claim it), and everything in it that a save
    would not rewrite in place is removed: anything but regular files under ``tensors/``.
    """
    with contextlib.suppress(OSError):  # no spare, or one this save may not take (another user's, a mount)
        os.rename(spare_path(path), staging)
    if staging.is_symlink() or (staging.exists() and not staging.is_dir()):
        staging.unlink()
    staging.mkdir(exist_ok=True)
    prune(staging, keep=lambda entry: entry.name == TENSOR_DIR and entry.is_dir(follow_symlinks=False))
    (staging / TENSOR_DIR).mkdir(exist_ok=True)
    prune(staging, TENSOR_DIR, keep=lambda entry: entry.is_file(follow_symlinks=False))


def keep_as_spare(superseded: Path, spare: Path) -> None:
    """Keep the checkpoint a save replaced as the spare of the next save (its manifest removed)."""
    if superseded.is_symlink() or not superseded.is_dir():
        remove(superseded)
        return
    (superseded / MANIFEST).unlink(missing_ok=True)  # never a checkpoint again
    try:
        os.rename(superseded, spare)
    except OSError:  # a concurrent save kept its own spare first
        remove(superseded)



def lock_path(path: Path, token: str) -> Path:
    return path.parent / f".{path.name}.lock-{token}"


def take_lock(path: Path, token: str) -> int:
    """An flock-ed lock file that marks this save's temporary siblings as in use.

    It appears already locked (made under another name, then renamed), so a concurrent
    cleanup never sees it unlocked.
    """
    lock = lock_path(path, token)
    making = lock.with_name(lock.name + ".new")
    fd = os.open(making, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, str(os.getpid()).encode())
        os.rename(making, lock)
    except BaseException:
        os.close(fd)
        making.unlink(missing_ok=True)
        raise
    return fd


_MAKING_LOCK_GRACE_S = 60.0


def stale_lock_in_making(path: Path, sibling: Path) -> bool:
    """Whether ``sibling`` is a ``.<name>.lock-<hex>.new`` left by a save killed while taking its lock.

    Its maker holds it locked from a moment after creating it until the rename; one unlocked
    and older than a minute belongs to no live save.
    """
    if not re.fullmatch(re.escape(f".{path.name}.lock-") + r"[0-9a-f]{12}\.new", sibling.name):
        return False
    try:
        fd = os.open(sibling, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        if time.time() - os.fstat(fd).st_mtime < _MAKING_LOCK_GRACE_S:
            return False
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    finally:
        os.close(fd)
    return True
