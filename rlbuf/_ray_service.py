"""Replay as a service on Ray: N shard actors behind one handle, a rate limiter per shard, exact checkpoints.

Each shard is a [`ReplayBuffer`][rlbuf.ReplayBuffer] in its own Ray actor
([`ShardHost`][rlbuf._ray_shard.ShardHost]). Writers ([`ServiceWriter`][rlbuf.ray.ServiceWriter])
send TorchRL-layout batches to one shard per call, round-robin or a fixed one; the learner
([`ReplayService`][rlbuf.ray.ReplayService]) splits each sample across the shards in proportion
to their sizes (to their priority mass with prioritized replay) with its own seeded generator,
and routes ``update_priority`` back by index. Arrays travel as numpy arrays through Ray's
object store.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any, TypeVar, cast

import numpy as np
import torch
from tensordict import TensorDictBase

from rlbuf._compact_wire import FrameDecoders
from rlbuf._convert import stored_positions
from rlbuf._keywords import keywords_checked
from rlbuf._priorities import priorities
from rlbuf._protocols import BufferProtocols
from rlbuf._rate_limit import RateLimiter
from rlbuf._ray_batches import batch_of, check_fields, check_reply, merged_fields
from rlbuf._ray_calls import get, start_ray, stop, wait_any
from rlbuf._ray_checkpoint import read_manifest, restore_shards, write_checkpoint
from rlbuf._ray_restart import Restarts, restart_path, retried
from rlbuf._ray_split import await_rows, may_sample, split_around_held
from rlbuf._ray_wire import to_wire
from rlbuf._ray_writer import ServiceWriter, check_batch_steps, timeout_of
from rlbuf._sumtree_arrays import check_exponent
from rlbuf.batches import ReplayBatch
from rlbuf.errors import (
    BatchSizeError,
    CheckpointError,
    ConfigError,
    EmptyBufferError,
    PriorityError,
    StoredIndexError,
)
from rlbuf.storage import DeviceLike, resolve_device

T = TypeVar("T")
_THREADS = 16  # calls a shard actor runs at once in each concurrency group: the writers', and the learner's


class ReplayService(BufferProtocols):
    """N [`ReplayBuffer`][rlbuf.ReplayBuffer] shards in Ray actors, a rate limiter each, one learner.

    Starts Ray (``ray.init(**ray_init_config)``) if it is not running, and shuts it down on
    [`close`][rlbuf.ray.ReplayService.close] if it started it. Give the service itself (or
    [`writer`][rlbuf.ray.ReplayService.writer]) to the Ray tasks and actors that write: they get a
    [`ServiceWriter`][rlbuf.ray.ServiceWriter]. The learner calls ``sample``,
    ``update_priority`` and ``save`` from one thread.

    Args:
        capacity: rows kept in all, ``capacity // num_shards`` per shard (a multiple of ``num_shards``).
        num_shards: buffer actors.
        obs_shape: shape of one observation.
        action_shape: shape of one action.
        rate_limiter: a [`RateLimiter`][rlbuf.ray.RateLimiter] whose settings each shard applies
            to its own rows and samples (as Reverb's sharded tables do); ``None``: no limit.
        timeout: seconds an insert or a sample may wait for a rate limiter before
            ``RateLimitTimeoutError`` (``None``: no limit).
        device: where sampled batches are delivered on this process.
        seed: seeds every shard's sampler and the learner's split of each batch.
        actor_options: Ray resources of each shard actor (``{"num_cpus": 1}`` by default).
        ray_init_config: arguments of ``ray.init`` when Ray is not running yet.
        restart_from: the directory ``save`` writes to: a shard actor that dies is started again
            by Ray under the same handle (``max_restarts``), from its part of the checkpoint there
            (empty if none was written yet), and the learner's next call that hears from it warns
            with a [`ShardRestartedWarning`][rlbuf.ray.ShardRestartedWarning] saying what was lost
            (also in [`shard_restarts`][rlbuf.ray.ReplayService.shard_restarts]). ``None``: a dead
            shard stays dead (``ShardDiedError``) until [`restore`][rlbuf.ray.ReplayService.restore].
        **options: the other [`ReplayBuffer`][rlbuf.ReplayBuffer] options (``prioritized``,
            ``storage``, ``extra_fields``, dtypes ...), applied in every shard.

    Raises:
        ConfigError: a bad ``capacity``, ``num_shards``, ``timeout`` or ``rate_limiter``,
            or [`ReplayBuffer`][rlbuf.ReplayBuffer] options it refuses (no actor is left running).

    Example:
        >>> limiter = RateLimiter(samples_per_insert=4.0, min_size_to_sample=1000,
        ...                       error_buffer=2000.0)                       # doctest: +SKIP
        >>> with ReplayService(100_000, num_shards=2, obs_shape=(4,), action_shape=(),
        ...                    rate_limiter=limiter, seed=0) as service:   # doctest: +SKIP
        ...     ray.get([collect.remote(service.writer(writer_id=w)) for w in range(2)])
        ...     batch = service.sample(256)        # a ReplayBatch; batch.index is global
        ...     service.save("/shared/replay")     # every shard, while writers write
    """

    def __init__(self, capacity: int | None = None, *, num_shards: int = 2, obs_shape: Any = None,
                 action_shape: Any = None, rate_limiter: RateLimiter | None = None, timeout: float | None = 60.0,
                 device: DeviceLike = "cpu", seed: int | None = None, actor_options: Mapping[str, Any] | None = None,
                 ray_init_config: Mapping[str, Any] | None = None, restart_from: str | Path | None = None,
                 **options: Any) -> None:
        self._timeout = timeout_of(timeout)
        self._restart_from = restart_path(restart_from)
        self._device = resolve_device(device, name="device")
        shard_capacity = _shard_capacity(capacity, num_shards)
        if rate_limiter is not None and not isinstance(rate_limiter, RateLimiter):
            raise ConfigError(f"rate_limiter: expected a RateLimiter or None, got {type(rate_limiter).__name__}")
        if rate_limiter is not None and rate_limiter.min_size_to_sample > shard_capacity:
            raise ConfigError(
                f"rate_limiter: min_size_to_sample={rate_limiter.min_size_to_sample} rows per shard can never be"
                f" reached with {shard_capacity} rows per shard; lower it or raise capacity")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ConfigError(f"seed: expected an int or None, got {seed!r}")
        seeds = np.random.SeedSequence(seed).spawn(num_shards + 1)
        self._rng = np.random.Generator(np.random.PCG64(seeds[-1]))
        limiter = None if rate_limiter is None else rate_limiter.config()
        specs = [{"capacity": shard_capacity, "obs_shape": obs_shape, "action_shape": action_shape,
                  "seed": None if seed is None else int(seeds[k].generate_state(1)[0]) >> 1,
                  "rate_limiter": limiter, "restart_from": self._restart_from, "shard_index": k, **options}
                 for k in range(num_shards)]
        self._start(specs, shard_capacity, limiter, None, actor_options, ray_init_config)

    def _start(self, specs: list[dict[str, Any]], shard_capacity: int, limiter: dict[str, Any] | None,
               manifest: dict[str, Any] | None, actor_options: Mapping[str, Any] | None,
               ray_init_config: Mapping[str, Any] | None) -> None:
        """Start one shard actor per ``specs`` entry (after every check that needs no actor)."""
        self._limiter_config = limiter
        self._shard_capacity = shard_capacity
        self._started_ray = start_ray(ray_init_config)
        import ray

        # Imported here: _ray_shard imports rlbuf.ray, which imports this module.
        from rlbuf._ray_shard import WRITERS, ShardHost

        restarts = {} if self._restart_from is None else {"max_restarts": -1}   # Ray starts a dead shard again
        # Writers held by a limiter take threads of their own group only: the learner's calls always find one.
        remote = ray.remote(concurrency_groups={WRITERS: _THREADS})(ShardHost).options(
            max_concurrency=_THREADS, **restarts, **dict(actor_options or {"num_cpus": 1}))
        self._remote = remote
        self._shards: list[Any] | None = [remote.remote(**spec) for spec in specs]
        try:
            infos = self._get([(k, shard.shard_info.remote()) for k, shard in enumerate(self._shards)])
            if any(info["capacity"] != shard_capacity for info in infos):
                raise CheckpointError(f"shard capacity: expected {shard_capacity} in every shard (service.json), got "
                                      f"{[info['capacity'] for info in infos]}")
        except BaseException:
            self.close()
            raise
        self._prioritized = bool(infos[0]["prioritized"])
        self._beta = float(infos[0]["beta"])
        self._keys = infos[0]["keys"]
        self._repr = infos[0]["repr"]
        self._layout = {"options": infos[0]["options"], "compact": bool(infos[0]["compact"]),
                        "restart": self._restart_from is not None}
        self._restarts = Restarts(infos)
        self._decoders = FrameDecoders(infos[0].get("frames"))  # payloads of other frames are refused
        self._wait_round = 0  # the learner's rounds of waits for a held shard (shard_stop_waiting ends one)
        self._frames_on_learner = True  # False: compact shards build the stacks (what benchmarks compare with)
        # Each shard's size, priority mass and limiter counters as of the learner's last call to it:
        # the next split uses them (sizes only grow meanwhile), saving a round trip per sample.
        self._stats: list[dict[str, Any]] | None = None if manifest is None else manifest["shard_stats"]
        self._writer = ServiceWriter(self._shards, self._keys, timeout=self._timeout, layout=self._layout,
                                     start=0 if manifest is None else manifest["writer_next"])

    @classmethod
    def load(cls, path: str | Path, *, device: DeviceLike = "cpu", timeout: float | None = 60.0,
             actor_options: Mapping[str, Any] | None = None, ray_init_config: Mapping[str, Any] | None = None,
             restart_from: str | Path | None = None) -> ReplayService:
        """A new service of the same shape rebuilt from the checkpoint ``save`` wrote at ``path``.

        Every shard's rows, sampler and RNG, its limiter's counters and the learner's split
        generator are restored: the next samples equal those the saved service would have drawn.
        ``device``, ``timeout``, ``actor_options``, ``ray_init_config`` and ``restart_from`` are
        the constructor's.

        Raises:
            CheckpointError: ``path`` is not a service checkpoint, or a shard's checkpoint fails
                its checks.
        """
        service = cls.__new__(cls)
        service._timeout = timeout_of(timeout)
        service._device = resolve_device(device, name="device")
        service._restart_from = restart_path(restart_from)
        path = Path(path).absolute()
        manifest = read_manifest(path)
        service._rng = np.random.Generator(np.random.PCG64())
        service._rng.bit_generator.state = manifest["rng"]
        limiter = manifest["rate_limiter"]
        specs = [{"checkpoint": str(path / f"shard_{k}"), "rate_limiter": limiter,
                  "limiter_counters": manifest["limiter_counters"][k], "restart_from": service._restart_from,
                  "shard_index": k} for k in range(manifest["num_shards"])]
        service._start(specs, manifest["shard_capacity"], limiter, manifest, actor_options, ray_init_config)
        return service

    # -- shape ------------------------------------------------------------------------------
    @property
    def num_shards(self) -> int:
        """Shard actors."""
        return len(self._live())

    @property
    def shard_capacity(self) -> int:
        """Rows each shard keeps."""
        return self._shard_capacity

    @property
    def capacity(self) -> int:
        """Rows kept in all."""
        return self._shard_capacity * self.num_shards

    @property
    def prioritized(self) -> bool:
        """Whether sampling follows priorities."""
        return self._prioritized

    @property
    def beta(self) -> float:
        """Every shard's importance-sampling exponent; set it between samples to anneal it towards 1.

        Raises:
            PriorityError: the service is not prioritized.
            ConfigError: a value that is not a finite number >= 0 (checked before any shard changes).
        """
        if not self._prioritized:
            raise PriorityError("beta: this service is not prioritized (build it with prioritized=True)")
        return self._beta

    @beta.setter
    def beta(self, value: float) -> None:
        if not self._prioritized:
            raise PriorityError("beta: this service is not prioritized (build it with prioritized=True)")
        check_exponent("beta", value)
        shards = self._live()
        self._retried(lambda: self._get([(k, shard.shard_set_beta.remote(float(value))) for k, shard in enumerate(shards)]),
                      reads=False)
        self._beta = float(value)

    @property
    def device(self) -> torch.device:
        """Where sampled batches are delivered."""
        return self._device

    @property
    def actors(self) -> list[Any]:
        """The shard actors' Ray handles, shard 0 first (for placement and monitoring)."""
        return list(self._live())

    def sizes(self) -> list[int]:
        """Rows each shard holds now (one round trip to each)."""
        return [int(stat["size"]) for stat in self._all_stats()]

    def __len__(self) -> int:
        return sum(self.sizes())

    def rate_limiters(self) -> list[dict[str, Any]] | None:
        """Each shard's limiter settings and counters, or ``None`` without a limiter."""
        if self._limiter_config is None:
            return None
        return self._retried(lambda: self._get([(k, shard.shard_limiter.remote()) for k, shard in enumerate(self._live())]),
                             reads=True)

    # -- writing ----------------------------------------------------------------------------
    def writer(self, shard: int | None = None, *, writer_id: int | None = None, batch_steps: int = 64) -> ServiceWriter:
        """A picklable writer: to ``shard`` always, else round-robin starting at ``writer_id % num_shards``.

        With a compact layout (``frame_stack``, ``n_step`` or ``compact=True``) each env's steps
        must reach one shard in order: ``writer_id=w`` then means shard ``w``, one writer a shard.

        Args:
            shard: the shard this writer always sends to.
            writer_id: the writer's number: where its round-robin starts (its shard, compact).
            batch_steps: env steps [`ServiceWriter.add`][rlbuf.ray.ServiceWriter.add] gathers per batch.

        Raises:
            ConfigError: ``shard`` is not a shard number, both ``shard`` and ``writer_id`` given,
                ``batch_steps`` below 1 or gathering more rows than the rate limiter's band takes; with a
                compact layout, neither given or ``writer_id >= num_shards``.
        """
        shards = self._live()
        check_batch_steps(batch_steps)
        if self._limiter_config is not None:  # a batch wider than the band would be refused once gathered: say so now
            rows = batch_steps * int((self._layout["options"] or {}).get("num_envs", 1))
            try:
                RateLimiter.from_config(self._limiter_config).check_insert(rows)
            except BatchSizeError as error:
                raise ConfigError(f"batch_steps={batch_steps}: its batches of {rows} rows could never be stored "
                                  f"({error}); give a smaller batch_steps") from None
        if shard is not None and writer_id is not None:
            raise ConfigError("writer: expected shard= or writer_id=, got both; use one")
        if shard is not None and (isinstance(shard, bool) or not isinstance(shard, int) or not 0 <= shard < len(shards)):
            raise ConfigError(f"shard: expected an int in [0, {len(shards)}), got {shard!r}")
        if writer_id is not None and (isinstance(writer_id, bool) or not isinstance(writer_id, int) or writer_id < 0):
            raise ConfigError(f"writer_id: expected an int >= 0, got {writer_id!r}")
        if self._layout["compact"]:
            if shard is None and writer_id is None:
                raise ConfigError("writer: the shards store next_obs once (frame_stack, n_step or compact), so each "
                                  "env's steps must all go to one shard; give writer_id=w (shard w) or shard=k")
            if writer_id is not None and writer_id >= len(shards):
                raise ConfigError(f"writer_id: expected an int in [0, {len(shards)}) with compact shards (one writer a "
                                  f"shard keeps each env's stream whole), got {writer_id}; build the service with "
                                  f"num_shards >= the number of writers")
            shard = writer_id if shard is None else shard
        return ServiceWriter(shards, self._keys, shard=shard, start=writer_id or 0, timeout=self._timeout,
                             layout=self._layout, batch_steps=batch_steps)

    def extend(self, td: TensorDictBase, *, timeout: float | str | None = "default") -> int:
        """Store a batch from the learner's process (round-robin); see [`ServiceWriter.extend`][rlbuf.ray.ServiceWriter.extend]."""
        self._live()
        return self._writer.extend(td, timeout=timeout)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
        return ServiceWriter(self._live(), self._keys, timeout=self._timeout, layout=self._layout).__reduce__()

    # -- sampling ---------------------------------------------------------------------------
    @keywords_checked
    def sample(self, batch_size: int, *, timeout: float | str | None = "default") -> ReplayBatch:
        """Draw ``batch_size`` rows across the shards, delivered on [`device`][rlbuf.ray.ReplayService.device].

        The split is multinomial over the shards' sizes (priority masses when prioritized),
        drawn by the service's seeded generator; each shard then samples its share. A shard
        whose rate limiter holds its share is left out and the split drawn again over the
        others; only when every shard holds does the sample wait, until any one of them lets its
        share be drawn, and then the split is drawn again. With priorities, importance
        weights are normalised over all shards (the largest possible weight is 1).
        ``batch.index`` is global: ``shard * shard_capacity + position``.

        Args:
            batch_size: rows to draw.
            timeout: seconds the rate limiters may hold the sample (the service's by default;
                ``None``: no limit).

        Raises:
            BatchSizeError: ``batch_size`` is not a positive int (or wider than a limiter's band).
            EmptyBufferError: every shard is empty.
            RateLimitTimeoutError: every shard's limiter held the sample for ``timeout``
                seconds; no shard sampled (no counter moved).
            ShardDiedError: a shard's actor is gone.
            ReplyError: a shard's reply no rlbuf shard sends (corrupted or forged; the split generator restored).
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise BatchSizeError(f"batch_size: expected a positive int, got {batch_size!r}")
        if self._limiter_config is not None:  # the whole batch, before any split: a shard may be drawn for all of it
            RateLimiter.from_config(self._limiter_config).check_sample(batch_size)
        wait = self._timeout if timeout == "default" else timeout_of(timeout)
        state = self._rng.bit_generator.state
        try:
            return self._sample(batch_size, wait)
        except BaseException:  # a refused sample (a dead shard, the limiter's timeout) leaves the split generator
            self._rng.bit_generator.state = state
            raise

    def _sample(self, batch_size: int, wait: float | None) -> ReplayBatch:
        shards = self._live()
        deadline = None if wait is None else time.monotonic() + wait
        stats = self._stats
        if stats is None or not all(stat["size"] for stat in stats):  # an empty shard is asked again each time
            stats = self._stats = self._all_stats(wait)
        if self._limiter_config is not None and not any(stat["size"] for stat in stats):
            stats = self._stats = await_rows(self._all_stats, batch_size, wait)   # a limited sample waits for rows
        mass = np.array([stat["mass"] for stat in stats], dtype=np.float64)
        if not mass.sum() > 0:
            raise EmptyBufferError(f"sample: every shard is empty (sizes {[stat['size'] for stat in stats]})")
        counts = self._rng.multinomial(batch_size, mass / mass.sum())
        drawn = [(k, int(count)) for k, count in enumerate(counts) if count > 0]
        may = partial(may_sample, self._limiter_config)
        if not all(may(stats[k], count) for k, count in drawn):
            drawn = split_around_held(self._rng, batch_size, mass, stats, drawn, may=may,
                                      stats_of=partial(self._stats_of, timeout=wait),
                                      wait=partial(self._wait_any, deadline=deadline))
        # A compact shard sends each distinct frame once, compressed as stored; the stacks are rebuilt here.
        known = self._decoders.known if self._frames_on_learner else None
        sent = {k: shards[k].shard_sample.remote(count, wait, known) for k, count in drawn}

        def reply(k: int, count: int) -> dict[str, Any]:
            # A shard whose actor died before answering is asked again once restarted (its draw died with it);
            # the others' draws are kept: no shard draws twice for one batch.
            ref = sent.pop(k, None) or shards[k].shard_sample.remote(count, wait, known)
            answer: dict[str, Any] = self._get([(k, ref)], wait)[0]
            return answer

        replies = [self._retried(partial(reply, k, count), reads=False, timeout=wait) for k, count in drawn]
        for (k, count), reply_k in zip(drawn, replies, strict=True):
            check_reply(reply_k, count)
            stats[k] = self._heard([reply_k["stats"]], k)[0]
        return self._merge(drawn, replies, stats)

    def _wait_any(self, held: list[tuple[int, int]], deadline: float | None) -> None:
        """Return once a shard of ``held`` lets its share be sampled (draws nothing), by ``deadline`` (monotonic)."""
        self._wait_round += 1
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        self._retried(lambda: wait_any(self._live(), held, self._wait_round, left,
                                       restarting=self._restart_from is not None), reads=True, timeout=left)

    def _merge(self, drawn: list[tuple[int, int]], replies: list[dict[str, Any]],
               stats: list[dict[str, Any]] | None) -> ReplayBatch:
        """One batch from the shards' replies: global indices, and with ``stats`` weights over all shards."""
        weights = None
        if self._prioritized and stats is not None:
            smallest = [reply["stats"]["smallest"] for reply in replies]
            smallest += [stat["smallest"] for stat in stats if stat["size"]]
            weights = (min(smallest), self._beta)
        return batch_of(merged_fields(drawn, replies, shard_capacity=self._shard_capacity, weights=weights,
                                      decoders=self._decoders), self._device)

    def sample_all(self) -> ReplayBatch:
        """Every stored row, shard 0 first, oldest first in each; ``index`` is global."""
        shards = self._live()
        drawn = [(k, 1) for k, size in enumerate(self.sizes()) if size]   # an empty shard refuses sample_all
        if not drawn:
            raise EmptyBufferError("sample_all: every shard is empty")
        replies = self._retried(lambda: self._get([(k, shards[k].rlbuf_sample_all.remote()) for k, _ in drawn]),
                                reads=True)
        for reply in replies:
            check_fields(reply, None)
        parts = [{"fields": reply, "stats": {"smallest": 1.0}} for reply in replies]
        return self._merge(drawn, parts, None)

    def update_priority(self, index: Any, priority: Any) -> None:
        """Set priorities of the rows at global ``index`` (e.g. ``batch.index``), each in its shard.

        Checked whole before any shard changes.

        Raises:
            PriorityError: the service is not prioritized, lengths differ, or a bad priority.
            StoredIndexError: an index outside what the shards hold.
        """
        if not self._prioritized:
            raise PriorityError("update_priority: this service is not prioritized (build it with prioritized=True)")
        shards = self._live()
        positions = stored_positions(index, self.capacity, torch.device("cpu")).reshape(-1)  # global: [0, capacity)
        values = priorities(priority, positions.numel())
        shard_of, local = positions // self._shard_capacity, positions % self._shard_capacity
        if self._stats is None or self._restart_from is not None:  # a shard Ray restarted may hold fewer rows now
            self._stats = self._all_stats()
        known = [int(stat["size"]) for stat in self._stats]
        outside = local >= torch.tensor(known)[shard_of]
        if positions.numel() and bool(outside.any()):  # sizes as of the last sample: writers may have added rows
            self._stats = self._all_stats()
            known = [int(stat["size"]) for stat in self._stats]
            outside = local >= torch.tensor(known)[shard_of]
        if positions.numel() and bool(outside.any()):
            raise StoredIndexError(f"index: {int(positions[outside][0])} is not stored (shard sizes {known}); "
                                   "pass batch.index")
        updated = [k for k in range(len(shards)) if bool((shard_of == k).any())]
        replies = self._get([(k, shards[k].shard_update_priority.remote(to_wire(local[shard_of == k]),
                                                                   to_wire(values[shard_of == k]))) for k in updated])
        for k, reply in zip(updated, replies, strict=True):
            self._stats[k] = self._heard([reply], k)[0]

    # -- checkpoints ------------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        """Write every shard's checkpoint and the service's state to the directory ``path``.

        Writers keep writing: each shard copies its rows at one write count and writes them
        outside its lock. Call it from the learner's thread, between samples. The directory is
        written beside ``path`` and renamed into place, so an interrupted save leaves the previous
        one whole. ``path`` is where the shard actors write (shared storage on a multi-node cluster).

        Raises:
            CheckpointError: ``path`` holds something that is not a service checkpoint, or a shard's save failed.
            ShardDiedError: a shard's actor is gone.
        """
        shards = self._live()
        self._retried(lambda: write_checkpoint(Path(path).absolute(), lambda staging: self._get(
            [(k, shard.shard_save.remote(str(staging / f"shard_{k}"))) for k, shard in enumerate(shards)]),
            {"num_shards": len(shards), "shard_capacity": self._shard_capacity, "rate_limiter": self._limiter_config,
             "rng": self._rng.bit_generator.state, "writer_next": self._writer._next, "shard_stats": self._stats}),
            reads=False)

    def restore(self, path: str | Path) -> None:
        """Put the service back to the checkpoint ``save`` wrote at ``path``, in place.

        Every shard reads and verifies its part first; only then do all of them switch, with
        the learner's split generator and cursor: the next samples are those the saved
        service would have drawn. A shard whose actor died is started again from its part
        (writers built before then keep the dead handle: give them ``service.writer()``).
        Rows the service's own [`extend`][rlbuf.ray.ReplayService.extend] left pending (a batch the
        limiter held, or a dead shard refused) are kept: its next ``extend`` sends them first.

        Raises:
            CheckpointError: ``path`` is not a checkpoint of a service of this shape (shards,
                shard capacity, rate limiter), or a part fails its checks; nothing changed.
        """
        path = Path(path).absolute()
        manifest = read_manifest(path)
        shards = self._live()
        shape = (manifest["num_shards"], manifest["shard_capacity"], manifest["rate_limiter"])
        if shape != (len(shards), self._shard_capacity, self._limiter_config):
            raise CheckpointError(f"{path}: expected a service of (num_shards, shard_capacity, rate_limiter) "
                                  f"{(len(shards), self._shard_capacity, self._limiter_config)}, got {shape}")
        restore_shards(path, shards, lambda k: self._remote.remote(
            checkpoint=str(path / f"shard_{k}"), rate_limiter=self._limiter_config,
            limiter_counters=manifest["limiter_counters"][k], restart_from=self._restart_from, shard_index=k),
            manifest["limiter_counters"], self._get)
        infos = self._get([(k, shard.shard_info.remote()) for k, shard in enumerate(shards)])
        self._beta = float(infos[0]["beta"])
        events, self._restarts = self._restarts.events, Restarts(infos)
        self._restarts.events = events
        self._rng.bit_generator.state = manifest["rng"]
        self._stats = manifest["shard_stats"]
        self._writer._restored(shards, manifest["writer_next"])  # what an extend left pending is sent next

    # -- restarts ---------------------------------------------------------------------------
    def _get(self, calls: list[tuple[int, Any]], wait: float | None = None) -> list[Any]:
        """The calls' results (see [`get`][rlbuf._ray_calls.get]); ``wait``: how long they may wait for a limiter."""
        return get(calls, restarting=self._restart_from is not None, wait=wait)

    def _retried(self, call: Callable[[], T], *, reads: bool, timeout: float | str | None = "default") -> T:
        """``call()``, made again where a shard it reached was being restarted by Ray and that is exact (see
        [`retried`][rlbuf._ray_restart.retried]), within ``timeout`` (the service's by default)."""
        if self._restart_from is None:
            return call()
        wait = self._timeout if timeout == "default" else timeout
        return retried(call, self._live(), self._restarted, timeout=cast(float | None, wait), reads=reads)

    def _restarted(self, k: int, stat: dict[str, Any]) -> None:
        """Shard ``k`` answered after Ray restarted it: reported, and every shard asked again at the next sample."""
        self._heard([stat], k)
        self._stats = None

    def _stats_of(self, ks: Sequence[int], timeout: float | str | None = "default") -> list[dict[str, Any]]:
        """Shards ``ks``' stats now, noted (``_heard``)."""
        shards = self._live()
        wait = self._timeout if timeout == "default" else cast(float | None, timeout)
        stats = self._retried(lambda: self._get([(k, shards[k].shard_stats.remote()) for k in ks], wait), reads=True,
                              timeout=wait)
        return [self._heard([stat], k)[0] for k, stat in zip(ks, stats, strict=True)]

    def _all_stats(self, timeout: float | str | None = "default") -> list[dict[str, Any]]:
        """Every shard's stats now (one round trip to each, in parallel)."""
        shards = self._live()
        wait = self._timeout if timeout == "default" else cast(float | None, timeout)
        return self._heard(self._retried(lambda: self._get([(k, shard.shard_stats.remote())
                                                            for k, shard in enumerate(shards)], wait), reads=True,
                                         timeout=wait))

    def _heard(self, stats: list[dict[str, Any]], first: int = 0) -> list[dict[str, Any]]:
        """``stats`` of shards ``first``, ``first + 1`` ..., noted: a shard Ray restarted is reported."""
        shards = self._live()
        for k, stat in enumerate(stats, start=first):
            self._restarts.heard(k, stat, partial(_info, k, shards[k]))
        return stats

    @property
    def shard_restarts(self) -> list[dict[str, Any]]:
        """Every restart of a dead shard seen so far (``restart_from``): ``shard``, ``restored_from`` (the
        checkpoint part, ``None``: restarted empty), its ``write_count`` and ``lost_at_least`` rows."""
        return [dict(event) for event in self._restarts.events]

    # -- lifetime ---------------------------------------------------------------------------
    def _live(self) -> list[Any]:
        if self._shards is None:
            raise RuntimeError("ReplayService: closed; its actors are stopped")
        return self._shards

    @property
    def closed(self) -> bool:
        """Whether [`close`][rlbuf.ray.ReplayService.close] has stopped the shards."""
        return self._shards is None

    def close(self) -> None:
        """Stop every shard actor (their rows are gone; save first), and Ray if the service started it."""
        import ray

        shards, self._shards = self._shards, None
        for shard in shards or []:
            stop(shard)
        if self._started_ray and ray.is_initialized():
            ray.shutdown()

    def __enter__(self) -> ReplayService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        if self._shards is None:
            return "ReplayService(closed)"
        shard = self._repr.removeprefix("ReplayBuffer(")[:-1]
        return f"ReplayService(num_shards={len(self._shards)}, shard={{{shard}}}, delivered_to={self._device})"


def _shard_capacity(capacity: Any, num_shards: Any) -> int:
    if isinstance(num_shards, bool) or not isinstance(num_shards, int) or num_shards < 1:
        raise ConfigError(f"num_shards: expected an int >= 1, got {num_shards!r}")
    if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < num_shards:
        raise ConfigError(f"capacity: expected an int >= num_shards={num_shards}, got {capacity!r}")
    if capacity % num_shards:
        low = capacity - capacity % num_shards
        raise ConfigError(f"capacity: expected a multiple of num_shards={num_shards}, got {capacity}; use {low} or "
                          f"{low + num_shards}")
    return capacity // num_shards


def _info(k: int, shard: Any) -> dict[str, Any]:
    info: dict[str, Any] = get([(k, shard.shard_info.remote())])[0]
    return info
