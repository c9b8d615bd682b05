"""What a save costs the writers, and the memory it needs.

A ReplayBuffer of 1,000,000 rows (obs and next_obs of 8 float32, an int64 action: 80 MB of
fields) is saved while one thread adds rows, one at a time, as fast as it can. Reported as
ratios, medians over rounds (each round: one second of adds without a save, then adds during
one save):

* the time the save spends re-copying, under the buffer's lock, the rows written since its
  copy began, over the whole save;
* the longest single add during a save over the whole save (how long a writer can be stopped);
* adds per second during a save over adds per second without;
* the peak memory a save adds to the process (``ru_maxrss``), over the bytes of the buffer's
  fields; for comparison the same for ``state_dict()``, which returns the rows in memory
  (Ray sends that).

The machine is shared and noisy: the ratios vary from run to run.

Run: ``PYTHONPATH=. python benchmarks/save_during_writes.py [rows] [rounds]``.
"""

from __future__ import annotations

import gc
import resource
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


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def main(rows: int = 1_000_000, rounds: int = 5) -> None:
    torch.set_num_threads(1)
    buffer = ReplayBuffer(rows, obs_shape=(8,), action_shape=(), action_dtype=torch.int64, seed=0)
    chunk = 10_000
    for start in range(0, rows, chunk):
        n = min(chunk, rows - start)
        buffer.extend(TensorDict({"observation": torch.rand(n, 8), "action": torch.zeros(n, dtype=torch.int64),
                                  ("next", "observation"): torch.rand(n, 8), ("next", "reward"): torch.rand(n),
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

    def adds(until: threading.Event | float, started: threading.Event | None = None) -> tuple[float, float]:
        """Add rows until the event is set (or for that many seconds): (adds per second, longest add)."""
        count, longest, began = 0, 0.0, time.perf_counter()
        while not until.is_set() if isinstance(until, threading.Event) else time.perf_counter() - began < until:
            before = time.perf_counter()
            buffer.add(obs, 0, 0.0, next_obs, False, truncated=False)
            longest = max(longest, time.perf_counter() - before)
            count += 1
            if started is not None and count == 1:
                started.set()
        return count / (time.perf_counter() - began), longest

    gc.collect()
    rss_before_saves = _peak_rss()
    hold, stall, throughput, save_seconds, stall_without = [], [], [], [], []
    with tempfile.TemporaryDirectory() as directory:
        for _ in range(rounds):
            baseline, longest_without = adds(1.0)
            saved, started = threading.Event(), threading.Event()
            result: list[tuple[float, float]] = []
            writer = threading.Thread(target=lambda out=result, until=saved, go=started: out.append(adds(until, go)))
            writer.start()
            started.wait()  # the writer is adding before the save begins
            began = time.perf_counter()
            held.clear()
            buffer.save(Path(directory) / "ckpt")
            took = time.perf_counter() - began
            saved.set()
            writer.join()
            save_seconds.append(took)
            hold.append(sum(held) / took)
            stall.append(result[0][1] / took)
            stall_without.append(longest_without)
            throughput.append(result[0][0] / baseline)
    save_extra = _peak_rss() - rss_before_saves
    state = buffer.state_dict()
    state_extra = _peak_rss() - rss_before_saves - save_extra
    field_bytes = sum(tensor.numel() * tensor.element_size() for tensor in state["fields"].values())
    del state
    print(f"rows={rows} ({field_bytes / 2**20:.0f} MiB of fields) rounds={rounds}; medians; noisy shared machine")
    print(f"save took                                        {statistics.median(save_seconds):.2f} s")
    print(f"row re-copy under the lock / whole save          {statistics.median(hold):.4f}")
    print(f"longest add during a save / whole save           {statistics.median(stall):.4f}"
          f"  (longest add without a save: {statistics.median(stall_without) * 1e3:.1f} ms)")
    print(f"adds/s during a save / adds/s without            {statistics.median(throughput):.2f}")
    print(f"peak memory added by save / bytes of the fields  {max(0, save_extra) / field_bytes:.3f}")
    print(f"peak memory added by state_dict / field bytes    {max(0, state_extra) / field_bytes:.3f}")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
