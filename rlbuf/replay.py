"""ReplayBuffer: the off-policy buffer (DQN, SAC, TD3), uniform or prioritized.

Example:
    >>> import torch
    >>> from rlbuf import ReplayBuffer
    >>> buf = ReplayBuffer(1000, obs_shape=(4,), action_shape=(), action_dtype=torch.int64,
    ...                    num_envs=2, seed=0)
    >>> for _ in range(10):
    ...     buf.add(obs=torch.randn(2, 4), action=torch.tensor([0, 1]), reward=torch.ones(2),
    ...             next_obs=torch.randn(2, 4), terminated=torch.tensor([False, True]),
    ...             truncated=torch.tensor([False, False]))
    >>> len(buf)
    20
    >>> batch = buf.sample(8)
    >>> target = batch.reward + 0.99 * (~batch.terminated) * torch.zeros(8)  # [8], no broadcast
    >>> target.shape
    torch.Size([8])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from tensordict import TensorDictBase
from torchrl.data import RandomSampler
from torchrl.data.replay_buffers.samplers import Sampler

from rlbuf._base import RingBuffer, as_shape, done_of, extra_specs
from rlbuf._core import check_extras
from rlbuf._sumtree import SumTreeSampler
from rlbuf.batches import ReplayBatch
from rlbuf.errors import ConfigError, MissingFieldError, PriorityError, ShapeError
from rlbuf.spec import ExtraFields, FieldSpec, positive_int
from rlbuf.stats import EpisodeStats
from rlbuf.storage import DeviceLike, StorageKind

_FIXED = ("obs", "action", "reward", "next_obs", "terminated", "truncated")
_PER_ALPHA, _PER_BETA = 0.6, 0.4


class Transition(NamedTuple):
    """One env step of ``num_envs`` rows, for ``ReplayBuffer.add(transition)``.

    Example:
        >>> import torch
        >>> step = Transition(torch.zeros(3), torch.zeros(1), 1.0, torch.ones(3), False)
        >>> step.truncated is None          # no time limit hit: False for every env
        True
    """

    obs: Any
    action: Any
    reward: Any
    next_obs: Any
    terminated: Any
    truncated: Any = None
    extras: Mapping[str, Any] | None = None


def replay_specs(obs_shape: tuple[int, ...], action_shape: tuple[int, ...], obs_dtype: torch.dtype,
                 action_dtype: torch.dtype, extra_fields: ExtraFields | None) -> tuple[FieldSpec, ...]:
    """The stored fields of a replay buffer, in TorchRL keys.

    Example:
        >>> [s.describe() for s in replay_specs((3,), (1,), torch.float32, torch.float32, None)][:3]
        ['obs: (3,) float32', 'action: (1,) float32', 'reward: () float32']
    """
    specs = [
        FieldSpec("obs", "observation", obs_shape, obs_dtype),
        FieldSpec("action", "action", action_shape, action_dtype),
        FieldSpec("reward", ("next", "reward"), (), torch.float32, finite=True, trailing_one=True),
        FieldSpec("next_obs", ("next", "observation"), obs_shape, obs_dtype),
        FieldSpec("terminated", ("next", "terminated"), (), torch.bool, trailing_one=True),
        FieldSpec("truncated", ("next", "truncated"), (), torch.bool, trailing_one=True),
        FieldSpec("done", ("next", "done"), (), torch.bool, trailing_one=True),
    ]
    reserved = {s.name for s in specs} | {"index", "weight", "extras", "observation", "next"}
    return (*specs, *extra_specs(extra_fields, reserved))


class ReplayBuffer(RingBuffer[ReplayBatch]):
    """A ring buffer of transitions for off-policy RL, backed by TorchRL.

    Args:
        capacity: transitions kept; the oldest are overwritten first once full.
        obs_shape: shape of one observation.
        action_shape: shape of one action (``()`` for a discrete action index).
        num_envs: rows per [`add`][rlbuf.ReplayBuffer.add] (one per vectorised env).
        prioritized: prioritized experience replay (sum tree), with ``alpha`` and ``beta``.
        alpha: priority exponent (default 0.6); only with ``prioritized=True``.
        beta: importance-sampling exponent (default 0.4); only with ``prioritized=True``.
        storage: ``"memory"`` (RAM or GPU) or ``"memmap"`` (disk files, larger than RAM).
        scratch_dir: directory for memmap files (a temporary one, removed on close, by default).
        storing_device: where transitions are stored.
        device: where sampled batches are delivered (defaults to ``storing_device``).
        seed: seeds the buffer's own generator; sampling never touches the global RNG.
        extra_fields: ``{"name": (shape, dtype)}`` stored with every transition.
        obs_dtype: stored observation dtype (``torch.uint8`` for images: 1 byte per value).
        action_dtype: stored action dtype.
        stats: an [`EpisodeStats`][rlbuf.EpisodeStats] fed with every step added (returns, lengths).

    Raises:
        ConfigError: contradictory or invalid options.

    Example:
        >>> buf = ReplayBuffer(100, obs_shape=(84, 84, 4), action_shape=(), obs_dtype=torch.uint8,
        ...                    action_dtype=torch.int64, seed=0)
        >>> buf
        ReplayBuffer(size=0/100, storage=memory, storing_device=cpu, device=cpu, prioritized=False, fields=[obs: (84, 84, 4) uint8, action: () int64, reward: () float32, next_obs: (84, 84, 4) uint8, terminated: () bool, truncated: () bool, done: () bool])
    """

    def __init__(
        self,
        capacity: int,
        *,
        obs_shape: Sequence[int] | int,
        action_shape: Sequence[int] | int,
        num_envs: int = 1,
        prioritized: bool = False,
        alpha: float | None = None,
        beta: float | None = None,
        storage: StorageKind = "memory",
        scratch_dir: str | Path | None = None,
        storing_device: DeviceLike = "cpu",
        device: DeviceLike | None = None,
        seed: int | None = None,
        extra_fields: ExtraFields | None = None,
        obs_dtype: torch.dtype = torch.float32,
        action_dtype: torch.dtype = torch.float32,
        stats: EpisodeStats | None = None,
    ) -> None:
        self._record_options(locals())
        positive_int("num_envs", num_envs)
        self._attach_stats(stats, num_envs)
        if not prioritized and (alpha is not None or beta is not None):
            given = ", ".join(f"{k}={v}" for k, v in (("alpha", alpha), ("beta", beta)) if v is not None)
            raise ConfigError(f"{given}: only used by prioritized replay; pass prioritized=True, or leave them out "
                              f"for uniform sampling")
        alpha, beta = _PER_ALPHA if alpha is None else alpha, _PER_BETA if beta is None else beta
        if prioritized and not (alpha >= 0 and beta >= 0):
            raise ConfigError(f"alpha, beta: expected non-negative numbers, got alpha={alpha}, beta={beta}")
        self._prioritized = prioritized
        specs = replay_specs(as_shape(obs_shape, "obs_shape"), as_shape(action_shape, "action_shape"),
                             obs_dtype, action_dtype, extra_fields)
        self._extra_specs = {s.name: s for s in specs[len(_FIXED) + 1:]}
        sampler: Sampler = (SumTreeSampler(positive_int("capacity", capacity), alpha=alpha, beta=beta)
                            if prioritized else RandomSampler())
        self._no_truncation = np.zeros(num_envs, np.bool_)
        self._setup(specs, capacity, sampler, num_envs=num_envs, storage=storage, scratch_dir=scratch_dir,
                    storing_device=storing_device, device=device, seed=seed, derived={"done": done_of})

    @classmethod
    def _options_from_checkpoint(cls, options: dict[str, Any]) -> dict[str, Any]:
        # rlbuf 0.1.0 recorded alpha=0.6, beta=0.4 for uniform buffers too; they are refused now.
        if not options.get("prioritized", False):
            options = {**options, "alpha": None, "beta": None}
        return options

    @property
    def prioritized(self) -> bool:
        """Whether sampling follows priorities."""
        return self._prioritized

    @property
    def beta(self) -> float:
        """The importance-sampling exponent; anneal it towards 1 by setting it between samples.

        Raises:
            PriorityError: the buffer is not prioritized.

        Example:
            >>> buf = ReplayBuffer(10, obs_shape=(1,), action_shape=(), prioritized=True, beta=0.4)
            >>> buf.beta = 0.7
            >>> buf.beta
            0.7
        """
        return float(self._sum_tree().beta)

    @beta.setter
    def beta(self, value: float) -> None:
        self._sum_tree().beta = value

    def _sum_tree(self) -> SumTreeSampler:
        sampler = self._ring.rb._sampler
        if not isinstance(sampler, SumTreeSampler):
            raise PriorityError("beta: this buffer is not prioritized (build it with prioritized=True)")
        return sampler

    def _repr_options(self) -> str:
        return f", prioritized={self._prioritized}"

    # -- writing -----------------------------------------------------------------------------
    def add(
        self,
        obs: Any,
        action: Any = None,
        reward: Any = None,
        next_obs: Any = None,
        terminated: Any = None,
        truncated: Any = None,
        **extras: Any,
    ) -> None:
        """Store one env step: ``num_envs`` transitions (the env dim may be omitted if 1).

        Accepts torch tensors (CPU or the storing device), numpy arrays and, for a single
        env, Python numbers. Values are converted to the stored dtype when the conversion
        stays within its kind (float64 → float32 is fine, float → uint8 is refused).

        Args:
            obs: observations ``[num_envs, *obs_shape]``; or a [`Transition`][rlbuf.Transition].
            action: actions ``[num_envs, *action_shape]``.
            reward: rewards ``[num_envs]``, finite.
            next_obs: observations after the step (the final observation for a truncated
                episode, not the reset one).
            terminated: the MDP ended the episode (no bootstrap) ``[num_envs]`` bool.
            truncated: a time limit cut the episode ``[num_envs]`` bool; ``None`` = False.
            **extras: one value per declared extra field.

        Raises:
            ShapeError, DtypeError, DeviceError, NonFiniteError, MissingFieldError: before
                anything is stored.

        Example:
            >>> buf = ReplayBuffer(10, obs_shape=(3,), action_shape=(), num_envs=2, seed=0)
            >>> buf.add(obs=torch.zeros(2, 3), action=torch.zeros(2), reward=torch.ones(2),
            ...         next_obs=torch.zeros(2, 3), terminated=torch.tensor([False, True]))
            >>> len(buf)
            2
        """
        if isinstance(obs, Transition):
            if any(v is not None for v in (action, reward, next_obs, terminated, truncated)) or extras:
                raise ConfigError("add: pass either a Transition or the fields, not both")
            obs, action, reward, next_obs, terminated, truncated, given = obs
            extras = dict(given or {})
        if truncated is None:
            truncated = False if self._num_envs == 1 else self._no_truncation
        if len(extras) != len(self._extra_specs) or (extras and extras.keys() != self._extra_specs.keys()):
            check_extras(self._extra_specs, extras)
        if extras:
            values = (obs, action, reward, next_obs, terminated, truncated, *(extras[n] for n in self._extra_specs))
        else:
            values = (obs, action, reward, next_obs, terminated, truncated)
        self._ring.add(values, self._num_envs)
        if self._stats is not None:
            self._stats.update(reward, terminated, truncated)

    def extend(self, td: TensorDictBase) -> None:
        """Store a TensorDict in TorchRL layout, e.g. a collector's ``[num_envs, T]`` batch.

        Reads ``"observation"``, ``"action"``, ``("next", "observation")``,
        ``("next", "reward")``, ``("next", "terminated")`` and ``("next", "truncated")``
        (derived as ``done & ~terminated`` when absent) plus the extra fields; every batch
        dim is flattened, row-major. Other keys are ignored.

        Raises:
            MissingFieldError, ShapeError, DtypeError, DeviceError, NonFiniteError: before
                anything is stored.

        Example:
            >>> from tensordict import TensorDict
            >>> td = TensorDict({"observation": torch.zeros(2, 5, 3), "action": torch.zeros(2, 5),
            ...                  "next": {"observation": torch.zeros(2, 5, 3), "reward": torch.ones(2, 5, 1),
            ...                           "terminated": torch.zeros(2, 5, 1, dtype=torch.bool)}}, batch_size=[2, 5])
            >>> buf = ReplayBuffer(100, obs_shape=(3,), action_shape=(), seed=0)
            >>> buf.extend(td)
            >>> len(buf)
            10
        """
        rows = int(td.batch_size.numel())
        lead = tuple(td.batch_size)
        tensors: dict[str, torch.Tensor] = {}
        for spec in self._ring.specs:
            if spec.name in ("truncated", "done"):
                continue
            tensors[spec.name] = _read_td(td, spec, lead)
        tensors["truncated"] = _truncated_from(td, lead, tensors["terminated"])
        if self._stats is not None and not (len(lead) == 2 and lead[0] == self._num_envs):
            raise ShapeError(f"td: a buffer with stats needs batch size ({self._num_envs}, T) to tell envs "
                             f"apart, got {lead}")
        for name, value in tensors.items():
            tensors[name] = value.reshape(rows, *self._ring.by_name[name].shape)
        self._ring.write_tensors(tensors, rows)
        if self._stats is not None:
            self._feed_stats_from_rollout(*(tensors[n].view(lead) for n in ("reward", "terminated", "truncated")))

    # -- reading -----------------------------------------------------------------------------
    def sample(self, batch_size: int) -> ReplayBatch:
        """Draw ``batch_size`` transitions (with replacement), delivered on ``device``.

        Uniform, or proportional to ``priority ** alpha`` with importance weights when
        prioritized. Uses the buffer's own generator: identically seeded buffers fed the
        same data draw the same batches.

        Raises:
            BatchSizeError: ``batch_size`` is not a positive int.
            EmptyBufferError: nothing is stored.

        Example:
            >>> buf = ReplayBuffer(10, obs_shape=(3,), action_shape=(), seed=0)
            >>> buf.add(torch.zeros(3), 0.0, 1.0, torch.ones(3), False)
            >>> batch = buf.sample(4)
            >>> batch.obs.shape, batch.reward.tolist(), batch.weight.tolist()
            (torch.Size([4, 3]), [1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0])
        """
        ring = self._ring
        with ring.lock:  # index, weights and rows from one consistent state, whatever other threads add
            batch_size = ring.require_rows(batch_size, without_replacement=False)
            ring.flush()
            if self._prioritized:
                index, info = ring.rb._sampler.sample(ring.rb._storage, batch_size)
                weight = info["priority_weight"].to(torch.float32)
            else:
                index = torch.randint(0, len(ring), (batch_size,), generator=ring.generator,
                                      device=self._storing_device)
                weight = None
            return self._batch(index, weight)

    def _make_batch(self, columns: dict[str, torch.Tensor]) -> ReplayBatch:
        weight = columns.get("weight")
        if weight is None:
            weight = torch.ones(columns["index"].shape[0], device=columns["index"].device)
        extras = {name: columns[name] for name in self._extra_specs}
        return ReplayBatch(columns["obs"], columns["action"], columns["reward"], columns["next_obs"],
                           columns["terminated"], columns["truncated"], columns["done"],
                           columns["index"], weight, extras)

    # -- priorities --------------------------------------------------------------------------
    def update_priority(self, index: Any, priority: Any) -> None:
        """Set the priorities of the transitions at ``index`` (e.g. ``|TD error|``).

        Raises:
            PriorityError: the buffer is not prioritized, lengths differ, or a priority is
                negative or not finite.
            StoredIndexError: a position outside what is stored.

        Example:
            >>> buf = ReplayBuffer(10, obs_shape=(1,), action_shape=(), prioritized=True, seed=0)
            >>> for _ in range(4):
            ...     buf.add(torch.zeros(1), 0.0, 0.0, torch.zeros(1), False)
            >>> buf.update_priority([0, 1, 2, 3], [0.0, 0.0, 1.0, 0.0])
            >>> buf.sample(5).index.tolist()
            [2, 2, 2, 2, 2]
        """
        if not self._prioritized:
            raise PriorityError("update_priority: this buffer is not prioritized (build it with prioritized=True)")
        positions = self._ring.as_index(index)
        values = torch.as_tensor(priority).detach().reshape(-1).to("cpu", torch.float64)
        if values.numel() != positions.numel():
            raise PriorityError(f"priority: expected {positions.numel()} values (one per index), got {values.numel()}")
        if not bool(torch.isfinite(values).all()) or bool((values < 0).any()):
            raise PriorityError("priority: expected finite, non-negative values")
        self._ring.rb.update_priority(positions, values)


def _read_td(td: TensorDictBase, spec: FieldSpec, lead: tuple[int, ...]) -> torch.Tensor:
    value: torch.Tensor | None = td.get(spec.key, None)
    if value is None:
        raise MissingFieldError(f"{spec.name}: key {spec.key!r} not found in the tensordict")
    if not spec.fits_rows(value.shape, lead):
        raise ShapeError(f"{spec.name}: expected shape {(*lead, *spec.td_shape)} at key {spec.key!r}, "
                         f"got {tuple(value.shape)}")
    return value


def _flag(td: TensorDictBase, key: tuple[str, str], lead: tuple[int, ...]) -> torch.Tensor | None:
    """A done-type flag at ``key`` as a ``[*lead]`` tensor (TorchRL's trailing 1 optional), or None."""
    value: torch.Tensor | None = td.get(key, None)
    if value is None:
        return None
    if tuple(value.shape) not in (lead, (*lead, 1)):
        raise ShapeError(f"{key[1]}: expected shape {(*lead, 1)} at key {key!r}, got {tuple(value.shape)}")
    return value.reshape(lead)


def _truncated_from(td: TensorDictBase, lead: tuple[int, ...], terminated: torch.Tensor) -> torch.Tensor:
    truncated = _flag(td, ("next", "truncated"), lead)
    if truncated is not None:
        return truncated
    done = _flag(td, ("next", "done"), lead)
    if done is None:
        return torch.zeros(lead, dtype=torch.bool, device=terminated.device)
    return done.to(torch.bool) & ~terminated.reshape(lead).to(torch.bool)
