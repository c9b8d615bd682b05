"""Recurrent PPO on CartPole-v1 with the velocities hidden: an LSTM policy and sequence minibatches.

Run it with ``rlbuf demo ppo --recurrent``. The envs show only the cart position and the pole
angle (``HideVelocities``), so the state is only partly observed: a memoryless policy
cannot tell which way the pole is moving (``rlbuf demo ppo --hide-velocities`` trains the MLP on
the same observations and stays far below 475), while an LSTM infers the velocities from
the observations it has seen. The loop, top to bottom:

1. ``num_envs`` CartPoles (a gymnasium ``SyncVectorEnv`` resetting finished envs in the same
   step, with the final observation in ``infos``) are stepped by hand; the LSTM carries a
   hidden state per env, zeroed when its episode ends;
2. every step goes to the ``RolloutBuffer`` with ``add(..., hidden_state={"h", "c"})``:
   the state the action was computed from. A truncated step (500 steps) bootstraps from
   V(final observation);
3. GAE, then ``minibatches(..., sequences=True)``: each env's rollout split at episode ends
   into trajectories, padded to ``[L, B]``, each replayed through the LSTM from its stored
   initial state; the losses are averaged over ``batch.mask``.

Example (not run here: it reaches 475 in 65k to 120k frames, about a minute on 2 cores)::

    rlbuf demo ppo --recurrent --out runs/ppo-lstm
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict
from torch import nn

from rlbuf import EpisodeStats, RolloutBuffer
from rlbuf.demos import _checkpoint, _progress, _run


class HideVelocities(gym.ObservationWrapper):  # type: ignore[misc]
    """CartPole observing only the cart position and the pole angle (no velocities).

    Example:
        >>> env = HideVelocities(gym.make("CartPole-v1"))
        >>> env.reset(seed=0)[0].shape, env.observation_space.shape
        ((2,), (2,))
    """

    KEEP = (0, 2)

    def __init__(self, env: Any) -> None:
        super().__init__(env)
        box = env.observation_space
        assert isinstance(box, gym.spaces.Box)
        self.observation_space = gym.spaces.Box(box.low[list(self.KEEP)], box.high[list(self.KEEP)], dtype=np.float32)

    def observation(self, observation: Any) -> Any:
        return observation[list(self.KEEP)]


def make_envs(num_envs: int) -> gym.vector.SyncVectorEnv:
    """``num_envs`` velocity-free CartPoles that reset in the step an episode ends.

    Example:
        >>> make_envs(2).single_observation_space.shape
        (2,)
    """
    return gym.vector.SyncVectorEnv([lambda: HideVelocities(gym.make("CartPole-v1"))] * num_envs,
                                    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


class LSTMPolicy(nn.Module):
    """An actor and a critic, each an LSTM layer then a ReLU layer; time-major inputs.

    Their states travel together: ``h`` and ``c`` are ``[2, batch, hidden]``, the actor's at
    index 0 and the critic's at 1 (separate LSTMs keep the value loss from swamping the
    actor's memory, as in SB3-contrib's RecurrentPPO with ``enable_critic_lstm``).

    Example:
        >>> policy = LSTMPolicy(2, 16)
        >>> state = policy.initial_state(3)
        >>> logits, value, state = policy(torch.zeros(5, 3, 2), state)
        >>> logits.shape, value.shape, state[0].shape
        (torch.Size([5, 3, 2]), torch.Size([5, 3]), torch.Size([2, 3, 16]))
    """

    obs_scale: torch.Tensor
    VALUE_SCALE = 100.0
    """The critic's output unit: CartPole's returns reach hundreds (gamma 0.999), its head outputs ~1."""

    def __init__(self, inputs: int, hidden: int, obs_scale: torch.Tensor | None = None) -> None:
        super().__init__()
        self.hidden = hidden
        # Observations scaled to about unit size: the pole angle's step-to-step changes, from
        # which the LSTM infers the velocity, are otherwise small next to its initial weights.
        self.register_buffer("obs_scale", torch.ones(inputs) if obs_scale is None else obs_scale)
        self.actor_lstm = nn.LSTM(inputs, hidden)
        self.critic_lstm = nn.LSTM(inputs, hidden)
        self.actor = nn.Sequential(nn.Linear(hidden, 64), nn.ReLU(), nn.Linear(64, 2))
        self.critic = nn.Sequential(nn.Linear(hidden, 64), nn.ReLU(), nn.Linear(64, 1))

    def initial_state(self, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Zero ``(h, c)``, each ``[2, batch, hidden]`` (actor, critic), on the policy's device."""
        device = self.obs_scale.device
        return torch.zeros(2, batch, self.hidden, device=device), torch.zeros(2, batch, self.hidden, device=device)

    def forward(self, obs: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor]
                ) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        h, c = state
        x = obs * self.obs_scale
        actor_out, (actor_h, actor_c) = self.actor_lstm(x, (h[:1], c[:1]))
        critic_out, (critic_h, critic_c) = self.critic_lstm(x, (h[1:], c[1:]))
        state = (torch.cat((actor_h, critic_h)), torch.cat((actor_c, critic_c)))
        return self.actor(actor_out), self.critic(critic_out).squeeze(-1) * self.VALUE_SCALE, state


def run(args: Any) -> dict[str, Any]:
    """Train recurrent PPO as ``args`` (``rlbuf.demos.ppo.Args``) say; return the summary."""
    out = _run.setup(args, "ppo")
    device = torch.device(args.device)  # the policy acts and learns there; the envs step on the CPU
    frames_per_batch = args.num_envs * args.num_steps

    # -- setup: envs, network, buffer ---------------------------------------------------------------
    envs = make_envs(args.num_envs)
    policy = LSTMPolicy(2, args.hidden, obs_scale=1 / torch.tensor([1.0, 0.1])).to(device)  # the spread seen in play
    optimizer = torch.optim.Adam(policy.parameters(), lr=args.lr, eps=1e-5)
    stats = EpisodeStats(args.num_envs)
    buffer = RolloutBuffer(args.num_steps, args.num_envs, obs_shape=(2,), action_shape=(), action_dtype=torch.int64,
                           hidden_state_shape={"h": (2, args.hidden), "c": (2, args.hidden)},
                           storage=args.storage, storing_device=device, seed=args.seed, stats=stats)

    frames, saved = 0, _checkpoint.resume(args, out, buffer)
    if saved is not None:
        policy.load_state_dict(saved["models"]["policy"])
        optimizer.load_state_dict(saved["optimizer"])
        frames = saved["frames"]
    progress = _progress.Progress(args, frames, None if saved is None else saved["progress"])

    def checkpoint(reason: _run.CheckpointReason) -> Path:
        return _checkpoint.save_checkpoint(out, "ppo", args, frames, buffer, {
            "frames": frames, "progress": progress.state_dict(), "optimizer": optimizer.state_dict(),
            "models": {"policy": policy.state_dict()}}, reason)

    raw_obs, _ = envs.reset(seed=_run.env_seed(args.seed, frames))  # see rlbuf.demos._run: exact resume
    obs, state = torch.as_tensor(raw_obs, device=device), policy.initial_state(args.num_envs)

    def reset_envs(seed: int) -> None:
        nonlocal obs, state
        raw_obs, _ = envs.reset(seed=seed)
        obs, state = torch.as_tensor(raw_obs, device=device), policy.initial_state(args.num_envs)

    # -- collect, learn, log ------------------------------------------------------------------------
    stopped, interrupted_at = progress.done(frames), None
    while not stopped:
        frames_before = frames
        buffer.clear()
        with torch.no_grad():
            for _ in range(args.num_steps):
                logits, value, next_state = policy(obs.unsqueeze(0), state)
                log_probs = logits[0].log_softmax(-1)
                action = torch.multinomial(log_probs.exp(), 1).squeeze(1)
                next_obs, reward, terminated, truncated, infos = envs.step(action.cpu().numpy())
                terminated_t = torch.as_tensor(terminated, device=device)
                truncated_t = torch.as_tensor(truncated, device=device)
                bootstrap = torch.zeros(args.num_envs, device=device)
                if truncated.any():  # V(final observation), from the state after this step
                    final = torch.as_tensor(np.stack([o if t else np.zeros_like(next_obs[0])
                                                      for o, t in zip(infos["final_obs"], truncated, strict=True)]),
                                            device=device)
                    bootstrap = policy(final.unsqueeze(0), next_state)[1][0] * truncated_t
                buffer.add(obs, action, torch.as_tensor(reward, dtype=torch.float32, device=device), terminated_t,
                           value[0], log_probs.gather(1, action.unsqueeze(1)).squeeze(1), truncated=truncated_t,
                           bootstrap_value=bootstrap,
                           hidden_state={"h": state[0].transpose(0, 1), "c": state[1].transpose(0, 1)})
                keep = ~(terminated_t | truncated_t)
                state = (next_state[0] * keep.view(1, -1, 1), next_state[1] * keep.view(1, -1, 1))
                obs = torch.as_tensor(next_obs, device=device)
            last_value = policy(obs.unsqueeze(0), state)[1][0]
        frames += frames_per_batch
        buffer.compute_returns_and_advantages(last_value, gamma=args.gamma, gae_lambda=args.gae_lambda)

        for group in optimizer.param_groups:
            group["lr"] = args.lr * max(0.0, 1.0 - frames_before / args.frames)
        for batch in buffer.minibatches(num_minibatches=args.num_minibatches, n_epochs=args.epochs, sequences=True):
            assert isinstance(batch.hidden_state, TensorDict)
            initial = (batch.hidden_state["h"].transpose(0, 1).contiguous(),
                       batch.hidden_state["c"].transpose(0, 1).contiguous())
            logits, value, _ = policy(batch.obs, initial)
            mask = batch.mask.float()
            log_probs = logits.log_softmax(-1)
            ratio = (log_probs.gather(-1, batch.action.unsqueeze(-1)).squeeze(-1) - batch.log_prob).exp()
            valid = batch.advantage[batch.mask]
            advantage = (batch.advantage - valid.mean()) / (valid.std() + 1e-8)
            surrogate = torch.min(ratio * advantage, ratio.clamp(1 - args.clip, 1 + args.clip) * advantage)
            policy_loss = -(surrogate * mask).sum() / mask.sum()
            # In the critic's own unit, so that its loss does not swamp the policy's.
            value_loss = 0.5 * (((value - batch.returns) / policy.VALUE_SCALE).pow(2) * mask).sum() / mask.sum()
            entropy = (-(log_probs.exp() * log_probs).sum(-1) * mask).sum() / mask.sum()
            loss = policy_loss + args.vf_coef * value_loss - args.ent_coef * entropy
            optimizer.zero_grad()
            torch.autograd.backward(loss)
            nn.utils.clip_grad_norm_(policy.parameters(), args.max_grad_norm)
            optimizer.step()

        progress.log(frames, stats, loss=loss.item())
        stopped = progress.done(frames)
        leave, interrupted_at = _run.checkpoint_and_reset(  # Ctrl-C: between two collections
            args, frames_before, frames, stopped, checkpoint, reset_envs, stats)
        if leave:
            break
    envs.close()
    progress.close()

    # -- outputs ------------------------------------------------------------------------------------
    if stopped:
        checkpoint("end")
        torch.save({"policy": policy.state_dict(), "hidden": args.hidden}, out / "model.pt")
    buffer.close()
    return _progress.finish(out, "ppo", args, progress, frames, stats, stopped, interrupted_at)
