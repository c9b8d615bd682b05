"""An attacker's checks of the compiled stream kernels' own guards: they index without bounds checks, so rows
of another size, dtype or count than the call's env ids, flags of another count, and env ids outside
``[0, num_envs)`` must be refused (``ValueError``) before anything is read or written out of bounds, and an
env with two rows declined (``REPEATED``: the numpy path takes the call); either changes no table.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from rlbuf import _streams
from rlbuf._streams import Streams


def _streams_of(stack: int) -> Streams:
    shape = (stack, 2, 3) if stack > 1 else (2, 3)
    return Streams(8, 2, shape, torch.uint8, frame_stack=stack, padding_type="reset", n_step=1,
                   storing_device=torch.device("cpu"))


def _tables(streams: Streams) -> list[Any]:
    return [table.tolist() for table in (streams.back, streams._links, streams._flags, streams.last,
                                         streams._expected)]


def _rows(streams: Streams, count: int) -> np.ndarray[Any, Any]:
    return np.zeros((count, *streams.expected.shape[1:]), np.uint8)


def _check(streams: Streams, obs: Any, next_obs: Any, env_ids: Any) -> Any:
    return streams._check_steps(obs, next_obs, streams._expected_words, env_ids, streams.last,
                                streams._words_per_frame, False)


def _record(streams: Streams, next_obs: Any, env_ids: Any, flags: Any) -> Any:
    return streams._record_steps(env_ids, 0, flags, flags, 0, streams.back, streams._links, streams._flags,
                                 streams._per_env, next_obs, streams._expected_bytes)


@pytest.mark.parametrize("stack", [1, 2])
@pytest.mark.parametrize("case", ["a byte short", "float64", "a row more", "a row less"])
def test_rows_the_env_ids_do_not_match_are_refused_by_the_kernels(stack: int, case: str) -> None:
    streams = _streams_of(stack)
    env_ids, flags, rows = np.array([0, 1]), np.zeros(2, np.bool_), _rows(streams, 2)
    bad = {"a byte short": lambda: rows.reshape(2, -1)[:, :-1].copy(), "float64": lambda: rows.astype(np.float64),
           "a row more": lambda: _rows(streams, 3), "a row less": lambda: _rows(streams, 1)}[case]()
    before = _tables(streams)
    for obs, next_obs in ((bad, rows), (rows, bad)):
        with pytest.raises(ValueError, match="rows of another"):
            _check(streams, obs, next_obs, env_ids)
    with pytest.raises(ValueError, match="rows of another"):
        _record(streams, bad, env_ids, flags)
    with pytest.raises(ValueError, match="flags of another count"):
        _record(streams, rows, env_ids, np.zeros(1, np.bool_))
    assert _tables(streams) == before


@pytest.mark.parametrize("env", [2, 3, 2**40, -1, -3])
def test_an_env_id_outside_the_envs_is_refused_changing_nothing(env: int) -> None:
    streams = _streams_of(2)
    env_ids, flags, rows = np.array([0, env]), np.zeros(2, np.bool_), _rows(streams, 2)
    before = _tables(streams)
    with pytest.raises(ValueError, match=r"env ids outside \[0, num_envs\)"):
        _check(streams, rows, rows, env_ids)
    with pytest.raises(ValueError, match=r"env ids outside \[0, num_envs\)"):
        _record(streams, rows, env_ids, flags)
    assert _tables(streams) == before


def test_an_env_with_two_rows_is_still_declined() -> None:
    streams = _streams_of(2)
    env_ids, flags, rows = np.array([1, 1]), np.zeros(2, np.bool_), _rows(streams, 2)
    before = _tables(streams)
    assert _check(streams, rows, rows, env_ids) == (_streams.REPEATED, -1)
    assert _record(streams, rows, env_ids, flags) == (_streams.REPEATED, 0)
    assert _tables(streams) == before
