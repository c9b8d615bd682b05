"""The on-disk form of a [`ReplayService`][rlbuf.ray.ReplayService]: ``service.json`` and one rlbuf checkpoint per shard.

```
path/service.json   format, version, num_shards, shard_capacity, rate_limiter settings, each shard's
                    limiter counters, the learner's split generator, its round-robin cursor,
                    what it last heard from each shard (sizes, priority mass: the next split) and
                    the parts it binds: each shard's index, write count and the SHA-256 of its
                    manifest.json (which lists every file's checksum)
path/shard_<k>/     shard k's ReplayBuffer checkpoint (rlbuf's format: checksummed, never unpickled)
```

A part that is not the one ``service.json`` binds (copied from another shard or another save)
is refused. Version 1 checkpoints, written before the binding, load when no two parts are the
same part (the same manifest twice: one shard's rows copied over another's).

Example:
    >>> read_manifest(Path("/nonexistent/replay"))
    Traceback (most recent call last):
    ...
    rlbuf.errors.CheckpointError: /nonexistent/replay/service.json: expected a ReplayService checkpoint's service.json, could not read it ([Errno 2] No such file or directory: '/nonexistent/replay/service.json'); pass the directory ReplayService.save wrote
"""

from __future__ import annotations

import hashlib
import json
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from rlbuf._manifest import MANIFEST
from rlbuf._rate_limit import RateLimiter
from rlbuf._ray_calls import stop
from rlbuf._savedir import exchange
from rlbuf.errors import CheckpointError, ConfigError, ShardDiedError

FORMAT = "rlbuf.ray.ReplayService"
VERSION = 2
_READABLE_VERSIONS = (1, 2)  # 1: no "parts" binding the shards' checkpoints


def write_checkpoint(path: Path, save_shards: Callable[[Path], list[Any]], fields: dict[str, Any]) -> None:
    """Write a service checkpoint at ``path``: shards first (``save_shards(staging)`` returns what each
    shard's ``shard_save`` returned: its limiter counters, write count and manifest digest), then
    ``service.json``, in a sibling directory renamed into place.

    Raises:
        CheckpointError: ``path`` holds something that is not a service checkpoint.
    """
    if path.exists() and not (path / "service.json").is_file():
        raise CheckpointError(f"{path}: expected a ReplayService checkpoint directory (service.json) or no file; "
                              "choose another path")
    staging = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:12]}"
    try:
        saved = save_shards(staging)
        parts = [{"shard": k, "write_count": part["write_count"], "manifest_sha256": part["manifest_sha256"]}
                 for k, part in enumerate(saved)]
        manifest = {"format": FORMAT, "version": VERSION, **fields,
                    "limiter_counters": [part["limiter"] for part in saved], "parts": parts}
        (staging / "service.json").write_text(json.dumps(manifest, indent=1), encoding="utf-8")
        # One atomic exchange (renameat2): a learner killed here leaves the old checkpoint or the new one whole at
        # path, never neither; where the kernel lacks it, two renames with a moment between them.
        if not path.exists():
            staging.rename(path)
        elif not exchange(staging, path):
            old = path.parent / f".{path.name}.old-{uuid.uuid4().hex[:12]}"
            path.rename(old)
            staging.rename(path)
            shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def restore_shards(path: Path, shards: list[Any], start: Callable[[int], Any], counters: list[Any],
                   get: Callable[[list[tuple[int, Any]]], list[Any]]) -> None:
    """Put the shard actors ``shards`` back to their parts at ``path`` (a service's restore): every shard first
    reads and checks its part (``shard_stage``, with its limiter ``counters``), and a dead one is started again
    from it (``start(k)``: a new actor, which then replaces it in ``shards``); only then do the others switch
    (``shard_commit``). ``get`` is the service's: results of ``(shard, ref)`` calls.

    Raises:
        CheckpointError: a part fails its checks; no shard changed (the actors started again are stopped).
    """
    dead = []
    for k, shard in enumerate(shards):
        try:
            get([(k, shard.shard_stage.remote(str(path / f"shard_{k}"), counters[k]))])
        except ShardDiedError:
            dead.append(k)
    restarted = {k: start(k) for k in dead}
    try:
        get([(k, actor.shard_info.remote()) for k, actor in restarted.items()])
    except BaseException:
        for actor in restarted.values():
            stop(actor)
        raise
    get([(k, shard.shard_commit.remote()) for k, shard in enumerate(shards) if k not in restarted])
    for k, actor in restarted.items():
        shards[k] = actor


def read_manifest(path: Path) -> dict[str, Any]:
    """``service.json``, checked: the shape and state a service is rebuilt from."""
    file = path / "service.json"
    try:
        manifest = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise CheckpointError(f"{file}: expected a ReplayService checkpoint's service.json, could not read it "
                              f"({error}); pass the directory ReplayService.save wrote") from error
    if (not isinstance(manifest, dict) or manifest.get("format") != FORMAT
            or manifest.get("version") not in _READABLE_VERSIONS):
        got = (manifest.get("format"), manifest.get("version")) if isinstance(manifest, dict) else manifest
        raise CheckpointError(f"{file}: expected format {FORMAT!r} version {' or '.join(map(str, _READABLE_VERSIONS))}"
                              f", got {got!r}")
    num_shards, capacity = manifest.get("num_shards"), manifest.get("shard_capacity")
    for name, value in (("num_shards", num_shards), ("shard_capacity", capacity)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise CheckpointError(f"{file}: {name}: expected an int >= 1, got {value!r}")
    counters = manifest.get("limiter_counters")
    if not isinstance(counters, list) or len(counters) != num_shards:
        raise CheckpointError(f"{file}: limiter_counters: expected one entry per shard ({num_shards}), got {counters!r}")
    writer_next = manifest.get("writer_next")
    if isinstance(writer_next, bool) or not isinstance(writer_next, int) or not 0 <= writer_next < num_shards:
        raise CheckpointError(f"{file}: writer_next: expected an int in [0, {num_shards}), got {writer_next!r}")
    try:
        np.random.PCG64().state = manifest["rng"]
        limiter = manifest.get("rate_limiter")
        if limiter is not None:
            for shard_counters in counters:
                RateLimiter.from_config(limiter, shard_counters)
    except (TypeError, ValueError, KeyError, ConfigError) as error:
        raise CheckpointError(f"{file}: {error}") from error
    stats = manifest.get("shard_stats")
    keys = {"size", "mass", "smallest", "limiter"}
    if stats is not None and (not isinstance(stats, list) or len(stats) != num_shards
                              or not all(isinstance(stat, dict) and keys <= set(stat) for stat in stats)):
        raise CheckpointError(f"{file}: shard_stats: expected null or one {sorted(keys)} entry per shard")
    missing = [k for k in range(num_shards) if not (path / f"shard_{k}").is_dir()]
    if missing:
        raise CheckpointError(f"{path}: expected shard_0 .. shard_{num_shards - 1}, missing {missing}")
    _check_parts(path, manifest)
    return manifest


def part_digest(part: Path) -> str:
    """The SHA-256 of a shard's checkpoint manifest, which lists each of its files' checksums: the part, named whole.

    Raises:
        CheckpointError: the part has no readable manifest.
    """
    try:
        return hashlib.sha256((part / MANIFEST).read_bytes()).hexdigest()
    except OSError as error:
        raise CheckpointError(f"{part / MANIFEST}: expected a shard's checkpoint manifest, could not read it ({error})"
                              "; restore the directory ReplayService.save wrote, whole") from error


def _check_parts(path: Path, manifest: dict[str, Any]) -> None:
    """Refuse parts other than those ``service.json`` binds (version 1, which binds none: a part found twice)."""
    num_shards = manifest["num_shards"]
    digests = [part_digest(path / f"shard_{k}") for k in range(num_shards)]
    if manifest["version"] == 1:
        for k, digest in enumerate(digests):
            first = digests.index(digest)
            if first != k:
                raise CheckpointError(f"{path}: shard_{k} is the same part as shard_{first} (identical manifests): "
                                      "one shard's rows copied over another's would be stored twice; restore the "
                                      "directory ReplayService.save wrote, whole")
        return
    parts = manifest.get("parts")
    keys = {"shard", "write_count", "manifest_sha256"}
    if (not isinstance(parts, list) or len(parts) != num_shards
            or not all(isinstance(part, dict) and set(part) == keys and part["shard"] == k
                       for k, part in enumerate(parts))):
        raise CheckpointError(f"{path / 'service.json'}: parts: expected one {sorted(keys)} entry per shard, shard "
                              f"0 first, got {parts!r}")
    for k, (part, digest) in enumerate(zip(parts, digests, strict=True)):
        if part["manifest_sha256"] != digest:
            raise CheckpointError(
                f"{path / f'shard_{k}'}: expected the part service.json binds (write count {part['write_count']}, "
                f"manifest SHA-256 {part['manifest_sha256']}), got a manifest hashing to {digest}: this shard's part "
                "was replaced (copied from another shard or another save); restore the directory ReplayService.save "
                "wrote, whole")
