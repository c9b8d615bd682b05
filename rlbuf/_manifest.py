"""Reading and verifying a checkpoint's manifest and files, without torch.

The one implementation of what a manifest must hold, where its files may lie and how their
checksums are checked: [`rlbuf.checkpoint`][rlbuf.checkpoint] loads and saves through it, and
``rlbuf inspect`` uses it alone, so inspecting a checkpoint never imports torch or TorchRL.
Only JSON is parsed and files are hashed; nothing is unpickled.

Example:
    >>> import json, tempfile
    >>> root = Path(tempfile.mkdtemp())
    >>> _ = (root / "x.bin").write_bytes(bytes(8))
    >>> entry = {"dtype": "float32", "shape": [2], "bytes": 8, "xxh3_128": file_digest(root / "x.bin", "xxh3_128")}
    >>> manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, "state": {}, "files": {"x.bin": entry}}
    >>> _ = (root / MANIFEST).write_text(json.dumps(manifest))
    >>> list(read_manifest(root)["files"])
    ['x.bin']
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import math
import os
import re
import stat
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import xxhash

from rlbuf.errors import CheckpointError

FORMAT = "rlbuf-checkpoint"
FORMAT_VERSION = 2
_READABLE_VERSIONS = (1, 2)  # 1: the same layout with SHA-256 checksums
MANIFEST = "manifest.json"
TENSOR_REF = "__tensor__"
"""The one key of the JSON object that stands for a tensor file in a manifest's state: ``{TENSOR_REF: relpath}``."""
DIGEST = "xxh3_128"  # the checksum new checkpoints carry, per file
DIGESTS: dict[str, Callable[[], Any]] = {"xxh3_128": xxhash.xxh3_128, "sha256": hashlib.sha256}
_DIGEST_NAMES = {"xxh3_128": "XXH3-128", "sha256": "SHA-256"}
CHUNK = 4 << 20  # bytes hashed at a time
_THREADS = max(1, min(4, os.cpu_count() or 1))
MAX_MANIFEST_BYTES = 64 << 20
MAX_FILES = 10_000
"""The most files a manifest may list (rlbuf writes one per stored field and state tensor)."""
_TEMP_NAME = re.compile(r"\..+\.(tmp|old)-[0-9a-f]{12}")
_MAX_DEPTH = 64  # the state rlbuf writes nests about 6 deep
_LOAD_ATTEMPTS = 10  # a load retries while saves keep replacing the checkpoint under it
DTYPE_BYTES = {"float16": 2, "float32": 4, "float64": 8, "uint8": 1, "int8": 1, "int16": 2, "int32": 4, "int64": 8,
               "bool": 1}
"""The dtypes a checkpoint's files may hold (torch's names), and their bytes per element."""


def _check_depth(value: Any, where: Path) -> None:
    """Refuse JSON nested deeper than any rlbuf manifest (walked without recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > _MAX_DEPTH:
            raise CheckpointError(f"{where}: nested deeper than {_MAX_DEPTH} levels; not an rlbuf manifest")
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)


class _DuplicateKey(Exception):
    """A JSON object with one key twice."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value = dict(pairs)
    if len(value) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return value


def parse_manifest(text: str, where: Path) -> Any:
    """JSON of a manifest; malformed, absurdly nested JSON or a key twice in one object raises ``CheckpointError``.

    Example:
        >>> parse_manifest("[" * 100_000, Path("m.json"))
        Traceback (most recent call last):
        ...
        rlbuf.errors.CheckpointError: m.json: not valid JSON (nested too deeply)
        >>> parse_manifest('{"format_version": 2, "format_version": 1}', Path("m.json"))
        Traceback (most recent call last):
        ...
        rlbuf.errors.CheckpointError: m.json: the key 'format_version' appears twice in one object (JSON readers disagree on which one counts); not a manifest rlbuf writes
    """
    try:
        value = json.loads(text, object_pairs_hook=_unique_keys)
    except _DuplicateKey as duplicate:
        raise CheckpointError(f"{where}: the key {duplicate.args[0]!r} appears twice in one object (JSON readers "
                              f"disagree on which one counts); not a manifest rlbuf writes") from None
    except RecursionError:
        raise CheckpointError(f"{where}: not valid JSON (nested too deeply)") from None
    except ValueError as error:
        raise CheckpointError(f"{where}: not valid JSON ({error})") from None
    _check_depth(value, where)
    return value


def buffer_checkpoint(root: Path) -> Path | None:
    """The buffer checkpoint at ``root``: ``root`` itself, a demo checkpoint's ``buffer/``, or a demo output
    folder's newest checkpoint's ``buffer/``; ``None`` if none of these.

    Below ``root`` no link is followed: a ``buffer/`` or a checkpoint linked from elsewhere is none of these.

    Example:
        >>> buffer_checkpoint(Path("/nonexistent")) is None
        True
    """
    if (root / MANIFEST).is_file():
        return root
    if (inner := inside_checkpoint(root, f"buffer/{MANIFEST}")) is not None and inner.is_file():
        return inner.parent
    checkpoints = inside_checkpoint(root, "checkpoints")
    if checkpoints is not None and checkpoints.is_dir():
        newest = max((entry.name for entry in checkpoints.glob("frames-*")), default=None)
        inner = None if newest is None else inside_checkpoint(root, f"checkpoints/{newest}/buffer/{MANIFEST}")
        if inner is not None and inner.is_file():
            return inner.parent
    return None


def plain_file_bytes(path: Path, *, limit: int = MAX_MANIFEST_BYTES) -> bytes:
    """The bytes of the file at ``path``: a regular file, no link, at most ``limit`` bytes (a manifest, a demo's
    ``meta.json``); a named pipe or a device is refused unread, never waited on.

    Raises:
        CheckpointError: a link, missing, not a regular file, larger than ``limit``, or unreadable.

    Example:
        >>> plain_file_bytes(Path("/dev/null"))
        Traceback (most recent call last):
        ...
        rlbuf.errors.CheckpointError: /dev/null: not a regular file
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise CheckpointError(f"{path}: a symbolic link; rlbuf writes it as a plain file and follows no links "
                                  "in a checkpoint") from None
        raise CheckpointError(f"{path}: unreadable ({error.strerror})") from None
    try:
        status = os.fstat(fd)
        if not stat.S_ISREG(status.st_mode):
            raise CheckpointError(f"{path}: not a regular file")
        if status.st_size > limit:
            raise CheckpointError(f"{path}: larger than {limit} bytes; refusing to read it")
        chunks, size = [], 0
        while size <= limit and (chunk := os.read(fd, min(CHUNK, limit + 1 - size))):
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:  # grown since the check
            raise CheckpointError(f"{path}: larger than {limit} bytes; refusing to read it")
        return b"".join(chunks)
    except OSError as error:
        raise CheckpointError(f"{path}: unreadable ({error.strerror})") from None
    finally:
        os.close(fd)


def plain_file_text(path: Path, *, limit: int = MAX_MANIFEST_BYTES) -> str:
    """[`plain_file_bytes`][rlbuf._manifest.plain_file_bytes] as UTF-8 text.

    Raises:
        CheckpointError: as ``plain_file_bytes``, or not UTF-8.

    Example:
        >>> plain_file_text(Path("/nonexistent"))
        Traceback (most recent call last):
        ...
        rlbuf.errors.CheckpointError: /nonexistent: unreadable (No such file or directory)
    """
    try:
        return plain_file_bytes(path, limit=limit).decode("utf-8")
    except UnicodeDecodeError as error:
        raise CheckpointError(f"{path}: unreadable ({error})") from None


def unverified_manifest(path: Path, *, staging: bool = False) -> dict[str, Any]:
    """The manifest of checkpoint ``path``, its format and tables checked, its files not yet.

    Args:
        path: the checkpoint directory.
        staging: ``path`` is a save's temporary sibling (read back before the swap).

    Raises:
        CheckpointError: no checkpoint, an unreadable or foreign manifest, an unknown format version, a
            malformed table of files, of the state or of the versions that wrote it.

    Example:
        >>> unverified_manifest(Path("/nonexistent"))
        Traceback (most recent call last):
        ...
        rlbuf.errors.CheckpointError: /nonexistent: does not exist (expected a checkpoint directory: check the path)
    """
    manifest_path = path / MANIFEST
    if _TEMP_NAME.fullmatch(path.name) and not staging:
        checkpoint = path.parent / path.name[1:].rsplit(".", 1)[0]
        raise CheckpointError(f"{path}: left by an interrupted save (unfinished, or the checkpoint it replaced); the "
                              f"checkpoint is {checkpoint} (rename this directory to load it anyway)")
    if not path.is_dir():
        raise CheckpointError(f"{path}: not a checkpoint directory" if path.exists() else
                              f"{path}: does not exist (expected a checkpoint directory: check the path)")
    if manifest_path.is_symlink():
        raise CheckpointError(f"{manifest_path}: a symbolic link; rlbuf writes the manifest as a plain file and "
                              "follows no links in a checkpoint")
    if not manifest_path.is_file():
        if (inner := buffer_checkpoint(path)) is not None:
            raise CheckpointError(f"{path}: a demo's checkpoint or output folder, not a buffer's; its buffer's "
                                  f"checkpoint is {inner}: load that")
        raise CheckpointError(f"{manifest_path}: missing (an interrupted save, or not an rlbuf checkpoint)")
    manifest = parse_manifest(plain_file_text(manifest_path), manifest_path)
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CheckpointError(f"{manifest_path}: not an rlbuf checkpoint manifest")
    version = manifest.get("format_version")
    if version not in _READABLE_VERSIONS or type(version) is not int:
        raise CheckpointError(f"{manifest_path}: format version {version!r}; this rlbuf reads versions "
                              f"{', '.join(map(str, _READABLE_VERSIONS))}")
    if not isinstance(manifest.get("files"), dict) or not isinstance(manifest.get("state"), dict):
        raise CheckpointError(f"{manifest_path}: malformed (no 'files' or 'state' table)")
    versions = manifest.get("versions", {})
    if not isinstance(versions, dict) or not all(isinstance(value, str) for value in versions.values()):
        raise CheckpointError(f"{manifest_path}: versions: expected a table of package names to version strings, "
                              f"got {str(versions)[:200]}")
    if len(manifest["files"]) > MAX_FILES:
        raise CheckpointError(f"{manifest_path}: lists {len(manifest['files'])} files, more than the {MAX_FILES} "
                              f"an rlbuf checkpoint holds at most; refusing it")
    return manifest


def _safe_file(root: Path, relpath: object) -> Path:
    if not isinstance(relpath, str) or not relpath or relpath.startswith(("/", "\\")) or "\\" in relpath:
        raise CheckpointError(f"{root / MANIFEST}: file name {relpath!r} is not a relative path inside the checkpoint")
    parts = relpath.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise CheckpointError(f"{root / MANIFEST}: file name {relpath!r} escapes the checkpoint directory")
    target = root
    for part in parts:  # no component may be a link: then the path stays inside root (no "..", none absolute)
        target = target / part
        try:
            linked = stat.S_ISLNK(os.lstat(target).st_mode)
        except OSError:
            linked = False  # missing: reported as such by the caller
        if linked:
            raise CheckpointError(f"{target}: a link or a path outside the checkpoint; refusing it")
    return target


def _is_count(value: object) -> bool:
    return type(value) is int and value >= 0


def inside_checkpoint(root: Path, relpath: object) -> Path | None:
    """The file ``relpath`` names inside checkpoint ``root``, or ``None`` when it is absolute,
    leaves the directory (``..``) or is a link.

    Example:
        >>> inside_checkpoint(Path("/tmp/ckpt"), "/etc/passwd") is None
        True
    """
    try:
        return _safe_file(root, relpath)
    except (CheckpointError, OSError, ValueError):
        return None


def file_digest(target: Path, algorithm: str) -> str:
    """The hex checksum (``"xxh3_128"`` or ``"sha256"``) of the file at ``target``.

    The file is read under a shared lock, so a save never rewrites it meanwhile (see
    [`open_verified`][rlbuf._manifest.open_verified]).

    Example:
        >>> import tempfile
        >>> target = Path(tempfile.mkdtemp()) / "x.bin"
        >>> _ = target.write_bytes(b"abc")
        >>> file_digest(target, "sha256")[:16]
        'ba7816bf8f01cfea'
    """
    fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)  # never a link's target or a pipe's wait
    try:
        _lock_shared(fd)
        return _fd_digest(fd, algorithm)
    finally:
        os.close(fd)


def _lock_shared(fd: int) -> None:
    """Take the shared lock of a file being read; without one where the file system has no locks.

    There (NFS without lockd, Lustre mounted without ``flock``) no save can run either: saves
    take locks, so none rewrites the file meanwhile.
    """
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
    except OSError as error:
        if error.errno not in (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP):
            raise


def _fd_digest(fd: int, algorithm: str) -> str:
    digest = DIGESTS[algorithm]()
    buffer = memoryview(bytearray(CHUNK))  # reused: a fresh buffer per read costs more than the hash
    offset = 0
    while count := os.preadv(fd, [buffer], offset):
        digest.update(buffer[:count])
        offset += count
    return str(digest.hexdigest())


def digest_of(entry: Mapping[str, Any], version: object = None) -> tuple[str, Any]:
    """The checksum algorithm and value of a manifest file entry.

    Version 1 manifests carry SHA-256, version 2 XXH3-128; with no version, whichever the
    entry holds (XXH3-128 first).

    Example:
        >>> digest_of({"xxh3_128": "00ff"})
        ('xxh3_128', '00ff')
        >>> digest_of({"sha256": "00ff", "xxh3_128": "00ff"}, version=1)
        ('sha256', '00ff')
    """
    if version is None:
        algorithm = DIGEST if DIGEST in entry or "sha256" not in entry else "sha256"
    else:
        algorithm = "sha256" if version == 1 else DIGEST
    return algorithm, entry.get(algorithm)


def file_matches(target: Path, entry: Mapping[str, Any], version: object = None) -> bool:
    """Whether the file at ``target`` has the size and checksum its manifest ``entry`` lists.

    Example:
        >>> import tempfile
        >>> target = Path(tempfile.mkdtemp()) / "x.bin"
        >>> _ = target.write_bytes(b"abc")
        >>> file_matches(target, {"bytes": 3, "xxh3_128": "06b05ab6733a618578af5f94892f3950"})
        True
    """
    algorithm, expected = digest_of(entry, version)
    return target.stat().st_size == entry.get("bytes") and file_digest(target, algorithm) == expected


def verify_files(root: Path, files: dict[str, Any], version: object = FORMAT_VERSION) -> None:
    """Check that ``root`` holds exactly the listed ``files``, each of its size and checksum.

    Raises:
        CheckpointError: an unexpected, missing, malformed, truncated or corrupted file, or one
            outside the checkpoint.

    Example:
        >>> import tempfile
        >>> verify_files(Path(tempfile.mkdtemp()), {"x.bin": {"dtype": "uint8", "shape": [1], "bytes": 1}})
        Traceback (most recent call last):
        ...
        rlbuf.errors.CheckpointError: /tmp/.../x.bin: missing
    """
    close_all(open_verified(root, files, version))


def close_all(opened: Mapping[str, int]) -> None:
    """Close the descriptors [`open_verified`][rlbuf._manifest.open_verified] returned (their locks go with them).

    Example:
        >>> close_all({})
    """
    for fd in opened.values():
        os.close(fd)


def open_verified(root: Path, files: dict[str, Any], version: object = FORMAT_VERSION) -> dict[str, int]:
    """Open every listed file under a shared lock and verify it; return the open descriptors.

    Checks that ``root`` holds exactly the listed ``files``, each of its size and checksum
    (hashed on up to four threads, largest file first, through the descriptors returned).
    The caller closes them. While a descriptor (or a memory map made from it, which shares
    its lock) is open, no save rewrites that file: a save reuses the files of the checkpoint
    it superseded only where it gets their exclusive lock, and writes new ones otherwise.

    Returns:
        relpath -> a read-only file descriptor holding the file's shared ``flock``.

    Raises:
        CheckpointError: an unexpected, missing, malformed, truncated or corrupted file, or one
            outside the checkpoint (nothing is left open).

    Example:
        >>> import tempfile
        >>> open_verified(Path(tempfile.mkdtemp()), {})
        {}
    """
    targets = {rel: _safe_file(root, rel) for rel in files}
    present = _present_files(root)
    unexpected = sorted(present - set(files) - {MANIFEST})
    if unexpected:
        raise CheckpointError(f"{root}: unexpected file {unexpected[0]!r} (rlbuf never writes it, and a pickle or "
                              f".pt file could run code when loaded); refusing the checkpoint")
    opened: dict[str, int] = {}
    try:
        for rel, entry in files.items():
            target = targets[rel]
            if (not isinstance(entry, dict) or not isinstance(entry.get("dtype"), str) or entry["dtype"] not in DTYPE_BYTES
                    or not isinstance(entry.get("shape"), list) or not all(_is_count(d) for d in entry["shape"])
                    or not _is_count(entry.get("bytes"))):
                raise CheckpointError(f"{target}: malformed manifest entry {str(entry)[:200]}")
            if not target.is_file():
                raise CheckpointError(f"{target}: missing")
            try:  # O_NONBLOCK: a FIFO swapped in after the check above must not hang the open.
                opened[rel] = fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError as error:  # gone since the check: a save swapped in a version without it
                raise CheckpointError(f"{target}: unreadable ({error.strerror})") from None
            _lock_shared(fd)
            status = os.fstat(fd)
            expected = math.prod(entry["shape"]) * DTYPE_BYTES[entry["dtype"]]
            if not stat.S_ISREG(status.st_mode):
                raise CheckpointError(f"{target}: not a regular file")
            if status.st_size != expected or entry.get("bytes") != expected:
                raise CheckpointError(f"{target}: {status.st_size} bytes, expected {expected} (truncated or corrupted)")
        algorithm = digest_of({}, version)[0]
        largest_first = sorted(files, key=lambda rel: -int(files[rel]["bytes"]))
        with ThreadPoolExecutor(max_workers=_THREADS) as pool:
            digests = dict(zip(largest_first, pool.map(lambda rel: _fd_digest(opened[rel], algorithm), largest_first),
                               strict=True))
        for rel, entry in files.items():
            if digests[rel] != entry.get(algorithm):
                raise CheckpointError(f"{targets[rel]}: {_DIGEST_NAMES[algorithm]} mismatch (corrupted)")
    except BaseException:
        close_all(opened)
        raise
    return opened


def _present_files(root: Path) -> set[str]:
    """Paths (relative, ``/``-separated) of everything under ``root`` but directories, links not followed.

    Raises:
        CheckpointError: more than ``MAX_FILES`` entries (no rlbuf checkpoint holds that many).
    """
    found: set[str] = set()
    pending = [""]
    while pending:
        prefix = pending.pop()
        with os.scandir(root / prefix if prefix else root) as entries:
            for entry in entries:
                rel = f"{prefix}/{entry.name}" if prefix else entry.name
                if entry.is_dir(follow_symlinks=False):
                    pending.append(rel)
                else:
                    found.add(rel)
                if len(found) + len(pending) > MAX_FILES + 1:
                    raise CheckpointError(f"{root}: holds more than {MAX_FILES} files; not an rlbuf checkpoint")
    return found


def _replaced_since(root: Path, manifest: dict[str, Any]) -> bool:
    try:
        return unverified_manifest(root) != manifest
    except CheckpointError:
        return True


def open_current(root: Path, check: Callable[[dict[str, Any]], None] | None = None,
                 ) -> tuple[dict[str, Any], dict[str, int]]:
    """The manifest of checkpoint ``root`` and its files, opened and verified; the caller closes them.

    The files are opened, locked and verified by [`open_verified`][rlbuf._manifest.open_verified].
    A save that swaps a new version in between reading the manifest and its files is no
    corruption: the new version is read (up to ten times while saves keep replacing it).

    Args:
        root: the checkpoint directory.
        check: called with each manifest read, before its files are opened (raises to refuse it).

    Raises:
        CheckpointError: as [`open_verified`][rlbuf._manifest.open_verified], or from ``check``.

    Example:
        >>> open_current(Path("/nonexistent"))
        Traceback (most recent call last):
        ...
        rlbuf.errors.CheckpointError: /nonexistent: does not exist (expected a checkpoint directory: check the path)
    """
    attempts = 1
    while True:
        manifest = unverified_manifest(root)
        if check is not None:
            check(manifest)
        try:
            return manifest, open_verified(root, manifest["files"], manifest["format_version"])
        except CheckpointError:
            if attempts == _LOAD_ATTEMPTS or not _replaced_since(root, manifest):
                raise
            attempts += 1


def read_manifest(path: str | Path) -> dict[str, Any]:
    """The verified manifest of a checkpoint (format, version, listed files and checksums).

    Raises:
        CheckpointError: naming the file and the problem.

    Example:
        >>> read_manifest("/nonexistent")
        Traceback (most recent call last):
        ...
        rlbuf.errors.CheckpointError: /nonexistent: does not exist (expected a checkpoint directory: check the path)
    """
    manifest, opened = open_current(Path(path))
    close_all(opened)
    return manifest
