"""``ReplayBuffer.sample_sequences`` against a plain Python model of which steps a sequence holds.

The model keeps every row ever written (env, step, flags) in write order; the ring holds the newest
``capacity``. After any mix of adds, time-major extends, masked adds, ``truncate_episodes``,
``clear``, save/load and wraps of the ring, each sampled sequence must be consecutive stored steps of
one env from a start that has them, with the flags as stored, ``mask`` False after the first end,
``is_first`` where the env's previous step ended an episode (or it had none; unknown once
overwritten), and the hidden state of its first step.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from rlbuf import ReplayBuffer
from rlbuf.errors import BatchSizeError, ConfigError


class Model:
    """Every row written since the last clear: ``[env, step, terminated, truncated]`` in write order."""

    def __init__(self, capacity: int, num_envs: int) -> None:
        self.capacity, self.num_envs = capacity, num_envs
        self.rows: list[list[Any]] = []
        self.steps = [0] * num_envs
        self.interleaved = True  # each env's rows num_envs apart

    def stored(self) -> list[list[Any]]:
        return self.rows[max(0, len(self.rows) - self.capacity):]

    def write(self, env: int, terminated: bool, truncated: bool) -> None:
        self.rows.append([env, self.steps[env], terminated, truncated])
        self.steps[env] += 1

    def row(self, env: int, step: int) -> list[Any] | None:
        return next((r for r in self.rows if r[0] == env and r[1] == step), None)

    def truncate(self, envs: list[int]) -> None:
        stored = self.stored()
        for env in envs:
            mine = [r for r in self.rows if r[0] == env]
            if mine and any(r is mine[-1] for r in stored) and not (mine[-1][2] or mine[-1][3]):
                mine[-1][3] = True


OPS = st.lists(st.one_of(
    st.tuples(st.just("add"), st.lists(st.integers(0, 5), min_size=3, max_size=3),
              st.lists(st.booleans(), min_size=3, max_size=3)),
    st.tuples(st.just("extend"), st.integers(1, 4), st.integers(0, 1000), st.booleans()),
    st.tuples(st.just("truncate"), st.lists(st.booleans(), min_size=3, max_size=3)),
    st.tuples(st.just("save")),
    st.tuples(st.just("clear")),
    st.tuples(st.just("sample"), st.integers(1, 4), st.integers(0, 3)),
), min_size=1, max_size=30)


def code(env: int, step: int) -> float:
    return float(env * 1000 + step)


def check_sequences(buf: ReplayBuffer, model: Model, length: int, burn_in: int) -> None:
    span, stored = length + burn_in, model.stored()
    if not stored:
        return
    live = {(r[0], r[1]) for r in stored}
    starts = {(r[0], r[1]) for r in stored if all((r[0], r[1] + k) in live for k in range(span))}
    if not model.interleaved or not starts:
        rng = buf.state_dict(data=False)["rng"]["sample"]
        with pytest.raises(ConfigError if not model.interleaved else BatchSizeError):
            buf.sample_sequences(4, length, burn_in=burn_in)
        assert torch.equal(buf.state_dict(data=False)["rng"]["sample"], rng)
        return
    batch = buf.sample_sequences(16, length, burn_in=burn_in)
    assert batch.obs.shape == (16, span, 1) and batch.mask.dtype == torch.bool and batch.burn_in == burn_in
    assert batch.hidden_state is not None
    for b in range(16):
        env, step = divmod(int(batch.obs[b, 0, 0]), 1000)  # type: ignore[index]
        assert (env, step) in starts
        assert float(batch.hidden_state[b, 0, 0]) == code(env, step) + 0.5  # type: ignore[index]
        ended = False
        for k in range(span):
            row = model.row(env, step + k)
            assert row is not None and float(batch.obs[b, k, 0]) == code(env, step + k)  # type: ignore[index]
            assert (bool(batch.terminated[b, k]), bool(batch.truncated[b, k])) == (row[2], row[3])
            assert bool(batch.mask[b, k]) == (not ended)
            previous = model.row(env, step + k - 1)
            if previous is None:
                first = True
            elif k == 0 and not any(r is previous for r in stored):
                first = False  # overwritten: whether it ended an episode is no longer known
            else:
                first = bool(previous[2] or previous[3])
            assert bool(batch.is_first[b, k]) == first
            ended = ended or row[2] or row[3]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(capacity=st.integers(3, 25), num_envs=st.integers(1, 3), ops=OPS)
def test_sampled_sequences_are_what_the_model_says(tmp_path_factory: pytest.TempPathFactory, capacity: int,
                                                   num_envs: int, ops: list[tuple[Any, ...]]) -> None:
    n, capacity = num_envs, max(capacity, num_envs)
    buf = ReplayBuffer(capacity, obs_shape=(1,), action_shape=(), num_envs=n, seed=0, hidden_state_shape=(1, 1))
    model = Model(capacity, n)
    warnings.simplefilter("ignore")  # the reset-step heuristic, for made-up observations
    for op in ops:
        if op[0] == "add":
            flags, keep = op[1][:n], op[2][:n]
            obs = torch.tensor([[code(e, model.steps[e])] for e in range(n)])
            terminated, truncated = [c == 0 for c in flags], [c == 1 for c in flags]
            buf.add(obs, torch.zeros(n), torch.zeros(n), obs + 1, torch.tensor(terminated),
                    truncated=torch.tensor(truncated), hidden_state=obs.view(n, 1, 1) + 0.5,
                    env_mask=torch.tensor(keep))
            for e in range(n):
                if keep[e]:
                    model.write(e, terminated[e], truncated[e])
            model.interleaved = model.interleaved and (all(keep) or not any(keep))
        elif op[0] == "extend":
            steps, seed, time_major = op[1:]
            if n > 1 and steps == n:
                steps += 1  # a square batch is read env-major (a collector's), whatever was meant
            # One env and not time-major: a collector's [2, T] batch of two envs into a buffer of one env.
            lead = (steps, n) if time_major else (2, steps) if n == 1 else (n, steps)
            g = torch.Generator().manual_seed(seed)
            flags = torch.randint(0, 6, lead, generator=g)
            envs = [0] * (lead[0] * lead[1]) if n == 1 else [
                e for t in range(steps) for e in range(n)] if time_major else [e for e in range(n) for _ in range(steps)]
            counts = list(model.steps)
            obs = []
            for e in envs:
                obs.append(code(e, counts[e]))
                counts[e] += 1
            obs_t = torch.tensor(obs).view(lead)
            td = TensorDict({"observation": obs_t.unsqueeze(-1), "action": torch.zeros(lead),
                             "recurrent_state": obs_t.view(*lead, 1, 1) + 0.5,
                             "next": {"observation": obs_t.unsqueeze(-1) + 1, "reward": torch.zeros(lead),
                                      "terminated": flags == 0, "truncated": flags == 1}}, batch_size=list(lead))
            buf.extend(td)
            for e, flag in zip(envs, flags.reshape(-1).tolist(), strict=True):
                model.write(e, flag == 0, flag == 1)
            model.interleaved = model.interleaved and (time_major or steps == 1)
        elif op[0] == "truncate":
            mask = op[1][:n]
            buf.truncate_episodes(torch.tensor(mask))
            if model.interleaved:  # else each env's newest row is not known (see truncate_episodes)
                model.truncate([e for e in range(n) if mask[e]])
            elif any(mask):
                return  # the model no longer knows what the buffer marked
        elif op[0] == "save":
            path = Path(tmp_path_factory.mktemp("ckpt")) / "ckpt"
            buf.save(path)
            loaded = ReplayBuffer.load(path)
            if model.interleaved and len(buf):  # the next draws of both are the same
                assert torch.equal(buf.sample_sequences(3, 1).index, loaded.sample_sequences(3, 1).index)
            buf = loaded
        elif op[0] == "clear":
            buf.clear()
            model = Model(capacity, n)
        else:
            check_sequences(buf, model, op[1], op[2])
