"""How fast is rlbuf's GAE against the GAE loops people use today?

Two shapes: ``[T=24, N=4096]`` (many envs, short rollouts; step-wise ``[T, N]`` layout) where the
target is <= 0.5x Stable-Baselines3's ``RolloutBuffer.compute_returns_and_advantage``, and
``[T=2048, N=8]`` (few envs, long rollouts; TorchRL's ``[N, T]`` layout) where the target is
<= 0.5x TorchRL's ``vec_generalized_advantage_estimate``. Float32 and float64.

Peers get their inputs in their own layout, prepared outside the timed region (TorchRL also gets
its next values precomputed, which its API requires). SB3 and the ApexRL-style loop fold timeouts
into ``done`` (they bootstrap at collection time instead), so they do slightly less work than
rlbuf, which reads ``bootstrap_value`` at truncated steps. One thread, one process, medians of
interleaved repeats. rlbuf is timed returning fresh tensors and writing into preallocated ones
(``out=``, what ``RolloutBuffer`` does): fresh tensors of this size are new pages from the OS
whenever the allocator has given the last ones back, which large-allocating peers in the same
rounds (TorchRL's ``vec_gae``) make frequent.

Run: ``PYTHONPATH=. python benchmarks/gae.py``
"""

from __future__ import annotations

import time
from collections.abc import Callable

import gymnasium as gym
import numpy as np
import torch
from _timing import time_interleaved
from stable_baselines3.common.buffers import RolloutBuffer
from torchrl.objectives.value.functional import (
    generalized_advantage_estimate,
    vec_generalized_advantage_estimate,
)

from rlbuf import gae as rlbuf_gae

GAMMA, LAMBDA = 0.99, 0.95


def make_rollout(num_steps: int, num_envs: int, dtype: torch.dtype, seed: int = 0) -> dict[str, torch.Tensor]:
    """A ``[T, N]`` rollout with ~1% terminations and ~0.2% timeouts per step."""
    gen = torch.Generator().manual_seed(seed)
    terminated = torch.rand(num_steps, num_envs, generator=gen) < 0.01
    truncated = (torch.rand(num_steps, num_envs, generator=gen) < 0.002) & ~terminated
    return {
        "reward": torch.randn(num_steps, num_envs, generator=gen, dtype=dtype),
        "value": torch.randn(num_steps, num_envs, generator=gen, dtype=dtype),
        "terminated": terminated,
        "truncated": truncated,
        "last_value": torch.randn(num_envs, generator=gen, dtype=dtype),
        "bootstrap_value": torch.randn(num_steps, num_envs, generator=gen, dtype=dtype),
    }


def next_values(ro: dict[str, torch.Tensor]) -> torch.Tensor:
    nxt = torch.cat([ro["value"][1:], ro["last_value"][None]])
    return torch.where(ro["truncated"], ro["bootstrap_value"], nxt)


def sb3_peer(ro: dict[str, torch.Tensor]) -> Callable[[], object]:
    num_steps, num_envs = ro["reward"].shape
    np_dtype = np.float32 if ro["reward"].dtype == torch.float32 else np.float64
    box = gym.spaces.Box(-1.0, 1.0, (1,))
    buf = RolloutBuffer(num_steps, box, box, device="cpu", gae_lambda=LAMBDA, gamma=GAMMA, n_envs=num_envs)
    done = (ro["terminated"] | ro["truncated"]).numpy()
    buf.rewards = ro["reward"].numpy().astype(np_dtype)
    buf.values = ro["value"].numpy().astype(np_dtype)
    buf.episode_starts = np.zeros((num_steps, num_envs), dtype=np_dtype)
    buf.episode_starts[1:] = done[:-1]
    buf.advantages = np.zeros((num_steps, num_envs), dtype=np_dtype)
    last_values, last_dones = ro["last_value"].clone(), done[-1].copy()
    return lambda: buf.compute_returns_and_advantage(last_values, last_dones)


def apexrl_peer(ro: dict[str, torch.Tensor]) -> Callable[[], object]:
    rewards, values, last_values = ro["reward"], ro["value"], ro["last_value"]
    dones = ro["terminated"] | ro["truncated"]
    returns = torch.empty_like(values)

    def run() -> torch.Tensor:
        advantage: torch.Tensor | float = 0.0
        num_steps = rewards.shape[0]
        for step in reversed(range(num_steps)):
            next_v = last_values if step == num_steps - 1 else values[step + 1]
            not_terminal = 1.0 - dones[step].to(values.dtype)
            delta = rewards[step] + not_terminal * GAMMA * next_v - values[step]
            advantage = delta + not_terminal * GAMMA * LAMBDA * advantage
            returns[step] = advantage + values[step]
        return returns - values

    return run


def torchrl_peer(ro: dict[str, torch.Tensor], fn: Callable[..., object]) -> Callable[[], object]:
    # TorchRL's own layout: [N, T, 1], time at -2.
    def prep(x: torch.Tensor) -> torch.Tensor:
        return x.t().contiguous().unsqueeze(-1)

    value, nxt, reward = prep(ro["value"]), prep(next_values(ro)), prep(ro["reward"])
    done, terminated = prep(ro["terminated"] | ro["truncated"]), prep(ro["terminated"])
    return lambda: fn(GAMMA, LAMBDA, value, nxt, reward, done, terminated)


def rlbuf_peer(ro: dict[str, torch.Tensor], time_dim: int, backend: rlbuf_gae.Backend,
               into: bool = False) -> Callable[[], object]:
    names = ("reward", "value", "terminated", "truncated", "bootstrap_value")
    tensors = {k: ro[k] if time_dim == 0 else ro[k].t().contiguous() for k in names}
    # into=True: write into preallocated tensors (out=), as RolloutBuffer does with its columns.
    out = (torch.empty_like(tensors["reward"]), torch.empty_like(tensors["reward"])) if into else None

    def run() -> tuple[torch.Tensor, torch.Tensor]:
        return rlbuf_gae.compute_gae(
            tensors["reward"],
            tensors["value"],
            tensors["terminated"],
            tensors["truncated"],
            ro["last_value"],
            gamma=GAMMA,
            gae_lambda=LAMBDA,
            bootstrap_value=tensors["bootstrap_value"],
            time_dim=time_dim,
            backend=backend,
            out=out,
        )

    return run


def check(ro: dict[str, torch.Tensor], peers: dict[str, Callable[[], object]]) -> None:
    """rlbuf's answers agree with TorchRL's (same next values) before anything is timed."""
    adv_ref, _ = vec_generalized_advantage_estimate(
        GAMMA, LAMBDA, ro["value"].double(), next_values(ro).double(), ro["reward"].double(),
        ro["terminated"] | ro["truncated"], ro["terminated"], time_dim=0,
    )
    for name, run in peers.items():
        if name.startswith("rlbuf"):
            out = run()
            assert isinstance(out, tuple)
            adv = out[0] if "[T, N]" in name else out[0].t()
            torch.testing.assert_close(adv.double(), adv_ref, rtol=1e-5, atol=1e-5)


def main() -> None:
    torch.set_num_threads(1)
    start = time.perf_counter()
    rlbuf_peer(make_rollout(2, 2, torch.float32), 0, "numba")()
    first_ms = (time.perf_counter() - start) * 1e3
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}; "
          f"first numba call (import, compile or cache load) {first_ms:.0f} ms")
    cases = [
        # (shape name, T, N, rounds, baseline peer)
        ("T=24 N=4096", 24, 4096, 300, "SB3 RolloutBuffer"),
        ("T=2048 N=8", 2048, 8, 15, "torchrl vec_gae"),
    ]
    header = f"{'shape':12} {'dtype':8} {'peer':26} {'median':>10} {'vs SB3':>8} {'vs vec_gae':>10}"
    print(header)
    print("-" * len(header))
    for shape, num_steps, num_envs, rounds, _baseline in cases:
        for dtype in (torch.float32, torch.float64):
            ro = make_rollout(num_steps, num_envs, dtype)
            peers: dict[str, Callable[[], object]] = {
                "SB3 RolloutBuffer": sb3_peer(ro),
                "torchrl gae (loop)": torchrl_peer(ro, generalized_advantage_estimate),
                "torchrl vec_gae": torchrl_peer(ro, vec_generalized_advantage_estimate),
                "ApexRL-style loop": apexrl_peer(ro),
                "rlbuf [T, N]": rlbuf_peer(ro, 0, "auto"),
                "rlbuf [N, T]": rlbuf_peer(ro, 1, "auto"),
                "rlbuf [T, N] out=": rlbuf_peer(ro, 0, "auto", into=True),
                "rlbuf [N, T] out=": rlbuf_peer(ro, 1, "auto", into=True),
                "rlbuf [T, N] torch path": rlbuf_peer(ro, 0, "torch"),
                "rlbuf [N, T] torch path": rlbuf_peer(ro, 1, "torch"),
            }
            check(ro, peers)
            medians = time_interleaved(peers, repeats=rounds, number=1)
            sb3, vec = medians["SB3 RolloutBuffer"], medians["torchrl vec_gae"]
            for name, med in medians.items():
                dname = str(dtype).removeprefix("torch.")
                print(f"{shape:12} {dname:8} {name:26} {med * 1e3:8.3f}ms {med / sb3:7.2f}x {med / vec:9.3f}x")
    print("\ntargets: T=24 N=4096 rlbuf <= 0.5x SB3; T=2048 N=8 rlbuf <= 0.5x torchrl vec_gae")


if __name__ == "__main__":
    main()
