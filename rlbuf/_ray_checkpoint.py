"""The on-disk form of a [`ReplayService`][rlbuf.ray.ReplayService]: ``service.json`` and one rlbuf checkpoint per shard.

```
path/service.json   format, version, num_shards, shard_capacity, rate_limiter settings, each shard's
                    limiter counters, the learner's split generator, its round-robin cursor and
                    what it last heard from each shard (sizes, priority mass: the next split)
path/shard_<k>/     shard k's ReplayBuffer checkpoint (rlbuf's format: checksummed, never unpickled)
```

Example:
    >>> read_manifest(Path("/nonexistent/replay"))
    Traceback (most recent call last):
    ...
    rlbuf.errors.CheckpointError: /nonexistent/replay/service.json: expected a ReplayService checkpoint's service.json, could not read it ([Errno 2] No such file or directory: '/nonexistent/replay/service.json'); pass the directory ReplayService.save wrote
"""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from rlbuf._rate_limit import RateLimiter
from rlbuf._savedir import exchange
from rlbuf.errors import CheckpointError, ConfigError

FORMAT = "rlbuf.ray.ReplayService"
VERSION = 1


def write_checkpoint(path: Path, save_shards: Callable[[Path], list[Any]], fields: dict[str, Any]) -> None:
    """Write a service checkpoint at ``path``: shards first (``save_shards(staging)`` returns their
    limiter counters), then ``service.json``, in a sibling directory renamed into place.

    Raises:
        CheckpointError: ``path`` holds something that is not a service checkpoint.
    """
    if path.exists() and not (path / "service.json").is_file():
        raise CheckpointError(f"{path}: expected a ReplayService checkpoint directory (service.json) or no file; "
                              "choose another path")
    staging = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:12]}"
    try:
        counters = save_shards(staging)
        manifest = {"format": FORMAT, "version": VERSION, **fields, "limiter_counters": counters}
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


def read_manifest(path: Path) -> dict[str, Any]:
    """``service.json``, checked: the shape and state a service is rebuilt from."""
    file = path / "service.json"
    try:
        manifest = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise CheckpointError(f"{file}: expected a ReplayService checkpoint's service.json, could not read it "
                              f"({error}); pass the directory ReplayService.save wrote") from error
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise CheckpointError(f"{file}: expected format {FORMAT!r} version {VERSION}, got "
                              f"{manifest.get('format') if isinstance(manifest, dict) else manifest!r}")
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
    return manifest
