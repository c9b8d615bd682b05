"""Declaring fields: extra fields, the name collisions refused between any two fields, and the end flags of a
TensorDict (``terminated``, ``truncated``, ``done``) that buffers and the GAE transform read alike.

Every stored field has a name (what batches and messages call it) and a TorchRL key (where
``extend`` reads it and ``buffer.torchrl`` stores it); a dict observation's leaf is also read at
its env key (TorchRL's ``GymEnv`` puts ``("observation", "a")`` at ``"a"``). Two fields whose
names or keys meet would store one value twice or lose one: ``check_names`` refuses them when
the buffer is built.

Example:
    >>> fields = [FieldSpec('obs["a"]', ("observation", "a"), (2,), torch.float32),
    ...           FieldSpec("a", "a", (), torch.float32)]
    >>> check_names(fields)
    Traceback (most recent call last):
    ...
    rlbuf.errors.ConfigError: obs["a"] and a: both read at TorchRL key 'a' (a dict observation's leaf is also read at its env key), so one would overwrite or lose the other; rename one of them (an extra field is stored at its own name: choose another for it)
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

import torch
from tensordict import TensorDictBase

from rlbuf._obs import as_shape, torchrl_env_key
from rlbuf.errors import ConfigError, MissingFieldError, ShapeError
from rlbuf.spec import FieldSpec, NestedKey

# Names every batch uses for its own attributes, and TorchRL's private keys ("_weight", "_data").
BATCH_NAMES = {"index": "an attribute of every batch", "weight": "an attribute of every batch",
                "extras": "an attribute of every batch"}
# Columns and attributes of sequence batches: an extra field of that name (an action "mask") is stored and
# sampled as usual, and refused by the calls that make sequences, whose column it would hide.
_MASK = "a column of sequence batches (steps inside the episode)"
_IS_INIT = "the key of is_first in a sequence batch's to_tensordict() (TorchRL's recurrent modules read it)"
SEQUENCE_COLUMNS = {"mask": _MASK, "is_first": "a column of sample_sequences batches (the first step of an episode)",
                    "is_init": _IS_INIT, "burn_in": "an attribute of sample_sequences batches (the burn-in steps)"}
"""What ``ReplayBuffer.sample_sequences`` adds to a batch."""
TRAJECTORY_COLUMNS = {"mask": _MASK, "is_init": _IS_INIT, "env": "an attribute of sequence minibatches (each "
                      "trajectory's env)", "start": "an attribute of sequence minibatches (each trajectory's first step)"}
"""What ``RolloutBuffer.minibatches(sequences=True)`` adds to a batch."""


def refuse_hidden_columns(names: Collection[str], columns: Mapping[str, str], call: str) -> None:
    """Refuse ``call`` when an extra field of ``names`` has the name of one of its batches' ``columns``.

    Example:
        >>> refuse_hidden_columns(["mask", "goal"], TRAJECTORY_COLUMNS, "minibatches(sequences=True)")
        Traceback (most recent call last):
        ...
        rlbuf.errors.ConfigError: minibatches(sequences=True): the extra field 'mask' has the name of a column of sequence batches (steps inside the episode), which it would hide; rename the extra field (extra_fields={'mask_': ...})
    """
    hiding = sorted(set(columns) & set(names))
    if hiding:
        raise ConfigError(f"{call}: the extra field {hiding[0]!r} has the name of {columns[hiding[0]]}, which it "
                          f"would hide; rename the extra field (extra_fields={{'{hiding[0]}_': ...}})")


# Keyword arguments of add() that are not fields: an extra field of that name could never be given.
ADD_ARGUMENTS = {"hidden_state": "an argument of add() (declare hidden states with hidden_state_shape=)",
                 "env_mask": "an argument of add()",
                 "metrics": "an argument of add() (per-step values for EpisodeStats(metrics=...))"}

TRUNCATED_MISSING = ("truncated: the tensordict has no ('next', 'truncated') and no ('next', 'done') to derive it "
                     "from, so its time-limit ends would be read as no end; add ('next', 'truncated') (your "
                     "env's truncations; all False for an env without time limit), or ('next', 'done') = "
                     "terminated | truncated")
"""Why a TensorDict without ``truncated`` or ``done`` is refused (a buffer's ``extend``, the GAE transform)."""


def refuse_padding(td: TensorDictBase) -> None:
    """Refuse a TensorDict whose ``("collector", "mask")`` marks padded rows (a TorchRL collector's
    ``split_trajs=True``): every row of an ``extend`` is stored as a transition.

    Example:
        >>> from tensordict import TensorDict
        >>> refuse_padding(TensorDict({("collector", "mask"): torch.tensor([True, False])}, [2]))
        Traceback (most recent call last):
        ...
        rlbuf.errors.ShapeError: td: ('collector', 'mask') marks 1 of 2 rows as padding (a collector's split_trajs=True pads each trajectory to the longest), which would be stored as transitions; collect with split_trajs=False (the default) and extend with the batch as it comes
    """
    mask = td.get(("collector", "mask"), None)
    if isinstance(mask, torch.Tensor) and not bool(mask.all()):
        raise ShapeError(f"td: ('collector', 'mask') marks {int((mask == 0).sum())} of {mask.numel()} rows as padding "
                         f"(a collector's split_trajs=True pads each trajectory to the longest), which would be stored "
                         f"as transitions; collect with split_trajs=False (the default) and extend with the batch as "
                         f"it comes")


def check_given_done(given: torch.Tensor | None, terminated: torch.Tensor, truncated: torch.Tensor) -> None:
    """Refuse a TensorDict's ``("next", "done")`` that is not ``terminated | truncated`` (the flags shaped as the
    TensorDict's batch): an episode end only ``done`` marks would be stored as no end.

    Example:
        >>> check_given_done(torch.tensor([[False], [True]]), torch.tensor([False, False]), torch.tensor([False, False]))
        Traceback (most recent call last):
        ...
        rlbuf.errors.ConfigError: done: key ('next', 'done') is True at batch index (1,), where terminated and truncated are False, so that episode end would be lost; set ('next', 'terminated') or ('next', 'truncated') there, or leave done out (it is derived from them)
    """
    if given is None:
        return
    derived = terminated.to(torch.bool) | truncated.to(torch.bool)
    if tuple(given.shape) not in (tuple(derived.shape), (*derived.shape, 1)):  # TorchRL's trailing 1 optional
        raise ShapeError(f"done: expected shape {(*derived.shape, 1)} at key ('next', 'done'), got {tuple(given.shape)}")
    done = given.reshape(derived.shape).to(device=derived.device, dtype=torch.bool)
    differs = (done != derived).nonzero()
    if differs.numel():
        at = tuple(differs[0].tolist())
        if bool(done[at]):
            raise ConfigError(f"done: key ('next', 'done') is True at batch index {at}, where terminated and truncated "
                              f"are False, so that episode end would be lost; set ('next', 'terminated') or "
                              f"('next', 'truncated') there, or leave done out (it is derived from them)")
        raise ConfigError(f"done: key ('next', 'done') is False at batch index {at}, where terminated or truncated is "
                          f"True; done is terminated | truncated: fix it there, or leave it out (it is derived from them)")


def done_flag(td: TensorDictBase, key: tuple[str, str], lead: tuple[int, ...]) -> torch.Tensor | None:
    """A done-type flag at ``key`` as a ``[*lead]`` tensor (TorchRL's trailing 1 optional), or None."""
    value: torch.Tensor | None = td.get(key, None)
    if value is None:
        return None
    if tuple(value.shape) not in (lead, (*lead, 1)):
        raise ShapeError(f"{key[1]}: expected shape {(*lead, 1)} at key {key!r}, got {tuple(value.shape)}")
    return value.reshape(lead)


def truncated_from(td: TensorDictBase, lead: tuple[int, ...], terminated: torch.Tensor) -> torch.Tensor:
    """``("next", "truncated")`` of ``td``, else ``done & ~terminated``.

    Raises:
        MissingFieldError: ``td`` has neither: its timeouts would be lost (read as no truncation).

    Example:
        >>> from tensordict import TensorDict
        >>> td = TensorDict({"next": {"done": torch.tensor([True, True])}}, batch_size=[2])
        >>> truncated_from(td, (2,), torch.tensor([True, False])).tolist()
        [False, True]
    """
    truncated = done_flag(td, ("next", "truncated"), lead)
    if truncated is not None:
        return truncated
    done = done_flag(td, ("next", "done"), lead)
    if done is None:
        raise MissingFieldError(TRUNCATED_MISSING)
    return done.to(torch.bool) & ~terminated.reshape(lead).to(torch.bool)


def extra_specs(extra_fields: Mapping[str, tuple[Sequence[int] | int, torch.dtype]] | None,
                builtin: Sequence[FieldSpec], reserved: Mapping[str, str] | None = None) -> list[FieldSpec]:
    """Field specs for user-declared extra fields, stored at their own top-level key.

    A name may not alias a built-in field: neither its rlbuf name nor the top-level part of its
    TorchRL key (``"state_value"``, ``"next"`` ...), derived from ``builtin`` itself.

    Args:
        extra_fields: ``{"name": (shape, dtype)}`` as the user passed it.
        builtin: the buffer's own fields.
        reserved: further names this buffer refuses, with the reason shown in the error.

    Raises:
        ConfigError: a malformed declaration, or a name that is reserved or not an identifier.

    Example:
        >>> fixed = [FieldSpec("value", "state_value", (), torch.float32)]
        >>> extra_specs({"state_value": ((), torch.float32)}, fixed)
        Traceback (most recent call last):
        ...
        rlbuf.errors.ConfigError: extra_fields: 'state_value' is reserved: the TorchRL key of the built-in field 'value'; choose another name
    """
    taken = {**BATCH_NAMES, **ADD_ARGUMENTS}
    for spec in builtin:
        top = spec.key if isinstance(spec.key, str) else spec.key[0]
        taken.setdefault(top, f"the TorchRL key of the built-in field {spec.name!r}")
        taken[spec.name] = "a built-in field"
    taken.update(reserved or {})
    if extra_fields is None:
        return []
    if not isinstance(extra_fields, Mapping):
        raise ConfigError(f"extra_fields: expected a dict {{name: (shape, dtype)}}, got {type(extra_fields).__name__}")
    specs = []
    for name, declared in extra_fields.items():
        if not isinstance(name, str) or not name.isidentifier() or name.startswith("_"):
            raise ConfigError(f"extra_fields: {name!r} is not a public identifier (letters, digits, '_'; "
                              f"not starting with '_')")
        if name in taken:
            raise ConfigError(f"extra_fields: {name!r} is reserved: {taken[name]}; choose another name")
        if not isinstance(declared, (tuple, list)) or len(declared) != 2:
            raise ConfigError(f"extra_fields[{name!r}]: expected (shape, dtype), got {declared!r}")
        shape, dtype = declared
        specs.append(FieldSpec(name, name, as_shape(shape, f"extra_fields[{name!r}]"), dtype))
    return specs



def _path(key: NestedKey) -> tuple[str, ...]:
    return (key,) if isinstance(key, str) else tuple(key)


def check_names(specs: Sequence[FieldSpec]) -> None:
    """Refuse two fields whose names or TorchRL keys meet (equal, or one nested inside the other).

    Names meet when equal or when one is a leaf of the other (``hidden_state`` and
    ``hidden_state["h"]``); keys when equal or when one is a prefix of the other, counting
    the env key a dict observation's leaf is also read at.

    Raises:
        ConfigError: naming both fields and the fix.

    Example:
        >>> check_names([FieldSpec('hidden_state["h"]', "recurrent_state_h", (4,), torch.float32),
        ...              FieldSpec("recurrent_state_h", "recurrent_state_h", (4,), torch.float32)])
        Traceback (most recent call last):
        ...
        rlbuf.errors.ConfigError: hidden_state["h"] and recurrent_state_h: both stored at TorchRL key 'recurrent_state_h', so one would overwrite or lose the other; rename one of them (an extra field is stored at its own name: choose another for it)
    """
    names: dict[str, FieldSpec] = {}
    keys: dict[tuple[str, ...], tuple[FieldSpec, bool]] = {}
    for spec in specs:
        own = [(_path(spec.key), False)]
        env_key = torchrl_env_key(spec.key)
        if env_key is not None:
            own.append((_path(env_key), True))
        for name, other in names.items():
            if spec.name == name or spec.name.startswith(name + "[") or name.startswith(spec.name + "["):
                _refuse(other, spec, f"both named {min(name, spec.name, key=len)!r} (or a leaf of it)")
        for path, read_only in own:
            for other_path, (other, other_read_only) in keys.items():
                shorter = min(len(path), len(other_path))
                if path[:shorter] == other_path[:shorter]:
                    shared = path if len(path) <= len(other_path) else other_path
                    shown = shared[0] if len(shared) == 1 else shared
                    how = "read" if read_only or other_read_only else "stored"
                    note = " (a dict observation's leaf is also read at its env key)" if how == "read" else ""
                    _refuse(other, spec, f"both {how} at TorchRL key {shown!r}{note}")
        names[spec.name] = spec
        for path, read_only in own:
            keys[path] = (spec, read_only)


def _refuse(first: FieldSpec, second: FieldSpec, why: str) -> None:
    raise ConfigError(f"{first.name} and {second.name}: {why}, so one would overwrite or lose the other; rename "
                      f"one of them (an extra field is stored at its own name: choose another for it)")
