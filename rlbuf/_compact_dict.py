"""Dict observations in the compact layout: one image key followed frame by frame, the others stored per row.

In ``{"image": (4, 84, 84) uint8, "state": (4, 7) float32}`` (gymnasium's ``FrameStackObservation``
of a ``Dict`` space stacks every key) the image is what costs memory: it is stored the compact way
(one frame per row, rebuilt from each env's stream, compressed with ``compression``). Every other
key is stored whole with each row, for ``obs`` and ``next_obs`` alike, as ordinary fields: small
vectors cost little, and need no stream. A sampled ``next_obs`` of those keys is read from the last
row of the transition's n steps, the row whose next observation the image's next frame comes from,
so every key is what a buffer storing whole transitions returns.

The image key is ``compact_key=`` (``"image"``, or a path of keys ``("sensors", "camera")``), or,
left out, the one ``uint8`` key whose frame has at least 2 dims.

Example:
    >>> import torch
    >>> from rlbuf._obs import Layout
    >>> obs = Layout.parse({"image": (4, 84, 84), "state": (4, 7)}, {"image": torch.uint8})
    >>> followed_path(obs, None, frame_stack=4)
    ('image',)
    >>> row_leaves(obs, ("image",))
    (('obs["state"]', 'next_obs["state"]'),)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from rlbuf._obs import Layout, Leaf, Path, leaf_name
from rlbuf.errors import ConfigError
from rlbuf.spec import FieldSpec

_MIN_IMAGE_DIMS = 2


def _frame_of(leaf: Leaf, frame_stack: int) -> tuple[int, ...]:
    return leaf.shape[1:] if frame_stack > 1 else leaf.shape


def _describe(leaf: Leaf) -> str:
    return f"{leaf_name('obs', leaf.path)}: {leaf.shape} {str(leaf.dtype).removeprefix('torch.')}"


def followed_path(obs: Layout, compact_key: Any, *, frame_stack: int) -> Path:
    """The path of the key a compact buffer of dict observations stores frame by frame.

    Args:
        obs: the dict observation's layout (as ``add`` takes it: whole stacks with ``frame_stack``).
        compact_key: a key (``"image"``), a path of keys (``("sensors", "camera")``), or ``None``:
            the one ``uint8`` key whose frame (without the stack dim) has at least 2 dims.
        frame_stack: frames per observation.

    Raises:
        ConfigError: an unknown key, a group of keys, a key that is no image, or no single image
            key to infer.

    Example:
        >>> obs = Layout.parse({"a": (8, 8), "b": (8, 8)}, torch.uint8)
        >>> followed_path(obs, None, frame_stack=1)
        Traceback (most recent call last):
        ...
        rlbuf.errors.ConfigError: compact_key: the compact layout stores one image key of a dict observation frame by frame; 2 keys could be it (obs["a"]: (8, 8) uint8, obs["b"]: (8, 8) uint8): pass compact_key= one of ['a', 'b']
    """
    leaves = obs.leaves
    if compact_key is None:
        images = [leaf for leaf in leaves
                  if leaf.dtype == torch.uint8 and len(_frame_of(leaf, frame_stack)) >= _MIN_IMAGE_DIMS]
        if len(images) == 1:
            return images[0].path
        names = [_key_repr(leaf.path) for leaf in (images or leaves)]
        found = (f"{len(images)} keys could be it ({', '.join(map(_describe, images))})" if images else
                 f"no key is a uint8 image of at least {_MIN_IMAGE_DIMS} dims per frame "
                 f"({', '.join(map(_describe, leaves))})")
        raise ConfigError(f"compact_key: the compact layout stores one image key of a dict observation frame by "
                          f"frame; {found}: pass compact_key= one of {names}")
    path = _as_path(compact_key)
    by_path = {leaf.path: leaf for leaf in leaves}
    leaf = by_path.get(path)
    if leaf is None:
        group = [_key_repr(p) for p in by_path if p[:len(path)] == path]
        what = f"a group of keys {group}, not one tensor" if group else "not a key of the observation"
        raise ConfigError(f"compact_key={compact_key!r}: {what}; keys are {[_key_repr(p) for p in by_path]}")
    frame = _frame_of(leaf, frame_stack)
    if len(frame) < _MIN_IMAGE_DIMS:
        raise ConfigError(f"compact_key={compact_key!r}: expected an image key (a frame of at least "
                          f"{_MIN_IMAGE_DIMS} dims, e.g. (84, 84) or (3, 64, 64)), got {_describe(leaf)}"
                          + (f" with frame_stack={frame_stack}" if frame_stack > 1 else "")
                          + "; the other keys are stored whole with every row")
    return path


def _as_path(compact_key: Any) -> Path:
    if isinstance(compact_key, str) and compact_key:
        return (compact_key,)
    if (isinstance(compact_key, Sequence) and not isinstance(compact_key, str) and compact_key
            and all(isinstance(key, str) and key for key in compact_key)):
        return tuple(compact_key)
    raise ConfigError(f"compact_key: expected a key (\"image\") or a tuple of keys (\"sensors\", \"camera\"), "
                      f"got {compact_key!r}")


def _key_repr(path: Path) -> Any:
    return path[0] if len(path) == 1 else path


def key_option(path: Path) -> str | list[str]:
    """``compact_key`` as a buffer records it (a checkpoint's JSON): the key, or the list of keys of a path.

    Example:
        >>> key_option(("image",)), key_option(("sensors", "camera"))
        ('image', ['sensors', 'camera'])
    """
    return path[0] if len(path) == 1 else list(path)


def stored_options(obs: Layout, path: Path, frame_shape: tuple[int, ...],
                   frame_dtype: torch.dtype) -> tuple[dict[str, Any], dict[str, Any]]:
    """The observation's ``(shapes, dtypes)`` as a compact buffer stores them: the followed key as one frame
    (``frame_shape``, ``frame_dtype``: an int32 size when compressed), every other key whole.

    Example:
        >>> stored_options(Layout.parse({"image": (4, 8, 8), "state": (3,)}), ("image",), (8, 8), torch.uint8)
        ({'image': (8, 8), 'state': (3,)}, {'image': torch.uint8, 'state': torch.float32})
    """
    shapes, dtypes = obs.options()
    node, dtype_node = shapes, dtypes
    for key in path[:-1]:
        node, dtype_node = node[key], dtype_node[key]
    node[path[-1]], dtype_node[path[-1]] = frame_shape, frame_dtype
    return shapes, dtypes


def row_leaves(obs: Layout, path: Path) -> tuple[tuple[str, str], ...]:
    """``(obs field, next_obs field)`` of every key stored whole with each row.

    Example:
        >>> row_leaves(Layout.parse({"image": (2, 2), "state": (3,)}), ("image",))
        (('obs["state"]', 'next_obs["state"]'),)
    """
    return tuple((leaf_name("obs", leaf.path), leaf_name("next_obs", leaf.path)) for leaf in obs.leaves
                 if leaf.path != path)


class DictInputs:
    """Splits the observations of ``add`` for a compact buffer of dict observations: the followed
    key's values for the streams, and the other keys' values by ring field name.

    Example:
        >>> inputs = DictInputs(Layout.parse({"image": (2, 2), "state": (3,)}), ("image",))
        >>> image, next_image, rest = inputs.split({"image": 1, "state": 2}, {"image": 3, "state": 4})
        >>> image, next_image, rest
        (1, 3, {'obs["state"]': 2, 'next_obs["state"]': 4})
    """

    def __init__(self, obs: Layout, path: Path) -> None:
        self.obs = obs
        self.at = [leaf.path for leaf in obs.leaves].index(path)
        self.names = [(leaf_name("obs", leaf.path), leaf_name("next_obs", leaf.path)) for leaf in obs.leaves]

    def split(self, obs: Any, next_obs: Any) -> tuple[Any, Any, dict[str, Any]]:
        """``(followed obs, followed next_obs, {field: value})`` of one add.

        Raises:
            MissingFieldError: a key missing from, or unknown to, either observation.
            ShapeError: something else than a mapping or TensorDict.
        """
        obs_values, next_values = self.obs.split("obs", obs), self.obs.split("next_obs", next_obs)
        rest: dict[str, Any] = {}
        for i, (obs_name, next_name) in enumerate(self.names):
            if i != self.at:
                rest[obs_name], rest[next_name] = obs_values[i], next_values[i]
        return obs_values[self.at], next_values[self.at], rest


def ring_values(specs: Sequence[FieldSpec], values: Mapping[str, Any]) -> tuple[Any, ...]:
    """``values`` in the order of the ring's input fields ``specs``."""
    return tuple(values[spec.name] for spec in specs)
