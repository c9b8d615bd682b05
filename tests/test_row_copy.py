"""``copy_rows``: rows copied by address into their targets' rows, nothing else touched."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rlbuf._core import raw_row_tables
from rlbuf._row_copy import SLOTS, copy_rows


@settings(max_examples=50, deadline=None)
@given(position=st.integers(0, 3), given_fields=st.lists(st.booleans(), min_size=SLOTS, max_size=SLOTS),
       seed=st.integers(0, 2**32 - 1))
def test_each_given_row_lands_in_its_target_row_and_nothing_else_changes(position: int, given_fields: list[bool],
                                                                         seed: int) -> None:
    rng = np.random.default_rng(seed)
    shapes = [(4, 3), (4,), (4, 2, 2), (4, 5), (4,)]
    dtypes = [np.float32, np.int64, np.uint8, np.float64, np.bool_]
    targets = [rng.integers(0, 100, shape).astype(dtype) for shape, dtype in zip(shapes, dtypes, strict=True)]
    rows = [rng.integers(0, 100, shape[1:]).astype(dtype) for shape, dtype in zip(shapes, dtypes, strict=True)]
    expected = [target.copy() for target in targets]
    for field, (row, taken) in enumerate(zip(rows, given_fields, strict=True)):
        if taken:
            expected[field][position] = row
    (table,) = raw_row_tables(targets, [range(SLOTS)])
    copy_rows(position, table, *(row.ctypes.data if taken else 0 for row, taken in zip(rows, given_fields, strict=True)))
    for target, wanted in zip(targets, expected, strict=True):
        assert target.tobytes() == wanted.tobytes()


def test_a_bool_row_is_stored_as_zeros_and_ones_whatever_bytes_it_holds() -> None:
    target = np.zeros((2, 4), np.bool_)
    given = np.array([0, 1, 7, 255], np.uint8)
    (table,) = raw_row_tables([target], [(0,)])
    copy_rows(1, table, given.ctypes.data, 0, 0, 0, 0)
    assert target.view(np.uint8).tolist() == [[0, 0, 0, 0], [0, 1, 1, 1]]


def test_a_target_of_one_row_is_copied_into_whatever_stride_numpy_gives_it() -> None:
    target = np.zeros((1, 3), np.float32)
    target = np.lib.stride_tricks.as_strided(target, (1, 3), (999, 4))  # a dim of size 1 may have any stride
    (table,) = raw_row_tables([target], [(0,)])
    assert table.tolist() == [[target.ctypes.data, 12, 0]]
    given = np.array([1.0, 2.0, 3.0], np.float32)
    copy_rows(0, table, given.ctypes.data, 0, 0, 0, 0)
    assert target.tolist() == [[1.0, 2.0, 3.0]]
