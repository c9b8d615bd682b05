"""Checkpoint format: a directory of raw tensor files and a JSON manifest; never a pickle.

Layout::

    path/
      manifest.json        format, versions, kind, options, spec, counts, state (JSON), and
                           for every tensor file its dtype, shape, size and checksum
                           (XXH3-128; format version 1 wrote SHA-256, still read)
      tensors/<name>.bin   raw little-endian tensor bytes, one file per tensor (a field's file is
                           named after the field, sanitised plus a hash of the name when it is
                           not plain: see ``row_relpath``; a state referring to one file twice,
                           or a field to a file not its own, is refused at load)

Saving writes into a temporary sibling directory ``.<name>.tmp-<hex>`` (files fsynced, the
manifest last), then swaps it into place atomically (``renameat2(RENAME_EXCHANGE)`` on Linux),
so a save killed at any moment leaves the previous checkpoint whole. A temporary sibling left
by a killed save is never loaded (it is either unfinished or the superseded checkpoint; rename
it to load it anyway), and the next save or load of that path removes it (see
``remove_stale_saves``). Saving replaces only an empty directory or an rlbuf checkpoint. Loading
verifies the manifest, the format version, that the directory holds exactly the listed files,
and every checksum, before a single tensor is read (XXH3 guards against corruption at disk
speed; safety against hostile files comes from never unpickling and from checking the manifest
against the buffer's options); it never unpickles anything (TorchRL
0.14.1's own ``loads`` unpickles a ``prefetch.pkl``: such a file makes rlbuf refuse the
checkpoint). Files are written one after another (writing several at once made saves 2-3x
slower on a shared disk: benchmarks/checkpoint.py); checksums are verified on up to four threads.

Example:
    >>> import tempfile, torch
    >>> from pathlib import Path
    >>> path = Path(tempfile.mkdtemp()) / "ckpt"
    >>> save_state({"kind": "Demo", "x": torch.arange(3), "note": "hi"}, path)
    >>> state = load_state(path, kind="Demo")
    >>> state["x"].tolist(), state["note"]
    ([0, 1, 2], 'hi')
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import mmap
import os
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from rlbuf._manifest import (
    CHUNK,
    DIGEST,
    DIGESTS,
    DTYPE_BYTES,
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    TENSOR_REF,
    close_all,
    file_digest,
    open_current,
    unverified_manifest,
    verify_files,
)
from rlbuf._savedir import (
    TENSOR_DIR,
    check_replaceable,
    claim_spare,
    exchange,
    fsync_dir,
    keep_as_spare,
    lock_path,
    open_for_writing,
    opener,
    prune,
    remove,
    spare_path,
    stale_lock_in_making,
    take_lock,
)
from rlbuf.errors import CheckpointError
from rlbuf.spec import numpy_dtype

_SAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]+")
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_]+")
_DTYPES = {name: getattr(torch, name) for name in DTYPE_BYTES}


def _versions() -> dict[str, str]:
    import tensordict
    import torchrl

    from rlbuf import __version__

    return {"rlbuf": __version__, "torchrl": torchrl.__version__, "tensordict": tensordict.__version__,
            "torch": torch.__version__}


# -- encoding ---------------------------------------------------------------------------------
class RowFile(NamedTuple):
    """A tensor file already written by [`RowFiles`][rlbuf.checkpoint.RowFiles] (its path in the checkpoint)."""

    relpath: str


def _encode(value: Any, key: str, tensors: dict[str, torch.Tensor]) -> Any:
    """JSON for ``value``; tensors are replaced by references and collected in ``tensors``."""
    if isinstance(value, RowFile):
        return {TENSOR_REF: value.relpath}
    if isinstance(value, torch.Tensor):
        name = _SAFE_NAME.sub("_", key).strip("._") or "tensor"
        candidate, counter = name, 1
        while f"{TENSOR_DIR}/{candidate}.bin" in tensors:
            counter += 1
            candidate = f"{name}_{counter}"
        relpath = f"{TENSOR_DIR}/{candidate}.bin"
        tensors[relpath] = value
        return {TENSOR_REF: relpath}
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise CheckpointError(f"{key}: state keys must be strings")
        return {k: _encode(v, f"{key}.{k}", tensors) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_encode(v, f"{key}.{i}", tensors) for i, v in enumerate(value)]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    raise CheckpointError(f"{key}: cannot store a {type(value).__name__} in a checkpoint")


def _decode(value: Any, read: Callable[[str], torch.Tensor]) -> Any:
    if isinstance(value, dict):
        if set(value) == {TENSOR_REF}:
            return read(value[TENSOR_REF])
        return {k: _decode(v, read) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v, read) for v in value]
    return value


# -- writing ----------------------------------------------------------------------------------
def _write_tensor(tensor: torch.Tensor, target: Path) -> dict[str, Any]:
    """Write ``tensor`` as raw bytes in chunks (never the whole of a memmap in RAM); return its entry."""
    flat = tensor.detach().reshape(-1) if tensor.is_contiguous() else tensor.detach().contiguous().reshape(-1)
    digest = DIGESTS[DIGEST]()
    rows_per_chunk = max(1, CHUNK // max(1, flat.element_size()))
    nbytes = flat.numel() * flat.element_size()
    # One fsync at the end: starting writeback chunk by chunk (sync_file_range) made saves 1.5-3x
    # slower and far less steady on a shared disk (benchmarks/checkpoint.py).
    fd = open_for_writing(target)
    try:
        for start in range(0, flat.numel(), rows_per_chunk):
            chunk = flat[start:start + rows_per_chunk]
            if chunk.device.type != "cpu":
                chunk = chunk.cpu()
            raw = chunk.as_subclass(torch.Tensor).numpy().data.cast("B")
            digest.update(raw)
            _write_all(lambda data: os.write(fd, data), raw)
        os.ftruncate(fd, nbytes)  # a reused file may have been longer
        os.fsync(fd)
    finally:
        os.close(fd)
    return {"dtype": str(tensor.dtype).removeprefix("torch."), "shape": list(tensor.shape),
            "bytes": nbytes, DIGEST: digest.hexdigest()}


def _write_all(write: Callable[[memoryview], int], data: memoryview) -> None:
    """Write all of ``data`` with ``write`` (an unbuffered write may take only part of it)."""
    written = 0
    while written < len(data):
        written += write(data[written:])


def remove_spare(path: str | Path) -> bool:
    """Give back the disk space of the superseded version that saves with ``keep_spare=True`` keep.

    A save over a checkpoint with ``keep_spare=True`` keeps the version it replaced as a hidden
    sibling, ``.<name>.spare`` (without its manifest, so it is never loaded), and the next save
    to ``path`` rewrites its files in place: on disks where allocating blocks is slow
    (thin-provisioned, ``discard``-mounted) that is several times faster. A save needs room for
    two versions anyway; this frees the second one between saves (as does the next save
    without ``keep_spare``), and the next save writes new files.

    Returns:
        Whether there was a spare to remove.

    Example:
        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "ckpt"
        >>> save_state({"kind": "Demo", "x": torch.arange(3)}, path)
        >>> save_state({"kind": "Demo", "x": torch.arange(4)}, path, keep_spare=True)
        >>> remove_spare(path), remove_spare(path)
        (True, False)
    """
    path = Path(path)
    aside = path.parent / f".{path.name}.old-{uuid.uuid4().hex[:12]}"  # removed by a later save if killed here
    try:
        os.rename(spare_path(path), aside)
    except FileNotFoundError:
        return False
    remove(aside)
    return True


def row_relpath(prefix: str, name: str) -> str:
    """The file of field ``name``: its name if plain, else sanitised plus a hash of the name, so
    two fields never share a file (``obs["a_b"]`` and ``obs["a"]["b"]``, ``hidden_state["h"]``
    and an extra field ``hidden_state_h_``).

    Example:
        >>> row_relpath("state.fields", "reward")
        'tensors/state.fields.reward.bin'
        >>> row_relpath("state.fields", 'obs["a_b"]') != row_relpath("state.fields", 'obs["a"]["b"]')
        True
    """
    if _PLAIN_NAME.fullmatch(name):
        return f"{TENSOR_DIR}/{prefix}.{name}.bin"
    digest = hashlib.blake2s(name.encode("utf-8"), digest_size=8).hexdigest()
    return f"{TENSOR_DIR}/{_SAFE_NAME.sub('_', f'{prefix}.{name}')}-{digest}.bin"


def _legacy_relpath(prefix: str, name: str) -> str:
    """The name rlbuf up to 0.3 gave a field's file (not unique: also checked for reuse at load)."""
    return f"{TENSOR_DIR}/{_SAFE_NAME.sub('_', f'{prefix}.{name}')}.bin"


def references_problem(state: Any) -> str:
    """A manifest's state that refers to one file twice, or a field to a file not its own (``""``: none)."""
    seen: set[str] = set()

    def walk(value: Any) -> str:
        if isinstance(value, dict):
            if set(value) == {TENSOR_REF}:
                rel = value[TENSOR_REF]
                if not isinstance(rel, str) or rel in seen:
                    return f"the state refers to the file {rel!r} twice; rlbuf writes one file per tensor"
                seen.add(rel)
                return ""
            return next((reason for reason in map(walk, value.values()) if reason), "")
        if isinstance(value, list):
            return next((reason for reason in map(walk, value) if reason), "")
        return ""

    reason = walk(state)
    fields = state.get("fields") if isinstance(state, dict) else None
    if reason or not isinstance(fields, dict):
        return reason
    for name, ref in fields.items():
        if not isinstance(ref, dict) or set(ref) != {TENSOR_REF} or ref[TENSOR_REF] == row_relpath("state.fields", name):
            continue
        legacy = _legacy_relpath("state.fields", name).removesuffix(".bin")
        # older saves numbered a second file of one sanitised name: legacy_2.bin
        if not re.fullmatch(re.escape(legacy) + (r"(_[0-9]+)?\.bin" if not _PLAIN_NAME.fullmatch(name) else r"\.bin"),
                            str(ref[TENSOR_REF])):
            return f"field {name!r} refers to the file {ref[TENSOR_REF]!r}, not its own"
    return ""


class RowFiles:
    """The row tensors of a checkpoint, copied while writers run and patched under their lock.

    ``copy`` writes every field's rows without any lock (hashing them from memory); rows
    that writers change meanwhile are then re-copied by ``patch``, which the buffer calls
    under its lock with the storage positions written since the copy began. ``finish``
    makes the files durable and re-hashes the patched ones from disk.
    """

    def __init__(self, staging: Path, prefix: str) -> None:
        self._staging, self._prefix = staging, prefix
        self.entries: dict[str, dict[str, Any]] = {}
        self._patched: set[str] = set()

    def _relpath(self, name: str) -> str:
        return row_relpath(self._prefix, name)

    def copy(self, leaves: Mapping[str, torch.Tensor], size: int) -> None:
        """Write rows ``[0, size)`` of every leaf (no lock held: rows may change meanwhile)."""
        for name, leaf in leaves.items():
            rel = self._relpath(name)
            self.entries[rel] = _write_tensor(leaf[:size], self._staging / rel)

    def patch(self, leaves: Mapping[str, torch.Tensor], segments: Sequence[tuple[int, int]],
              size: int) -> dict[str, RowFile]:
        """Re-copy the rows of ``segments`` (storage positions) and cut the files at ``size`` rows.

        Returns:
            name -> the file reference to put in the state.
        """
        refs = {}
        for name, leaf in leaves.items():
            rel = self._relpath(name)
            row_bytes = leaf[0].numel() * leaf.element_size()
            entry = self.entries[rel]
            if segments or entry["shape"][0] != size:
                with open(self._staging / rel, "r+b", buffering=0, opener=opener(self._staging)) as file:
                    for start, stop in segments:
                        rows = leaf[start:stop]
                        raw = (rows if rows.device.type == "cpu" else rows.cpu()).as_subclass(torch.Tensor)
                        file.seek(start * row_bytes)
                        _write_all(file.write, raw.contiguous().numpy().data.cast("B"))
                    file.truncate(size * row_bytes)
                entry.update({"shape": [size, *leaf.shape[1:]], "bytes": size * row_bytes, DIGEST: None})
                self._patched.add(rel)
            refs[name] = RowFile(rel)
        return refs

    def finish(self) -> None:
        """Make the files durable; re-hash, from disk, the ones ``patch`` changed."""
        for rel in self._patched:
            with open(self._staging / rel, "rb+", opener=opener(self._staging)) as file:
                os.fsync(file.fileno())
            self.entries[rel][DIGEST] = file_digest(self._staging / rel, DIGEST)


def remove_stale_saves(path: str | Path) -> list[Path]:
    """Remove what saves to ``path`` killed mid-way left behind; return what was removed.

    Every save and load of ``path`` calls this first. A temporary sibling
    ``.<name>.tmp-<hex>`` / ``.<name>.old-<hex>`` is stale when the lock file of its save
    (``.<name>.lock-<hex>``, locked before the temporary is made) is gone or no longer locked:
    its process died, and the kernel dropped the ``flock`` with it. A save in progress, in
    this process or another, keeps its lock, so its files are never touched. What cannot be
    removed (a read-only directory) is left as it is, without an error.

    Example:
        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "ckpt"
        >>> (path.parent / ".ckpt.tmp-0123456789ab").mkdir()
        >>> [p.name for p in remove_stale_saves(path)]
        ['.ckpt.tmp-0123456789ab']
    """
    path = Path(path)
    pattern = re.compile(re.escape(f".{path.name}.") + r"(tmp|old|lock)-([0-9a-f]{12})")
    removed: list[Path] = []
    try:
        siblings = sorted(path.parent.iterdir())
    except OSError:
        return removed
    for sibling in siblings:
        with contextlib.suppress(OSError):  # a read-only directory, another user's file: left alone
            if _remove_if_stale(path, sibling, pattern):
                removed.append(sibling)
    return removed


def _remove_if_stale(path: Path, sibling: Path, pattern: re.Pattern[str]) -> bool:
    """Remove ``sibling`` if a killed save of ``path`` left it; whether it did."""
    if stale_lock_in_making(path, sibling):
        sibling.unlink(missing_ok=True)
        return True
    match = pattern.fullmatch(sibling.name)
    if match is None:
        return False
    lock = lock_path(path, match.group(2))
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        fd = -1
    try:
        if fd >= 0:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                return False  # a live save holds it
        if match.group(1) == "lock":
            lock.unlink(missing_ok=True)
        else:
            remove(sibling)
        return True
    finally:
        if fd >= 0:
            os.close(fd)


def _save_failed(path: Path, error: OSError) -> str:
    reason = "the disk is full" if error.errno == errno.ENOSPC else f"{error.strerror or error}"
    return f"{path}: saving failed: {reason}; the previous checkpoint, if any, is untouched"


def save_state(state: dict[str, Any] | Callable[[RowFiles], dict[str, Any]], path: str | Path, *,
               keep_spare: bool = False) -> None:
    """Write ``state`` (JSON values and tensors) as a checkpoint directory at ``path``, atomically.

    The new checkpoint is written to a temporary sibling, fsynced, read back and verified
    (every checksum) before it replaces the previous one, so a failure at any point leaves the
    previous checkpoint whole. Stale siblings of saves killed earlier are removed first (see
    [`remove_stale_saves`][rlbuf.checkpoint.remove_stale_saves]). The version replaced is
    removed, or with ``keep_spare`` kept as ``.<name>.spare``; a save finding a spare rewrites
    its files in place (see [`remove_spare`][rlbuf.checkpoint.remove_spare]).

    Args:
        state: the state, or a function that writes the row files through the
            [`RowFiles`][rlbuf.checkpoint.RowFiles] it is given and returns the state
            (referring to them with [`RowFile`][rlbuf.checkpoint.RowFile]).
        path: the checkpoint directory.
        keep_spare: keep the replaced version's files on disk for the next save to rewrite
            (twice the disk between saves; faster saves only where allocating blocks is slow).

    Raises:
        CheckpointError: the target is not a checkpoint directory, the state holds something
            that is not JSON or a tensor, the disk is full / unwritable, or what was written
            does not read back (the previous checkpoint at ``path``, if any, is left whole).
    """
    path = Path(path)
    check_replaceable(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_saves(path)
    token = uuid.uuid4().hex[:12]
    staging = path.parent / f".{path.name}.tmp-{token}"
    try:
        lock_fd = take_lock(path, token)
    except OSError as error:
        raise CheckpointError(_save_failed(path, error)) from error
    superseded: Path | None = None
    try:
        claim_spare(path, staging)
        rows = RowFiles(staging, "state.fields")
        made = state(rows) if callable(state) else state
        rows.finish()
        tensors: dict[str, torch.Tensor] = {}
        encoded = _encode(made, "state", tensors)
        files = {**rows.entries, **{rel: _write_tensor(tensor, staging / rel) for rel, tensor in tensors.items()}}
        # files of the spare this save did not rewrite
        prune(staging, TENSOR_DIR, keep=lambda entry: f"{TENSOR_DIR}/{entry.name}" in files)
        manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, "versions": _versions(),
                    "state": encoded, "files": files}
        with open(staging / MANIFEST, "w", encoding="utf-8", opener=opener(staging)) as file:
            json.dump(manifest, file, indent=1)
            file.flush()
            os.fsync(file.fileno())
        fsync_dir(staging / TENSOR_DIR)
        fsync_dir(staging)
        listed = unverified_manifest(staging, staging=True)["files"]
        if listed.keys() != files.keys():
            raise CheckpointError(f"{path}: the written checkpoint does not list the files it was given")
        verify_files(staging, listed)
        placed = False
        if not path.exists():
            try:
                os.rename(staging, path)
                placed = True
            except OSError as error:
                if error.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
                check_replaceable(path)  # another save made the checkpoint meanwhile: replace it
        if not placed:
            if not exchange(staging, path):  # two renames: a crash between them leaves no checkpoint at path
                aside = path.parent / f".{path.name}.old-{token}"
                os.rename(path, aside)
                try:
                    os.rename(staging, path)
                except OSError:
                    os.rename(aside, path)
                    raise
                staging = aside
            superseded = staging
        fsync_dir(path.parent)
    except OSError as error:
        raise CheckpointError(_save_failed(path, error)) from error
    except CheckpointError as error:
        raise CheckpointError(f"{error}; the previous checkpoint at {path}, if any, is untouched") from error
    finally:
        if superseded is not None and keep_spare:
            keep_as_spare(superseded, spare_path(path))
        else:
            remove(staging)
        lock_path(path, token).unlink(missing_ok=True)
        os.close(lock_fd)


# -- reading ----------------------------------------------------------------------------------
def load_state(path: str | Path, *, kind: str) -> dict[str, Any]:
    """Verify a checkpoint completely, then return its state with file-backed tensors.

    Tensors are copy-on-write memory maps of the files, so loading a memmap buffer never
    needs the whole of it in RAM. Each map holds the shared lock its file was verified under,
    so no later save rewrites the bytes behind it (see [`save_state`][rlbuf.checkpoint.save_state]).
    What saves to ``path`` killed mid-way left beside it is removed first (see
    [`remove_stale_saves`][rlbuf.checkpoint.remove_stale_saves]).

    Raises:
        CheckpointError: a missing, truncated, corrupted, wrong-version or wrong-kind checkpoint.
    """
    root = Path(path)
    remove_stale_saves(root)

    def check_kind(manifest: dict[str, Any]) -> None:
        found = manifest["state"].get("kind")
        if found != kind:
            raise CheckpointError(f"{root / MANIFEST}: holds a {found}, not a {kind}")

    manifest, opened = open_current(root, check_kind)
    files = manifest["files"]
    reason = references_problem(manifest["state"])
    if reason:
        close_all(opened)
        raise CheckpointError(f"{root / MANIFEST}: {reason}")

    def read(relpath: str) -> torch.Tensor:
        if relpath not in files:
            raise CheckpointError(f"{root / MANIFEST}: the state refers to {relpath!r}, which is not listed")
        entry = files[relpath]
        dtype = _DTYPES[entry["dtype"]]
        shape = tuple(int(d) for d in entry["shape"])
        if entry["bytes"] == 0:
            return torch.empty(shape, dtype=dtype)
        # The map keeps a duplicate of the descriptor, and with it the shared lock.
        mapped = mmap.mmap(opened[relpath], entry["bytes"], access=mmap.ACCESS_COPY)
        return torch.from_numpy(np.frombuffer(mapped, dtype=numpy_dtype(dtype)).reshape(shape))

    try:
        state = _decode(manifest["state"], read)
    finally:
        close_all(opened)
    state["versions"] = manifest.get("versions", {})
    return state  # type: ignore[no-any-return]
