"""One shard of a [`ReplayService`][rlbuf.ray.ReplayService]: a ReplayBuffer and its rate limiter in a Ray actor.

The actor is threaded (Ray's ``max_concurrency``): an insert held by the rate limiter waits on
a condition while the learner's sample, which frees it, runs in another thread. Writers' calls run
in their own threads (the concurrency group ``WRITERS``), so however many writers the limiter
holds, the learner's calls always find a thread. Every row goes
through the hosted buffer's validated ``extend``; the limiter's counters move only once the
buffer has accepted a batch (a refused batch, or one held past its timeout, changes nothing).

Example:
    >>> import torch
    >>> from tensordict import TensorDict
    >>> shard = ShardHost(capacity=8, obs_shape=(1,), action_shape=(), seed=0,
    ...                   rate_limiter={"samples_per_insert": 1.0, "min_size_to_sample": 2, "error_buffer": 4.0})
    >>> rows = TensorDict({"observation": torch.zeros(3, 1), "action": torch.zeros(3),
    ...                    ("next", "observation"): torch.ones(3, 1), ("next", "reward"): torch.ones(3),
    ...                    ("next", "terminated"): torch.zeros(3, dtype=torch.bool),
    ...                    ("next", "truncated"): torch.zeros(3, dtype=torch.bool)}, batch_size=[3])
    >>> shard.shard_extend([(k, v.numpy()) for k, v in rows.items(True, True)], [3], None)
    >>> shard.shard_stats()["size"], shard.shard_limiter()["counters"]["inserts"]
    (3, 3)
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar, cast

import numpy as np
import ray
from tensordict import TensorDict

from rlbuf._compact_wire import frame_geometry, sample_wire, sends_frames
from rlbuf._complete_rows import complete_mass, incomplete_positions
from rlbuf._rate_limit import RateLimiter, wait_until
from rlbuf._ray_checkpoint import part_digest, read_manifest
from rlbuf._ray_wire import fields_of, from_wire, to_wire
from rlbuf._state import Checked
from rlbuf.checkpoint import load_state, save_state
from rlbuf.errors import CheckpointError, RlbufError
from rlbuf.ray import ReplayBufferHost

WRITERS = "writers"  # the Ray concurrency group of writers' calls; every other call runs in the default group
Call = TypeVar("Call", bound=Callable[..., Any])


def _writers(method: Call) -> Call:
    """``method`` run in the ``WRITERS`` concurrency group's threads (those a rate limiter may hold)."""
    return cast(Call, ray.method(concurrency_group=WRITERS)(method))


class ShardHost(ReplayBufferHost):
    """What runs inside one shard actor: [`ReplayBufferHost`][rlbuf.ray.ReplayBufferHost] plus a rate limiter.

    Args:
        checkpoint: rebuild the buffer from this checkpoint directory instead of ``options``.
        rate_limiter: the limiter's ``config()`` (``None``: no limit).
        limiter_counters: the limiter's counters to start from (a service checkpoint's).
        **options: [`ReplayBuffer`][rlbuf.ReplayBuffer] arguments.
    """

    def __init__(self, *, checkpoint: str | None = None, rate_limiter: Mapping[str, Any] | None = None,
                 limiter_counters: Mapping[str, int] | None = None, restart_from: str | None = None,
                 shard_index: int = 0, **options: Any) -> None:
        self._incarnation = uuid.uuid4().hex
        self._restored_from: dict[str, Any] | None = None
        restart_error: RlbufError | None = None
        # Ray starting this actor again after its process died: rebuild from the last checkpoint, else from what
        # it was first built from (a loaded service's part: reported as such, not as an empty restart).
        reconstructed = restart_from is not None and _reconstructed()
        if reconstructed and (Path(str(restart_from)) / "service.json").is_file():
            checkpoint = str(Path(str(restart_from)) / f"shard_{shard_index}")
            try:
                limiter_counters = read_manifest(Path(str(restart_from)))["limiter_counters"][shard_index]
            except RlbufError as error:
                restart_error = error
        if reconstructed and checkpoint is not None:
            self._restored_from = {"path": checkpoint, "write_count": 0}
        super().__init__(checkpoint=checkpoint, **options)
        self._error = self._error or restart_error
        self._condition = threading.Condition()
        self._limiter: RateLimiter | None = None
        self._base = 0
        self._stopped = 0  # the learner's rounds of waits ended (shard_stop_waiting)
        self._staged: tuple[dict[str, Any], Checked, RateLimiter | None]
        if self._error is not None:
            return
        try:
            if rate_limiter is not None:
                self._limiter = RateLimiter.from_config(rate_limiter, limiter_counters)
                if self._limiter.size != len(self._buffer):
                    raise CheckpointError(f"rate_limiter: counters say {self._limiter.size} rows, the buffer holds "
                                     f"{len(self._buffer)}; the checkpoint's service.json and shard differ")
        except RlbufError as error:
            self._error = error
            return
        # The limiter's inserts follow the buffer's write count from here on: a snapshot's write
        # count gives the inserts it holds, without stopping writers (see shard_save).
        inserts = 0 if self._limiter is None else self._limiter.inserts
        self._base = self._write_count() - inserts
        if self._restored_from is not None:
            self._restored_from["write_count"] = self._write_count()

    def _write_count(self) -> int:
        return int(self.buffer.state_dict(data=False)["write_count"])

    def shard_info(self) -> dict[str, Any]:
        """[`rlbuf_info`][rlbuf.ray.ReplayBufferHost.rlbuf_info], the importance-sampling exponent, and the
        buffer's options (JSON form) and layout, from which a writer checks single steps."""
        buffer = self.buffer
        return {**self.rlbuf_info(), "beta": buffer.beta if buffer.prioritized else 0.0, "compact": buffer.compact,
                "options": buffer.state_dict(data=False)["options"], "incarnation": self._incarnation,
                "write_count": self.write_count, "restored_from": self._restored_from,
                "frames": frame_geometry(buffer)}

    def shard_set_beta(self, value: float) -> None:
        """See [`ReplayBuffer.beta`][rlbuf.ReplayBuffer.beta]."""
        with self._condition:
            self.buffer.beta = value

    @_writers
    def shard_extend(self, columns: list[tuple[Any, Any]], batch_size: list[int], timeout: float | None) -> None:
        """Store a TorchRL-layout batch, first waiting for the rate limiter (``timeout`` seconds at most).

        Raises:
            RateLimitTimeoutError: the limiter held the batch for ``timeout`` seconds.
            ShapeError, DtypeError ...: as [`ReplayBuffer.extend`][rlbuf.ReplayBuffer.extend].
        """
        buffer = self.buffer
        td = TensorDict({key: from_wire(value) for key, value in columns}, batch_size=batch_size)
        rows = int(td.batch_size.numel())
        with self._condition:
            if rows and not self._may_insert(rows):
                buffer._check_extend(td)  # a malformed batch refused now, not once the limiter lets it in
            self._wait_to_insert("extend", rows, timeout)
            before = len(buffer)
            buffer.extend(td)
            limiter = self._limiter  # read after the wait: a restore meanwhile replaced it
            if limiter is not None:
                limiter.record_insert(rows)
                limiter.record_delete(before + rows - len(buffer))
                self._condition.notify_all()

    @_writers
    def shard_add(self, steps: list[tuple[list[Any], dict[str, Any]]], timeout: float | None) -> None:
        """Store steps as [`ReplayBuffer.add`][rlbuf.ReplayBuffer.add] stores them (``(values, keywords)`` each: a
        compact layout's steps that leave envs out with ``env_mask``), first waiting for the rate limiter.

        Each step is checked and stored as one ``add``: a step refused raises with the steps before it
        stored, as a local buffer given the same adds would hold them.

        Raises:
            RateLimitTimeoutError: the limiter held the rows for ``timeout`` seconds (nothing stored).
            ShapeError, StreamError ...: as ``add``.
        """
        buffer = self.buffer
        steps = [(from_wire(values), from_wire(keywords)) for values, keywords in steps]
        rows = sum(buffer.num_envs if keywords.get("env_mask") is None else int(np.asarray(keywords["env_mask"]).sum())
                   for _, keywords in steps)
        with self._condition:
            self._wait_to_insert("add", rows, timeout)
            before, written = len(buffer), self.write_count
            try:
                for values, keywords in steps:
                    buffer.add(*values, **keywords)
            finally:  # the limiter counts the rows stored, all of them or those before a refused step
                limiter = self._limiter  # read after the wait: a restore meanwhile replaced it
                if limiter is not None:
                    stored = self.write_count - written
                    limiter.record_insert(stored)
                    limiter.record_delete(before + stored - len(buffer))
                    self._condition.notify_all()

    def _wait_to_insert(self, call: str, rows: int, timeout: float | None) -> None:
        """Wait, holding the condition, until the rate limiter lets ``rows`` rows in: the limiter of the moment,
        which a restore replaces (with the same settings) while writers wait.

        Raises:
            RateLimitTimeoutError: it held them for ``timeout`` seconds.
        """
        if self._limiter is not None and rows:
            self._limiter.check_insert(rows)
            wait_until(self._condition, lambda: self._may_insert(rows), timeout,
                       lambda: f"{call}: the rate limiter held {rows} rows for {timeout} s ({self._limiter}); the "
                               "learner samples too slowly for samples_per_insert: sample more, widen error_buffer or "
                               "raise timeout")

    def _may_insert(self, rows: int) -> bool:
        return self._limiter is None or self._limiter.can_insert(rows)

    @_writers
    def shard_truncate_episodes(self, env_mask: Any) -> None:
        """See [`ReplayBuffer.truncate_episodes`][rlbuf.ReplayBuffer.truncate_episodes]."""
        with self._condition:
            self.buffer.truncate_episodes(env_mask)

    def shard_stats(self) -> dict[str, Any]:
        """``size``, the total and smallest ``priority ** alpha`` of the rows ``sample`` draws (every stored row, but
        a compact buffer's complete transitions alone; their count and 1 without priorities), the limiter's counters,
        the rows ever written and which actor answers."""
        with self._condition:
            return self._stats()

    def _stats(self) -> dict[str, Any]:
        buffer = self.buffer
        size = len(buffer)
        counters = None if self._limiter is None else self._limiter.counters()
        who = {"write_count": self.write_count, "incarnation": self._incarnation}
        compact = buffer._compact
        if size == 0 or (not buffer.prioritized and compact is None):
            return {"size": size, "mass": float(size), "smallest": 1.0, "limiter": counters, **who}
        ring, sampler = buffer._ring, buffer._ring.rb.sampler  # not buffer.torchrl, which a compact buffer does not hand out
        with ring.lock:  # a compact buffer judges its rows' completeness on committed rows
            ring.flush()
            if compact is not None and not buffer.prioritized:  # it draws its complete transitions alone
                complete = len(ring) - len(incomplete_positions(compact))
                return {"size": size, "mass": float(complete), "smallest": 1.0, "limiter": counters, **who}
            _, total, smallest = sampler.sampled_mass(ring.rb.storage)  # rlbuf's own SumTreeSampler
            if compact is not None:  # it draws its complete transitions alone: their mass is its share
                total = complete_mass(compact, sampler, total)
        return {"size": size, "mass": float(total), "smallest": float(smallest), "limiter": counters, **who}

    def shard_wait_sample(self, batch_size: int, timeout: float | None, wait_round: int = 0) -> bool:
        """``True`` once the rate limiter lets ``batch_size`` rows be sampled, ``False`` once the learner stops
        this round of waits (``shard_stop_waiting(wait_round)``: another shard let its share be drawn first);
        changes nothing. A limiter replaced meanwhile (a restore) is the one asked.

        Raises:
            RateLimitTimeoutError: neither within ``timeout`` seconds.
        """
        limiter = self._limiter  # a restore replaces it by one of the same settings: read anew at each wake
        if limiter is None:
            return True
        limiter.check_sample(batch_size)
        with self._condition:
            wait_until(self._condition, lambda: self._may_sample(batch_size) or self._stopped >= wait_round, timeout,
                       lambda: self._sample_held(self._limiter or limiter, batch_size, timeout))
            return self._may_sample(batch_size)

    def _may_sample(self, batch_size: int) -> bool:
        return self._limiter is None or self._limiter.can_sample(batch_size)

    def shard_stop_waiting(self, wait_round: int) -> None:
        """End the learner's waits of rounds up to ``wait_round`` (see ``shard_wait_sample``)."""
        with self._condition:
            self._stopped = max(self._stopped, wait_round)
            self._condition.notify_all()

    @staticmethod
    def _sample_held(limiter: RateLimiter, batch_size: int, timeout: float | None) -> str:
        reason = ("too few rows to sample" if limiter.size < limiter.min_size_to_sample
                  else "sampling would run ahead of samples_per_insert")
        return (f"sample: the rate limiter held {batch_size} rows for {timeout} s ({reason}; {limiter}): insert"
                " more, widen error_buffer or raise timeout")

    def shard_sample(self, batch_size: int, timeout: float | None,
                     known: list[str] | None = None) -> dict[str, Any]:
        """``batch_size`` rows (as [`ReplayBuffer.sample`][rlbuf.ReplayBuffer.sample]) and the shard's stats after the draw.

        With ``known`` (the ids of the dictionaries the learner holds), a compact buffer's followed frames
        travel apart, each distinct one once (``"frames"``, see [`rlbuf._compact_wire`][rlbuf._compact_wire]).
        """
        first = self._limiter
        if first is not None:
            first.check_sample(batch_size)
        payload = None
        with self._condition:
            if first is not None:
                wait_until(self._condition, lambda: self._may_sample(batch_size), timeout,
                           lambda: self._sample_held(self._limiter or first, batch_size, timeout))
            limiter = self._limiter  # read after the wait: a restore meanwhile replaced it
            if known is not None and sends_frames(self.buffer):
                batch, payload = sample_wire(self.buffer, batch_size, known=known)
            else:
                batch = self.buffer.sample(batch_size)
            if limiter is not None:
                limiter.record_sample(batch_size)
                self._condition.notify_all()
            stats = self._stats()
        fields: dict[str, Any] = to_wire(fields_of(batch))
        return {"fields": fields, "stats": stats, "frames": payload}

    def shard_update_priority(self, index: Any, priority: Any) -> dict[str, Any]:
        """See [`ReplayBuffer.update_priority`][rlbuf.ReplayBuffer.update_priority]; returns the stats after it."""
        with self._condition:
            self.buffer.update_priority(from_wire(index), from_wire(priority))
            return self._stats()

    def shard_limiter(self) -> dict[str, Any] | None:
        """The limiter's ``config()`` and ``counters()``, or ``None`` without one."""
        limiter = self._limiter
        if limiter is None:
            return None
        with self._condition:
            return {"config": limiter.config(), "counters": limiter.counters()}

    def shard_stage(self, path: str, counters: Mapping[str, int] | None) -> None:
        """Read and verify the shard checkpoint at ``path`` (and the limiter's ``counters``) for ``shard_commit``.

        Every check the buffer's own load makes runs here (its options, fields, counts against this
        buffer's), so that no shard's commit can fail once every shard has staged its part.

        Raises:
            CheckpointError: the checkpoint fails its checks, or the counters do not match its rows.
        """
        state = load_state(path, kind="ReplayBuffer")
        checked = self.buffer._check(state)
        limiter = None
        if self._limiter is not None:
            limiter = RateLimiter.from_config(self._limiter.config(), counters)
            if limiter.size != int(state["size"]):
                raise CheckpointError(f"rate_limiter: counters say {limiter.size} rows, {path} holds {state['size']}")
        self._staged = (state, checked, limiter)

    def shard_commit(self) -> None:
        """Replace the buffer and limiter with what ``shard_stage`` read and checked: the service's restore."""
        state, checked, limiter = self._staged
        with self._condition:
            self.buffer._restore_checked(state, checked)
            self._limiter = limiter
            self._base = int(state["write_count"]) - (0 if limiter is None else limiter.inserts)
            self._condition.notify_all()
        del self._staged

    def shard_save(self, path: str) -> dict[str, Any]:
        """Write the buffer's checkpoint at ``path``; return the limiter's counters at the same write count
        (``limiter``, ``None`` without one), that ``write_count`` and the digest of the checkpoint's manifest
        (``manifest_sha256``, which ``service.json`` binds).

        Writers keep writing: the buffer's snapshot holds them off only while it copies rows.
        Samples must not run meanwhile (the learner saves between its samples).
        """
        state = self.buffer.state_dict()
        save_state(state, path)
        saved = {"limiter": None, "write_count": int(state["write_count"]), "manifest_sha256": part_digest(Path(path))}
        limiter = self._limiter
        if limiter is None:
            return saved
        inserts = int(state["write_count"]) - self._base
        return {**saved, "limiter": {"inserts": inserts, "samples": limiter.samples,
                                     "deletes": inserts - int(state["size"])}}


def _reconstructed() -> bool:
    """Whether Ray is starting this actor again after its process died (``max_restarts``)."""
    import ray

    return bool(ray.get_runtime_context().was_current_actor_reconstructed)
