"""A rollout buffer's rows: its stored fields, and the reading of a collector's TensorDict into them.

Example:
    >>> import torch
    >>> [s.name for s in rollout_specs((3,), (), None, torch.float32, torch.int64, None)][:4]
    ['obs', 'action', 'reward', 'terminated']
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase

from rlbuf._bounds import Bounds
from rlbuf._convert import _NUMPY_DTYPES
from rlbuf._fields import (
    BATCH_NAMES,
    TRAJECTORY_COLUMNS,
    TRUNCATED_MISSING,
    check_given_done,
    extra_specs,
    refuse_hidden_columns,
    refuse_padding,
)
from rlbuf._keywords import check_extras, refuse_foreign_names
from rlbuf._obs import Layout, check_hidden_state, find_in_td, leaf_names, missing_key
from rlbuf._ring import RowRing
from rlbuf.batches import Transition
from rlbuf.errors import (
    BufferFullError,
    CheckpointError,
    ConfigError,
    DeviceError,
    DtypeError,
    MissingFieldError,
    RlbufError,
    ShapeError,
)
from rlbuf.sequences import SequenceBatch, split_trajectories
from rlbuf.spec import ExtraFields, FieldSpec, as_array, as_tensordict, check_strided

_STEP_FIELDS = ("obs", "action", "reward", "terminated", "truncated", "value", "log_prob", "bootstrap_value")
COMPUTED = ("advantage", "returns")
_LOG_PROB_KEYS = ("sample_log_prob", "action_log_prob")
BUILT_IN = frozenset((*_STEP_FIELDS, *COMPUTED, "done", "privileged_obs"))


def rollout_specs(obs_shape: Any, action_shape: tuple[int, ...], privileged_obs_shape: tuple[int, ...] | None,
                  obs_dtype: Any, action_dtype: torch.dtype,
                  extra_fields: ExtraFields | None, action_range: Any = None) -> tuple[FieldSpec, ...]:
    """The stored fields of a rollout buffer, in TorchRL keys.

    Example:
        >>> [s.name for s in rollout_specs((3,), (), None, torch.float32, torch.int64, None)]
        ['obs', 'action', 'reward', 'terminated', 'truncated', 'value', 'log_prob', 'bootstrap_value', 'advantage', 'returns', 'done']
    """
    specs = [
        *Layout.parse(obs_shape, obs_dtype).specs("obs", "observation"),
        FieldSpec("action", "action", action_shape, action_dtype, bounds=Bounds.parse(action_range, action_shape)),
        FieldSpec("reward", ("next", "reward"), (), torch.float32, finite=True, trailing_one=True),
        FieldSpec("terminated", ("next", "terminated"), (), torch.bool, trailing_one=True),
        FieldSpec("truncated", ("next", "truncated"), (), torch.bool, trailing_one=True),
        FieldSpec("value", "state_value", (), torch.float32, finite=True, trailing_one=True),
        FieldSpec("log_prob", "sample_log_prob", (), torch.float32, finite=True),
        FieldSpec("bootstrap_value", ("next", "state_value"), (), torch.float32, finite=True, trailing_one=True),
        FieldSpec("advantage", "advantage", (), torch.float32, trailing_one=True),
        FieldSpec("returns", "value_target", (), torch.float32, trailing_one=True),
        FieldSpec("done", ("next", "done"), (), torch.bool, trailing_one=True),
    ]
    if privileged_obs_shape is not None:
        action_at = specs.index(next(s for s in specs if s.name == "action"))
        specs.insert(action_at, FieldSpec("privileged_obs", "privileged_observation", privileged_obs_shape,
                                          torch.float32))
    reserved = {key: "a key rlbuf reads log-probabilities from" for key in _LOG_PROB_KEYS}
    reserved["hidden_state"] = "the recurrent state field (declare it with hidden_state_shape)"
    if privileged_obs_shape is None:
        reserved["privileged_obs"] = "a built-in field (declare it with privileged_obs_shape, not as an extra)"
        reserved["privileged_observation"] = "the TorchRL key of the built-in field 'privileged_obs'"
    return (*specs, *extra_specs(extra_fields, specs, reserved))


def zeros_column(columns: Mapping[str, Any]) -> Any:
    """Advantages and returns until GAE computes them: zeros, one per row (numpy for the numpy views
    of a CPU storage, else a tensor on the rewards' device)."""
    reward = columns["reward"]
    if isinstance(reward, np.ndarray):
        return np.zeros(reward.shape[0], np.float32)
    return torch.zeros(reward.shape[0], dtype=torch.float32, device=reward.device)


def rollout_columns(td: Any, ring: RowRing, *, num_envs: int, free_steps: int,
                    whole: bool) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], int]:
    """The rows of a collector's ``[num_envs, T]`` TensorDict, time-major, each read by its field's reader.

    Args:
        td: the TensorDict (``[T]`` for one env).
        ring: the rollout's ring (its readers).
        num_envs: envs of the rollout.
        free_steps: steps the rollout still has room for.
        whole: the rollout is empty, so advantages a GAE transform wrote are read too when ``T``
            fills it.

    Returns:
        The input fields ``[T * num_envs, ...]`` by name, ``advantage`` and ``returns`` if read,
        and ``T``.

    Raises:
        BufferFullError: more than ``free_steps`` steps.
        MissingFieldError, ShapeError, DtypeError, NonFiniteError: a field is missing or does not fit.
    """
    td = as_tensordict(td)
    refuse_padding(td)
    batch = tuple(td.batch_size)
    if len(batch) == 1 and num_envs == 1:
        td = td.unsqueeze(0)
        batch = tuple(td.batch_size)
    if len(batch) != 2 or batch[0] != num_envs:
        raise ShapeError(f"td: expected batch size ({num_envs}, T), got {batch}")
    steps = batch[1]
    if steps > free_steps:
        raise BufferFullError(f"extend: {steps} steps do not fit; {free_steps} of {ring.capacity // num_envs} left")
    time_major = td.transpose(0, 1)
    rows = steps * num_envs

    def rows_of(spec: FieldSpec, value: torch.Tensor) -> torch.Tensor:
        received = (value.shape[1], value.shape[0], *value.shape[2:]) if value.dim() >= 2 else tuple(value.shape)
        if not spec.fits_rows(received, (num_envs, steps)):
            raise ShapeError(f"{spec.name}: expected shape {(num_envs, steps, *spec.td_shape)} at key "
                             f"{spec.key!r}, got {tuple(received)}")
        return value.reshape(rows, *spec.shape)

    columns: dict[str, torch.Tensor] = {}
    for spec in ring.input_specs:
        value = _read_rollout_key(time_major, spec)
        if value is None:
            raise missing_key(time_major, spec)
        columns[spec.name] = ring.reader(spec, rows).tensor(rows_of(spec, value))
    check_given_done(td.get(("next", "done"), None), columns["terminated"].view(steps, num_envs).T,
                     columns["truncated"].view(steps, num_envs).T)
    if bool(columns["truncated"].any()) and time_major.get(("next", "state_value"), None) is None:
        raise MissingFieldError("bootstrap_value: the rollout has truncated steps but no ('next', 'state_value')")
    # Advantages a GAE transform already wrote are kept when they cover the whole rollout.
    computed: dict[str, torch.Tensor] = {}
    if whole and steps == free_steps:
        for name in COMPUTED:
            spec = ring.by_name[name]
            value = time_major.get(spec.key, None)
            if value is not None:
                computed[name] = ring.reader(replace(spec, finite=True), rows).tensor(rows_of(spec, value))
    return columns, computed, steps


_STEP_FIELD = ("rlbuf's name is {}, a step field stored by add (set_extras attaches new tensors, or replaces "
               "advantage and returns)")
_FOREIGN_EXTRAS = {
    "advantages": "rlbuf's name is advantage (with returns, it replaces the computed advantages)",
    **{name: _STEP_FIELD.format(field) for name, field in [
        ("values", "value"), ("log_probs", "log_prob"), ("logprobs", "log_prob"), ("logprob", "log_prob"),
        ("rewards", "reward"), ("actions", "action"), ("observations", "obs"),
        ("dones", "terminated (and truncated: done is derived)")]},
}
"""A hand-written buffer's key for a field the rollout stores -> rlbuf's name, for ``set_extras``."""


def checked_extras(mapping: Any, ring: RowRing, *, num_steps: int, num_envs: int) -> dict[str, torch.Tensor]:
    """The tensors of ``RolloutBuffer.set_extras``, checked: new ``[num_steps, num_envs, ...]`` tensors, or
    ``advantage`` and ``returns`` together, as their stored fields (finite).

    Raises:
        MissingFieldError: not a dict, a name that is not usable, one of advantage/returns, or another stored field.
        ShapeError, DtypeError, DeviceError, NonFiniteError: a tensor that does not fit.

    Example:
        >>> from rlbuf import RolloutBuffer
        >>> buf = RolloutBuffer(2, 1, obs_shape=(1,), action_shape=())
        >>> checked_extras({"advantage": torch.zeros(2, 1)}, buf._ring, num_steps=2, num_envs=1)
        Traceback (most recent call last):
        ...
        rlbuf.errors.MissingFieldError: set_extras: advantage and returns go together (both, or neither)
    """
    if not isinstance(mapping, Mapping):
        raise MissingFieldError(f"set_extras: expected a dict of tensors, got {type(mapping).__name__}")
    given = set(mapping.keys())  # a TensorDict iterates along its batch dim: its keys are the names
    for name in given & _FOREIGN_EXTRAS.keys() - ring.by_name.keys():  # attached, they left the field as it was
        raise MissingFieldError(f"set_extras: got {name!r}; {_FOREIGN_EXTRAS[name]}")
    if given & set(COMPUTED) and not set(COMPUTED) <= given:
        raise MissingFieldError("set_extras: advantage and returns go together (both, or neither)")
    checked: dict[str, torch.Tensor] = {}
    for name, tensor in mapping.items():
        if name not in ring.by_name and (problem := attached_name_problem(name, ring)):  # stored ones: below
            raise MissingFieldError(f"set_extras: {problem}")
        if not isinstance(tensor, torch.Tensor):
            raise ShapeError(f"{name}: expected a tensor, got {type(tensor).__name__}")
        if tensor.device.type == "meta":
            raise DeviceError(f"{name}: got a tensor on the meta device (it holds no values)")
        lead = (num_steps, num_envs)
        if name in ring.by_name and name not in COMPUTED:
            raise MissingFieldError(f"{name}: a stored step field; set_extras attaches new tensors or replaces "
                                    f"advantage and returns")
        if name in ring.by_name:
            replace(ring.by_name[name], finite=True).check_tensor(tensor, lead, (tensor.device,))
        else:
            _check_attached(name, tensor, lead)
        checked[name] = tensor.detach()  # stored values, not a node of the caller's autograd graph
    return checked


def attached_name_problem(name: Any, ring: RowRing) -> str:
    """Why ``name`` cannot be an attached extra (``set_extras``, a checkpoint's), or ``""``: a public identifier, not
    a stored field, nor a batch's own attribute (``batch.mask``) or a key its ``to_tensordict()`` writes
    (``"value_target"``, ``"next"``, ``"is_init"``), which the extra would hide or replace.

    Example:
        >>> from rlbuf import RolloutBuffer
        >>> attached_name_problem("value_target", RolloutBuffer(2, 1, obs_shape=(1,), action_shape=())._ring)
        "'value_target' is not a usable name: the TorchRL key of a stored field"
    """
    if not isinstance(name, str) or not name.isidentifier() or name.startswith("_"):
        return f"{name!r} is not a usable name (a public identifier, not starting with '_')"
    keys = {spec.key if isinstance(spec.key, str) else spec.key[0] for spec in ring.specs}
    taken = {**dict.fromkeys(keys, "the TorchRL key of a stored field"), **dict.fromkeys(ring.by_name, "a stored field"),
             "is_init": "a key of a sequence minibatch's to_tensordict()"}
    taken.update(dict.fromkeys(sorted(set(BATCH_NAMES) | _batch_attributes() - set(ring.by_name)),
                               "an attribute of the rollout's batches"))
    return f"{name!r} is not a usable name: {taken[name]}" if name in taken else ""


def saved_iterator_rows(method: str, arguments: Mapping[str, Any], size: int, fields: Mapping[str, torch.Tensor],
                        *, num_envs: int, capacity: int) -> int | None:
    """Rows (trajectories) a rollout's saved ``minibatches()`` iterator runs over (``None``: another method).

    Raises:
        CheckpointError: one ``minibatches()`` would refuse: a rollout not full, an extra field named like a
            sequence batch's column.
    """
    if method != "minibatches":
        return None
    if size != capacity:
        raise CheckpointError(f"state: a minibatches() iterator runs over a full rollout, the state holds {size} of "
                              f"{capacity} rows")
    if not arguments.get("sequences"):
        return capacity
    try:
        refuse_hidden_columns(fields, TRAJECTORY_COLUMNS, "minibatches(sequences=True)")
    except ConfigError as error:
        raise CheckpointError(f"state: a saved iterator of {error}") from error
    return len(split_trajectories(fields["done"].view(-1, num_envs)))


@functools.cache
def _batch_attributes() -> frozenset[str]:
    """The attributes and methods of a rollout's batches (``RolloutBatch``, ``SequenceBatch``), read once."""
    from rlbuf.batches import RolloutBatch
    from rlbuf.sequences import SequenceBatch

    return frozenset(name for batch in (RolloutBatch, SequenceBatch) for name in dir(batch) if not name.startswith("_"))


def _check_attached(name: str, tensor: torch.Tensor, lead: tuple[int, int]) -> None:
    """A new extra: dense, ``[num_steps, num_envs, ...]``, of a dtype a buffer stores (and a checkpoint writes)."""
    check_strided(name, tensor)
    if tensor.dtype not in _NUMPY_DTYPES:
        stored = ", ".join(str(dtype) for dtype in _NUMPY_DTYPES)
        raise DtypeError(f"{name}: expected one of the dtypes a buffer stores ({stored}), got {tensor.dtype}; "
                         f"convert it first, e.g. tensor.to(torch.float32) (torch.view_as_real for complex)")
    if tensor.dim() < 2 or tuple(tensor.shape[:2]) != lead:
        raise ShapeError(f"{name}: expected shape ({lead[0]}, {lead[1]}, ...), got {tuple(tensor.shape)}")


def refuse_whole_step(obs: Any) -> None:
    """Refuse a ``RolloutBuffer.add`` given a whole step in place of ``obs``: a replay's
    [`Transition`][rlbuf.Transition] (Velora's push of an Experience) or a TensorDict (ObjectRL's add).

    Example:
        >>> from rlbuf.batches import Transition
        >>> refuse_whole_step(Transition(0.0, 0, 1.0, 0.0, False, truncated=False))
        Traceback (most recent call last):
        ...
        rlbuf.errors.MissingFieldError: add: got a Transition in place of obs; a rollout's add takes the fields, add(obs, action, reward, terminated, value, log_prob, truncated=..., bootstrap_value=...), not a Transition (ReplayBuffer.add takes one: a Transition has no value or log_prob)
    """
    if isinstance(obs, Transition):
        raise MissingFieldError("add: got a Transition in place of obs; a rollout's add takes the fields, add(obs, "
                                "action, reward, terminated, value, log_prob, truncated=..., bootstrap_value=...), "
                                "not a Transition (ReplayBuffer.add takes one: a Transition has no value or log_prob)")
    if isinstance(obs, TensorDictBase):
        raise MissingFieldError("add: got a TensorDict in place of obs; extend(td) stores a collector's [num_envs, T] "
                                "rollout, add(obs, action, reward, terminated, value, log_prob, truncated=...) one step")


def step_values(fields: dict[str, Any], hidden_state: Any, extras: Mapping[str, Any], *, num_envs: int,
                obs_layout: Layout, hidden: Layout | None, extra_specs: Mapping[str, FieldSpec],
                privileged: bool) -> dict[str, Any]:
    """The values of one ``RolloutBuffer.add`` by stored field name (defaults filled in, leaves split),
    once every required one is there.

    Raises:
        MissingFieldError: a required value, an extra field or the bootstrap of a truncation is missing.

    Example:
        >>> layout = Layout.parse((1,), None)
        >>> fields = dict(obs=torch.zeros(1, 1), action=0.0, reward=0.0, terminated=False, value=0.0, log_prob=0.0,
        ...               truncated=False, privileged_obs=None, bootstrap_value=None)
        >>> sorted(step_values(fields, None, {}, num_envs=1, obs_layout=layout, hidden=None, extra_specs={},
        ...                    privileged=False))[:3]
        ['action', 'bootstrap_value', 'log_prob']
    """
    obs, action, reward, terminated = fields["obs"], fields["action"], fields["reward"], fields["terminated"]
    value, log_prob, truncated = fields["value"], fields["log_prob"], fields["truncated"]
    privileged_obs, bootstrap_value = fields["privileged_obs"], fields["bootstrap_value"]
    refuse_foreign_names(extra_specs, extras)  # first: done=, truncations= and SB3's names get the rlbuf names
    if truncated is None:
        refuse_whole_step(obs)
        raise MissingFieldError("truncated: required with every step: pass truncated=False for envs without time "
                                "limit; with gymnasium, add(..., terminated=terminations, value, log_prob, "
                                "truncated=truncations, bootstrap_value=...); CleanRL's done is not terminated (a "
                                "timeout would count as a death), nor is SB3's episode_start in the 4th place (the "
                                "previous step's done: each end would be stored a step late)")
    if truncated is False:  # for every env: one flag per row
        truncated = np.zeros(num_envs, np.bool_)
    if bootstrap_value is None:
        if any_true(truncated):
            raise MissingFieldError("bootstrap_value: required at a step where an env is truncated: pass "
                                    "V(final observation) so the timeout bootstraps instead of counting as a death")
        bootstrap_value = np.zeros(num_envs, np.float32)
    if privileged and privileged_obs is None:
        raise MissingFieldError("privileged_obs: this buffer stores privileged observations with every step")
    if not privileged and privileged_obs is not None:
        raise MissingFieldError("privileged_obs: this buffer was built without privileged_obs_shape")
    check_hidden_state(hidden, hidden_state)
    check_extras(extra_specs, extras)
    required = {"obs": obs, "action": action, "reward": reward, "terminated": terminated, "value": value, "log_prob": log_prob}
    missing = [name for name, value_given in required.items() if value_given is None]
    if missing:
        refuse_whole_step(obs)
        raise MissingFieldError(f"{', '.join(missing)}: required with every step (add(obs, action, reward, "
                                f"terminated, value, log_prob, truncated=...))")
    if hidden is not None:
        extras = {**extras, **dict(zip(leaf_names("hidden_state", hidden),
                                       hidden.split("hidden_state", hidden_state), strict=True))}
    values = {**dict(zip(leaf_names("obs", obs_layout), obs_layout.split("obs", obs), strict=True)),
              "action": action, "reward": reward, "terminated": terminated, "truncated": truncated,
              "value": value, "log_prob": log_prob, "bootstrap_value": bootstrap_value, **extras}
    if privileged:
        values["privileged_obs"] = privileged_obs
    return values


def minibatches_call(options: Mapping[str, Any]) -> dict[str, Any]:
    """``minibatches()``'s keywords for checked epoch options (saved, to make the iterator again on load)."""
    return {"batch_size": options["batch_size"], "num_minibatches": options["num_batches"],
            "n_epochs": options["n_epochs"], "shuffle": options["shuffle"], "drop_last": options["drop_last"]}


def any_true(flags: Any) -> bool:
    """Whether any flag is set; ``False`` for what is no flags at all (the validation of ``add`` names it)."""
    try:
        if isinstance(flags, torch.Tensor):
            return flags.device.type != "meta" and bool(flags.any())
        return bool(np.any(as_array("truncated", flags)))
    except (RlbufError, TypeError, ValueError, RuntimeError):
        return False


def _read_rollout_key(td: TensorDictBase, spec: FieldSpec) -> torch.Tensor | None:
    if spec.name == "log_prob":
        for key in _LOG_PROB_KEYS:
            value: torch.Tensor | None = td.get(key, None)
            if value is not None:
                return value
        return None
    if spec.name == "truncated":
        truncated: torch.Tensor | None = td.get(spec.key, None)
        if truncated is None:
            done: torch.Tensor | None = td.get(("next", "done"), None)
            terminated: torch.Tensor | None = td.get(("next", "terminated"), None)
            if done is None:
                raise MissingFieldError(TRUNCATED_MISSING)
            if terminated is None:
                return None  # the check of terminated names it
            return done.to(torch.bool) & ~terminated.to(torch.bool)
        return truncated
    if spec.name == "bootstrap_value":
        bootstrap: torch.Tensor | None = td.get(spec.key, None)
        if bootstrap is None:
            reward_: torch.Tensor = td.get(("next", "reward"))
            return torch.zeros(reward_.shape, dtype=torch.float32, device=reward_.device)
        return bootstrap
    return find_in_td(td, spec.key)


def sequence_batch(padded: dict[str, torch.Tensor], mask: torch.Tensor, first: dict[str, torch.Tensor],
                   env: torch.Tensor, start: torch.Tensor, *, obs: Layout, hidden: Layout | None,
                   extra_names: tuple[str, ...]) -> SequenceBatch:
    """A rollout's [`SequenceBatch`][rlbuf.SequenceBatch] of padded trajectories (what
    ``PaddedTrajectories.select`` returns), the hidden state taken at each trajectory's first step.

    Example:
        >>> names = ("obs", "action", "reward", "terminated", "truncated", "value", "log_prob", "advantage", "returns")
        >>> padded = {name: torch.zeros(3, 2) for name in names}
        >>> batch = sequence_batch(padded, torch.ones(3, 2, dtype=torch.bool), {}, torch.zeros(2), torch.zeros(2),
        ...                        obs=Layout.parse((), None), hidden=None, extra_names=())
        >>> batch.reward.shape, batch.hidden_state
        (torch.Size([3, 2]), None)
    """
    hidden_state = None if hidden is None else hidden.assemble("hidden_state", first)
    extras = {name: padded[name] for name in extra_names}
    return SequenceBatch(obs.assemble("obs", padded, batch_dims=2), padded.get("privileged_obs"),
                         padded["action"], padded["reward"], padded["terminated"], padded["truncated"],
                         padded["value"], padded["log_prob"], padded["advantage"], padded["returns"], mask,
                         hidden_state, env, start, extras)
