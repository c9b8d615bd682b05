"""Checkpoints: exact resume for every buffer kind and storage, ``data=False``, saves killed at
any moment, damaged, crafted and malicious directories refused, a full disk, memmap storage."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import itertools
import json
import os
import pathlib
import pickle
import queue
import random
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
import xxhash
from _snapshot import same, snapshot
from _versions import loaded_version, versioned_state, whole_version
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torchrl.data import LazyMemmapStorage

from rlbuf import (
    CheckpointError,
    DistillationBuffer,
    EpisodeStats,
    ReplayBuffer,
    RolloutBuffer,
)
from rlbuf import checkpoint as checkpoint_module
from rlbuf._base import MetadataOnlyWarning
from rlbuf._manifest import read_manifest
from rlbuf.checkpoint import MANIFEST, load_state

REPO = Path(__file__).resolve().parents[1]
STORAGES = ["memory", "memmap"]
KINDS = ["replay", "prioritized", "rollout", "distillation"]
Buffer = Any  # any rlbuf buffer: the tests call each kind's own methods


# -- buffers fed identical random data ---------------------------------------------------------
def make(kind: str, storage: str = "memory", *, capacity: int = 8, num_envs: int = 2, seed: int = 0) -> Buffer:
    """A buffer of ``kind`` with an extra field (``capacity`` is ``num_steps`` for a rollout)."""
    if kind in ("replay", "prioritized"):
        return ReplayBuffer(capacity, obs_shape=(3,), action_shape=(2,), num_envs=num_envs,
                            prioritized=kind == "prioritized", storage=storage,  # type: ignore[arg-type]
                            **({"alpha": 0.7, "beta": 0.5} if kind == "prioritized" else {}),
                            seed=seed, extra_fields={"cost": ((), torch.float32)})
    if kind == "distillation":
        return DistillationBuffer(capacity, obs_shape=(3,), action_shape=(), action_dtype=torch.int64,
                                  num_envs=num_envs, storage=storage, seed=seed,  # type: ignore[arg-type]
                                  extra_fields={"expert_logits": ((4,), torch.float32)})
    return RolloutBuffer(capacity, num_envs, obs_shape=(3,), action_shape=(), action_dtype=torch.int64,
                         storage=storage, seed=seed, extra_fields={"mask": ((4,), torch.bool)})  # type: ignore[arg-type]


def add_steps(buffers: Sequence[Buffer], kind: str, data: torch.Generator, steps: int) -> None:
    """``steps`` adds of ``num_envs`` random rows each, the same rows into every buffer."""
    n = buffers[0].num_envs
    for _ in range(steps):
        obs = torch.randn(n, 3, generator=data)
        if kind == "distillation":
            values: dict[str, Any] = dict(obs=obs, expert_action=torch.randint(0, 4, (n,), generator=data),
                                          expert_logits=torch.randn(n, 4, generator=data))
        elif kind == "rollout":
            terminated = torch.rand(n, generator=data) < 0.2
            values = dict(obs=obs, action=torch.randint(0, 4, (n,), generator=data),
                          reward=torch.randn(n, generator=data), terminated=terminated,
                          value=torch.randn(n, generator=data), log_prob=torch.randn(n, generator=data),
                          truncated=~terminated & (torch.rand(n, generator=data) < 0.2),
                          bootstrap_value=torch.randn(n, generator=data), mask=torch.rand(n, 4, generator=data) < 0.5)
        else:
            values = dict(obs=obs, action=torch.randn(n, 2, generator=data), reward=torch.randn(n, generator=data),
                          next_obs=torch.randn(n, 3, generator=data), terminated=torch.rand(n, generator=data) < 0.1,
                          truncated=torch.rand(n, generator=data) < 0.1, cost=torch.randn(n, generator=data))
        for buf in buffers:
            buf.add(**values)


def same_tensor(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), what


def assert_same(batches: Sequence[Any]) -> None:
    """Batches equal in every field (index and weight included), value, dtype and shape."""
    first = batches[0]
    for other in batches[1:]:
        assert type(other) is type(first)
        for field in dataclasses.fields(first):
            a, b = getattr(first, field.name), getattr(other, field.name)
            if isinstance(a, dict):
                assert a.keys() == b.keys(), field.name
                for key in a:
                    same_tensor(a[key], b[key], f"{field.name}[{key!r}]")
            elif a is None:
                assert b is None, field.name
            else:
                same_tensor(a, b, field.name)


def counters(buf: Buffer) -> tuple[int, int, int]:
    return len(buf), buf._ring.cursor, buf._ring.write_count


def assert_lockstep(buffers: Sequence[Buffer], call: Callable[[Buffer], Any]) -> None:
    assert_same([call(buf) for buf in buffers])


def rest(iterator: Iterator[Any], n_epochs: int) -> list[Any]:
    """What an epoch iterator has left (three batches of an endless one)."""
    return list(iterator) if n_epochs else [next(iterator) for _ in range(3)]


def update_priorities(buffers: Sequence[Buffer], data: torch.Generator, batch_size: int) -> None:
    batches = [buf.sample(batch_size) for buf in buffers]
    assert_same(batches)
    priority = torch.rand(batch_size, generator=data, dtype=torch.float64) * 3
    for buf, batch in zip(buffers, batches, strict=True):
        buf.update_priority(batch.index, priority)


def close_all(buffers: Sequence[Buffer]) -> None:
    for buf in buffers:
        buf.close()


# -- exact resume ------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["replay", "prioritized", "distillation"])
@settings(max_examples=12, deadline=None)
@given(storage=st.sampled_from(STORAGES), capacity=st.integers(1, 20), num_envs=st.integers(1, 3),
       adds=st.integers(1, 14), samples=st.integers(0, 3), batch_size=st.integers(1, 6), n_epochs=st.integers(0, 3),
       earlier=st.integers(0, 2), taken=st.integers(0, 8), drop_last=st.booleans(), shuffle=st.booleans(),
       more=st.integers(1, 9), seed=st.integers(0, 2**31))
def test_a_loaded_buffer_continues_exactly_like_the_original(
    kind: str, storage: str, capacity: int, num_envs: int, adds: int, samples: int, batch_size: int,
    n_epochs: int, earlier: int, taken: int, drop_last: bool, shuffle: bool, more: int, seed: int,
) -> None:
    assume(capacity >= num_envs)  # a smaller capacity is refused at construction
    # `twin` never saves: saving must not change what the original draws next either.
    original, twin = (make(kind, storage, capacity=capacity, num_envs=num_envs, seed=seed) for _ in range(2))
    buffers: list[Buffer] = [original, twin]
    data = torch.Generator().manual_seed(seed)
    try:
        add_steps(buffers, kind, data, adds)
        for _ in range(samples):
            assert_lockstep(buffers, lambda buf: buf.sample(batch_size))
        if kind == "prioritized":
            update_priorities(buffers, data, batch_size)
        epoch_batch = min(batch_size, len(original))
        for _ in range(earlier):  # each iterator draws its seed from the buffer's epoch generator
            assert_same([next(buf.epochs(epoch_batch)) for buf in buffers])
        iterators = [buf.epochs(epoch_batch, n_epochs, drop_last=drop_last, shuffle=shuffle) for buf in buffers]
        for _ in range(taken if n_epochs == 0 else min(taken, len(iterators[0]))):
            assert_same([next(iterator) for iterator in iterators])
        with tempfile.TemporaryDirectory() as scratch:
            original.save(Path(scratch) / "ckpt")
            loaded = type(original).load(Path(scratch) / "ckpt")
        buffers = [original, twin, loaded]

        assert counters(original) == counters(twin) == counters(loaded)
        assert loaded.current_epochs is not None
        iterators.append(loaded.current_epochs)
        if n_epochs:
            assert len(iterators[0]) == len(iterators[1]) == len(iterators[2])
        for triple in zip(*(rest(iterator, n_epochs) for iterator in iterators), strict=True):
            assert_same(triple)
        for _ in range(2):
            assert_lockstep(buffers, lambda buf: buf.sample(batch_size))
        if kind == "prioritized":
            update_priorities(buffers, data, batch_size)
            assert_lockstep(buffers, lambda buf: buf.sample(batch_size))
        add_steps(buffers, kind, data, more)
        assert counters(original) == counters(twin) == counters(loaded)
        assert_lockstep(buffers, lambda buf: buf.sample_all())
        assert_lockstep(buffers, lambda buf: buf.sample(batch_size))
        fresh = [buf.epochs(min(batch_size, len(buf)), 1) for buf in buffers]
        for pair in zip(*fresh, strict=True):
            assert_same(pair)
    finally:
        close_all(buffers)


@settings(max_examples=15, deadline=None)
@given(storage=st.sampled_from(STORAGES), num_steps=st.integers(1, 6), num_envs=st.integers(1, 3),
       batch_size=st.integers(1, 8), by_count=st.booleans(), n_epochs=st.integers(1, 3), earlier=st.integers(0, 2),
       taken=st.integers(0, 10), drop_last=st.booleans(), shuffle=st.booleans(), attach=st.booleans(),
       seed=st.integers(0, 2**31))
def test_a_loaded_rollout_continues_exactly_like_the_original(
    storage: str, num_steps: int, num_envs: int, batch_size: int, by_count: bool, n_epochs: int, earlier: int,
    taken: int, drop_last: bool, shuffle: bool, attach: bool, seed: int,
) -> None:
    original, twin = (make("rollout", storage, capacity=num_steps, num_envs=num_envs, seed=seed) for _ in range(2))
    buffers: list[Buffer] = [original, twin]
    data = torch.Generator().manual_seed(seed)
    size = min(batch_size, num_steps * num_envs)
    split: dict[str, Any] = {"num_minibatches": size} if by_count else {"batch_size": size, "drop_last": drop_last}

    def collect(buffers: Sequence[Buffer]) -> None:
        add_steps(buffers, "rollout", data, num_steps)
        last_value = torch.randn(num_envs, generator=data)
        for buf in buffers:
            buf.compute_returns_and_advantages(last_value, gamma=0.9, gae_lambda=0.8)

    try:
        collect(buffers)
        if attach:
            old_logits = torch.randn(num_steps, num_envs, 2, generator=data)
            for buf in buffers:
                buf.set_extras({"old_logits": old_logits})
        for _ in range(earlier):
            assert_same([next(buf.minibatches(**split)) for buf in buffers])
        iterators = [buf.minibatches(**split, n_epochs=n_epochs, shuffle=shuffle) for buf in buffers]
        for _ in range(min(taken, len(iterators[0]))):
            assert_same([next(iterator) for iterator in iterators])
        with tempfile.TemporaryDirectory() as scratch:
            original.save(Path(scratch) / "ckpt")
            loaded = RolloutBuffer.load(Path(scratch) / "ckpt")
        buffers = [original, twin, loaded]

        assert {(counters(buf), buf.steps, buf.advantages_ready) for buf in buffers} == {
            (counters(twin), num_steps, True)}
        assert loaded.current_epochs is not None
        assert len(loaded.current_epochs) == len(iterators[0])
        for triple in zip(*iterators, loaded.current_epochs, strict=True):
            assert_same(triple)
        assert_lockstep(buffers, lambda buf: buf.get_all_data())
        for buf in buffers:  # the next rollout
            buf.clear()
        collect(buffers)
        fresh = [buf.minibatches(**split, n_epochs=n_epochs, shuffle=shuffle) for buf in buffers]
        for triple in zip(*fresh, strict=True):
            assert_same(triple)
    finally:
        close_all(buffers)


@pytest.mark.parametrize("storage", STORAGES)
def test_a_rollout_saved_mid_collection_resumes_collecting(storage: str, tmp_path: Path) -> None:
    original = make("rollout", storage, capacity=4, num_envs=3)
    data = torch.Generator().manual_seed(1)
    add_steps([original], "rollout", data, 2)
    original.save(tmp_path / "ckpt")
    loaded = RolloutBuffer.load(tmp_path / "ckpt")
    buffers = [original, loaded]
    assert [(buf.steps, buf.is_full, buf.advantages_ready) for buf in buffers] == [(2, False, False)] * 2
    add_steps(buffers, "rollout", data, 2)
    for buf in buffers:
        buf.compute_returns_and_advantages(torch.ones(3))
    for pair in zip(*(buf.minibatches(batch_size=5, n_epochs=2) for buf in buffers), strict=True):
        assert_same(pair)
    close_all(buffers)


def test_a_rollout_saved_mid_collection_after_an_earlier_rollout_loads(tmp_path: Path) -> None:
    buf = make("rollout", capacity=2, num_envs=2)
    data = torch.Generator().manual_seed(0)
    add_steps([buf], "rollout", data, 2)
    buf.compute_returns_and_advantages(torch.zeros(2))
    for _ in buf.minibatches(batch_size=2):
        pass
    buf.clear()
    add_steps([buf], "rollout", data, 1)  # a PPO run checkpointed while collecting
    buf.save(tmp_path / "ckpt")
    assert RolloutBuffer.load(tmp_path / "ckpt").steps == 1


def test_a_replay_buffer_saved_after_clear_and_a_few_adds_loads(tmp_path: Path) -> None:
    buf = make("replay", capacity=8, num_envs=1)
    data = torch.Generator().manual_seed(0)
    add_steps([buf], "replay", data, 8)
    buf.epochs(4)
    buf.clear()
    add_steps([buf], "replay", data, 2)
    buf.save(tmp_path / "ckpt")
    assert len(ReplayBuffer.load(tmp_path / "ckpt")) == 2


def test_episode_stats_are_restored(tmp_path: Path) -> None:
    buf = ReplayBuffer(8, obs_shape=(3,), action_shape=(2,), num_envs=2, seed=0, stats=EpisodeStats(2, window=5))
    for step in range(5):
        buf.add(torch.zeros(2, 3), torch.zeros(2, 2), torch.tensor([1.0, 2.0]), torch.zeros(2, 3),
                torch.tensor([step == 2, False]))
    buf.save(tmp_path / "ckpt")
    loaded = ReplayBuffer.load(tmp_path / "ckpt")
    assert loaded.stats is not None and buf.stats is not None
    for tracker in (buf.stats, loaded.stats):  # running episodes carry over
        tracker.update(torch.tensor([1.0, 2.0]), torch.tensor([True, True]))
    assert loaded.stats.recent_returns() == buf.stats.recent_returns() == [3.0, 3.0, 12.0]
    assert loaded.stats.recent_lengths() == buf.stats.recent_lengths() == [3, 3, 6]


# -- data=False ---------------------------------------------------------------------------------
@pytest.mark.parametrize("storage", STORAGES)
@pytest.mark.parametrize("kind", KINDS)
def test_data_false_saves_options_only_and_loads_an_empty_buffer_with_a_warning(
    kind: str, storage: str, tmp_path: Path
) -> None:
    buf = make(kind, storage, capacity=6, num_envs=2)
    add_steps([buf], kind, torch.Generator().manual_seed(0), 6 if kind == "rollout" else 4)
    path = tmp_path / "ckpt"
    buf.save(path, data=False)
    assert not [name for name in read_manifest(path)["files"] if "fields" in name]
    with pytest.warns(MetadataOnlyWarning, match=rf"{re.escape(str(path))}: saved with data=False .* the loaded "
                                                 rf"buffer is empty; the original held {len(buf)} rows"):
        loaded = type(buf).load(path)
    empty = make(kind, storage, capacity=6, num_envs=2)
    assert len(loaded) == 0
    assert loaded._options == buf._options
    assert repr(loaded) == repr(empty)  # kind, capacity, storage, devices, prioritized, fields
    add_steps([loaded, empty], kind, torch.Generator().manual_seed(1), 6 if kind == "rollout" else 3)
    assert_lockstep([loaded, empty], lambda b: b.sample_all())
    close_all([buf, loaded, empty])


# -- saves killed at any moment -----------------------------------------------------------------
_SAVER = r"""
import logging, os, sys
import torch
torch.set_num_threads(1)  # no thread pool before fork
logging.getLogger("torchrl").setLevel(logging.WARNING)
import rlbuf.checkpoint
from rlbuf import ReplayBuffer

rows = int(sys.argv[1])
buf = ReplayBuffer(rows, obs_shape=(48,), action_shape=(4,), num_envs=rows, seed=0)
swap = rlbuf.checkpoint.exchange

def crash_before_swap(a, b):
    os._exit(0)

def crash_after_swap(a, b):
    swap(a, b)
    os._exit(0)

def save(mode, version, path):
    # runs in a forked child: saves version, version + 1, ... to path ('loop') or one version
    if mode == "crash-before-swap":
        rlbuf.checkpoint.exchange = crash_before_swap
    if mode == "crash-after-swap":
        rlbuf.checkpoint.exchange = crash_after_swap
    while True:
        value = torch.full((rows,), float(version))
        buf.add(obs=value[:, None].expand(rows, 48), action=value[:, None].expand(rows, 4), reward=value,
                next_obs=value[:, None].expand(rows, 48), terminated=torch.zeros(rows, dtype=torch.bool))
        buf.save(path)
        print(version, flush=True)
        if mode != "loop":
            os._exit(0)
        version += 1

child = 0
for line in sys.stdin:
    if line.strip() == "sync":  # answered after every line a dead child wrote: the pipe keeps order
        print("synced", flush=True)
        continue
    if child:
        os.waitpid(child, 0)
    mode, version, path = line.split(maxsplit=2)
    child = os.fork()
    if child == 0:
        save(mode, int(version), path.strip())
    print("forked", child, flush=True)
"""


class Saver:
    """A process that forks children saving numbered versions of a buffer, to kill at any moment.

    Forking from one process that has imported torch already keeps each kill point cheap.
    Version ``v`` holds ``v`` in every row of every float field.
    """

    rows = 60_000  # 24 MB per save

    def __init__(self, log: Path) -> None:
        self._log = log
        self._process = subprocess.Popen(
            [sys.executable, "-c", _SAVER, str(self.rows)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=log.open("w"), text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
        self._lines: queue.Queue[str] = queue.Queue()
        self.saved: list[int] = []  # versions reported saved, in order
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            self._lines.put(line.strip())
        self._lines.put("")

    def _next(self) -> str:
        line = self._lines.get(timeout=120)
        assert line, f"the saver process ended: {self._log.read_text()[-2000:]}"
        if line.isdigit():
            self.saved.append(int(line))
        return line

    def start(self, mode: str, version: int, path: Path) -> int:
        """Fork a child saving from ``version`` on; return a pidfd for it."""
        assert self._process.stdin is not None
        self._process.stdin.write(f"{mode} {version} {path}\n")
        self._process.stdin.flush()
        while not (line := self._next()).startswith("forked"):
            pass
        return os.pidfd_open(int(line.split()[1]))

    def wait_saved(self, version: int) -> None:
        while version not in self.saved:
            self._next()

    def sync(self) -> None:
        """Read every line that children which have ended wrote."""
        assert self._process.stdin is not None
        self._process.stdin.write("sync\n")
        self._process.stdin.flush()
        while self._next() != "synced":
            pass

    def close(self) -> None:
        assert self._process.stdin is not None
        self._process.stdin.close()
        self._process.wait(timeout=60)


def wait_dead(pidfd: int) -> None:
    ready, _, _ = select.select([pidfd], [], [], 60)
    os.close(pidfd)
    assert ready, "the saving child did not end"


def kill(pidfd: int) -> None:
    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    wait_dead(pidfd)


def version_at(path: Path) -> int:
    """The version a checkpoint holds, checking that every row of every field is of that one version."""
    loaded = ReplayBuffer.load(path)
    batch = loaded.sample_all()
    loaded.close()
    version = batch.reward[0].item()
    assert len(batch) == Saver.rows
    for name in ("obs", "action", "reward", "next_obs"):
        assert bool((getattr(batch, name) == version).all()), f"{name} mixes versions"
    return int(version)


def leftovers(path: Path) -> list[Path]:
    """Temporary directories of killed saves (their lock files are not checkpoints, the spare is no leftover)."""
    return sorted(p for p in path.parent.iterdir()
                  if p.name.startswith(f".{path.name}.") and p.is_dir() and p.name != f".{path.name}.spare")


@pytest.fixture(scope="module")
def saver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Saver]:
    if not hasattr(os, "pidfd_open") or not hasattr(os, "fork"):
        pytest.skip("needs Linux (fork, pidfd)")
    probe = tmp_path_factory.mktemp("exchange")
    (probe / "a").mkdir()
    (probe / "b").mkdir()
    if not checkpoint_module.exchange(probe / "a", probe / "b"):
        pytest.skip("this filesystem cannot swap directories atomically (no RENAME_EXCHANGE)")
    process = Saver(tmp_path_factory.mktemp("saver") / "stderr.txt")
    yield process
    process.close()


def test_a_save_killed_at_any_moment_leaves_one_whole_version(saver: Saver, tmp_path: Path) -> None:
    path = tmp_path / "ckpt"
    rng = random.Random(7)
    found: list[tuple[int, int]] = []
    for round_ in range(1, 8):
        first = 1000 * round_
        pidfd = saver.start("loop", first, path)
        saver.wait_saved(first + rng.randrange(3))
        time.sleep(rng.uniform(0, 0.08))  # a seeded moment within the next save or two
        kill(pidfd)
        version = version_at(path)
        found.append((first, version))
        for leftover in leftovers(path):
            with pytest.raises(CheckpointError, match="left by an interrupted save"):
                ReplayBuffer.load(leftover)
            os.rename(leftover, tmp_path / "renamed")
            with contextlib.suppress(CheckpointError):  # unfinished, or whole: the next version
                # (killed before its swap) or the one it replaced
                assert version_at(tmp_path / "renamed") in (version - 1, version + 1)
            shutil.rmtree(tmp_path / "renamed")
    saver.sync()
    for first, version in found:
        last = max(v for v in saver.saved if first <= v < first + 1000)
        assert version in (last, last + 1)  # the last reported save, or one killed after its swap


def test_a_save_killed_just_before_or_after_the_swap(saver: Saver, tmp_path: Path) -> None:
    path = tmp_path / "ckpt"
    wait_dead(saver.start("once", 1, path))
    assert version_at(path) == 1
    wait_dead(saver.start("crash-before-swap", 2, path))
    assert version_at(path) == 1
    [unfinished] = leftovers(path)
    with pytest.raises(CheckpointError, match=rf"{re.escape(str(unfinished))}: left by an interrupted save .* the "
                                              rf"checkpoint is {re.escape(str(path))} \(rename"):
        read_manifest(unfinished)
    os.rename(unfinished, tmp_path / "never-swapped-in")
    assert version_at(tmp_path / "never-swapped-in") == 2  # whole, but not the checkpoint
    wait_dead(saver.start("crash-after-swap", 3, path))
    assert version_at(path) == 3
    [superseded] = leftovers(path)
    with pytest.raises(CheckpointError, match="left by an interrupted save"):
        ReplayBuffer.load(superseded)
    os.rename(superseded, tmp_path / "superseded")
    assert version_at(tmp_path / "superseded") == 1
    wait_dead(saver.start("once", 4, path))  # a later save swaps in over the debris
    assert version_at(path) == 4


# -- damaged, crafted and malicious checkpoints --------------------------------------------------
@pytest.fixture
def saved(tmp_path: Path) -> Path:
    buf = make("replay", capacity=8, num_envs=2)
    add_steps([buf], "replay", torch.Generator().manual_seed(0), 3)
    path = tmp_path / "ckpt"
    buf.save(path)
    return path


def field_file(path: Path, field: str = "obs") -> str:
    [name] = [name for name in read_manifest(path)["files"] if name.endswith(f"fields.{field}.bin")]
    return name


def edit_manifest(path: Path, change: Callable[[dict[str, Any]], object]) -> None:
    manifest = json.loads((path / MANIFEST).read_text())
    change(manifest)
    (path / MANIFEST).write_text(json.dumps(manifest))


def relist(path: Path, old: str, new: str) -> None:
    """List file ``old`` under the name ``new`` in the manifest (entry and reference)."""
    def rename(manifest: dict[str, Any]) -> None:
        manifest["files"][new] = manifest["files"].pop(old)
        text = json.dumps(manifest["state"]).replace(json.dumps(old), json.dumps(new))
        manifest["state"] = json.loads(text)
    edit_manifest(path, rename)


def truncate(path: Path) -> str:
    target = path / field_file(path)
    data = target.read_bytes()
    target.write_bytes(data[:-4])
    return rf"{re.escape(str(target))}: {len(data) - 4} bytes, expected {len(data)} \(truncated or corrupted\)"


def flip_a_byte(path: Path) -> str:
    target = path / field_file(path)
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x10
    target.write_bytes(bytes(data))
    return rf"{re.escape(str(target))}: XXH3-128 mismatch \(corrupted\)"


def remove_a_file(path: Path) -> str:
    target = path / field_file(path, "reward")
    target.unlink()
    return rf"{re.escape(str(target))}: missing"


def newer_format(path: Path) -> str:
    edit_manifest(path, lambda manifest: manifest.update(format_version=3))
    return rf"{re.escape(str(path / MANIFEST))}: format version 3; this rlbuf reads versions 1, 2"


def broken_json(path: Path) -> str:
    (path / MANIFEST).write_text('{"format": "rlbuf-checkpoint", "files": {')
    return rf"{re.escape(str(path / MANIFEST))}: not valid JSON"


def parent_path(path: Path) -> str:
    name = field_file(path)
    os.rename(path / name, path.parent / "outside.bin")  # same bytes, so only the path is wrong
    relist(path, name, "../outside.bin")
    return rf"{re.escape(str(path / MANIFEST))}: file name '../outside.bin' escapes the checkpoint directory"


def nested_parent_path(path: Path) -> str:
    name = field_file(path)
    os.rename(path / name, path.parent / "outside.bin")
    relist(path, name, "tensors/../../outside.bin")
    return r"file name 'tensors/../../outside.bin' escapes the checkpoint directory"


def absolute_path(path: Path) -> str:
    name = field_file(path)
    outside = path.parent / "outside.bin"
    os.rename(path / name, outside)
    relist(path, name, str(outside))
    return rf"{re.escape(str(path / MANIFEST))}: file name '{re.escape(str(outside))}' is not a relative path"


def symlink_out(path: Path) -> str:
    target = path / field_file(path)
    os.rename(target, path.parent / "outside.bin")
    target.symlink_to(path.parent / "outside.bin")
    return rf"{re.escape(str(target))}: a link or a path outside the checkpoint"


def unlisted_file(path: Path) -> str:
    (path / "tensors" / "notes.txt").write_text("hello")
    return rf"{re.escape(str(path))}: unexpected file 'tensors/notes.txt'"


@pytest.mark.parametrize("damage", [truncate, flip_a_byte, remove_a_file, newer_format, broken_json, parent_path,
                                    nested_parent_path, absolute_path, symlink_out, unlisted_file])
def test_a_damaged_or_crafted_checkpoint_is_refused_naming_the_file_and_the_problem(
    saved: Path, damage: Callable[[Path], str]
) -> None:
    expected = damage(saved)
    with pytest.raises(CheckpointError, match=expected):
        ReplayBuffer.load(saved)
    with pytest.raises(CheckpointError, match=expected):
        read_manifest(saved)


@pytest.mark.parametrize("other", [RolloutBuffer, DistillationBuffer])
def test_a_checkpoint_of_another_kind_is_refused(saved: Path, other: type[Buffer]) -> None:
    with pytest.raises(CheckpointError, match=rf"{re.escape(str(saved / MANIFEST))}: holds a ReplayBuffer, not "
                                              rf"a {other.__name__}"):
        other.load(saved)


class TouchOnUnpickle:
    """Unpickling this creates ``marker``: a stand-in for any code a crafted pickle runs."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return pathlib.Path.touch, (self.marker,)


def write_payload(marker: Path, target: Path) -> None:
    """A pickle as TorchRL writes one: ``pickle.dump`` for ``.pkl`` files, ``torch.save`` for the others."""
    if target.suffix == ".pkl":
        target.write_bytes(pickle.dumps(TouchOnUnpickle(marker)))
    else:
        torch.save(TouchOnUnpickle(marker), target)


@pytest.mark.parametrize("name", ["payload.pkl", "payload.pt"])
def test_the_payload_runs_when_unpickled(tmp_path: Path, name: str) -> None:
    write_payload(tmp_path / "ran", tmp_path / name)
    if name.endswith(".pkl"):
        pickle.loads((tmp_path / name).read_bytes())
    else:
        torch.load(tmp_path / name, weights_only=False)
    assert (tmp_path / "ran").exists()  # so its absence below means it never ran


@pytest.mark.parametrize("name", ["prefetch.pkl", "tensors/buffer.pt", "transform.t"])
def test_a_pickle_in_a_checkpoint_is_refused_and_never_unpickled(saved: Path, tmp_path: Path, name: str) -> None:
    marker = tmp_path / "ran"
    write_payload(marker, saved / name)
    with pytest.raises(CheckpointError, match=rf"unexpected file {re.escape(repr(name))} .* refusing the checkpoint"):
        ReplayBuffer.load(saved)
    assert not marker.exists()


def test_a_listed_file_holding_a_pickle_is_read_as_raw_bytes_never_unpickled(saved: Path, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    write_payload(marker, saved / "tensors" / "evil.pt")
    raw = (saved / "tensors" / "evil.pt").read_bytes()

    def list_it(manifest: dict[str, Any]) -> None:
        manifest["files"]["tensors/evil.pt"] = {"dtype": "uint8", "shape": [len(raw)], "bytes": len(raw),
                                                "xxh3_128": xxhash.xxh3_128(raw).hexdigest()}
        manifest["state"]["evil"] = {"__tensor__": "tensors/evil.pt"}
    edit_manifest(saved, list_it)
    state = load_state(saved, kind="ReplayBuffer")
    assert bytes(state["evil"].numpy()) == raw
    assert not marker.exists()


def test_torchrl_loads_would_run_the_pickle_that_rlbuf_refuses(tmp_path: Path) -> None:
    crafted, marker = tmp_path / "crafted", tmp_path / "ran"
    crafted.mkdir()
    write_payload(marker, crafted / "prefetch.pkl")
    with pytest.raises(CheckpointError, match=r"manifest\.json: missing"):
        ReplayBuffer.load(crafted)
    assert not marker.exists()
    buf = make("replay")
    with pytest.raises(FileNotFoundError):  # after it ran the payload, it finds no storage
        buf.torchrl.loads(crafted)
    assert marker.exists()


# -- refusing to overwrite, a full disk -------------------------------------------------------------
def test_save_replaces_only_a_checkpoint_or_an_empty_directory(tmp_path: Path) -> None:
    buf = make("replay")
    add_steps([buf], "replay", torch.Generator().manual_seed(0), 3)
    results = tmp_path / "results"
    results.mkdir()
    (results / "notes.txt").write_text("mine")
    with pytest.raises(CheckpointError, match=rf"{re.escape(str(results))}: exists and is not an rlbuf checkpoint"):
        buf.save(results)
    (results / MANIFEST).write_text('{"name": "a web app"}')
    with pytest.raises(CheckpointError, match=rf"{re.escape(str(results))}: exists and is not an rlbuf checkpoint"):
        buf.save(results)
    (tmp_path / "file").write_text("mine")
    with pytest.raises(CheckpointError, match="exists and is not a directory"):
        buf.save(tmp_path / "file")
    assert sorted(os.listdir(results)) == [MANIFEST, "notes.txt"]
    assert (tmp_path / "file").read_text() == "mine"
    (tmp_path / "empty").mkdir()
    buf.save(tmp_path / "empty")
    buf.save(tmp_path / "empty")  # now a checkpoint: replaced
    assert len(ReplayBuffer.load(tmp_path / "empty")) == len(buf)
    assert sorted(os.listdir(tmp_path)) == [".empty.spare", "empty", "file", "results"]  # the replaced one: a spare


def test_saving_through_a_symlink_replaces_the_link_and_leaves_its_target(tmp_path: Path) -> None:
    buf = make("replay")
    data = torch.Generator().manual_seed(0)
    add_steps([buf], "replay", data, 2)
    buf.save(tmp_path / "run-1")
    (tmp_path / "latest").symlink_to(tmp_path / "run-1")
    add_steps([buf], "replay", data, 2)
    buf.save(tmp_path / "latest")
    assert len(ReplayBuffer.load(tmp_path / "latest")) == 8
    assert len(ReplayBuffer.load(tmp_path / "run-1")) == 4
    assert sorted(os.listdir(tmp_path)) == ["latest", "run-1"]


@pytest.mark.parametrize("second_rename_fails", [False, True])
def test_without_an_atomic_swap_a_save_replaces_the_checkpoint_or_keeps_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, second_rename_fails: bool
) -> None:
    monkeypatch.setattr(checkpoint_module, "exchange", lambda a, b: False)  # a filesystem without RENAME_EXCHANGE
    buf = make("replay")
    data = torch.Generator().manual_seed(0)
    add_steps([buf], "replay", data, 2)
    path = tmp_path / "ckpt"
    buf.save(path)
    before = buf.sample_all()
    add_steps([buf], "replay", data, 2)
    if second_rename_fails:
        rename = os.rename

        def rename_once(source: Any, target: Any) -> None:
            if Path(target) == path and Path(source).name.startswith(".ckpt.tmp-"):  # the second of the two
                raise enospc(str(target))
            rename(source, target)
        monkeypatch.setattr(os, "rename", rename_once)
        with pytest.raises(CheckpointError, match="the disk is full"):
            buf.save(path)
        monkeypatch.undo()
    else:
        buf.save(path)
    assert sorted(os.listdir(tmp_path)) == ["ckpt"] if second_rename_fails else [".ckpt.spare", "ckpt"]
    assert_same([ReplayBuffer.load(path).sample_all(), before if second_rename_fails else buf.sample_all()])


def test_state_that_is_not_json_or_tensors_is_refused_before_writing(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"state\.extra\.1: cannot store a object in a checkpoint"):
        checkpoint_module.save_state({"kind": "Demo", "extra": [1, object()]}, tmp_path / "ckpt")
    assert os.listdir(tmp_path) == []


def enospc(where: str) -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), where)


@pytest.mark.parametrize("failing", ["tensor write", "tensor fsync", "manifest fsync"])
def test_a_full_disk_fails_the_save_and_keeps_the_previous_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str
) -> None:
    buf = make("prioritized", capacity=32, num_envs=4)
    data = torch.Generator().manual_seed(0)
    add_steps([buf], "prioritized", data, 5)
    path = tmp_path / "ckpt"
    buf.save(path)
    before = ReplayBuffer.load(path).sample_all()
    files = len(read_manifest(path)["files"])
    add_steps([buf], "prioritized", data, 3)  # new contents, partly written when the disk fills
    calls = itertools.count()
    if failing == "tensor write":
        write = checkpoint_module._write_tensor

        def write_until_full(tensor: torch.Tensor, target: Path) -> dict[str, Any]:
            if next(calls) == 2:
                target.write_bytes(b"\0" * 7)
                raise enospc(str(target))
            return write(tensor, target)
        monkeypatch.setattr(checkpoint_module, "_write_tensor", write_until_full)
    else:
        fsync, fail_at = os.fsync, 1 if failing == "tensor fsync" else files

        def fsync_until_full(fd: int) -> None:
            if next(calls) == fail_at:
                raise enospc("fsync")
            fsync(fd)
        monkeypatch.setattr(os, "fsync", fsync_until_full)
    with pytest.raises(CheckpointError, match=rf"{re.escape(str(path))}: saving failed: the disk is full; the "
                                              rf"previous checkpoint, if any, is untouched"):
        buf.save(path)
    assert next(calls) > (2 if failing == "tensor write" else fail_at)  # the failure did happen where meant
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ["ckpt"]  # no temporary directory left
    assert_same([ReplayBuffer.load(path).sample_all(), before])
    buf.save(path)  # space again: the new contents go in
    assert_same([ReplayBuffer.load(path).sample_all(), buf.sample_all()])


def test_a_full_disk_on_a_first_save_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    buf = make("replay")
    add_steps([buf], "replay", torch.Generator().manual_seed(0), 2)

    def full(tensor: torch.Tensor, target: Path) -> dict[str, Any]:
        raise enospc(str(target))
    monkeypatch.setattr(checkpoint_module, "_write_tensor", full)
    with pytest.raises(CheckpointError, match="the disk is full"):
        buf.save(tmp_path / "ckpt")
    assert os.listdir(tmp_path) == []


# -- memmap storage -----------------------------------------------------------------------------
def test_a_memmap_buffer_loads_into_a_new_scratch_dir_and_never_writes_to_the_checkpoint(tmp_path: Path) -> None:
    buf = ReplayBuffer(64, obs_shape=(3,), action_shape=(2,), storage="memmap", scratch_dir=tmp_path / "scratch",
                       seed=0, extra_fields={"cost": ((), torch.float32)})
    data = torch.Generator().manual_seed(0)
    add_steps([buf], "replay", data, 40)
    path = tmp_path / "ckpt"
    buf.save(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error", MetadataOnlyWarning)
        loaded = ReplayBuffer.load(path)
    scratch = loaded._ring.scratch_dir
    assert isinstance(loaded.torchrl.storage, LazyMemmapStorage)
    assert scratch is not None and scratch.is_dir() and any(scratch.rglob("*.memmap"))
    assert scratch != tmp_path / "scratch" and not scratch.is_relative_to(path)
    assert_same([loaded.sample_all(), buf.sample_all()])
    add_steps([loaded], "replay", data, 64)  # overwrite every row of the loaded buffer
    read_manifest(path)  # checksums still hold: the checkpoint files were not written to
    again = ReplayBuffer.load(path)
    assert_same([again.sample_all(), buf.sample_all()])
    loaded.save(path)  # over the checkpoint it was loaded from
    assert_same([ReplayBuffer.load(path).sample_all(), loaded.sample_all()])
    loaded.close()
    assert not scratch.exists()
    close_all([buf, again])


def test_state_of_another_capacity_or_sampler_is_refused_before_anything_changes() -> None:
    small = ReplayBuffer(4, obs_shape=(3,), action_shape=(2,), seed=0)
    big = ReplayBuffer(10, obs_shape=(3,), action_shape=(2,), seed=0)
    prioritized = ReplayBuffer(4, obs_shape=(3,), action_shape=(2,), seed=0, prioritized=True)
    for _ in range(6):
        small.add(torch.ones(3), torch.ones(2), 1.0, torch.ones(3), False)
    big.add(torch.zeros(3), torch.zeros(2), 0.0, torch.zeros(3), False)
    with pytest.raises(CheckpointError, match="capacity 4, this buffer's is 10"):
        big.load_state_dict(small.state_dict())
    with pytest.raises(CheckpointError, match="sampled by a RandomSampler"):
        prioritized.load_state_dict(small.state_dict())
    assert len(big) == 1 and len(prioritized) == 0


def _rewrite_manifest(path: Path, change: Any) -> None:
    manifest = json.loads((path / "manifest.json").read_text())
    change(manifest["state"])
    (path / "manifest.json").write_text(json.dumps(manifest))


def test_a_crafted_manifest_cannot_call_other_methods_or_pass_other_options(tmp_path: Path) -> None:
    buf = ReplayBuffer(8, obs_shape=(3,), action_shape=(2,), seed=0)
    for _ in range(4):
        buf.add(torch.ones(3), torch.ones(2), 1.0, torch.ones(3), False)
    buf.epochs(2)
    buf.save(tmp_path / "a")
    _rewrite_manifest(tmp_path / "a", lambda state: state["iterator"].update(
        method="save", arguments={"path": str(tmp_path / "written")}))
    with pytest.raises(CheckpointError, match="unknown iterator method 'save'"):
        ReplayBuffer.load(tmp_path / "a")
    assert not (tmp_path / "written").exists()
    buf.save(tmp_path / "b")
    _rewrite_manifest(tmp_path / "b", lambda state: state["options"].update(scratch_dir="/"))
    with pytest.raises(CheckpointError, match=r"options \['scratch_dir'\] are not options of ReplayBuffer"):
        ReplayBuffer.load(tmp_path / "b")


def _as_format_one(path: Path) -> None:
    """Rewrite a checkpoint as rlbuf wrote it before issue 10: format version 1, SHA-256 per file."""
    def downgrade(manifest: dict[str, Any]) -> None:
        manifest["format_version"] = 1
        for rel, entry in manifest["files"].items():
            del entry["xxh3_128"]
            entry["sha256"] = hashlib.sha256((path / rel).read_bytes()).hexdigest()
    edit_manifest(path, downgrade)


def test_a_format_one_checkpoint_with_sha256_still_loads(saved: Path) -> None:
    def stored(buffer: ReplayBuffer) -> Any:  # rows past the stored ones are uninitialised memory
        return {key: value for key, value in snapshot(buffer).items() if key != "storage"}

    expected = stored(ReplayBuffer.load(saved))
    _as_format_one(saved)
    assert read_manifest(saved)["format_version"] == 1
    assert same(stored(ReplayBuffer.load(saved)), expected)
    target = saved / field_file(saved)
    data = bytearray(target.read_bytes())
    data[0] ^= 0x01
    target.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=rf"{re.escape(str(target))}: SHA-256 mismatch \(corrupted\)"):
        ReplayBuffer.load(saved)


def test_new_checkpoints_carry_xxh3_of_each_file(saved: Path) -> None:
    manifest = read_manifest(saved)
    assert manifest["format_version"] == 2
    for rel, entry in manifest["files"].items():
        assert "sha256" not in entry
        assert entry["xxh3_128"] == xxhash.xxh3_128((saved / rel).read_bytes()).hexdigest()


# -- the spare: the replaced version's files, rewritten in place by the next save ----------------
def _inodes(path: Path) -> dict[str, int]:
    return {p.name: p.stat().st_ino for p in (path / "tensors").iterdir()}


def test_a_save_rewrites_the_files_of_the_version_it_replaced_one_save_earlier(tmp_path: Path) -> None:
    path = tmp_path / "ckpt"
    checkpoint_module.save_state(versioned_state(1), path)
    first = _inodes(path)
    checkpoint_module.save_state(versioned_state(2), path)
    spare = tmp_path / ".ckpt.spare"
    assert _inodes(spare) == first and not (spare / MANIFEST).exists()  # kept, and never loadable
    checkpoint_module.save_state(versioned_state(3), path)
    assert _inodes(path) == first  # the same files, rewritten in place: their disk blocks reused
    assert loaded_version(path) == 3
    assert checkpoint_module.remove_spare(path) and sorted(os.listdir(tmp_path)) == ["ckpt"]
    checkpoint_module.save_state(versioned_state(4), path)  # without a spare: new files
    assert loaded_version(path) == 4 and sorted(os.listdir(tmp_path)) == [".ckpt.spare", "ckpt"]


def test_a_save_never_rewrites_files_a_load_still_maps(tmp_path: Path) -> None:
    path = tmp_path / "ckpt"
    checkpoint_module.save_state(versioned_state(1), path)
    held = load_state(path, kind="Demo")  # maps of version 1's files, e.g. a load still copying
    first = _inodes(path)
    checkpoint_module.save_state(versioned_state(2), path)
    checkpoint_module.save_state(versioned_state(3), path)  # would rewrite version 1's files in place
    assert whole_version(held) == 1
    assert not set(_inodes(path).values()) & set(first.values())
    assert loaded_version(path) == 3
    del held
    checkpoint_module.save_state(versioned_state(4), path)  # version 2's files are free: rewritten
    assert loaded_version(path) == 4


def test_a_hard_linked_backup_of_a_checkpoint_survives_later_saves(tmp_path: Path) -> None:
    path, backup = tmp_path / "ckpt", tmp_path / "backup"
    checkpoint_module.save_state(versioned_state(1), path)
    shutil.copytree(path, backup, copy_function=os.link)  # `cp -al`: the same inodes
    for version in (2, 3, 4):
        checkpoint_module.save_state(versioned_state(version), path)
    assert loaded_version(backup) == 1 and loaded_version(path) == 4


def test_a_forged_spare_is_never_written_through(tmp_path: Path) -> None:
    path, victim_dir = tmp_path / "ckpt", tmp_path / "victim"
    victim_dir.mkdir()
    victim = victim_dir / "precious.txt"
    victim.write_text("mine")
    checkpoint_module.save_state(versioned_state(1), path)
    checkpoint_module.save_state(versioned_state(2), path)
    spare = tmp_path / ".ckpt.spare"
    names = sorted(os.listdir(spare / "tensors"))
    (spare / "tensors" / names[0]).unlink()
    (spare / "tensors" / names[0]).symlink_to(victim)          # a link where a tensor file was
    (spare / "tensors" / names[1]).unlink()
    os.mkfifo(spare / "tensors" / names[1])                      # a FIFO where another was
    (spare / "tensors" / "state.extra.bin").write_bytes(b"junk")  # a file no save writes
    (spare / "notes").mkdir()
    checkpoint_module.save_state(versioned_state(3), path)
    assert victim.read_text() == "mine" and loaded_version(path) == 3
    shutil.rmtree(tmp_path / ".ckpt.spare")
    (tmp_path / ".ckpt.spare").symlink_to(victim_dir)           # the spare itself a link
    checkpoint_module.save_state(versioned_state(4), path)
    checkpoint_module.save_state(versioned_state(5), path)
    assert os.listdir(victim_dir) == ["precious.txt"] and victim.read_text() == "mine"
    assert loaded_version(path) == 5


def test_loads_during_saves_each_get_one_whole_version(tmp_path: Path) -> None:
    path = tmp_path / "ckpt"
    checkpoint_module.save_state(versioned_state(1), path)
    stop, versions, errors = threading.Event(), [], []

    def load_repeatedly() -> None:
        while not stop.is_set():
            try:
                versions.append(loaded_version(path))
            except BaseException as error:  # reported below
                errors.append(error)
                return

    reader = threading.Thread(target=load_repeatedly)
    reader.start()
    try:
        for version in range(2, 40):
            checkpoint_module.save_state(versioned_state(version), path)
    finally:
        stop.set()
        reader.join()
    assert errors == [] and len(versions) > 0 and versions == sorted(versions)
