"""How fast do writers fill, and a learner sample, rlbuf's Ray replay service next to TorchRL's
``RayReplayBuffer``, in the same run on the same local Ray cluster?

Inserted rows/s: two writer actors (one CPU each) extend the buffer with TensorDict batches of
``--rows`` rows of about 200 bytes (observation and next observation 23 float32 each, an int64
action, a float32 reward, three flags), ``--batches`` batches each, every call one blocking
round trip. The clock runs from the first writer's start to the last one's end, after a
barrier (actor start-up is not timed). Learner batches/s: ``sample(256)`` in a loop on a
filled buffer, no writers, rounds interleaved across peers, median over rounds.

Peers (each buffer's actors take no CPU reservation; the writers take one each):

* ``torchrl RayReplayBuffer``: TorchRL's actor around its ``ReplayBuffer`` with a
  ``LazyTensorStorage``; writers use ``rb.client()``; ``sample`` returns a TensorDict.
* ``rlbuf RemoteReplayBuffer``: one rlbuf ``ReplayBuffer`` behind one actor (validated rows,
  typed batches).
* ``rlbuf ReplayService, 2 shards``: two shard actors; each writer sends round-robin; a
  sample asks both shards their size, then draws from each (two round trips).
* ``... + rate limiter``: the same with a ``RateLimiter`` whose band never binds here, so what
  it costs is its checks and, on ``sample``, the extra round trip that waits on every shard.

Ratios are to TorchRL's ``RayReplayBuffer``. From the repository root::

    PYTHONPATH=. python benchmarks/ray_service.py            # about 3 minutes on 2 cores
    PYTHONPATH=. python benchmarks/ray_service.py --quick    # smoke run
"""

from __future__ import annotations

import argparse
import logging
import statistics
import time
import warnings
from functools import partial
from typing import Any

import torch
from tensordict import TensorDict

OBS = 23  # 2 x 92 B of observations + 8 + 4 + 3 = 199 bytes a row
BATCH = 256


def make_rows(rows: int, seed: int) -> TensorDict:
    """``rows`` transitions in TorchRL layout, about 200 bytes each."""
    generator = torch.Generator().manual_seed(seed)
    terminated = torch.rand(rows, 1, generator=generator) < 0.01
    return TensorDict({
        "observation": torch.randn(rows, OBS, generator=generator),
        "action": torch.randint(0, 4, (rows,), generator=generator),
        ("next", "observation"): torch.randn(rows, OBS, generator=generator),
        ("next", "reward"): torch.randn(rows, 1, generator=generator),
        ("next", "terminated"): terminated,
        ("next", "truncated"): torch.zeros(rows, 1, dtype=torch.bool),
        ("next", "done"): terminated.clone(),
    }, batch_size=[rows])


class Writer:
    """A writer actor: extends ``target`` with one prepared batch ``batches`` times."""

    def __init__(self, rows: int, seed: int) -> None:
        torch.set_num_threads(1)
        self.td = make_rows(rows, seed)

    def ready(self) -> bool:
        return True

    def write(self, target: Any, batches: int) -> tuple[float, float]:
        start = time.time()
        for _ in range(batches):
            target.extend(self.td)
        return start, time.time()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1024, help="rows per writer batch")
    parser.add_argument("--batches", type=int, default=100, help="batches per writer per round")
    parser.add_argument("--rounds", type=int, default=3, help="write rounds and sample rounds")
    parser.add_argument("--samples", type=int, default=100, help="sample(256) calls per peer per round")
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    args = parser.parse_args()
    if args.quick:
        args.batches, args.rounds, args.samples = 10, 1, 20
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")

    import ray
    from torchrl.data import LazyTensorStorage, RayReplayBuffer

    from rlbuf.ray import RateLimiter, RemoteReplayBuffer, ReplayService

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR,
             _node_ip_address="127.0.0.1")
    capacity = 2 * args.rows * args.batches * args.rounds
    capacity += capacity % 2
    free = {"num_cpus": 0}
    rlbuf_options: dict[str, Any] = {"obs_shape": (OBS,), "action_shape": (), "action_dtype": torch.int64, "seed": 0}
    never_binds = RateLimiter(samples_per_insert=1.0, min_size_to_sample=1, error_buffer=1e12)
    torchrl_rb = RayReplayBuffer(storage=partial(LazyTensorStorage, capacity), batch_size=BATCH, remote_config=free)
    remote = RemoteReplayBuffer(capacity, actor_options=free, **rlbuf_options)
    service = ReplayService(capacity, num_shards=2, actor_options=free, **rlbuf_options)
    limited = ReplayService(capacity, num_shards=2, actor_options=free, rate_limiter=never_binds, **rlbuf_options)
    peers: dict[str, tuple[Any, Any, Any]] = {  # name: (writer target for writer w, sample call)
        "torchrl RayReplayBuffer": (lambda w: torchrl_rb.client(), lambda: torchrl_rb.sample(BATCH), torchrl_rb),
        "rlbuf RemoteReplayBuffer": (lambda w: remote.handle, lambda: remote.sample(BATCH), remote),
        "rlbuf ReplayService, 2 shards": (lambda w: service.writer(writer_id=w), lambda: service.sample(BATCH),
                                          service),
        "... + rate limiter": (lambda w: limited.writer(writer_id=w), lambda: limited.sample(BATCH), limited),
    }
    writers = [ray.remote(num_cpus=1)(Writer).remote(args.rows, seed) for seed in range(2)]
    ray.get([writer.ready.remote() for writer in writers])

    rates: dict[str, list[float]] = {name: [] for name in peers}
    for _ in range(args.rounds):
        for name, (target, _, _) in peers.items():
            spans = ray.get([writer.write.remote(target(w), args.batches) for w, writer in enumerate(writers)])
            elapsed = max(end for _, end in spans) - min(start for start, _ in spans)
            rates[name].append(2 * args.rows * args.batches / elapsed)
    per_sample: dict[str, list[float]] = {name: [] for name in peers}
    for _ in range(args.rounds):
        for name, (_, sample, _) in peers.items():
            sample()
            start = time.perf_counter()
            for _ in range(args.samples):
                sample()
            per_sample[name].append((time.perf_counter() - start) / args.samples)

    base_rows = statistics.median(rates["torchrl RayReplayBuffer"])
    base_batches = 1 / statistics.median(per_sample["torchrl RayReplayBuffer"])
    print(f"rows of ~200 B, {args.rows} per writer batch, 2 writers; sample({BATCH}); {args.rounds} rounds, medians")
    print(f"{'peer':32} {'rows/s':>10} {'ratio':>6} {'batches/s':>10} {'ratio':>6}")
    for name in peers:
        rows = statistics.median(rates[name])
        batches = 1 / statistics.median(per_sample[name])
        print(f"{name:32} {rows:10,.0f} {rows / base_rows:6.2f} {batches:10,.0f} {batches / base_batches:6.2f}")
    written = 2 * args.rows * args.batches * args.rounds
    assert all(len(buffer) == written for _, _, buffer in peers.values()), "a peer lost or duplicated rows"
    torchrl_rb.close()
    remote.close()
    service.close()
    limited.close()
    ray.shutdown()


if __name__ == "__main__":
    main()
