"""Structured fields: dict (and nested dict) observations and hidden states, stored leaf by leaf.

A structured field (``obs``, ``next_obs``, ``hidden_state``) is either one tensor or a nested
mapping of named tensors. ``Layout`` is its description: the leaves, each a path of keys
with a per-row shape and dtype. It is read from a shape (``(4,)``), a mapping of shapes
(``{"camera": (3, 64, 64), "proprio": (12,)}``), a TorchRL ``Composite`` spec or a gymnasium
``Dict`` space, and it turns into one [`FieldSpec`][rlbuf.spec.FieldSpec] per leaf, stored at a
nested TorchRL key (``("observation", "camera")``, ``("next", "observation", "camera")``).
Adds are split into leaves here, and batches are assembled back into a ``TensorDict`` here.

Example:
    >>> import torch
    >>> layout = Layout.parse({"camera": (3, 8, 8), "proprio": (12,)}, {"camera": torch.uint8})
    >>> [spec.describe() for spec in layout.specs("obs", "observation")]
    ['obs["camera"]: (3, 8, 8) uint8', 'obs["proprio"]: (12,) float32']
    >>> layout.specs("obs", "observation")[0].key
    ('observation', 'camera')
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase, is_tensor_collection

from rlbuf._convert import MAX_DEPTH
from rlbuf.errors import ConfigError, MissingFieldError, ShapeError
from rlbuf.spec import FieldSpec, NestedKey, as_int, short_repr

Path = tuple[str, ...]
ObsShape: TypeAlias = "Sequence[int] | int | Mapping[str, Any] | Any"
"""A shape, a (nested) mapping of shapes, a TorchRL ``Composite`` or a gymnasium ``Dict`` space."""
ObsDtype: TypeAlias = "torch.dtype | Mapping[str, Any]"
"""One dtype, or a (nested) mapping of dtypes by observation key."""
_FLOAT_DEFAULT = torch.float32
MAX_DIMS = 62
"""Dims a row shape may have: torch's 64 less the two batch dims rlbuf puts before it (``[num_steps, num_envs]``,
``[batch, seq_len]``)."""


@dataclass(frozen=True)
class Leaf:
    """One stored tensor of a structured field: its path of keys, per-row shape and dtype."""

    path: Path
    shape: tuple[int, ...]
    dtype: torch.dtype


def leaf_name(name: str, path: Path) -> str:
    """The name a leaf's field goes by in messages: ``obs["sensors"]["imu"]`` (or ``obs``).

    Example:
        >>> leaf_name("obs", ("sensors", "imu")), leaf_name("obs", ())
        ('obs["sensors"]["imu"]', 'obs')
    """
    return name + "".join(f'["{key}"]' for key in path)


def is_structured(value: Any) -> bool:
    """Whether a shape option describes a dict observation (a mapping, gymnasium ``Dict``, TorchRL ``Composite``).

    Example:
        >>> is_structured({"camera": (3, 8, 8)}), is_structured((4,))
        (True, False)
    """
    return isinstance(value, Mapping) or _is_gym_dict(value) or _is_composite(value)


def _is_gym_dict(value: Any) -> bool:
    spaces = getattr(value, "spaces", None)
    return isinstance(spaces, Mapping) and type(value).__name__ == "Dict"


def _is_composite(value: Any) -> bool:
    return type(value).__name__ == "Composite" and hasattr(value, "items") and hasattr(value, "shape")


def _torch_dtype(dtype: Any, where: str) -> torch.dtype:
    """The torch dtype of a spec's or space's leaf, kept as it is (a float64 leaf stays float64, as a flat ``Box``)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return torch.from_numpy(np.zeros((), dtype=np.dtype(dtype))).dtype
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: cannot store dtype {dtype!r}") from None


def as_shape(shape: Any, name: str, *, batch_dims: int = 0) -> tuple[int, ...]:
    """A shape option as a tuple of non-negative ints (an int means a 1-D shape): the one shape check.

    Ints of Python, numpy or a ``torch.Size`` are welcome; bools, floats (even ``2.0``), strings
    and anything else are refused, in a flat shape and in every leaf of a dict observation alike.
    ``batch_dims`` leading dims (of a batched TorchRL spec) are not counted in the limit on dims.

    Raises:
        ConfigError: anything else (``(3.5,)``, ``(True,)``, ``("3",)``, ``"84"``, a negative size), or
            more than ``MAX_DIMS`` (62) dims: with the batch dims rlbuf adds, torch takes at most 64.

    Example:
        >>> as_shape(4, "obs_shape"), as_shape([84, 84], "obs_shape")
        ((4,), (84, 84))
        >>> as_shape((2, 2.0), "obs_shape['a']")
        Traceback (most recent call last):
        ...
        rlbuf.errors.ConfigError: obs_shape['a']: expected a tuple of non-negative ints, got (2, 2.0)
    """
    if not isinstance(shape, str | bytes | Mapping):
        if isinstance(shape, Sequence | torch.Size) or (isinstance(shape, np.ndarray) and shape.ndim == 1):
            if len(shape) - batch_dims > MAX_DIMS:
                raise ConfigError(f"{name}: expected at most {MAX_DIMS} dims (torch's 64 less the batch and time "
                                  f"dims of a batch), got {len(shape) - batch_dims}; flatten or reshape the field")
            with contextlib.suppress(ConfigError):
                return tuple(as_int(name, d, minimum=0) for d in shape)
        else:
            with contextlib.suppress(ConfigError):
                return (as_int(name, shape, minimum=0),)
    raise ConfigError(f"{name}: expected a tuple of non-negative ints, got {short_repr(shape)}")


def _where(option: str, path: Path) -> str:
    return option + "".join(f"[{key!r}]" for key in path)


def _leaves_of(value: Any, path: Path, option: str,
               batch_dims: int | None = None) -> list[tuple[Path, tuple[int, ...], torch.dtype | None]]:
    """(path, shape, dtype or None) of every leaf of a shape mapping, Composite spec or gymnasium Dict.

    A batched ``Composite`` (a vectorized env's ``observation_spec``, shape ``[num_envs]``) gives
    the shape of one env's observation: its leading batch dims are dropped from every leaf.
    """
    _check_depth(option, path)
    if _is_gym_dict(value):
        items: Any = value.spaces.items()
    elif _is_composite(value) or isinstance(value, Mapping):
        items = value.items()
        if batch_dims is None and _is_composite(value):
            batch_dims = len(value.shape)
    else:
        shape = getattr(value, "shape", value)
        dtype = getattr(value, "dtype", None)
        if dtype is not None and not isinstance(value, torch.Tensor | np.ndarray | np.generic):
            return [(path, as_shape(shape, _where(option, path), batch_dims=batch_dims or 0)[batch_dims or 0:],
                     _torch_dtype(dtype, _where(option, path)))]
        return [(path, as_shape(value, _where(option, path)), None)]
    out: list[tuple[Path, tuple[int, ...], torch.dtype | None]] = []
    for key, sub in items:
        if not isinstance(key, str) or not key:
            raise ConfigError(f"{_where(option, path)}: keys must be non-empty strings, got {key!r}")
        out.extend(_leaves_of(sub, (*path, key), option, batch_dims))
    if not out:
        raise ConfigError(f"{_where(option, path)}: expected at least one key, got an empty mapping")
    return out


def _dtype_at(dtypes: Any, path: Path, option: str) -> torch.dtype | None:
    node = dtypes
    for depth, key in enumerate(path):
        if not isinstance(node, Mapping):
            raise ConfigError(f"{_where(option, path[:depth])}: expected a mapping of dtypes to match the shapes, "
                              f"got {node!r}")
        if key not in node:
            return None
        node = node[key]
    if not isinstance(node, torch.dtype):
        raise ConfigError(f"{_where(option, path)}: expected a torch dtype, got {node!r}")
    return node


def _dtype_paths(dtypes: Mapping[str, Any], option: str, path: Path = ()) -> list[Path]:
    paths: list[Path] = []
    for key, sub in dtypes.items():
        _check_depth(option, (*path, key))
        paths.extend(_dtype_paths(sub, option, (*path, key)) if isinstance(sub, Mapping) else [(*path, key)])
    return paths


def _check_depth(option: str, path: Path) -> None:
    if len(path) > MAX_DEPTH:
        raise ConfigError(f"{_where(option, path[:3])}...: nested {len(path)} levels deep, more than the "
                          f"{MAX_DEPTH} a dict observation may have; flatten the keys")


@dataclass(frozen=True)
class Layout:
    """The leaves of a structured field; ``structured`` is False for a single tensor.

    Build one with ``Layout.parse``.
    """

    leaves: tuple[Leaf, ...]
    structured: bool

    @classmethod
    def parse(cls, shape: Any, dtype: Any = None, *, option: str = "obs_shape",
              dtype_option: str = "obs_dtype", default_dtype: torch.dtype = _FLOAT_DEFAULT) -> Layout:
        """Read a shape, a (nested) mapping of shapes, a TorchRL ``Composite`` or a gymnasium ``Dict``.

        ``dtype`` is one dtype for every leaf, or a mapping with the same nesting; leaves it
        does not name take the spec's or space's dtype, else ``default_dtype``.

        Raises:
            ConfigError: a malformed shape, an unknown key in ``dtype``, or a dtype mapping
                for a single-tensor field.

        Example:
            >>> Layout.parse((4,), torch.uint8).leaves
            (Leaf(path=(), shape=(4,), dtype=torch.uint8),)
            >>> Layout.parse({"a": 2}, {"b": torch.uint8})
            Traceback (most recent call last):
            ...
            rlbuf.errors.ConfigError: obs_dtype: keys [('b',)] are not observation keys [('a',)]
        """
        structured = is_structured(shape)
        found = _leaves_of(shape, (), option)
        if not structured:
            path, leaf_shape, own = found[0]
            if isinstance(dtype, Mapping):
                raise ConfigError(f"{dtype_option}: a mapping of dtypes needs a mapping of shapes in {option}")
            chosen = dtype if dtype is not None else own if own is not None else default_dtype
            if not isinstance(chosen, torch.dtype):
                raise ConfigError(f"{dtype_option}: expected a torch dtype, got {chosen!r}")
            return cls((Leaf((), leaf_shape, chosen),), False)
        if isinstance(dtype, Mapping):
            known = {path for path, _, _ in found}
            unknown = [path for path in _dtype_paths(dtype, dtype_option) if path not in known]
            if unknown:
                raise ConfigError(f"{dtype_option}: keys {unknown} are not observation keys {sorted(known)}")
        leaves = []
        for path, leaf_shape, own in found:
            if isinstance(dtype, Mapping):
                chosen = _dtype_at(dtype, path, dtype_option)
            elif dtype is not None:
                if not isinstance(dtype, torch.dtype):
                    raise ConfigError(f"{dtype_option}: expected a torch dtype or a mapping of them, got {dtype!r}")
                chosen = dtype
            else:
                chosen = None
            leaves.append(Leaf(path, leaf_shape, chosen or own or default_dtype))
        return cls(tuple(leaves), True)

    def specs(self, name: str, key: NestedKey | Callable[[Path], NestedKey]) -> list[FieldSpec]:
        """One field spec per leaf, at ``key`` + the leaf's path (or at ``key(path)``)."""
        def key_of(path: Path) -> NestedKey:
            if callable(key):
                return key(path)
            if not path:
                return key
            return (*((key,) if isinstance(key, str) else key), *path)
        return [FieldSpec(leaf_name(name, leaf.path), key_of(leaf.path), leaf.shape, leaf.dtype)
                for leaf in self.leaves]

    def options(self) -> tuple[Any, Any]:
        """``(shape, dtype)`` as plain constructor options (nested dicts), e.g. for checkpoints."""
        if not self.structured:
            return self.leaves[0].shape, self.leaves[0].dtype
        shapes: dict[str, Any] = {}
        dtypes: dict[str, Any] = {}
        for leaf in self.leaves:
            shape_node, dtype_node = shapes, dtypes
            for key in leaf.path[:-1]:
                shape_node = shape_node.setdefault(key, {})
                dtype_node = dtype_node.setdefault(key, {})
            shape_node[leaf.path[-1]] = leaf.shape
            dtype_node[leaf.path[-1]] = leaf.dtype
        return shapes, dtypes

    def split(self, name: str, value: Any) -> list[Any]:
        """The per-leaf values of one add, in leaf order (a single-tensor field passes through).

        Raises:
            MissingFieldError: a key missing from, or unknown to, a structured value.
            ShapeError: something else than a mapping or TensorDict for a structured field.

        Example:
            >>> layout = Layout.parse({"a": (2,), "b": {"c": ()}})
            >>> layout.split("obs", {"a": [1.0, 2.0], "b": {"c": 3.0}})
            [[1.0, 2.0], 3.0]
        """
        if not self.structured:
            return [value]
        if value is None:
            raise MissingFieldError(f"{name}: a value is required")
        if not (isinstance(value, Mapping) or is_tensor_collection(value)):
            raise ShapeError(f"{name}: expected a dict or TensorDict with keys "
                             f"{[leaf_name('', leaf.path) for leaf in self.leaves]}, got {type(value).__name__}")
        out = []
        for leaf in self.leaves:
            node = value
            for depth, key in enumerate(leaf.path):
                if not (isinstance(node, Mapping) or is_tensor_collection(node)) or key not in node:
                    raise MissingFieldError(f"{leaf_name(name, leaf.path[:depth + 1])}: missing")
                node = node[key]
            out.append(node)
        self._refuse_unknown(name, value, ())
        return out

    def _refuse_unknown(self, name: str, value: Any, path: Path) -> None:
        children = {leaf.path[len(path)] for leaf in self.leaves if leaf.path[:len(path)] == path and len(leaf.path) > len(path)}
        for key in tuple(value.keys()):  # iterating a TensorDict walks its batch dim, not its keys
            if key not in children:
                raise MissingFieldError(f"{leaf_name(name, (*path, key))}: not a key of this buffer's {name}; "
                                        f"keys are {sorted(children)}")
            sub = value[key]
            if isinstance(sub, Mapping) or is_tensor_collection(sub):
                self._refuse_unknown(name, sub, (*path, key))

    def assemble(self, name: str, columns: Mapping[str, torch.Tensor], batch_dims: int = 1) -> torch.Tensor | TensorDict:
        """The leaves' columns as one value: the tensor itself, or a nested ``TensorDict``.

        Example:
            >>> layout = Layout.parse({"a": (2,), "b": {"c": ()}})
            >>> td = layout.assemble("obs", {'obs["a"]': torch.zeros(5, 2), 'obs["b"]["c"]': torch.zeros(5)})
            >>> td["b", "c"].shape, td.batch_size
            (torch.Size([5]), torch.Size([5]))
        """
        if not self.structured:
            return columns[name]
        first = columns[leaf_name(name, self.leaves[0].path)]
        td = TensorDict({}, batch_size=first.shape[:batch_dims], device=first.device)
        for leaf in self.leaves:
            td.set(leaf.path, columns[leaf_name(name, leaf.path)])
        return td



def leaf_names(name: str, layout: Layout) -> list[str]:
    """Field names of a layout's leaves (``['obs']`` for a single tensor)."""
    return [leaf_name(name, leaf.path) for leaf in layout.leaves]


def torchrl_env_key(key: NestedKey) -> NestedKey | None:
    """Where a TorchRL ``GymEnv`` puts a dict observation's leaf: at the top level, without ``"observation"``.

    Example:
        >>> torchrl_env_key(("next", "observation", "camera")), torchrl_env_key("action")
        (('next', 'camera'), None)
    """
    if isinstance(key, str) or "observation" not in key or key[-1] == "observation":
        return None
    stripped = tuple(k for k in key if k != "observation")
    return stripped[0] if len(stripped) == 1 else stripped


def find_in_td(td: TensorDictBase, key: NestedKey) -> torch.Tensor | None:
    """The value at ``key`` in a tensordict, or where a TorchRL ``GymEnv`` puts it (a dict observation's
    leaves at the top level, a goal env's ``"observation"`` leaf too), or ``None``.

    Example:
        >>> td = TensorDict({"observation": torch.zeros(2, 3), "achieved_goal": torch.ones(2, 1)}, batch_size=[2])
        >>> find_in_td(td, ("observation", "observation")).shape, find_in_td(td, ("observation", "achieved_goal"))
        (torch.Size([2, 3]), tensor([[1.],
                [1.]]))
    """
    keys = [key, torchrl_env_key(key)]
    if isinstance(key, tuple) and key[-1] == "observation" and "observation" in key[:-1]:
        first = key.index("observation")  # a goal env's "observation" leaf, at the top level in GymEnv's layout
        stripped = key[:first] + key[first + 1:]
        keys.append(stripped[0] if len(stripped) == 1 else stripped)
    for candidate in keys:
        if candidate is None:
            continue
        try:
            found: torch.Tensor | None = td.get(candidate, None)
        except (ValueError, TypeError, KeyError):  # a tensor where the key needs a tensordict
            continue
        if found is not None:
            return found
    return None


# What writes a rollout's policy outputs in a TorchRL collector's batch: a PPO port's policy often returns an action alone.
_WRITTEN_BY = {
    "state_value": ("; run the critic on the batch before extend (a TorchRL ValueOperator writes 'state_value'), "
                    "and on td['next'] too where a time limit cut an episode (its bootstrap value)"),
    "sample_log_prob": ("; the policy writes it at collection (TorchRL's ProbabilisticActor(..., "
                        "return_log_prob=True): 'action_log_prob' is read too)"),
}


def missing_key(td: TensorDictBase, spec: FieldSpec) -> MissingFieldError:
    """The error of a field ``td`` lacks, with where TorchRL would have put it, or the keys ``td`` holds.

    Example:
        >>> td = TensorDict({"reward": torch.ones(4)}, batch_size=[4])
        >>> print(missing_key(td, FieldSpec("reward", ("next", "reward"), (), torch.float32)))
        reward: key ('next', 'reward') not found in the tensordict; it holds 'reward' at the top: TorchRL keeps a step's reward, end flags and next observation under 'next' (td['next', 'reward'])
    """
    key = (spec.key,) if isinstance(spec.key, str) else tuple(spec.key)
    held = [k if isinstance(k, str) else tuple(k) for k in td.keys(include_nested=True, leaves_only=True)]
    if key[0] == "next" and len(key) == 2 and key[1] in held:
        hint = (f"it holds {key[1]!r} at the top: TorchRL keeps a step's reward, end flags and next observation "
                f"under 'next' (td['next', {key[1]!r}])")
    else:
        shown = ", ".join(repr(k) for k in held[:12]) + (" ..." if len(held) > 12 else "")
        hint = f"it holds {shown or 'no keys'}"
        if spec.name in ("terminated", "truncated") and ("next", "done") in held:
            hint += ("; ('next', 'done') alone does not tell a time limit from a termination: set "
                     "td['next', 'terminated'] (and 'truncated' where a time limit cut the episode; "
                     "without it, done & ~terminated is taken as truncated)")
        hint += _WRITTEN_BY.get(spec.key, "") if isinstance(spec.key, str) else ""
    return MissingFieldError(f"{spec.name}: key {spec.key!r} not found in the tensordict; {hint}")


def read_td(td: TensorDictBase, spec: FieldSpec, lead: tuple[int, ...]) -> torch.Tensor:
    """The value of ``spec`` in a TorchRL tensordict of batch size ``lead``, at its key or the env's key.

    Raises:
        MissingFieldError: neither key is in ``td``.
        ShapeError: the value is not ``[*lead, *shape]`` (a scalar's trailing 1 optional).

    Example:
        >>> td = TensorDict({"next": {"reward": torch.ones(4, 1)}}, batch_size=[4])
        >>> read_td(td, FieldSpec("reward", ("next", "reward"), (), torch.float32, trailing_one=True), (4,)).shape
        torch.Size([4, 1])
    """
    value = find_in_td(td, spec.key)
    if value is None:
        raise missing_key(td, spec)
    if not spec.fits_rows(value.shape, lead):
        raise ShapeError(f"{spec.name}: expected shape {(*lead, *spec.td_shape)} at key {spec.key!r}, "
                         f"got {tuple(value.shape)}")
    return value


def hidden_state_key(path: Path) -> str:
    """TorchRL's recurrent-state keys: ``recurrent_state`` (a GRU) or ``recurrent_state_h`` (an LSTM's ``h``).

    Example:
        >>> hidden_state_key(()), hidden_state_key(("h",))
        ('recurrent_state', 'recurrent_state_h')
    """
    return "_".join(("recurrent_state", *path))


def hidden_state_layout(shape: Any) -> Layout:
    """The layout of a ``hidden_state_shape`` option: one shape or a flat mapping of shapes, float32.

    Raises:
        ConfigError: a malformed shape or nested keys.

    Example:
        >>> [leaf.path for leaf in hidden_state_layout({"h": (1, 8), "c": (1, 8)}).leaves]
        [('h',), ('c',)]
    """
    layout = Layout.parse(shape, torch.float32, option="hidden_state_shape", dtype_option="hidden_state_shape")
    deep = [leaf.path for leaf in layout.leaves if len(leaf.path) > 1]
    if deep:
        raise ConfigError(f"hidden_state_shape: expected a shape or a flat mapping of shapes, got nested keys {deep}")
    return layout


def check_hidden_state(layout: Layout | None, hidden_state: Any) -> None:
    """Refuse a step whose hidden state is missing (the buffer stores one) or unexpected (it stores none).

    Raises:
        MissingFieldError: ``hidden_state`` given without a ``layout``, or missing with one.

    Example:
        >>> check_hidden_state(None, None)
        >>> check_hidden_state(None, torch.zeros(2, 8))
        Traceback (most recent call last):
        ...
        rlbuf.errors.MissingFieldError: hidden_state: this buffer was built without hidden_state_shape
    """
    if layout is None and hidden_state is not None:
        # gymnasium's infos (a dict: {} when nothing to say, "_"-masked keys, "final_obs", "episode") or SB3's
        # (a list of one dict per env); not a hidden state's {"h": ..., "c": ...} or (h, c).
        infos = (isinstance(hidden_state, dict) and (not hidden_state or any(
            str(key).startswith("_") or key in ("final_obs", "final_info", "episode") for key in hidden_state))) or (
            isinstance(hidden_state, (list, tuple)) and bool(hidden_state)
            and all(isinstance(value, dict) for value in hidden_state))
        raise MissingFieldError("hidden_state: this buffer was built without hidden_state_shape" + (
            "; the argument after truncated is hidden_state, and add takes no infos (with gymnasium, use "
            "rlbuf.gym.Recorder, which reads info['final_obs'])" if infos else ""))
    if layout is not None and hidden_state is None:
        raise MissingFieldError("hidden_state: this buffer stores one with every step")


def record_layout(options: MutableMapping[str, Any], shape: Any, dtype: Any, *, option: str = "obs_shape",
                  dtype_option: str = "obs_dtype") -> Layout:
    """Parse a structured option and keep its plain form in the buffer's recorded ``options``.

    A ``Composite`` spec or a gymnasium space is not JSON: checkpoints keep nested dicts of
    shapes and dtypes instead, which rebuild the same buffer.
    """
    from rlbuf._state import option_to_json

    layout = Layout.parse(shape, dtype, option=option, dtype_option=dtype_option)
    if layout.structured:
        plain_shape, plain_dtype = layout.options()
        options[option] = option_to_json(plain_shape)
        options[dtype_option] = option_to_json(plain_dtype)
    return layout
