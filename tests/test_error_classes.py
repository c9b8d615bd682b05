"""Ports catch the builtin errors their old library raised: each rlbuf error is also that builtin.

A port from SB3 or Tianshou wraps its buffer calls in ``except ValueError`` (shapes, an empty
buffer), ``except TypeError`` (dtypes, a missing argument), ``except IndexError`` and
``except KeyError``; each case below is the real call, caught by the builtin, and still named
by its rlbuf class.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import rlbuf
from rlbuf import ReplayBuffer, RolloutBuffer


def _buffer() -> ReplayBuffer:
    return ReplayBuffer(8, obs_shape=(3,), action_shape=(), seed=0, extra_fields={"cost": ((), torch.float32)})


def _one_row() -> ReplayBuffer:
    buf = _buffer()
    _add(buf)
    return buf


def _add(buf: ReplayBuffer, **changes: object) -> None:
    fields = dict(obs=np.zeros(3), action=0.0, reward=1.0, next_obs=np.zeros(3), terminated=False, truncated=False,
                  cost=0.5)
    fields.update(changes)
    buf.add(**{k: v for k, v in fields.items() if v is not None})


@pytest.mark.parametrize(("call", "builtin", "name"), [
    (lambda: _buffer().sample(4), ValueError, "EmptyBufferError"),
    (lambda: _buffer().sample(4), RuntimeError, "EmptyBufferError"),
    (lambda: _add(_buffer(), obs=np.zeros(4)), ValueError, "ShapeError"),
    (lambda: _add(_buffer(), reward=float("nan")), ValueError, "NonFiniteError"),
    (lambda: _add(_buffer(), terminated=np.float32(0.5)), TypeError, "DtypeError"),
    (lambda: _add(_buffer(), cost=None), KeyError, "MissingFieldError"),
    (lambda: _add(_buffer(), cost=None), TypeError, "MissingFieldError"),
    (lambda: _one_row().sample_by_index([5]), IndexError, "StoredIndexError"),
    (lambda: RolloutBuffer(2, 1, obs_shape=(3,), action_shape=()).get_all_data(), RuntimeError,
     "RolloutIncompleteError"),
], ids=lambda value: value if isinstance(value, str) else getattr(value, "__name__", ""))
def test_a_port_catches_the_builtin_and_sees_rlbufs_name(call, builtin, name):
    with pytest.raises(builtin) as caught:
        call()
    assert type(caught.value).__name__ == name
    assert isinstance(caught.value, rlbuf.RlbufError)


def test_a_missing_checkpoint_is_a_value_error_named_checkpoint_error(tmp_path: Path):
    with pytest.raises(ValueError) as caught:
        ReplayBuffer.load(tmp_path / "never-saved")
    assert type(caught.value).__name__ == "CheckpointError"
    assert "never-saved" in str(caught.value)


def test_every_error_class_keeps_its_name_and_a_builtin_base():
    classes = [value for value in vars(rlbuf.errors).values()
               if isinstance(value, type) and issubclass(value, rlbuf.RlbufError) and value is not rlbuf.RlbufError]
    assert len(classes) >= 14
    for cls in classes:
        assert cls.__module__ == "rlbuf.errors"
        builtins = [base for base in cls.__mro__[1:] if base.__module__ == "builtins" and base not in (
            Exception, BaseException, object)]
        assert builtins, f"{cls.__name__} subclasses no builtin error a port would catch"
