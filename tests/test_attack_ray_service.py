"""The Ray replay service under attack: writers held by a limiter never starve the learner, a refused
batch never jams its writer, a refused or forged checkpoint changes nothing and is refused whole, and
a held sample or writer follows what the shards hold now, not what they held when it started waiting."""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from _ray_cluster import local_ray
from tensordict import TensorDict

ray = pytest.importorskip("ray")

from rlbuf import (  # noqa: E402
    CheckpointError,
    ConfigError,
    RateLimitTimeoutError,
    ShapeError,
    ShardDiedError,
    StoredIndexError,
)
from rlbuf._ray_checkpoint import part_digest  # noqa: E402
from rlbuf.ray import RateLimiter, ReplayService, ShardRestartedWarning  # noqa: E402

OPTIONS: dict[str, Any] = {"obs_shape": (4,), "action_shape": (), "action_dtype": torch.int64, "seed": 0,
                           "actor_options": {"num_cpus": 0}}


@pytest.fixture(scope="module", autouse=True)
def ray_cluster() -> Iterator[None]:
    """One local Ray instance for the module, on loopback, shut down at the end."""
    yield from local_ray(sys.modules[__name__])


def rows(ids: Any, obs_dim: int = 4) -> TensorDict:
    """TorchRL-layout rows whose every field carries the row's id."""
    uid = torch.as_tensor(ids)
    n = len(uid)
    obs = uid[:, None].float().expand(n, obs_dim)
    return TensorDict({"observation": obs.clone(), "action": uid.clone(), ("next", "observation"): obs + 0.5,
                       ("next", "reward"): uid.float(), ("next", "terminated"): torch.zeros(n, dtype=torch.bool),
                       ("next", "truncated"): torch.zeros(n, dtype=torch.bool)}, [n])


def columns(td: TensorDict) -> list[tuple[Any, Any]]:
    """A batch as a writer sends it to a shard: its fields as numpy arrays."""
    return [(key, value.numpy()) for key, value in td.items(include_nested=True, leaves_only=True)]


def test_writers_held_by_a_shard_limiter_leave_the_learner_a_thread() -> None:
    # 18 writers held by shard 0's limiter took all 16 threads of its actor: the learner's sample, which would
    # let them in, never ran, and the learner hung past its timeout (helper 54, h9).
    limiter = RateLimiter(samples_per_insert=1.0, min_size_to_sample=1, error_buffer=(0.0, 2.0))
    with ReplayService(2 * 64, num_shards=2, rate_limiter=limiter, timeout=None, **OPTIONS) as service:
        shard = service.actors[0]
        held = [shard.shard_extend.remote(columns(rows([i])), [1], None) for i in range(20)]  # 2 fit the band
        drawn = [service.sample(1, timeout=60.0).action.item() for _ in range(18)]           # each lets one in
        ray.get(held)
        assert service.sizes() == [20, 0] and set(drawn) <= set(range(20))


def test_a_batch_a_shard_refuses_with_a_config_error_is_dropped_and_the_writer_goes_on() -> None:
    # The shard refused a done that is neither terminated nor truncated with ConfigError, which the writer did not
    # count as a refusal of the batch: it kept it and sent it again before every later batch, refused each time.
    with ReplayService(64, num_shards=2, **OPTIONS) as service:
        writer = service.writer(shard=0)
        bad = rows(range(4))
        bad["next", "done"] = torch.tensor([True, False, False, False])
        with pytest.raises(ConfigError, match="done"):
            writer.extend(bad)
        assert writer.pending == 0
        for first in (10, 14):
            writer.extend(rows(range(first, first + 4)))
        assert service.sizes() == [8, 0] and sorted(service.sample_all().action.tolist()) == list(range(10, 18))


def copied(source: Path, target: Path, *, shard_1: Path | None = None, rebind: bool = False,
           version: int | None = None) -> Path:
    """A copy of the service checkpoint ``source``: its shard_1 replaced by the part ``shard_1`` (``rebind``: and
    ``service.json`` made to bind it, as a hand-made checkpoint may), or written as ``version`` 1 wrote it."""
    shutil.copytree(source, target)
    if shard_1 is not None:
        shutil.rmtree(target / "shard_1")
        shutil.copytree(shard_1, target / "shard_1")
    manifest = json.loads((target / "service.json").read_text())
    if rebind:
        manifest["parts"][1]["manifest_sha256"] = part_digest(target / "shard_1")
    if version == 1:
        del manifest["parts"]
        manifest["version"] = 1
    (target / "service.json").write_text(json.dumps(manifest))
    return target


def test_a_restore_refused_by_one_shards_buffer_changes_no_shard(tmp_path: Path) -> None:
    # shard_stage only read and checksummed each part; the buffer's own checks (options, fields) ran in shard_commit,
    # in parallel: shard 1 refused a part of another obs_shape after shard 0 had rolled back (helper 54, h10).
    with ReplayService(16, num_shards=2, **{**OPTIONS, "obs_shape": (3,)}) as other:
        other.extend(rows(range(100, 104), 3))
        other.extend(rows(range(104, 108), 3))
        other.save(tmp_path / "other")
    with ReplayService(16, num_shards=2, **OPTIONS) as service:
        service.extend(rows(range(4)))
        service.extend(rows(range(4, 8)))
        service.save(tmp_path / "saved")
        mixed = copied(tmp_path / "saved", tmp_path / "mixed", shard_1=tmp_path / "other" / "shard_1", rebind=True)
        service.extend(rows(range(8, 12)))
        with pytest.raises(CheckpointError, match="obs_shape"):
            service.restore(mixed)
        assert sorted(service.sample_all().action.tolist()) == list(range(12)) and service.sizes() == [8, 4]


def test_a_checkpoint_whose_shard_part_is_another_shards_or_saves_is_refused(tmp_path: Path) -> None:
    # shard_1/ replaced by a copy of shard_0/ loaded: every row of shard 0 stored twice (helper 54, h10).
    with ReplayService(16, num_shards=2, **OPTIONS) as service:
        for first in (0, 4):
            service.extend(rows(range(first, first + 4)))
        service.save(tmp_path / "saved")
        for first in (8, 12):
            service.extend(rows(range(first, first + 4)))
        service.save(tmp_path / "later")
        for k, part in enumerate((tmp_path / "saved" / "shard_0", tmp_path / "later" / "shard_1")):
            with pytest.raises(CheckpointError, match=r"shard_1: expected the part service\.json binds"):
                service.restore(copied(tmp_path / "saved", tmp_path / f"forged-{k}", shard_1=part))
        assert sorted(service.sample_all().action.tolist()) == list(range(16))
        old = copied(tmp_path / "saved", tmp_path / "old", version=1)
        duplicated = copied(tmp_path / "saved", tmp_path / "old-duplicated", shard_1=tmp_path / "saved" / "shard_0",
                            version=1)
        with pytest.raises(CheckpointError, match="shard_1 is the same part as shard_0"):
            service.restore(duplicated)
        service.restore(old)                                           # a version 1 checkpoint still loads
        assert sorted(service.sample_all().action.tolist()) == list(range(8))


def test_update_priority_of_rows_written_since_the_last_sample_is_accepted() -> None:
    # The range check used the shard sizes cached at the last sample: rows written since were "not stored" (h12).
    with ReplayService(32, num_shards=2, prioritized=True, **OPTIONS) as service:
        for first in (0, 4):
            service.extend(rows(range(first, first + 4)))
        service.sample(2)
        for first in (8, 12):
            service.extend(rows(range(first, first + 4)))
        stored = service.sample_all()
        service.update_priority(stored.index, torch.arange(1.0, 17.0))
        assert service.sample_all().action.tolist() == stored.action.tolist()
        with pytest.raises(StoredIndexError, match=r"index: 8 is not stored \(shard sizes \[8, 8\]\)"):
            service.update_priority(torch.tensor([8]), torch.ones(1))


def test_a_held_sample_is_drawn_once_any_shard_lets_its_share_be_drawn(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every shard held: the learner waited until all the first split's shards let their share be drawn, so a shard
    # whose writer had stopped for good held the sample even after another shard's writer made room (h1).
    limiter = RateLimiter(samples_per_insert=1.0, min_size_to_sample=8, error_buffer=(0.0, 10_000.0))
    with ReplayService(2 * 256, num_shards=2, rate_limiter=limiter, timeout=5.0, **OPTIONS) as service:
        writers = [service.writer(shard=k) for k in range(2)]
        for k, writer in enumerate(writers):
            writer.extend(rows(range(100 * k, 100 * k + 16)))
        with pytest.raises(RateLimitTimeoutError):
            for _ in range(33):                                       # 32 rows may be drawn in all
                service.sample(1, timeout=0.0)
        held = service._wait_any

        def writer_1_goes_on(*args: Any, **kwargs: Any) -> None:     # once the learner waits, not before
            writers[1].extend(rows(range(200, 208)))
            held(*args, **kwargs)
        monkeypatch.setattr(service, "_wait_any", writer_1_goes_on)
        batch = service.sample(4, timeout=60.0)
        assert bool((batch.index >= service.shard_capacity).all())
        assert [c["counters"] for c in service.rate_limiters() or []] == [
            {"inserts": 16, "samples": 16, "deletes": 0}, {"inserts": 24, "samples": 20, "deletes": 0}]


class _WatchedCondition(threading.Condition):
    """A condition that says when a thread first waits on it."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        self.waiting.set()
        return super().wait(timeout)


def test_a_writer_held_during_a_restore_is_let_in_by_the_restored_limiter(tmp_path: Path) -> None:
    # A held insert kept asking the limiter object it started with; the restore replaced it, so the writer waited out
    # its timeout though the restored limiter had room (h16).
    from rlbuf._ray_shard import ShardHost

    limiter = RateLimiter(samples_per_insert=1.0, min_size_to_sample=1, error_buffer=(0.0, 8.0))
    host = ShardHost(rate_limiter=limiter.config(), capacity=64, obs_shape=(4,), action_shape=(),
                     action_dtype=torch.int64, seed=0)
    host.shard_extend(columns(rows(range(4))), [4], None)
    saved = host.shard_save(str(tmp_path / "shard"))
    host.shard_extend(columns(rows(range(4, 8))), [4], None)          # diff 8, the band's top: inserts wait
    host._condition = condition = _WatchedCondition()
    failed: list[BaseException] = []

    def held_writer() -> None:
        try:
            host.shard_extend(columns(rows(range(8, 12))), [4], 30.0)
        except BaseException as error:
            failed.append(error)
    writer = threading.Thread(target=held_writer)
    writer.start()
    condition.waiting.wait()
    host.shard_stage(str(tmp_path / "shard"), saved["limiter"])       # 4 rows, diff 4: room for 4
    host.shard_commit()
    writer.join()
    assert not failed and host.shard_stats()["limiter"] == {"inserts": 8, "samples": 0, "deletes": 0}
    assert sorted(host.buffer.sample_all().action.tolist()) == [0, 1, 2, 3, 8, 9, 10, 11]


def test_truncate_episodes_of_a_whole_transition_writer_sends_its_steps_as_added() -> None:
    # The writer checked env_mask by truncating its staging buffer: the gathered steps went out marked truncated,
    # where the docstring says shards of whole transitions only get those steps sent (h14).
    with ReplayService(32, num_shards=2, num_envs=2, **OPTIONS) as service:
        writer = service.writer(shard=0, batch_steps=8)
        for t in range(3):
            writer.add(torch.zeros(2, 4) + t, torch.zeros(2, dtype=torch.int64), torch.ones(2),
                       torch.zeros(2, 4) + t + 1, torch.zeros(2, dtype=torch.bool), torch.zeros(2, dtype=torch.bool))
        with pytest.raises(ShapeError, match="env_mask: expected 2 bools"):
            writer.truncate_episodes(torch.ones(3, dtype=torch.bool))
        assert writer.pending == 6 and service.sizes() == [0, 0]
        writer.truncate_episodes()
        stored = service.sample_all()
        assert writer.pending == 0 and len(stored) == 6 and not bool(stored.truncated.any())


def test_rows_the_services_own_extend_left_pending_survive_a_restore(tmp_path: Path) -> None:
    # restore replaced the service's internal writer, and the batch the limiter had held in it vanished (h2 H3).
    limiter = RateLimiter(samples_per_insert=1.0, min_size_to_sample=2, error_buffer=(0.0, 8.0))
    with ReplayService(64, num_shards=2, rate_limiter=limiter, **OPTIONS) as service:
        for first in (0, 4):
            service.extend(rows(range(first, first + 4)))
        service.save(tmp_path / "saved")
        for first in (8, 12):
            service.extend(rows(range(first, first + 4)))             # diff 8 in each shard, the band's top
        with pytest.raises(RateLimitTimeoutError):
            service.extend(rows(range(16, 20)), timeout=0.0)          # held, kept in the writer
        service.restore(tmp_path / "saved")
        service.extend(rows(range(20, 24)))                           # the held batch first, then this one
        assert sorted(service.sample_all().action.tolist()) == [*range(8), *range(16, 24)]


def test_a_loaded_services_shard_restarted_before_any_save_reports_the_part_it_was_rebuilt_from(
        tmp_path: Path) -> None:
    # No checkpoint at restart_from yet: Ray rebuilt the shard from the part the service was loaded from, and the
    # warning said "restarted empty", counting every row the learner knew of as lost (h18).
    with ReplayService(64, num_shards=2, **OPTIONS) as service:
        for first in (0, 8):
            service.extend(rows(range(first, first + 8)))
        service.save(tmp_path / "saved")
    with ReplayService.load(tmp_path / "saved", restart_from=tmp_path / "restarts",
                            actor_options={"num_cpus": 0}) as loaded:
        loaded.extend(rows(range(16, 20)))                            # shard 0: 4 rows after the checkpoint
        assert loaded.sizes() == [12, 8]
        ray.kill(loaded.actors[0], no_restart=False)                  # its process dies; Ray starts it again
        with pytest.warns(ShardRestartedWarning, match=r"shard 0: .*restarted from .*saved/shard_0 \(write count 8\)"
                                                       r".* gone: 4 the learner knew of"):
            sizes = until_restarted(loaded)
        assert sizes == [8, 8] and loaded.shard_restarts == [
            {"shard": 0, "restored_from": str(tmp_path / "saved" / "shard_0"), "write_count": 8, "lost_at_least": 4}]


def until_restarted(service: ReplayService) -> list[int]:
    """``service.sizes()`` once the restarted shard answers (``ray.kill`` returns before the actor is dead: a call
    may still reach the old actor, or the shard while Ray restarts it). Ray's restart is bounded."""
    deadline = time.monotonic() + 60
    while True:
        with contextlib.suppress(ShardDiedError):
            sizes = service.sizes()
            if service.shard_restarts:
                return sizes
        if time.monotonic() > deadline:
            raise AssertionError("the killed shard was not restarted within 60 s")
        time.sleep(0.01)
