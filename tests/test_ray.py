"""A ReplayBuffer in a Ray actor: remote writers lose nothing, dead writers lose only their own
unsent data, the remote state checkpoints like a local buffer, and closing stops the actor."""

from __future__ import annotations

import copy
import json
import math
import sys
import warnings
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from _ray_cluster import local_ray
from tensordict import TensorDict

ray = pytest.importorskip("ray")

from _rows import check_id_rows, id_rows  # noqa: E402

from rlbuf import (  # noqa: E402
    BatchSizeError,
    CheckpointError,
    ConfigError,
    DtypeError,
    EmptyBufferError,
    PriorityError,
    RateLimitTimeoutError,
    ReplayBatch,
    ReplayBuffer,
    ShapeError,
    ShardDiedError,
    StoredIndexError,
    Transition,
)
from rlbuf.checkpoint import save_state  # noqa: E402
from rlbuf.ray import (  # noqa: E402
    RateLimiter,
    RemoteReplayBuffer,
    RemoteReplayBufferHandle,
    ReplayService,
    ServiceWriter,
)

CHUNKS, ROWS = 12, 8


@pytest.fixture(scope="module", autouse=True)
def ray_cluster() -> Iterator[None]:
    """One local Ray instance for the module, on loopback, shut down at the end."""
    yield from local_ray(sys.modules[__name__], sys.modules[id_rows.__module__])


def _rows(uid: torch.Tensor) -> TensorDict:
    rows = id_rows(uid)
    rows["step_count"] = torch.zeros(uid.numel(), 1, dtype=torch.int64)  # a key the buffer does not store
    return rows


def _chunk(worker: int, chunk: int) -> TensorDict:
    first = worker * 1_000_000 + chunk * ROWS
    return _rows(torch.arange(first, first + ROWS, dtype=torch.float32))


def _new_buffer(capacity: int = 4096, **options: Any) -> RemoteReplayBuffer:
    # num_cpus=0: the 2-CPU test cluster stays free for the writers.
    return RemoteReplayBuffer(capacity, obs_shape=(3,), action_shape=(2,), seed=0,
                              actor_options={"num_cpus": 0}, **options)


@ray.remote(num_cpus=0.5)
def extend_chunks(buffer: RemoteReplayBufferHandle, worker: int, chunks: int, fail_after: int | None = None) -> int:
    for chunk in range(chunks):
        if chunk == fail_after:
            raise RuntimeError(f"writer {worker} crashed after {chunk} chunks")
        buffer.extend(_chunk(worker, chunk))
    return chunks


@ray.remote(num_cpus=0.5)
def add_steps(buffer: RemoteReplayBufferHandle, worker: int, steps: int) -> int:
    for step in range(steps):
        uid = float(worker * 1_000_000 + step)
        buffer.add(torch.full((3,), uid), torch.full((2,), uid), uid, torch.full((3,), uid + 0.5), step % 2 == 0, truncated=False)
    return steps


@ray.remote(num_cpus=0)
class EndlessWriter:
    def run(self, buffer: RemoteReplayBufferHandle, worker: int) -> None:
        chunk = 0
        while True:
            buffer.extend(_chunk(worker, chunk))
            chunk += 1


def _ids(buffer: RemoteReplayBuffer, worker: int) -> list[int]:
    reward = buffer.sample_all().reward
    mine = reward[(reward >= worker * 1_000_000) & (reward < (worker + 1) * 1_000_000)]
    return sorted(int(uid) - worker * 1_000_000 for uid in mine.tolist())


def test_two_remote_writers_store_every_transition_exactly_once() -> None:
    with _new_buffer() as buffer:
        writers = [extend_chunks.remote(buffer, 1, CHUNKS), add_steps.remote(buffer.handle, 2, CHUNKS * ROWS)]
        pending, samples = writers, 0
        while pending or samples == 0:
            _, pending = ray.wait(pending, timeout=0.05)
            if len(buffer):
                check_id_rows(buffer.sample(64))          # the learner samples while writers write
                samples += 1
        assert ray.get(writers) == [CHUNKS, CHUNKS * ROWS]
        stored = buffer.sample_all()
        check_id_rows(stored)
        ids = stored.reward.tolist()
        expected = {float(w * 1_000_000 + i) for w in (1, 2) for i in range(CHUNKS * ROWS)}
        assert len(ids) == len(buffer) == len(expected) and set(ids) == expected


def test_a_writer_that_raises_loses_only_its_unsent_chunks() -> None:
    with _new_buffer() as buffer:
        crashing = extend_chunks.remote(buffer, 1, CHUNKS, fail_after=5)
        healthy = extend_chunks.remote(buffer, 2, CHUNKS)
        with pytest.raises(RuntimeError, match="crashed after 5 chunks"):
            ray.get(crashing)
        ray.get(healthy)
        assert _ids(buffer, 1) == list(range(5 * ROWS))
        assert _ids(buffer, 2) == list(range(CHUNKS * ROWS))


def test_a_killed_writer_leaves_whole_chunks_and_the_buffer_keeps_serving() -> None:
    with _new_buffer(capacity=1 << 16) as buffer:
        writer = EndlessWriter.remote()           # type: ignore[attr-defined]
        running = writer.run.remote(buffer, 3)
        while len(buffer) < 3 * ROWS:
            ray.wait([running], timeout=0.05)
        ray.kill(writer)
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(running)
        ids = _ids(buffer, 3)
        assert ids == list(range(len(ids))) and len(ids) % ROWS == 0      # whole chunks, in order
        check_id_rows(buffer.sample(32))
        buffer.extend(_chunk(4, 0))
        assert _ids(buffer, 4) == list(range(ROWS))


def test_errors_reach_the_caller_as_rlbuf_errors_and_close_stops_the_actor() -> None:
    with pytest.raises(ConfigError, match="capacity"):
        _new_buffer(capacity=-1)                  # the actor is stopped again (checked at module end)
    with pytest.raises(ConfigError, match="bytes"):
        _new_buffer(capacity=10**12)              # refused before allocating: no dead actor
    buffer = _new_buffer()
    handle = buffer.handle
    with pytest.raises(EmptyBufferError):
        buffer.sample(4)
    with pytest.raises(ShapeError, match=r"obs: expected shape \(1, 3\) or \(3,\), got \(4,\)"):
        buffer.add(torch.zeros(4), torch.zeros(2), 1.0, torch.zeros(3), False, truncated=False)
    with pytest.raises(ShapeError):               # the same from a writer's handle
        handle.add(torch.zeros(4), torch.zeros(2), 1.0, torch.zeros(3), False, truncated=False)
    with pytest.raises(DtypeError, match="reward"):  # would be stored as inf
        buffer.add(torch.zeros(3), torch.zeros(2), np.float64(1e300), torch.zeros(3), False, truncated=False)
    huge = _chunk(1, 0)
    huge["next", "reward"] = torch.full((ROWS, 1), 1e300, dtype=torch.float64)
    with pytest.raises(DtypeError, match="reward"):
        buffer.extend(huge)
    assert len(buffer) == 0
    buffer.add(Transition(torch.ones(3), torch.ones(2), 1.0, torch.full((3,), 1.5), False, truncated=False))
    buffer.extend(_chunk(1, 0))
    assert len(handle) == ROWS + 1
    check_id_rows(buffer.sample_all())
    buffer.close()
    buffer.close()                                # again: nothing happens
    assert buffer.closed and repr(buffer) == "RemoteReplayBuffer(closed)"
    with pytest.raises(ray.exceptions.RayActorError):
        len(handle)                               # the actor is gone, not just forgotten
    with pytest.raises(RuntimeError, match="closed"):
        buffer.sample(1)


def test_save_on_the_remote_buffer_then_load_here_equals_its_contents(tmp_path: Path, device: str) -> None:
    with _new_buffer(capacity=64, prioritized=True, device=device) as buffer:
        for chunk in range(10):                   # 80 rows into 64: the ring wraps
            buffer.extend(_chunk(1, chunk))
        batch = buffer.sample(16)
        assert batch.obs.device.type == batch.weight.device.type == torch.device(device).type
        buffer.update_priority(batch.index, torch.arange(1.0, 17.0))
        buffer.save(tmp_path / "remote")          # written by the actor (same machine here)
        save_state(buffer.state_dict(), tmp_path / "fetched")   # copied here, written here
        remote_all = buffer.sample_all()
        for path in ("remote", "fetched"):
            local = ReplayBuffer.load(tmp_path / path)
            local_all = local.sample_all()
            for name in ("obs", "action", "reward", "next_obs", "terminated", "truncated", "index"):
                assert torch.equal(getattr(local_all, name).cpu(), getattr(remote_all, name).cpu()), name
        expected = local.sample(32)               # exact resume: the next draw is the same
        got = buffer.sample(32)
        assert torch.equal(got.index.cpu(), expected.index) and torch.equal(got.weight.cpu(), expected.weight)
        with RemoteReplayBuffer.load(tmp_path / "remote", actor_options={"num_cpus": 0}) as copy:
            assert torch.equal(copy.sample_all().reward, remote_all.reward.cpu())


@ray.remote(num_cpus=0.5)
def collect(buffer: RemoteReplayBufferHandle, seed: int, steps: int, chunk: int = 64) -> int:
    """The collector of docs/scale.md: CartPole steps sent in batches of ``chunk``."""
    env = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=seed)
    rows = []
    for _ in range(steps):
        action = env.action_space.sample()
        next_obs, reward, terminated, truncated, _ = env.step(action)
        rows.append((obs, action, reward, next_obs, terminated, truncated))
        obs = env.reset()[0] if terminated or truncated else next_obs
        if len(rows) == chunk:
            buffer.extend(to_tensordict(rows))
            rows = []
    return steps


def to_tensordict(rows: list[tuple[Any, ...]]) -> TensorDict:
    obs, action, reward, next_obs, terminated, truncated = (torch.as_tensor(np.array(c)) for c in zip(*rows, strict=True))
    return TensorDict({
        "observation": obs, "action": action, ("next", "observation"): next_obs,
        ("next", "reward"): reward.float(), ("next", "terminated"): terminated,
        ("next", "truncated"): truncated,
    }, batch_size=[len(rows)])


def test_ray_collectors_fill_the_buffer() -> None:
    """docs/scale.md's examples: Ray tasks, and TorchRL's RayCollector through ``buffer.torchrl``."""
    from torchrl.collectors import RandomPolicy
    from torchrl.collectors.distributed import RayCollector
    from torchrl.data import RayReplayBuffer
    from torchrl.envs import GymEnv

    with RemoteReplayBuffer(10_000, obs_shape=(4,), action_shape=(), action_dtype=torch.int64, seed=0,
                            actor_options={"num_cpus": 0}) as buffer:
        assert ray.get([collect.remote(buffer, seed, 128) for seed in range(2)]) == [128, 128]
        assert len(buffer) == 256

        make_env = partial(GymEnv, "CartPole-v1", categorical_action_encoding=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)         # "no policy weights to sync": a random policy
            collector = RayCollector([make_env, make_env], RandomPolicy(make_env().full_action_spec),
                                     collector_class="single", frames_per_batch=64, total_frames=256, sync=True,
                                     replay_buffer=buffer.torchrl, remote_configs={"num_cpus": 0.5, "memory": 0})
            try:
                for nothing in collector:
                    assert nothing is None                       # the collectors wrote into the actor
            finally:
                collector.shutdown()
        rows = buffer.sample_all()
        assert len(rows) == 512 and torch.equal(rows.reward, torch.ones(512))
        assert torch.equal(rows.done, rows.terminated | rows.truncated) and bool(rows.terminated.any())
        # Rows arrive in whole, ordered batches (64 rows from a task, 32 from each RayCollector
        # worker): inside one, a step's next_obs is the next row's obs unless the episode ended.
        within = (torch.arange(511) % 32 != 31) & ~rows.done[:-1]
        assert torch.equal(rows.next_obs[:-1][within], rows.obs[1:][within])

        rb = buffer.torchrl
        assert isinstance(rb, RayReplayBuffer)
        td = rb.sample(8)                                        # TorchRL's layout
        assert td["next", "reward"].shape == (8, 1) and td["observation"].shape == (8, 4)
        client = rb.client()                                     # TorchRL's picklable writer, in a task
        ray.get(ray.remote(num_cpus=0.5)(lambda c: c.extend(td.exclude("index", "priority_weight"))).remote(client))
        assert len(rb) == len(buffer) == 512 + 8
        with pytest.raises(ShapeError):                          # rlbuf's validation behind TorchRL's API
            rb.extend(td.set("observation", torch.zeros(8, 3)))
        assert "size=520/10000" in repr(buffer)


def test_dict_observations_and_hidden_states_travel_both_ways() -> None:
    obs = {"camera": torch.full((2, 2, 2), 7, dtype=torch.uint8), "proprio": torch.arange(6.0).view(2, 3)}
    with RemoteReplayBuffer(64, obs_shape={"camera": (2, 2), "proprio": (3,)}, obs_dtype={"camera": torch.uint8},
                            action_shape=(), num_envs=2, seed=0, hidden_state_shape={"h": (1, 2)}) as buffer:
        buffer.add(obs, torch.zeros(2), torch.ones(2), obs, torch.zeros(2, dtype=torch.bool),
                   hidden_state={"h": torch.ones(2, 1, 2)}, truncated=False)
        # TorchRL's GymEnv puts a Dict space's keys at the top level: extend reads them there too.
        buffer.extend(TensorDict({**obs, "action": torch.zeros(2), "recurrent_state_h": torch.full((2, 1, 2), 2.0),
                                  "next": {**obs, "reward": torch.ones(2), "terminated": torch.zeros(2, dtype=torch.bool),
                                           "truncated": torch.zeros(2, dtype=torch.bool)}},
                                 batch_size=[2]))
        with pytest.raises(ShapeError, match=r'obs\["proprio"\]'):
            buffer.add({**obs, "proprio": torch.zeros(2, 4)}, torch.zeros(2), torch.ones(2), obs,
                       torch.zeros(2, dtype=torch.bool), hidden_state={"h": torch.ones(2, 1, 2)}, truncated=False)
        batch = buffer.sample_all()
        sequences = buffer.sample_sequences(3, 1, burn_in=1)
    assert sequences.obs["camera"].shape == (3, 2, 2, 2) and sequences.burn_in == 1
    assert sequences.hidden_state is not None and sequences.hidden_state["h"].shape == (3, 1, 2)
    assert isinstance(batch.obs, TensorDict) and batch.obs["camera"].dtype is torch.uint8
    assert torch.equal(batch.next_obs["proprio"], obs["proprio"].repeat(2, 1))
    assert batch.hidden_state is not None and batch.hidden_state["h"][:, 0, 0].tolist() == [1.0, 1.0, 2.0, 2.0]


# -- ReplayService: shards, rate limits, checkpoints ------------------------------------------
SERVICE_CHUNKS = 24
ID = 1_000_000  # id rows carry ids >= ID in every field; CartPole rows have reward 1


@pytest.fixture(scope="module")
def service(ray_cluster: None) -> Iterator[ReplayService]:
    """One CartPole-shaped 2-shard prioritized service with a rate limiter, shared by the service
    tests in order (starting a shard actor costs seconds here: each imports torch)."""
    limiter = RateLimiter(samples_per_insert=2.0, min_size_to_sample=64, error_buffer=2048.0)
    with ReplayService(2 * 4096, num_shards=2, obs_shape=(4,), action_shape=(), action_dtype=torch.int64,
                       prioritized=True, rate_limiter=limiter, timeout=60.0, seed=0,
                       actor_options={"num_cpus": 0}) as built:
        yield built


def epsilon(i: int, n: int, base: float = 0.4, alpha: float = 7.0) -> float:
    """Ape-X's exploration of actor ``i`` of ``n``: from ``base`` down to ``base ** 8``."""
    return base ** (1 + alpha * i / max(n - 1, 1))


def q_network() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(4, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))


@ray.remote(num_cpus=0.5)
def apex_actor(writer: ServiceWriter, weights: dict[str, torch.Tensor], i: int, n: int, steps: int,
               chunk: int = 64) -> int:
    """docs/ray.md's actor: CartPole, epsilon-greedy on the learner's weights, batches of ``chunk``."""
    q = q_network()
    q.load_state_dict(weights)
    env, rng = gym.make("CartPole-v1"), np.random.default_rng(i)
    obs, _ = env.reset(seed=i)
    rows = []
    for _ in range(steps):
        if rng.random() < epsilon(i, n):
            action = int(rng.integers(2))
        else:
            with torch.no_grad():
                action = int(q(torch.as_tensor(obs)).argmax())
        next_obs, reward, terminated, truncated, _ = env.step(action)
        rows.append((obs, action, reward, next_obs, terminated, truncated))
        obs = env.reset()[0] if terminated or truncated else next_obs
        if len(rows) == chunk:
            writer.extend(to_tensordict(rows))
            rows = []
    return steps


def learn(service: ReplayService, q: torch.nn.Module, target: torch.nn.Module,
          optimizer: torch.optim.Optimizer, gamma: float = 0.99) -> tuple[torch.Tensor, float]:
    """docs/ray.md's learner step: double DQN on a prioritized batch, priorities back."""
    batch = service.sample(64)
    with torch.no_grad():
        best = q(batch.next_obs).argmax(1, keepdim=True)
        next_q = target(batch.next_obs).gather(1, best).squeeze(1)
        y = batch.reward + gamma * (~batch.terminated) * next_q
    td = y - q(batch.obs).gather(1, batch.action[:, None]).squeeze(1)
    loss = (batch.weight * td.pow(2)).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    service.update_priority(batch.index, td.abs().detach() + 1e-3)
    return batch.index, loss.item()


def test_an_apex_shaped_run_checkpoints_and_resumes_exactly(service: ReplayService, tmp_path: Path) -> None:
    """docs/ray.md's Ape-X example: per-actor epsilon, one learner, the rate limiter on, a save
    while the actors write, and a restore (in place, then into a new service by ``load``) whose
    next batches, losses and counters equal those of the run that kept going."""
    torch.manual_seed(0)
    q = q_network()
    learner = (q, q_network(), torch.optim.Adam(q.parameters(), lr=1e-3))
    learner[1].load_state_dict(q.state_dict())
    actors = [apex_actor.remote(service.writer(writer_id=i), q.state_dict(), i, 2, 512) for i in range(2)]
    for step in range(12):                                  # waits for 64 rows a shard first
        learn(service, *learner)
        if step == 6:
            service.save(tmp_path / "during")               # while the actors write
    assert ray.get(actors) == [512, 512] and service.sizes() == [512, 512]
    service.save(tmp_path / "apex")
    saved, saved_again = copy.deepcopy(learner), copy.deepcopy(learner)
    uninterrupted = [learn(service, *learner) for _ in range(4)]
    counters = service.rate_limiters()
    service.restore(tmp_path / "apex")
    for (index, loss), (expected_index, expected_loss) in zip(
            [learn(service, *saved) for _ in range(4)], uninterrupted, strict=True):
        assert torch.equal(index, expected_index) and loss == expected_loss
    assert service.rate_limiters() == counters
    with ReplayService.load(tmp_path / "apex", actor_options={"num_cpus": 0}) as loaded:  # a new service
        for (index, loss), (expected_index, expected_loss) in zip(
                [learn(loaded, *saved_again) for _ in range(4)], uninterrupted, strict=True):
            assert torch.equal(index, expected_index) and loss == expected_loss
        assert loaded.rate_limiters() == counters and loaded.sizes() == [512, 512]
    during = [ReplayBuffer.load(tmp_path / "during" / f"shard_{k}") for k in range(2)]
    assert all(len(shard) % 64 == 0 for shard in during)    # whole batches only


def _id_rows(first: int, n: int = ROWS) -> TensorDict:
    """CartPole-shaped rows whose every field carries its id (``first`` .. ``first + n - 1``)."""
    uid = torch.arange(first, first + n, dtype=torch.int64)
    return TensorDict({
        "observation": uid[:, None].expand(n, 4).float(), "action": uid.clone(),
        ("next", "observation"): uid[:, None].expand(n, 4).float() + 0.5, ("next", "reward"): uid.float(),
        ("next", "terminated"): uid % 2 == 0, ("next", "truncated"): torch.zeros(n, dtype=torch.bool),
        "step_count": torch.zeros(n, dtype=torch.int64),           # a key the service does not store
    }, batch_size=[n])


def _check_ids(batch: ReplayBatch) -> list[int]:
    """Assert every field of every id row carries the same id; return the ids (CartPole rows left out)."""
    mine = batch.reward >= ID
    uid = batch.action[mine]
    assert torch.equal(batch.reward[mine], uid.float()), "torn row: reward"
    assert torch.equal(batch.obs[mine], uid[:, None].expand(-1, 4).float()), "torn row: obs"
    assert torch.equal(batch.next_obs[mine], uid[:, None].expand(-1, 4).float() + 0.5), "torn row: next_obs"
    assert torch.equal(batch.terminated[mine], uid % 2 == 0), "torn row: terminated"
    return uid.tolist()


@ray.remote(num_cpus=0.5)
def write_chunks(writer: ServiceWriter, worker: int, chunks: int) -> list[int]:
    return [writer.extend(_id_rows(worker * ID + chunk * ROWS)) for chunk in range(chunks)]


def _chunks(ids: list[int]) -> dict[tuple[int, int], list[int]]:
    """``(worker, chunk) -> ids`` of the id rows stored, for chunks of ROWS ids each."""
    chunks: dict[tuple[int, int], list[int]] = {}
    for uid in ids:
        chunks.setdefault((uid // ID, uid % ID // ROWS), []).append(uid)
    return chunks


def test_service_shards_lose_and_duplicate_no_row_under_writers_samples_priorities_and_a_save(
        service: ReplayService, tmp_path: Path) -> None:
    with pytest.raises(ShapeError, match="obs"):                    # refused whole by the shard
        service.writer(shard=1).extend(_id_rows(9 * ID).set("observation", torch.zeros(ROWS, 3)))
    with pytest.raises(BatchSizeError, match="wider than the rate limiter's band"):
        service.sample(5000 * 2)
    counters = service.rate_limiters()
    with pytest.raises(RateLimitTimeoutError, match="sampling would run ahead"):
        for _ in range(8):                                          # the learner runs ahead of the band
            counters, split = service.rate_limiters(), service._rng.bit_generator.state
            service.sample(2048, timeout=0.0)
    assert service.rate_limiters() == counters                      # the held sample moved nothing
    assert service._rng.bit_generator.state == split                # nor the learner's split of batches
    before = len(service)

    writers = [write_chunks.remote(service.writer(writer_id=w), w + 1, SERVICE_CHUNKS) for w in range(2)]
    for step in range(6):                                           # the learner, while they write
        batch = service.sample(32)                                  # held until the writers make room
        _check_ids(batch)
        service.update_priority(batch.index, torch.rand(32) + 0.1)
        if step == 2:
            service.save(tmp_path / "during")                       # writers keep writing
    shard_of = ray.get(writers)
    assert shard_of == [[(w + c) % 2 for c in range(SERVICE_CHUNKS)] for w in range(2)]   # round-robin

    everything = service.sample_all()
    ids = _check_ids(everything)
    expected = {w * ID + i for w in (1, 2) for i in range(SERVICE_CHUNKS * ROWS)}
    assert len(ids) == len(set(ids)) == len(expected) and set(ids) == expected
    assert len(everything.reward) == before + len(expected)
    shard = (everything.index[everything.reward >= ID] // service.shard_capacity).tolist()
    for (worker, chunk), members in _chunks(ids).items():          # every chunk whole, where it was sent
        assert len(members) == ROWS and {shard[ids.index(uid)] for uid in members} == {shard_of[worker - 1][chunk]}

    with pytest.raises(StoredIndexError, match=r"index: expected positions in \[0, 8192\), got values in \[8192, 8192\]"):
        service.update_priority([service.capacity], [1.0])
    with pytest.raises(StoredIndexError, match="expected integer positions"):
        service.update_priority(torch.tensor([0.5]), [1.0])
    # Each was torch's own error, and complex indices were taken by their real part (helper 44).
    for index in (None, slice(0, 2), "abc", [2**64], torch.tensor([1j])):
        with pytest.raises(StoredIndexError, match=r"^index: "):
            service.update_priority(index, [1.0])
    # A batch wider than the band (4,096) was split, one shard sampled, another refused (helper 44): refused
    # whole first. A writer whose batches could never fit the band lost every step it gathered: refused when made.
    limiters = service.rate_limiters()
    with pytest.raises(BatchSizeError, match=r"^batch_size: a sample of 5000 rows is wider than the rate limiter's"):
        service.sample(5000)
    with pytest.raises(ConfigError, match=r"^batch_steps=3000: its batches of 3000 rows could never be stored .*"
                                          r"give a smaller batch_steps"):
        service.writer(shard=0, batch_steps=3000)
    assert service.rate_limiters() == limiters
    with pytest.raises(PriorityError, match="expected 2 values"):
        service.update_priority([0, 1], [1.0])
    with pytest.raises(ConfigError, match="beta: expected a finite number >= 0"):
        service.beta = -1.0
    service.beta = 1.0                                              # annealed on every shard
    assert service.beta == 1.0 and float(service.sample(64).weight.max()) <= 1.0

    # The checkpoint taken during the writes: whole chunks, each writer's a prefix of what it sent
    # to each shard, and limiter counters that match each shard's rows.
    saved = json.loads((tmp_path / "during" / "service.json").read_text())
    for k in range(2):
        rows = ReplayBuffer.load(tmp_path / "during" / f"shard_{k}").sample_all()
        counted = saved["limiter_counters"][k]
        assert counted["inserts"] - counted["deletes"] == len(rows.reward)
        chunks = _chunks(_check_ids(rows))
        assert all(len(members) == ROWS for members in chunks.values())
        for worker in (1, 2):
            sent = [c for c in range(SERVICE_CHUNKS) if shard_of[worker - 1][c] == k]
            stored = sorted(c for w, c in chunks if w == worker)
            assert stored == sent[:len(stored)]


def test_a_killed_shard_is_reported_then_restored_from_the_last_checkpoint(
        service: ReplayService, tmp_path: Path) -> None:
    service.save(tmp_path / "last")
    sizes, counters = service.sizes(), service.rate_limiters()
    writer = service.writer(shard=1)
    ray.kill(service.actors[1])
    with pytest.raises(ShardDiedError, match="shard 1: its Ray actor is gone"):
        service.save(tmp_path / "never")
    with pytest.raises(ShardDiedError, match=r"shard 1: .*ReplayService.load"):
        writer.extend(_id_rows(5 * ID))
    with pytest.raises(ShardDiedError, match="shard 1"):
        ray.get(write_chunks.remote(service.writer(shard=1), 5, 1))
    service.writer(shard=0).extend(_id_rows(5 * ID))                # the live shard keeps serving
    service.restore(tmp_path / "last")                              # shard 1 started again from its part
    assert service.sizes() == sizes and service.rate_limiters() == counters
    service.writer(shard=1).extend(_id_rows(6 * ID))
    assert service.sizes() == [sizes[0], sizes[1] + ROWS]


def test_service_options_and_checkpoints_are_refused_before_any_actor_starts(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"capacity: expected a multiple of num_shards=3, got 100; use 99 or 102"):
        ReplayService(100, num_shards=3, obs_shape=(3,), action_shape=(2,))
    with pytest.raises(ConfigError, match="min_size_to_sample=64 rows per shard can never be reached with 32"):
        ReplayService(64, num_shards=2, obs_shape=(3,), action_shape=(2,),
                      rate_limiter=RateLimiter(min_size_to_sample=64))
    for timeout in (-1, math.inf):  # an infinity failed inside a shard's wait (OverflowError; helper 44)
        with pytest.raises(ConfigError, match=rf"timeout: expected None \(no limit\) or a finite number of seconds "
                                              rf">= 0, got {timeout}"):
            ReplayService(64, obs_shape=(3,), action_shape=(2,), timeout=timeout)
    with pytest.raises(CheckpointError, match=r"expected a ReplayService checkpoint's service\.json"):
        ReplayService.load(tmp_path / "never-saved")
    (tmp_path / "forged").mkdir()
    (tmp_path / "forged" / "service.json").write_text(json.dumps({"format": "rlbuf.ray.ReplayService", "version": 1,
                                                                 "num_shards": 2, "shard_capacity": 0}))
    with pytest.raises(CheckpointError, match="shard_capacity: expected an int >= 1, got 0"):
        ReplayService.load(tmp_path / "forged")
