"""Ape-X-shaped DQN on CartPole-v1: several actor processes, one learner, a rate-limited replay service on Ray.

Run it with ``rlbuf demo apex`` (``--help`` lists the options; needs ``pip install "rlbuf[ray]"``).
The run, top to bottom:

1. a prioritized [`ReplayService`][rlbuf.ray.ReplayService] (one shard) with a
   [`RateLimiter`][rlbuf.ray.RateLimiter] (``samples_per_insert`` sampled rows per inserted row,
   within an error buffer): neither the actors nor the learner run ahead of the other;
2. ``num_actors`` Ray actors, each with its own CartPole and its own ε (Ape-X's
   ``0.4 ** (1 + 7 * i / (n - 1))``: from 0.4 down to 0.4 ** 8), acting greedily on the learner's
   latest weights and storing every step with [`ServiceWriter.add`][rlbuf.ray.ServiceWriter.add]
   (checked at once, sent in batches);
3. the learner: double DQN on prioritized batches drawn across the shards (``batch.weight``
   corrects the bias), priorities back as ``|TD error|``, weights to the actors every chunk;
4. a service checkpoint every ``checkpoint_every`` frames while the actors write, and at the end
   the resume check: the learner's next steps after ``service.restore`` of the final checkpoint
   equal those of the run that kept going (``resume_exact`` in ``summary.json``).

The actors run asynchronously, so two runs with one seed differ (unlike the other demos); what is
exact is the replay: a checkpoint brings back every shard's rows, priorities, sampler, limiter
counters and the learner's split, so the next batches are the same.

Example (not run here: it trains for a couple of minutes)::

    rlbuf demo apex --out runs/apex
    rlbuf demo apex --num-actors 3 --frames 30000
"""

from __future__ import annotations

import copy
import json
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from rlbuf import EpisodeStats, RateLimitTimeoutError
from rlbuf.demos import _progress, _run
from rlbuf.demos._options import ApexArgs as Args
from rlbuf.errors import ConfigError


def q_network(hidden: int) -> nn.Sequential:
    """Observation (4) -> one Q-value per action (2).

    Example:
        >>> q_network(8)(torch.zeros(3, 4)).shape
        torch.Size([3, 2])
    """
    return nn.Sequential(nn.Linear(4, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 2))


def epsilon(i: int, n: int, base: float = 0.4, alpha: float = 7.0) -> float:
    """Ape-X's exploration rate of actor ``i`` of ``n``.

    Example:
        >>> round(epsilon(0, 3), 4), round(epsilon(2, 3), 6)
        (0.4, 0.000655)
    """
    return float(base ** (1 + alpha * i / max(n - 1, 1)))


class Actor:
    """One actor process: a CartPole, its ε, and a writer to the service."""

    def __init__(self, writer: Any, index: int, num_actors: int, seed: int, hidden: int) -> None:
        torch.set_num_threads(1)
        self.writer, self.epsilon = writer, epsilon(index, num_actors)
        self.env = gym.make("CartPole-v1")
        self.obs, _ = self.env.reset(seed=seed)
        self.rng = np.random.default_rng(seed)
        self.q = q_network(hidden)
        self.episode_return = 0.0

    def collect(self, weights: dict[str, torch.Tensor], steps: int) -> list[float]:
        """``steps`` env steps on ``weights``, all stored; the returns of the episodes that ended."""
        self.q.load_state_dict(weights)
        returns = []
        for _ in range(steps):
            if self.rng.random() < self.epsilon:
                action = int(self.rng.integers(2))
            else:
                with torch.no_grad():
                    action = int(self.q(torch.as_tensor(self.obs)).argmax())
            next_obs, reward, terminated, truncated, _ = self.env.step(action)
            self.writer.add(self.obs, action, reward, next_obs, terminated, truncated)
            self.episode_return += float(reward)
            if terminated or truncated:
                returns.append(self.episode_return)
                self.episode_return = 0.0
                self.obs, _ = self.env.reset()
            else:
                self.obs = next_obs
        self.writer.flush()
        return returns


class Learner:
    """Double DQN on prioritized batches from the service."""

    def __init__(self, args: Args) -> None:
        self.args = args
        self.q, self.target = q_network(args.hidden), q_network(args.hidden)
        self.target.load_state_dict(self.q.state_dict())
        self.optimizer = torch.optim.Adam(self.q.parameters(), lr=args.lr)
        self.steps = 0

    def step(self, service: Any, timeout: float | None = None) -> tuple[torch.Tensor, float]:
        """One gradient step; returns the batch's indices and the loss."""
        batch = service.sample(self.args.batch_size, timeout=timeout)
        with torch.no_grad():
            best = self.q(batch.next_obs).argmax(1, keepdim=True)
            next_q = self.target(batch.next_obs).gather(1, best).squeeze(1)
            y = batch.reward + self.args.gamma * (~batch.terminated) * next_q   # timeouts bootstrap
        q = self.q(batch.obs).gather(1, batch.action.unsqueeze(1)).squeeze(1)
        loss = (batch.weight * nn.functional.smooth_l1_loss(q, y, reduction="none")).mean()
        self.optimizer.zero_grad()
        torch.autograd.backward(loss)
        nn.utils.clip_grad_norm_(self.q.parameters(), 10.0)
        self.optimizer.step()
        service.update_priority(batch.index, (q - y).abs().detach() + 1e-6)
        self.steps += 1
        with torch.no_grad():
            for target_param, param in zip(self.target.parameters(), self.q.parameters(), strict=True):
                target_param.lerp_(param, self.args.tau)
        return batch.index, float(loss.item())


def run(args: Args) -> dict[str, Any]:
    """Train Ape-X-style as ``args`` say; write curve, summary, model and checkpoints; return the summary."""
    import ray

    from rlbuf.ray import RateLimiter, ReplayService

    if args.resume is not None:
        raise ConfigError("--resume: rlbuf demo apex's actors run asynchronously, so a resumed run would not be the "
                          "same run; it checks the exact resume of its replay itself (resume_exact in summary.json)")
    out = _run.setup(args, "apex")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=max(2, args.num_actors), include_dashboard=False, log_to_driver=False)
    limiter = RateLimiter(samples_per_insert=args.samples_per_insert, min_size_to_sample=args.learning_starts,
                          error_buffer=args.samples_per_insert * args.learning_starts + 2 * args.batch_size)
    # One shard, so the limiter's ratio is the whole run's (each shard of a service has its own limiter).
    service = ReplayService(args.buffer_size, num_shards=1, obs_shape=(4,), action_shape=(),
                            action_dtype=torch.int64, prioritized=True, alpha=args.alpha, beta=args.beta,
                            rate_limiter=limiter, seed=args.seed, storage=args.storage,
                            actor_options={"num_cpus": 0})
    remote_actor = ray.remote(num_cpus=0.5)(Actor)
    actors = [remote_actor.remote(service.writer(writer_id=i, batch_steps=args.batch_steps), i, args.num_actors,
                                  _run.env_seed(args.seed, i), args.hidden) for i in range(args.num_actors)]
    learner = Learner(args)
    stats = EpisodeStats(1)
    progress = _progress.Progress(args, 0)
    frames, loss, sent = 0, 0.0, 0
    try:
        weights = ray.put(learner.q.state_dict())
        running: dict[Any, int] = {}
        for i, actor in enumerate(actors):
            running[actor.collect.remote(weights, args.chunk)] = i
            sent += args.chunk
        stopped = False
        while running:
            done, _ = ray.wait(list(running), timeout=0)
            for ref in done:
                i = running.pop(ref)
                for episode_return in ray.get(ref):
                    stats.update(episode_return, True)
                frames_before, frames = frames, frames + args.chunk
                if _run.crossed(frames_before, frames, args.checkpoint_every):
                    service.save(out / "checkpoints" / f"frames-{frames}")   # while the other actors write
                if _run.crossed(frames_before, frames, 1_000) or frames >= args.frames:
                    progress.log(frames, stats, loss=loss)
                    stopped = progress.done(frames)
                if not stopped and sent < args.frames:
                    weights = ray.put(learner.q.state_dict())
                    running[actors[i].collect.remote(weights, args.chunk)] = i
                    sent += args.chunk
            try:   # held by the limiter while the learner is ahead of the actors
                _, loss = learner.step(service, timeout=1.0)
            except RateLimitTimeoutError:
                continue

        # The resume check: the next steps after restoring the final checkpoint equal those that follow
        # it. If the learner is too far ahead for them, one more chunk from every actor makes room.
        counters = (service.rate_limiters() or [{"counters": {"inserts": 0, "samples": 0}}])[0]["counters"]
        room = counters["inserts"] * args.samples_per_insert - counters["samples"] - limiter.min_diff
        if room < args.resume_check_steps * args.batch_size:
            weights = ray.put(learner.q.state_dict())
            for returns in ray.get([actor.collect.remote(weights, args.chunk) for actor in actors]):
                for episode_return in returns:
                    stats.update(episode_return, True)
            frames += args.chunk * args.num_actors
        final = out / "checkpoints" / f"frames-{frames}"
        service.save(final)
        torch.save({"q": learner.q.state_dict(), "target": learner.target.state_dict(),
                    "optimizer": learner.optimizer.state_dict()}, final / "learner.pt")
        copies = copy.deepcopy(learner)
        kept_going = [learner.step(service, timeout=0.0) for _ in range(args.resume_check_steps)]
        service.restore(final)
        resumed = [copies.step(service, timeout=0.0) for _ in range(args.resume_check_steps)]
        exact = all(torch.equal(a[0], b[0]) and a[1] == b[1] for a, b in zip(kept_going, resumed, strict=True))
        limiters = service.rate_limiters() or []
        sizes = service.sizes()
    finally:
        for actor in actors:
            ray.kill(actor)
        service.close()
        if started:
            ray.shutdown()
    progress.close()
    torch.save({"q": learner.q.state_dict(), "hidden": args.hidden}, out / "model.pt")
    (final / "resume_check.json").write_text(json.dumps({"resume_exact": exact, "steps": args.resume_check_steps}))
    return _progress.finish(out, "apex", args, progress, frames, stats, True, None, resume_exact=exact,
                            learner_steps=learner.steps, shard_sizes=sizes, inspect=str(final / "shard_0"),
                            limiter_counters=[limiter["counters"] for limiter in limiters],
                            epsilons=[epsilon(i, args.num_actors) for i in range(args.num_actors)])
