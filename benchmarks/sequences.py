"""How fast are rlbuf's sequences: recurrent PPO minibatches next to rsl_rl, replay sequences next to TorchRL?

1. **Recurrent PPO minibatches.** One rollout of ``T=24`` steps from ``N`` envs (an Isaac Lab
   setting), observations ``{"policy": (48,), "critic": (60,)}``, actions ``(12,)``, an LSTM
   state ``h, c`` of ``(1, 128)`` per env, episodes ending with probability 2 % per step. One
   training phase of 5 epochs × 4 minibatches, iterated fully:

   * ``rlbuf``: ``RolloutBuffer.minibatches(num_minibatches=4, n_epochs=5, sequences=True)``:
     trajectories shuffled across envs, *every* field padded ``[L, B]``, initial states;
   * ``rsl_rl``: ``RolloutStorage.recurrent_mini_batch_generator(4, 5)`` of rsl-rl-lib: only
     observations padded (the other fields stay ``[T, envs]``), minibatches by env block,
     no shuffling. rsl_rl does less work per minibatch; the ratio says what rlbuf's extra
     work (every field padded, shuffled trajectories) costs or saves.

2. **Replay sequences.** A replay ring of ``capacity`` transitions from 16 envs
   (observation ``(32,)``), episodes ending with probability 1 % per step; batches of 64
   sequences of 32 steps:

   * ``rlbuf``: ``ReplayBuffer.sample_sequences(64, 32)`` over its interleaved ring;
   * ``torchrl-cached``: TorchRL's ``SliceSampler(slice_len=32, cache_values=True)`` on a
     ``TensorDictReplayBuffer`` holding the same transitions with each env's steps
     contiguous (what ``SliceSampler`` needs), trajectory ends from ``("next", "done")``,
     its boundaries cached (a static dataset: its best case);
   * ``+ add`` rows: one add of a step of all 16 envs, then one sample — the off-policy
     loop, in which TorchRL's cache is invalidated by every write.

   ``SliceSampler`` never crosses an episode and drops episodes shorter than a slice
   (``strict_length``); rlbuf draws any start and masks steps after an episode end.

Each table gives the median time per call over rounds in which every peer runs in turn (see
``_timing.py``) and rlbuf's time divided by each peer's: below 1 means rlbuf is faster. The
machine these figures come from is small and shared: the numbers are noisy; compare ratios.

Run from the repository root::

    PYTHONPATH=. python benchmarks/sequences.py           # about a minute on 2 cores
    PYTHONPATH=. python benchmarks/sequences.py --quick   # smoke run, a few seconds
"""

from __future__ import annotations

import argparse
import logging
from typing import Any

import torch
from _timing import print_table, time_interleaved
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl.data.replay_buffers.samplers import SliceSampler

from rlbuf import ReplayBuffer, RolloutBuffer

T, OBS, CRITIC, ACTION, HIDDEN = 24, 48, 60, 12, 128


def recurrent_minibatches(num_envs: int, repeats: int) -> None:
    from rsl_rl.storage.rollout_storage import RolloutStorage

    g = torch.Generator().manual_seed(0)
    done = torch.rand(T, num_envs, generator=g) < 0.02
    data = {"policy": torch.randn(T, num_envs, OBS, generator=g), "critic": torch.randn(T, num_envs, CRITIC, generator=g),
            "action": torch.randn(T, num_envs, ACTION, generator=g), "h": torch.randn(T, 1, num_envs, HIDDEN, generator=g),
            "c": torch.randn(T, 1, num_envs, HIDDEN, generator=g)}

    mine = RolloutBuffer(T, num_envs, obs_shape={"policy": (OBS,), "critic": (CRITIC,)}, action_shape=(ACTION,),
                         hidden_state_shape={"h": (1, HIDDEN), "c": (1, HIDDEN)}, seed=0)
    first = TensorDict({"policy": data["policy"][0], "critic": data["critic"][0]}, batch_size=[num_envs])
    theirs = RolloutStorage("rl", num_envs, T, first, (ACTION,))
    for t in range(T):
        obs = {"policy": data["policy"][t], "critic": data["critic"][t]}
        mine.add(obs, data["action"][t], torch.ones(num_envs), done[t], torch.zeros(num_envs), torch.zeros(num_envs),
                 hidden_state={"h": data["h"][t].transpose(0, 1), "c": data["c"][t].transpose(0, 1)}, truncated=False)
        step = RolloutStorage.Transition()
        step.observations = TensorDict(obs, batch_size=[num_envs])
        step.actions, step.rewards, step.dones = data["action"][t], torch.ones(num_envs), done[t].to(torch.uint8)
        step.values, step.actions_log_prob = torch.zeros(num_envs, 1), torch.zeros(num_envs)
        step.distribution_params = (data["action"][t], data["action"][t])
        step.hidden_states = ((data["h"][t], data["c"][t]), None)
        theirs.add_transition(step)
    mine.compute_returns_and_advantages(torch.zeros(num_envs))

    def rlbuf_phase() -> None:
        for batch in mine.minibatches(num_minibatches=4, n_epochs=5, sequences=True):
            batch.obs["policy"].sum()

    def rsl_rl_phase() -> None:
        for batch in theirs.recurrent_mini_batch_generator(4, 5):
            batch.observations["policy"].sum()

    medians = time_interleaved({"rlbuf": rlbuf_phase, "rsl_rl": rsl_rl_phase}, repeats=repeats, number=1)
    print_table(f"recurrent PPO: one phase of 5 epochs x 4 sequence minibatches, T={T}, N={num_envs}", medians,
                ["rlbuf"])


def replay_sequences(capacity: int, repeats: int, number: int) -> None:
    num_envs, length, batch = 16, 32, 64
    steps = capacity // num_envs
    g = torch.Generator().manual_seed(0)
    obs = torch.randn(steps, num_envs, 32, generator=g)
    done = torch.rand(steps, num_envs, generator=g) < 0.01

    mine = ReplayBuffer(capacity, obs_shape=(32,), action_shape=(), num_envs=num_envs, seed=0)
    for t in range(steps):
        mine.add(obs[t], torch.zeros(num_envs), torch.zeros(num_envs), obs[t], done[t], truncated=False)

    def torchrl_buffer(cache: bool) -> TensorDictReplayBuffer:
        env_major = {"observation": obs.transpose(0, 1).reshape(-1, 32), "action": torch.zeros(capacity),
                     "next": {"observation": obs.transpose(0, 1).reshape(-1, 32), "reward": torch.zeros(capacity, 1),
                              "done": done.T.reshape(-1, 1), "terminated": done.T.reshape(-1, 1),
                              "truncated": torch.zeros(capacity, 1, dtype=torch.bool)}}
        # Each env's stream is contiguous; its last row ends a trajectory so envs never join.
        env_major["next"]["done"].view(num_envs, steps)[:, -1] = True
        rb = TensorDictReplayBuffer(storage=LazyTensorStorage(capacity + num_envs),
                                    sampler=SliceSampler(slice_len=length, end_key=("next", "done"),
                                                         cache_values=cache, strict_length=False),
                                    batch_size=batch * length)
        rb.extend(TensorDict(env_major, batch_size=[capacity]))
        return rb

    cached, uncached = torchrl_buffer(True), torchrl_buffer(False)
    step = TensorDict({"observation": obs[0], "action": torch.zeros(num_envs),
                       "next": {"observation": obs[0], "reward": torch.zeros(num_envs, 1),
                                "done": torch.zeros(num_envs, 1, dtype=torch.bool),
                                "terminated": torch.zeros(num_envs, 1, dtype=torch.bool),
                                "truncated": torch.zeros(num_envs, 1, dtype=torch.bool)}}, batch_size=[num_envs])

    def rlbuf_add_and_sample() -> None:
        mine.add(obs[0], torch.zeros(num_envs), torch.zeros(num_envs), obs[0], done[0], truncated=False)
        mine.sample_sequences(batch, length)

    def torchrl_add_and_sample() -> None:
        uncached.extend(step)
        uncached.sample()

    sample_only: dict[str, Any] = {"rlbuf": lambda: mine.sample_sequences(batch, length),
                                   "torchrl-cached": lambda: cached.sample()}
    print_table(f"replay sequences: sample {batch} x {length} steps, capacity {capacity}, 16 envs",
                time_interleaved(sample_only, repeats=repeats, number=number), ["rlbuf"])
    loop = {"rlbuf": rlbuf_add_and_sample, "torchrl": torchrl_add_and_sample}
    print_table(f"replay sequences: add one step of 16 envs, then sample {batch} x {length}",
                time_interleaved(loop, repeats=repeats, number=max(1, number // 10)), ["rlbuf"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="small sizes and few rounds (a smoke run)")
    options = parser.parse_args()
    torch.set_num_threads(1)
    logging.getLogger("torchrl").setLevel(logging.WARNING)
    if options.quick:
        recurrent_minibatches(num_envs=256, repeats=3)
        replay_sequences(capacity=16_000, repeats=3, number=5)
    else:
        recurrent_minibatches(num_envs=4096, repeats=9)
        replay_sequences(capacity=1_000_000, repeats=9, number=20)
    print("\nNoisy shared 2-core machine: compare ratios, not absolute times.")


if __name__ == "__main__":
    main()
