"""Spaces to fields: the shape and dtype a buffer stores for a gymnasium space or a TorchRL spec.

| space / spec | stored shape | stored dtype |
|---|---|---|
| ``Box(low, high, shape, dtype)`` | ``shape`` | ``dtype`` (``uint8`` stays ``uint8``) |
| ``Discrete(n)`` | ``()`` (an index) | ``int64`` |
| ``MultiDiscrete(nvec)`` | ``nvec.shape`` | ``int64`` |
| ``MultiBinary(n)`` | ``(n,)`` (or its shape) | ``int8`` |
| TorchRL ``Bounded``, ``Unbounded``, ``OneHot``, ``Categorical``, ``Binary``, ... | its ``shape`` | its ``dtype`` |
| TorchRL ``Composite`` | its ``"observation"`` (or ``"action"``) entry, batch dims dropped | that entry's |
| ``Dict`` / a ``Composite`` of observation keys (observations only) | a dict observation: one field per key | each key's |

``Dict`` observation spaces (and TorchRL ``Composite`` specs whose entries are the observation
keys) give a dict-observation buffer (see ``resolve_field``, ``structured=True``): every key of a
``Dict`` is a field, one named ``"observation"`` too (gymnasium's ``GoalEnv`` layout), and every
leaf keeps its space's dtype, as a flat ``Box`` does (``float64`` stays ``float64``);
``field_of`` itself, and so ``action_space=``, still refuses them with a ``ConfigError``, as
it refuses ``Tuple`` and ``Text``.
``MultiBinary`` is stored as ``int8``, not ``bool``: gymnasium's ``MultiBinary`` samples and
envs emit ``int8`` arrays, and a bool field would refuse them (kinds never change); TorchRL's
``Binary`` spec is ``int8`` too. A vector env's batched spaces (``envs.observation_space``)
are not what a buffer wants: give it ``envs.single_observation_space`` and
``envs.single_action_space``. A batched TorchRL env's leaf specs carry its batch dims: pass
``env.observation_spec`` (a ``Composite``, whose batch dims are dropped) and
``env.action_spec_unbatched``, or ``env.full_action_spec`` (a ``Composite``).

Example:
    >>> import gymnasium as gym
    >>> import numpy as np
    >>> field_of(gym.spaces.Box(0, 255, (84, 84, 4), np.uint8), "observation_space")
    ((84, 84, 4), torch.uint8)
    >>> field_of(gym.spaces.Discrete(6), "action_space")
    ((), torch.int64)
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from rlbuf._bounds import Bounds
from rlbuf._dtypes import dtype_options
from rlbuf._dtypes import extra_field_dtypes as extra_field_dtypes
from rlbuf._obs import Layout, as_shape, is_structured
from rlbuf.errors import BatchedSpaceWarning, ConfigError, MemoryWarning

_ENTRY = {"observation_space": "observation", "action_space": "action"}


def field_of(space: Any, name: str) -> tuple[tuple[int, ...], torch.dtype]:
    """The ``(shape, dtype)`` of one stored row for a gymnasium space or a TorchRL spec.

    Args:
        space: a gymnasium ``Box``, ``Discrete``, ``MultiDiscrete`` or ``MultiBinary``, or a
            TorchRL spec (a leaf spec, or a ``Composite`` holding ``"observation"`` /
            ``"action"``).
        name: the option it came from (``"observation_space"``, ``"action_space"``), for messages.

    Raises:
        ConfigError: a space rlbuf cannot store as one field (``Dict``, ``Tuple``, ``Text``,
            ...), or a ``Composite`` without the expected entry.

    Example:
        >>> import gymnasium as gym
        >>> from torchrl.data import Composite, OneHot, Unbounded
        >>> field_of(gym.spaces.MultiDiscrete([3, 4]), "action_space")
        ((2,), torch.int64)
        >>> field_of(OneHot(5), "action_space")
        ((5,), torch.bool)
        >>> field_of(Composite(observation=Unbounded((8, 3)), shape=(8,)), "observation_space")
        ((3,), torch.float32)
        >>> field_of(gym.spaces.Dict({"a": gym.spaces.Discrete(2)}), "observation_space")
        Traceback (most recent call last):
        ...
        rlbuf.errors.ConfigError: observation_space: a Dict space cannot be stored as one field; supported: Box, Discrete, MultiDiscrete, MultiBinary and TorchRL specs (Bounded, Unbounded, OneHot, Categorical, Binary, ..., or a Composite holding 'observation')
    """
    if isinstance(space, spaces.Box):
        return tuple(space.shape), _torch_dtype(space.dtype, name)
    if isinstance(space, spaces.Discrete):
        return (), torch.int64
    if isinstance(space, spaces.MultiDiscrete):
        return tuple(space.shape), torch.int64
    if isinstance(space, spaces.MultiBinary):
        return tuple(space.shape), torch.int8
    from torchrl.data import Composite, TensorSpec

    if isinstance(space, Composite):
        entry = _ENTRY.get(name, "observation")
        if entry not in space:
            raise ConfigError(f"{name}: the Composite spec has no {entry!r} entry (keys: {list(space.keys())}); "
                              f"pass the spec of the field to store")
        leaf = space[entry]
        if isinstance(leaf, Composite):
            raise ConfigError(f"{name}: {entry!r} is itself a Composite spec (a dict observation): pass one "
                              f"of its entries")
        return tuple(leaf.shape[len(space.shape):]), leaf.dtype
    if isinstance(space, TensorSpec):
        return tuple(space.shape), space.dtype
    entry = _ENTRY.get(name, "observation")
    raise ConfigError(f"{name}: a {type(space).__name__} space cannot be stored as one field; supported: Box, "
                      f"Discrete, MultiDiscrete, MultiBinary and TorchRL specs (Bounded, Unbounded, OneHot, "
                      f"Categorical, Binary, ..., or a Composite holding {entry!r})")


def resolve_field(space: Any, shape: Any, dtype: Any, *, space_name: str, shape_name: str,
                  structured: bool = False) -> tuple[Any, Any]:
    """A buffer option pair: ``(shape, dtype)`` from ``space``, or the given shape (dtype default float32).

    ``dtype`` may override the space's dtype (e.g. float32 for a float64 ``Box``). With
    ``structured`` (observations), a gymnasium ``Dict`` space (every key, ``"observation"`` too)
    or a TorchRL ``Composite`` is passed on as the shape and an unset dtype stays unset: the
    buffer's layout reads both. Given as ``obs_shape``, a ``Composite`` reads as it does as
    ``observation_space``.

    Raises:
        ConfigError: both a space and a shape, or neither.

    Example:
        >>> import gymnasium as gym
        >>> resolve_field(gym.spaces.Discrete(2), None, None, space_name="action_space", shape_name="action_shape")
        ((), torch.int64)
        >>> resolve_field(None, (3,), None, space_name="observation_space", shape_name="obs_shape")
        ((3,), torch.float32)
        >>> resolve_field(gym.spaces.Discrete(2), (), None, space_name="action_space", shape_name="action_shape")
        Traceback (most recent call last):
        ...
        rlbuf.errors.ConfigError: action_space, action_shape: give one of them, not both (the space sets the shape)
    """
    if space is not None and shape is not None:
        raise ConfigError(f"{space_name}, {shape_name}: give one of them, not both (the space sets the shape)")
    if space is None:
        if shape is None:
            raise ConfigError(f"{shape_name}: required (or give {space_name}=, e.g. envs.single_{space_name})")
        from torchrl.data import Composite

        if not (structured and isinstance(shape, Composite)):
            return shape, torch.float32 if dtype is None and not structured else dtype
        space = shape  # a Composite reads the same as a shape as it does as a space: its "observation" entry
    if structured and isinstance(space, spaces.Dict):
        # A dict observation, every key a field, as obs_shape= reads it: a key named "observation"
        # (gymnasium's GoalEnv layout) is one key among the others.
        return space, dtype
    if structured and is_structured(space):
        # A Composite of observation keys, or one whose "observation" entry is itself one (a
        # TorchRL env's observation_spec). The buffer's layout reads each leaf.
        entry = space.get("observation", None) if hasattr(space, "get") and not isinstance(space, dict) else None
        if entry is None or is_structured(entry):
            return space if entry is None else entry, dtype
    space_shape, space_dtype = field_of(space, space_name)
    return space_shape, space_dtype if dtype is None else dtype


def resolve_fields(observation_space: Any, obs_shape: Any, obs_dtype: Any, action_space: Any, action_shape: Any,
                   action_dtype: Any, *, num_envs: Any = 1) -> tuple[Any, Any, Any, Any]:
    """A buffer constructor's ``(obs_shape, obs_dtype, action_shape, action_dtype)``, from spaces or shapes.

    Each pair goes through ``resolve_field``; observations may be structured (a dict observation),
    actions may not. Dtypes may be named (``"int64"``). Warns ([`BatchedSpaceWarning`][rlbuf.errors.BatchedSpaceWarning])
    for a vector env's batched space given for ``num_envs`` envs, and ([`MemoryWarning`][rlbuf.errors.MemoryWarning])
    for a float64 ``Box`` observation or action space without ``obs_dtype`` / ``action_dtype``.

    Raises:
        ConfigError: a space and its shape both given, or neither, an unsupported space, or a
            malformed shape (``(3.5,)``, a dict nested deeper than ``MAX_DEPTH``).

    Example:
        >>> import gymnasium as gym
        >>> resolve_fields(None, (3,), None, gym.spaces.Discrete(2), None, None)
        ((3,), None, (), torch.int64)
    """
    obs_dtype, action_dtype = dtype_options(obs_dtype, action_dtype)
    for space, name in ((observation_space, "observation_space"), (action_space, "action_space")):
        warn_if_batched(space, name, num_envs)
    for space, dtype, (name, option, what) in ((observation_space, obs_dtype, ("observation", "obs", "observations")),
                                               (action_space, action_dtype, ("action", "action", "actions"))):
        if isinstance(space, spaces.Box) and space.dtype == np.float64 and dtype is None:
            warnings.warn(f"{name}_space: a float64 Box (as MuJoCo's) is stored as float64, 8 bytes a value; "
                          f"{option}_dtype=torch.float32 halves the memory and matches a float32 network (float64 "
                          f"{what} are converted as they are added)", MemoryWarning, stacklevel=3)
    obs_shape, obs_dtype = resolve_field(observation_space, obs_shape, obs_dtype, space_name="observation_space",
                                         shape_name="obs_shape", structured=True)
    action_shape, action_dtype = resolve_field(action_space, action_shape, action_dtype, space_name="action_space",
                                               shape_name="action_shape")
    # Checked here, before a buffer records its options: every leaf's shape, and the nesting's depth.
    Layout.parse(obs_shape, obs_dtype)
    as_shape(action_shape, "action_shape")
    return obs_shape, obs_dtype, action_shape, action_dtype


def looks_batched(space: Any, num_envs: Any) -> bool:
    """Whether ``space`` looks like a vector env's batched space for ``num_envs`` envs: its first dim is
    ``num_envs`` and it repeats one space along it (a ``Box`` of 2 dims or more with the same bounds in
    every slice, or a ``MultiDiscrete`` of ``num_envs`` equal entries, the batch of a ``Discrete``).

    A single env's space may look so too (4 stacked frames with ``num_envs=4``): it is a warning.

    Example:
        >>> import gymnasium as gym
        >>> envs_space = gym.vector.utils.batch_space(gym.spaces.Box(-1, 1, (3,)), 4)
        >>> looks_batched(envs_space, 4), looks_batched(gym.spaces.Box(-1, 1, (4,)), 4)
        (True, False)
    """
    if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 2:
        return False
    shape = tuple(getattr(space, "shape", None) or ())
    if not shape or shape[0] != num_envs:
        return False
    if isinstance(space, spaces.Box):
        return len(shape) >= 2 and all(bool((bound == bound[:1]).all()) for bound in (space.low, space.high))
    if isinstance(space, spaces.MultiDiscrete):
        return len(shape) == 1 and bool((space.nvec == space.nvec[0]).all())
    if isinstance(space, spaces.MultiBinary):
        return len(shape) >= 2
    from torchrl.data import Bounded, Categorical, Composite, TensorSpec

    if isinstance(space, Composite) or not isinstance(space, TensorSpec):
        return False  # a Composite's own shape is its batch, which field_of leaves out
    if isinstance(space, Categorical):  # one env's index is a scalar
        return len(shape) == 1
    if isinstance(space, Bounded):
        return len(shape) >= 2 and all(bool((bound == bound[:1]).all()) for bound in (space.low, space.high))
    return len(shape) >= 2


def warn_if_batched(space: Any, name: str, num_envs: Any) -> None:
    """Warn ([`BatchedSpaceWarning`][rlbuf.errors.BatchedSpaceWarning]) when ``space`` looks like ``envs.{name}``
    given for ``envs.single_{name}`` (see [`looks_batched`][rlbuf.spaces.looks_batched])."""
    if looks_batched(space, num_envs):
        single = (f"env.{_ENTRY[name]}_spec_unbatched (one env's spec)" if not isinstance(space, spaces.Space)
                  else f"envs.single_{name} (one env's space)")
        warnings.warn(f"{name}: shape {tuple(space.shape)} starts with num_envs={num_envs}: it looks like a vector "
                      f"env's batched space (envs.{name}, a batched TorchRL env's spec); pass {single}, else every "
                      f"add is refused", BatchedSpaceWarning, stacklevel=4)


def _torch_dtype(dtype: Any, name: str) -> torch.dtype:
    try:
        return torch.from_numpy(np.zeros(0, dtype=dtype)).dtype
    except TypeError:
        raise ConfigError(f"{name}: the space's dtype {dtype} has no torch equivalent") from None


def resolve_action_range(action_space: Any, action_range: Any, action_shape: Any) -> list[Any] | None:
    """The ``action_range`` option as recorded (``[low, high]``): the discrete action space's, or the one given.

    Raises:
        ConfigError: both a range and an action space given, or a malformed range.

    Example:
        >>> import gymnasium as gym
        >>> resolve_action_range(gym.spaces.Discrete(4), None, ())
        [0, 3]
        >>> resolve_action_range(None, (0, 9), ()), resolve_action_range(gym.spaces.Box(-1, 1), None, (1,))
        ([0, 9], None)
    """
    if action_range is not None and action_space is not None:
        raise ConfigError("action_range, action_space: give one of them, not both (a discrete space sets the range)")
    shape = as_shape(action_shape, "action_shape")
    bounds = Bounds.of_space(action_space) if action_space is not None else Bounds.parse(action_range, shape)
    if bounds is not None:
        bounds.check_shape("action_range", shape)
    return None if bounds is None else bounds.to_json()
