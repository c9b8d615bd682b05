"""Write ``tests/data/breakout_steps.npz``: real Breakout frames for the compact layout's tests (run once; ale-py and OpenCV).

Two envs of ale-py's Breakout with the DQN preprocessing (frame skip 4, 84×84 grey, life loss
ends an episode) and a 60-step time limit, random actions from a fixed seed, stepped with
gymnasium's ``SAME_STEP`` autoreset so that every step is a real transition. Stored per env,
in order, the frames a ``FrameStackObservation(4)`` (``padding_type="reset"``) stack is built
from: each episode's first frame, then the newest frame of each step's ``next_obs`` (the final
observation's at an episode's end); and per step the actions, rewards and flags.

    PYTHONPATH=. python benchmarks/make_breakout_steps.py
"""

from __future__ import annotations

from pathlib import Path

import ale_py
import gymnasium as gym
import numpy as np

STEPS, NUM_ENVS, SEED = 300, 2, 0


def main() -> None:
    gym.register_envs(ale_py)
    wrappers = [lambda env: gym.wrappers.AtariPreprocessing(env, frame_skip=4, terminal_on_life_loss=True),
                lambda env: gym.wrappers.TimeLimit(env, 60)]
    envs = gym.make_vec("BreakoutNoFrameskip-v4", num_envs=NUM_ENVS, vectorization_mode="sync", wrappers=wrappers,
                        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})
    envs.action_space.seed(SEED)
    obs, _ = envs.reset(seed=SEED)
    frames: list[list[np.ndarray]] = [[obs[env]] for env in range(NUM_ENVS)]
    actions, rewards, terminated, truncated = [], [], [], []
    for _ in range(STEPS):
        action = envs.action_space.sample()
        next_obs, reward, term, trunc, info = envs.step(action)
        for env in range(NUM_ENVS):
            if term[env] or trunc[env]:
                frames[env] += [info["final_obs"][env], next_obs[env]]  # the final frame, the next episode's first
            else:
                frames[env].append(next_obs[env])
        actions.append(action)
        rewards.append(reward)
        terminated.append(term)
        truncated.append(trunc)
    envs.close()
    np.savez_compressed(Path(__file__).parents[1] / "tests" / "data" / "breakout_steps.npz",
                        **{f"frames_{env}": np.stack(frames[env]) for env in range(NUM_ENVS)},
                        action=np.array(actions), reward=np.array(rewards, np.float32),
                        terminated=np.array(terminated), truncated=np.array(truncated))


if __name__ == "__main__":
    main()
