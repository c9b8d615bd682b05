"""The fix a refusal of a user's value ends with: the cast for a dtype, the single space for a batched shape.

Example:
    >>> import numpy as np
    >>> cast_hint("terminated", np.dtype(np.float32), torch.bool)[:52]
    '; convert the values: terminated.bool() (numpy: term'
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from rlbuf._convert import _NUMPY_DTYPES

# torch's method for each cast, where it has one (``x.long()``); else ``x.to(torch.uint8)``.
_METHOD = {torch.bool: "bool", torch.int64: "long", torch.int32: "int", torch.float32: "float",
           torch.float64: "double", torch.float16: "half"}
_SPACE_OF = {"obs": "observation_space", "next_obs": "observation_space", "privileged_obs": "observation_space",
             "action": "action_space", "expert_action": "action_space"}


def cast_hint(field: str, given: np.dtype[Any] | None, stored: torch.dtype) -> str:
    """The end of a dtype refusal: the cast that converts ``given`` values to the ``stored`` dtype.

    Example:
        >>> cast_hint("terminated", np.dtype(np.float32), torch.bool)
        '; convert the values: terminated.bool() (numpy: terminated.astype(bool)); dones stored as floats (CleanRL) are flags: pass terminated=terminations.bool(), truncated=truncations.bool()'
        >>> cast_hint("obs", np.dtype(np.float32), torch.uint8)  # doctest: +ELLIPSIS
        '; store the observations as the env returns them and scale them after sampling, or build ... all 0 or 1)'
        >>> cast_hint("action", np.dtype(np.float32), torch.int64)
        '; convert the values: action.long() (numpy: action.astype(np.int64)), e.g. actions kept as floats'
    """
    if given is None or stored not in _NUMPY_DTYPES or field.startswith("info["):
        return ""  # a final observation from info: its message says how to give it
    kind, target = given.kind, _NUMPY_DTYPES[stored].kind
    if target == "f" and kind == "b" and field in ("reward", "value", "log_prob", "bootstrap_value"):
        return "; a flag where a number belongs: check the order of the arguments"
    if target == "f" and kind in "biu":
        if field in ("action", "expert_action"):
            return ("; for discrete actions build the buffer with action_dtype=torch.int64 or "
                    "action_space=envs.single_action_space")
        if field in ("obs", "next_obs", "privileged_obs") or field.startswith(("obs[", "next_obs[")):
            return (f"; store them as they come with obs_dtype=torch.{given} or "
                    f"observation_space=envs.single_observation_space, or convert them yourself")
        return f"; declare the field with dtype torch.{given}, or convert the values yourself"
    observation = field in ("obs", "next_obs", "privileged_obs") or field.startswith(("obs[", "next_obs["))
    if target in "iu" and kind == "f" and observation:  # a cast would turn frames scaled to [0, 1] into 0s and 1s
        return (f"; store the observations as the env returns them and scale them after sampling, or build the "
                f"buffer with obs_dtype=torch.{given} (a cast to {stored} would make frames scaled to [0, 1] all 0 or 1)")
    method = _METHOD.get(stored)
    name = field  # obs["camera"] and info["final_obs"][1] read as Python expressions too
    cast = f"{name}.{method}()" if method else f"{name}.to({stored})"
    numpy_cast = f"{name}.astype({'bool' if target == 'b' else 'np.' + str(_NUMPY_DTYPES[stored])})"
    hint = f"; convert the values: {cast} (numpy: {numpy_cast})"
    if target == "b" and name in ("terminated", "truncated"):
        return (hint + "; dones stored as floats (CleanRL) are flags: pass terminated=terminations.bool(), "
                "truncated=truncations.bool()")
    if target in "iu" and kind == "f" and name in ("action", "expert_action"):
        return hint + ", e.g. actions kept as floats"
    return hint


def batched_hint(spec: Any, rows: int, got: tuple[int, ...]) -> str:
    """The end of a refused shape when ``spec`` was declared from a vector env's batched space: ``got``
    is one step of ``rows`` envs (``rows`` > 1) and the declared row shape itself, ``(num_envs, *shape)``.

    Example:
        >>> from rlbuf.spec import FieldSpec
        >>> print(batched_hint(FieldSpec("obs", "observation", (4, 3), torch.float32), 4, (4, 3)))
        ; this buffer stores obs of shape (4, 3), whose first dim is num_envs=4: was it built from envs.observation_space? Build it with observation_space=envs.single_observation_space (one env's space); or, if that was one env's obs, give every env's at once
    """
    space = _SPACE_OF.get(spec.name.split("[", 1)[0])
    if rows < 2 or space is None or spec.shape[:1] != (rows,) or tuple(got) != spec.shape:
        return ""
    return (f"; this buffer stores {spec.name} of shape {spec.shape}, whose first dim is num_envs={rows}: was it "
            f"built from envs.{space}? Build it with {space}=envs.single_{space} (one env's space); or, if that "
            f"was one env's {spec.name}, give every env's at once")


def shape_hint(spec: Any, rows: int, got: tuple[int, ...]) -> str:
    """The end of a refused shape: the fix for the usual slips (a batched space, a missing
    ``num_envs``, a trailing dim of 1 too many or too few), or ``""``.

    Example:
        >>> from rlbuf.spec import FieldSpec
        >>> print(shape_hint(FieldSpec("value", "value", (), torch.float32), 4, (4, 1)))
        ; drop the trailing dim of 1: value.squeeze(-1)
        >>> print(shape_hint(FieldSpec("obs", "observation", (3,), torch.float32), 1, (4, 3)))
        ; this buffer was built for one env (num_envs=1): for 4 envs per add, build it with num_envs=4
        >>> print(shape_hint(FieldSpec("reward", ("next", "reward"), (), torch.float32), 4, (1,)))
        ; that is one env's reward: this buffer (num_envs=4) takes every env's at once, shape (4,)
    """
    got, shape = tuple(got), tuple(spec.shape)
    name = spec.name.split("[", 1)[0]
    if batched := batched_hint(spec, rows, got):
        return batched
    if got == (rows, *shape, 1) or (rows == 1 and got == (*shape, 1)):
        return f"; drop the trailing dim of 1: {name}.squeeze(-1)"
    if rows > 1 and got in (shape, (1, *shape), (*shape, 1)):
        return (f"; that is one env's {name}: this buffer (num_envs={rows}) takes every env's at once, "
                f"shape {(rows, *shape)}")
    if shape[-1:] == (1,) and got in ((rows, *shape[:-1]), shape[:-1]):
        wanted = (rows, *shape) if got == (rows, *shape[:-1]) else shape
        return f"; {name} has a trailing dim of 1 in this buffer: give shape {wanted} ({name}[..., None] for an array)"
    if rows == 1 and len(got) == len(shape) + 1 and got[1:] == shape and got[0] > 1:
        return (f"; this buffer was built for one env (num_envs=1): for {got[0]} envs per add, build it with "
                f"num_envs={got[0]}")
    return ""



def sb3_order_hint(obs: Any, action: Any, refusal: str) -> str:
    """The end of ``refusal``, an ``add``'s, where its arguments look like SB3's order, ``add(obs, next_obs, action,
    reward, done, infos)``: ``action`` shaped like ``obs`` (SB3's ``next_obs`` in its place).

    Example:
        >>> sb3_order_hint(np.zeros((2, 4)), np.zeros((2, 4)), "action: expected shape (2,)")[:33]
        '; are the arguments in SB3 order?'
        >>> sb3_order_hint(np.zeros((2, 4)), np.zeros(2), "reward: expected shape (2,)")
        ''
    """
    try:
        shaped_like_obs = (isinstance(obs, Mapping) and isinstance(action, Mapping)) or (
            np.ndim(obs) > 1 and np.shape(obs) == np.shape(action))
    except Exception:  # ragged values, tensors numpy cannot read (grad-tracking ones in a list): no hint
        shaped_like_obs = False
    if not shaped_like_obs:
        return ""
    hint = ("; are the arguments in SB3 order? Its add(obs, next_obs, action, reward, done, infos) is rlbuf's "
            "add(obs, action, reward, next_obs, terminated, truncated)")
    return hint if "sb3_step" in refusal else f"{hint}, with terminated, truncated, info = rlbuf.gym.sb3_step(done, infos)"


def done_order_hint(obs: Any, next_obs: Any, terminated: Any) -> str:
    """The end of an ``add``'s refusal where ``done`` came before ``next_obs`` (rl-buffer's
    ``add(obs, action, reward, done, next_obs, truncated)``): ``terminated`` shaped like ``obs``, ``next_obs`` not.

    Example:
        >>> done_order_hint(np.zeros((2, 4)), np.zeros(2, bool), np.zeros((2, 4)))[:36]
        '; is done before next_obs (rl-buffer'
        >>> done_order_hint(np.zeros((2, 4)), np.zeros((2, 4)), np.zeros(2, bool))
        ''
    """
    try:
        swapped = (isinstance(terminated, Mapping) and not isinstance(next_obs, Mapping)) or (
            np.ndim(obs) > 0 and np.shape(terminated) == np.shape(obs) != np.shape(next_obs))
    except Exception:  # values numpy cannot read: no hint
        swapped = False
    return ("; is done before next_obs (rl-buffer's add(obs, action, reward, done, next_obs, truncated))? rlbuf's "
            "order is add(obs, action, reward, next_obs, terminated, truncated)") if swapped else ""
