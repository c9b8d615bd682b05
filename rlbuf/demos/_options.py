"""Every demo's options, importable without torch: ``rlbuf demo NAME --help`` builds its parser from them.

Each demo module (``rlbuf.demos.ppo`` …) uses its class here as its ``Args``; the training code,
and with it torch and TorchRL, is imported only when a demo runs.

Example:
    >>> ARGS["dqn"]().batch_size, ARGS["ppo"](recurrent=True).num_steps
    (128, 32)
"""

import argparse
import typing
from dataclasses import dataclass, field, fields
from typing import Any, Literal

WINDOW = 20
"""Episodes averaged for the reported return (the issue's "last 20 episodes")."""


def arg(default: Any, help: str) -> Any:
    """A dataclass field that is also a command-line option with this help text.

    Example:
        >>> from dataclasses import dataclass
        >>> @dataclass
        ... class Options:
        ...     lr: float = arg(1e-3, "learning rate")
        >>> Options().lr
        0.001
    """
    return field(default=default, metadata={"help": help})


@dataclass
class RunArgs:
    """Options every demo takes (each demo adds its hyper-parameters in a subclass)."""

    frames: int = arg(100_000, "environment frames to train for at most")
    seed: int = arg(1, "seed of torch, numpy, python, the envs and the buffer")
    device: str = arg("cpu", "training device (e.g. cuda); envs and collection stay on the CPU")
    storage: Literal["memory", "memmap"] = arg("memory", "where the buffer keeps its data: in memory, or in memory-mapped files")
    out: str | None = arg(None, "output folder (default: runs/<demo>-seed<seed>-<time>)")
    checkpoint_every: int = arg(25_000, "write a checkpoint every this many frames (0: only at the end)")
    resume: str | None = arg(None, "continue the run in this output folder from its newest checkpoint (a Ctrl-C "
                                   "writes one); exactly as if never stopped when that checkpoint is a scheduled "
                                   "one (--checkpoint-every), else with envs reset at that frame")
    stop_after_frames: int | None = arg(None, "debug: stop right after the first checkpoint at or past this "
                                              "many frames, as if killed there (then --resume)")
    target_return: float = arg(475.0, f"report when the mean return of the last {WINDOW} episodes reaches this")
    stop_at_target: bool = arg(True, "stop training once the target return is reached")
    progress: bool | None = arg(None, "progress on stderr (default: a bar on a terminal, else a line every tenth "
                                      "of --frames; --progress: always a bar; --no-progress: nothing)")


def add_arguments(parser: argparse.ArgumentParser, args_type: type[RunArgs]) -> None:
    """Add one ``--option`` per field of ``args_type``; only options given on the line are parsed.

    Example:
        >>> parser = argparse.ArgumentParser()
        >>> add_arguments(parser, RunArgs)
        >>> vars(parser.parse_args(["--seed", "3", "--no-progress"]))
        {'seed': 3, 'progress': False}
    """
    for item in fields(args_type):  # real types, not strings: this module does not postpone annotations
        flag = "--" + item.name.replace("_", "-")
        hint: Any = item.type
        if typing.get_origin(hint) is not typing.Literal:  # `int | None` -> int
            hint = next((t for t in typing.get_args(hint) if t is not type(None)), hint)
        help_text = item.metadata["help"] + ("" if item.default is None else f" (default: {item.default})")
        if hint is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS,
                                help=help_text)
        elif typing.get_origin(hint) is typing.Literal:
            parser.add_argument(flag, choices=typing.get_args(hint), default=argparse.SUPPRESS, help=help_text)
        else:
            parser.add_argument(flag, type=hint, default=argparse.SUPPRESS, metavar=item.name.upper(), help=help_text)


# -- the demos' own options ------------------------------------------------------------------------
MLP_DEFAULTS = {"num_steps": 64, "num_minibatches": 4, "epochs": 10, "gamma": 0.99, "gae_lambda": 0.95}
RECURRENT_DEFAULTS = {"num_steps": 32, "num_minibatches": 1, "epochs": 4, "gamma": 0.999, "gae_lambda": 0.98}
"""``--recurrent``'s defaults for the options ``MLP_DEFAULTS`` lists (the fields' defaults)."""


@dataclass
class PPOArgs(RunArgs):
    """PPO options; the defaults reach a mean return of 475 in 25k to 40k frames."""

    frames: int = arg(300_000, "environment frames to train for at most")
    checkpoint_every: int = arg(50_000, "write a checkpoint every this many frames (0: only at the end)")
    num_envs: int = arg(8, "CartPole envs stepped together")
    num_steps: int = arg(64, "steps per env in each rollout")
    epochs: int = arg(10, "passes over each rollout")
    num_minibatches: int = arg(4, "minibatches per pass")
    lr: float = arg(1e-3, "Adam learning rate, annealed linearly to 0 over --frames")
    gamma: float = arg(0.99, "discount")
    gae_lambda: float = arg(0.95, "GAE lambda")
    clip: float = arg(0.2, "PPO clip range")
    ent_coef: float = arg(0.0, "entropy bonus coefficient")
    vf_coef: float = arg(0.5, "value loss coefficient")
    max_grad_norm: float = arg(0.5, "gradient norm clip")
    hidden: int = arg(64, "hidden units of the actor's and critic's two layers (the LSTM's with --recurrent)")
    recurrent: bool = arg(False, "an LSTM policy on CartPole without velocities, trained on sequence minibatches "
                                 "(rlbuf.demos.ppo_recurrent)")
    hide_velocities: bool = arg(False, "observe only cart position and pole angle (the MLP then falls short of 475)")

    def __post_init__(self) -> None:
        # The LSTM learns best with shorter rollouts, fewer updates and a longer horizon (as in
        # rl-baselines3-zoo's RecurrentPPO on CartPoleNoVel): options left at the MLP's defaults
        # take the recurrent ones.
        if self.recurrent:
            for name, value in RECURRENT_DEFAULTS.items():
                if getattr(self, name) == MLP_DEFAULTS[name]:
                    setattr(self, name, value)


@dataclass
class DQNArgs(RunArgs):
    """DQN options; the defaults reach a mean return of 475 in 50k to 100k frames."""

    frames: int = arg(200_000, "environment frames to train for at most")
    checkpoint_every: int = arg(25_000, "write a checkpoint every this many frames (0: only at the end)")
    num_envs: int = arg(4, "CartPole envs stepped together")
    prioritized: bool = arg(False, "prioritized experience replay")
    alpha: float = arg(0.6, "PER priority exponent")
    beta: float = arg(0.4, "PER importance-sampling exponent")
    buffer_size: int = arg(100_000, "replay capacity (transitions)")
    batch_size: int = arg(128, "transitions per gradient step")
    lr: float = arg(5e-4, "Adam learning rate")
    gamma: float = arg(0.99, "discount")
    learning_starts: int = arg(2_000, "frames collected before the first update")
    train_every: int = arg(4, "frames between training phases")
    gradient_steps: int = arg(1, "gradient steps per training phase")
    target_every: int = arg(4, "frames between updates of the target network")
    tau: float = arg(0.01, "target update: target += tau * (online - target); 1 copies the online network")
    exploration_frames: int = arg(10_000, "frames over which ε decays linearly from 1")
    final_epsilon: float = arg(0.01, "ε after the decay")
    hidden: int = arg(128, "hidden units of the Q-network's two layers")


@dataclass
class PPOContinuousArgs(RunArgs):
    """PPO options (CleanRL's ``ppo_continuous_action.py`` defaults, 8 envs of 256 steps)."""

    frames: int = arg(200_000, "environment frames to train for")
    checkpoint_every: int = arg(50_000, "write a checkpoint every this many frames (0: only at the end)")
    target_return: float = arg(-250.0, "report when the mean return of the last 20 episodes reaches this")
    stop_at_target: bool = arg(False, "stop training once the target return is reached")
    fold_truncation: bool = arg(False, "the baseline: treat a time limit as a death (CleanRL's folded done)")
    num_envs: int = arg(8, "Pendulum envs stepped together")
    num_steps: int = arg(256, "steps per env in each rollout")
    epochs: int = arg(10, "passes over each rollout")
    num_minibatches: int = arg(32, "minibatches per pass")
    lr: float = arg(3e-4, "Adam learning rate, annealed linearly to 0 over --frames")
    gamma: float = arg(0.99, "discount")
    gae_lambda: float = arg(0.95, "GAE lambda")
    clip: float = arg(0.2, "PPO clip range (policy and value)")
    ent_coef: float = arg(0.0, "entropy bonus coefficient")
    vf_coef: float = arg(0.5, "value loss coefficient")
    max_grad_norm: float = arg(0.5, "gradient norm clip")
    target_kl: float | None = arg(None, "stop an update's epochs early past this approximate KL")
    hidden: int = arg(64, "hidden units of the actor's and critic's two layers")


@dataclass
class DistillArgs(RunArgs):
    """Distillation options; the student is a tenth of the teacher's size."""

    frames: int = arg(50_000, "student frames (DAgger rounds) at most")
    checkpoint_every: int = arg(10_000, "write a checkpoint every this many frames (0: only at the end)")
    teacher: str | None = arg(None, "output folder of `rlbuf demo ppo` holding the teacher's model.pt "
                                    "(default: train a teacher into OUT/teacher)")
    teacher_frames: int = arg(300_000, "frames for training the teacher, when none is given")
    num_envs: int = arg(8, "CartPole envs the student runs in")
    num_steps: int = arg(64, "steps per env in each DAgger round")
    buffer_size: int = arg(100_000, "distillation buffer capacity (rows)")
    batch_size: int = arg(256, "rows per gradient step")
    gradient_steps: int = arg(32, "student updates per round")
    lr: float = arg(3e-3, "student Adam learning rate")
    hidden: int = arg(16, "hidden units of the student's two layers (the teacher's come from its run)")
    eval_episodes: int = arg(20, "episodes of the final greedy evaluation of teacher and student")


@dataclass
class HERArgs(RunArgs):
    """DQN on bit flipping; the defaults reach a success rate of 0.9 with hindsight and stay near 0 without."""

    frames: int = arg(50_000, "environment frames to train for")
    checkpoint_every: int = arg(25_000, "write a checkpoint every this many frames (0: only at the end)")
    target_return: float = arg(0.9, f"report when the success rate of the last {WINDOW} episodes reaches this")
    stop_at_target: bool = arg(False, "stop training once the target success rate is reached")
    n_bits: int = arg(15, "bits of the state and goal (15: a random policy reaches the goal in 1 episode of 2,400)")
    hindsight: bool = arg(True, "relabel sampled goals (--no-hindsight: plain DQN on the sparse reward)")
    strategy: Literal["future", "final", "episode"] = arg("future", "where relabelled goals come from")
    relabel_ratio: float = arg(0.8, "fraction of sampled transitions relabelled")
    num_envs: int = arg(16, "bit-flipping envs stepped together")
    buffer_size: int = arg(100_000, "replay capacity (transitions)")
    batch_size: int = arg(128, "transitions per gradient step")
    lr: float = arg(1e-3, "Adam learning rate")
    gamma: float = arg(0.98, "discount")
    learning_starts: int = arg(1_000, "frames collected before the first update")
    train_every: int = arg(16, "frames between training phases")
    gradient_steps: int = arg(4, "gradient steps per training phase")
    target_every: int = arg(16, "frames between updates of the target network")
    tau: float = arg(0.05, "target update: target += tau * (online - target); 1 copies the online network")
    exploration_frames: int = arg(20_000, "frames over which ε decays linearly from 1")
    final_epsilon: float = arg(0.05, "ε after the decay")
    hidden: int = arg(128, "hidden units of the Q-network's two layers")


@dataclass
class ApexArgs(RunArgs):
    """Ape-X options: actor processes, one learner, a rate-limited replay service on Ray."""

    frames: int = arg(20_000, "environment frames to collect in all, over all actors")
    checkpoint_every: int = arg(10_000, "save the replay service every this many frames (while the actors write)")
    num_actors: int = arg(2, "actor processes, each with its own CartPole and its own epsilon")
    chunk: int = arg(200, "env steps an actor takes on one copy of the learner's weights")
    batch_steps: int = arg(50, "env steps an actor's writer gathers before sending them as one batch")
    buffer_size: int = arg(50_000, "replay capacity (transitions)")
    batch_size: int = arg(64, "transitions per gradient step")
    samples_per_insert: float = arg(8.0, "rate limiter: sampled transitions per inserted one")
    learning_starts: int = arg(500, "transitions stored before the learner samples")
    alpha: float = arg(0.6, "PER priority exponent")
    beta: float = arg(0.4, "PER importance-sampling exponent")
    lr: float = arg(1e-3, "Adam learning rate")
    gamma: float = arg(0.99, "discount")
    tau: float = arg(0.01, "target update after every step: target += tau * (online - target)")
    hidden: int = arg(64, "hidden units of the Q-network's two layers")
    resume_check_steps: int = arg(4, "learner steps compared after restoring the final checkpoint")


ARGS: dict[str, type[RunArgs]] = {"ppo": PPOArgs, "dqn": DQNArgs, "ppo-continuous": PPOContinuousArgs,
                                  "distill": DistillArgs, "her": HERArgs, "apex": ApexArgs}
"""Demo name (as in ``rlbuf.demos.DEMOS``) -> its options."""
