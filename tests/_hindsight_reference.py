"""A plain reference of hindsight relabelling (every row's episode and goals, kept beside a buffer) and the
steps and plans that fill both, for ``tests/test_hindsight*.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import strategies as st
from tensordict import TensorDict

from rlbuf import Hindsight, ReplayBuffer

STRATEGIES = ("future", "episode", "final")
SENTINEL = -7.0  # every stored desired goal: a relabelled row is recognised by its goal


def reached(achieved: np.ndarray[Any, Any], desired: np.ndarray[Any, Any], info: Any) -> np.ndarray[Any, Any]:
    """0 where the goals match, else -1 (gymnasium-robotics' signature)."""
    return np.where((achieved == desired).all(-1), 0.0, -1.0)


def goal_buffer(capacity: int, num_envs: int, strategy: str = "future", ratio: float = 1.0, **options: Any) -> ReplayBuffer:
    return ReplayBuffer(capacity, obs_shape={"observation": 1, "achieved_goal": 2, "desired_goal": 2},
                        action_shape=(), num_envs=num_envs, seed=3,
                        hindsight=Hindsight(strategy, ratio, reached), **options)  # type: ignore[arg-type]


@dataclass
class Reference:
    """Every row written, in write order: the plain-loop model of which rows make up an episode."""

    capacity: int
    env: list[int] = field(default_factory=list)
    ended: list[bool] = field(default_factory=list)
    running: dict[int, torch.Tensor] = field(default_factory=dict)  # next_obs of each env's running episode

    def stored(self) -> list[int]:
        return list(range(max(0, len(self.env) - self.capacity), len(self.env)))

    def candidates(self, serial: int, strategy: str) -> list[int]:
        """Serials a goal for the row ``serial`` may come from, in order."""
        env, oldest = self.env[serial], max(0, len(self.env) - self.capacity)
        mine = [s for s in range(len(self.env)) if self.env[s] == env]
        episode: list[int] = []
        for s in mine:
            episode.append(s)
            if s >= serial and self.ended[s]:
                break
            if self.ended[s]:
                episode = []
        stored = [s for s in episode if s >= oldest]
        if strategy == "final":
            return stored[-1:]
        return [s for s in stored if s >= serial] if strategy == "future" else stored


def add_step(buf: ReplayBuffer, ref: Reference, mask: list[bool], ended: list[bool], truncated: list[bool]) -> None:
    """One vector step whose achieved goals name the row's serial, ``[serial, env]``; each env's
    obs continues its running episode (a left-out row never happened)."""
    n = len(mask)
    serials, serial = [], len(ref.env)
    for e in range(n):
        serials.append(serial if mask[e] else -1)
        serial += mask[e]
    code = torch.tensor([[s, e] for e, s in enumerate(serials)], dtype=torch.float32)
    start = torch.stack([ref.running.get(e, torch.full((2,), -0.5 - e)) for e in range(n)])
    obs = {"observation": start[:, :1], "achieved_goal": start, "desired_goal": torch.full((n, 2), SENTINEL)}
    nxt = {"observation": code[:, :1], "achieved_goal": code, "desired_goal": torch.full((n, 2), SENTINEL)}
    terminated = [a and not t for a, t in zip(ended, truncated, strict=True)]
    buf.add(obs, torch.zeros(n), torch.full((n,), -1.0), nxt, torch.tensor(terminated), torch.tensor(truncated),
            env_mask=None if all(mask) else torch.tensor(mask))
    for e in range(n):
        if mask[e]:
            ref.env.append(e)
            ref.ended.append(ended[e])
            if ended[e]:
                ref.running.pop(e, None)
            else:
                ref.running[e] = code[e]


@dataclass(frozen=True)
class Extend:
    """An ``extend`` of ``T`` steps of every env (env first); ``ended[e][t]``: step t of env e ends its
    episode (by a time limit where ``truncated[e][t]`` too)."""

    T: int
    ended: list[list[bool]]
    truncated: list[list[bool]]


def extend_steps(buf: ReplayBuffer, ref: Reference, step: Extend) -> None:
    """``add_step`` for an env-first batch: achieved goals ``[serial, env]``, serials env by env
    (the rows' write order); a step after one that ended starts anywhere."""
    n, T = len(step.ended), step.T
    base = len(ref.env)
    code = torch.tensor([[[base + e * T + t, e] for t in range(T)] for e in range(n)], dtype=torch.float32)
    start = torch.stack([torch.stack([ref.running.get(e, torch.full((2,), -0.5 - e))]
                                     + [torch.full((2,), -100.0 - t) if step.ended[e][t] else code[e, t]
                                        for t in range(T - 1)]) for e in range(n)])
    ended = torch.tensor(step.ended)
    truncated = ended & torch.tensor(step.truncated)
    goal = torch.full((n, T, 2), SENTINEL)
    buf.extend(TensorDict({"observation": {"observation": start[..., :1], "achieved_goal": start, "desired_goal": goal},
                           "action": torch.zeros(n, T),
                           "next": {"observation": {"observation": code[..., :1], "achieved_goal": code,
                                                    "desired_goal": goal},
                                    "reward": torch.full((n, T, 1), -1.0), "terminated": (ended & ~truncated)[..., None],
                                    "truncated": truncated[..., None]}}, batch_size=[n, T]))
    for e in range(n):
        ref.env.extend([e] * T)
        ref.ended.extend(step.ended[e])
        if step.ended[e][-1]:
            ref.running.pop(e, None)
        else:
            ref.running[e] = code[e, -1]


def _plan(n: int) -> st.SearchStrategy[Any]:
    """Vector steps (mask, ends, cuts) and env-first extends, some of more rows than the ring holds."""
    flags = st.lists(st.booleans(), min_size=n, max_size=n)
    step = st.tuples(flags, st.lists(st.integers(0, 5), min_size=n, max_size=n), flags)
    extend = st.integers(1, 12).flatmap(lambda T: st.builds(
        Extend, st.just(T), *[st.lists(st.lists(st.integers(0, 5).map(lambda x: x == 0), min_size=T, max_size=T),
                                       min_size=n, max_size=n)] * 2))
    return st.lists(st.one_of(step, step, extend), min_size=1, max_size=40)


steps = st.integers(1, 3).flatmap(lambda n: st.tuples(st.just(n), st.integers(3, 24), _plan(n)))


def fill(n: int, capacity: int, plan: list[Any], strategy: str = "future", ratio: float = 1.0) -> tuple[ReplayBuffer, Reference]:
    return fill_into(goal_buffer(capacity, n, strategy, ratio), Reference(capacity), plan)


def fill_into(buf: ReplayBuffer, ref: Reference, plan: list[Any]) -> tuple[ReplayBuffer, Reference]:
    for step in plan:
        if isinstance(step, Extend):
            extend_steps(buf, ref, step)
            continue
        keep, end, cut = step
        mask = [k or (sum(keep) == 0 and e == 0) for e, k in enumerate(keep)]
        add_step(buf, ref, mask, [x == 0 for x in end], [x == 0 and c for x, c in zip(end, cut, strict=True)])
    return buf, ref


MASKED_ENDS = pytest.mark.filterwarnings("ignore:add. env_mask leaves out")
