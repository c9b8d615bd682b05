"""ServiceWriter.add (single steps checked at once, sent in batches, nothing lost at flush); a
ReplayService whose shards use the compact layout (frame_stack=4, n_step=3, zstd frames): each env's
stream stays in its writer's shard, no row is lost or duplicated, and a restore resumes exactly; and
a dead shard restarted from the last checkpoint (``restart_from``), with what was lost reported."""

from __future__ import annotations

import pickle
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _stacked_envs as stacked_envs
import pytest
import torch
from _ray_cluster import local_ray
from tensordict import TensorDict

ray = pytest.importorskip("ray")

from rlbuf import (  # noqa: E402
    ConfigError,
    DtypeError,
    NotPicklableError,
    RateLimitTimeoutError,
    ReplayBuffer,
    ShapeError,
    ShardDiedError,
    StreamError,
)
from rlbuf.ray import RateLimiter, ReplayService, ServiceWriter, ShardRestartedWarning  # noqa: E402

ID = 1_000_000   # writer w's env e has ids w * ID + e * STREAM + t
STREAM = 10_000
EPISODE = 7      # steps per episode: the last one terminates
FRAME = (6, 6)
STEPS = 6 * EPISODE  # steps per writer, 2 envs each: whole episodes


@pytest.fixture(scope="module", autouse=True)
def ray_cluster() -> Iterator[None]:
    """One local Ray instance for the module, on loopback, shut down at the end."""
    yield from local_ray(sys.modules[__name__])


@pytest.fixture(scope="module")
def plain(ray_cluster: None) -> Iterator[ReplayService]:
    """Two plain shards of CartPole-shaped rows, a rate limiter that never binds here."""
    limiter = RateLimiter(samples_per_insert=1.0, min_size_to_sample=1, error_buffer=1e9)
    with ReplayService(2 * 512, num_shards=2, obs_shape=(4,), action_shape=(), action_dtype=torch.int64, num_envs=2,
                       rate_limiter=limiter, seed=0, actor_options={"num_cpus": 0}) as built:
        yield built


@pytest.fixture(scope="module")
def compact(ray_cluster: None) -> Iterator[ReplayService]:
    """Two shards of Atari-like stacks stored compactly: frames once, zstd-compressed, n-step returns."""
    with ReplayService(2 * 512, num_shards=2, obs_shape=(4, *FRAME), obs_dtype=torch.uint8, action_shape=(),
                       action_dtype=torch.int64, num_envs=2, frame_stack=4, n_step=3, compression="zstd", seed=0,
                       actor_options={"num_cpus": 0}) as built:
        yield built


def cartpole_step(uid: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """One step of 2 envs whose every field carries the row's id."""
    obs = uid[:, None].expand(2, 4).float()
    return obs, uid.clone(), uid.float(), obs + 0.5, uid % 2 == 0, torch.zeros(2, dtype=torch.bool)


def test_add_checks_each_step_at_once_and_sends_whole_batches(plain: ReplayService, tmp_path: Path) -> None:
    writer = plain.writer(shard=1, batch_steps=4)
    with pytest.raises(ShapeError, match="obs"):                     # refused at the add, not at the flush
        writer.add(torch.zeros(2, 3), torch.zeros(2, dtype=torch.int64), torch.ones(2), torch.zeros(2, 3),
                   torch.zeros(2, dtype=torch.bool), truncated=torch.zeros(2, dtype=torch.bool))
    assert writer.pending == 0
    for t in range(6):
        writer.add(*cartpole_step(torch.tensor([ID + 2 * t, ID + 2 * t + 1])))
    assert writer.pending == 4 and plain.sizes() == [0, 8]           # one batch of 4 steps sent, 2 steps held
    with pytest.raises(NotPicklableError, match="4 rows not yet sent"):
        pickle.dumps(writer)
    plain.save(tmp_path / "held")                                    # what is held is in no checkpoint
    assert ReplayBuffer.load(tmp_path / "held" / "shard_1").size == 8
    writer.flush()
    assert writer.pending == 0 and plain.sizes() == [0, 12]
    stored = plain.sample_all()
    assert stored.action.tolist() == list(range(ID, ID + 12))        # every step once, in order
    assert torch.equal(stored.obs, stored.action[:, None].expand(-1, 4).float())
    with pytest.raises(ConfigError, match="batch_steps: expected an int >= 1"):
        plain.writer(batch_steps=0)


@ray.remote(num_cpus=0.5)
def add_steps(writer: ServiceWriter, first: int, steps: int) -> int:
    with writer:                                                     # the last, partial batch goes at exit
        for t in range(steps):
            writer.add(*cartpole_step(torch.tensor([first + 2 * t, first + 2 * t + 1])))
    return writer.pending


def test_remote_writers_adding_steps_lose_and_duplicate_nothing(plain: ReplayService) -> None:
    before = set(plain.sample_all().action.tolist())
    assert ray.get([add_steps.remote(plain.writer(writer_id=w, batch_steps=8), (w + 2) * ID, 29)
                    for w in range(2)]) == [0, 0]
    ids = plain.sample_all().action.tolist()
    expected = before | {w * ID + i for w in (2, 3) for i in range(58)}
    assert len(ids) == len(set(ids)) == len(expected) and set(ids) == expected


def frame(uid: int) -> torch.Tensor:
    """A frame that carries ``uid`` in its first four bytes."""
    out = torch.full(FRAME, uid % 251, dtype=torch.uint8)
    out[0, :4] = torch.tensor(list(uid.to_bytes(4, "little")), dtype=torch.uint8)
    return out


def uid_of(frames: torch.Tensor) -> torch.Tensor:
    """The ids the frames ``[..., *FRAME]`` carry."""
    raw = frames[..., 0, :4].to(torch.int64)
    return raw[..., 0] + (raw[..., 1] << 8) + (raw[..., 2] << 16) + (raw[..., 3] << 24)


def stack(first: int, uid: int) -> torch.Tensor:
    """The 4-frame stack at ``uid`` of an episode starting at ``first`` (its first frame repeated before it)."""
    return torch.stack([frame(max(first, uid - 3 + i)) for i in range(4)])


def env_step(worker: int, t: int) -> tuple[torch.Tensor, ...]:
    """Step ``t`` of writer ``worker``'s 2 envs: episodes of EPISODE steps, ids in every frame and action."""
    uids = [worker * ID + e * STREAM + t for e in range(2)]
    first = [u - t % EPISODE for u in uids]
    obs = torch.stack([stack(f, u) for f, u in zip(first, uids, strict=True)])
    next_obs = torch.stack([stack(f, u + 1) for f, u in zip(first, uids, strict=True)])
    terminated = torch.full((2,), t % EPISODE == EPISODE - 1)
    return obs, torch.tensor(uids), torch.ones(2), next_obs, terminated, torch.zeros(2, dtype=torch.bool)


@ray.remote(num_cpus=0.5)
def add_frames(writer: ServiceWriter, worker: int, steps: int) -> int:
    with writer:
        for t in range(steps):
            writer.add(*env_step(worker, t))
    return steps


def test_compact_shards_keep_each_stream_whole_and_resume_exactly(compact: ReplayService, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="each env's steps must all go to one shard"):
        compact.writer()                                             # round-robin would split the streams
    with pytest.raises(ConfigError, match=r"writer_id: expected an int in \[0, 2\) with compact shards"):
        compact.writer(writer_id=2)                                  # two writers in one shard
    obs, action, reward, next_obs, terminated, truncated = env_step(0, 0)
    with pytest.raises(ConfigError, match="round-robin writer"):     # the learner's writer is round-robin
        compact.extend(TensorDict({"observation": obs, "action": action, ("next", "observation"): next_obs,
                                   ("next", "reward"): reward, ("next", "terminated"): terminated}, batch_size=[2]))
    writer = compact.writer(writer_id=0, batch_steps=4)
    writer.add(obs, action, reward, next_obs, terminated, truncated)
    with pytest.raises(StreamError, match="differs from the next_obs added with its previous step"):
        writer.add(*env_step(0, 5))                                  # skips steps 1-4: refused at the add
    assert writer.pending == 2 and compact.sizes() == [0, 0]
    for t in range(1, EPISODE):                                      # the episodes end: a whole first batch
        writer.add(*env_step(0, t))
    writer.flush()
    assert compact.sizes() == [2 * EPISODE, 0]

    # Two remote writers, one a shard, each continuing its envs' streams in batches of 4 steps.
    done = ray.get([add_frames.remote(compact.writer(writer_id=w, batch_steps=4), w + 1, STEPS) for w in range(2)])
    assert done == [STEPS, STEPS] and compact.sizes() == [2 * EPISODE + 2 * STEPS, 2 * STEPS]
    everything = compact.sample_all()
    uid = everything.action
    expected = {w * ID + e * STREAM + t for w in (1, 2) for e in range(2) for t in range(STEPS)}
    expected |= {e * STREAM + t for e in range(2) for t in range(EPISODE)}
    assert len(uid) == len(set(uid.tolist())) == len(expected) and set(uid.tolist()) == expected
    assert torch.equal(everything.index // compact.shard_capacity, (uid // ID - 1).clamp(min=0))  # the writer's shard
    first = uid - uid % STREAM % EPISODE
    for i in range(4):                                               # each stack rebuilt from its own stream
        assert torch.equal(uid_of(everything.obs[:, i]), torch.maximum(first, uid - 3 + i))
    assert torch.equal(uid_of(everything.next_obs[:, -1]), torch.minimum(uid + 3, first + EPISODE))
    assert torch.equal(everything.discount == 0, uid + 3 > first + EPISODE - 1)

    compact.save(tmp_path / "compact")
    kept_going = [compact.sample(32) for _ in range(3)]
    for frames_on_learner in (True, False):   # the shards' distinct frames sent, or their stacks built and sent
        compact.restore(tmp_path / "compact")
        compact._frames_on_learner = frames_on_learner
        for got, expected_batch in zip([compact.sample(32) for _ in range(3)], kept_going, strict=True):
            for name in ("index", "obs", "action", "reward", "next_obs", "discount"):
                assert torch.equal(getattr(got, name), getattr(expected_batch, name)), name
    compact._frames_on_learner = True

    # A writer that takes over from one that crashed mid-episode ends the episodes the shard still holds open.
    crashed = compact.writer(writer_id=0, batch_steps=1)
    for t in range(3):
        crashed.add(*env_step(5, t))
    successor = compact.writer(writer_id=0, batch_steps=1)
    with pytest.raises(StreamError, match="differs from the next_obs added with its previous step"):
        successor.add(*env_step(6, 0))                               # checked here, refused by the shard
    with pytest.raises(ShapeError, match="env_mask: expected 2 bools"):
        successor.truncate_episodes([True])
    before = compact.sizes()[0]
    successor.truncate_episodes()
    successor.add(*env_step(6, 0))
    rows = compact.sample_all()
    newest = (rows.action // ID == 5) & (rows.action % STREAM == 2)     # the crashed writer's last step
    assert compact.sizes()[0] == before + 2 and newest.sum() == 2 and rows.truncated[newest].all()

    # The service restored under a running writer: the shard's streams go back, the writer's own check does not.
    writer = compact.writer(writer_id=0, batch_steps=1)
    writer.truncate_episodes()                                       # the successor's episodes end
    writer.add(*env_step(7, 0))
    compact.save(tmp_path / "mid-episode")
    writer.add(*env_step(7, 1))
    compact.restore(tmp_path / "mid-episode")                        # the shard forgets step 1
    with pytest.raises(StreamError, match=r"shard 0's streams no longer follow this writer's.*call "
                                          r"writer\.truncate_episodes\(\)"):
        writer.add(*env_step(7, 2))                                  # checked here, refused by the shard
    writer.truncate_episodes()                                       # as the message says: both ends agree again,
    writer.add(*env_step(8, 0))                                      # and the reset envs start new episodes
    assert writer.pending == 0


def until_restarted(service: ReplayService) -> list[int]:
    """``service.sizes()`` once the restarted shard answers. ``ray.kill`` returns before the actor is
    dead, so a call may still reach the old actor (no restart heard yet: ask again); a call that
    reaches the shard while Ray restarts it fails with ShardDiedError ("call again"). Ray's restart
    is bounded."""
    deadline = time.monotonic() + 60
    while True:
        try:
            sizes = service.sizes()
            if service.shard_restarts:
                return sizes
        except ShardDiedError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError("the killed shard was not restarted within 60 s")
        time.sleep(0.01)


def test_a_dead_shard_is_restarted_from_the_last_checkpoint_and_what_was_lost_is_reported(tmp_path: Path) -> None:
    """``restart_from``: Ray starts a killed shard again under the same handle, from its part of
    the checkpoint; the learner is warned with the rows lost, and writers keep their batch."""
    path = tmp_path / "replay"
    with ReplayService(2 * 64, num_shards=2, obs_shape=(4,), action_shape=(), action_dtype=torch.int64,
                       num_envs=2, restart_from=path, seed=0, actor_options={"num_cpus": 0}) as service:
        writer = service.writer(shard=1, batch_steps=2)
        for t in range(4):
            writer.add(*cartpole_step(torch.tensor([2 * t, 2 * t + 1])))
        service.save(path)                                           # 8 rows in shard 1
        for t in range(4, 7):
            writer.add(*cartpole_step(torch.tensor([2 * t, 2 * t + 1])))
        assert service.sizes() == [0, 12] and writer.pending == 2   # 4 rows after the checkpoint, 2 held
        ray.kill(service.actors[1], no_restart=False)                # its process dies; Ray starts it again
        with pytest.warns(ShardRestartedWarning, match=r"shard 1: .*restarted from .*shard_1 \(write count 8\).* "
                                                       r"gone: 4 the learner knew of"):
            sizes = until_restarted(service)
        assert sizes == [0, 8] and service.shard_restarts == [
            {"shard": 1, "restored_from": str(path / "shard_1"), "write_count": 8, "lost_at_least": 4}]
        assert service.sample_all().action.tolist() == list(range(8))
        writer.flush()                                               # the held rows go to the restarted shard
        assert service.sample_all().action.tolist() == [*range(8), 12, 13]
        service.sizes()                                              # heard again: no second warning
        assert len(service.shard_restarts) == 1
        ray.kill(service.actors[1], no_restart=False)                # again: the learner's calls now wait
        deadline = time.monotonic() + 180  # a hang guard: Ray restarts a process slowly on a loaded machine
        with pytest.warns(ShardRestartedWarning, match=r"shard 1: .*restarted from .*shard_1 \(write count 8\)"):
            while len(service.shard_restarts) < 2:                  # no ShardDiedError: each call waits for it
                service.sizes()
                assert len(service.sample(4)) == 4 and time.monotonic() < deadline
        assert service.sizes() == [0, 8]
    with pytest.raises(ConfigError, match=r"restart_from: expected None or the path service\.save writes to"):
        ReplayService(64, obs_shape=(4,), action_shape=(), restart_from=3)


def test_rlbuf_demo_apex_runs_with_a_checkpoint_and_resumes_exactly(tmp_path: Path) -> None:
    """``rlbuf demo apex`` in short: actors with their own epsilon add steps through writers, the
    learner samples under the limiter, checkpoints are written while the actors write, and the
    learner's next steps after restoring the final checkpoint equal those of the run that kept going."""
    from rlbuf.demos._options import ApexArgs
    from rlbuf.demos.apex import run

    out = tmp_path / "apex"
    summary = run(ApexArgs(frames=800, chunk=100, batch_steps=25, checkpoint_every=400, learning_starts=100,
                           buffer_size=4_000, out=str(out), progress=False))
    assert summary["status"] == "finished" and summary["resume_exact"] is True
    assert summary["shard_sizes"] == [summary["frames"]] and summary["frames"] >= 800
    counters = summary["limiter_counters"][0]
    assert counters["inserts"] == summary["frames"] and counters["samples"] == 64 * summary["learner_steps"]
    assert summary["epsilons"][0] == 0.4 and summary["epsilons"][1] == pytest.approx(0.4 ** 8)
    saved = sorted(path.name for path in (out / "checkpoints").iterdir())
    assert "frames-400" in saved and f"frames-{summary['frames']}" in saved
    assert ReplayBuffer.load(out / "checkpoints" / "frames-400" / "shard_0").size >= 100   # written mid-run


def test_a_shard_the_learner_is_ahead_on_is_left_out_and_the_others_keep_serving() -> None:
    """Shard 1's writer stops early: once the learner has drawn its rows, batches come from shard 0
    alone (its writer is not held by shard 1); a sample waits, and times out, only when no shard
    can give its share, and that timeout moves no counter."""
    limiter = RateLimiter(samples_per_insert=1.0, min_size_to_sample=8, error_buffer=(0.0, 10_000.0))
    with ReplayService(2 * 256, num_shards=2, obs_shape=(4,), action_shape=(), action_dtype=torch.int64,
                       num_envs=2, rate_limiter=limiter, seed=0, actor_options={"num_cpus": 0}) as service:
        for shard, steps in ((0, 32), (1, 8)):                       # 64 rows in shard 0, 16 in shard 1
            with service.writer(shard=shard, batch_steps=8) as writer:
                for t in range(steps):
                    writer.add(*cartpole_step(torch.tensor([2 * t, 2 * t + 1])))
        batches = []
        with pytest.raises(RateLimitTimeoutError, match="sampling would run ahead"):
            for _ in range(11):                                      # 80 rows may be drawn in all
                counters = service.rate_limiters()
                batches.append(service.sample(8, timeout=0.0))
        assert service.rate_limiters() == counters                   # the held sample moved nothing
        room = [c["counters"]["inserts"] - c["counters"]["samples"] for c in counters or []]
        assert all(0 <= left < 8 for left in room)                   # no shard could give a share of 8
        shard_of = [batch.index // service.shard_capacity for batch in batches]
        assert sum(int((s == 1).sum()) for s in shard_of) == 16 - room[1]
        assert any(bool((s == 0).all()) for s in shard_of[-3:])      # shard 1 drawn out: shard 0 alone


def test_a_compact_writers_steps_that_leave_envs_out_are_stored_as_a_local_buffer_stores_them() -> None:
    """``add(..., env_mask=)`` to a compact shard: gymnasium's NEXT_STEP reset steps left out, checked at the
    add and stored by the shard's own ``add`` of each step, so the shard holds, bit for bit, the transitions a
    local buffer given the same adds holds (whole steps go as ``(num_envs, steps)`` blocks: env by env, so in
    another order in the ring)."""
    options: dict[str, Any] = {"obs_shape": (4, *stacked_envs.FRAME), "obs_dtype": torch.uint8, "action_shape": (),
                               "action_dtype": torch.int64, "num_envs": 2, "frame_stack": 4, "n_step": 3,
                               "padding_type": "zero", "seed": 0}
    local = ReplayBuffer(64, **options)
    envs = stacked_envs.Envs(2, 4, "zero", torch.uint8, False, seed=0)
    with ReplayService(64, num_shards=1, actor_options={"num_cpus": 0}, **options) as service:
        writer = service.writer(writer_id=0, batch_steps=5)
        ended: list[int] = []
        for t in range(30):
            ends = [1 if t % 7 == 6 else 0, 2 if t % 5 == 4 else 0]
            step = envs.step(ends, reset_steps=ended)
            mask = None if not ended else torch.tensor([e not in ended for e in range(2)])
            writer.add(*step, env_mask=mask)
            local.add(*step[:5], truncated=step[5], env_mask=mask)
            ended = [e for e, end in enumerate(ends) if end and e not in ended]
        envs.step([0, 0])
        with pytest.raises(StreamError, match="env 0's observation differs from the next_obs added"):
            writer.add(*envs.step([0, 0]), env_mask=torch.tensor([True, False]))   # a step skipped: refused here
        writer.flush()
        assert not writer.pending
        assert transitions(service.sample_all()) == transitions(local.sample_all())


def transitions(batch: Any) -> list[bytes]:
    """Each transition of a batch as bytes (every field but ``index`` and ``weight``), sorted."""
    names = ("obs", "action", "reward", "next_obs", "terminated", "truncated", "done", "discount")
    columns = [getattr(batch, name).reshape(len(batch), -1).contiguous().view(torch.uint8).numpy() for name in names]
    return sorted(b"".join(column[i].tobytes() for column in columns) for i in range(len(batch)))


@pytest.mark.parametrize("compact", [False, True])
def test_a_malformed_batch_the_rate_limiter_would_hold_is_refused_at_once(compact: bool) -> None:
    # A shard checked a writer's extend only once its limiter let the batch in: held, the batch waited out its
    # timeout and stayed pending in the writer, refused only by a later flush (a compact shard's frames: review).
    from rlbuf._ray_shard import ShardHost
    from rlbuf._ray_wire import to_wire

    limiter = RateLimiter(samples_per_insert=1.0, min_size_to_sample=4, error_buffer=4.0)
    shape = (4, *FRAME) if compact else (3,)
    options = {"obs_dtype": torch.uint8, "frame_stack": 4} if compact else {}
    host = ShardHost(rate_limiter=limiter.config(), capacity=64, obs_shape=shape, action_shape=(), seed=0, **options)

    def columns(obs: torch.Tensor, next_obs: torch.Tensor) -> list[tuple[Any, Any]]:
        lead = obs.shape[:2]
        td = TensorDict({"observation": obs, "action": torch.zeros(lead), ("next", "observation"): next_obs,
                         ("next", "reward"): torch.ones(lead), ("next", "terminated"): torch.zeros(lead, dtype=torch.bool),
                         ("next", "truncated"): torch.zeros(lead, dtype=torch.bool)}, list(lead))
        return [(key, to_wire(td[key])) for key in td.keys(include_nested=True, leaves_only=True)]

    full = torch.zeros(1, 8, *shape, dtype=torch.uint8 if compact else torch.float32)
    host.shard_extend(columns(full, full), [1, 8], None)            # diff 8, the band's top: inserts wait
    counters = host.shard_stats()["limiter"]
    good = full[:, :2]
    for bad in (good[..., :-1], good.float() + 0.5 if compact else good.to(torch.complex64)):   # shape, then dtype
        started = time.monotonic()
        with pytest.raises((ShapeError, DtypeError)):
            host.shard_extend(columns(bad, good), [1, 2], 5.0)      # was RateLimitTimeoutError after 5 s
        assert time.monotonic() - started < 4.0
    assert host.shard_stats()["limiter"] == counters and len(host.buffer) == 8
    with pytest.raises(RateLimitTimeoutError):                      # a well-formed batch is still held
        host.shard_extend(columns(good, good), [1, 2], 0.0)
