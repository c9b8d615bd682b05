"""Final observations kept aside by a compact layout: the observation that ended an episode, which the env replaced
by a reset one, one slot per stored row that ended an episode (see [`rlbuf._streams`][rlbuf._streams]).

Example:
    >>> finals = FinalFrames((2,), torch.float32, torch.device("cpu"))
    >>> finals.put(np.ones((2, 2), np.float32)).tolist()
    [0, 1]
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from rlbuf.errors import CheckpointError

_Ints = npt.NDArray[np.int64]


class FinalFrames:
    """Final observations (or their newest frame) kept aside, in reusable slots that grow on demand.

    Example:
        >>> finals = FinalFrames((2,), torch.float32, torch.device("cpu"))
        >>> slots = finals.put(np.ones((3, 2), np.float32))
        >>> finals.release(slots[:1]); finals.put(np.zeros((1, 2), np.float32)).tolist()   # a freed slot is reused
        [0]
    """

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> None:
        self.frames = torch.zeros((0, *shape), dtype=dtype, device=device)
        self.top = 0
        self.free: list[int] = []

    def put(self, values: np.ndarray[Any, Any]) -> _Ints:
        """Store ``values`` (numpy, one per row, of the stored dtype) and return their slots."""
        count = int(values.shape[0])
        reused = [self.free.pop() for _ in range(min(count, len(self.free)))]
        fresh = count - len(reused)
        if self.top + fresh > self.frames.shape[0]:
            grown = torch.empty((max(16, 2 * self.frames.shape[0], self.top + fresh), *self.frames.shape[1:]),
                                dtype=self.frames.dtype, device=self.frames.device)
            grown[:self.top] = self.frames[:self.top]
            self.frames = grown
        slots = np.array(reused + list(range(self.top, self.top + fresh)), np.int64)
        self.top += fresh
        if count and self.frames.is_cpu:  # numpy: a tensor's indexed assignment is ~50x slower per frame
            self.frames.numpy()[slots] = values
        elif count:
            self.frames[torch.from_numpy(slots).to(self.frames.device)] = torch.from_numpy(values).to(self.frames.device)
        return slots

    @property
    def nbytes(self) -> int:
        """Bytes of the slots allocated."""
        return self.frames.numel() * self.frames.element_size()

    def release(self, slots: _Ints) -> None:
        """Free ``slots`` for reuse (their rows were overwritten)."""
        self.free.extend(int(s) for s in slots)

    def take(self, slots: _Ints) -> torch.Tensor:
        """The frames in ``slots``."""
        if self.frames.is_cpu:  # numpy: torch's index_select of uint8 frames is several times slower on the CPU
            return torch.from_numpy(self.frames.numpy().take(slots, axis=0))
        return self.frames.index_select(0, torch.from_numpy(slots).to(self.frames.device))

    def clear(self) -> None:
        """Forget every frame (the memory is given back)."""
        self.frames = self.frames[:0].clone()
        self.top = 0
        self.free = []

    def state_dict(self) -> dict[str, Any]:
        """The used slots and the free list, as tensors."""
        return {"frames": self.frames[:self.top].cpu(), "free": torch.tensor(self.free, dtype=torch.int64)}

    def structure_problem(self, state: Any) -> str:
        """``""`` when ``state`` has the form of this ``state_dict``, else why not."""
        if not isinstance(state, dict) or set(state) != {"frames", "free"}:
            return "stream table finals must hold 'frames' and 'free'"
        frames, free, frame = state["frames"], state["free"], tuple(self.frames.shape[1:])
        if (not isinstance(frames, torch.Tensor) or frames.dtype != self.frames.dtype
                or frames.dim() != 1 + len(frame) or tuple(frames.shape[1:]) != frame):
            return f"final observations must be {self.frames.dtype} frames of shape {frame}"
        if not isinstance(free, torch.Tensor) or free.dtype != torch.int64 or free.dim() != 1:
            return "the free final-observation slots must be a 1-D int64 tensor"
        return ""

    @staticmethod
    def slots(state: dict[str, Any]) -> int:
        """Slots kept in a ``state_dict`` (used or free)."""
        return int(state["frames"].shape[0])

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a ``state_dict``."""
        frames = state["frames"]
        if tuple(frames.shape[1:]) != tuple(self.frames.shape[1:]) or frames.dtype != self.frames.dtype:
            raise CheckpointError(f"state: final observations of shape {tuple(frames.shape[1:])} {frames.dtype}, "
                                  f"expected {tuple(self.frames.shape[1:])} {self.frames.dtype}")
        self.frames = frames.to(self.frames.device).clone()
        self.top = int(frames.shape[0])
        self.free = [int(s) for s in state["free"].tolist()]
