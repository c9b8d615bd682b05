"""The keywords an ``add`` takes: every declared extra field, and rlbuf's names for other libraries' words.

Example:
    >>> FOREIGN_NAMES["dones"]
    'pass terminated= and truncated= instead; done is derived (terminated | truncated)'
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from rlbuf.errors import ConfigError, MissingFieldError
from rlbuf.spec import FieldSpec

# Keywords users bring from other libraries (SB3, CleanRL, TorchRL), and what rlbuf takes instead.
_DONE_HINT = "pass terminated= and truncated= instead; done is derived (terminated | truncated)"
_INFO_HINT = ("rlbuf's add takes no infos; with gymnasium use rlbuf.gym.Recorder, which reads info['final_obs'] "
              "(else pass the final observation as next_obs, and declare what else you need in extra_fields)")
_FLAGS_HINT = "pass terminated= and truncated= (rlbuf's names for gymnasium's terminations and truncations)"
FOREIGN_NAMES = {
    "done": _DONE_HINT,
    "dones": _DONE_HINT,
    "observations": "rlbuf's name is obs",
    "observation": "rlbuf's name is obs",
    "actions": "rlbuf's name is action (expert_action in a DistillationBuffer)",
    "rewards": "rlbuf's name is reward",
    "next_observations": "rlbuf's name is next_obs (the final observation where an episode ended)",
    "next_observation": "rlbuf's name is next_obs (the final observation where an episode ended)",
    "terminations": _FLAGS_HINT,
    "truncations": _FLAGS_HINT,
    "terminals": "rlbuf's name is terminated",
    "timeouts": "rlbuf's name is truncated",
    "values": "rlbuf's name is value",
    "log_probs": "rlbuf's name is log_prob",
    "logprobs": "rlbuf's name is log_prob",
    "infos": _INFO_HINT,
    "info": _INFO_HINT,
    "episode_starts": "rlbuf derives episode starts from the previous step's terminated and truncated",
    "state": "rlbuf's name is obs", "states": "rlbuf's name is obs",
    "next_state": "rlbuf's name is next_obs (the final observation where an episode ended)",
    "next_states": "rlbuf's name is next_obs (the final observation where an episode ended)",
    "logprob": "rlbuf's name is log_prob",
    "action": "rlbuf's name is expert_action in a DistillationBuffer",
    "expert_actions": "rlbuf's name is expert_action",
}
"""Foreign keyword -> what to pass instead, for the message of ``check_extras``."""


_ROLLOUT_SAMPLE = "a rollout gives minibatches(batch_size=...) (each row once per epoch), get_all_data() the whole of it"
FOREIGN_METHODS = {
    "get": "minibatches(batch_size=...) gives a rollout's minibatches (SB3's get), get_all_data() the whole of it",
    "reset": "clear() empties the buffer (SB3's reset)",
    "compute_returns_and_advantage": "rlbuf's name is compute_returns_and_advantages(last_value, gamma=..., "
                                     "gae_lambda=...); the bootstrap of time limits comes with each add",
    "is_full": "len(buffer) == buffer.capacity",
    "full": "buffer.is_full (SB3's full)",
    "to_torch": "batches are tensors already, on the buffer's device= (set it when you build the buffer)",
    "dumps": "buffer.save(path) writes a checkpoint (TorchRL's dumps); buffer = {cls}.load(path) reads it",
    "loads": "buffer = {cls}.load(path) reads a checkpoint into a new buffer (TorchRL's loads fills this one)",
    "empty": "clear() empties the buffer (TorchRL's empty)",
    "sample": _ROLLOUT_SAMPLE,
    "push": "add(...) stores a step; it also takes a Transition (Velora's push of an Experience)",
    "add_batch": "extend(td) stores a TensorDict of rows (ObjectRL's add_batch)",
    "sample_batch": "sample(batch_size) draws a batch (ObjectRL's sample_batch)",
    "sample_by_index_fields": "sample_by_index(index, fields=[...]) (ObjectRL's sample_by_index_fields)",
    "create_epoch_iterator": "it = buffer.epochs(batch_size=..., n_epochs=...) (ObjectRL's create_epoch_iterator)",
    "get_next_batch": "next(it) or it.next_batch() on it = buffer.epochs(...); the latest is buffer.current_epochs",
    "calculate_num_batches": "num_batches(batch_size, drop_last=...) (ObjectRL's calculate_num_batches)",
    "get_steps_and_iterator": "it = buffer.epochs(batch_size=..., n_epochs=...); its steps are len(it)",
    "pos": "rlbuf keeps its write position to itself: len(buffer) rows are stored, and buffer.is_full says whether "
           "the next add overwrites the oldest (SB3's pos and full)",
    "buffer_size": "buffer.capacity, in rows (SB3's buffer_size counts steps per env: capacity = buffer_size * n_envs)",
    "n_envs": "buffer.num_envs",
    "batch_size": "sample(batch_size) takes it with each call (TorchRL's buffers keep one from when they are built)",
    **{attr: f"buffer.sample_all().{name} holds every stored row's, oldest first (SB3's {attr} array)"
       for attr, name in [("observations", "obs"), ("next_observations", "next_obs"), ("actions", "action"),
                          ("rewards", "reward"), ("dones", "done"), ("timeouts", "truncated")]},
}
"""Methods of other libraries' buffers (SB3's) -> what rlbuf has instead, for a buffer's ``AttributeError``."""

_VIEW = "buffer.view({name!r}) is the [num_steps, num_envs, ...] tensor, no copy ({lib}'s {attr} attribute)"
FOREIGN_METHODS_OF = {
    "RolloutBuffer": {
        "push": "add(obs, action, reward, terminated, value, log_prob, truncated=...) stores a step of every env",
        "sample_batch": _ROLLOUT_SAMPLE,
        "iterate_minibatches": "minibatches(batch_size=..., n_epochs=...) yields typed minibatches (mb.obs, "
                               "mb.advantage); mb.to_tensordict() for keys",
        **{attr: _VIEW.format(name=name, lib=lib, attr=attr) for attr, name, lib in [
            ("observations", "obs", "ApexRL"), ("obs", "obs", "a hand-written buffer"),
            ("actions", "action", "ApexRL"), ("rewards", "reward", "ApexRL"), ("values", "value", "ApexRL"),
            ("log_probs", "log_prob", "ApexRL"), ("logprobs", "log_prob", "a hand-written buffer"),
            ("advantages", "advantage", "ApexRL"), ("returns", "returns", "ApexRL")]},
        "dones": "buffer.view('terminated') and buffer.view('truncated') (ApexRL's dones, split); 'done' is both",
        "pos": "buffer.steps counts the steps stored (SB3's pos); buffer.is_full is buffer.steps == buffer.num_steps",
        "buffer_size": "buffer.num_steps (steps per env, SB3's buffer_size); capacity counts rows",
        "generator_ready": "minibatches(batch_size=...) needs no flag: it refuses a rollout without advantages",
    },
    "ReplayBuffer": {
        "get": "sample(batch_size) draws a batch (rl-buffer's get); epochs(batch_size=...) passes over every row",
    },
    "DistillationBuffer": {
        "get": "sample(batch_size) draws a batch; epochs(batch_size=...) passes over every row",
        "push": "add(obs, expert_action) stores rows",
        "actions": "buffer.sample_all().expert_action holds every stored row's, oldest first",
        **dict.fromkeys(("rewards", "dones", "next_observations", "timeouts"),
                        "a DistillationBuffer stores obs and expert_action only (and the extra fields declared)"),
    },
    "EpisodeStats": {
        **dict.fromkeys(("get_statistics", "get_stats", "statistics", "stats", "get_summary", "get_episode_statistics"),
                        "summary() gives mean/std/min/max/count of returns, lengths and metrics, and end reasons "
                        "(summary(last=k) for the last k episodes)"),
        **dict.fromkeys(("mean_return", "mean_reward", "average_return", "avg_return", "mean_episode_return"),
                        "summary()['return']['mean'] (summary(last=k) for the last k episodes)"),
        **dict.fromkeys(("episode_returns", "returns", "rewards", "episode_rewards", "get_episode_returns"),
                        "recent_returns(k) lists the returns of the last k finished episodes"),
        **dict.fromkeys(("episode_lengths", "lengths", "get_episode_lengths"),
                        "recent_lengths(k) lists the lengths of the last k finished episodes"),
        **dict.fromkeys(("num_episodes", "episode_count", "total_episodes", "n_episodes"),
                        "episodes_finished counts the finished episodes"),
        **dict.fromkeys(("clear", "reset_statistics"), "reset() forgets every episode (reset(envs): the running "
                                                       "episodes of envs reset mid-episode)"),
        "add": "update(reward, terminated, truncated) feeds one step of every env (buffers call it from add "
               "when built with stats=)",
    },
}
"""Class name -> attribute -> what that class has instead (before ``FOREIGN_METHODS``)."""


_NO_DONES = ("drop it: the last step's terminated and truncated came with its add (a truncated step bootstraps "
              "from its bootstrap_value)")
_SAMPLE_HINTS = {
    "env": "rlbuf has no VecNormalize: batches hold what was added (normalise before add, or after sample)",
    "device": "batches come on the buffer's device= (set it when you build the buffer)",
    "beta": "PER's beta is the buffer's: buffer.beta = ... (or beta= when you build it)",
    "return_info": "the batch carries index and weight already",
}
_EPOCH_HINTS = {
    "minibatch_size": "rlbuf's name is batch_size (rows per minibatch)",
    "mini_batch_size": "rlbuf's name is batch_size (rows per minibatch)",
    "n_minibatches": "rlbuf's name is num_minibatches",
    "num_mini_batches": "rlbuf's name is num_minibatches",
    "update_epochs": "rlbuf's name is n_epochs",
    "num_epochs": "rlbuf's name is n_epochs",
    "num_learning_epochs": "rlbuf's name is n_epochs",
    "epochs": "rlbuf's name is n_epochs",
}
FOREIGN_KEYWORDS: dict[str, dict[str, str]] = {
    "sample": _SAMPLE_HINTS,
    "sample_sequences": {**_SAMPLE_HINTS, "seq_len": "rlbuf's name is length (steps after burn_in)",
                         "sequence_length": "rlbuf's name is length (steps after burn_in)"},
    "compute_returns_and_advantages": {
        "last_values": "rlbuf's name is last_value (V of the observation after the last step, [num_envs])",
        "next_value": "rlbuf's name is last_value (V of the observation after the last step, [num_envs])",
        "dones": _NO_DONES, "next_done": _NO_DONES, "next_dones": _NO_DONES,
        "lam": "rlbuf's name is gae_lambda", "lmbda": "rlbuf's name is gae_lambda",
        "discount": "rlbuf's name is gamma",
        "normalize_advantage": "rlbuf's name is normalize_advantages",
        "norm_adv": "rlbuf's name is normalize_advantages",
    },
    "minibatches": _EPOCH_HINTS,
    "update": {"dones": _DONE_HINT, "done": _DONE_HINT, "next_done": _DONE_HINT, "rewards": "rlbuf's name is reward",
               "terminations": _FLAGS_HINT, "truncations": _FLAGS_HINT,
               **dict.fromkeys(("infos", "info"), "EpisodeStats reads no infos: pass metrics= for what to follow")},
    "epochs": {name: hint for name, hint in _EPOCH_HINTS.items() if "num_minibatches" not in hint},
}
"""Method -> keywords of other libraries' versions of it (SB3, CleanRL, TorchRL, rsl_rl) -> what rlbuf takes."""

FOREIGN_MISSING = {
    "sample": ": sample(batch_size) draws batch_size rows (TorchRL's buffers take batch_size when built, and "
              "sample() then draws that many)",
    "sample_sequences": ": sample_sequences(batch_size, length)",
    "epochs": ": epochs(batch_size=...) for batches of that many rows (n_epochs=... passes over them)",
    "compute_returns_and_advantages": ": last_value is V of the observation after the last step, [num_envs] (SB3's "
                                      "last_values; CleanRL's next_value)",
}
"""Method -> the end of its refusal when a required argument is missing (other libraries' calls without it)."""

FOREIGN_POSITIONS = {"sample": ("batch_size", "env"), "compute_returns_and_advantages": ("last_value", "dones")}
"""Method -> its arguments by position in SB3's version: an argument past rlbuf's is likely the one named."""

_P = ParamSpec("_P")
_R = TypeVar("_R")


def refuse_foreign_keywords(method: str, taken: Collection[str], given: Mapping[str, Any]) -> None:
    """Raise [`MissingFieldError`][rlbuf.errors.MissingFieldError] (also a ``TypeError``) for a keyword
    ``method`` does not take, with rlbuf's word where it is another library's.

    Example:
        >>> refuse_foreign_keywords("compute_returns_and_advantages", {"last_value"}, {"last_values": 0})
        Traceback (most recent call last):
        ...
        rlbuf.errors.MissingFieldError: compute_returns_and_advantages: got last_values=, which it does not take; rlbuf's name is last_value (V of the observation after the last step, [num_envs])
    """
    for name in given:
        if name not in taken:
            hint = FOREIGN_KEYWORDS.get(method, {}).get(name, f"its keywords are {', '.join(sorted(taken))}")
            raise MissingFieldError(f"{method}: got {name}=, which it does not take; {hint}")


def refuse_positions(method: str, positional: Sequence[str], given: int) -> None:
    """Raise [`MissingFieldError`][rlbuf.errors.MissingFieldError] (also a ``TypeError``) for ``given``
    arguments by position to a ``method`` that takes ``positional``, naming what the next one likely is.

    Example:
        >>> refuse_positions("sample", ["batch_size"], 2)
        Traceback (most recent call last):
        ...
        rlbuf.errors.MissingFieldError: sample: got 2 arguments by position, it takes 1 (batch_size); in SB3's version, env comes there: rlbuf has no VecNormalize: batches hold what was added (normalise before add, or after sample)
    """
    names = FOREIGN_POSITIONS.get(method, ())
    foreign = names[len(positional)] if len(names) > len(positional) else None
    hint = (f"in SB3's version, {foreign} comes there: {FOREIGN_KEYWORDS[method][foreign]}" if foreign
            else "give the others by keyword")
    raise MissingFieldError(f"{method}: got {given} arguments by position, it takes {len(positional)} "
                            f"({', '.join(positional)}); {hint}")


def keywords_checked(method: Callable[_P, _R]) -> Callable[_P, _R]:
    """Answer a keyword the method does not take with rlbuf's word for it (see ``FOREIGN_KEYWORDS``),
    where Python would raise a bare ``TypeError``.

    Example:
        >>> class Buffer:
        ...     @keywords_checked
        ...     def sample(self, batch_size: int) -> int:
        ...         return batch_size
        >>> Buffer().sample(batch_size=4)
        4
        >>> Buffer().sample(4, env=None)
        Traceback (most recent call last):
        ...
        rlbuf.errors.MissingFieldError: sample: got env=, which it does not take; rlbuf has no VecNormalize: batches hold what was added (normalise before add, or after sample)
    """
    parameters = inspect.signature(method).parameters.values()
    taken = frozenset(p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)) - {"self"}
    by_position = [p.name for p in parameters if p.kind == p.POSITIONAL_OR_KEYWORD]  # self first
    required = [p.name for p in parameters if p.default is p.empty and p.kind in (
        p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]  # self first

    @functools.wraps(method)
    def checked(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        if len(args) > len(by_position):
            refuse_positions(method.__name__, by_position[1:], len(args) - 1)
        if not taken.issuperset(kwargs):
            refuse_foreign_keywords(method.__name__, taken, kwargs)
        if len(args) < len(required):
            given = {*by_position[:len(args)], *kwargs}
            if missing := [name for name in required if name not in given]:
                raise MissingFieldError(f"{method.__name__}: {', '.join(missing)} required"
                                        f"{FOREIGN_MISSING.get(method.__name__, '')}")
        return method(*args, **kwargs)

    return checked


def foreign_method(owner: str, name: str, *, shared: bool = True) -> AttributeError:
    """The ``AttributeError`` of ``owner.name``: Python's own, with rlbuf's method where ``name`` is another
    library's (from ``FOREIGN_METHODS`` too unless ``shared`` is False: those are buffers' methods).

    Example:
        >>> print(foreign_method("RolloutBuffer", "reset"))
        'RolloutBuffer' object has no attribute 'reset'; clear() empties the buffer (SB3's reset)
    """
    hint = FOREIGN_METHODS_OF.get(owner, {}).get(name, FOREIGN_METHODS.get(name) if shared else None)
    if hint is None and shared and not name.startswith("_"):
        # Imported only on a refusal: modules that import this one need no torchrl.
        from torchrl.data import TensorDictReplayBuffer

        if hasattr(TensorDictReplayBuffer, name):
            hint = (f"{name} is TorchRL's ReplayBuffer's; rlbuf's buffer wraps one: buffer.torchrl is the "
                    f"TensorDictReplayBuffer over the same storage")
    return AttributeError(f"{owner!r} object has no attribute {name!r}" + (
        f"; {hint.replace('{cls}', owner)}" if hint else ""))


def refuse_foreign_names(expected: Mapping[str, FieldSpec], given: Mapping[str, Any]) -> None:
    """Raise [`MissingFieldError`][rlbuf.errors.MissingFieldError] for a keyword of another library that is
    not a declared extra field, with the rlbuf name (checked before any other check of ``add``).

    Example:
        >>> refuse_foreign_names({}, {"terminations": 1})
        Traceback (most recent call last):
        ...
        rlbuf.errors.MissingFieldError: terminations: not a field of this buffer; pass terminated= and truncated= (rlbuf's names for gymnasium's terminations and truncations)
        >>> refuse_foreign_names({}, {"cost": 1})  # not a foreign name: check_extras answers it
    """
    for name in given:
        if name not in expected and name in FOREIGN_NAMES:
            raise MissingFieldError(f"{name}: not a field of this buffer; {FOREIGN_NAMES[name]}")


_MINARI_EXACT = frozenset({"episode_id", "episode_seed", "dataset_reward"})


def check_extras(expected: Mapping[str, FieldSpec], given: Mapping[str, Any]) -> None:
    """Raise [`MissingFieldError`][rlbuf.errors.MissingFieldError] when extras are missing or unknown.

    A keyword from another library (``dones=``, ``rewards=``, ``log_probs=`` ...) is answered
    with the rlbuf name to use (see ``FOREIGN_NAMES``).

    Example:
        >>> check_extras({}, {"foo": 1})
        Traceback (most recent call last):
        ...
        rlbuf.errors.MissingFieldError: foo: not a field of this buffer (declare it in extra_fields); extra fields are []
        >>> check_extras({}, {"dones": 1})
        Traceback (most recent call last):
        ...
        rlbuf.errors.MissingFieldError: dones: not a field of this buffer; pass terminated= and truncated= instead; done is derived (terminated | truncated)
        >>> check_extras({"cost": FieldSpec("cost", "cost", (), "float32")}, {})
        Traceback (most recent call last):
        ...
        rlbuf.errors.MissingFieldError: cost: missing; this buffer stores it with every row (an extra field, expected shape () float32 per row): pass cost= to add
    """
    refuse_foreign_names(expected, given)
    for name in given:
        if name not in expected:
            raise MissingFieldError(f"{name}: not a field of this buffer (declare it in extra_fields); "
                                    f"extra fields are {sorted(expected)}")
    for name in expected:
        if name not in given:
            spec = expected[name]
            # from_minari's exact import declares these; a user adding online steps to it has no values for them.
            minari = (" (from_minari's exact import stores episode_id, episode_seed and dataset_reward: import with "
                      "exact=False to add online steps)" if name in _MINARI_EXACT else "")
            raise MissingFieldError(f"{name}: missing; this buffer stores it with every row (an extra field, "
                                    f"expected shape {spec.shape} {str(spec.dtype).removeprefix('torch.')} per row): "
                                    f"pass {name}= to add{minari}")


_M = TypeVar("_M")

if TYPE_CHECKING:  # a type checker sees the classmethod below it

    def loader(method: _M) -> _M:
        return method
else:

    class loader(classmethod):
        """Wraps a ``classmethod`` that returns a new object (``load``), refused when called on an instance:
        TorchRL's ``rb.load(path)`` loads in place, so ``buffer.load(path)`` would return the loaded buffer
        and leave ``buffer`` as it was, unnoticed. (Still a ``classmethod``: doctest finds its examples.)

        Example:
            >>> class Buffer:
            ...     @loader
            ...     @classmethod
            ...     def load(cls, path):
            ...         return cls()
            >>> type(Buffer.load("ckpt")).__name__
            'Buffer'
            >>> Buffer().load("ckpt")
            Traceback (most recent call last):
            ...
            rlbuf.errors.ConfigError: Buffer.load: called on a Buffer, it would return a new one and leave this one as it was; write buffer = Buffer.load(path)
        """

        def __init__(self, method: classmethod) -> None:
            super().__init__(method.__func__)

        def __get__(self, instance: Any, owner: type | None = None) -> Any:
            if instance is None:
                return super().__get__(instance, owner)
            cls, name = type(instance).__name__, self.__func__.__name__

            def refused(*args: Any, **kwargs: Any) -> Any:
                raise ConfigError(f"{cls}.{name}: called on a {cls}, it would return a new one and leave this one "
                                  f"as it was; write buffer = {cls}.{name}(path)")

            return refused
