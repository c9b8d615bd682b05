"""A ReplayBuffer served by a Ray actor: collectors on any node write, the learner samples.

Install with ``pip install "rlbuf[ray]"``. The actor is TorchRL's
``RayReplayBuffer``, built with ``replay_buffer_cls=ReplayBufferHost``: the
object inside the actor is a real [`ReplayBuffer`][rlbuf.ReplayBuffer] (validation, typed fields,
prioritized replay, the pickle-free checkpoint format). Two ways in:

* [`RemoteReplayBuffer`][rlbuf.ray.RemoteReplayBuffer] on the learner: rlbuf's typed API (``add``, ``extend``,
  ``sample`` delivering a [`ReplayBatch`][rlbuf.ReplayBatch] on the learner's ``device``, ``save``,
  ``state_dict``), plus ``close()`` that stops the actor. Sending it to a Ray task or actor
  sends a [`RemoteReplayBufferHandle`][rlbuf.ray.RemoteReplayBufferHandle]: the same calls, without the right to stop it.
* ``buffer.torchrl``: the ``RayReplayBuffer`` itself, for TorchRL code (``RayCollector(...,
  replay_buffer=buffer.torchrl)``, ``buffer.torchrl.sample(32)`` giving a TensorDict).

Every call is one blocking round trip to the actor, which runs calls one at a time, in the
order they arrive: an acknowledged ``add``/``extend`` is stored whole, and a rejected one
(a ``ShapeError`` raised on the learner or writer, as if the buffer were local) stores nothing.
Tensors travel as numpy arrays, which Ray moves without pickling their bytes: sending a
64-row batch or receiving a 4096-row sample takes 1.5-2.5x less time than torch's pickling.

For N buffers behind one handle, with Reverb's rate limiting and exact checkpoints of them
all, see [`ReplayService`][rlbuf.ray.ReplayService] and [`RateLimiter`][rlbuf.ray.RateLimiter].
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data.replay_buffers.ray_buffer import RayReplayBuffer

from rlbuf._delivery import deliver
from rlbuf._keywords import keywords_checked
from rlbuf._obs import torchrl_env_key
from rlbuf._protocols import BufferProtocols, RowCount
from rlbuf._ray_wire import fields_of, from_wire, to_wire
from rlbuf.batches import ReplayBatch, Transition
from rlbuf.checkpoint import load_state
from rlbuf.errors import RlbufError
from rlbuf.replay import ReplayBuffer
from rlbuf.sequences import ReplaySequenceBatch
from rlbuf.storage import DeviceLike, resolve_device


class ReplayBufferHost:
    """What runs inside the Ray actor: a [`ReplayBuffer`][rlbuf.ReplayBuffer] behind TorchRL's calls.

    TorchRL's ``RayReplayBuffer(replay_buffer_cls=ReplayBufferHost, **options)`` builds it
    remotely as ``ReplayBufferHost(delayed_init=..., **options)``. It answers the calls TorchRL's
    Ray client makes (``extend``, ``add``, ``sample``, ``len``, ``save``, ``load`` ...) with
    rlbuf's own paths, so a TorchRL collector's batches are validated like any ``extend``
    and ``save`` writes rlbuf's checkpoint format, and the ``rlbuf_*`` calls that
    [`RemoteReplayBuffer`][rlbuf.ray.RemoteReplayBuffer] makes. Not meant to be built by hand.

    Args:
        delayed_init: TorchRL's option; ignored (the storage is always built up front).
        checkpoint: rebuild the buffer from this checkpoint directory (on the actor's node)
            instead of from ``options``.
        **options: [`ReplayBuffer`][rlbuf.ReplayBuffer] arguments.

    Example:
        >>> host = ReplayBufferHost(capacity=10, obs_shape=(2,), action_shape=())
        >>> host.rlbuf_add(torch.zeros(2), 0.0, 1.0, torch.ones(2), False, truncated=False)
        >>> len(host), host.sample(4)["next", "reward"].shape
        (1, torch.Size([4, 1]))
    """

    _batch_size = None  # read by TorchRL's client: batches are sized per call

    def __init__(self, *, delayed_init: bool = False, checkpoint: str | None = None, **options: Any) -> None:
        del delayed_init
        # An error raised here would reach the learner as Ray's ActorDiedError, with only its text;
        # keeping it and raising it from the first call gives the learner the rlbuf exception itself.
        self._error: RlbufError | None = None
        try:
            self._buffer = ReplayBuffer.load(checkpoint) if checkpoint is not None else ReplayBuffer(**options)
        except RlbufError as error:
            self._error = error

    @classmethod
    def as_remote(cls, remote_config: Mapping[str, Any] | None = None) -> Any:
        """The Ray actor class (what ``RayReplayBuffer`` instantiates), with ``remote_config`` resources."""
        import ray

        return ray.remote(**dict(remote_config or {"num_cpus": 1}))(cls)

    @property
    def buffer(self) -> ReplayBuffer:
        """The hosted buffer (raises the construction error, if there was one)."""
        if self._error is not None:
            raise self._error
        return self._buffer

    # -- TorchRL's replay-buffer calls --------------------------------------------------------
    def extend(self, data: TensorDictBase) -> None:
        """Store a TensorDict batch in TorchRL layout (see [`ReplayBuffer.extend`][rlbuf.ReplayBuffer.extend])."""
        self.buffer.extend(data)

    def add(self, data: TensorDictBase) -> None:
        """Store one TorchRL transition (a TensorDict without a batch dim)."""
        self.buffer.extend(data.unsqueeze(0))

    def sample(self, batch_size: int) -> TensorDictBase:
        """A sampled batch in TorchRL layout (``batch.to_tensordict()``)."""
        return self.buffer.sample(batch_size).to_tensordict()

    def __len__(self) -> int:
        return len(self.buffer)

    def __bool__(self) -> bool:
        # Ray tests the actor's truth while storing a task's error: without this it calls
        # __len__, which raises again when construction failed, and the worker dies.
        return True

    def _getattr(self, name: str) -> Any:
        return getattr(self, name)

    @property
    def write_count(self) -> int:
        """Rows ever written."""
        return self.buffer._ring.write_count

    def update_priority(self, index: Any, priority: Any) -> None:
        """See [`ReplayBuffer.update_priority`][rlbuf.ReplayBuffer.update_priority]."""
        self.buffer.update_priority(index, priority)

    def empty(self, empty_write_count: bool = True) -> None:
        """Remove every row."""
        del empty_write_count
        self.buffer.clear()

    def save(self, path: str) -> None:
        """Write an rlbuf checkpoint at ``path`` on the actor's node."""
        self.buffer.save(path)

    def load(self, path: str) -> None:
        """Replace the contents with the rlbuf checkpoint at ``path`` on the actor's node."""
        self.buffer.load_state_dict(load_state(path, kind="ReplayBuffer"))

    def state_dict(self) -> dict[str, Any]:
        """See [`ReplayBuffer.state_dict`][rlbuf.ReplayBuffer.state_dict]."""
        return self.buffer.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """See [`ReplayBuffer.load_state_dict`][rlbuf.ReplayBuffer.load_state_dict]."""
        self.buffer.load_state_dict(state)

    def stats(self) -> dict[str, Any]:
        """TorchRL's counters (size, capacity, write count ...)."""
        return dict(self.buffer.torchrl.stats())

    def synchronize(self) -> None:
        """Nothing to wait for: every call completes before it returns."""

    # -- rlbuf's typed calls ------------------------------------------------------------------
    def rlbuf_info(self) -> dict[str, Any]:
        """What the learner shows without a round trip per property."""
        buffer = self.buffer
        keys = [spec.key for spec in buffer.fields if spec.name != "done"] + [("next", "done")]
        if buffer.compact:  # next_obs is stored once, but extend reads it
            keys += [("next", *(spec.key if isinstance(spec.key, tuple) else (spec.key,)))
                     for spec in buffer.fields if spec.name.startswith("obs")]
        # Where TorchRL's GymEnv puts a Dict space's keys (top level), which extend also reads.
        keys += [alternative for key in keys if (alternative := torchrl_env_key(key)) is not None]
        return {"capacity": buffer.capacity, "num_envs": buffer.num_envs, "prioritized": buffer.prioritized,
                "storing_device": str(buffer.storing_device), "keys": keys, "repr": repr(buffer)}

    def rlbuf_add(self, *args: Any, **kwargs: Any) -> None:
        """See [`ReplayBuffer.add`][rlbuf.ReplayBuffer.add] (numpy arrays or Python values)."""
        self.buffer.add(*args, **kwargs)

    def rlbuf_extend(self, columns: list[tuple[Any, Any]], batch_size: list[int]) -> None:
        """See [`ReplayBuffer.extend`][rlbuf.ReplayBuffer.extend]: the TensorDict's leaves as ``(key, array)`` pairs."""
        self.buffer.extend(TensorDict({key: from_wire(value) for key, value in columns}, batch_size=batch_size))

    def rlbuf_sample(self, batch_size: int) -> dict[str, Any]:
        """See [`ReplayBuffer.sample`][rlbuf.ReplayBuffer.sample] (the batch as a dict of its fields)."""
        fields: dict[str, Any] = to_wire(fields_of(self.buffer.sample(batch_size)))
        return fields

    def rlbuf_sample_sequences(self, batch_size: int, length: int, burn_in: int = 0) -> dict[str, Any]:
        """See [`ReplayBuffer.sample_sequences`][rlbuf.ReplayBuffer.sample_sequences] (the batch as a dict)."""
        batch = self.buffer.sample_sequences(batch_size, length, burn_in=burn_in)
        fields: dict[str, Any] = to_wire({field.name: getattr(batch, field.name) for field in dataclasses.fields(batch)})
        return fields

    def rlbuf_sample_all(self) -> dict[str, Any]:
        """See [`ReplayBuffer.sample_all`][rlbuf.ReplayBuffer.sample_all]."""
        fields: dict[str, Any] = to_wire(fields_of(self.buffer.sample_all()))
        return fields

    def rlbuf_update_priority(self, index: Any, priority: Any) -> None:
        """See [`ReplayBuffer.update_priority`][rlbuf.ReplayBuffer.update_priority]."""
        self.buffer.update_priority(from_wire(index), from_wire(priority))

    def rlbuf_state_dict(self, data: bool = True) -> dict[str, Any]:
        """See [`ReplayBuffer.state_dict`][rlbuf.ReplayBuffer.state_dict]."""
        state: dict[str, Any] = to_wire(self.buffer.state_dict(data=data))
        return state

    def rlbuf_load_state_dict(self, state: Mapping[str, Any]) -> None:
        """See [`ReplayBuffer.load_state_dict`][rlbuf.ReplayBuffer.load_state_dict]."""
        self.buffer.load_state_dict(from_wire(dict(state)))

    def rlbuf_save(self, path: str, data: bool = True, keep_spare: bool = False) -> None:
        """See [`ReplayBuffer.save`][rlbuf.ReplayBuffer.save]."""
        self.buffer.save(path, data=data, keep_spare=keep_spare)

    def rlbuf_close(self) -> None:
        """Remove the memmap scratch directory rlbuf made (a killed actor cannot), then exit the actor."""
        import ray

        if self._error is None:
            self._buffer.close()
        exit_actor: Any = ray.actor.exit_actor  # untyped in Ray
        exit_actor()


def _wait_until_dead(client: Any, timeout: float = 30.0) -> None:
    """Return once the actor behind ``client`` is gone (an exit or a kill is not instant)."""
    from ray.exceptions import RayActorError

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            client.synchronize()
        except RayActorError:
            return
        time.sleep(0.01)


class RemoteReplayBufferHandle(BufferProtocols):
    """A writer's (or a second reader's) view of a [`RemoteReplayBuffer`][rlbuf.ray.RemoteReplayBuffer]: picklable, cannot stop it.

    What a Ray task or actor receives when given a ``RemoteReplayBuffer`` (or its
    [`handle`][rlbuf.ray.RemoteReplayBuffer.handle]). Batches are delivered on ``device`` (CPU for handles).
    Errors raised by the buffer (``ShapeError``, ``EmptyBufferError`` ...) are raised here as
    themselves.

    Example:
        >>> @ray.remote                                              # doctest: +SKIP
        ... def collect(buffer, worker):
        ...     for step in range(100):
        ...         buffer.add(obs, action, reward, next_obs, terminated, truncated)
        >>> ray.get([collect.remote(buffer, w) for w in range(4)])  # doctest: +SKIP
    """

    def __init__(self, client: Any, device: DeviceLike = "cpu", keys: list[Any] | None = None) -> None:
        self._client = client
        self._device = resolve_device(device, name="device")
        self._keys = keys

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return RemoteReplayBufferHandle, (self._client, "cpu", self._keys)

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        from ray.exceptions import RayTaskError

        try:
            return getattr(self._client, name)(*args, **kwargs)
        except RayTaskError as error:
            if isinstance(error.cause, RlbufError):
                raise error.cause from None
            raise

    @property
    def device(self) -> torch.device:
        """Where sampled batches are delivered."""
        return self._device

    def __len__(self) -> int:
        return int(self._call("__len__"))

    @property
    def size(self) -> int:
        """Rows stored now (same as ``len(buffer)``; one round trip); calling it, as SB3's ``size()``, names the fix."""
        return RowCount(len(self))

    def add(self, obs: Any, action: Any = None, reward: Any = None, next_obs: Any = None, terminated: Any = None,
            truncated: Any = None, **extras: Any) -> None:
        """Store one env step; see [`ReplayBuffer.add`][rlbuf.ReplayBuffer.add] (tensors travel via CPU)."""
        if isinstance(obs, Transition):
            obs = obs._replace(**{name: to_wire(getattr(obs, name)) for name in obs._fields})
        values = [to_wire(v) for v in (obs, action, reward, next_obs, terminated, truncated)]
        self._call("rlbuf_add", *values, **{name: to_wire(v) for name, v in extras.items()})

    def extend(self, td: TensorDictBase) -> None:
        """Store a TensorDict batch in TorchRL layout; see [`ReplayBuffer.extend`][rlbuf.ReplayBuffer.extend].

        Only the keys the buffer stores travel (all leaves for a handle made by hand).
        """
        keys = self._keys if self._keys is not None else list(td.keys(include_nested=True, leaves_only=True))
        columns = [(key, to_wire(value)) for key in keys if (value := td.get(key, None)) is not None]
        self._call("rlbuf_extend", columns, list(td.batch_size))

    @keywords_checked
    def sample(self, batch_size: int) -> ReplayBatch:
        """Draw ``batch_size`` transitions on the actor, delivered on [`device`][rlbuf.ray.RemoteReplayBufferHandle.device].

        Raises:
            BatchSizeError: ``batch_size`` is not a positive int.
            EmptyBufferError: nothing is stored.
        """
        return self._batch(self._call("rlbuf_sample", batch_size))

    @keywords_checked
    def sample_sequences(self, batch_size: int, length: int, *, burn_in: int = 0) -> ReplaySequenceBatch:
        """Draw sequences on the actor (see [`ReplayBuffer.sample_sequences`][rlbuf.ReplayBuffer.sample_sequences]),
        delivered on [`device`][rlbuf.ray.RemoteReplayBufferHandle.device].

        Raises:
            BatchSizeError: a size that is not a positive int, or longer than what each env holds.
            ConfigError: the remote buffer's rows are not interleaved by env (see there).
        """
        fields = from_wire(self._call("rlbuf_sample_sequences", batch_size, length, burn_in))
        return ReplaySequenceBatch(**{name: value.to(self._device) if hasattr(value, "to") else value
                                      for name, value in fields.items() if name != "extras"},
                                   extras=deliver(fields["extras"], self._device) if fields["extras"] else {})

    def sample_all(self) -> ReplayBatch:
        """Every stored row, oldest first, delivered on [`device`][rlbuf.ray.RemoteReplayBufferHandle.device]."""
        return self._batch(self._call("rlbuf_sample_all"))

    def update_priority(self, index: Any, priority: Any) -> None:
        """See [`ReplayBuffer.update_priority`][rlbuf.ReplayBuffer.update_priority]."""
        self._call("rlbuf_update_priority", to_wire(torch.as_tensor(index)), to_wire(torch.as_tensor(priority)))

    def state_dict(self, *, data: bool = True) -> dict[str, Any]:
        """The remote buffer's [`state_dict`][rlbuf.ReplayBuffer.state_dict], copied here.

        Write it on this machine with ``rlbuf.checkpoint.save_state(state, path)``; it loads
        with [`ReplayBuffer.load`][rlbuf.ReplayBuffer.load].
        """
        state: dict[str, Any] = from_wire(self._call("rlbuf_state_dict", data))
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Replace the remote buffer's contents with ``state`` (sent to the actor)."""
        self._call("rlbuf_load_state_dict", to_wire(dict(state)))

    def save(self, path: str | Path, *, data: bool = True, keep_spare: bool = False) -> None:
        """Write a checkpoint at ``path`` on the actor's node (see [`ReplayBuffer.save`][rlbuf.ReplayBuffer.save]).

        A relative ``path`` is made absolute here first. On a multi-node cluster ``path`` must
        be storage the actor's node can write, e.g. a shared file system;
        ``save_state(buffer.state_dict(), path)`` writes on this machine.
        """
        self._call("rlbuf_save", str(Path(path).absolute()), data, keep_spare)

    def _batch(self, fields: dict[str, Any]) -> ReplayBatch:
        fields = from_wire(fields)
        extras, hidden_state = fields.pop("extras"), fields.pop("hidden_state")
        fields = deliver(fields, self._device)
        return ReplayBatch(**fields, extras=deliver(extras, self._device) if extras else {},
                           hidden_state=None if hidden_state is None else hidden_state.to(self._device))


class RemoteReplayBuffer(RemoteReplayBufferHandle):
    """A [`ReplayBuffer`][rlbuf.ReplayBuffer] in a Ray actor, sampled on the learner's ``device``.

    Starts Ray (``ray.init(**ray_init_config)``) if it is not running, and shuts it down on
    [`close`][rlbuf.ray.RemoteReplayBuffer.close] if it started it. The actor holds the storage, so ``storage="memmap"``
    files and ``scratch_dir`` are on the actor's node. Give the buffer itself (or
    [`handle`][rlbuf.ray.RemoteReplayBuffer.handle]) to Ray tasks and actors that write: they get a
    [`RemoteReplayBufferHandle`][rlbuf.ray.RemoteReplayBufferHandle].

    Args:
        capacity: transitions kept; the oldest are overwritten first once full.
        obs_shape: shape of one observation.
        action_shape: shape of one action.
        device: where sampled batches are delivered on this process (e.g. ``"cuda"``).
        actor_options: Ray resources and placement of the actor (``num_cpus``, ``num_gpus``,
            ``resources``, ``scheduling_strategy`` ...); ``{"num_cpus": 1}`` by default.
        ray_init_config: arguments of ``ray.init`` when Ray is not running yet
            (e.g. ``{"address": "auto"}`` to join a cluster).
        checkpoint: build the buffer from this checkpoint (a path on the actor's node)
            instead of from the options; ``capacity`` and shapes are then ignored.
        **options: the other [`ReplayBuffer`][rlbuf.ReplayBuffer] options (``num_envs``,
            ``prioritized``, ``storage``, ``seed``, ``extra_fields``, dtypes ...), applied
            in the actor; ``storing_device`` is the actor's device.

    Raises:
        ConfigError, CheckpointError: as [`ReplayBuffer`][rlbuf.ReplayBuffer] would (the actor is
            stopped again).

    Example:
        >>> import ray                                                # doctest: +SKIP
        >>> from rlbuf.ray import RemoteReplayBuffer
        >>> ray.init(num_cpus=4)                                      # doctest: +SKIP
        >>> with RemoteReplayBuffer(100_000, obs_shape=(4,), action_shape=(), seed=0,
        ...                         action_dtype=torch.int64, device="cuda") as buffer:  # doctest: +SKIP
        ...     ray.get([collect.remote(buffer, w) for w in range(4)])  # writers get handles
        ...     batch = buffer.sample(256)                            # a ReplayBatch on cuda
        ...     buffer.save("/shared/replay")                         # on the actor's node
    """

    def __init__(
        self,
        capacity: int | None = None,
        *,
        obs_shape: Any = None,
        action_shape: Any = None,
        device: DeviceLike = "cpu",
        actor_options: Mapping[str, Any] | None = None,
        ray_init_config: Mapping[str, Any] | None = None,
        checkpoint: str | Path | None = None,
        **options: Any,
    ) -> None:
        if importlib.util.find_spec("ray") is None:
            raise ImportError('RemoteReplayBuffer needs Ray: pip install "rlbuf[ray]"')
        remote_config = dict(actor_options or {"num_cpus": 1})
        if checkpoint is None:
            options = {"capacity": capacity, "obs_shape": obs_shape, "action_shape": action_shape, **options}
        else:
            options = {"checkpoint": str(Path(checkpoint).absolute())}
        self._service: RayReplayBuffer | None = RayReplayBuffer(
            replay_buffer_cls=ReplayBufferHost,
            ray_init_config=dict(ray_init_config) if ray_init_config is not None else None,
            remote_config=remote_config, **options)
        super().__init__(self._service.client(), device)
        try:
            self._info: dict[str, Any] = self._call("rlbuf_info")
        except BaseException:
            self.close()
            raise
        self._keys = self._info["keys"]

    @classmethod
    def load(cls, path: str | Path, *, device: DeviceLike = "cpu", actor_options: Mapping[str, Any] | None = None,
             ray_init_config: Mapping[str, Any] | None = None) -> RemoteReplayBuffer:
        """A new remote buffer rebuilt from the checkpoint at ``path`` on the actor's node.

        Raises:
            CheckpointError: as [`ReplayBuffer.load`][rlbuf.ReplayBuffer.load].
        """
        return cls(device=device, actor_options=actor_options, ray_init_config=ray_init_config, checkpoint=path)

    @property
    def handle(self) -> RemoteReplayBufferHandle:
        """A picklable handle for writers: ``add``, ``extend``, ``sample`` ..., but no ``close``."""
        return RemoteReplayBufferHandle(self._live_service().client(), "cpu", self._keys)

    @property
    def torchrl(self) -> RayReplayBuffer:
        """TorchRL's ``RayReplayBuffer`` owning the actor, e.g. for ``RayCollector(replay_buffer=...)``.

        Its ``extend`` goes through rlbuf's validation; its ``sample`` returns TorchRL's layout.
        """
        return self._live_service()

    @property
    def capacity(self) -> int:
        """Rows the buffer holds at most."""
        return int(self._info["capacity"])

    @property
    def num_envs(self) -> int:
        """Rows per ``add``."""
        return int(self._info["num_envs"])

    @property
    def prioritized(self) -> bool:
        """Whether sampling follows priorities."""
        return bool(self._info["prioritized"])

    @property
    def storing_device(self) -> torch.device:
        """Where the actor stores rows (a device of the actor's node)."""
        return torch.device(self._info["storing_device"])

    @property
    def closed(self) -> bool:
        """Whether [`close`][rlbuf.ray.RemoteReplayBuffer.close] has stopped the actor."""
        return self._service is None

    def _live_service(self) -> RayReplayBuffer:
        if self._service is None:
            raise RuntimeError("RemoteReplayBuffer: closed; its actor is stopped")
        return self._service

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        self._live_service()
        return super()._call(name, *args, **kwargs)

    def close(self) -> None:
        """Stop the actor (its data is gone; save first), and Ray too if this buffer started it.

        Handles given to writers fail from then on. Calling it again does nothing.
        """
        service, self._service = self._service, None
        if service is None:
            return
        client = service.client()
        # The actor exits by itself after removing its scratch directory; one that died already
        # has nothing left to remove. TorchRL's close then kills whatever is left and, if it
        # started Ray, shuts Ray down: the wait must come before that.
        with contextlib.suppress(Exception):
            client.rlbuf_close()
        _wait_until_dead(client)
        service.close()

    def __enter__(self) -> RemoteReplayBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        if self._service is None:
            return "RemoteReplayBuffer(closed)"
        hosted = self._call("rlbuf_info")["repr"].removeprefix("ReplayBuffer(")
        return f"RemoteReplayBuffer({hosted[:-1]}, delivered_to={self._device})"


# The service's names live in their own modules (this one stays one buffer behind one actor).
from rlbuf._rate_limit import RateLimiter  # noqa: E402
from rlbuf._ray_restart import ShardRestartedWarning  # noqa: E402
from rlbuf._ray_service import ReplayService  # noqa: E402
from rlbuf._ray_writer import ServiceWriter  # noqa: E402

__all__ = ["RateLimiter", "RemoteReplayBuffer", "RemoteReplayBufferHandle", "ReplayBufferHost", "ReplayService",
           "ServiceWriter", "ShardRestartedWarning"]
