"""Demo training runs (CartPole-v1, Pendulum-v1, bit flipping), one module per algorithm, run by ``rlbuf demo <name>`` (module: the name with ``_`` for ``-``).

- ``rlbuf.demos.ppo``: PPO with a TorchRL collector, the RolloutBuffer, GAE and EpisodeStats.
- ``rlbuf.demos.dqn``: double DQN with a target network and the ReplayBuffer (``--prioritized``).
- ``rlbuf.demos.ppo_continuous``: PPO on Pendulum-v1 through a gymnasium vector env and the Recorder.
- ``rlbuf.demos.distill``: DAgger from a PPO teacher to a smaller student via the DistillationBuffer.
- ``rlbuf.demos.her``: DQN with hindsight relabelling on a bit-flipping goal env (``rlbuf.demos.bitflip``).
- ``rlbuf.demos.apex``: Ape-X-shaped DQN: actor processes on Ray, one learner, a rate-limited replay service.

Each module has an ``Args`` dataclass (its options, defined in ``rlbuf.demos._options`` so that
``--help`` needs no torch) and ``run(args)``. What they share:
``rlbuf.demos._run`` (output folder, seeding, Ctrl-C), ``rlbuf.demos._progress``
(progress bar, curve, summary) and ``rlbuf.demos._checkpoint`` (checkpoints and resume).

Example:
    >>> sorted(DEMOS)
    ['apex', 'distill', 'dqn', 'her', 'ppo', 'ppo-continuous']
"""

DEMOS = {
    "ppo": "PPO on CartPole-v1: TorchRL collector + RolloutBuffer + GAE transform + EpisodeStats",
    "dqn": "double DQN on CartPole-v1 with a target network and the ReplayBuffer (--prioritized: PER)",
    "ppo-continuous": "PPO on Pendulum-v1, CleanRL-style: gymnasium vector env + Recorder + RolloutBuffer + GAE "
                      "(--fold-truncation: the timeout-as-death baseline)",
    "distill": "DAgger on CartPole-v1: a PPO teacher labels a smaller student's states in a DistillationBuffer",
    "her": "DQN on 15-bit flipping, a sparse-reward goal env: Recorder + ReplayBuffer(hindsight=Hindsight(...)) "
           "(--no-hindsight: the baseline that learns nothing)",
    "apex": "Ape-X-shaped DQN on CartPole-v1: actor processes with their own epsilon, one learner, a rate-limited "
            "ReplayService on Ray, a checkpoint while actors write and an exact-resume check (needs rlbuf[ray])",
}
"""Demo name -> one line of what it does."""
