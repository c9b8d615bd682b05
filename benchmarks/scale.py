"""How many transitions/s do several writers put into one buffer, next to one process, and
what does sampling from a Ray actor cost next to sampling in-process?

Writes: every writer extends the buffer with TensorDict batches of ``--rows`` transitions
(obs 48 float32, action 4 float32, as a collector's batch) for a fixed number of batches;
a round starts when every writer is ready (a barrier, so process and Ray start-up are not
timed) and the rate is all rows written divided by the time from the first writer's start
to the last writer's end. Peers:

* ``local rlbuf``: one process, ``buffer.extend(td)`` (rlbuf's validated bulk write).
* ``local torchrl``: one process, ``buffer.torchrl.extend(td)`` (TorchRL's write, the path the
  worker processes take), on a buffer never shared.
* ``processes N`` (N = 1, 2, 4): N spawned processes extending ``buffer.torchrl`` of a
  buffer in shared memory (as ``tests/test_multiprocess.py``); writes hold the buffer's
  cross-process write lock.
* ``ray tasks N``: N Ray tasks extending a :class:`rlbuf.ray.RemoteReplayBuffer` through
  its handle, one blocking round trip per batch; the actor applies one call at a time.

Samples: median µs per ``sample(256)`` and ``sample(4096)`` of a typed batch from a full
buffer of 100,000 rows, in-process vs from the Ray actor on the same machine (serialising
the batch, a local socket and object-store copy; on a cluster add the network transfer,
about 110 KB per 256 rows here). Each repeat times both in turn (see ``_timing.py``).

Writes report the median rate over rounds and each rate divided by ``local rlbuf``'s.
One torch thread per process. Ray is optional (``pip install "rlbuf[ray]"``). From the
repository root::

    PYTHONPATH=. python benchmarks/scale.py           # about 2 minutes on 2 cores
    PYTHONPATH=. python benchmarks/scale.py --quick   # smoke run, under a minute
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import logging
import multiprocessing as mp
import os
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

import torch
from _timing import print_table, time_interleaved
from tensordict import TensorDict

from rlbuf import ReplayBuffer

OBS, ACTION, CAPACITY = 48, 4, 100_000
WORKER_COUNTS = (1, 2, 4)


def make_batch(rows: int, seed: int) -> TensorDict:
    """A collector-like batch of ``rows`` transitions."""
    generator = torch.Generator().manual_seed(seed)
    return TensorDict({
        "observation": torch.randn(rows, OBS, generator=generator),
        "action": torch.randn(rows, ACTION, generator=generator),
        ("next", "observation"): torch.randn(rows, OBS, generator=generator),
        ("next", "reward"): torch.randn(rows, 1, generator=generator),
        ("next", "terminated"): torch.zeros(rows, 1, dtype=torch.bool),
        ("next", "truncated"): torch.zeros(rows, 1, dtype=torch.bool),
        ("next", "done"): torch.zeros(rows, 1, dtype=torch.bool),
    }, batch_size=[rows])


def new_buffer() -> ReplayBuffer:
    return ReplayBuffer(CAPACITY, obs_shape=(OBS,), action_shape=(ACTION,), seed=0)


def write(extend: Callable[[TensorDict], Any], batch: TensorDict, batches: int) -> tuple[float, float]:
    """Extend ``batches`` times; the start and end time (a clock shared by every process)."""
    start = time.monotonic()
    for _ in range(batches):
        extend(batch)
    return start, time.monotonic()


def rate(spans: list[tuple[float, float]], rows: int) -> float:
    return rows / (max(end for _, end in spans) - min(start for start, _ in spans))


# -- one process -------------------------------------------------------------------------------
def local_rates(batch: TensorDict, batches: int, rounds: int) -> dict[str, float]:
    rows = batches * batch.batch_size[0]
    rlbuf_buffer, torchrl_buffer = new_buffer(), new_buffer()
    peers = {"local rlbuf": rlbuf_buffer.extend, "local torchrl": torchrl_buffer.torchrl.extend}
    samples: dict[str, list[float]] = {name: [] for name in peers}
    for round_ in range(rounds + 1):          # round 0 warms up
        for name, extend in peers.items():
            measured = rate([write(extend, batch, batches)], rows)
            if round_:
                samples[name].append(measured)
    return {name: statistics.median(values) for name, values in samples.items()}


# -- worker processes --------------------------------------------------------------------------
def process_writer(rb: Any, rows: int, batches: int, rounds: int, seed: int, barrier: Any, results: Any) -> None:
    torch.set_num_threads(1)
    batch = make_batch(rows, seed)
    for _ in range(rounds + 1):
        barrier.wait()
        results.put(write(rb.extend, batch, batches))


def process_rates(workers: int, rows: int, batches: int, rounds: int) -> float:
    buffer = new_buffer()
    context = mp.get_context("spawn")
    barrier, results = context.Barrier(workers + 1), context.Queue()
    procs = [context.Process(target=process_writer, args=(buffer.torchrl, rows, batches, rounds, w, barrier, results))
             for w in range(workers)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)     # the one-time sharing-strategy notice
        for proc in procs:
            proc.start()
    rates = []
    for round_ in range(rounds + 1):
        barrier.wait()
        spans = [results.get(timeout=300) for _ in range(workers)]
        if round_:
            rates.append(rate(spans, workers * rows * batches))
    for proc in procs:
        proc.join(timeout=60)
    if len(buffer) != min(CAPACITY, (rounds + 1) * workers * rows * batches):
        raise RuntimeError(f"processes {workers}: {len(buffer)} rows stored, some writes were lost")
    buffer.close()
    return statistics.median(rates)


# -- Ray ---------------------------------------------------------------------------------------
def ray_benchmarks(batch: TensorDict, batches: int, rounds: int, sample_repeats: int,
                   local: ReplayBuffer) -> tuple[dict[str, float], dict[str, float]]:
    import asyncio

    import ray

    from rlbuf.ray import RemoteReplayBuffer, RemoteReplayBufferHandle

    @ray.remote(num_cpus=0)
    class Barrier:
        def __init__(self, parties: int) -> None:
            self.parties, self.arrived, self.event = parties, 0, asyncio.Event()

        async def wait(self) -> None:
            self.arrived += 1
            if self.arrived == self.parties:
                self.event.set()
            await self.event.wait()

    @ray.remote(num_cpus=1)
    def ray_writer(buffer: RemoteReplayBufferHandle, rows: int, batches: int, seed: int,
                   barrier: Any) -> tuple[float, float]:
        torch.set_num_threads(1)
        chunk = make_batch(rows, seed)
        buffer.extend(chunk)                  # warm: imports, connection to the actor
        ray.get(barrier.wait.remote())
        return write(buffer.extend, chunk, batches)

    rows = batch.batch_size[0]
    ray.init(num_cpus=1 + max(WORKER_COUNTS), include_dashboard=False, log_to_driver=False,
             _node_ip_address="127.0.0.1")
    rates: dict[str, float] = {}
    try:
        with RemoteReplayBuffer(CAPACITY, obs_shape=(OBS,), action_shape=(ACTION,), seed=0) as remote:
            for workers in WORKER_COUNTS:
                measured = []
                for round_ in range(rounds + 1):
                    barrier = Barrier.remote(workers)  # type: ignore[attr-defined]
                    spans = ray.get([ray_writer.remote(remote, rows, batches, w, barrier) for w in range(workers)])
                    if round_:
                        measured.append(rate(spans, workers * rows * batches))
                rates[f"ray tasks {workers}"] = statistics.median(measured)
            while len(remote) < CAPACITY:
                remote.extend(batch)
            samples = {}
            for size in (256, 4096):
                samples.update(time_interleaved({
                    f"local sample {size}": lambda size=size: local.sample(size),
                    f"ray sample {size}": lambda size=size: remote.sample(size),
                }, repeats=sample_repeats, number=20))
    finally:
        ray.shutdown()
    return rates, samples


def print_rates(rates: dict[str, float], baseline: str) -> None:
    width = max(len(name) for name in rates)
    print(f"\nwrites: transitions/s (median over rounds); '÷ {baseline}': the row's rate divided by it")
    header = f"{'writer':<{width}}  {'rows/s':>12}  {'÷ ' + baseline:>16}"
    print(header)
    print("-" * len(header))
    for name, value in rates.items():
        print(f"{name:<{width}}  {value:>12,.0f}  {value / rates[baseline]:>16.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer batches and rounds: a smoke run")
    parser.add_argument("--rows", type=int, default=64, help="transitions per extend (default 64)")
    args = parser.parse_args()
    logging.getLogger("torchrl").setLevel(logging.WARNING)
    torch.set_num_threads(1)
    batches, rounds, sample_repeats = (100, 1, 3) if args.quick else (400, 3, 9)
    versions = ", ".join(f"{name} {importlib.metadata.version(name)}" for name in ("torch", "torchrl", "tensordict"))
    has_ray = importlib.util.find_spec("ray") is not None
    if has_ray:
        versions += f", ray {importlib.metadata.version('ray')}"
    print(f"rlbuf scale benchmark{' (--quick)' if args.quick else ''}: {versions}; {os.cpu_count()} CPUs; "
          f"{args.rows} rows per extend, {batches} extends per writer per round, {rounds} rounds")
    started = time.perf_counter()
    batch = make_batch(args.rows, seed=0)
    rates = local_rates(batch, batches, rounds)
    for workers in WORKER_COUNTS:
        rates[f"processes {workers}"] = process_rates(workers, args.rows, batches, rounds)
    local = new_buffer()
    while len(local) < CAPACITY:
        local.extend(batch)
    samples: dict[str, float] = {}
    if has_ray:
        ray_rates, samples = ray_benchmarks(batch, batches, rounds, sample_repeats, local)
        rates.update(ray_rates)
    print_rates(rates, "local rlbuf")
    if samples:
        for size in (256, 4096):
            print_table(f"sample {size}: median µs per call", {k: v for k, v in samples.items() if k.endswith(f" {size}")},
                        ours=[f"ray sample {size}"])
    else:
        print("\nray is not installed: Ray writers and remote sampling skipped")
    print(f"\ntotal {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
