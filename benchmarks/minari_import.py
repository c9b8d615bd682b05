"""How fast, and in how much memory, does a local Minari dataset load: rlbuf's from_minari vs TorchRL's loader?

One synthetic HDF5 dataset, made once with ``minari.create_dataset_from_buffers`` in a temporary
``MINARI_DATASETS_PATH``: 1,000,000 steps in 1,000 episodes of 1,000 (half terminated, half
truncated, each with a seed), MuJoCo-like: observations 17 float64, actions 6 float32, rewards
float64. Its arrays (observations T + 1 a episode, actions, rewards, flags) are the *dataset size*.

Peers, each load in a fresh subprocess (so every peak RSS is its own), rounds interleaved and the
median taken (as ``_timing.py`` does):

* ``minari read``: Minari's own reader over every episode (``dataset.storage.get_episodes``),
  storing nothing: what reading through Minari costs.
* ``rlbuf``: ``from_minari(id)``: a plain ``ReplayBuffer`` (``obs`` and ``next_obs`` stored),
  ``exact=True`` (``episode_id``, ``episode_seed``, the float64 reward beside the float32 one).
* ``rlbuf compact``: ``from_minari(id, compact=True)``: each observation stored once.
* ``rlbuf compact, not exact``: ``compact=True, exact=False``: the transitions only.
* ``rlbuf memmap``: ``from_minari(id, storage="memmap")``: the rows in files on disk.
* ``... (Arrow)``: the same episodes written in Minari's Arrow format (one IPC file an episode):
  Minari's reader, ``from_minari(id)`` and ``from_minari(id, compact=True, exact=False)``.
* ``torchrl``: TorchRL's ``MinariExperienceReplay(id, batch_size=256, root=<tmp>,
  load_from_local_minari=True)``, which reads the local HDF5 file under ``MINARI_DATASETS_PATH``
  without a download, builds a TensorDict of every step in RAM and writes it as a memmap under
  ``root`` (a fresh directory each run).

After the peak is read, the first episode's rows (``obs``, ``next_obs``, the float64 rewards)
are compared with what Minari's own reader gives: the last column says whether they match.

Each row gives the median seconds, steps per second (wall clock), steps per CPU second (the
process's, both of rlbuf's threads and the memory sampler: the figure to compare on a shared
machine), the peak RSS above the process's RSS just
before the load (``ru_maxrss`` less the baseline; each child first loads a 4-episode dataset the
same way, so imports and first-use allocations are not counted), that peak divided by the
dataset size and (rlbuf) by the bytes the buffer stores (``buffer.nbytes``), the peak of anonymous
memory alone (``RssAnon``, sampled every 5 ms: a memmap's rows are file pages, which the kernel
writes back and drops, so this is what bounds a load larger than RAM), and
rlbuf's seconds and peak divided by TorchRL's (below 1: rlbuf is faster / smaller). The targets
(issue 23): ≥ 1,000,000 steps/s for flat observations, peak RSS ≤ 1.2 × the dataset.

One torch thread. Run from the repository root::

    PYTHONPATH=. python benchmarks/minari_import.py            # 3 rounds, about 10 minutes on 2 cores
    PYTHONPATH=. python benchmarks/minari_import.py --quick    # 100,000 steps, a smoke run
    PYTHONPATH=. python benchmarks/minari_import.py --peers rlbuf "rlbuf (Arrow)" --datasets /tmp/minari-bench
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any

PEERS = ["minari read", "rlbuf", "rlbuf compact", "rlbuf compact, not exact", "rlbuf memmap", "torchrl",
         "minari read (Arrow)", "rlbuf (Arrow)", "rlbuf compact, not exact (Arrow)"]
DATASET_ID = "bench/mujoco-like-v0"
ARROW_ID = "bench/mujoco-like-arrow-v0"  # the same episodes, in Minari's Arrow format
WARM_UP_ID = "bench/warm-up-v0"  # loaded first by each peer: imports and first-use allocations are not counted
ARROW_WARM_UP_ID = "bench/warm-up-arrow-v0"


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _rss_anon() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("RssAnon:"))


def make_dataset(root: Path, steps: int, episode_length: int, dataset_id: str = DATASET_ID,
                 data_format: str = "hdf5") -> int:
    """Write the dataset under ``root``; return the bytes of its arrays."""
    import gymnasium as gym
    import minari
    import numpy as np
    from minari.data_collector import EpisodeBuffer

    os.environ["MINARI_DATASETS_PATH"] = str(root)
    rng = np.random.default_rng(0)
    episodes = steps // episode_length
    end = np.arange(episode_length) == episode_length - 1

    def buffers() -> Any:
        for number in range(episodes):
            yield EpisodeBuffer(seed=number, observations=rng.standard_normal((episode_length + 1, 17)),
                                actions=rng.uniform(-1, 1, (episode_length, 6)).astype(np.float32),
                                rewards=rng.standard_normal(episode_length),
                                terminations=end & (number % 2 == 0), truncations=end & (number % 2 == 1))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Minari's reminders of metadata
        minari.create_dataset_from_buffers(dataset_id, buffers(), data_format=data_format,
                                           observation_space=gym.spaces.Box(-np.inf, np.inf, (17,), np.float64),
                                           action_space=gym.spaces.Box(-1, 1, (6,), np.float32))
    return episodes * ((episode_length + 1) * 17 * 8 + episode_length * (6 * 4 + 8 + 1 + 1))


def load(peer: str, root: Path, scratch: Path) -> dict[str, float]:
    """One load by ``peer`` in this process: seconds, and peak bytes above the RSS before it."""
    import logging

    import numpy as np
    import torch

    torch.set_num_threads(1)
    logging.getLogger("torchrl").setLevel(logging.WARNING)
    os.environ["MINARI_DATASETS_PATH"] = str(root)
    import minari
    from torchrl.data.datasets import MinariExperienceReplay

    from rlbuf.offline import from_minari

    options: dict[str, Any] = {"rlbuf": {}, "rlbuf compact": {"compact": True},
                               "rlbuf compact, not exact": {"compact": True, "exact": False},
                               "rlbuf memmap": {"storage": "memmap", "scratch_dir": scratch}}.get(peer.removesuffix(" (Arrow)"), {})
    arrow = peer.endswith("(Arrow)")
    dataset_id, warm_up_id = (ARROW_ID, ARROW_WARM_UP_ID) if arrow else (DATASET_ID, WARM_UP_ID)

    def run(dataset_id: str, scratch: Path) -> tuple[int, int, Any]:
        """Steps loaded, the bytes rlbuf's buffer holds (0 for the others), and a reader of the first rows."""
        if peer.startswith("minari read"):
            dataset = minari.load_dataset(dataset_id)
            steps = sum(len(episode["rewards"]) for episode in dataset.storage.get_episodes(dataset.episode_indices))
            return steps, 0, None
        if peer == "torchrl":
            replay = MinariExperienceReplay(dataset_id, batch_size=256, root=scratch, load_from_local_minari=True)
            return len(replay), 0, lambda rows: replay[:rows]
        buffer = from_minari(dataset_id, **options)
        return len(buffer), buffer.nbytes, lambda rows: buffer.sample_by_index(torch.arange(rows))

    run(warm_up_id, scratch / "warm-up")
    baseline, anon_baseline = _rss(), _rss_anon()
    anon_peak = [0]
    done = threading.Event()

    def sample_anon() -> None:  # anonymous memory only: a memmap's file pages are the page cache's
        while not done.wait(0.005):
            anon_peak[0] = max(anon_peak[0], _rss_anon() - anon_baseline)

    sampler = threading.Thread(target=sample_anon, daemon=True)
    sampler.start()
    start, cpu_start = time.perf_counter(), time.process_time()
    steps, stored, first_rows = run(dataset_id, scratch)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    done.set()
    sampler.join()
    anon = max(anon_peak[0], _rss_anon() - anon_baseline)
    correct = -1.0  # not a loader: nothing to compare
    if first_rows is not None:  # after the peak is read: the first episode's rows against Minari's own reader
        episode = next(minari.load_dataset(dataset_id).iterate_episodes())
        rows = first_rows(len(episode.rewards))
        obs = rows["observation"] if peer == "torchrl" else rows.obs
        next_obs = rows["next", "observation"] if peer == "torchrl" else rows.next_obs
        reward = rows["next", "reward"].reshape(-1) if peer == "torchrl" else rows.extras.get("dataset_reward")
        correct = float(np.array_equal(obs.numpy(), episode.observations[:-1])
                        and np.array_equal(next_obs.numpy(), episode.observations[1:])
                        and (reward is None or np.array_equal(reward.numpy(), episode.rewards)))
    return {"seconds": seconds, "cpu": cpu, "steps": steps, "peak": max(0, peak - baseline), "anon": anon,
            "stored": stored, "correct": correct}


def _datasets(root: Path, steps: int, episode_length: int) -> int:
    """Write the four datasets under ``root`` unless they are there (``--datasets``); return the dataset size."""
    episodes = steps // episode_length
    size = episodes * ((episode_length + 1) * 17 * 8 + episode_length * (6 * 4 + 8 + 1 + 1))
    made = json.loads((root / "rlbuf-bench.json").read_text()) if (root / "rlbuf-bench.json").is_file() else None
    if made == {"steps": steps, "episode_length": episode_length}:
        print(f"dataset: {steps:,} steps, {size / 1e6:.0f} MB of arrays (kept in {root})")
        return size
    shutil.rmtree(root, ignore_errors=True)
    started = time.perf_counter()
    make_dataset(root, steps, episode_length)
    make_dataset(root, 4 * episode_length, episode_length, WARM_UP_ID)
    make_dataset(root, steps, episode_length, ARROW_ID, "arrow")
    make_dataset(root, 4 * episode_length, episode_length, ARROW_WARM_UP_ID, "arrow")
    (root / "rlbuf-bench.json").write_text(json.dumps({"steps": steps, "episode_length": episode_length}))
    print(f"dataset: {steps:,} steps, {size / 1e6:.0f} MB of arrays (written in {time.perf_counter() - started:.1f} s)")
    return size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--episode-length", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="100,000 steps, one round")
    parser.add_argument("--peers", nargs="+", choices=PEERS, metavar="PEER", help=f"a subset of: {PEERS}")
    parser.add_argument("--datasets", type=Path, help="keep the datasets in this directory (made once), not a "
                                                     "temporary one")
    parser.add_argument("--json", type=Path, help="write the medians here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--root", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--scratch", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(load(args.child, args.root, args.scratch)))
        return
    if args.quick:
        args.steps, args.rounds = 100_000, 1
    peers = args.peers or PEERS
    with tempfile.TemporaryDirectory(prefix="rlbuf-minari-") as tmp:
        root = args.datasets or Path(tmp) / "datasets"
        size = _datasets(root, args.steps, args.episode_length)
        runs: dict[str, list[dict[str, float]]] = {peer: [] for peer in peers}
        for round_ in range(args.rounds):
            shift = round_ % len(peers)
            for peer in peers[shift:] + peers[:shift]:
                scratch = Path(tmp) / "scratch"
                shutil.rmtree(scratch, ignore_errors=True)
                scratch.mkdir()
                out = subprocess.run([sys.executable, __file__, "--child", peer, "--root", str(root),
                                      "--scratch", str(scratch)], check=True, capture_output=True, text=True)
                runs[peer].append(json.loads(out.stdout.strip().splitlines()[-1]))
    medians = {peer: {key: statistics.median(run[key] for run in values)
                      for key in ("seconds", "cpu", "peak", "anon", "steps", "stored", "correct")}
               for peer, values in runs.items()}
    torchrl = medians.get("torchrl")
    print(f"\n{'peer':<34} {'s':>7} {'steps/s':>11} {'steps/cpu-s':>11} {'peak MB':>8} {'anon MB':>8} "
          f"{'÷ dataset':>9} {'÷ stored':>8} {'s ÷ torchrl':>11} {'peak ÷ torchrl':>14}  rows match Minari")
    for peer, median in medians.items():
        stored = f"{median['peak'] / median['stored']:>8.2f}" if median["stored"] else f"{'':>8}"
        versus = (f"{median['seconds'] / torchrl['seconds']:>11.2f} {median['peak'] / torchrl['peak']:>14.2f}"
                  if torchrl else f"{'-':>11} {'-':>14}")
        print(f"{peer:<34} {median['seconds']:>7.2f} {median['steps'] / median['seconds']:>11,.0f} "
              f"{median['steps'] / median['cpu']:>11,.0f} {median['peak'] / 1e6:>8.0f} {median['anon'] / 1e6:>8.0f} "
              f"{median['peak'] / size:>9.2f} {stored} {versus}  "
              f"{ {1: 'yes', 0: 'NO'}.get(int(median['correct']), '-')}")
    print()
    for peer in ("rlbuf", "rlbuf (Arrow)"):
        if peer in medians:
            rate = medians[peer]["steps"] / medians[peer]["seconds"]
            print(f"{'PASS' if rate >= 1e6 else 'MISS'}: {peer} {rate:,.0f} steps/s (target >= 1,000,000)")
    for peer in ("rlbuf", "rlbuf compact", "rlbuf compact, not exact", "rlbuf memmap", "rlbuf (Arrow)",
                 "rlbuf compact, not exact (Arrow)"):
        if peer in medians:
            ratio = medians[peer]["peak"] / size
            print(f"{'PASS' if ratio <= 1.2 else 'MISS'}: {peer} peak RSS {ratio:.2f} x the dataset (target <= 1.2)")
    if args.json:
        args.json.write_text(json.dumps({"dataset_bytes": size, "medians": medians}, indent=2))


if __name__ == "__main__":
    main()
