"""Timing helpers shared by the benchmark scripts: interleaved medians and a ratio table.

The machines these run on are small and busy. Each repeat times every peer once, in a
rotating order, and the median over repeats is reported, so a burst of load from another
process lands on all peers alike instead of on one peer's whole run.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Mapping, Sequence


def time_interleaved(peers: Mapping[str, Callable[[], object]], *, repeats: int,
                     number: int, sync: Callable[[], object] = lambda: None,
                     clock: Callable[[], float] = time.perf_counter) -> dict[str, float]:
    """Median seconds per call of each peer.

    Args:
        peers: the callables to time, by name.
        repeats: rounds; each round times every peer once, in a rotating order.
        number: calls per peer per round; one round's time divided by it is one sample.
        sync: waits for queued device work (``torch.cuda.synchronize``), called before each
            round starts and before it is stopped, so a round counts the work it launched.
        clock: what a round is timed by: wall time, or ``time.thread_time`` (this thread's CPU
            time, which leaves out the time other processes hold the cores) for one-thread CPU work.

    Returns:
        The median over rounds of each peer's seconds per call.
    """
    names = list(peers)
    for name in names:  # warm up: caches, lazy initialisation, steady-state buffers
        for _ in range(number):
            peers[name]()
    samples: dict[str, list[float]] = {name: [] for name in names}
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for round_ in range(repeats):
            shift = round_ % len(names)
            for name in names[shift:] + names[:shift]:
                call = peers[name]
                sync()
                start = clock()
                for _ in range(number):
                    call()
                sync()
                samples[name].append((clock() - start) / number)
    finally:
        if gc_was_enabled:
            gc.enable()
    return {name: statistics.median(values) for name, values in samples.items()}


def print_table(title: str, medians: Mapping[str, float], ours: Sequence[str]) -> None:
    """Print each peer's median µs per call, and each of ``ours`` divided by that peer.

    A ratio below 1 means ``ours`` is faster than the peer on that row.
    """
    width = max(len(name) for name in medians)
    header = f"{'peer':<{width}}  {'µs/call':>10}" + "".join(f"  {name + ' ÷':>{max(len(name) + 2, 8)}}"
                                                           for name in ours)
    print(f"\n{title}")
    print(header)
    print("-" * len(header))
    for name, seconds in medians.items():
        ratios = "".join(f"  {medians[mine] / seconds:>{max(len(mine) + 2, 8)}.2f}" for mine in ours)
        print(f"{name:<{width}}  {seconds * 1e6:>10.1f}{ratios}")
