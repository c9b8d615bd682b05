"""The two loops of a one-row add, as direct calls for the plain layout's six fields and the compact layout's five.

A Python loop over six fields costs about 1.5 us of a 10 us torch add (``benchmarks/add.py``,
issue 20's budget); six direct calls do not. Other field counts take the loop. Both run the
same readers and the same assignments: nothing is skipped, only the loop.

Example:
    >>> import numpy as np
    >>> targets = [np.zeros(3) for _ in range(6)]
    >>> read = reading_all([float] * 6)
    >>> write = writing_row(targets)
    >>> write(1, read([1, 2, 3, 4, 5, 6]))
    >>> [float(t[1]) for t in targets]
    [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


def reading_all(reads: Sequence[Callable[[Any], Any]]) -> Callable[[Sequence[Any]], list[Any]]:
    """One call that reads each value with its field's reader, in field order (the caller checks
    that there is one value per reader)."""
    if len(reads) == 6:
        r0, r1, r2, r3, r4, r5 = reads

        def read_six(values: Sequence[Any]) -> list[Any]:
            v0, v1, v2, v3, v4, v5 = values
            return [r0(v0), r1(v1), r2(v2), r3(v3), r4(v4), r5(v5)]
        return read_six
    if len(reads) == 5:  # the compact layout's: a frame, action, reward and the two flags
        f0, f1, f2, f3, f4 = reads

        def read_five(values: Sequence[Any]) -> list[Any]:
            v0, v1, v2, v3, v4 = values
            return [f0(v0), f1(v1), f2(v2), f3(v3), f4(v4)]
        return read_five

    def read_each(values: Sequence[Any]) -> list[Any]:
        return [read(value) for read, value in zip(reads, values)]  # noqa: B905 (lengths checked by the caller)
    return read_each


def writing_row(targets: Sequence[np.ndarray[Any, Any]]) -> Callable[[int, Sequence[Any]], None]:
    """One call that writes one row of each field (as its reader returned it) at ``position``."""
    if len(targets) == 6:
        t0, t1, t2, t3, t4, t5 = targets

        def write_six(position: int, rows: Sequence[Any]) -> None:
            t0[position], t1[position], t2[position], t3[position], t4[position], t5[position] = rows
        return write_six
    if len(targets) == 5:
        u0, u1, u2, u3, u4 = targets

        def write_five(position: int, rows: Sequence[Any]) -> None:
            u0[position], u1[position], u2[position], u3[position], u4[position] = rows
        return write_five

    def write_each(position: int, rows: Sequence[Any]) -> None:
        for target, row in zip(targets, rows):  # noqa: B905 (one row per field, read by reading_all)
            target[position] = row
    return write_each
