"""Rows written through ``buffer.torchrl``: read and checked by the fields' readers before TorchRL stores them.

A [`TorchRLRows`][rlbuf._torchrl_rows.TorchRLRows] holds what the checks need (the field specs,
the derived fields and the devices a tensor may be on), so it travels with ``buffer.torchrl``
to worker processes: a worker checks its writes exactly as the learner does, without the
learner's ring. Each write through TorchRL (``add``, ``extend``, ``rb[index] = td``) must
carry every input field at its TorchRL key; the derived fields (``("next", "done")``) are
computed here, and a given one must equal what they derive to. A rollout, which fills by whole
steps and never wraps, takes new rows only as whole steps that fit (``require_room``).

Example:
    >>> import torch
    >>> from tensordict import TensorDict
    >>> from rlbuf import ReplayBuffer
    >>> buf = ReplayBuffer(8, obs_shape=(2,), action_shape=())
    >>> buf.torchrl.add(TensorDict({"observation": torch.zeros(2)}, []))
    Traceback (most recent call last):
    ...
    rlbuf.errors.MissingFieldError: action: key 'action' is missing; a write through buffer.torchrl must carry every input field (observation, action, next.reward, next.observation, next.terminated, next.truncated)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase, is_tensor_collection

from rlbuf._convert import stored_positions
from rlbuf._fields import refuse_padding
from rlbuf.errors import BufferFullError, ConfigError, MissingFieldError, ShapeError
from rlbuf.spec import FieldSpec, RowReader

Derive = Callable[[Mapping[str, torch.Tensor]], torch.Tensor]


def _key_name(key: Any) -> str:
    return ".".join(key) if isinstance(key, tuple) else str(key)


class TorchRLRows:
    """The checks of rows written through TorchRL's API (see the module); picklable.

    Args:
        specs: every stored field, in order.
        derived: fields computed from the others (module-level functions, so they pickle).
        devices: the devices a tensor may be on.
        whole_steps: ``(rows of a step, capacity)`` of a buffer filled by whole steps that never wraps
            (a rollout), whose new rows must be whole steps that fit; None for any other.
    """

    def __init__(self, specs: Sequence[FieldSpec], derived: Mapping[str, Derive],
                 devices: tuple[torch.device, ...], *, whole_steps: tuple[int, int] | None = None) -> None:
        self.specs = tuple(specs)
        self.derived = dict(derived)
        self.input_specs = tuple(s for s in self.specs if s.name not in self.derived)
        self.devices = devices
        self.whole_steps = whole_steps
        self._readers: dict[tuple[FieldSpec, int], RowReader] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_readers"] = {}  # rebuilt on first use (readers hold closures)
        return state

    def reader(self, spec: FieldSpec, rows: int) -> RowReader:
        """The reader of ``rows`` rows of ``spec`` (made once, then kept)."""
        reader = self._readers.get((spec, rows))
        if reader is None:
            reader = self._readers[(spec, rows)] = RowReader(spec, rows, self.devices)
        return reader

    def _field(self, td: TensorDictBase, spec: FieldSpec, lead: tuple[int, ...]) -> torch.Tensor | None:
        """``spec``'s rows in ``td``, read and checked as ``[rows, *shape]``, or None when absent."""
        value = td.get(spec.key, None)
        if value is None:
            return None
        if not isinstance(value, torch.Tensor):
            raise ShapeError(f"{spec.name}: expected a tensor at key {spec.key!r}, got {type(value).__name__}")
        if not spec.fits_rows(value.shape, lead):
            raise ShapeError(f"{spec.name}: expected shape {(*lead, *spec.td_shape)} at key {spec.key!r}, "
                             f"got {tuple(value.shape)}")
        rows = math.prod(lead)
        return self.reader(spec, rows).tensor(value.reshape(rows, *spec.shape))

    def require_room(self, call: str, rows: int, size: int) -> None:
        """Refuse ``rows`` new rows after ``size`` stored in a buffer of ``whole_steps``: a part of a step
        would put every later row in another env's place, and rows beyond the capacity would wrap over
        the first steps. Nothing is written before.

        Raises:
            ShapeError: ``rows`` is no whole number of steps.
            BufferFullError: the steps do not fit in what is left.
        """
        if self.whole_steps is None:
            return
        step, capacity = self.whole_steps
        if rows % step:
            raise ShapeError(f"data: expected whole steps of {step} rows (one per env, env by env), got {rows} "
                             f"row(s); a rollout stores its envs' rows step by step: write whole steps")
        if size + rows > capacity:
            raise BufferFullError(f"{call}: {rows // step} step(s) do not fit; {(capacity - size) // step} of "
                                  f"{capacity // step} left (a rollout never wraps); call clear() first")

    def rows(self, data: Any, *, batched: bool) -> TensorDict:
        """The rows of ``data`` (a TensorDict of batch size ``[n, ...]``, or ``[]`` for one row when not
        ``batched``) as a TensorDict of the stored keys only, every field checked by its reader.

        Raises:
            ShapeError: ``data`` is not a TensorDict, or a field has the wrong shape.
            MissingFieldError: an input field is missing.
            DtypeError, DeviceError, NonFiniteError: a field does not fit its spec.
            ConfigError: a derived field (``done``) is given and differs from what it derives to.
        """
        if not is_tensor_collection(data):
            raise ShapeError(f"data: a write through buffer.torchrl takes a TensorDict, got {type(data).__name__}")
        lead = tuple(data.batch_size)
        if batched and not lead:
            raise ShapeError("data: expected a TensorDict with a batch dim (rows); for one row use add")
        refuse_padding(data)
        if batched and len(lead) > 1:  # TorchRL would store each [T] slice as one row, and fail part-way
            raise ShapeError(f"data: expected a TensorDict of rows (batch size [n]), got batch size {list(lead)}; "
                             f"give a collector's [num_envs, T] batch to the rlbuf buffer's extend(td), which "
                             f"reads it env by env (a Collector over a batched env built with "
                             f"replay_buffer=buffer.torchrl writes such batches: iterate the collector and call "
                             f"buffer.extend(td), or give each worker of a multi-process collector one env)")
        if not batched and lead:
            raise ShapeError(f"data: expected one row (a TensorDict of batch size []), got batch size {lead}; "
                             f"for several rows use extend")
        columns: dict[str, torch.Tensor] = {}
        for spec in self.input_specs:
            column = self._field(data, spec, lead)
            if column is None:
                keys = ", ".join(_key_name(s.key) for s in self.input_specs)
                raise MissingFieldError(f"{spec.name}: key {_key_name(spec.key)!r} is missing; a write through "
                                        f"buffer.torchrl must carry every input field ({keys})")
            columns[spec.name] = column
        by_name = {s.name: s for s in self.specs}
        for name, derive in self.derived.items():
            spec = by_name[name]
            value = derive(columns).to(spec.dtype).reshape((-1, *spec.shape))
            given = self._field(data, spec, lead)
            if given is not None:
                differs = (given.to(value.device) != value).reshape(value.shape[0], -1).any(1).nonzero()
                if differs.numel():
                    raise ConfigError(f"{name}: key {_key_name(spec.key)!r} differs from what the buffer derives "
                                      f"at row {int(differs[0])} ({_derivation(name)}); leave it out, the buffer "
                                      f"computes it")
            columns[name] = value
        out = TensorDict({}, batch_size=lead)
        for spec in self.specs:
            out.set(spec.key, columns[spec.name].reshape((*lead, *spec.td_shape)))
        return out


def _derivation(name: str) -> str:
    return "terminated | truncated" if name == "done" else "zeros until the advantages are computed"


def positions(index: Any, size: int, device: torch.device) -> tuple[Any, int | None]:
    """Positions of stored rows that ``rb[index] = td`` writes, and the rows of ``td`` (None: one row, no dim).

    Raises:
        StoredIndexError: a key, a position outside ``[0, size)``, or not integer positions.
        EmptyBufferError: nothing is stored.
    """
    if isinstance(index, slice):
        chosen = torch.arange(size)[index]
        return chosen.to(device), chosen.numel()
    if isinstance(index, int) and not isinstance(index, bool):
        return int(stored_positions(index, size, device)[0]), None
    chosen = stored_positions(index, size, device)
    return chosen, chosen.numel()
