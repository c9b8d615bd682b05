"""What a save costs the writers: lock hold time of a save, and writer throughput during a save.

A 1M-row ReplayBuffer (obs of 8 floats) is saved while one thread adds rows. Reported as ratios:
the time the save holds the buffer's lock over the whole save, and adds per second during
saves over adds per second without. Rounds are interleaved and medians taken; the machine is
shared, so the figures are noisy.

Run: `PYTHONPATH=. python benchmarks/save_during_writes.py [rows] [rounds]`.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
from tensordict import TensorDict

import rlbuf.checkpoint as checkpoint
from rlbuf import ReplayBuffer


def main(rows: int = 1_000_000, rounds: int = 3) -> None:
    buffer = ReplayBuffer(rows, obs_shape=(8,), action_shape=(), seed=0)
    chunk = 10_000
    for start in range(0, rows, chunk):
        n = min(chunk, rows - start)
        buffer.extend(TensorDict({"observation": torch.zeros(n, 8), "action": torch.zeros(n, dtype=torch.int64),
                                  ("next", "observation"): torch.zeros(n, 8), ("next", "reward"): torch.zeros(n),
                                  ("next", "terminated"): torch.zeros(n, dtype=torch.bool),
                                  ("next", "truncated"): torch.zeros(n, dtype=torch.bool)}, batch_size=[n]))
    held: list[float] = []
    patch = checkpoint.RowFiles.patch

    def timed_patch(self: checkpoint.RowFiles, *args: object) -> object:
        began = time.perf_counter()
        try:
            return patch(self, *args)  # type: ignore[arg-type]
        finally:
            held.append(time.perf_counter() - began)

    checkpoint.RowFiles.patch = timed_patch  # type: ignore[method-assign]
    obs, next_obs = torch.zeros(8), torch.zeros(8)

    def adds_per_second(seconds: float | None, until: threading.Event | None = None) -> float:
        count, began = 0, time.perf_counter()
        while (until is None and time.perf_counter() - began < (seconds or 0)) or (until is not None and not until.is_set()):
            buffer.add(obs, 0, 0.0, next_obs, False)
            count += 1
        return count / (time.perf_counter() - began)

    hold_ratios, throughput_ratios, save_seconds = [], [], []
    with tempfile.TemporaryDirectory() as directory:
        for _ in range(rounds):
            baseline = adds_per_second(1.0)
            saved = threading.Event()
            result: list[float] = []
            writer = threading.Thread(target=lambda out=result, until=saved: out.append(adds_per_second(None, until)))
            writer.start()
            began = time.perf_counter()
            held.clear()
            buffer.save(Path(directory) / "ckpt")
            took = time.perf_counter() - began
            saved.set()
            writer.join()
            save_seconds.append(took)
            hold_ratios.append(sum(held) / took)
            throughput_ratios.append(result[0] / baseline)
    print(f"rows={rows} rounds={rounds} save={statistics.median(save_seconds):.2f}s (median)")
    print(f"lock held by the row re-copy / whole save: {statistics.median(hold_ratios):.4f} (median)")
    print(f"adds/s during a save / adds/s without:     {statistics.median(throughput_ratios):.2f} (median)")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
