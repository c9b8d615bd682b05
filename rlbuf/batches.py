"""Typed batches that buffers return (attribute access, extras, a TorchRL view), and the typed step ``add`` takes.

Batches are slotted dataclasses rather than tensorclasses: building one costs well under a
microsecond, which matters at thousands of samples per second. ``to_tensordict()`` gives the
same data in TorchRL layout (scalars with a trailing 1) for TorchRL losses.

Example:
    >>> import torch
    >>> from rlbuf import ReplayBuffer
    >>> buf = ReplayBuffer(8, obs_shape=(2,), action_shape=(), action_dtype=torch.int64, seed=0)
    >>> buf.add(torch.ones(2), 1, 0.5, torch.zeros(2), False, truncated=False)
    >>> batch = buf.sample(4)
    >>> batch.obs.shape, batch.reward.shape, batch.done.dtype
    (torch.Size([4, 2]), torch.Size([4]), torch.bool)
    >>> batch.to_tensordict()["next", "reward"].shape
    torch.Size([4, 1])
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, NoReturn, Self, cast

import numpy as np
import torch
from tensordict import TensorDict

from rlbuf._keywords import FOREIGN_NAMES
from rlbuf._obs import hidden_state_key
from rlbuf._protocols import (
    field_values,
    held_as_object,
    moved,
    reduced,
    refuse_iteration,
    refuse_next,
    same_batch,
    select_rows,
    shown_key,
)
from rlbuf.errors import MissingFieldError, UnsupportedOperationError
from rlbuf.storage import DeviceLike, resolve_device


def _torchrl_layout(value: torch.Tensor, batch_ndim: int) -> torch.Tensor:
    return value.unsqueeze(-1) if value.dim() == batch_ndim else value


def set_hidden_state(td: TensorDict, hidden_state: torch.Tensor | TensorDict | None, steps: int | None = None) -> None:
    """Put a hidden state at TorchRL's keys (``recurrent_state``, ``recurrent_state_h`` ...).

    With ``steps``, a per-sequence state ``[B, ...]`` goes to the first of ``steps`` steps
    ``[B, steps, ...]``, zeros after: TorchRL's recurrent modules (in recurrent mode) start each
    sequence from its first step's state, and each episode starting inside it (``"is_init"``)
    from the state at that step, a new episode's zeros.
    """
    if hidden_state is None:
        return
    items = [((), hidden_state)] if isinstance(hidden_state, torch.Tensor) else [
        ((key,), value) for key, value in hidden_state.items()]
    for path, value in items:
        if steps is not None:
            first, value = value, value.new_zeros(value.shape[0], steps, *value.shape[1:])
            value[:, 0] = first
        td.set(hidden_state_key(path), value)



class _TransitionTuple(NamedTuple):
    obs: Any
    action: Any
    reward: Any
    next_obs: Any
    terminated: Any
    truncated: Any = None
    extras: Mapping[str, Any] | None = None


class Transition(_TransitionTuple):
    """One env step of ``num_envs`` rows, for ``ReplayBuffer.add(transition)``.

    Other libraries' names (``state``, ``next_state``, ``done`` ...) are refused with rlbuf's
    (``MissingFieldError``, also a ``TypeError``), and so are ``extras`` that are no mapping; a
    mapping (a TensorDict too) is kept as a dict.

    Example:
        >>> import torch
        >>> step = Transition(torch.zeros(3), torch.zeros(1), 1.0, torch.ones(3), False, truncated=False)
        >>> step.truncated                  # required by ReplayBuffer.add: False without time limit
        False
        >>> Transition(state=torch.zeros(3), action=0, reward=1.0, next_obs=torch.ones(3), terminated=False)
        Traceback (most recent call last):
        ...
        rlbuf.errors.MissingFieldError: Transition: got state=, which it does not take; rlbuf's name is obs
    """

    __slots__ = ()

    if not TYPE_CHECKING:  # type checkers read the fields' signature; this only refuses other names
        __signature__ = inspect.signature(_TransitionTuple)  # what help() and call hints show: the fields

        def __new__(cls, *args, **kwargs):
            if kwargs and not _TRANSITION_FIELDS.issuperset(kwargs):
                raise _keyword_refusal("Transition", cls._fields, kwargs)
            step = _TransitionTuple.__new__(cls, *args, **kwargs)
            extras = step.extras
            if extras is None or type(extras) is dict:
                return step
            if not isinstance(extras, Mapping):
                raise MissingFieldError(f"extras: expected a mapping name -> values (extras={{'cost': values}}), "
                                        f"got {type(extras).__name__}")
            return step._replace(extras=dict(extras.items()))  # a TensorDict, which refuses bool(): its keys


_TRANSITION_FIELDS = frozenset(_TransitionTuple._fields)

_FOREIGN_FIELDS = {
    "observations": ("obs",), "actions": ("action", "expert_action"), "rewards": ("reward",),
    "next_observations": ("next_obs",), "dones": ("terminated",), "old_values": ("value",), "values": ("value",),
    "old_log_prob": ("log_prob",), "log_probs": ("log_prob",), "logprobs": ("log_prob",),
    "advantages": ("advantage",), "weights": ("weight",), "indices": ("index",), "discounts": ("discount",),
}
"""Other libraries' batch attributes (SB3's samples, CleanRL's arrays) -> rlbuf's, the first a batch has."""
_WHY = {"terminated": " (the bootstrap mask: a time limit is no end there; batch.done is terminated | truncated)"}
_TORCHRL_KEYS: dict[str, str | tuple[str, str]] = {
    "obs": "observation", "next_obs": ("next", "observation"), "reward": ("next", "reward"),
    "terminated": ("next", "terminated"), "truncated": ("next", "truncated"), "done": ("next", "done"),
    "value": "state_value", "log_prob": "sample_log_prob", "returns": "value_target", "weight": "priority_weight",
    "privileged_obs": "privileged_observation", "is_first": "is_init", "hidden_state": "recurrent_state",
}
"""An rlbuf field -> its key in ``to_tensordict()`` where the two differ (the others keep their name)."""
_METHOD_HINTS = {
    "cpu": "batch.to('cpu') moves every field", "cuda": "batch.to('cuda') moves every field",
    "numpy": "convert a field: batch.obs.cpu().numpy() ...", "_asdict": "dataclasses.asdict(batch)",
    "_fields": "[f.name for f in dataclasses.fields(batch)]",
}
"""Tensor and NamedTuple methods a batch lacks -> what to call instead."""
_FROM_TORCHRL: dict[object, str] = {key: name for name, key in _TORCHRL_KEYS.items()}


def _keyword_refusal(owner: str, fields: Sequence[str], given: Mapping[str, Any]) -> MissingFieldError:
    """The error of ``owner(name=...)`` for a name it does not take: rlbuf's where it is another library's (a
    batch's attribute first; a step's as ``add`` names it), else its fields. Built only when refusing."""
    name = next(name for name in given if name not in fields)
    own = [] if owner == "Transition" else [field for field in _FOREIGN_FIELDS.get(name, ()) if field in fields]
    if own:
        hint = f"rlbuf's name is {own[0]}{_WHY.get(own[0], '') if 'done' in fields else ''}"
    else:
        extra = f" (an extra field goes in extras={{{name!r}: ...}})" if "extras" in fields else ""
        hint = FOREIGN_NAMES.get(name) or f"its fields are {', '.join(fields)}{extra}"
    return MissingFieldError(f"{owner}: got {name}=, which it does not take; {hint}")


def _subscript_refusal(batch: Any, key: object) -> UnsupportedOperationError:
    """The error of ``batch[key]`` (a dict batch's habit: TorchRL's, ObjectRL's, rollout-buffer's): the
    attribute to read instead, and the key of ``to_tensordict()`` for TorchRL's keys. Built only when refusing.

    A refused protocol, as ``buffer["obs"]``, not a missing key: no ``KeyError``, which a dict habit's
    ``except KeyError`` fallback would take for an absent field.
    """
    names = [*batch.__dataclass_fields__, *batch.extras]
    nested = isinstance(key, tuple) and all(isinstance(part, str) for part in key)  # ("next", "reward")
    asked = (_FROM_TORCHRL.get(key) if isinstance(key, str) or nested else None) or (key if isinstance(key, str) else "")
    own = [name for name in (asked, *_FOREIGN_FIELDS.get(asked, ())) if name in names]
    shown = f"{type(batch).__name__}[{key!r}]"
    if asked == "done" and not own and "terminated" in names:  # a rollout's batch derives no done
        return UnsupportedOperationError(f"{shown}: a batch is read by attribute, not by key: batch.terminated | "
                                 f"batch.truncated (TorchRL's keys: batch.to_tensordict()[('next', 'done')])")
    if not own:
        return UnsupportedOperationError(f"{shown}: a batch is read by attribute, not by key; its fields are "
                                 f"{', '.join(name for name in names if name != 'extras')}; "
                                 f"batch.to_tensordict() holds them at TorchRL's keys")
    name = own[0]
    why = _WHY.get(name, "") if "done" in names else ""
    return UnsupportedOperationError(f"{shown}: a batch is read by attribute, not by key: batch.{name}{why} (TorchRL's "
                             f"keys: batch.to_tensordict()[{_TORCHRL_KEYS.get(name, name)!r}])")


def _shown(value: object) -> str:
    """A field in a batch's repr: ``[4, 2] float32``, a TensorDict's keys likewise, other values as they are."""
    if isinstance(value, torch.Tensor):
        return f"{list(value.shape)} {str(value.dtype).removeprefix('torch.')}"
    if isinstance(value, TensorDict):
        return "{" + ", ".join(f"{key}: {_shown(item)}" for key, item in value.items()) + "}"
    return repr(value)


class _ExtrasAccess:
    """Lets ``batch.privileged_obs`` read an extra field by name; Python's protocols on a batch (``_protocols``)."""

    __slots__ = ()
    extras: dict[str, torch.Tensor]
    _time_first: ClassVar[frozenset[str]] = frozenset()  # fields whose rows are on dim 1 ([L, B, ...])

    def __len__(self) -> int:
        """Rows in the batch: the first dim of its first field (of any field a ``fields=`` batch holds)."""
        for name in cast(Any, self).__dataclass_fields__:  # the first held field, most often obs: no dict built
            try:
                value = object.__getattribute__(self, name)
            except AttributeError:  # a slot a fields= batch left empty
                continue
            if isinstance(value, (torch.Tensor, TensorDict)):
                return int(value.shape[0])
        return next((int(extra.shape[0]) for extra in self.extras.values()), 0)

    def __repr__(self) -> str:
        """Each field's shape and dtype, and the device: ``ReplayBatch(device=cpu, obs=[4, 2] float32, ...)``.

        Never the values: a batch of 256 stacked frames would print screens of digits.

        Example:
            >>> from rlbuf import ReplayBuffer
            >>> buf = ReplayBuffer(8, obs_shape=(2,), action_shape=(), seed=0)
            >>> buf.add(torch.ones(2), 0.0, 1.0, torch.zeros(2), False, truncated=False)
            >>> buf.sample_by_index([0, 0], fields=["reward"])
            ReplayBatch(device=cpu, reward=[2] float32)
        """
        present = self._present()
        devices = {str(value.device) for value in present.values() if isinstance(value, (torch.Tensor, TensorDict))}
        shown = [f"device={devices.pop() if len(devices) == 1 else sorted(devices)}"] if devices else []
        return f"{type(self).__name__}({', '.join(shown + [f'{name}={_shown(value)}' for name, value in present.items()])})"

    def _present(self) -> dict[str, object]:
        """The fields that hold a value (a ``fields=`` batch lacks some), then the extras as ``extras.name``."""
        present: dict[str, object] = {}
        for name, value in field_values(self).items():
            if name == "extras":
                present.update({f"extras.{key}": extra for key, extra in value.items()})
            elif value is not None:
                present[name] = value
        return present

    def __getitem__(self, key: object) -> Self:
        """The rows ``key`` (a slice, integer positions or a bool mask) as a batch of the same type.

        Raises:
            UnsupportedOperationError: a key (``batch["obs"]``: the attribute to read instead), or an ``int``
                (``batch[i:i + 1]`` keeps the batch dim).
            StoredIndexError: a row outside the batch.

        Example:
            >>> from rlbuf import ReplayBuffer
            >>> buf = ReplayBuffer(8, obs_shape=(1,), action_shape=(), seed=0)
            >>> for r in range(4):
            ...     buf.add(torch.zeros(1), 0.0, float(r), torch.zeros(1), False, truncated=False)
            >>> batch = buf.sample_all()
            >>> batch[:2].reward.tolist(), batch[batch.reward > 1].index.tolist(), len(batch[[3, 0, 3]])
            ([0.0, 1.0], [2, 3], 3)
        """
        if isinstance(key, str) or (isinstance(key, tuple) and key and all(isinstance(k, str) for k in key)):
            raise _subscript_refusal(self, key)
        return cast(Self, select_rows(self, key, time_first=self._time_first))

    def __setitem__(self, key: object, value: object) -> NoReturn:
        raise UnsupportedOperationError(f"{type(self).__name__}[{shown_key(key)}] = ...: a batch's fields are fixed; "
                                        f"write into a field's tensor (batch.reward[0:2] = ...), or add rows to the "
                                        f"buffer with add()")

    def __delitem__(self, key: object) -> NoReturn:
        raise UnsupportedOperationError(f"del {type(self).__name__}[{shown_key(key)}]: a batch's rows are not deleted; "
                                        f"batch[mask] is a batch of the rows mask keeps")

    def __iter__(self) -> Iterator[Any]:
        refuse_iteration(self)

    def __reversed__(self) -> NoReturn:
        refuse_iteration(self, "reversed")

    def __next__(self) -> NoReturn:
        refuse_next(self)

    def __contains__(self, item: object) -> bool:
        raise UnsupportedOperationError(
            f"`in` {type(self).__name__}: a batch is not searched; hasattr(batch, name) says whether it holds a "
            f"field, name in batch.extras an extra one, key in batch.to_tensordict().keys(True) a TorchRL key")

    def __eq__(self, other: object) -> bool:
        """Same type, same fields, each of the same dtype, device, shape and values (``torch.equal``)."""
        if type(other) is not type(self):
            return NotImplemented
        return same_batch(self, other)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return reduced(self)  # a fields= batch copies and pickles too (the dataclass's state needs every field)

    def __hash__(self) -> int:
        raise UnsupportedOperationError(f"hash({type(self).__name__}): a batch compares by contents, which can "
                                        f"change in place, so it is unhashable; key by id(batch)")

    def to(self, device: DeviceLike, *, non_blocking: bool = False) -> Self:
        """The batch with every tensor on ``device`` (as ``Tensor.to``; only a device, never a dtype).

        Raises:
            ConfigError: not a device, or one this machine lacks.

        Example:
            >>> from rlbuf import DistillationBuffer
            >>> buf = DistillationBuffer(8, obs_shape=(2,), action_shape=(), seed=0)
            >>> buf.add(torch.ones(2), 0.0)
            >>> buf.sample(2).to("cpu").obs.device
            device(type='cpu')
        """
        return cast(Self, moved(self, resolve_device(device, name="device"), non_blocking=bool(non_blocking)))

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray[Any, Any]:
        """numpy's view of a batch: one object (``np.array([batch, ...], dtype=object)``), never an array of its
        own, which numpy would otherwise try through ``__len__`` and ``__getitem__``."""
        if (held := held_as_object(self, dtype)) is not None:
            return held
        raise UnsupportedOperationError(f"np.asarray({type(self).__name__}): a batch is no array (its fields have "
                                        f"shapes of their own); convert a field: np.asarray(batch.obs.cpu()) ..., or "
                                        f"all of them: batch.to_tensordict().cpu().numpy() (a dict of arrays at "
                                        f"TorchRL's keys)")

    if not TYPE_CHECKING:  # type checkers read the dataclass's signature; this only refuses other names
        def __new__(cls, *args, **kwargs):
            if kwargs and not cls.__dataclass_fields__.keys() >= kwargs.keys():
                raise _keyword_refusal(cls.__name__, tuple(cls.__dataclass_fields__), kwargs)
            return object.__new__(cls)

    def __getattr__(self, name: str) -> torch.Tensor:
        # Only called when normal lookup fails: the fixed fields never come here.
        try:
            return self.extras[name]
        except KeyError:
            fields = self.__dataclass_fields__
            if name in ("keys", "items", "get"):  # a dict batch's methods (values: SB3's attribute, below)
                raise AttributeError(f"{type(self).__name__} has no {name}(): a batch is read by attribute "
                                     f"(batch.obs ...); batch.to_tensordict().{name}() for TorchRL's keys") from None
            if name in _METHOD_HINTS:
                raise AttributeError(f"{type(self).__name__} has no {name}(); {_METHOD_HINTS[name]}") from None
            own = [field for field in _FOREIGN_FIELDS.get(name, ()) if field in fields]
            if own:
                why = _WHY.get(own[0], "") if "done" in fields else ""
                raise AttributeError(f"{type(self).__name__} has no field {name!r}; rlbuf's name is {own[0]}{why}"
                                     ) from None
            raise AttributeError(f"{type(self).__name__} has no field {name!r} (a batch from sample_by_index("
                                 f"..., fields=...) holds only the fields asked for); extras are "
                                 f"{sorted(self.extras)}") from None


@dataclass(slots=True, frozen=True, eq=False, repr=False)
class _TransitionFields(_ExtrasAccess):
    """The fields of replayed steps, one each ([`ReplayBatch`][rlbuf.ReplayBatch]) or in sequences (``ReplaySequenceBatch``)."""

    obs: torch.Tensor | TensorDict
    action: torch.Tensor
    reward: torch.Tensor
    next_obs: torch.Tensor | TensorDict
    terminated: torch.Tensor
    truncated: torch.Tensor
    done: torch.Tensor


@dataclass(slots=True, frozen=True, eq=False, repr=False)
class ReplayBatch(_TransitionFields):
    """A batch of transitions sampled from a [`ReplayBuffer`][rlbuf.ReplayBuffer].

    Scalars per transition (``reward``, ``terminated``, ``truncated``, ``done``, ``index``,
    ``weight``) have shape ``[batch_size]`` — never ``[batch_size, 1]``, which would
    broadcast silently against a ``[batch_size]`` Q-value.

    Attributes:
        obs: observations ``[B, *obs_shape]`` (a ``TensorDict`` of batch size ``[B]`` for dict observations).
        action: actions ``[B, *action_shape]``.
        reward: rewards ``[B]``.
        next_obs: next observations ``[B, *obs_shape]`` (a ``TensorDict`` like ``obs``).
        terminated: episode ended by the MDP (no bootstrap) ``[B]`` bool.
        truncated: episode cut by a time limit (bootstrap from ``next_obs``) ``[B]`` bool.
        done: ``terminated | truncated`` ``[B]`` bool.
        index: storage positions of the rows, for [`ReplayBuffer.update_priority`][rlbuf.ReplayBuffer.update_priority].
        weight: importance-sampling weights (ones when the buffer is not prioritized).
        discount: what multiplies the value of ``next_obs`` in a TD target ``[B]``:
            ``gamma ** m`` for a transition of ``m`` steps (``m = 1`` unless ``n_step > 1``),
            0 when the episode terminated within them.
        extras: the buffer's extra fields by name (also readable as attributes).
        hidden_state: the hidden state stored with each transition, or ``None`` without one.
    """

    index: torch.Tensor
    weight: torch.Tensor
    discount: torch.Tensor
    extras: dict[str, torch.Tensor] = field(default_factory=dict)
    hidden_state: torch.Tensor | TensorDict | None = None

    def to_tensordict(self) -> TensorDict:
        """The batch in TorchRL layout (``"observation"``, ``("next", "reward")`` of shape ``[B, 1]`` ...).

        Example:
            >>> from rlbuf import ReplayBuffer
            >>> buf = ReplayBuffer(8, obs_shape=(2,), action_shape=(), seed=0)
            >>> buf.add(torch.ones(2), 0.0, 1.0, torch.zeros(2), False, truncated=False)
            >>> td = buf.sample(4).to_tensordict()
            >>> td["next", "done"].shape, td["priority_weight"].tolist()
            (torch.Size([4, 1]), [1.0, 1.0, 1.0, 1.0])
        """
        n = len(self)
        td = TensorDict({
            "observation": self.obs,
            "action": self.action,
            "index": self.index,
            "priority_weight": self.weight,
            "next": {
                "observation": self.next_obs,
                "reward": _torchrl_layout(self.reward, 1),
                "terminated": _torchrl_layout(self.terminated, 1),
                "truncated": _torchrl_layout(self.truncated, 1),
                "done": _torchrl_layout(self.done, 1),
            },
        }, batch_size=[n], device=self.obs.device)
        set_hidden_state(td, self.hidden_state)
        for name, value in self.extras.items():
            td.set(name, value)
        return td


@dataclass(slots=True, frozen=True, eq=False, repr=False)
class DistillationBatch(_ExtrasAccess):
    """A batch from a [`DistillationBuffer`][rlbuf.DistillationBuffer]; unpacks as ``obs, expert_action = batch``.

    Attributes:
        obs: observations ``[B, *obs_shape]`` (a ``TensorDict`` for dict observations).
        expert_action: the expert's actions ``[B, *action_shape]``.
        index: storage positions of the rows.
        extras: extra fields (e.g. ``expert_logits``), also readable as attributes.
    """

    obs: torch.Tensor | TensorDict
    expert_action: torch.Tensor
    index: torch.Tensor
    extras: dict[str, torch.Tensor] = field(default_factory=dict)

    def __iter__(self) -> Iterator[torch.Tensor | TensorDict]:
        yield self.obs
        yield self.expert_action

    def to_tensordict(self) -> TensorDict:
        """The batch as a TensorDict (``"observation"``, ``"expert_action"``, extras).

        Example:
            >>> from rlbuf import DistillationBuffer
            >>> buf = DistillationBuffer(8, obs_shape=(2,), action_shape=(), seed=0)
            >>> buf.add(torch.ones(2), 0.0)
            >>> sorted(buf.sample(3).to_tensordict().keys())
            ['expert_action', 'index', 'observation']
        """
        td = TensorDict({"observation": self.obs, "expert_action": self.expert_action, "index": self.index},
                        batch_size=[len(self)], device=self.obs.device)
        for name, value in self.extras.items():
            td.set(name, value)
        return td


@dataclass(slots=True, frozen=True, eq=False, repr=False)
class _OnPolicyFields(_ExtrasAccess):
    """The fields a rollout minibatch holds, flat ([`RolloutBatch`][rlbuf.RolloutBatch]) or padded (``SequenceBatch``)."""

    obs: torch.Tensor | TensorDict
    privileged_obs: torch.Tensor | None
    action: torch.Tensor
    reward: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    value: torch.Tensor
    log_prob: torch.Tensor
    advantage: torch.Tensor
    returns: torch.Tensor


@dataclass(slots=True, frozen=True, eq=False, repr=False)
class RolloutBatch(_OnPolicyFields):
    """A minibatch (or the whole rollout, flattened ``T*N``) from a [`RolloutBuffer`][rlbuf.RolloutBuffer].

    Attributes:
        obs: observations ``[B, *obs_shape]`` (a ``TensorDict`` for dict observations).
        privileged_obs: privileged observations for an asymmetric critic (stored at its own key,
            ``"privileged_observation"``), or ``None``.
        action: actions ``[B, *action_shape]``.
        reward: rewards ``[B]``.
        terminated: episode ended by the MDP at this step ``[B]`` bool.
        truncated: episode cut by a time limit at this step ``[B]`` bool.
        value: value estimates at collection time ``[B]``.
        log_prob: log-probabilities of the actions at collection time ``[B]``.
        advantage: GAE advantages ``[B]``.
        returns: value targets (``advantage + value``) ``[B]``.
        extras: extra fields and tensors attached with ``set_extras`` (also attributes).
        hidden_state: the policy's hidden state stored with each step ``[B, *shape]`` (a
            ``TensorDict`` for ``{"h": ..., "c": ...}``), or ``None`` without hidden states.
    """

    extras: dict[str, torch.Tensor] = field(default_factory=dict)
    hidden_state: torch.Tensor | TensorDict | None = None

    def to_tensordict(self) -> TensorDict:
        """The batch in TorchRL layout (``"state_value"``, ``"advantage"``, ``"value_target"`` ...).

        Example:
            >>> from rlbuf import RolloutBuffer
            >>> buf = RolloutBuffer(1, 2, obs_shape=(3,), action_shape=())
            >>> buf.add(torch.zeros(2, 3), torch.zeros(2), torch.ones(2), torch.tensor([False, False]),
            ...         torch.zeros(2), torch.zeros(2), truncated=False)
            >>> buf.compute_returns_and_advantages(torch.zeros(2))
            >>> td = buf.get_all_data().to_tensordict()
            >>> td["advantage"].shape, td["next", "done"].shape
            (torch.Size([2, 1]), torch.Size([2, 1]))
        """
        td = TensorDict({
            "observation": self.obs,
            "action": self.action,
            "state_value": _torchrl_layout(self.value, 1),
            "sample_log_prob": self.log_prob,
            "advantage": _torchrl_layout(self.advantage, 1),
            "value_target": _torchrl_layout(self.returns, 1),
            "next": {
                "reward": _torchrl_layout(self.reward, 1),
                "terminated": _torchrl_layout(self.terminated, 1),
                "truncated": _torchrl_layout(self.truncated, 1),
                "done": _torchrl_layout(self.terminated | self.truncated, 1),
            },
        }, batch_size=[len(self)], device=self.obs.device)
        if self.privileged_obs is not None:
            td.set("privileged_observation", self.privileged_obs)
        set_hidden_state(td, self.hidden_state)
        for name, value in self.extras.items():
            td.set(name, value)
        return td
