"""DistillationBuffer: observations with an expert's actions, for policy distillation and DAgger.

DAgger aggregation over rounds is continued [`DistillationBuffer.add`][rlbuf.DistillationBuffer.add]: each round the
student acts, the expert labels the visited observations, and the labels join the buffer.

Example:
    >>> import torch
    >>> from rlbuf import DistillationBuffer
    >>> teacher = torch.nn.Linear(4, 2)
    >>> student = torch.nn.Linear(4, 2)
    >>> buf = DistillationBuffer(10_000, obs_shape=(4,), action_shape=(2,), num_envs=8,
    ...                          extra_fields={"expert_logits": ((2,), torch.float32)}, seed=0)
    >>> for dagger_round in range(3):
    ...     obs = torch.randn(8, 4)                      # states the *student* visited
    ...     with torch.no_grad():
    ...         logits = teacher(obs)
    ...     buf.add(obs, logits.softmax(-1), expert_logits=logits)
    >>> obs, expert_action = buf.sample(16)
    >>> loss = torch.nn.functional.mse_loss(student(obs).softmax(-1), expert_action)
    >>> len(buf)
    24
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torchrl.data import RandomSampler

from rlbuf._base import RingBuffer, as_shape, extra_specs
from rlbuf._core import check_extras
from rlbuf.batches import DistillationBatch
from rlbuf.spec import ExtraFields, FieldSpec
from rlbuf.storage import DeviceLike, StorageKind


class DistillationBuffer(RingBuffer[DistillationBatch]):
    """A ring buffer of (observation, expert action, extras) rows, backed by TorchRL.

    Args:
        capacity: rows kept; the oldest are overwritten first once full.
        obs_shape: shape of one observation.
        action_shape: shape of one expert action (``()`` for a discrete index).
        num_envs: rows per [`add`][rlbuf.DistillationBuffer.add].
        storage: ``"memory"`` or ``"memmap"``.
        scratch_dir: directory for memmap files.
        storing_device: where rows are stored.
        device: where batches are delivered (defaults to ``storing_device``).
        seed: seeds the buffer's generator; the global RNG is untouched.
        extra_fields: ``{"name": (shape, dtype)}``, e.g. ``expert_logits``, ``expert_value``,
            or privileged observations for teacher-student setups.
        obs_dtype: stored observation dtype.
        action_dtype: stored expert-action dtype.

    Raises:
        ConfigError: invalid options.

    Example:
        >>> DistillationBuffer(100, obs_shape=(3,), action_shape=(), action_dtype=torch.int64)
        DistillationBuffer(size=0/100, storage=memory, storing_device=cpu, device=cpu, fields=[obs: (3,) float32, expert_action: () int64])
    """

    def __init__(
        self,
        capacity: int,
        *,
        obs_shape: Sequence[int] | int,
        action_shape: Sequence[int] | int,
        num_envs: int = 1,
        storage: StorageKind = "memory",
        scratch_dir: str | Path | None = None,
        storing_device: DeviceLike = "cpu",
        device: DeviceLike | None = None,
        seed: int | None = None,
        extra_fields: ExtraFields | None = None,
        obs_dtype: torch.dtype = torch.float32,
        action_dtype: torch.dtype = torch.float32,
    ) -> None:
        self._record_options(locals())
        fixed = [FieldSpec("obs", "observation", as_shape(obs_shape, "obs_shape"), obs_dtype),
                 FieldSpec("expert_action", "expert_action", as_shape(action_shape, "action_shape"), action_dtype)]
        extras = extra_specs(extra_fields, {"obs", "expert_action", "index", "extras", "observation"})
        self._extra_specs = {s.name: s for s in extras}
        self._setup((*fixed, *extras), capacity, RandomSampler(), num_envs=num_envs, storage=storage,
                    scratch_dir=scratch_dir, storing_device=storing_device, device=device, seed=seed)

    def add(self, obs: Any, expert_action: Any, **extras: Any) -> None:
        """Store ``num_envs`` rows: observations and the expert's actions (plus extras).

        Args:
            obs: observations ``[num_envs, *obs_shape]`` (env dim optional when 1).
            expert_action: the expert's actions ``[num_envs, *action_shape]``.
            **extras: one value per declared extra field.

        Raises:
            ShapeError, DtypeError, DeviceError, MissingFieldError: before anything is stored.

        Example:
            >>> buf = DistillationBuffer(10, obs_shape=(3,), action_shape=(), action_dtype=torch.int64, num_envs=2)
            >>> buf.add(torch.zeros(2, 3), torch.tensor([0, 1]))
            >>> len(buf), buf.sample_all().expert_action.tolist()
            (2, [0, 1])
        """
        check_extras(self._extra_specs, extras)
        values = {"obs": obs, "expert_action": expert_action, **extras}
        self._ring.add(tuple(values[spec.name] for spec in self._ring.input_specs), self._num_envs)

    def sample(self, batch_size: int) -> DistillationBatch:
        """Draw ``batch_size`` rows uniformly (with replacement), delivered on ``device``.

        Raises:
            BatchSizeError: ``batch_size`` is not a positive int.
            EmptyBufferError: nothing is stored.

        Example:
            >>> buf = DistillationBuffer(10, obs_shape=(3,), action_shape=(2,), seed=0)
            >>> buf.add(torch.zeros(3), torch.ones(2))
            >>> obs, expert_action = buf.sample(4)
            >>> obs.shape, expert_action.shape
            (torch.Size([4, 3]), torch.Size([4, 2]))
        """
        ring = self._ring
        with ring.lock:
            batch_size = ring.require_rows(batch_size, without_replacement=False)
            ring.flush()
            index = torch.randint(0, len(ring), (batch_size,), generator=ring.generator, device=self._storing_device)
            return self._batch(index)

    def _make_batch(self, columns: dict[str, torch.Tensor]) -> DistillationBatch:
        return DistillationBatch(columns["obs"], columns["expert_action"], columns["index"],
                                 {name: columns[name] for name in self._extra_specs})
