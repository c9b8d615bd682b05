"""Rows copied from CPU tensors by address: the one-row add's way around ``Tensor.numpy()``.

``Tensor.numpy()`` costs about 0.8 µs, with the numpy array it makes and drops, for a tensor of
one row: most of a torch add of one transition (``benchmarks/add.py``). A contiguous CPU tensor
of the stored dtype and shape is a block of bytes at ``data_ptr()``; ``copy_rows`` copies up to
five such blocks into their targets' rows in one call, compiled by numba (its dispatch with
ints costs about 0.25 µs, against ctypes' ``memmove`` at 0.4 µs for each block).

Who reads an address decides whether the bytes are there: see ``_CAPTURE`` in ``rlbuf._core``,
which checks the tensor's type, device, dtype, shape, contiguity and negation bit first, keeps
its storage alive until the copy is done, and takes the address again after any reader that
may have run the caller's code.

numba is imported when the first buffer that adds one row at a time is built (about 0.15 s);
the kernel is compiled on the first such add in a fresh install (about 1 s) and loaded from
numba's disk cache after that (about 0.3 s, once per process), like the GAE kernels.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
from numba import types
from numba.extending import intrinsic

SLOTS = 5  # sources per call: a plain transition has five fields copied so (all but the reward)


@intrinsic  # type: ignore[untyped-decorator]
def _pointer(typingctx: Any, address: Any) -> Any:
    """The integer ``address`` as a ``void*``: what ``numba.carray`` views (numba's documented
    ``intrinsic`` extension API; numba passes the typing context)."""
    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.inttoptr(args[0], context.get_value_type(signature.return_type))
    return types.voidptr(address), codegen


@numba.njit(cache=True, boundscheck=False)
def copy_rows(position, table, s0, s1, s2, s3, s4):  # type: ignore[no-untyped-def]
    """Copy the row at each nonzero source address ``s<i>`` into row ``position`` of target ``i``.

    ``table[i]`` is ``(address of row 0, bytes per row, is bool)`` of a C-contiguous target; a
    source is one row of that many bytes. A bool is stored as 0 or 1 whatever byte its source
    holds (a ``uint8`` tensor viewed as bool may hold any), as ``Tensor.item()`` would read it.
    The GIL is held throughout, so no Python thread runs meanwhile.

    Example:
        >>> target = np.zeros((3, 2), np.float32)
        >>> source = np.array([1.5, 2.5], np.float32)
        >>> table = np.array([[target.ctypes.data, target.strides[0], 0]], np.int64)
        >>> copy_rows(1, table, source.ctypes.data, 0, 0, 0, 0)
        >>> target[1].tolist()
        [1.5, 2.5]
    """
    sources = (s0, s1, s2, s3, s4)
    for i in range(table.shape[0]):
        source = sources[i]
        if source != 0:
            size = table[i, 1]
            row = numba.carray(_pointer(table[i, 0] + position * size), size, np.uint8)
            given = numba.carray(_pointer(source), size, np.uint8)
            # Loops, not ``row[:] = given``: numba copies a slice that may overlap through a
            # temporary (12x slower for an Atari frame); these loops vectorise.
            if table[i, 2]:
                for k in range(size):
                    row[k] = given[k] != 0
            else:
                for k in range(size):
                    row[k] = given[k]
