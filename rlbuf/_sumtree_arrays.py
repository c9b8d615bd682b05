"""The array sum/min tree behind [`SumTreeSampler`][rlbuf._sumtree.SumTreeSampler]: leaves, updates, prefix sums, draws.

The tree is one ``(2, 2 * P)`` CPU tensor (``P`` the next power of two >= the capacity): row 0
the sum tree, row 1 the min tree; node 1 is the root, node ``k`` has children ``2k`` and
``2k + 1``, leaves are nodes ``P ..``. Updates and draws loop over the ``log2(P)`` levels,
vectorised over the batch, with numpy kernels on the tensor's memory.

Example:
    >>> import numpy as np, torch
    >>> tree = new_tree(3, torch.float64)
    >>> tree[0], tree[1] = 0.0, float("inf")
    >>> write_leaves(tree, np.array([0, 2]), np.array([1.0, 3.0]))
    >>> leaf, value = descend(tree, np.array([0.5, 2.5]), 3)
    >>> prefix_sum_min(tree, 3), leaf.tolist(), value.tolist()
    ((4.0, 1.0), [0, 2], [1.0, 3.0])
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from rlbuf.errors import ConfigError, NonFiniteError, PriorityError, StoredIndexError
from rlbuf.storage import available_ram

_Int64Array = npt.NDArray[np.int64]
_FloatArray = npt.NDArray[np.floating[Any]]


class NonFinitePriorityError(PriorityError, NonFiniteError):
    """A NaN or infinite priority: caught by ``except PriorityError`` and ``except NonFiniteError``."""


def new_tree(capacity: int, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised ``(2, 2 * P)`` tree for ``capacity`` leaves.

    Raises:
        ConfigError: the tree needs more RAM than is available (checked before allocating).
    """
    num_leaves = 1 << (capacity - 1).bit_length()
    needed = 2 * 2 * num_leaves * dtype.itemsize
    if needed > available_ram():
        raise ConfigError(f"capacity: a priority tree of {capacity} rows needs {needed} bytes, but only "
                          f"{available_ram()} bytes of RAM are available; build a smaller buffer")
    return torch.empty(2, 2 * num_leaves, dtype=dtype)


def _depth(tree: torch.Tensor) -> int:
    return int(tree.shape[1] // 2).bit_length() - 1


def write_leaves(tree: torch.Tensor, leaf: _Int64Array, value: _FloatArray) -> None:
    """Set leaves ``leaf`` of both trees to ``value`` and update their ancestors."""
    sums, mins = tree[0].numpy(), tree[1].numpy()
    sum_pairs, min_pairs = sums.reshape(-1, 2), mins.reshape(-1, 2)  # row k: children of k
    num_leaves, depth = tree.shape[1] // 2, _depth(tree)
    node = leaf + num_leaves
    sums.put(node, value)
    mins.put(node, value)
    if leaf.shape[0] * depth > 2 * num_leaves:
        # Walking up costs batch * depth; rebuilding every level costs 2 * P and gives the same tree.
        rebuild(tree)
        return
    for _ in range(depth):
        node >>= 1
        pair = sum_pairs.take(node, axis=0)
        sums.put(node, pair[:, 0] + pair[:, 1])
        pair = min_pairs.take(node, axis=0)
        mins.put(node, np.minimum(pair[:, 0], pair[:, 1]))


def rebuild(tree: torch.Tensor) -> None:
    """Recompute every inner node from the leaves, level by level (same sums as ``write_leaves``)."""
    sums, mins = tree[0].numpy(), tree[1].numpy()
    for level in reversed(range(_depth(tree))):
        lo, hi = 1 << level, 2 << level
        sums[lo:hi] = sums[2 * lo : 2 * hi : 2] + sums[2 * lo + 1 : 2 * hi : 2]
        mins[lo:hi] = np.minimum(mins[2 * lo : 2 * hi : 2], mins[2 * lo + 1 : 2 * hi : 2])


def prefix_sum_min(tree: torch.Tensor, size: int) -> tuple[float, float]:
    """Sum and minimum of the leaves ``[0, size)``."""
    sums, mins = tree[0].numpy(), tree[1].numpy()
    total, smallest = 0.0, float("inf")
    lo, hi = tree.shape[1] // 2, tree.shape[1] // 2 + size
    while lo < hi:
        if lo & 1:
            total += float(sums[lo])
            smallest = min(smallest, float(mins[lo]))
            lo += 1
        if hi & 1:
            hi -= 1
            total += float(sums[hi])
            smallest = min(smallest, float(mins[hi]))
        lo >>= 1
        hi >>= 1
    return total, smallest


def descend(tree: torch.Tensor, mass: npt.NDArray[np.float64], size: int) -> tuple[_Int64Array, _FloatArray]:
    """The leaf in ``[0, size)`` where each prefix ``mass`` falls, and its value (consumes ``mass``)."""
    sums = tree[0].numpy()
    num_leaves = tree.shape[1] // 2
    node = np.ones(len(mass), dtype=np.int64)
    for _ in range(_depth(tree)):
        node <<= 1
        left = sums.take(node)
        right = mass >= left
        np.subtract(mass, left, out=mass, where=right)
        node += right
    leaf: _Int64Array = node - num_leaves
    stored = sums[num_leaves : num_leaves + size]
    value: _FloatArray = stored.take(np.minimum(leaf, size - 1))
    bad = (leaf >= size) | ~(value > 0)
    if bad.any():
        # Round-off can carry a draw past the last item with mass; take the nearest such item
        # at or before where it landed (TorchRL walks left the same way).
        nonzero = np.flatnonzero(stored > 0)
        landed = np.minimum(leaf[bad], size - 1)
        position = np.maximum(np.searchsorted(nonzero, landed, side="right") - 1, 0)
        leaf[bad] = nonzero[position]
        value = stored.take(leaf)
    return leaf, value


def smallest_where(tree: torch.Tensor, size: int, accept: Callable[[int], bool]) -> float:
    """The smallest leaf value in ``[0, size)`` among leaves ``accept`` admits (``inf`` if none).

    The smallest leaf of all is tried first (one descent); past it, leaves come out of the min tree in
    increasing order (best first: a node's minimum bounds its leaves), so each leaf ``accept`` refuses
    costs one more descent, not a pass over the tree.

    Example:
        >>> tree = new_tree(4, torch.float64)
        >>> tree[0], tree[1] = 0.0, float("inf")
        >>> write_leaves(tree, np.arange(4), np.array([3.0, 1.0, 2.0, 0.5]))
        >>> smallest_where(tree, 4, lambda leaf: leaf != 3), smallest_where(tree, 1, lambda leaf: True)
        (1.0, 3.0)
    """
    mins = tree[1].numpy()
    num_leaves, depth = tree.shape[1] // 2, _depth(tree)
    node = 1  # the smallest leaf of all first, one descent: nearly always stored and admitted (then the answer)
    while node < num_leaves:
        node = 2 * node + int(mins[2 * node + 1] < mins[2 * node])
    tried = node if node - num_leaves < size else 0  # a leaf refused here is not asked again below
    if tried and accept(node - num_leaves):
        return float(mins[node])
    heap = [(float(mins[1]), 0, 1)]  # ties popped deepest first: equal priorities cost a descent, not a breadth
    while heap:
        value, _, node = heapq.heappop(heap)
        if node >= num_leaves:
            if node != tried and accept(node - num_leaves):
                return value
            continue
        for child in (2 * node, 2 * node + 1):
            first_leaf = (child << (depth - child.bit_length() + 1)) - num_leaves
            if first_leaf < size:
                heapq.heappush(heap, (float(mins[child]), -child.bit_length(), child))
    return math.inf


def flattened_index(index: Any, shape: tuple[int, ...] | None) -> _Int64Array:
    """Storage indices as flat int64 positions: an int, a 1-D tensor, or rows of coordinates (``[B, ndim]``
    or a tuple of tensors) in a storage of ``shape``; a coordinate row with a negative entry stays -1.

    Example:
        >>> flattened_index(torch.tensor([[0, 1], [1, 0], [-1, 0]]), (2, 3)).tolist()
        [1, 3, -1]
    """
    if isinstance(index, tuple):
        index = torch.stack([torch.as_tensor(i) for i in index], -1)
    tensor = torch.as_tensor(index).detach().cpu()
    if tensor.is_floating_point() or tensor.is_complex() or tensor.dtype == torch.bool:
        raise StoredIndexError(f"index: expected integers, got dtype {tensor.dtype}")
    array = tensor.to(torch.int64).numpy()
    if array.ndim <= 1:
        return array.reshape(-1)
    if shape is None or len(shape) != array.shape[-1]:
        raise StoredIndexError(
            f"index: a {array.shape[-1]}-D coordinate index needs storage= with as many dimensions"
            f" to be flattened, got storage shape {shape}"
        )
    rows = array.reshape(-1, array.shape[-1])
    flat: _Int64Array = np.ravel_multi_index(tuple(np.maximum(rows, 0).T), shape)
    flat[(rows < 0).any(axis=1)] = -1
    return flat


def importance_weights(value: _FloatArray, smallest: float, beta: float) -> torch.Tensor:
    """``(q_i / min_j q_j) ** -beta`` of leaf values ``value`` as float32: 1 for the least likely item."""
    return torch.from_numpy((value.astype(np.float64) / float(smallest)) ** -beta).to(torch.float32)


def check_exponent(name: str, value: float) -> None:
    try:
        valid = isinstance(value, int | float) and not isinstance(value, bool) and value >= 0 and math.isfinite(value)
    except OverflowError:  # an int beyond any float
        valid = False
    if not valid:
        raise ConfigError(f"{name}: expected a finite number >= 0, got {value!r}")


def checked_leaf_values(
    raw: npt.NDArray[np.float64], eps: float, alpha: float, dtype: type[np.floating[Any]]
) -> _FloatArray:
    """``(raw + eps) ** alpha`` in the tree's dtype, after checking every raw priority."""
    # min/max first: two reductions in the common all-valid case (a NaN makes the min NaN).
    if not (raw.min() >= 0 and raw.max() < np.inf):
        bad = ~np.isfinite(raw)
        if bad.any():
            position = int(np.flatnonzero(bad)[0])
            raise NonFinitePriorityError(
                f"priority: expected finite values, got {raw[position]} at position {position}"
            )
        position = int(np.flatnonzero(raw < 0)[0])
        raise PriorityError(
            f"priority: expected values >= 0, got {raw[position]} at position {position}"
        )
    with np.errstate(over="ignore"):
        value: _FloatArray = np.power(raw + eps, alpha).astype(dtype, copy=False)
    if not value.max() < np.inf:
        overflow = ~np.isfinite(value)
        position = int(np.flatnonzero(overflow)[0])
        raise PriorityError(
            f"priority: expected (p + eps) ** alpha to fit in {np.dtype(dtype)},"
            f" got p={raw[position]} at position {position} (alpha={alpha})"
        )
    if not value.min() > 0 and (lost := (value == 0) & (raw + eps > 0)).any():  # alpha underflowed a priority
        position = int(np.flatnonzero(lost)[0])
        raise PriorityError(
            f"priority: expected (p + eps) ** alpha > 0 in {np.dtype(dtype)} for p + eps > 0 (or the row is never"
            f" drawn), got p={raw[position]} at position {position} (alpha={alpha}, eps={eps}); raise eps or lower"
            f" alpha"
        )
    return value
