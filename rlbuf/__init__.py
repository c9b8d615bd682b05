"""rlbuf: typed, fast, correct replay and rollout buffers for PyTorch RL, built on TorchRL.

Public names are imported on first use (PEP 562), so ``import rlbuf`` and the ``rlbuf`` command
do not pay for torch and TorchRL until something needs them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlbuf._state import MetadataOnlyWarning
    from rlbuf.batches import DistillationBatch, ReplayBatch, RolloutBatch, Transition
    from rlbuf.distill import DistillationBuffer
    from rlbuf.epochs import EpochIterator
    from rlbuf.errors import (
        BatchedSpaceWarning,
        BatchSizeError,
        BufferFullError,
        CheckpointError,
        ConfigError,
        DatasetError,
        DeviceError,
        DtypeError,
        EmptyBufferError,
        MemoryWarning,
        MissingFieldError,
        NextStepResetWarning,
        NonFiniteError,
        NotPicklableError,
        OutOfRangeError,
        PriorityError,
        RateLimitTimeoutError,
        ReadOnlyError,
        ReplyError,
        RlbufError,
        RlbufWarning,
        RolloutIncompleteError,
        ShapeError,
        ShardDiedError,
        StoredIndexError,
        StreamError,
        UnsupportedOperationError,
    )
    from rlbuf.gae import GAE
    from rlbuf.gym import Recorder
    from rlbuf.hindsight import Hindsight
    from rlbuf.mixing import MixedBatch, MixedReplay
    from rlbuf.replay import ReplayBuffer
    from rlbuf.rollout import RolloutBuffer
    from rlbuf.sequences import ReplaySequenceBatch, SequenceBatch
    from rlbuf.spec import FieldSpec
    from rlbuf.stats import EpisodeStats

__version__ = "0.1.0"

# Public name -> the module that defines it. A new public name goes here, in the TYPE_CHECKING
# imports above (for type checkers and IDEs) and in __all__.
_MODULE_OF = {
    "MetadataOnlyWarning": "rlbuf._state",
    "DistillationBatch": "rlbuf.batches",
    "ReplayBatch": "rlbuf.batches",
    "RolloutBatch": "rlbuf.batches",
    "DistillationBuffer": "rlbuf.distill",
    "EpochIterator": "rlbuf.epochs",
    "BatchSizeError": "rlbuf.errors",
    "BatchedSpaceWarning": "rlbuf.errors",
    "MemoryWarning": "rlbuf.errors",
    "NextStepResetWarning": "rlbuf.errors",
    "RlbufWarning": "rlbuf.errors",
    "BufferFullError": "rlbuf.errors",
    "CheckpointError": "rlbuf.errors",
    "ConfigError": "rlbuf.errors",
    "DatasetError": "rlbuf.errors",
    "DeviceError": "rlbuf.errors",
    "DtypeError": "rlbuf.errors",
    "EmptyBufferError": "rlbuf.errors",
    "MissingFieldError": "rlbuf.errors",
    "NonFiniteError": "rlbuf.errors",
    "NotPicklableError": "rlbuf.errors",
    "OutOfRangeError": "rlbuf.errors",
    "PriorityError": "rlbuf.errors",
    "RateLimitTimeoutError": "rlbuf.errors",
    "ReadOnlyError": "rlbuf.errors",
    "ReplyError": "rlbuf.errors",
    "ShardDiedError": "rlbuf.errors",
    "RlbufError": "rlbuf.errors",
    "RolloutIncompleteError": "rlbuf.errors",
    "ShapeError": "rlbuf.errors",
    "StoredIndexError": "rlbuf.errors",
    "StreamError": "rlbuf.errors",
    "UnsupportedOperationError": "rlbuf.errors",
    "ReplaySequenceBatch": "rlbuf.sequences",
    "SequenceBatch": "rlbuf.sequences",
    "GAE": "rlbuf.gae",
    "Recorder": "rlbuf.gym",
    "Hindsight": "rlbuf.hindsight",
    "MixedBatch": "rlbuf.mixing",
    "MixedReplay": "rlbuf.mixing",
    "ReplayBuffer": "rlbuf.replay",
    "Transition": "rlbuf.batches",
    "RolloutBuffer": "rlbuf.rollout",
    "FieldSpec": "rlbuf.spec",
    "EpisodeStats": "rlbuf.stats",
}

__all__ = [
    "GAE",
    "BatchSizeError",
    "BatchedSpaceWarning",
    "BufferFullError",
    "CheckpointError",
    "ConfigError",
    "DatasetError",
    "DeviceError",
    "DistillationBatch",
    "DistillationBuffer",
    "DtypeError",
    "EmptyBufferError",
    "EpisodeStats",
    "EpochIterator",
    "FieldSpec",
    "Hindsight",
    "MemoryWarning",
    "MetadataOnlyWarning",
    "MissingFieldError",
    "MixedBatch",
    "MixedReplay",
    "NextStepResetWarning",
    "NonFiniteError",
    "NotPicklableError",
    "OutOfRangeError",
    "PriorityError",
    "RateLimitTimeoutError",
    "ReadOnlyError",
    "Recorder",
    "ReplayBatch",
    "ReplayBuffer",
    "ReplaySequenceBatch",
    "ReplyError",
    "RlbufError",
    "RlbufWarning",
    "RolloutBatch",
    "RolloutBuffer",
    "RolloutIncompleteError",
    "SequenceBatch",
    "ShapeError",
    "ShardDiedError",
    "StoredIndexError",
    "StreamError",
    "Transition",
    "UnsupportedOperationError",
    "__version__",
]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'rlbuf' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
