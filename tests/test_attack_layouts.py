"""Hostile input through every entry path of every ReplayBuffer layout: refused by name, nothing changed.

``test_attack_inputs.py`` attacks the plain layout method by method. Here each layout that keeps
state of its own (the compact layout's stream tables, dict observations stored leaf by leaf,
hidden states, the sum tree of prioritized replay, memmap files) is attacked through each way rows
enter: ``add``, ``add`` with ``env_mask``, ``add(Transition)`` and ``extend``. One field of an
otherwise valid step is replaced by a hostile value; the call must either raise an rlbuf error
naming the field and leave a full snapshot of the buffer (rows, cursor, write count, stream tables,
priorities, random state) exactly as it was, or succeed and leave the buffer's invariants true.
Valid steps given through the different paths must store the same transitions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from _snapshot import check_invariants, same, snapshot
from hypothesis import given
from hypothesis import strategies as st
from tensordict import TensorDict
from test_attack_inputs import _DTYPES, _FILLS, _SHAPES, FUZZ, HOSTILE, _tensor

from rlbuf import ReplayBuffer, RlbufError, Transition

NUM_ENVS = 2
FRAME = (4,)

LAYOUTS: dict[str, dict[str, Any]] = {
    "compact": dict(obs_shape=(2, *FRAME), obs_dtype=torch.uint8, frame_stack=2, n_step=2),
    "compact-memmap": dict(obs_shape=(2, *FRAME), obs_dtype=torch.uint8, frame_stack=2, n_step=2,
                           storage="memmap"),
    "dict": dict(obs_shape={"a": (3,), "b": {"c": (2,)}}),
    "hidden": dict(obs_shape=(3,), hidden_state_shape={"h": (1, 2)}),
    "prioritized": dict(obs_shape=(3,), prioritized=True),
    "memmap": dict(obs_shape=(3,), storage="memmap"),
}


class Steps:
    """Valid env steps for one layout, consistent with what was stored before (frame streams)."""

    def __init__(self, layout: str) -> None:
        self.layout = layout
        self.t = 0
        self.start = [0] * NUM_ENVS  # the step each env's running episode began at

    def _frame(self, t: int, env: int) -> torch.Tensor:
        return torch.full(FRAME, (3 * t + env) % 250, dtype=torch.uint8)

    def _stack(self, first: int, last: int, env: int) -> torch.Tensor:
        return torch.stack([self._frame(first, env), self._frame(last, env)])

    def _obs(self, pair: Callable[[int], torch.Tensor]) -> Any:
        rows = torch.stack([pair(env) for env in range(NUM_ENVS)])
        if self.layout == "dict":
            return {"a": rows, "b": {"c": torch.ones(NUM_ENVS, 2)}}
        return rows

    def step(self) -> dict[str, Any]:
        """The keyword arguments of ``add`` for the next step (without advancing)."""
        t = self.t
        terminated = torch.tensor([t % 5 == 4, False])
        truncated = torch.tensor([False, t % 7 == 6])
        if self.layout.startswith("compact"):
            obs = self._obs(lambda env: self._stack(max(t - 1, self.start[env]), t, env))
            next_obs = self._obs(lambda env: self._stack(t, t + 1, env))
        else:
            obs = self._obs(lambda env: torch.full((3,), float(t + env)))
            next_obs = self._obs(lambda env: torch.full((3,), float(t + env + 1)))
        values: dict[str, Any] = dict(obs=obs, action=torch.full((NUM_ENVS,), float(t)),
                                      reward=torch.full((NUM_ENVS,), 0.5 * t), next_obs=next_obs,
                                      terminated=terminated, truncated=truncated)
        if self.layout == "hidden":
            values["hidden_state"] = {"h": torch.full((NUM_ENVS, 1, 2), float(t))}
        return values

    def advance(self) -> None:
        values = self.step()
        ended = values["terminated"] | values["truncated"]
        self.t += 1
        for env in range(NUM_ENVS):
            if ended[env]:
                self.start[env] = self.t


def make(layout: str, steps: int) -> tuple[ReplayBuffer, Steps]:
    buffer = ReplayBuffer(6, action_shape=(), num_envs=NUM_ENVS, seed=5, **LAYOUTS[layout])
    driver = Steps(layout)
    for _ in range(steps):
        buffer.add(**driver.step())
        driver.advance()
    if layout == "prioritized" and steps:
        buffer.update_priority([0, 1], [0.5, 2.0])
    return buffer, driver


def as_td(values: dict[str, Any]) -> TensorDict:
    """One step in TorchRL layout, batch ``[num_envs, 1]`` (a collector's ``[num_envs, T]``)."""
    def leaf(value: Any) -> Any:
        return TensorDict(value, batch_size=[NUM_ENVS]) if isinstance(value, dict) else value

    td = TensorDict({"observation": leaf(values["obs"]), "action": values["action"],
                     "next": {"observation": leaf(values["next_obs"]), "reward": values["reward"].unsqueeze(-1),
                              "terminated": values["terminated"].unsqueeze(-1),
                              "truncated": values["truncated"].unsqueeze(-1)}}, batch_size=[NUM_ENVS])
    if "hidden_state" in values:
        td["recurrent_state_h"] = values["hidden_state"]["h"]
    return td.unsqueeze(-1)


_TD_KEYS = {"obs": "observation", "action": "action", "next_obs": ("next", "observation"),
            "reward": ("next", "reward"), "terminated": ("next", "terminated"),
            "truncated": ("next", "truncated"), "hidden_state": "recurrent_state_h"}
_TD_NAMES = {"obs": ("obs", "observation"), "next_obs": ("next_obs", "observation"),
             "hidden_state": ("hidden_state", "recurrent_state")}


def attempt(buffer: ReplayBuffer, call: Callable[[], Any], names: tuple[str, ...]) -> None:
    before = snapshot(buffer)
    try:
        call()
    except RlbufError as error:
        assert same(before, snapshot(buffer)), f"a refused call changed the buffer: {error!r}"
        assert any(name in str(error) for name in names), f"{names} not named in {error}"
        return
    except BaseException as error:
        pytest.fail(f"foreign exception {type(error).__name__}: {error}")
    check_invariants(buffer)
    assert buffer.check_valid() == (True, "")


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@FUZZ
@given(data=st.data())
def test_every_entry_path_refuses_hostile_fields_without_change(layout: str, data: st.DataObject) -> None:
    buffer, driver = make(layout, data.draw(st.sampled_from([0, 3, 8]), label="steps"))
    good = driver.step()
    field = data.draw(st.sampled_from(sorted(good)), label="field")
    path = data.draw(st.sampled_from(["add", "env_mask", "transition", "extend"]), label="path")
    names = (field,)
    if path == "extend":
        # A tensordict holds tensors of its batch size [num_envs, 1]: the hostile part is the rest.
        value = _tensor((NUM_ENVS, 1, *data.draw(st.sampled_from(_SHAPES), label="shape")),
                        data.draw(st.sampled_from(_DTYPES), label="dtype"), data.draw(st.sampled_from(_FILLS)),
                        data.draw(st.sampled_from(["cpu", "cpu", "meta"]), label="device"))
        td = as_td(good)
        key = _TD_KEYS[field]
        names = (*_TD_NAMES.get(field, (field,)), "td")
        if isinstance(td.get(key), TensorDict):
            key = (*((key,) if isinstance(key, str) else key), "a")
        td.set(key, value)
        attempt(buffer, lambda: buffer.extend(td), names)
        return
    given_values = {**good, field: data.draw(HOSTILE, label="value")}
    if path == "add":
        attempt(buffer, lambda: buffer.add(**given_values), names)
    elif path == "env_mask":
        mask = np.array([True, False])
        attempt(buffer, lambda: buffer.add(**given_values, env_mask=mask), names)
    else:
        hidden = given_values.pop("hidden_state", None)
        extras = {} if hidden is None else {"hidden_state": hidden}
        transition = Transition(given_values["obs"], given_values["action"], given_values["reward"],
                                given_values["next_obs"], given_values["terminated"], given_values["truncated"],
                                extras or None)
        attempt(buffer, lambda: buffer.add(transition), names)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_the_same_steps_through_add_transition_and_extend_store_the_same_transitions(layout: str) -> None:
    stored = {}
    for path in ("add", "transition", "extend"):
        buffer = ReplayBuffer(14, action_shape=(), num_envs=NUM_ENVS, seed=5, **LAYOUTS[layout])
        driver = Steps(layout)
        for _ in range(9):  # 18 rows into 14: the ring wraps
            values = driver.step()
            if path == "add":
                buffer.add(**values)
            elif path == "extend":
                buffer.extend(as_td(values))
            else:
                hidden = values.pop("hidden_state", None)
                buffer.add(Transition(values["obs"], values["action"], values["reward"], values["next_obs"],
                                      values["terminated"], values["truncated"],
                                      None if hidden is None else {"hidden_state": hidden}))
            driver.advance()
        batch = buffer.sample_all().to_tensordict()
        stored[path] = batch.exclude("index", "weight")
        assert buffer.check_valid() == (True, "")
    assert (stored["add"] == stored["transition"]).all()
    assert (stored["add"] == stored["extend"]).all()
