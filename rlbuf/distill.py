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

import numpy as np
import torch
from tensordict import TensorDictBase
from torchrl.data import RandomSampler

from rlbuf._bounds import Bounds
from rlbuf._buffer import RingBuffer, refuse_foreign_options
from rlbuf._convert import REQUIRED, as_num_envs, require, tensor_of
from rlbuf._fields import extra_specs, refuse_padding
from rlbuf._keywords import check_extras, keywords_checked
from rlbuf._obs import ObsDtype, ObsShape, as_shape, leaf_names, read_td, record_layout
from rlbuf.batches import DistillationBatch
from rlbuf.errors import MissingFieldError, ShapeError
from rlbuf.spaces import extra_field_dtypes, resolve_action_range, resolve_fields
from rlbuf.spec import ExtraFields, FieldSpec, as_array, as_tensordict
from rlbuf.storage import DeviceLike, StorageKind


def _shape(value: Any) -> tuple[int, ...] | None:
    """The shape of an add's value, or ``None`` where it has none (ragged: the field's reader refuses it)."""
    if isinstance(value, torch.Tensor | np.ndarray):
        return tuple(value.shape)
    try:
        return tuple(np.shape(value))
    except ValueError:
        return None


def _rows_of(shape: tuple[int, ...], row_shape: tuple[int, ...]) -> int | None:
    """Rows in a value of ``shape`` of a field of ``row_shape`` (one row may omit its batch dim), or ``None``."""
    if shape == row_shape:
        return 1
    return shape[0] if len(shape) == len(row_shape) + 1 and shape[1:] == row_shape else None


class DistillationBuffer(RingBuffer[DistillationBatch]):
    """A ring buffer of (observation, expert action, extras) rows, backed by TorchRL.

    Args:
        capacity: rows kept; the oldest are overwritten first once full.
        obs_shape: shape of one observation, or a (nested) mapping of shapes, a TorchRL
            ``Composite`` or a gymnasium ``Dict`` space for dict observations.
        action_shape: shape of one expert action (``()`` for a discrete index).
        num_envs: the usual rows per [`add`][rlbuf.DistillationBuffer.add] (they take the fastest
            path); batches of any other size are stored too.
        storage: ``"memory"`` or ``"memmap"``.
        scratch_dir: directory for memmap files.
        storing_device: where rows are stored.
        device: where batches are delivered (defaults to ``storing_device``).
        seed: seeds the buffer's generator; the global RNG is untouched.
        extra_fields: ``{"name": (shape, dtype)}``, e.g. ``expert_logits``, ``expert_value``,
            or privileged observations for teacher-student setups.
        observation_space: instead of ``obs_shape``/``obs_dtype``: a gymnasium space
            (``envs.single_observation_space``) or a TorchRL spec (see [`rlbuf.spaces`][rlbuf.spaces]).
        action_space: instead of ``action_shape``/``action_dtype``: ``envs.single_action_space``
            or a TorchRL spec (a ``Discrete`` space stores an ``int64`` index).
        obs_dtype: stored observation dtype, or a mapping by key for dict observations (default:
            the space's or spec's, else float32).
        action_dtype: stored expert-action dtype, a torch dtype or its name (``"int64"``); default: the space's, else float32.
        action_range: ``(low, high)``, the expert actions allowed (ints, or one per element), refused
            outside with an ``OutOfRangeError``; default: a discrete ``action_space``'s range, else none.

    Raises:
        ConfigError: invalid options.

    Example:
        >>> DistillationBuffer(100, obs_shape=(3,), action_shape=(), action_dtype=torch.int64)
        DistillationBuffer(size=0/100, storage=memory, storing_device=cpu, device=cpu, fields=[obs: (3,) float32, expert_action: () int64])
    """

    _batch_type = DistillationBatch

    def __init__(
        self,
        capacity: int = REQUIRED,
        *positional: Any,
        obs_shape: ObsShape | None = None,
        action_shape: Sequence[int] | int | None = None,
        num_envs: int = 1,
        storage: StorageKind = "memory",
        scratch_dir: str | Path | None = None,
        storing_device: DeviceLike = "cpu",
        device: DeviceLike | None = None,
        seed: int | None = None,
        extra_fields: ExtraFields | None = None,
        observation_space: Any = None,
        action_space: Any = None,
        obs_dtype: ObsDtype | None = None,
        action_dtype: torch.dtype | None = None,
        action_range: Sequence[Any] | None = None,
        **foreign: Any,
    ) -> None:
        refuse_foreign_options(DistillationBuffer.__init__, foreign, positional)
        require("DistillationBuffer(100_000, observation_space=envs.single_observation_space, action_space=envs.single_action_space)", capacity=capacity)
        extra_fields = extra_field_dtypes(extra_fields)
        obs_shape, obs_dtype, action_shape, action_dtype = resolve_fields(
            observation_space, obs_shape, obs_dtype, action_space, action_shape, action_dtype, num_envs=num_envs)
        action_range = resolve_action_range(action_space, action_range, action_shape)
        self._record_options(locals())
        self._obs = record_layout(self._options, obs_shape, obs_dtype)
        as_num_envs(num_envs)
        fixed = [*self._obs.specs("obs", "observation"),
                 FieldSpec("expert_action", "expert_action", as_shape(action_shape, "action_shape"), action_dtype,
                           bounds=Bounds.parse(action_range, as_shape(action_shape, "action_shape")))]
        extras = extra_specs(extra_fields, fixed)
        self._extra_specs = {s.name: s for s in extras}
        self._setup((*fixed, *extras), capacity, RandomSampler(), num_envs=num_envs, storage=storage,
                    scratch_dir=scratch_dir, storing_device=storing_device, device=device, seed=seed)

    def add(self, obs: Any = None, expert_action: Any = None, **extras: Any) -> None:
        """Store a batch of rows of any size: observations and the expert's actions (plus extras).

        The batch is whatever the envs gave: ``[B, *obs_shape]`` for any ``B``, or one row
        without a batch dim. Adds of ``num_envs`` rows take the fastest path.

        Args:
            obs: observations ``[B, *obs_shape]``, or ``obs_shape`` for one row.
            expert_action: the expert's actions ``[B, *action_shape]``.
            **extras: one value per declared extra field, ``B`` rows each.

        Raises:
            ShapeError, DtypeError, DeviceError, MissingFieldError: before anything is stored.

        Example:
            >>> buf = DistillationBuffer(100, obs_shape=(3,), action_shape=(), action_dtype=torch.int64, num_envs=16)
            >>> buf.add(torch.zeros(16, 3), torch.zeros(16, dtype=torch.int64))
            >>> buf.add(torch.zeros(3, 3), torch.tensor([0, 1, 2]))
            >>> buf.add(torch.zeros(3), 1)                      # one row, no batch dim
            >>> len(buf), buf.sample_all().expert_action[-4:].tolist()
            (20, [0, 1, 2, 1])
        """
        self._require_writable("add")
        check_extras(self._extra_specs, extras)  # first: SB3's observations=, actions= get the rlbuf names
        missing = [name for name, value in (("obs", obs), ("expert_action", expert_action)) if value is None]
        if missing:
            raise MissingFieldError(f"{', '.join(missing)}: required with every row (add(obs, expert_action))")
        names = leaf_names("obs", self._obs)
        leaves = self._obs.split("obs", obs) if self._obs.structured else [obs]
        leaves = [leaf if isinstance(leaf, torch.Tensor) else tensor_of(np.ascontiguousarray(as_array(name, leaf)))
                  for name, leaf in zip(names, leaves, strict=True)]  # checked: numbers, not ragged
        values = {**dict(zip(names, leaves, strict=True)), "expert_action": expert_action, **extras}
        ordered = tuple(values[spec.name] for spec in self._ring.input_specs)
        # The rows of this call, from the first observation leaf (one row may omit its batch dim).
        obs_shape, given = self._ring.by_name[names[0]].shape, tuple(leaves[0].shape)
        rows = _rows_of(given, obs_shape)
        if rows is None:
            raise ShapeError(f"{names[0]}: expected shape (B, {', '.join(map(str, obs_shape))}) for B rows, or "
                             f"{obs_shape} for one row, got {given}")
        for name, value in values.items():  # one row of each field per observation row
            shape = _shape(value)
            if shape is not None and (count := _rows_of(shape, self._ring.by_name[name].shape)) not in (None, rows):
                raise ShapeError(f"{name}: {count} row{'s' * (count != 1)} (shape {shape}) where {names[0]} has {rows} (shape {given}): "
                                 f"one {name} per observation row")
        if rows == self._num_envs:
            self._ring.add(ordered, rows)
            return
        tensors = self._ring.read_tensors(self._ring.input_specs, ordered, rows)
        if rows:
            self._ring.write_checked(tensors, rows)

    def extend(self, td: TensorDictBase) -> None:
        """Store a TensorDict of any batch shape (flattened row-major): ``"observation"``,
        ``"expert_action"`` and the extra fields by name; other keys are ignored.

        Raises:
            MissingFieldError, ShapeError, DtypeError, DeviceError: before anything is stored.

        Example:
            >>> from tensordict import TensorDict
            >>> buf = DistillationBuffer(100, obs_shape=(3,), action_shape=(2,))
            >>> buf.extend(TensorDict({"observation": torch.zeros(4, 5, 3), "expert_action": torch.ones(4, 5, 2)},
            ...                       batch_size=[4, 5]))
            >>> len(buf)
            20
        """
        self._require_writable("extend")
        td = as_tensordict(td)
        refuse_padding(td)
        rows = int(td.batch_size.numel())
        lead = tuple(td.batch_size)
        tensors: dict[str, torch.Tensor] = {}
        for spec in self._ring.input_specs:
            tensors[spec.name] = read_td(td, spec, lead).reshape(rows, *spec.shape)
        self._ring.write_tensors(tensors, rows)

    @keywords_checked
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
            index = torch.randint(0, len(ring), (batch_size,), generator=ring.generator, device=self._storing_device)
            return self._batch(index)

    def _make_batch(self, columns: dict[str, torch.Tensor]) -> DistillationBatch:
        return DistillationBatch(self._obs.assemble("obs", columns), columns["expert_action"], columns["index"],
                                 {name: columns[name] for name in self._extra_specs})
