"""rlbuf: typed, fast, correct replay and rollout buffers for PyTorch RL, built on TorchRL."""

from rlbuf._base import MetadataOnlyWarning
from rlbuf.batches import DistillationBatch, ReplayBatch, RolloutBatch
from rlbuf.distill import DistillationBuffer
from rlbuf.epochs import EpochIterator
from rlbuf.errors import (
    BatchSizeError,
    BufferFullError,
    CheckpointError,
    ConfigError,
    DeviceError,
    DtypeError,
    EmptyBufferError,
    MissingFieldError,
    NonFiniteError,
    PriorityError,
    RlbufError,
    RolloutIncompleteError,
    ShapeError,
    StoredIndexError,
)
from rlbuf.gae import GAE
from rlbuf.gym import Recorder
from rlbuf.replay import ReplayBuffer, Transition
from rlbuf.rollout import RolloutBuffer
from rlbuf.spec import FieldSpec
from rlbuf.stats import EpisodeStats

__version__ = "0.1.0"

__all__ = [
    "GAE",
    "BatchSizeError",
    "BufferFullError",
    "CheckpointError",
    "ConfigError",
    "DeviceError",
    "DistillationBatch",
    "DistillationBuffer",
    "DtypeError",
    "EmptyBufferError",
    "EpisodeStats",
    "EpochIterator",
    "FieldSpec",
    "MetadataOnlyWarning",
    "MissingFieldError",
    "NonFiniteError",
    "PriorityError",
    "Recorder",
    "ReplayBatch",
    "ReplayBuffer",
    "RlbufError",
    "RolloutBatch",
    "RolloutBuffer",
    "RolloutIncompleteError",
    "ShapeError",
    "StoredIndexError",
    "Transition",
    "__version__",
]
