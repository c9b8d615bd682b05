"""A writer's handle on a [`ReplayService`][rlbuf.ray.ReplayService]: batches to one shard, or single steps gathered first.

``extend`` sends a TorchRL-layout batch in one round trip. ``add`` takes one env step, with
[`ReplayBuffer.add`][rlbuf.ReplayBuffer.add]'s signature, checks it at once in a local staging
``ReplayBuffer`` of the shards' fields (and, for a compact layout, a small compact buffer that
follows each env's stream), and sends ``batch_steps`` steps as one batch: a Ray call costs
milliseconds, a step microseconds. A step refused here was never staged; a batch the rate
limiter holds, or a dead shard refuses, stays in the writer (``pending``) for the next flush; a
batch the shard refuses for what it holds is dropped, its error raised once.

Example:
    >>> @ray.remote                                          # doctest: +SKIP
    ... def collect(writer):
    ...     with writer:                                     # flushes the last steps at exit
    ...         for step in range(1000):
    ...             writer.add(obs, action, reward, next_obs, terminated, truncated)
    >>> ray.get([collect.remote(service.writer(writer_id=w)) for w in range(2)])  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, cast

import numpy as np
from tensordict import TensorDictBase

from rlbuf._ray_calls import get
from rlbuf._ray_wire import to_wire
from rlbuf._state import _option_from_json
from rlbuf.batches import Transition
from rlbuf.errors import (
    CheckpointError,
    ConfigError,
    NotPicklableError,
    RateLimitTimeoutError,
    RlbufError,
    ShapeError,
    ShardDiedError,
    StreamError,
)
from rlbuf.replay import ReplayBuffer

# Options of the shards' buffers a staging buffer leaves out: it stores plain rows, in order, on the CPU.
_NOT_STAGED = ("capacity", "prioritized", "alpha", "beta", "storage", "storing_device", "device", "seed", "frame_stack",
               "padding_type", "n_step", "gamma", "compact", "compression", "compression_level", "compact_key",
               "hindsight")


# What leaves a batch in the writer: a limiter's timeout, a dead shard, or one that could not rebuild itself from
# its checkpoint. Any other rlbuf error is the shard's answer to the batch itself (ShapeError, ConfigError for a done
# that is neither terminated nor truncated ...): sending it again would be refused again, so it is dropped.
_KEPT = (RateLimitTimeoutError, ShardDiedError, CheckpointError)


Step = tuple[tuple[list[Any], dict[str, Any]], int]  # an add's (positional, keyword) values, and the rows it keeps


class Batch(NamedTuple):
    """A batch a writer sends: TorchRL-layout ``columns`` of ``batch_size``, or the adds ``steps``; ``rows`` stored."""

    columns: list[tuple[Any, Any]]
    batch_size: list[int]
    rows: int
    steps: list[tuple[list[Any], dict[str, Any]]] | None = None


def timeout_of(timeout: Any) -> float | None:
    """``timeout`` checked: ``None`` (wait as long as it takes) or finite seconds >= 0.

    Example:
        >>> timeout_of(2), timeout_of(None)
        (2.0, None)
        >>> timeout_of(float("inf"))
        Traceback (most recent call last):
        ...
        rlbuf.errors.ConfigError: timeout: expected None (no limit) or a finite number of seconds >= 0, got inf
    """
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 <= timeout < math.inf:
        raise ConfigError(f"timeout: expected None (no limit) or a finite number of seconds >= 0, got {timeout!r}")
    return float(timeout)


def check_batch_steps(batch_steps: Any) -> int:
    """``batch_steps`` checked: an int >= 1."""
    if isinstance(batch_steps, bool) or not isinstance(batch_steps, int) or batch_steps < 1:
        raise ConfigError(f"batch_steps: expected an int >= 1 (env steps a writer's add gathers per batch), got "
                          f"{batch_steps!r}")
    return batch_steps


class ServiceWriter:
    """A writer's handle on a [`ReplayService`][rlbuf.ray.ReplayService]: picklable, sends batches to the shards.

    What a Ray task or actor receives when given a ``ReplayService`` (or
    [`ReplayService.writer`][rlbuf.ray.ReplayService.writer]). Each batch is one round trip to
    one shard: the same shard every time when built with ``shard=`` (always, for a compact
    layout), else the next one in turn. ``add`` gathers single steps into batches of
    ``batch_steps`` steps; ``flush`` (or leaving a ``with writer:`` block) sends what is left.

    Example:
        >>> @ray.remote                                          # doctest: +SKIP
        ... def collect(writer):
        ...     for step in range(100):
        ...         writer.extend(batch_of_64_transitions)       # a TensorDict, TorchRL layout
        >>> ray.get([collect.remote(service.writer(writer_id=w)) for w in range(2)])  # doctest: +SKIP
    """

    def __init__(self, shards: Sequence[Any], keys: Sequence[Any], *, shard: int | None = None, start: int = 0,
                 timeout: float | None = 60.0, layout: Mapping[str, Any] | None = None, batch_steps: int = 64) -> None:
        self._shards = list(shards)
        self._keys = list(keys)
        self._shard = shard
        self._next = start % len(self._shards)
        self._timeout = timeout
        self._layout = dict(layout or {"options": None, "compact": False})
        self._batch_steps = check_batch_steps(batch_steps)
        self._staging: ReplayBuffer | None = None   # built on first add, in the writer's process
        self._checker: ReplayBuffer | None = None   # compact layouts: follows each env's stream
        self._steps = 0                              # steps in the staging buffer
        self._masked = False                         # some staged step left envs out (env_mask)
        self._adds: list[Step] = []                  # compact layouts: steps sent as adds (env_mask), with their rows
        self._ready: list[Batch] = []                # batches not yet acknowledged, in order

    def __reduce__(self) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
        if self.pending:
            raise NotPicklableError(f"ServiceWriter: {self.pending} rows not yet sent would be sent twice (here and "
                                    "by the copy); call flush() before giving it to another process")
        return (ServiceWriter, (self._shards, self._keys),
                {"_shard": self._shard, "_next": self._next, "_timeout": self._timeout, "_layout": self._layout,
                 "_batch_steps": self._batch_steps, "_staging": None, "_checker": None, "_steps": 0,
                 "_masked": False, "_adds": [], "_ready": []})

    def __setstate__(self, state: Mapping[str, Any]) -> None:
        self.__dict__.update(state)

    @property
    def num_shards(self) -> int:
        """Shards of the service."""
        return len(self._shards)

    @property
    def shard(self) -> int | None:
        """The shard this writer always sends to, or ``None`` (round-robin)."""
        return self._shard

    @property
    def batch_steps(self) -> int:
        """Env steps ``add`` gathers before it sends them as one batch."""
        return self._batch_steps

    @property
    def pending(self) -> int:
        """Rows added here and not yet acknowledged by a shard (not in any checkpoint yet)."""
        staged = 0 if self._staging is None else len(self._staging)
        return staged + sum(rows for _, rows in self._adds) + sum(batch.rows for batch in self._ready)

    def _restored(self, shards: Sequence[Any], start: int) -> None:
        """Send to ``shards`` from now on, the next in turn ``start``: the service's restore (a dead shard started
        again under a new handle). The batches held (``pending``) stay, sent first at the next ``flush``."""
        self._shards = list(shards)
        self._next = start % len(self._shards)

    def _route(self, call: str) -> None:
        if self._layout["compact"] and self._shard is None:
            raise ConfigError(f"{call}: the shards store next_obs once (frame_stack, n_step or compact), so each env's "
                              "steps must all go to one shard; use service.writer(writer_id=w) (one writer a shard) "
                              "or service.writer(shard=k), not a round-robin writer")

    def add(self, obs: Any = None, action: Any = None, reward: Any = None, next_obs: Any = None,
            terminated: Any = None, truncated: Any = None, hidden_state: Any = None, *, env_mask: Any = None,
            metrics: Mapping[str, Any] | None = None, **extras: Any) -> None:
        """Store one env step, as [`ReplayBuffer.add`][rlbuf.ReplayBuffer.add]: checked now, sent with the batch.

        The step is validated here at once (shapes, dtypes, values and, for a compact layout,
        that it continues each env's stream); every ``batch_steps`` steps the batch goes to
        the writer's shard in one call.

        Raises:
            ShapeError, DtypeError, StreamError ...: as [`ReplayBuffer.add`][rlbuf.ReplayBuffer.add]; nothing is staged.
            ConfigError: a round-robin writer of a compact layout.
            RateLimitTimeoutError, ShardDiedError: sending a full batch failed; its rows stay
                in the writer (``pending``) for the next ``flush``.
        """
        self._route("add")
        staging, checker = self._buffers()
        if checker is not None:
            checker.add(obs, action, reward, next_obs, terminated, truncated, hidden_state, env_mask=env_mask,
                        metrics=metrics, **extras)
        if checker is not None and (env_mask is not None or self._adds):
            # Steps that leave envs out make no (num_envs, steps) block: they go as the adds they are.
            if not self._adds:
                self._stage()   # the whole steps before them go first
            rows = checker.num_envs if env_mask is None else int(np.asarray(to_wire(env_mask)).sum())  # checked
            if isinstance(obs, Transition):
                obs = obs._replace(**{name: to_wire(getattr(obs, name)) for name in obs._fields})
            values = [to_wire(value) for value in (obs, action, reward, next_obs, terminated, truncated, hidden_state)]
            self._adds.append(((values, to_wire({"env_mask": env_mask, "metrics": metrics, **extras})), rows))
        else:
            staging.add(obs, action, reward, next_obs, terminated, truncated, hidden_state, env_mask=env_mask,
                        metrics=metrics, **extras)
            self._masked = self._masked or env_mask is not None
        self._steps += 1
        if self._steps == self._batch_steps:
            self.flush()

    def extend(self, td: TensorDictBase, *, timeout: float | str | None = "default") -> int:
        """Store a TensorDict batch in TorchRL layout in one shard (after any steps ``add`` gathered); returns the shard.

        Args:
            td: rows in TorchRL layout (any batch shape, flattened), as for
                [`ReplayBuffer.extend`][rlbuf.ReplayBuffer.extend]; ``(num_envs, T)`` for a compact layout.
            timeout: seconds the rate limiter may hold the batch (the service's by default;
                ``None``: no limit).

        Raises:
            ShapeError, DtypeError, StreamError ...: as [`ReplayBuffer.extend`][rlbuf.ReplayBuffer.extend];
                nothing is stored.
            ConfigError: a round-robin writer of a compact layout.
            RateLimitTimeoutError, ShardDiedError: the shard's rate limiter held the batch for
                ``timeout`` seconds, or the shard's actor is gone; the batch stays in the writer
                (``pending``): the next ``flush`` sends it, never send it again.
        """
        if not isinstance(td, TensorDictBase):
            raise ShapeError(f"td: expected a TensorDict with a batch size, got {type(td).__name__}; wrap it: "
                             "TensorDict(d, batch_size=[n])")
        self._route("extend")
        timeout_of(None if timeout == "default" else timeout)
        if self._layout["compact"]:   # the stream continues from this batch: checked here first
            self._buffers()[1].extend(td)  # type: ignore[union-attr]  # a compact layout has a checker
        self._stage()
        self._queue(td)
        return cast(int, self.flush(timeout=timeout))  # a batch was sent

    def flush(self, *, timeout: float | str | None = "default") -> int | None:
        """Send the steps ``add`` gathered (and any batch a failed send kept), oldest first.

        Returns:
            The shard the last batch went to (``None``: nothing to send).

        Raises:
            RateLimitTimeoutError, ShardDiedError: a batch was not stored; it and the ones after
                it stay in the writer (``pending``): flush again, never send them again.
            ShapeError, ConfigError ...: the shard refused a batch itself (any other rlbuf error);
                that batch is dropped, raised this once, and the ones after it stay (``pending``).
        """
        wait = self._timeout if timeout == "default" else timeout_of(timeout)
        self._stage()
        shard = None
        while self._ready:
            shard = self._shard if self._shard is not None else self._next
            batch, remote = self._ready[0], self._shards[shard]
            call = (remote.shard_add.remote(batch.steps, wait) if batch.steps is not None
                    else remote.shard_extend.remote(batch.columns, batch.batch_size, wait))
            try:
                get([(shard, call)], restarting=bool(self._layout.get("restart")))
            except RlbufError as error:
                if isinstance(error, _KEPT):
                    raise
                self._ready.pop(0)  # the batch itself refused by the shard: raised once, never sent again
                if isinstance(error, StreamError) and self._checker is not None:  # checked here, so the shard moved
                    raise StreamError(f"{error} (shard {shard}'s streams no longer follow this writer's, as after a "
                                      f"restore or a restart from a checkpoint: call writer.truncate_episodes() to end "
                                      f"each env's episode on both, and reset the envs)") from error
                raise
            self._ready.pop(0)
            if self._shard is None:
                self._next = (shard + 1) % len(self._shards)
        return shard

    def truncate_episodes(self, env_mask: Any = None, *, timeout: float | str | None = "default") -> None:
        """End the running episodes of this writer's envs at their newest stored step, as a time limit
        would (see [`ReplayBuffer.truncate_episodes`][rlbuf.ReplayBuffer.truncate_episodes]): after the
        envs were reset mid-episode, or in a writer that takes over from one that crashed (the shard's
        streams still wait for the old writer's next steps). The steps gathered so far are sent first.
        Shards of whole transitions hold no stream to end (their rows stand alone, and other writers'
        rows share them): there it only sends those steps.

        Args:
            env_mask: ``[num_envs]`` bools: the envs reset (``None``: all).
            timeout: for the steps sent first (the service's by default).

        Raises:
            ShapeError: ``env_mask`` is not one bool per env (checked before anything is sent).
            ConfigError: a round-robin writer of a compact layout.
        """
        self._route("truncate_episodes")
        staging = self._buffers()[0]  # built here if not yet: with it, a compact layout's stream checker
        if env_mask is not None:  # checked before anything is sent; the steps gathered are sent as they were added
            staging._writer.checked_env_mask(env_mask)
        self.flush(timeout=timeout)
        shard = self._shard
        if self._checker is None or shard is None:  # whole transitions, other writers' rows beside: nothing to end
            return
        get([(shard, self._shards[shard].shard_truncate_episodes.remote(env_mask))],
            restarting=bool(self._layout.get("restart")))
        self._checker.truncate_episodes(env_mask)

    def _stage(self) -> None:
        """Turn the steps ``add`` gathered into a batch ready to send (TorchRL layout, numpy arrays; or the adds
        of a compact layout's steps that leave envs out)."""
        if self._adds:
            steps, self._adds = self._adds, []
            self._ready.append(Batch([], [], sum(rows for _, rows in steps), [step for step, _ in steps]))
            self._steps = 0
            return
        staging = self._staging
        if staging is None or not len(staging):
            return
        td = staging.sample_all().to_tensordict()
        if not self._masked:   # whole steps: rows of one env num_envs apart, or env-first for a compact shard
            td = td.reshape(self._steps, staging.num_envs)
            if self._layout["compact"]:
                td = td.transpose(0, 1)
        self._queue(td)
        staging.clear()
        self._steps, self._masked = 0, False

    def _queue(self, td: TensorDictBase) -> None:
        """Queue a batch to send: its shards' keys as numpy arrays, and its batch size."""
        self._ready.append(Batch([(key, to_wire(value)) for key in self._keys if (value := td.get(key, None)) is not None],
                             list(td.batch_size), math.prod(td.batch_size)))

    def _buffers(self) -> tuple[ReplayBuffer, ReplayBuffer | None]:
        """The staging buffer (and the compact layout's stream checker), built on first use."""
        if self._staging is None:
            options = self._layout["options"]
            if options is None:
                raise ConfigError("add: this writer was built by hand without the shards' layout; take one from "
                                  "service.writer()")
            options = _option_from_json(options)
            plain = {name: value for name, value in options.items() if name not in _NOT_STAGED}
            rows = self._batch_steps * int(options.get("num_envs", 1))
            self._staging = ReplayBuffer(rows, **plain)
            if self._layout["compact"]:
                kept = ("frame_stack", "padding_type", "compact", "compact_key")
                compact = {name: options[name] for name in kept if name in options}
                self._checker = ReplayBuffer(max(rows, 16 * int(options.get("num_envs", 1))),
                                             **{**plain, **compact, "compact": True})
        return self._staging, self._checker

    def __enter__(self) -> ServiceWriter:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.flush()
            return
        with contextlib.suppress(RlbufError):  # the block's own error is the one to see
            self.flush()

