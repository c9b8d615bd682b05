"""How fast is rlbuf on a GPU: Isaac-scale PPO rollouts, CUDA replay, CPU storage feeding a GPU learner?

Three questions, each answered side by side in this process, on ``--device`` (``cuda`` when
there is one; ``--device cpu`` runs the first two on the CPU, so the figures exist without a GPU):

1. **Rollout** (``T=24, N=4096``, observations 48 + privileged 187, actions 12, plus the
   policy's action mean and std, 12 each, which rsl_rl keeps for its adaptive learning rate),
   stored on the device. Per op:

   * ``add``: one step of all envs, per call, over whole rollouts (so it includes the
     per-rollout ``clear()``). rlbuf also gets ``truncated`` and ``bootstrap_value``.
   * ``GAE``: advantages and returns of the full rollout, normalised over the rollout
     (rsl_rl's default). rsl_rl's GAE lives in ``PPO.compute_returns``; its peer here runs the
     same loop on the ``RolloutStorage`` tensors, given the last values.
   * ``minibatches``: one training phase of 5 epochs x 4 shuffled minibatches, iterated fully.
     rsl_rl ``mini_batch_generator(4, 5)`` (one permutation for all epochs; rlbuf and the
     tensors draw one per epoch).

   Peers: rlbuf ``RolloutBuffer(storing_device=device)`` (minibatches carry every stored field,
   15 here); rsl_rl's ``RolloutStorage("rl", ...)`` (``rsl-rl-lib``), fed ``Transition``s as its
   runner does; hand-written ``[T, N, ...]`` tensors with a backward GAE loop (one ``done``
   flag) and ``randperm`` + indexing per minibatch. rsl_rl and the tensors fold timeouts into
   ``done`` (Isaac Lab adds ``gamma * V`` to the reward at a timeout before the buffer sees it);
   rlbuf stores ``terminated``, ``truncated`` and ``bootstrap_value`` and reads the bootstrap
   at truncated steps. Targets: rlbuf <= 1.0 x rsl_rl and <= 1.2 x the tensors, for each op.

2. **Replay** on a device storage (1,000,000 transitions, observations 48 float32, actions 4
   float32, filled with random data): ``sample(4096)`` against the floor, ``randint`` plus one
   ``index_select`` per stored field on rlbuf's own storage tensors, and TorchRL's
   ``TensorDictReplayBuffer(LazyTensorStorage(device=...))``. Target: <= 1.5 x the floor.

3. **CPU storage -> CUDA batches** (CUDA only): the same replay stored on the CPU, delivered on
   the GPU (``device="cuda"``), in GB/s of rows crossing the bus, against the bandwidth of one
   ``copy_`` of as many bytes from pinned memory measured in the same run, and against a
   hand-written gather into pinned memory plus copy. Target: >= 70 % of the pinned copy for
   batches of >= 4096 x 48 floats.

Timing: every round times each peer once, in a rotating order (see ``_timing.py``); on CUDA a
round starts and stops on ``torch.cuda.synchronize()``, so it counts the kernels and copies it
launched. Tables give medians over rounds and rlbuf's time divided by each peer's (below 1:
rlbuf is faster). One torch thread unless ``--threads``.

Run from the repository root::

    PYTHONPATH=. python benchmarks/gpu.py                 # on the GPU; a few minutes
    PYTHONPATH=. python benchmarks/gpu.py --device cpu    # the rollout and replay tables on the CPU
    PYTHONPATH=. python benchmarks/gpu.py --quick         # smoke run
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import logging
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from _timing import print_table, time_interleaved
from rsl_rl.storage import RolloutStorage
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer

from rlbuf import ReplayBuffer, RolloutBuffer

T, N, OBS, PRIVILEGED, ACT = 24, 4096, 48, 187, 12
GAMMA, GAE_LAMBDA = 0.99, 0.95
N_EPOCHS, NUM_MINIBATCHES = 5, 4
REPLAY_OBS, REPLAY_ACT, SAMPLE = 48, 4, 4096


@dataclass(frozen=True)
class Step:
    """One step of all envs, on the device, as a GPU simulator and the policy hand it over."""

    obs: torch.Tensor
    privileged_obs: torch.Tensor
    action: torch.Tensor
    action_mean: torch.Tensor
    action_std: torch.Tensor
    reward: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    value: torch.Tensor
    log_prob: torch.Tensor
    bootstrap_value: torch.Tensor


def make_rollout(device: torch.device) -> list[Step]:
    """``T`` steps of random data, ~1 % terminations and ~0.1 % timeouts per env and step."""
    generator = torch.Generator(device=device).manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, device=device)

    steps = []
    for _ in range(T):
        terminated = torch.rand(N, generator=generator, device=device) < 0.01
        truncated = ~terminated & (torch.rand(N, generator=generator, device=device) < 0.001)
        steps.append(Step(randn(N, OBS), randn(N, PRIVILEGED), randn(N, ACT), randn(N, ACT), randn(N, ACT).exp(),
                          randn(N), terminated, truncated, randn(N), randn(N), randn(N)))
    return steps


# -- rollout peers ---------------------------------------------------------------------------------
class RlbufRollout:
    """rlbuf's RolloutBuffer stored on the device."""

    def __init__(self, rollout: list[Step], device: torch.device) -> None:
        self.buf = RolloutBuffer(T, N, obs_shape=(OBS,), action_shape=(ACT,), privileged_obs_shape=(PRIVILEGED,),
                                 storing_device=device, seed=0,
                                 extra_fields={"action_mean": ((ACT,), torch.float32),
                                               "action_std": ((ACT,), torch.float32)})
        self.inputs = [{"obs": s.obs, "privileged_obs": s.privileged_obs, "action": s.action, "reward": s.reward,
                        "terminated": s.terminated, "truncated": s.truncated, "value": s.value,
                        "log_prob": s.log_prob, "bootstrap_value": s.bootstrap_value, "action_mean": s.action_mean,
                        "action_std": s.action_std} for s in rollout]
        self.last_value = torch.randn(N, device=device)

    def add(self) -> None:
        if self.buf.is_full:
            self.buf.clear()
        self.buf.add(**self.inputs[self.buf.steps])

    def gae(self) -> None:
        self.buf.compute_returns_and_advantages(self.last_value, gamma=GAMMA, gae_lambda=GAE_LAMBDA,
                                                normalize_advantages=True)

    def minibatches(self) -> None:
        for _ in self.buf.minibatches(num_minibatches=NUM_MINIBATCHES, n_epochs=N_EPOCHS):
            pass


class RslRlRollout:
    """rsl_rl's RolloutStorage, fed as its on-policy runner feeds it."""

    def __init__(self, rollout: list[Step], device: torch.device) -> None:
        first = TensorDict({"policy": rollout[0].obs, "critic": rollout[0].privileged_obs}, batch_size=[N])
        self.storage = RolloutStorage("rl", N, T, first, (ACT,), device=str(device))
        self.transitions = []
        for s in rollout:
            transition = RolloutStorage.Transition()
            transition.observations = TensorDict({"policy": s.obs, "critic": s.privileged_obs}, batch_size=[N])
            transition.actions = s.action
            transition.rewards = s.reward
            transition.dones = s.terminated | s.truncated
            transition.values = s.value[:, None]  # its critic's [N, 1] output
            transition.actions_log_prob = s.log_prob
            transition.distribution_params = (s.action_mean, s.action_std)
            self.transitions.append(transition)
        self.last_values = torch.randn(N, 1, device=device)

    def add(self) -> None:
        storage = self.storage
        if storage.step == T:
            storage.clear()
        storage.add_transition(self.transitions[storage.step])

    def gae(self) -> None:
        """rsl_rl 5.5's ``PPO.compute_returns`` on this storage, with the critic's last values given."""
        st = self.storage
        advantage: torch.Tensor | float = 0.0
        for step in reversed(range(T)):
            next_values = self.last_values if step == T - 1 else st.values[step + 1]
            not_terminal = 1.0 - st.dones[step].float()
            delta = st.rewards[step] + not_terminal * GAMMA * next_values - st.values[step]
            advantage = delta + not_terminal * GAMMA * GAE_LAMBDA * advantage
            st.returns[step] = advantage + st.values[step]
        st.advantages = st.returns - st.values
        st.advantages = (st.advantages - st.advantages.mean()) / (st.advantages.std() + 1e-8)

    def minibatches(self) -> None:
        for _ in self.storage.mini_batch_generator(NUM_MINIBATCHES, N_EPOCHS):
            pass


class TensorsRollout:
    """Preallocated tensors, a backward GAE loop and indexed minibatches, written by hand."""

    def __init__(self, rollout: list[Step], device: torch.device) -> None:
        def zeros(*shape: int) -> torch.Tensor:
            return torch.zeros(T, N, *shape, device=device)

        self.obs, self.privileged_obs, self.action = zeros(OBS), zeros(PRIVILEGED), zeros(ACT)
        self.action_mean, self.action_std = zeros(ACT), zeros(ACT)
        self.reward, self.done, self.value, self.log_prob = zeros(), zeros(), zeros(), zeros()
        self.advantage, self.returns = zeros(), zeros()
        self.rollout = rollout
        self.last_value = torch.randn(N, device=device)
        self.device = device
        self.pos = 0

    def add(self) -> None:
        t, s = self.pos, self.rollout[self.pos]
        self.obs[t], self.privileged_obs[t], self.action[t] = s.obs, s.privileged_obs, s.action
        self.action_mean[t], self.action_std[t] = s.action_mean, s.action_std
        self.reward[t], self.done[t], self.value[t], self.log_prob[t] = (s.reward, s.terminated | s.truncated,
                                                                         s.value, s.log_prob)
        self.pos = (t + 1) % T

    def gae(self) -> None:
        last_gae: torch.Tensor | float = 0.0
        for t in reversed(range(T)):
            next_value = self.last_value if t == T - 1 else self.value[t + 1]
            not_done = 1.0 - self.done[t]
            delta = self.reward[t] + GAMMA * next_value * not_done - self.value[t]
            self.advantage[t] = last_gae = delta + GAMMA * GAE_LAMBDA * not_done * last_gae
        torch.add(self.advantage, self.value, out=self.returns)
        self.advantage.sub_(self.advantage.mean()).div_(self.advantage.std() + 1e-8)

    def minibatches(self) -> None:
        fields = [self.obs.view(T * N, OBS), self.privileged_obs.view(T * N, PRIVILEGED),
                  self.action.view(T * N, ACT), self.action_mean.view(T * N, ACT), self.action_std.view(T * N, ACT),
                  self.log_prob.view(-1), self.value.view(-1), self.advantage.view(-1), self.returns.view(-1)]
        size = T * N // NUM_MINIBATCHES
        for _ in range(N_EPOCHS):
            order = torch.randperm(T * N, device=self.device)
            for start in range(0, T * N, size):
                index = order[start:start + size]
                _ = [field[index] for field in fields]


RolloutPeer = RlbufRollout | RslRlRollout | TensorsRollout


# -- replay peers ----------------------------------------------------------------------------------
def transitions(rows: int, device: torch.device, generator: torch.Generator) -> TensorDict:
    obs = torch.randn(rows, REPLAY_OBS, generator=generator, device=device)
    flags = torch.rand(rows, 1, generator=generator, device=device)
    return TensorDict({"observation": obs, "action": torch.randn(rows, REPLAY_ACT, generator=generator, device=device),
                       "next": {"observation": obs.roll(1, 0), "reward": torch.randn(rows, 1, generator=generator,
                                                                                     device=device),
                                "terminated": flags < 0.01, "truncated": flags > 0.999, "done": (flags < 0.01) |
                                (flags > 0.999)}}, batch_size=[rows], device=device)


def filled_replay(capacity: int, storing_device: torch.device, device: torch.device) -> ReplayBuffer:
    buf = ReplayBuffer(capacity, obs_shape=(REPLAY_OBS,), action_shape=(REPLAY_ACT,), storing_device=storing_device,
                       device=device, seed=0)
    generator = torch.Generator(device=storing_device).manual_seed(1)
    for start in range(0, capacity, 100_000):
        buf.extend(transitions(min(100_000, capacity - start), storing_device, generator))
    return buf


def replay_peers(capacity: int, device: torch.device) -> dict[str, Callable[[], object]]:
    buf = filled_replay(capacity, device, device)
    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(capacity, device=device), batch_size=SAMPLE)
    generator = torch.Generator(device=device).manual_seed(1)
    for start in range(0, capacity, 100_000):
        rb.extend(transitions(min(100_000, capacity - start), device, generator))
    leaves = list(buf.state_dict()["fields"].values())  # copies of rlbuf's stored fields, on its device
    floor_generator = torch.Generator(device=device).manual_seed(2)

    def floor() -> list[torch.Tensor]:
        index = torch.randint(0, capacity, (SAMPLE,), generator=floor_generator, device=device)
        return [leaf.index_select(0, index) for leaf in leaves]

    return {"rlbuf": lambda: buf.sample(SAMPLE), "floor": floor, "torchrl": rb.sample}


# -- CPU storage to CUDA ---------------------------------------------------------------------------
def transfer_table(capacity: int, sizes: list[int], repeats: int) -> list[tuple[int, float, float, float]]:
    """(batch size, rlbuf GB/s, hand-written gather + copy GB/s, pinned copy GB/s) for each size."""
    cuda = torch.device("cuda")
    buf = filled_replay(capacity, torch.device("cpu"), cuda)
    leaves = list(buf.state_dict()["fields"].values())
    generator = torch.Generator().manual_seed(2)
    rows = []
    for size in sizes:
        # The bytes that cross the bus: the stored fields and the index (the weights of a uniform
        # sample are made on the GPU).
        moved = size * (sum(leaf[0].numel() * leaf.element_size() for leaf in leaves) + 8)
        pinned = torch.empty(moved, dtype=torch.uint8, pin_memory=True)
        target = torch.empty(moved, dtype=torch.uint8, device=cuda)

        def by_hand(size: int = size) -> list[torch.Tensor]:
            index = torch.randint(0, capacity, (size,), generator=generator)
            out = []
            for leaf in leaves:
                rows_ = torch.empty((size, *leaf.shape[1:]), dtype=leaf.dtype, pin_memory=True)
                torch.index_select(leaf, 0, index, out=rows_)
                out.append(rows_.to(cuda, non_blocking=True))
            out.append(index.pin_memory().to(cuda, non_blocking=True))
            return out

        seconds = time_interleaved({"rlbuf": lambda size=size: buf.sample(size), "by hand": by_hand,
                                    "pinned copy": lambda target=target, pinned=pinned: target.copy_(
                                        pinned, non_blocking=True)},
                                   repeats=repeats, number=10, sync=torch.cuda.synchronize)
        rows.append((size, moved / seconds["rlbuf"] / 1e9, moved / seconds["by hand"] / 1e9,
                     moved / seconds["pinned copy"] / 1e9))
    return rows


# -- running ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Plan:
    """Rounds and calls per round of each table, and the replay capacity."""

    repeats: int
    minibatch_repeats: int
    add_number: int
    gae_number: int
    replay_capacity: int


def plan(quick: bool) -> Plan:
    if quick:
        return Plan(repeats=3, minibatch_repeats=3, add_number=T, gae_number=2, replay_capacity=200_000)
    return Plan(repeats=31, minibatch_repeats=15, add_number=T, gae_number=10, replay_capacity=1_000_000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="where the rollouts and replay live: cuda (default when present) or cpu")
    parser.add_argument("--quick", action="store_true", help="a few rounds and a smaller replay: a smoke run")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: CUDA is not available here; use --device cpu")
    logging.getLogger("torchrl").setLevel(logging.WARNING)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    sync: Callable[[], object] = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    bench = plan(args.quick)
    versions = ", ".join(f"{name} {importlib.metadata.version(name)}"
                         for name in ("torch", "torchrl", "tensordict", "rsl-rl-lib"))
    machine = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "CPU"
    print(f"rlbuf GPU benchmark{' (--quick)' if args.quick else ''} on {device} ({machine}); {versions}; "
          f"{args.threads} torch thread(s)")
    print("'X ÷' columns: X's time divided by the row's (< 1: X is faster); medians of interleaved rounds")
    started = time.perf_counter()
    results: dict[str, dict[str, float]] = {}

    rollout = make_rollout(device)
    peers: dict[str, RolloutPeer] = {"rlbuf": RlbufRollout(rollout, device), "rsl_rl": RslRlRollout(rollout, device),
                                     "tensors": TensorsRollout(rollout, device)}
    print(f"\nRollout: T={T}, N={N}, obs ({OBS},) + privileged ({PRIVILEGED},), actions ({ACT},), on {device}")
    for title, op, number, repeats in (("add", "add", bench.add_number, bench.repeats),
                                       ("GAE", "gae", bench.gae_number, bench.repeats),
                                       ("minibatches 5 x 4", "minibatches", 1, bench.minibatch_repeats)):
        if op != "add":
            for peer in peers.values():  # the add rounds left a full rollout; advantages for minibatches
                peer.gae()
        results[title] = time_interleaved({name: getattr(peer, op) for name, peer in peers.items()},
                                          repeats=repeats, number=number, sync=sync)
        print_table(title, results[title], ["rlbuf"])
    del peers, rollout
    gc.collect()

    print(f"\nReplay: {bench.replay_capacity:,} transitions on {device}, obs ({REPLAY_OBS},), "
          f"actions ({REPLAY_ACT},); sample({SAMPLE})")
    results["sample"] = time_interleaved(replay_peers(bench.replay_capacity, device), repeats=bench.repeats,
                                         number=10, sync=sync)
    print_table(f"sample {SAMPLE}", results["sample"], ["rlbuf"])
    gc.collect()

    transfer: list[tuple[int, float, float, float]] = []
    if torch.cuda.is_available() and device.type == "cuda":
        print(f"\nCPU storage -> CUDA batches: {bench.replay_capacity:,} transitions on the CPU, device='cuda'")
        transfer = transfer_table(bench.replay_capacity, [4096, 16384, 65536], bench.repeats)
        print(f"{'batch':>7}  {'rlbuf GB/s':>10}  {'by hand GB/s':>12}  {'pinned copy GB/s':>16}  {'rlbuf ÷ copy':>12}")
        for size, ours, by_hand, copy in transfer:
            print(f"{size:>7}  {ours:>10.2f}  {by_hand:>12.2f}  {copy:>16.2f}  {ours / copy:>12.2f}")
    else:
        print("\nCPU storage -> CUDA batches: skipped (needs CUDA)")
    print_targets(results, transfer)
    print(f"\ntotal {time.perf_counter() - started:.0f} s")


def print_targets(results: dict[str, dict[str, float]], transfer: list[tuple[int, float, float, float]]) -> None:
    print("\ntargets")
    checks: list[tuple[str, float, float, str]] = []
    for title in ("add", "GAE", "minibatches 5 x 4"):
        table = results[title]
        checks.append((f"rollout {title} ÷ rsl_rl", table["rlbuf"] / table["rsl_rl"], 1.0, "≤"))
        checks.append((f"rollout {title} ÷ tensors", table["rlbuf"] / table["tensors"], 1.2, "≤"))
    checks.append((f"replay sample {SAMPLE} ÷ floor", results["sample"]["rlbuf"] / results["sample"]["floor"], 1.5, "≤"))
    for size, ours, _, copy in transfer:
        checks.append((f"CPU -> CUDA batch {size} ÷ pinned copy", ours / copy, 0.7, "≥"))
    for what, ratio, target, sense in checks:
        met = ratio <= target if sense == "≤" else ratio >= target
        print(f"  {'PASS' if met else 'MISS'}  {what:<36} {ratio:6.2f} ({sense} {target})")


if __name__ == "__main__":
    main()
