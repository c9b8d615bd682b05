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

``--atari``: learner batches/s of ``sample(256)`` on real Breakout transitions (84x84 uint8
frames, stacks of 4, from ``tests/data/breakout_steps.npz``, repeated to ``--transitions``),
each peer holding the same transitions: TorchRL's ``RayReplayBuffer`` (both stacks stored per
transition), a 2-shard service with the compact layout (``frame_stack=4, n_step=3``: each frame
stored once), and the same with zstd- and with lz4-compressed frames. Each service is timed two ways on the
same shards: its compact shards sending each distinct frame of a batch once (compressed as
stored) for the learner to rebuild the stacks (``now``), and building the stacks themselves and
sending them whole (``before``, the path kept behind a private switch). Beside them, what one
shard's ``ReplayBuffer.sample(256)`` takes here without Ray, and a round trip to both shards that
moves no data (``service.sizes()``), the floor under every service figure. Two interleaved passes: wall time,
then the CPU time of every process of the run (the learner, the actors and Ray's daemons, read
from /proc) a batch; then each service's CPU a batch split by process (learner, shards, the rest).

``--soak SECONDS``: two writer actors ``add`` single CartPole-shaped steps (``batch_steps``
64) while the learner samples as fast as it can, for ``SECONDS``, with a rate limiter on;
every second the samples-per-insert ratio of each shard is recorded, and the largest distance of
``diff`` from its target, against the error buffer, is reported.

Ratios are to TorchRL's ``RayReplayBuffer``. From the repository root::

    PYTHONPATH=. python benchmarks/ray_service.py            # about 3 minutes on 2 cores
    PYTHONPATH=. python benchmarks/ray_service.py --quick    # smoke run
    PYTHONPATH=. python benchmarks/ray_service.py --atari    # about 3 minutes
    PYTHONPATH=. python benchmarks/ray_service.py --soak 600
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import time
import warnings
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from _timing import time_interleaved
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


def breakout_steps(repeats: int) -> TensorDict:
    """The recorded Breakout steps of 2 envs, ``repeats`` times over, as a ``(2, T)`` TensorDict of stacks.

    Each repeat's last step is marked truncated, so the streams continue across repeats.
    """
    data = np.load(Path(__file__).parents[1] / "tests" / "data" / "breakout_steps.npz")
    terminated, truncated = data["terminated"], data["truncated"].copy()
    truncated[-1] |= ~terminated[-1]
    per_env: list[tuple[np.ndarray, np.ndarray]] = []
    for env in range(2):
        frames, at, first = data[f"frames_{env}"], 0, 0
        obs, next_obs = [], []
        for t in range(len(terminated)):
            window = [max(first, at - 3 + i) for i in range(4)]
            obs.append(frames[window])
            next_obs.append(frames[[max(first, at - 2 + i) for i in range(4)]])
            at += 1
            if terminated[t, env] or truncated[t, env]:
                at += 1    # the next episode's first frame follows the final one
                first = at
        per_env.append((np.stack(obs), np.stack(next_obs)))
    obs = torch.from_numpy(np.stack([o for o, _ in per_env]))
    next_obs = torch.from_numpy(np.stack([n for _, n in per_env]))
    one = TensorDict({
        "observation": obs, "action": torch.from_numpy(data["action"].T.copy()),
        ("next", "observation"): next_obs, ("next", "reward"): torch.from_numpy(data["reward"].T.copy()),
        ("next", "terminated"): torch.from_numpy(terminated.T.copy()),
        ("next", "truncated"): torch.from_numpy(truncated.T.copy()),
    }, batch_size=[2, len(terminated)])
    one["next", "done"] = one["next", "terminated"] | one["next", "truncated"]
    return torch.cat([one] * repeats, dim=1)


def atari(args: argparse.Namespace) -> None:
    """Learner batches/s on Breakout transitions: TorchRL's RayReplayBuffer and the compact service."""
    import ray
    from torchrl.data import LazyTensorStorage, RayReplayBuffer

    from rlbuf import ReplayBuffer
    from rlbuf.ray import ReplayService

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR,
             _node_ip_address="127.0.0.1")
    repeats = max(1, args.transitions // 1200)
    steps = breakout_steps(repeats)                      # (2 envs, T): one shard's worth
    per_shard = steps.batch_size.numel()
    flat = steps.reshape(-1)
    free = {"num_cpus": 0}
    options: dict[str, Any] = {"obs_shape": (4, 84, 84), "obs_dtype": torch.uint8, "action_shape": (),
                               "action_dtype": torch.int64, "num_envs": 2, "frame_stack": 4, "n_step": 3, "seed": 0}
    torchrl_rb = RayReplayBuffer(storage=partial(LazyTensorStorage, 2 * per_shard), batch_size=BATCH,
                                 remote_config=free)
    services = {"rlbuf service, compact": ReplayService(2 * per_shard, num_shards=2, actor_options=free, **options),
                "rlbuf service, compact + zstd": ReplayService(2 * per_shard, num_shards=2, actor_options=free,
                                                               compression="zstd", **options),
                "rlbuf service, compact + lz4": ReplayService(2 * per_shard, num_shards=2, actor_options=free,
                                                              compression="lz4", **options)}
    chunk = 600
    for _ in range(2):                                   # the same transitions in each shard
        for start in range(0, per_shard, chunk):
            torchrl_rb.extend(flat[start:start + chunk])
    for service in services.values():
        for w in range(2):
            writer = service.writer(writer_id=w)
            for start in range(0, steps.batch_size[1], chunk // 2):
                writer.extend(steps[:, start:start + chunk // 2])
    assert len(torchrl_rb) == 2 * per_shard and all(len(s) == 2 * per_shard for s in services.values())
    local = {name: ReplayBuffer(per_shard, **options, **extra) for name, extra in
             (("one shard's sample, no Ray", {}), ("... with zstd frames", {"compression": "zstd"}),
              ("... with lz4 frames", {"compression": "lz4"}))}
    for buffer in local.values():
        buffer.extend(steps)
    peers: dict[str, Any] = {"torchrl RayReplayBuffer": lambda: torchrl_rb.sample(BATCH)}
    for name, service in services.items():
        peers[f"{name}: stacks sent (before)"] = partial(sample_stacks_on_learner, service, False)
        peers[f"{name}: frames once (now)"] = partial(sample_stacks_on_learner, service, True)
    peers.update({name: partial(buffer.sample, BATCH) for name, buffer in local.items()})
    # The floor under every service figure: a round trip to both shards that moves no data.
    peers["service.sizes(): a round trip, no batch"] = next(iter(services.values())).sizes
    load = os.getloadavg()
    wall = time_interleaved(peers, repeats=args.rounds, number=args.samples)
    cpu = time_interleaved(peers, repeats=args.rounds, number=args.samples, clock=session_cpu_seconds)
    print(f"Breakout transitions (84x84 uint8, stacks of 4), {2 * per_shard:,} in each peer; sample({BATCH}); "
          f"{args.rounds} interleaved rounds of {args.samples}, medians; load average {load[0]:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after")
    print("CPU: seconds of every process of this run a batch: the learner, the buffer actors and Ray's daemons")
    base, base_cpu = wall["torchrl RayReplayBuffer"], cpu["torchrl RayReplayBuffer"]
    print(f"{'peer':50} {'batches/s':>10} {'ratio':>6} {'ms/batch':>9} {'CPU ms':>7} {'ratio':>6}")
    for name in peers:
        print(f"{name:50} {1 / wall[name]:10,.1f} {base / wall[name]:6.2f} {wall[name] * 1e3:9.2f} "
              f"{cpu[name] * 1e3:7.2f} {cpu[name] / base_cpu:6.2f}")
    for name in services:
        before, now = f"{name}: stacks sent (before)", f"{name}: frames once (now)"
        print(f"{name}: now / before: {wall[before] / wall[now]:.2f}x the batches a second, "
              f"{cpu[now] / cpu[before]:.2f}x the CPU a batch")
    print(f"CPU ms a batch by process, frames once, {args.samples} batches each (load {os.getloadavg()[0]:.2f}):")
    for name, service in services.items():
        shard_pids = set(ray.get([actor.__ray_call__.remote(lambda _: os.getpid()) for actor in service.actors]))
        roles = cpu_by_role(partial(sample_stacks_on_learner, service, True), args.samples, shard_pids)
        print(f"{name:50} " + ", ".join(f"{role} {seconds * 1e3:.2f}" for role, seconds in roles.items()))
    for service in services.values():
        batch = sample_stacks_on_learner(service, True)
        assert batch.obs.shape == (BATCH, 4, 84, 84) and batch.obs.dtype == torch.uint8
    torchrl_rb.close()
    for service in services.values():
        service.close()
    ray.shutdown()


def sample_stacks_on_learner(service: Any, on_learner: bool) -> Any:
    """``service.sample(256)`` with the compact shards' frames sent once and stacked here, or stacked in the shards
    and sent whole (the path before the learner rebuilt them: a private switch kept for this comparison and the
    tests that check both give the same batches)."""
    service._frames_on_learner = on_learner
    return service.sample(BATCH)


def session_cpu_seconds() -> float:
    """User and system CPU seconds so far of this process and every process it started (Ray's daemons and
    workers: ``ray.init`` starts them as its descendants), from /proc (Linux)."""
    return sum(session_cpu_by_process().values())


def cpu_by_role(call: Any, number: int, shard_pids: set[int]) -> dict[str, float]:
    """CPU seconds a call of ``call()`` (over ``number`` calls) of the learner (this process), the shard actors
    (``shard_pids``) and the run's other processes (Ray's daemons, idle workers and other peers' actors)."""
    before = session_cpu_by_process()
    for _ in range(number):
        call()
    after = session_cpu_by_process()
    spent = {pid: seconds - before.get(pid, 0.0) for pid, seconds in after.items()}
    learner, shards = spent.pop(os.getpid(), 0.0), sum(spent.pop(pid, 0.0) for pid in shard_pids)
    return {"learner": learner / number, "shards": shards / number, "others": sum(spent.values()) / number}


def session_cpu_by_process() -> dict[int, float]:
    """``session_cpu_seconds`` of each process, by pid."""
    parents: dict[int, int] = {}
    spent: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended meanwhile
            continue
        parents[int(entry.name)], spent[int(entry.name)] = int(fields[1]), int(fields[11]) + int(fields[12])
    ours, grown = {os.getpid()}, True
    while grown:  # descendants at any depth, whatever the order of their pids
        found = {pid for pid, parent in parents.items() if parent in ours} - ours
        ours |= found
        grown = bool(found)
    return {pid: spent[pid] / os.sysconf("SC_CLK_TCK") for pid in ours}


class StepWriter:
    """A writer actor for ``--soak``: ``add`` of single 2-env CartPole-shaped steps until told to stop."""

    def __init__(self, writer: Any, seed: int) -> None:
        torch.set_num_threads(1)
        self.writer, self.generator = writer, torch.Generator().manual_seed(seed)

    def ready(self) -> bool:
        return True

    def run(self, seconds: float) -> int:
        steps, end = 0, time.monotonic() + seconds
        obs = torch.randn(2, 4, generator=self.generator)
        while time.monotonic() < end:
            next_obs = torch.randn(2, 4, generator=self.generator)
            self.writer.add(obs, torch.randint(0, 2, (2,), generator=self.generator), torch.ones(2), next_obs,
                            torch.zeros(2, dtype=torch.bool), torch.zeros(2, dtype=torch.bool))
            obs, steps = next_obs, steps + 1
        self.writer.flush()
        return steps


def soak(args: argparse.Namespace) -> None:
    """Writers and a learner for ``args.soak`` seconds with the limiter on: the ratio over time."""
    import ray

    from rlbuf import RateLimitTimeoutError
    from rlbuf.ray import RateLimiter, ReplayService

    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR,
             _node_ip_address="127.0.0.1")
    spi, min_size, error = 4.0, 1_000, 4_000.0
    limiter = RateLimiter(samples_per_insert=spi, min_size_to_sample=min_size, error_buffer=error)
    target = spi * min_size
    with ReplayService(2 * 100_000, num_shards=2, obs_shape=(4,), action_shape=(), action_dtype=torch.int64,
                       num_envs=2, rate_limiter=limiter, timeout=120.0, seed=0, actor_options={"num_cpus": 0},
                       prioritized=True) as service:
        writers = [ray.remote(num_cpus=1)(StepWriter).remote(service.writer(writer_id=w, batch_steps=64), w)
                   for w in range(2)]
        ray.get([writer.ready.remote() for writer in writers])         # actor start-up is not timed
        runs = [writer.run.remote(args.soak) for writer in writers]
        start = time.monotonic()
        next_report, batches, held, worst = start + 1.0, 0, 0, 0.0
        timeline: list[tuple[float, list[float], list[float]]] = []
        last: list[dict[str, int]] | None = None
        while len(ray.wait(runs, num_returns=2, timeout=0)[0]) < 2:   # until the writers stop
            try:
                batch = service.sample(BATCH, timeout=1.0)
            except RateLimitTimeoutError:    # held a second: the writers are behind (or have stopped)
                held += 1
                continue
            service.update_priority(batch.index, batch.reward + 0.1)
            batches += 1
            if time.monotonic() >= next_report:
                counters = [limiter_state["counters"] for limiter_state in service.rate_limiters() or []]
                diffs = [c["inserts"] * spi - c["samples"] for c in counters]
                if all(c["inserts"] - c["deletes"] >= min_size for c in counters):
                    worst = max([worst, *(abs(d - target) for d in diffs)])
                    if last is not None:   # samples per insert over the last second, each shard
                        ratios = [(c["samples"] - b["samples"]) / max(c["inserts"] - b["inserts"], 1)
                                  for c, b in zip(counters, last, strict=True)]
                        timeline.append((time.monotonic() - start, ratios, diffs))
                    last = counters
                next_report = time.monotonic() + 1.0
        steps = ray.get(runs)
        load = os.getloadavg()
    print(f"soak: {args.soak:.0f} s, 2 writers adding single 2-env steps (batch_steps 64), a learner sampling {BATCH} "
          f"with priorities; limiter samples_per_insert={spi}, min_size_to_sample={min_size}, error_buffer={error}")
    print(f"learner batches: {batches:,} ({batches / args.soak:,.1f}/s, {held} samples held 1 s by the limiter); "
          f"writer steps: {steps} "
          f"({sum(steps) * 2 / args.soak:,.0f} rows/s); load average (1, 5, 15 min) {load}")
    for at, ratios, diffs in timeline[:: max(1, len(timeline) // 10)]:
        print(f"  t={at:6.1f} s  samples/insert over the last second, per shard {[f'{r:.2f}' for r in ratios]}  "
              f"diff - target {[f'{d - target:+.0f}' for d in diffs]}")
    windows = [r for _, ratios, _ in timeline for r in ratios]
    if windows:
        print(f"samples/insert over 1-s windows, every shard: median {statistics.median(windows):.2f}, "
              f"min {min(windows):.2f}, max {max(windows):.2f} ({len(windows)} windows)")
    print(f"largest |diff - target| once sampling started: {worst:.0f} (error buffer {error:.0f}): "
          f"{'held' if worst <= error else 'NOT held'}")
    ray.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--atari", action="store_true", help="learner batches/s on Breakout transitions")
    parser.add_argument("--transitions", type=int, default=12_000, help="--atari: transitions in each peer")
    parser.add_argument("--soak", type=float, default=0.0, help="seconds of writers + learner with the limiter on")
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
    if args.atari:
        atari(args)
        return
    if args.soak:
        soak(args)
        return

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
