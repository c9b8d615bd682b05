"""How fast is rlbuf's RolloutBuffer through one PPO rollout, next to SB3 and hand-written tensors?

One rollout of ``T=24`` steps from ``N=4096`` envs, observations ``(48,)`` float32, actions
``(12,)`` float32. Measured, per peer:

* ``add``: one step of all ``N`` envs, per call, over whole rollouts: each round is one
  rollout, so it includes the per-rollout ``clear()`` (rlbuf) or ``reset()`` (SB3; it
  reallocates its arrays, as SB3's PPO does before every rollout).
* ``GAE``: advantages and returns of the full rollout (rlbuf
  ``compute_returns_and_advantages``; SB3 ``compute_returns_and_advantage(last_values, dones)``).
* ``minibatches``: one training phase of 5 epochs × 4 shuffled minibatches, iterated fully
  (rlbuf ``minibatches(num_minibatches=4, n_epochs=5)``; SB3 ``get(batch_size)`` per epoch,
  starting from the unflattened buffer, so it pays the flatten copy of its first ``get()``
  once per phase as a PPO user does).
* ``rollout + training``: all of the above in sequence, one call per rollout; this also
  counts work an op defers to the next one (rlbuf commits its added rows at the first read).

Peers, all in this process on one torch thread:

* ``rlbuf-t``: :class:`rlbuf.RolloutBuffer` fed torch tensors; ``rlbuf-np`` fed what SB3's
  ``add`` is fed (numpy from the VecEnv: obs, action, reward, flags; torch from the policy:
  value, log_prob, bootstrap_value). rlbuf gets ``terminated`` and ``truncated`` separately
  and, since with 4096 envs some env times out at nearly every step, ``bootstrap_value``
  at every step. GAE and minibatches do not depend on the input type: one ``rlbuf`` row.
* ``sb3``: Stable-Baselines3 ``RolloutBuffer(n_envs=4096, device="cpu")`` with gymnasium
  ``Box`` spaces, fed numpy arrays and torch ``value``/``log_prob`` as its PPO does.
* ``tensors``: what a CleanRL PPO script writes: preallocated ``[T, N, ...]`` tensors
  assigned in place (one ``done`` flag), a torch backward GAE loop, ``randperm`` and
  ``tensor[index]`` per minibatch (obs, action, log_prob, advantage, returns, value).

rlbuf's minibatches carry every stored field (11 here); SB3's and the tensors' six. Each
table gives the median time per call over rounds in which every peer runs in turn (see
``_timing.py``) and rlbuf's time divided by each peer's: below 1 means rlbuf is faster. A
"targets" section at the end checks rlbuf's goals: each op at most SB3's time.

Run from the repository root::

    PYTHONPATH=. python benchmarks/rollout.py           # about 30 s on 2 cores
    PYTHONPATH=. python benchmarks/rollout.py --quick   # smoke run, a few seconds
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from _timing import print_table, time_interleaved
from gymnasium import spaces
from stable_baselines3.common.buffers import RolloutBuffer as Sb3Buffer

from rlbuf import RolloutBuffer

T, N, OBS, ACT = 24, 4096, 48, 12
GAMMA, GAE_LAMBDA = 0.99, 0.95
N_EPOCHS, NUM_MINIBATCHES = 5, 4
MINIBATCH_SIZE = T * N // NUM_MINIBATCHES


@dataclass(frozen=True)
class Step:
    """One step of all envs, as the VecEnv (numpy) and the policy (torch) hand it over."""

    obs: np.ndarray
    action: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    episode_start: np.ndarray  # SB3's flag: the previous step ended the episode
    value: torch.Tensor
    log_prob: torch.Tensor
    bootstrap_value: torch.Tensor

    def torch_inputs(self) -> dict[str, Any]:
        """rlbuf's add arguments, every one a tensor."""
        return {"obs": torch.from_numpy(self.obs), "action": torch.from_numpy(self.action),
                "reward": torch.from_numpy(self.reward), "terminated": torch.from_numpy(self.terminated),
                "truncated": torch.from_numpy(self.truncated), "value": self.value,
                "log_prob": self.log_prob, "bootstrap_value": self.bootstrap_value}

    def sb3_inputs(self) -> dict[str, Any]:
        """rlbuf's add arguments typed as SB3's add receives them."""
        return {"obs": self.obs, "action": self.action, "reward": self.reward, "terminated": self.terminated,
                "truncated": self.truncated, "value": self.value, "log_prob": self.log_prob,
                "bootstrap_value": self.bootstrap_value}


def make_rollout(rng: np.random.Generator) -> list[Step]:
    """``T`` steps with ~1% terminations and ~0.1% timeouts per env and step."""
    steps, previous_done = [], np.zeros(N, np.bool_)
    for _ in range(T):
        terminated = rng.random(N) < 0.01
        truncated = ~terminated & (rng.random(N) < 0.001)
        steps.append(Step(
            obs=rng.standard_normal((N, OBS), dtype=np.float32),
            action=rng.uniform(-1, 1, (N, ACT)).astype(np.float32),
            reward=rng.standard_normal(N, dtype=np.float32),
            terminated=terminated, truncated=truncated, episode_start=previous_done,
            value=torch.from_numpy(rng.standard_normal(N, dtype=np.float32)),
            log_prob=torch.from_numpy(rng.standard_normal(N, dtype=np.float32)),
            bootstrap_value=torch.from_numpy(rng.standard_normal(N, dtype=np.float32)),
        ))
        previous_done = terminated | truncated
    return steps


# -- peers ---------------------------------------------------------------------------------
class RlbufPeer:
    """rlbuf's RolloutBuffer, fed torch tensors or SB3's input types."""

    def __init__(self, rollout: list[Step], *, numpy_inputs: bool) -> None:
        self.buf = RolloutBuffer(T, N, obs_shape=(OBS,), action_shape=(ACT,), seed=0)
        self.inputs = [step.sb3_inputs() if numpy_inputs else step.torch_inputs() for step in rollout]
        self.last_value = torch.from_numpy(np.random.default_rng(1).standard_normal(N, dtype=np.float32))

    def add(self) -> None:
        if self.buf.is_full:
            self.buf.clear()
        self.buf.add(**self.inputs[self.buf.steps])

    def gae(self) -> None:
        self.buf.compute_returns_and_advantages(self.last_value, gamma=GAMMA, gae_lambda=GAE_LAMBDA)

    def minibatches(self) -> None:
        for _ in self.buf.minibatches(num_minibatches=NUM_MINIBATCHES, n_epochs=N_EPOCHS):
            pass


class Sb3Peer:
    """Stable-Baselines3's RolloutBuffer, used as its PPO uses it."""

    def __init__(self, rollout: list[Step]) -> None:
        box = spaces.Box(-np.inf, np.inf, (OBS,), np.float32)
        self.buf = Sb3Buffer(T, box, spaces.Box(-1, 1, (ACT,), np.float32), device="cpu",
                             gae_lambda=GAE_LAMBDA, gamma=GAMMA, n_envs=N)
        self.rollout = rollout
        self.values = [step.value[:, None] for step in rollout]  # its value head's [N, 1] output
        self.last_values = torch.from_numpy(np.random.default_rng(1).standard_normal((N, 1), dtype=np.float32))
        self.last_dones = rollout[-1].terminated | rollout[-1].truncated
        self.unflattened: dict[str, np.ndarray] = {}

    def add(self) -> None:
        buf = self.buf
        if buf.full:
            buf.reset()
        step = self.rollout[buf.pos]
        buf.add(step.obs, step.action, step.reward, step.episode_start, self.values[buf.pos], step.log_prob)

    def gae(self) -> None:
        self.buf.compute_returns_and_advantage(self.last_values, self.last_dones)

    def keep_unflattened(self) -> None:
        """Remember the filled ``[T, N]`` arrays, so each timed phase flattens them anew."""
        names = ("observations", "actions", "values", "log_probs", "advantages", "returns")
        self.unflattened = {name: getattr(self.buf, name) for name in names}

    def minibatches(self) -> None:
        buf = self.buf
        if self.unflattened:
            buf.__dict__.update(self.unflattened)
            buf.generator_ready = False
        for _ in range(N_EPOCHS):
            for _ in buf.get(MINIBATCH_SIZE):
                pass


class TensorsPeer:
    """The storage, GAE and minibatch loop of a CleanRL PPO script."""

    def __init__(self, rollout: list[Step]) -> None:
        self.obs = torch.zeros(T, N, OBS)
        self.action = torch.zeros(T, N, ACT)
        self.log_prob, self.reward, self.done, self.value = (torch.zeros(T, N) for _ in range(4))
        self.advantage, self.returns = torch.zeros(T, N), torch.zeros(T, N)
        self.inputs = [(torch.from_numpy(step.obs), torch.from_numpy(step.action), torch.from_numpy(step.reward),
                        torch.from_numpy(step.episode_start).float(), step.value, step.log_prob)
                       for step in rollout]
        self.last_value = torch.from_numpy(np.random.default_rng(1).standard_normal(N, dtype=np.float32))
        self.last_done = torch.from_numpy(rollout[-1].terminated | rollout[-1].truncated).float()
        self.pos = 0

    def add(self) -> None:
        t = self.pos
        self.obs[t], self.action[t], self.reward[t], self.done[t], self.value[t], self.log_prob[t] = self.inputs[t]
        self.pos = (t + 1) % T

    def gae(self) -> None:
        last_gae: torch.Tensor | float = 0.0
        for t in reversed(range(T)):
            if t == T - 1:
                next_nonterminal, next_value = 1.0 - self.last_done, self.last_value
            else:
                next_nonterminal, next_value = 1.0 - self.done[t + 1], self.value[t + 1]
            delta = self.reward[t] + GAMMA * next_value * next_nonterminal - self.value[t]
            self.advantage[t] = last_gae = delta + GAMMA * GAE_LAMBDA * next_nonterminal * last_gae
        self.returns = self.advantage + self.value

    def minibatches(self) -> None:
        b_obs, b_action = self.obs.reshape(-1, OBS), self.action.reshape(-1, ACT)
        b_log_prob, b_advantage = self.log_prob.reshape(-1), self.advantage.reshape(-1)
        b_returns, b_value = self.returns.reshape(-1), self.value.reshape(-1)
        for _ in range(N_EPOCHS):
            order = torch.randperm(T * N)
            for start in range(0, T * N, MINIBATCH_SIZE):
                index = order[start:start + MINIBATCH_SIZE]
                _ = (b_obs[index], b_action[index], b_log_prob[index], b_advantage[index], b_returns[index],
                     b_value[index])


Peer = RlbufPeer | Sb3Peer | TensorsPeer


def make_peers(rollout: list[Step], *, both_inputs: bool) -> dict[str, Peer]:
    peers: dict[str, Peer] = {}
    if both_inputs:
        peers["rlbuf-t"] = RlbufPeer(rollout, numpy_inputs=False)
        peers["rlbuf-np"] = RlbufPeer(rollout, numpy_inputs=True)
    else:
        peers["rlbuf"] = RlbufPeer(rollout, numpy_inputs=False)
    peers["sb3"] = Sb3Peer(rollout)
    peers["tensors"] = TensorsPeer(rollout)
    return peers


def fill(peers: dict[str, Peer]) -> None:
    """One full rollout into every peer, with advantages computed."""
    for peer in peers.values():
        for _ in range(T):
            peer.add()
        peer.gae()
        if isinstance(peer, Sb3Peer):
            peer.keep_unflattened()


def training_phase(peer: Peer) -> Callable[[], object]:
    def run() -> None:
        for _ in range(T):
            peer.add()
        peer.gae()
        peer.minibatches()
    return run


# -- running -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Plan:
    """Rounds (repeats) and calls per peer per round, by table."""

    repeats: dict[str, int]
    number: dict[str, int]


def plan(quick: bool) -> Plan:
    if quick:
        return Plan({"add": 3, "GAE": 3, "minibatches": 3, "rollout + training": 3},
                    {"add": T, "GAE": 2, "minibatches": 1, "rollout + training": 1})
    # Each add round is one rollout (T adds), so every round pays one clear/reset.
    return Plan({"add": 61, "GAE": 61, "minibatches": 31, "rollout + training": 21},
                {"add": T, "GAE": 20, "minibatches": 1, "rollout + training": 1})


def time_table(title: str, calls: dict[str, Callable[[], object]], ours: list[str], bench: Plan,
               results: dict[str, dict[str, float]]) -> None:
    results[title] = time_interleaved(calls, repeats=bench.repeats[title], number=bench.number[title])
    print_table(title, results[title], ours)


def print_targets(results: dict[str, dict[str, float]]) -> None:
    print("\ntargets (ratio = rlbuf time ÷ SB3 time)")
    add, gae, mb = results["add"], results["GAE"], results["minibatches"]
    checks = [
        ("add, torch input     ≤ 1× SB3", add["rlbuf-t"] / add["sb3"]),
        ("add, numpy input     ≤ 1× SB3", add["rlbuf-np"] / add["sb3"]),
        ("GAE                  ≤ 1× SB3", gae["rlbuf"] / gae["sb3"]),
        ("minibatches 5×4      ≤ 1× SB3", mb["rlbuf"] / mb["sb3"]),
    ]
    for what, ratio in checks:
        print(f"  {'PASS' if ratio <= 1.0 else 'MISS'}  {what:<32} ratio {ratio:.3f} (≤ 1)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few rounds: a smoke run")
    args = parser.parse_args()
    logging.getLogger("torchrl").setLevel(logging.WARNING)  # storage-initialised notices
    torch.set_num_threads(1)
    torch.manual_seed(0)
    np.random.seed(0)  # SB3 shuffles with numpy's global generator
    versions = ", ".join(f"{name} {importlib.metadata.version(name)}"
                         for name in ("torch", "torchrl", "tensordict", "stable_baselines3", "numpy"))
    print(f"rlbuf rollout benchmark{' (--quick)' if args.quick else ''}: T={T}, N={N}, obs ({OBS},) float32, "
          f"action ({ACT},) float32; {versions}; 1 torch thread")
    print("'X ÷' columns: X's time divided by the row's (< 1: X is faster); medians of interleaved rounds")
    started = time.perf_counter()
    bench = plan(args.quick)
    rollout = make_rollout(np.random.default_rng(0))
    results: dict[str, dict[str, float]] = {}

    peers = make_peers(rollout, both_inputs=True)
    time_table("add", {name: peer.add for name, peer in peers.items()}, ["rlbuf-t", "rlbuf-np"], bench,
               results)
    del peers
    gc.collect()

    peers = make_peers(rollout, both_inputs=False)
    fill(peers)
    time_table("GAE", {name: peer.gae for name, peer in peers.items()}, ["rlbuf"], bench, results)
    time_table("minibatches", {name: peer.minibatches for name, peer in peers.items()}, ["rlbuf"], bench,
               results)
    del peers
    gc.collect()

    peers = make_peers(rollout, both_inputs=True)
    time_table("rollout + training", {name: training_phase(peer) for name, peer in peers.items()},
               ["rlbuf-t", "rlbuf-np"], bench, results)
    del peers
    gc.collect()

    print_targets(results)
    print(f"\ntotal {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
