"""A demo's checkpoints: written whole or not at all, the newest two kept, resumed exactly.

Example:
    >>> import tempfile
    >>> from rlbuf import ReplayBuffer
    >>> from rlbuf.demos._run import setup
    >>> args = RunArgs(out=tempfile.mkdtemp() + "/run", progress=False)
    >>> out = setup(args, "demo")
    >>> buffer = ReplayBuffer(8, obs_shape=(1,), action_shape=(), seed=0)
    >>> save_checkpoint(out, "demo", args, 100, buffer, {"frames": 100}).name
    'frames-000000000100'
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import shutil
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlbuf._buffer import RingBuffer
from rlbuf.checkpoint import load_state
from rlbuf.demos._options import RunArgs
from rlbuf.demos._run import CheckpointReason, latest_checkpoint, write_json
from rlbuf.errors import CheckpointError

KEEP_CHECKPOINTS = 2
"""Checkpoints kept per run folder: the newest two (a kill while writing one leaves the other)."""


def rng_state() -> dict[str, Any]:
    """The global generators' states: torch (and CUDA), numpy, python.

    Example:
        >>> state = rng_state()
        >>> draws = torch.rand(1), np.random.rand(), random.random()
        >>> set_rng_state(state)
        >>> (torch.rand(1), np.random.rand(), random.random()) == draws
        True
    """
    numpy_state = np.random.get_state(legacy=False)
    assert isinstance(numpy_state, dict)
    numpy_state["state"]["key"] = torch.from_numpy(numpy_state["state"]["key"].astype(np.int64))
    return {"torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "numpy": numpy_state, "python": random.getstate()}


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what ``rng_state`` returned (see there for an example)."""
    torch.set_rng_state(state["torch"])
    if state["cuda"]:
        torch.cuda.set_rng_state_all(state["cuda"])
    numpy_state = dict(state["numpy"])
    numpy_state["state"] = {**numpy_state["state"], "key": numpy_state["state"]["key"].numpy().astype(np.uint32)}
    np.random.set_state(numpy_state)
    random.setstate(state["python"])


def save_checkpoint(out: Path, demo: str, args: RunArgs, frames: int, buffer: RingBuffer[Any],
                    state: dict[str, Any], reason: CheckpointReason = "scheduled") -> Path:
    """Write ``out/checkpoints/frames-<frames>`` whole or not at all; keep the newest two.

    ``state`` holds what the demo needs back (state dicts of networks and optimisers, counters);
    the global RNG states are added here. It must load with ``torch.load(weights_only=True)``.
    ``reason`` (recorded in ``meta.json``) says why it was written, for ``--resume`` to report.

    Example:
        >>> import tempfile
        >>> from rlbuf import ReplayBuffer
        >>> from rlbuf.demos._run import setup
        >>> args = RunArgs(out=tempfile.mkdtemp() + "/run", progress=False)
        >>> out = setup(args, "demo")
        >>> buffer = ReplayBuffer(8, obs_shape=(1,), action_shape=(), seed=0)
        >>> buffer.add(torch.zeros(1), 0.0, 1.0, torch.ones(1), False, truncated=False)
        >>> path = save_checkpoint(out, "demo", args, 100, buffer, {"frames": 100})
        >>> path.name, latest_checkpoint(out) == path, read_meta(path)["frames"]
        ('frames-000000000100', True, 100)
        >>> resumed = ReplayBuffer(8, obs_shape=(1,), action_shape=(), seed=0)
        >>> resume(dataclasses.replace(args, resume=str(out)), out, resumed)["frames"], len(resumed)  # doctest: +ELLIPSIS
        resuming .../run from checkpoints/frames-000000000100 (scheduled): 100 of 100000 frames done
        (100, 1)
    """
    root = out / "checkpoints"
    final = root / f"frames-{frames:012d}"
    staging = root / f".frames-{frames:012d}.tmp-{uuid.uuid4().hex[:8]}"
    staging.mkdir(parents=True)
    try:
        buffer.save(staging / "buffer")
        torch.save({**state, "rng": rng_state()}, staging / "state.pt")
        digest = _sha256(staging / "state.pt")
        write_json(staging / "meta.json", {"demo": demo, "frames": frames, "state_sha256": digest,
                                            "reason": reason, "args": dataclasses.asdict(args)})
        if final.exists():
            shutil.rmtree(final)
        os.rename(staging, final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    for old in [*sorted(root.glob("frames-*"))[:-KEEP_CHECKPOINTS], *root.glob(".frames-*.tmp-*")]:
        shutil.rmtree(old, ignore_errors=True)  # older checkpoints, and saves a kill interrupted
    return final


def read_meta(checkpoint: Path) -> dict[str, Any]:
    """The ``meta.json`` of a demo checkpoint.

    Raises:
        CheckpointError: missing or not valid JSON.
    """
    try:
        meta = json.loads((checkpoint / "meta.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise CheckpointError(f"{checkpoint / 'meta.json'}: unreadable ({error})") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("args"), dict):
        raise CheckpointError(f"{checkpoint / 'meta.json'}: not a demo checkpoint")
    return meta


def resume(args: RunArgs, out: Path, buffer: RingBuffer[Any]) -> dict[str, Any] | None:
    """On ``--resume``, restore the newest checkpoint: ``buffer`` (with the stats it feeds), the
    global RNGs; print what was resumed; return the demo's saved state. ``None`` for a fresh run,
    or a run whose only checkpoints are in a subfolder (a finished teacher: this stage starts at 0).

    Raises:
        CheckpointError: a checksum or the format does not match.
    """
    if args.resume is None:
        return None
    checkpoint = latest_checkpoint(out)
    if checkpoint is None:
        print(f"resuming {out}: no checkpoint of this stage yet, it starts at frame 0", flush=True)
        return None
    meta = read_meta(checkpoint)
    if _sha256(checkpoint / "state.pt") != meta.get("state_sha256"):
        raise CheckpointError(f"{checkpoint / 'state.pt'}: SHA-256 mismatch (corrupted)")
    # Into the buffer built by the demo (not Cls.load) so the EpisodeStats it feeds come back too.
    buffer.load_state_dict(load_state(checkpoint / "buffer", kind=type(buffer).__name__))
    state: dict[str, Any] = torch.load(checkpoint / "state.pt", weights_only=True)
    set_rng_state(state["rng"])
    print(f"resuming {out} from checkpoints/{checkpoint.name} ({meta.get('reason', 'scheduled')}): "
          f"{state['frames']} of {args.frames} frames done", flush=True)
    return state


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


