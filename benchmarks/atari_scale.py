"""Ten million Atari transitions in RAM: compressed rlbuf filled with real frames, memory and throughput as it grows.

Real frames: ale-py's Breakout and Pong (``--games``) with the DQN preprocessing, 8 envs,
gymnasium's default ``NEXT_STEP`` autoreset, random actions; a recording of ``--steps`` steps is
fed in order again and again (each env's last recorded step marked truncated, so the recording
loops as new episodes; see ``compression.py``). Each game runs in a forked process of its own, so
its resident memory starts from the same base and is given back after it.
``ReplayBuffer(capacity=--transitions, frame_stack=4, n_step=3, compression="zstd")`` is filled;
at each tenth of the way (or when ``--minutes`` run out) it reports the rows stored, the
process's resident memory above what it held before the buffer (RSS, from ``/proc/self/statm``)
per transition, ``buffer.nbytes`` per transition, the add of one step of 8 envs (wall and this
thread's CPU time, ``time.thread_time``: the machine may be shared) and batches of
``sample(256)`` per second of wall time and per second of the sampling thread's CPU time; at the
last point, 15 rounds of both, alternated with a buffer of ``--alongside`` rows of the same frames
(their ratio per CPU second, round by round, says whether a batch costs more in a full buffer).
Where the run stops short of ``--transitions``, the RSS at the target is extrapolated from a
straight line fitted to the measured points (the buffer's memory grows linearly with its rows),
and said to be. "since last" is the RSS added per row since the previous point: the first point
also holds one-off costs (compiled kernels, the stream tables allocated for every row at the first
add). The fill stops, and says so, if the process's RSS passes ``--max-rss-gib``. The load
average is printed at the start and end of each game.

Then the peers, filled with ``--peer-rows`` transitions of the same frames, one after the other,
each in a forked process of its own: uncompressed rlbuf, Stable-Baselines3's
``ReplayBuffer(optimize_memory_usage=True)`` and TorchRL's ``CompressedListStorage`` (each
transition's stacks compressed by TorchRL); their RSS per transition, fill time and
``sample(256)`` per second (wall and CPU time).

    PYTHONPATH=benchmarks python benchmarks/atari_scale.py                       # 10M, 2 games, ~20 minutes
    PYTHONPATH=benchmarks python benchmarks/atari_scale.py --transitions 200000 --peer-rows 20000 --games Pong
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from atari_add import record_steps
from compression import Feed, looped

from rlbuf import ReplayBuffer


def rss() -> int:
    """Resident bytes of this process."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def per_second(call: Callable[[], object], seconds: float = 2.0) -> tuple[float, float]:
    """Calls of ``call`` per second of wall time and per second of this thread's CPU time, over about ``seconds``."""
    call()
    count, start, cpu = 0, time.perf_counter(), time.thread_time()
    while time.perf_counter() - start < seconds:
        call()
        count += 1
    return count / (time.perf_counter() - start), count / (time.thread_time() - cpu)


def load() -> str:
    """The load average over 1, 5 and 15 minutes."""
    return " ".join(f"{value:.2f}" for value in os.getloadavg())


def fill_compressed(recorded: list[tuple[Any, ...]], space: Any, actions: Any, transitions: int,
                    minutes: float, max_rss: int, alongside: int) -> None:
    base = rss()
    buffer = ReplayBuffer(transitions, observation_space=space, action_space=actions, num_envs=8, frame_stack=4,
                          n_step=3, seed=0, compression="zstd")
    feed = Feed(buffer, recorded)
    deadline = time.perf_counter() + 60 * minutes
    points: list[tuple[int, int]] = []
    print(f"{'rows':>11} {'RSS B/row':>10} {'since last':>11} {'nbytes B/row':>13} {'add µs/step':>12} "
          f"{'add CPU µs':>11} {'sample(256)/s':>14} {'per CPU s':>10}", flush=True)
    stop = ""
    for tenth in range(1, 11):
        goal = transitions * tenth // 10
        steps, start, cpu = 0, time.perf_counter(), time.thread_time()
        while len(buffer) < goal:
            feed()
            steps += 1
            if steps % 1024 == 0:  # a read of /proc every 1024 adds: about 0.01 µs an add
                if time.perf_counter() > deadline:
                    stop = f"{minutes} minutes"
                    break
                if rss() > max_rss:
                    stop = f"RSS past {max_rss / 2**30:.1f} GiB"
                    break
        add = (time.perf_counter() - start) / max(steps, 1) * 1e6
        add_cpu = (time.thread_time() - cpu) / max(steps, 1) * 1e6
        rows = len(buffer)
        held = rss() - base
        last_rows, last_held = points[-1] if points else (0, 0)
        points.append((rows, held))
        rate, cpu_rate = per_second(lambda: buffer.sample(256))
        marginal = (held - last_held) / max(rows - last_rows, 1)
        print(f"{rows:>11,} {held / rows:>10.1f} {marginal:>11.1f} {buffer.nbytes / rows:>13.1f} {add:>12.0f} "
              f"{add_cpu:>11.0f} {rate:>14.1f} {cpu_rate:>10.1f}", flush=True)
        if stop:
            break
    rows, held = points[-1]
    # Fifteen rounds at the last point: one 2-second figure swings with the load of a shared machine. Alongside,
    # a small buffer of the same frames sampled in alternation: whether a batch costs more in a full buffer.
    samplers = {f"{rows:,} rows": lambda: buffer.sample(256)}
    if alongside:
        small = ReplayBuffer(alongside, observation_space=space, action_space=actions, num_envs=8, frame_stack=4,
                             n_step=3, seed=0, compression="zstd")
        small_feed = Feed(small, recorded)
        while len(small) < alongside:
            small_feed()
        samplers[f"{len(small):,} rows alongside"] = lambda: small.sample(256)
    rounds: dict[str, list[tuple[float, float]]] = {label: [] for label in samplers}
    for round_ in range(15):
        for label in list(samplers)[::1 if round_ % 2 else -1]:
            rounds[label].append(per_second(samplers[label], 1.0))
    for label, figures in rounds.items():
        wall, cpu = (sorted(column) for column in zip(*figures, strict=True))
        print(f"sample(256) at {label}, 15 rounds of 1 s (least, median, most): {wall[0]:.0f}, {wall[7]:.0f}, "
              f"{wall[-1]:.0f} per s; {cpu[0]:.0f}, {cpu[7]:.0f}, {cpu[-1]:.0f} per CPU s of the sampling thread",
              flush=True)
    if alongside:
        full, little = rounds.values()
        ratios = sorted(big[1] / other[1] for big, other in zip(full, little, strict=True))
        print(f"per CPU s, full ÷ alongside, round by round (least, median, most): {ratios[0]:.2f}, "
              f"{ratios[7]:.2f}, {ratios[-1]:.2f}", flush=True)
    if stop:
        print(f"stopped at {rows:,} rows ({stop})")
    if rows < transitions and len(points) >= 2:
        slope, intercept = np.polyfit([p[0] for p in points], [p[1] for p in points], 1)
        print(f"RSS at {transitions:,} extrapolated from the {len(points)} points: "
              f"{(intercept + slope * transitions) / 2**30:.2f} GiB")
    else:
        print(f"RSS at {rows:,} rows: {held / 2**30:.2f} GiB")


def peers(recorded: list[tuple[Any, ...]], space: Any, actions: Any, rows: int) -> None:
    from stable_baselines3.common.buffers import ReplayBuffer as Sb3Buffer
    from tensordict import TensorDict
    from torchrl.data import CompressedListStorage, TensorDictReplayBuffer

    def rlbuf_uncompressed() -> Callable[[], object]:
        buffer = ReplayBuffer(rows, observation_space=space, action_space=actions, num_envs=8, frame_stack=4,
                              n_step=3, seed=0)
        feed = Feed(buffer, recorded)
        while len(buffer) < rows:
            feed()
        return lambda: buffer.sample(256)

    def sb3() -> Callable[[], object]:
        buffer = Sb3Buffer(rows, space, actions, device="cpu", n_envs=8, optimize_memory_usage=True,
                           handle_timeout_termination=False)
        infos = [{}] * 8
        for step in range(rows // 8):
            obs, action, reward, next_obs, terminated, truncated, _ = recorded[step % len(recorded)]
            buffer.add(obs, next_obs, action, reward, terminated | truncated, infos)
        return lambda: buffer.sample(256)

    def torchrl_compressed() -> Callable[[], object]:
        buffer = TensorDictReplayBuffer(storage=CompressedListStorage(rows), batch_size=256)
        for step in range(rows // 8):
            obs, action, reward, next_obs, terminated, truncated, _ = recorded[step % len(recorded)]
            buffer.extend(TensorDict({"observation": torch.from_numpy(obs), "action": torch.from_numpy(action),
                                      ("next", "observation"): torch.from_numpy(next_obs),
                                      ("next", "reward"): torch.from_numpy(reward),
                                      ("next", "terminated"): torch.from_numpy(terminated),
                                      ("next", "truncated"): torch.from_numpy(truncated)}, batch_size=[8]))
        return lambda: buffer.sample()

    def measure(make: Callable[[], Callable[[], object]], results: Any) -> None:
        base, start = rss(), time.perf_counter()
        sample = make()
        results.send((rss() - base, time.perf_counter() - start, *per_second(sample)))

    print(f"\npeers at {rows:,} transitions: {'RSS B/row':>10} {'fill s':>8} {'sample(256)/s':>14} "
          f"{'per CPU s':>10}")
    for name, make in (("rlbuf uncompressed", rlbuf_uncompressed), ("sb3-optimized", sb3),
                       ("torchrl compressed", torchrl_compressed)):
        # A forked process each: its resident memory grows by what the peer allocates, and is given back.
        context = multiprocessing.get_context("fork")
        receive, send = context.Pipe(duplex=False)
        child = context.Process(target=measure, args=(make, send))
        child.start()
        held, fill, rate, cpu_rate = receive.recv()
        child.join()
        print(f"{name:>20} {held / rows:>21.1f} {fill:>8.1f} {rate:>14.1f} {cpu_rate:>10.1f}", flush=True)


def run_game(game: str, args: argparse.Namespace) -> None:
    """Records ``game``'s frames, fills the compressed buffer with them, then the peers."""
    print(f"\n## {game}: {args.transitions:,} transitions, compression='zstd', frame_stack=4, n_step=3, 8 envs; "
          f"load average {load()}", flush=True)
    envs, recorded = record_steps(8, args.steps, game=game)
    recorded = looped(recorded)
    space, actions = envs.single_observation_space, envs.single_action_space
    envs.close()
    fill_compressed(recorded, space, actions, args.transitions, args.minutes, int(args.max_rss_gib * 2**30),
                    args.alongside)
    if args.peer_rows:
        peers(recorded, space, actions, args.peer_rows)
    print(f"load average at the end: {load()}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--transitions", type=int, default=10_000_000)
    parser.add_argument("--steps", type=int, default=1000, help="steps of 8 envs recorded (then looped)")
    parser.add_argument("--minutes", type=float, default=25.0, help="stop filling after this long, per game")
    parser.add_argument("--peer-rows", type=int, default=50_000)
    parser.add_argument("--games", nargs="+", default=["Breakout", "Pong"])
    parser.add_argument("--alongside", type=int, default=100_000,
                        help="rows of a small buffer sampled in alternation with the full one at the end (0: none)")
    parser.add_argument("--max-rss-gib", type=float, default=10.0, help="stop filling past this resident memory")
    args = parser.parse_args()
    warnings.simplefilter("ignore", DeprecationWarning)
    torch.set_num_threads(1)
    for game in args.games:
        # Each game in a forked process: it starts from the same resident memory and gives its buffer back.
        child = multiprocessing.get_context("fork").Process(target=run_game, args=(game, args))
        child.start()
        child.join()
        if child.exitcode:
            raise SystemExit(f"{game}: the run failed (exit code {child.exitcode})")


if __name__ == "__main__":
    main()
