"""How fast are rlbuf's checkpoints, next to writing the same bytes raw and to TorchRL's dumps/loads?

A ReplayBuffer of 1,000,000 transitions (obs 48 float32, action 4 float32: 407 MB of
fields), full of random data, for each storage (``memory``, ``memmap``). Peers:

* ``numpy tofile`` / ``numpy fromfile``: every field array written to / read from its own file,
  nothing else (no checksum, no fsync, no metadata): the floor.
* ``tofile + fsync``: the same writes, each file fsynced: what any durable save must pay.
* ``torchrl dumps`` / ``torchrl loads``: TorchRL 0.14.1's own ``rb.dumps(dir)`` and, into a
  fresh rlbuf buffer of the same options, ``rb.loads(dir)`` (no checksum, no fsync; it
  unpickles a ``prefetch.pkl`` when present).
* ``rlbuf save`` / ``rlbuf load``: ``buf.save(path)`` over the previous checkpoint (XXH3-128 of
  every file while it is written, fsync, every file read back and verified, atomic swap, the
  replaced version removed) and ``ReplayBuffer.load(path)`` (verifies every checksum, builds
  the buffer, copies the rows in).
* ``save, keep_spare``: ``buf.save(path, keep_spare=True)`` over the previous checkpoint: the
  replaced version is kept as the spare whose files the next save rewrites in place (twice the
  disk between saves). On a disk where allocating blocks is slow (ext4 mounted with ``discard``
  on a thin-provisioned virtual disk) writing new blocks cost about 4x writing over allocated
  ones, which is what the spare was made for.

``--spare`` times only repeated saves to one path with and without ``keep_spare``, interleaved,
of two realistic buffers: 1,000,000 MuJoCo-sized rows (the buffer above, 407 MB) and 100,000
Atari-sized rows (84x84 uint8 frames as ``obs`` and ``next_obs``: 1.4 GB); the ratio is what
the spare buys on this disk (docs/checkpoints.md).

Loads build a new buffer and close it (a memmap buffer writes its rows into a new scratch
directory); ``fromfile`` only allocates arrays. Files stay in the page cache between runs,
so loads measure verification and copying, not the disk. To show where the time goes:
``xxh3`` rows time the checksums alone (all 407 MB on one thread, and one thread per file
on two threads, as ``save`` and ``load`` run them; ``sha256`` is what format 1 checkpoints
used), ``tofile + fsync`` less ``numpy tofile``
is what durability costs, and ``load_state`` is verification and mapping alone, without
building the buffer and copying the rows in.

Every call starts with ``os.sync()`` (not timed), so a peer that does not fsync leaves no
writeback for the next peer to wait for. Each table gives median seconds over rounds in
which every peer runs once, in rotating order (as ``_timing.py`` does), and rlbuf's time
divided by each peer's (below 1: rlbuf is faster). The targets (issue 10): save ≤ 1.5×
``tofile + fsync`` of the same bytes, load ≤ 1.2× ``fromfile``.

One torch thread. Run from the repository root::

    PYTHONPATH=. python benchmarks/checkpoint.py           # about 5 minutes on 2 cores
    PYTHONPATH=. python benchmarks/checkpoint.py --quick   # 100,000 transitions, a smoke run
    PYTHONPATH=. python benchmarks/checkpoint.py --spare   # saves with and without the spare
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import importlib.metadata
import logging
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
import xxhash
from tensordict import TensorDict

from rlbuf import ReplayBuffer
from rlbuf.checkpoint import load_state

_SAVE_TARGET = 1.5
_LOAD_TARGET = 1.2


def empty_buffer(rows: int, storage: str) -> ReplayBuffer:
    return ReplayBuffer(rows, obs_shape=(48,), action_shape=(4,), storage=storage, seed=0)  # type: ignore[arg-type]


def filled_buffer(rows: int, storage: str) -> ReplayBuffer:
    """A full ReplayBuffer of ``rows`` random transitions (random bytes: nothing compresses)."""
    buf = empty_buffer(rows, storage)
    generator = torch.Generator().manual_seed(0)
    block = 250_000
    for start in range(0, rows, block):
        n = min(block, rows - start)
        terminated = torch.rand(n, 1, generator=generator) < 0.01
        buf.extend(TensorDict({
            "observation": torch.randn(n, 48, generator=generator),
            "action": torch.rand(n, 4, generator=generator) * 2 - 1,
            ("next", "observation"): torch.randn(n, 48, generator=generator),
            ("next", "reward"): torch.randn(n, 1, generator=generator),
            ("next", "terminated"): terminated,
            ("next", "truncated"): ~terminated & (torch.rand(n, 1, generator=generator) < 0.01),
        }, batch_size=[n]))
    return buf


def time_synced(peers: Mapping[str, Callable[[], object]], *, repeats: int) -> dict[str, float]:
    """Median seconds per call of each peer; every call starts after an untimed ``os.sync()``.

    One warm-up call each, then ``repeats`` rounds, each timing every peer once in a rotating
    order, so a burst of load from another process lands on all peers alike.
    """
    names = list(peers)
    for name in names:
        peers[name]()
    samples: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(repeats):
        shift = round_ % len(names)
        for name in names[shift:] + names[:shift]:
            gc.collect()
            os.sync()
            start = time.perf_counter()
            peers[name]()
            samples[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in samples.items()}


def digest_all(arrays: Mapping[str, np.ndarray], pool: ThreadPoolExecutor | None,
               algorithm: Callable[[], object] = xxhash.xxh3_128) -> None:
    def digest(array: np.ndarray) -> str:
        hasher = algorithm()
        hasher.update(memoryview(array).cast("B"))  # type: ignore[attr-defined]
        return hasher.hexdigest()  # type: ignore[attr-defined,no-any-return]

    if pool is None:
        for array in arrays.values():
            digest(array)
    else:
        list(pool.map(digest, arrays.values()))


def peers(buf: ReplayBuffer, storage: str, scratch: Path,
          pool: ThreadPoolExecutor) -> tuple[dict[str, Callable[[], object]], dict[str, Callable[[], object]]]:
    """The save peers and the load peers for ``buf``, writing under ``scratch``."""
    arrays = {name: leaf[: len(buf)].numpy() for name, leaf in buf._ring.leaves.items()}
    raw_dir, torchrl_dir, checkpoint = scratch / "raw", scratch / "torchrl", scratch / "checkpoint"
    spared = scratch / "spared"
    raw_dir.mkdir()

    def tofile(durable: bool) -> None:
        for name, array in arrays.items():
            with open(raw_dir / name, "wb") as file:
                array.tofile(file)
                if durable:
                    file.flush()
                    os.fsync(file.fileno())

    def fromfile() -> object:
        return {name: np.fromfile(raw_dir / name, dtype=array.dtype) for name, array in arrays.items()}

    def torchrl_loads() -> None:
        fresh = empty_buffer(len(buf), storage)
        rb = fresh._ring.rb
        super(type(rb), rb).loads(torchrl_dir)  # TorchRL's own loads: rlbuf's buffer.torchrl refuses it
        fresh.close()

    def rlbuf_load() -> None:
        ReplayBuffer.load(checkpoint).close()

    saves: dict[str, Callable[[], object]] = {
        "numpy tofile": lambda: tofile(False),
        "tofile + fsync": lambda: tofile(True),
        "torchrl dumps": lambda: buf.torchrl.dumps(torchrl_dir),
        "sha256, 1 thread": lambda: digest_all(arrays, None, hashlib.sha256),
        "xxh3, 1 thread": lambda: digest_all(arrays, None),
        "xxh3, 2 threads": lambda: digest_all(arrays, pool),
        "rlbuf save": lambda: buf.save(checkpoint),
        "save, keep_spare": lambda: buf.save(spared, keep_spare=True),
    }
    loads: dict[str, Callable[[], object]] = {
        "numpy fromfile": fromfile,
        "torchrl loads": torchrl_loads,
        "load_state": lambda: load_state(checkpoint, kind="ReplayBuffer"),
        "rlbuf load": rlbuf_load,
    }
    for save in ("numpy tofile", "torchrl dumps", "rlbuf save"):  # the loads need files to read
        saves[save]()
    return saves, loads


def print_table(title: str, medians: Mapping[str, float], ours: str, megabytes: float) -> None:
    """Median seconds and GB/s of each peer, and ``ours`` divided by each."""
    width = max(len(name) for name in medians)
    header = f"{'peer':<{width}}  {'s':>7}  {'GB/s':>6}  {ours + ' ÷':>{len(ours) + 2}}"
    print(f"\n{title}")
    print(header)
    print("-" * len(header))
    for name, seconds in medians.items():
        print(f"{name:<{width}}  {seconds:>7.3f}  {megabytes / 1e3 / seconds:>6.2f}  "
              f"{medians[ours] / seconds:>{len(ours) + 2}.2f}")


def atari_buffer(rows: int) -> ReplayBuffer:
    """A full ReplayBuffer of ``rows`` random 84x84 uint8 frames (``obs`` and ``next_obs``)."""
    buf = ReplayBuffer(rows, obs_shape=(84, 84), action_shape=(), obs_dtype=torch.uint8,
                       action_dtype=torch.int64, seed=0)
    generator = torch.Generator().manual_seed(0)
    block = 10_000
    for start in range(0, rows, block):
        n = min(block, rows - start)
        terminated = torch.rand(n, 1, generator=generator) < 0.01
        buf.extend(TensorDict({
            "observation": torch.randint(0, 256, (n, 84, 84), generator=generator, dtype=torch.uint8),
            "action": torch.randint(0, 18, (n,), generator=generator),
            ("next", "observation"): torch.randint(0, 256, (n, 84, 84), generator=generator, dtype=torch.uint8),
            ("next", "reward"): torch.randn(n, 1, generator=generator),
            ("next", "terminated"): terminated,
            ("next", "truncated"): torch.zeros(n, 1, dtype=torch.bool),
        }, batch_size=[n]))
    return buf


def time_spare(buf: ReplayBuffer, scratch: Path, repeats: int) -> dict[str, float]:
    """Median seconds of repeated saves of ``buf`` to one path without and with ``keep_spare``."""
    saves: dict[str, Callable[[], object]] = {
        "save (default: no spare)": lambda: buf.save(scratch / "plain"),
        "save, keep_spare=True": lambda: buf.save(scratch / "spared", keep_spare=True),
    }
    saves["save (default: no spare)"]()  # a checkpoint to replace from the first timed save on
    return time_synced(saves, repeats=repeats)


def spare_main(quick: bool) -> None:
    """Repeated saves to one path without and with ``keep_spare``, interleaved; the ratio of medians."""
    repeats = 3 if quick else 9
    cases: list[tuple[str, Callable[[], ReplayBuffer]]] = [
        ("MuJoCo-sized", lambda: filled_buffer(100_000 if quick else 1_000_000, "memory")),
        ("Atari-sized", lambda: atari_buffer(10_000 if quick else 100_000)),
    ]
    print(f"saves with and without the spare; median seconds of {repeats} interleaved rounds, "
          f"os.sync() before each save")
    summary = []
    for name, build in cases:
        scratch = Path(tempfile.mkdtemp(prefix="rlbuf-bench-spare-"))
        buf = build()
        try:
            rows = len(buf)
            megabytes = sum(leaf[:rows].numel() * leaf.element_size() for leaf in buf._ring.leaves.values()) / 1e6
            medians = time_spare(buf, scratch, repeats)
            print_table(f"{name} · {rows:,} rows · {megabytes:.0f} MB", medians, "save, keep_spare=True", megabytes)
            summary.append((name, rows, megabytes, medians))
        finally:
            buf.close()
            gc.collect()
            shutil.rmtree(scratch, ignore_errors=True)
    print("\nwhat the spare buys (time without ÷ time with; above 1: the spare makes saves faster)")
    for name, rows, megabytes, medians in summary:
        ratio = medians["save (default: no spare)"] / medians["save, keep_spare=True"]
        print(f"  {name:<13} {rows:>9,} rows {megabytes:>6.0f} MB  {ratio:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100,000 transitions and 3 rounds: a smoke run")
    parser.add_argument("--spare", action="store_true", help="only saves with and without the spare")
    args = parser.parse_args()
    logging.getLogger("torchrl").setLevel(logging.WARNING)  # storage-initialised notices
    torch.set_num_threads(1)
    if args.spare:
        spare_main(args.quick)
        return
    rows, repeats = (100_000, 3) if args.quick else (1_000_000, 11)
    versions = ", ".join(f"{name} {importlib.metadata.version(name)}" for name in ("torch", "torchrl", "numpy"))
    print(f"rlbuf checkpoint benchmark{' (--quick)' if args.quick else ''}: {rows:,} transitions; {versions}; "
          f"1 torch thread; median seconds of {repeats} interleaved rounds")
    started = time.perf_counter()
    ratios: list[tuple[str, float, float, float]] = []
    for storage in ("memory", "memmap"):
        scratch = Path(tempfile.mkdtemp(prefix="rlbuf-bench-checkpoint-"))
        buf = filled_buffer(rows, storage)
        pool = ThreadPoolExecutor(max_workers=2)
        try:
            megabytes = sum(leaf[:rows].numel() * leaf.element_size() for leaf in buf._ring.leaves.values()) / 1e6
            saves, loads = peers(buf, storage, scratch, pool)
            saved = time_synced(saves, repeats=repeats)
            print_table(f"save · storage={storage} · {megabytes:.0f} MB", saved, "rlbuf save", megabytes)
            loaded = time_synced(loads, repeats=repeats)
            print_table(f"load · storage={storage} · {megabytes:.0f} MB", loaded, "rlbuf load", megabytes)
            ratios += [
                (f"save {storage:<6} ≤ {_SAVE_TARGET}× tofile + fsync", _SAVE_TARGET,
                 saved["rlbuf save"] / saved["tofile + fsync"], saved["rlbuf save"] / saved["numpy tofile"]),
                ("  with keep_spare=True", _SAVE_TARGET, saved["save, keep_spare"] / saved["tofile + fsync"],
                 saved["save, keep_spare"] / saved["numpy tofile"]),
                (f"load {storage:<6} ≤ {_LOAD_TARGET}× numpy fromfile", _LOAD_TARGET,
                 loaded["rlbuf load"] / loaded["numpy fromfile"], loaded["rlbuf load"] / loaded["torchrl loads"]),
            ]
        finally:
            pool.shutdown()
            buf.close()
            del buf
            gc.collect()
            shutil.rmtree(scratch, ignore_errors=True)
    print("\ntargets (ratio = rlbuf time ÷ the raw peer's; in brackets: ÷ numpy tofile without fsync for saves, "
          "÷ torchrl loads for loads)")
    for what, target, ratio, other in ratios:
        print(f"  {'PASS' if ratio <= target else 'MISS'}  {what:<36} ratio {ratio:.2f}  [{other:.2f}]")
    print(f"\ntotal {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
