"""Prioritized experience replay on a vectorised array sum tree, for TorchRL's composable buffers.

torchrl 0.14.1's ``PrioritizedSampler`` needs the C++ segment trees of ``torchrl._torchrl``, which
fail to load against torch 2.13. ``SumTreeSampler`` is a drop-in replacement written in
torch/numpy: it subclasses ``PrioritizedSampler`` (without running its constructor) so that every
``isinstance(sampler, PrioritizedSampler)`` branch of TorchRL (``update_tensordict_priority``, new
items at the max priority through ``mark_update``, trainers) treats it as TorchRL's own, and it
keeps TorchRL's semantics: leaf value ``(p + eps) ** alpha``, new items at the largest raw priority
seen so far, info key ``"priority_weight"`` holding ``(p_i / p_min) ** -beta``.

Example:
    >>> import torch
    >>> from tensordict import TensorDict
    >>> from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
    >>> from rlbuf._sumtree import SumTreeSampler
    >>> rb = TensorDictReplayBuffer(
    ...     storage=LazyTensorStorage(8),
    ...     sampler=SumTreeSampler(8, alpha=1.0, beta=1.0),
    ...     batch_size=4,
    ...     generator=torch.Generator().manual_seed(0),
    ... )
    >>> index = rb.extend(TensorDict(obs=torch.arange(4.0), batch_size=[4]))
    >>> rb.update_priority(index, torch.tensor([0.0, 0.0, 0.0, 10.0]))
    >>> batch = rb.sample()
    >>> batch["index"]
    tensor([3, 3, 3, 3])
    >>> batch["priority_weight"]
    tensor([1.0000e-09, 1.0000e-09, 1.0000e-09, 1.0000e-09])
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torchrl.data.replay_buffers.samplers import PrioritizedSampler

from rlbuf._sumtree_arrays import (
    check_exponent,
    checked_leaf_values,
    descend,
    flattened_index,
    importance_weights,
    new_tree,
    prefix_sum_min,
    rebuild,
    smallest_where,
    write_leaves,
)
from rlbuf._torchrl import sampler_generator
from rlbuf.errors import (
    BatchSizeError,
    CheckpointError,
    ConfigError,
    EmptyBufferError,
    PriorityError,
    StoredIndexError,
)

_FORMAT_VERSION = 1
_METADATA_FILE = "sampler_metadata.json"
_SCALARS = ("alpha", "beta", "eps", "max_priority", "max_priority_index")
_SUM_FILE = "sum_leaves.npy"
_MIN_FILE = "min_leaves.npy"
_DTYPES: dict[torch.dtype, type[np.floating[Any]]] = {
    torch.float32: np.float32,
    torch.float64: np.float64,
}

_Int64Array = npt.NDArray[np.int64]
_FloatArray = npt.NDArray[np.floating[Any]]


class SumTreeSampler(PrioritizedSampler):  # type: ignore[misc]
    """Prioritized sampler over a vectorised sum/min tree, a drop-in for TorchRL's ``PrioritizedSampler``.

    Item ``i`` is drawn with probability ``P(i) = q_i / sum_j q_j`` where ``q_i = (p_i + eps) ** alpha``
    and ``p_i`` is its raw priority; its importance weight is ``(N * P(i)) ** -beta`` divided by the
    largest such weight among the stored items, i.e. ``(q_i / min_j q_j) ** -beta`` (TorchRL's
    normalisation). Items get the largest raw priority seen so far when they are written.

    ``drawable`` (``None``: every stored item) narrows the items the weights are normalised over to
    those its caller keeps: a compact replay layout draws complete transitions alone, so ``min_j``
    runs over those, as in a buffer storing only complete transitions.

    The priorities live in one array sum/min tree (see [`rlbuf._sumtree_arrays`][rlbuf._sumtree_arrays]),
    updated and walked with numpy kernels on its memory (2-3x faster than torch ops on 256-element batches).

    Args:
        max_capacity: number of items the storage holds when full.
        alpha: priority exponent (0 = uniform sampling).
        beta: importance-sampling exponent (0 = no correction).
        eps: added to every raw priority before the exponent, so zero priorities stay drawable.
        dtype: ``torch.float64`` (default, exact enough for millions of items) or ``torch.float32``.
        reduction: how ``TensorDictReplayBuffer`` reduces a multi-element priority per item
            (``"max"``, ``"min"``, ``"mean"``, ``"median"``), as in TorchRL.
        max_priority_within_buffer: track the max priority among stored items instead of the max
            ever seen (TorchRL's option of the same name; default ``False`` like TorchRL).

    Raises:
        ConfigError: a non-positive capacity, a negative ``alpha``/``beta``/``eps``, or another dtype.

    Example:
        >>> import torch
        >>> from torchrl.data import LazyTensorStorage
        >>> storage = LazyTensorStorage(4)
        >>> storage.set(torch.arange(3), torch.zeros(3))
        >>> sampler = SumTreeSampler(4, alpha=1.0, beta=0.5)
        >>> sampler.update_priority(torch.tensor([0, 1, 2]), torch.tensor([1.0, 1.0, 2.0]))
        >>> from rlbuf._torchrl import set_sampler_generator
        >>> set_sampler_generator(sampler, torch.Generator().manual_seed(0))
        >>> index, info = sampler.sample(storage, 5)
        >>> index
        tensor([2, 2, 1, 2, 2])
        >>> info["priority_weight"]
        tensor([0.7071, 0.7071, 1.0000, 0.7071, 0.7071])
    """

    def __init__(
        self,
        max_capacity: int,
        alpha: float,
        beta: float,
        eps: float = 1e-8,
        dtype: torch.dtype = torch.float64,
        *,
        reduction: str = "max",
        max_priority_within_buffer: bool = False,
    ) -> None:
        # PrioritizedSampler.__init__ is skipped on purpose: it builds the C++ trees that fail to load.
        if not isinstance(max_capacity, int) or max_capacity < 1:
            raise ConfigError(f"max_capacity: expected a positive integer, got {max_capacity!r}")
        check_exponent("alpha", alpha)
        check_exponent("beta", beta)
        if not eps >= 0:
            raise ConfigError(f"eps: expected a value >= 0, got {eps}")
        if dtype not in _DTYPES:
            raise ConfigError(f"dtype: expected torch.float32 or torch.float64, got {dtype}")
        if reduction not in ("max", "min", "mean", "median"):
            raise ConfigError(f"reduction: expected one of 'max', 'min', 'mean', 'median', got {reduction!r}")
        self._max_capacity = max_capacity
        self._alpha = float(alpha)
        self._beta, self._eps = float(beta), float(eps)
        self.dtype, self.reduction = dtype, reduction
        self._max_priority_within_buffer = max_priority_within_buffer
        self._tree = new_tree(max_capacity, dtype)
        self._num_leaves = self._tree.shape[1] // 2
        self._depth = self._num_leaves.bit_length() - 1
        self._storage_shape: tuple[int, ...] | None = None
        self._max_priority_value: float | None = None
        self._max_priority_index: int | None = None
        # One past the largest leaf ever written: from a storage this long, the root holds the sum and minimum.
        self._high = 0
        self.drawable: Callable[[int], bool] | None = None
        self._empty()

    # -- configuration --------------------------------------------------------------------------

    @property
    def max_size(self) -> int:
        """The capacity the sampler was built for."""
        return self._max_capacity

    @property
    def nbytes(self) -> int:
        """Bytes of the tree (sums and minimums over every leaf, allocated for ``max_size`` items)."""
        return int(self._tree.nbytes)

    @property
    def device(self) -> torch.device:
        """Where the tree lives: always the CPU."""
        return torch.device("cpu")

    @property
    def alpha(self) -> float:
        """The priority exponent; setting it re-transforms the stored leaves, as TorchRL does."""
        return self._alpha

    @alpha.setter
    def alpha(self, value: float) -> None:
        check_exponent("alpha", value)
        old, self._alpha = self._alpha, float(value)
        if old == self._alpha:
            return
        sums, mins = self._leaves()
        written = np.isfinite(mins)
        if not written.any():
            return
        if old == 0:
            warnings.warn(
                "alpha: changing it away from 0 cannot recover the raw priorities (alpha == 0 stores 1.0"
                " for every item); sampling stays uniform for an item until its priority is next updated",
                stacklevel=2,
            )
            return
        raw = np.maximum(sums[written].astype(np.float64) ** (1.0 / old) - self._eps, 0.0)
        sums[written] = (raw + self._eps) ** self._alpha
        mins[written] = sums[written]
        self._rebuild()

    @property
    def beta(self) -> float:
        """The importance-sampling exponent; may be annealed between samples."""
        return self._beta

    @beta.setter
    def beta(self, value: float) -> None:
        check_exponent("beta", value)
        self._beta = float(value)

    @property
    def default_priority(self) -> float:
        """The raw priority new items get: the largest seen so far, or 1.0 before any update."""
        return 1.0 if self._max_priority_value is None else self._max_priority_value

    # -- sampling -------------------------------------------------------------------------------

    def sample(self, storage: Any, batch_size: int) -> tuple[Any, dict[str, torch.Tensor]]:
        """Draw ``batch_size`` indices in ``[0, len(storage))`` with probability proportional to ``q_i``.

        Args:
            storage: the TorchRL storage being sampled (its length bounds the indices).
            batch_size: how many indices to draw (with replacement).

        Returns:
            The index (a LongTensor on the storage's device, or a tuple of them for a storage with
            more than one dimension, as TorchRL returns) and ``{"priority_weight": weights}``
            (float32, normalised so the largest possible weight among stored items, the ``drawable`` ones
            where set, is 1).

        Raises:
            BatchSizeError: ``batch_size`` is not a positive integer.
            EmptyBufferError: the storage holds nothing.
            PriorityError: the stored items have total priority 0, or one of them has priority 0
                with ``eps == 0`` (importance weights would be undefined; TorchRL raises too).
        """
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise BatchSizeError(f"batch_size: expected a positive integer, got {batch_size!r}")
        size, total, smallest = self.sampled_mass(storage)
        generator = sampler_generator(self)
        generator_device = generator.device if generator is not None else "cpu"
        uniform = torch.rand(batch_size, generator=generator, dtype=torch.float64, device=generator_device)
        leaf, value = descend(self._tree, uniform.cpu().numpy() * total, size)
        weight = importance_weights(value, smallest, self._beta)
        index = torch.from_numpy(leaf)
        device = _storage_device(storage)
        if device is not None:
            index = index.to(device)
            weight = weight.to(device)
        if getattr(storage, "ndim", 1) > 1:
            return torch.unravel_index(index, tuple(storage.shape)), {"priority_weight": weight}
        return index, {"priority_weight": weight}

    def weights(self, storage: Any, index: Any) -> torch.Tensor:
        """The importance weights ``sample`` gives the stored items at ``index`` (same beta and normalisation).

        Raises:
            EmptyBufferError, PriorityError: as ``sample``.
            StoredIndexError: an index outside the stored items.

        Example:
            >>> from torchrl.data import LazyTensorStorage
            >>> storage = LazyTensorStorage(4)
            >>> storage.set(torch.arange(3), torch.zeros(3))
            >>> sampler = SumTreeSampler(4, alpha=1.0, beta=0.5)
            >>> sampler.update_priority(torch.tensor([0, 1, 2]), torch.tensor([1.0, 1.0, 2.0]))
            >>> sampler.weights(storage, torch.tensor([2, 0]))
            tensor([0.7071, 1.0000])
        """
        size, _, smallest = self.sampled_mass(storage)
        leaf = self._flat_index(index, storage)
        if leaf.size and not (leaf.min() >= 0 and leaf.max() < size):
            raise StoredIndexError(f"index: expected stored items in [0, {size}), got {leaf.min()} to {leaf.max()}")
        weight = importance_weights(self.leaf_values(leaf), smallest, self._beta)
        device = _storage_device(storage)
        return weight if device is None else weight.to(device)

    def leaf_values(self, positions: _Int64Array) -> _FloatArray:
        """The stored ``q = (p + eps) ** alpha`` of the items at ``positions`` (a copy).

        Example:
            >>> sampler = SumTreeSampler(4, alpha=1.0, beta=0.4, eps=0.0)
            >>> sampler.update_priority(torch.tensor([0, 1]), torch.tensor([1.0, 3.0]))
            >>> sampler.leaf_values(np.array([1, 0])).tolist()
            [3.0, 1.0]
        """
        return self._leaves()[0][positions]

    def sampled_mass(self, storage: Any) -> tuple[int, float, float]:
        """The items ``sample`` draws from, their total ``q`` and the smallest ``q`` of a ``drawable`` one (checked
        as ``sample`` needs)."""
        size = len(storage)
        if size == 0:
            raise EmptyBufferError("cannot sample: the storage holds 0 items")
        size = min(size, self._max_capacity)
        total, smallest = self._prefix_sum_min(size)
        if self.drawable is not None:  # none drawable: the caller refuses the draw, any smallest will do
            kept = smallest_where(self._tree, size, self.drawable)
            smallest = kept if kept < math.inf else smallest
        if not total > 0:
            raise PriorityError(f"priority: expected a positive total over the {size} stored items, got {total}")
        if not smallest > 0:
            raise PriorityError(
                f"priority: expected every stored item to have q = (p + eps) ** alpha > 0, got {smallest}"
                f" (eps={self._eps}); importance weights are undefined for a zero priority"
            )
        return size, total, smallest

    # -- writing --------------------------------------------------------------------------------

    def add(self, index: Any) -> None:
        """Note that one item was written at ``index`` (its priority comes from ``mark_update``).

        Args:
            index: the storage index written.
        """
        self._maybe_erase_max_priority(index)

    def extend(self, index: Any) -> None:
        """Note that items were written at ``index`` (their priority comes from ``mark_update``).

        Args:
            index: the storage indices written.
        """
        self._maybe_erase_max_priority(index)

    def mark_update(self, index: Any, *, storage: Any = None) -> None:
        """Give the items at ``index`` the default priority; TorchRL's writers call this on write.

        Args:
            index: the storage indices written.
            storage: the storage, needed to flatten a multi-dimensional index.
        """
        self.update_priority(index, self.default_priority, storage=storage)

    @torch.no_grad()
    def update_priority(self, index: int | torch.Tensor | tuple[torch.Tensor, ...], priority: float | torch.Tensor, *,
                        storage: Any = None) -> None:
        """Set the raw priorities of the items at ``index``; the tree stores ``(p + eps) ** alpha``.

        Negative indices are skipped (TorchRL's ``MaxValueWriter`` marks unwritten rows with -1); for a
        repeated index the last priority wins. Everything is validated before the tree changes.

        Args:
            index: storage indices: an int, a 1-D LongTensor, or rows of coordinates (``[B, ndim]`` or a
                tuple of tensors) for a multi-dimensional storage.
            priority: one number for all indices, or one value per index.
            storage: the storage, needed to flatten a multi-dimensional index.

        Raises:
            PriorityError: priority length differs from the index length, or a priority is negative,
                NaN, infinite, or overflows once raised to ``alpha``.
            StoredIndexError: an index is ``>= max_capacity``, or a multi-dimensional index comes
                without a storage.

        Example:
            >>> sampler = SumTreeSampler(4, alpha=0.5, beta=0.4, eps=0.0)
            >>> sampler.update_priority(torch.tensor([0, 1]), torch.tensor([4.0, 9.0]))
            >>> float(sampler._tree[0, 1])  # root of the sum tree: 4 ** 0.5 + 9 ** 0.5
            5.0
            >>> sampler.update_priority(torch.tensor([0, 1]), torch.tensor([1.0, 2.0, 3.0]))
            Traceback (most recent call last):
            ...
            rlbuf.errors.PriorityError: priority: expected 2 values (one per index), got 3
        """
        flat_index = self._flat_index(index, storage)
        # A Python number as float64: torch would make it float32, and the default priority (the largest seen,
        # up to 1e100) of every new row would round, or overflow to inf past 3.4e38.
        given = priority if isinstance(priority, torch.Tensor) else torch.as_tensor(priority, dtype=torch.float64)
        raw = given.detach().cpu().reshape(-1).numpy().astype(np.float64)
        count = flat_index.shape[0]
        if raw.shape[0] == 1:
            raw = np.broadcast_to(raw, (count,))
        elif raw.shape[0] != count:
            raise PriorityError(f"priority: expected {count} values (one per index), got {raw.shape[0]}")
        if count == 0:
            return
        if flat_index.max() >= self._max_capacity:
            raise StoredIndexError(f"index: expected values in [0, {self._max_capacity}) (or negative to skip),"
                                   f" got {int(flat_index.max())}")
        leaf_value = checked_leaf_values(raw, self._eps, self._alpha, _DTYPES[self.dtype])
        if flat_index.min() < 0:
            kept = flat_index >= 0
            flat_index, raw, leaf_value = flat_index[kept], raw[kept], leaf_value[kept]
            if flat_index.shape[0] == 0:
                return

        self._track_max_priority(flat_index, raw)
        if flat_index.shape[0] > 1:
            # np.unique keeps the first occurrence; on the reversed batch that is the last write.
            flat_index, first = np.unique(flat_index[::-1], return_index=True)
            leaf_value = leaf_value[::-1][first]
        write_leaves(self._tree, flat_index, leaf_value)
        self._high = max(self._high, int(flat_index[-1]) + 1)
        self._recompute_max_priority_if_touched(flat_index)

    def check_priority(self, priority: torch.Tensor) -> None:
        """Raise what ``update_priority`` raises for these raw priorities (float64); change nothing.

        Example:
            >>> SumTreeSampler(4, alpha=4.0, beta=0.4).check_priority(torch.tensor([1e90], dtype=torch.float64))
            Traceback (most recent call last):
            ...
            rlbuf.errors.PriorityError: priority: expected (p + eps) ** alpha to fit in float64, got p=1e+90 at position 0 (alpha=4.0)
        """
        checked_leaf_values(priority.detach().cpu().reshape(-1).numpy().astype(np.float64), self._eps, self._alpha,
                            _DTYPES[self.dtype])

    # -- state ----------------------------------------------------------------------------------

    def _empty(self) -> None:
        """Forget every priority and the max priority (``rb.empty()`` calls this)."""
        self._tree[0] = 0.0
        self._tree[1] = float("inf")
        self._max_priority_value = None
        self._max_priority_index = None
        self._high = 0

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume sampling, as tensors and numbers (no pickled objects).

        Returns:
            A dict with ``format_version``, ``alpha``, ``beta``, ``eps``, ``max_priority`` (-1.0 when no
            priority was seen), ``max_priority_index`` (-1 when unknown), ``sum_leaves`` and
            ``min_leaves`` (the stored ``q`` values; ``min_leaves`` is ``inf`` for never-written items).
        """
        sums, mins = self._leaves()
        return {
            "format_version": _FORMAT_VERSION,
            "alpha": self._alpha,
            "beta": self._beta,
            "eps": self._eps,
            "max_priority": -1.0 if self._max_priority_value is None else self._max_priority_value,
            "max_priority_index": -1 if self._max_priority_index is None else self._max_priority_index,
            "sum_leaves": torch.from_numpy(sums.copy()),
            "min_leaves": torch.from_numpy(mins.copy()),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore a ``state_dict``; the next draws equal those of the sampler that made it.

        Args:
            state_dict: the output of ``state_dict`` of a sampler with the same capacity.

        Raises:
            CheckpointError: another format version, or leaves of another capacity.
        """
        version = state_dict.get("format_version")
        if version != _FORMAT_VERSION:
            raise CheckpointError(f"sampler state format_version: expected {_FORMAT_VERSION}, got {version!r}")
        self._restore(sums=torch.as_tensor(state_dict["sum_leaves"]).numpy(),
                      mins=torch.as_tensor(state_dict["min_leaves"]).numpy(),
                      **{key: state_dict[key] for key in _SCALARS})

    def dumps(self, path: str | Path) -> None:
        """Write the sampler to directory ``path`` (created if missing; TorchRL's ``rb.dumps`` passes
        ``<dir>/sampler``): two ``.npy`` leaf arrays and a JSON metadata file."""
        (path := Path(path)).mkdir(parents=True, exist_ok=True)
        state = self.state_dict()
        np.save(path / _SUM_FILE, state.pop("sum_leaves").numpy(), allow_pickle=False)
        np.save(path / _MIN_FILE, state.pop("min_leaves").numpy(), allow_pickle=False)
        state["max_capacity"] = self._max_capacity
        (path / _METADATA_FILE).write_text(json.dumps(state))

    def loads(self, path: str | Path) -> None:
        """Read a sampler written by ``dumps``, never unpickling anything.

        Args:
            path: the directory ``dumps`` wrote.

        Raises:
            CheckpointError: missing or unreadable files, another format version or capacity.
        """
        path = Path(path)
        try:
            metadata = json.loads((path / _METADATA_FILE).read_text())
            sums = np.load(path / _SUM_FILE, allow_pickle=False)
            mins = np.load(path / _MIN_FILE, allow_pickle=False)
        except (OSError, ValueError) as error:
            raise CheckpointError(f"sampler at {path}: cannot read it ({error})") from error
        if metadata.get("format_version") != _FORMAT_VERSION:
            raise CheckpointError(
                f"sampler at {path}: expected format_version {_FORMAT_VERSION},"
                f" got {metadata.get('format_version')!r}"
            )
        if metadata.get("max_capacity") != self._max_capacity:
            raise CheckpointError(
                f"sampler at {path}: expected max_capacity {self._max_capacity},"
                f" got {metadata.get('max_capacity')!r}"
            )
        self._restore(sums=sums, mins=mins, **{key: metadata[key] for key in _SCALARS})

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(max_capacity={self._max_capacity}, alpha={self._alpha},"
            f" beta={self._beta}, eps={self._eps}, dtype={self.dtype},"
            f" default_priority={self.default_priority})"
        )

    def __getstate__(self) -> dict[str, Any]:
        """What a pickle or copy keeps: not ``drawable``, its caller's (a copy draws for no caller)."""
        return {**super().__getstate__(), "drawable": None}

    # -- internals ------------------------------------------------------------------------------

    def _leaves(self) -> tuple[_FloatArray, _FloatArray]:
        """Numpy views of the sum and min leaves ``[0, max_capacity)``."""
        # Fresh views per call: views kept as attributes would stop sharing memory with the
        # tensor after a pickle or deepcopy round trip.
        tree = self._tree.numpy()
        leaves = slice(self._num_leaves, self._num_leaves + self._max_capacity)
        return tree[0, leaves], tree[1, leaves]

    def _rebuild(self) -> None:
        rebuild(self._tree)

    def _prefix_sum_min(self, size: int) -> tuple[float, float]:
        """Sum and minimum of the leaves ``[0, size)`` (the root's, when no leaf beyond was written)."""
        if size >= self._high:
            return float(self._tree[0, 1]), float(self._tree[1, 1])
        return prefix_sum_min(self._tree, size)

    def _flat_index(self, index: Any, storage: Any) -> _Int64Array:
        return flattened_index(index, self._remember_shape(storage))

    def _remember_shape(self, storage: Any) -> tuple[int, ...] | None:
        if storage is not None and getattr(storage, "ndim", 1) > 1:
            self._storage_shape = tuple(storage.shape)
        return self._storage_shape

    def _track_max_priority(self, flat_index: _Int64Array, raw: npt.NDArray[np.float64]) -> None:
        position = int(np.argmax(raw))
        value = float(raw[position])
        if self._max_priority_value is None or value > self._max_priority_value:
            self._max_priority_value = value
            self._max_priority_index = int(flat_index[position])

    def _recompute_max_priority_if_touched(self, flat_index: _Int64Array) -> None:
        """Within-buffer mode: re-read the max from the tree when its item was just overwritten."""
        if not self._max_priority_within_buffer or self._max_priority_index is None:
            return
        # With alpha == 0 every leaf is 1.0 and raw priorities cannot be recovered; keep the raw max.
        if self._alpha == 0 or not (flat_index == self._max_priority_index).any():
            return
        sums, _ = self._leaves()
        position = int(np.argmax(sums))
        self._max_priority_value = max(float(sums[position]) ** (1.0 / self._alpha) - self._eps, 0.0)
        self._max_priority_index = position

    def _maybe_erase_max_priority(self, index: Any) -> None:
        if not self._max_priority_within_buffer or self._max_priority_index is None:
            return
        tensor = torch.as_tensor(index).detach().cpu()
        if tensor.ndim > 1 and self._storage_shape is not None:
            rows = tensor.reshape(-1, tensor.shape[-1]).numpy()
            flat_index = np.ravel_multi_index(tuple(np.maximum(rows, 0).T), self._storage_shape)
            overwritten = bool((flat_index == self._max_priority_index).any())
        else:
            # Without a known shape a coordinate index cannot be compared: assume it was overwritten.
            overwritten = tensor.ndim > 1 or bool((tensor == self._max_priority_index).any())
        if overwritten:
            self._max_priority_value = None
            self._max_priority_index = None

    def _restore(self, *, sums: npt.NDArray[Any], mins: npt.NDArray[Any], alpha: float, beta: float, eps: float,
                 max_priority: float, max_priority_index: int) -> None:
        expected = (self._max_capacity,)
        if sums.shape != expected or mins.shape != expected:
            raise CheckpointError(f"sampler leaves: expected shape {expected}, got {sums.shape} and {mins.shape}")
        if sums.dtype.kind != "f" or mins.dtype.kind != "f":
            raise CheckpointError(f"sampler leaves: expected floating dtypes, got {sums.dtype} and {mins.dtype}")
        check_exponent("alpha", alpha)
        check_exponent("beta", beta)
        self._empty()
        self._alpha, self._beta, self._eps = float(alpha), float(beta), float(eps)
        leaf_sums, leaf_mins = self._leaves()
        leaf_sums[:] = sums
        leaf_mins[:] = mins
        self._rebuild()
        written = np.flatnonzero(np.isfinite(leaf_mins))
        self._high = int(written[-1]) + 1 if written.size else 0
        if max_priority >= 0:
            self._max_priority_value = float(max_priority)
            self._max_priority_index = int(max_priority_index) if max_priority_index >= 0 else None


def _storage_device(storage: Any) -> torch.device | None:
    device = getattr(storage, "device", None)
    if device is None or device == "auto":
        return None
    return torch.device(device)
