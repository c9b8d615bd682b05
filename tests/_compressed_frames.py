"""Streams of frames of three kinds, a compressed buffer and its uncompressed twin fed alike, and their
comparison, for ``tests/test_compression*.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from rlbuf import EmptyBufferError, ReplayBuffer

DATA = Path(__file__).parent / "data" / "breakout_steps.npz"
FRAME = (6, 5)


def _frame(rng: np.random.Generator, kind: int) -> np.ndarray:
    """Frames of three kinds: a flat colour, a pattern with a moving dot, noise (incompressible)."""
    if kind == 0:
        return np.full(FRAME, rng.integers(0, 4), np.uint8)
    if kind == 1:
        frame = np.tile(np.arange(FRAME[1], dtype=np.uint8), (FRAME[0], 1))
        frame[rng.integers(0, FRAME[0]), rng.integers(0, FRAME[1])] = 255
        return frame
    return rng.integers(0, 256, FRAME, dtype=np.uint8)


def _steps(num_envs: int, frame_stack: int, steps: int, seed: int, end_rate: float,
           padding_type: str = "reset") -> Iterator[dict[str, Any]]:
    """Steps of ``num_envs`` envs, stacked as gymnasium's ``FrameStackObservation`` stacks them."""
    rng = np.random.default_rng(seed)

    def first(frame: np.ndarray) -> list[np.ndarray]:  # an episode's first stack
        return [frame] * frame_stack if padding_type == "reset" else [np.zeros_like(frame)] * (frame_stack - 1) + [frame]

    stacks = [first(_frame(rng, 0)) for _ in range(num_envs)]
    for t in range(steps):
        new = [_frame(rng, int(rng.integers(0, 3))) for _ in range(num_envs)]
        ends = rng.random(num_envs) < end_rate
        cut = ends & (rng.random(num_envs) < 0.5)
        next_stacks = [[*stacks[e][1:], new[e]] for e in range(num_envs)]
        shape = (num_envs, frame_stack, *FRAME) if frame_stack > 1 else (num_envs, *FRAME)
        yield {"obs": torch.from_numpy(np.stack([np.stack(s) for s in stacks]).reshape(shape)),
               "action": torch.from_numpy(rng.integers(0, 4, num_envs)),
               "reward": torch.from_numpy(rng.standard_normal(num_envs).astype(np.float32)),
               "next_obs": torch.from_numpy(np.stack([np.stack(s) for s in next_stacks]).reshape(shape)),
               "terminated": torch.from_numpy(ends & ~cut), "truncated": torch.from_numpy(cut), "t": t}
        for e in range(num_envs):
            stacks[e] = first(_frame(rng, 0)) if ends[e] else next_stacks[e]


def _pair(capacity: int, num_envs: int, frame_stack: int, n_step: int, compression: str = "zstd",
          **options: Any) -> tuple[ReplayBuffer, ReplayBuffer]:
    shape = (frame_stack, *FRAME) if frame_stack > 1 else FRAME
    level = options.pop("compression_level", None)
    made = [ReplayBuffer(capacity, obs_shape=shape, action_shape=(), obs_dtype=torch.uint8, action_dtype=torch.int64,
                         num_envs=num_envs, frame_stack=frame_stack, n_step=n_step, compact=True, seed=3,
                         compression=codec, compression_level=level if codec else None, **options)
            for codec in (None, compression)]
    return made[0], made[1]


def _add(buffers: tuple[ReplayBuffer, ...], step: dict[str, Any], **kwargs: Any) -> None:
    for buffer in buffers:
        buffer.add(step["obs"], step["action"], step["reward"], step["next_obs"], step["terminated"],
                   step["truncated"], **kwargs)


def _everything(buffer: ReplayBuffer) -> Any:
    """Every complete transition, then three seeded draws."""
    if len(buffer) == 0:
        return []
    try:
        seen = [buffer.sample_all()]
    except EmptyBufferError:  # nothing complete yet: both must say so alike
        return ["empty"]
    seen += [buffer.sample(5) for _ in range(3)]
    return [{name: value.clone() for name, value in batch.to_tensordict().items(include_nested=True, leaves_only=True)}
            for batch in seen]


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    return bool(a == b)


def _env_major(steps: list[dict[str, Any]]) -> TensorDict:
    """``steps`` as one TensorDict of batch size ``[num_envs, T]``, as TorchRL collectors give them."""
    def stacked(name: str) -> torch.Tensor:
        return torch.stack([step[name] for step in steps], 1)
    return TensorDict({"observation": stacked("obs"), "action": stacked("action"),
                       ("next", "observation"): stacked("next_obs"), ("next", "reward"): stacked("reward"),
                       ("next", "terminated"): stacked("terminated"), ("next", "truncated"): stacked("truncated")},
                      batch_size=[len(steps[0]["obs"]), len(steps)])


def _saved(tmp_path: Path, codec: str = "zstd") -> tuple[Path, ReplayBuffer]:
    _, compressed = _pair(32, 2, 4, 3, codec)
    for step in _steps(2, 4, 50, 6, 0.1):
        _add((compressed,), step)
    path = tmp_path / "ckpt"
    compressed.save(path)
    return path, compressed
