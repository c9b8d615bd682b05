"""The Recorder stores exactly the real transitions of every env, in every autoreset mode.

The test env's observation is ``(env id, episode, step)``; it terminates pseudo-randomly (a
function of that triple) and is truncated by a per-env time limit, so every stored row can be
checked against what must have happened: each stored pair is consecutive (same env, same
episode, step + 1), every truncation bootstraps from its own final observation, every step of
every episode is stored once, and no reset step is.
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode

from rlbuf import (
    BatchedSpaceWarning,
    ConfigError,
    DistillationBuffer,
    DtypeError,
    EpisodeStats,
    MissingFieldError,
    ReplayBuffer,
    RolloutBuffer,
    ShapeError,
    StreamError,
)
from rlbuf.gym import Recorder, isaac_step, sb3_step

MODES = [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED]
NUM_ENVS = 3
STEPS = 40


def ends_by_termination(env: int, episode: int, step: int) -> bool:
    return (env * 7 + episode * 3 + step * 5) % 11 == 0


def time_limit(env: int) -> int:
    return 4 + env


def code(obs: Any) -> float:
    """A value that names an observation: what ``bootstrap`` returns for it."""
    env, episode, step = (float(x) for x in obs)
    return env * 10_000 + episode * 100 + step


class CountingEnv(gym.Env[np.ndarray, np.int64]):
    """Observations ``(env id, episode, step)``; terminates at some steps, truncated by a time limit."""

    observation_space = gym.spaces.Box(0, 10_000, (3,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, env_id: int) -> None:
        self.env_id, self.episode, self.step_count = env_id, -1, 0

    def _obs(self) -> np.ndarray:
        return np.array([self.env_id, self.episode, self.step_count], np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.episode += 1
        self.step_count = 0
        return self._obs(), {}

    def step(self, action: np.int64) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.step_count += 1
        terminated = ends_by_termination(self.env_id, self.episode, self.step_count)
        return self._obs(), float(self.step_count), terminated, False, {}


def make(env_id: int) -> Any:
    return lambda: gym.wrappers.TimeLimit(CountingEnv(env_id), max_episode_steps=time_limit(env_id))


def make_envs(mode: AutoresetMode, vector: str = "sync") -> gym.vector.VectorEnv:
    makers = [make(i) for i in range(NUM_ENVS)]
    if vector == "async":
        return gym.vector.AsyncVectorEnv(makers, autoreset_mode=mode, context="fork")  # spawn: a minute of imports
    return gym.vector.SyncVectorEnv(makers, autoreset_mode=mode)


def build(kind: str, envs: gym.vector.VectorEnv, steps: int = STEPS) -> Any:
    spaces = {"observation_space": envs.single_observation_space, "action_space": envs.single_action_space}
    if kind == "replay":
        return ReplayBuffer(10_000, num_envs=NUM_ENVS, stats=EpisodeStats(NUM_ENVS), **spaces)
    if kind == "rollout":
        return RolloutBuffer(steps, NUM_ENVS, extra_fields={"next_code": ((), torch.float32)},
                             stats=EpisodeStats(NUM_ENVS), **spaces)
    return DistillationBuffer(10_000, **spaces)


def drive(envs: gym.vector.VectorEnv, buffer: Any, steps: int = STEPS, as_torch: bool = False) -> Recorder:
    """Step random actions through ``envs`` into ``buffer`` via a Recorder; return the Recorder.

    The critic (``bootstrap``) reads the ``state`` key of dict final observations.
    """
    def bootstrap(final: Any) -> list[float]:
        return [code(o) for o in np.asarray(final["state"] if isinstance(final, dict) else final)]

    recorder = Recorder(envs, buffer, bootstrap=bootstrap if isinstance(buffer, RolloutBuffer) else None)
    mode = envs.metadata["autoreset_mode"]
    obs, _ = envs.reset(seed=0)
    rng = np.random.default_rng(0)
    for _ in range(steps):
        action = rng.integers(0, 2, NUM_ENVS)
        step_action = torch.as_tensor(action) if as_torch else action
        next_obs, reward, terminated, truncated, info = envs.step(step_action)
        fields: dict[str, Any] = {}
        if isinstance(buffer, RolloutBuffer):
            fields = {"value": np.zeros(NUM_ENVS, np.float32), "log_prob": np.zeros(NUM_ENVS, np.float32),
                      "next_code": np.zeros(NUM_ENVS, np.float32)}
        recorder.record(obs, step_action, reward, next_obs, terminated, truncated, info, **fields)
        obs = next_obs
        if mode == AutoresetMode.DISABLED:
            ended = np.asarray(terminated) | np.asarray(truncated)
            if ended.any():
                obs, _ = envs.reset(options={"reset_mask": ended})
    envs.close()
    return recorder


def check_episodes(obs_rows: np.ndarray) -> None:
    """Every step of every episode of every env is there, once: nothing lost, nothing junk."""
    seen: dict[int, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    for env, episode, step in obs_rows.astype(int).tolist():
        seen[env][episode].append(step)
    assert sorted(seen) == list(range(NUM_ENVS))
    for env, episodes in seen.items():
        assert sorted(episodes) == list(range(len(episodes)))
        for episode, steps in episodes.items():
            assert sorted(steps) == list(range(len(steps))), (env, episode, steps)
            if episode < len(episodes) - 1:  # a finished episode: it ended where the env says
                last = len(steps)
                assert last == time_limit(env) or ends_by_termination(env, episode, last), (env, episode, last)


def check_transition_flags(obs: np.ndarray, reward: np.ndarray, terminated: np.ndarray,
                           truncated: np.ndarray) -> None:
    for (env, episode, step), r, term, trunc in zip(obs.astype(int).tolist(), reward.tolist(), terminated.tolist(),
                                                   truncated.tolist(), strict=True):
        assert r == step + 1
        assert term == ends_by_termination(env, episode, step + 1)
        at_limit = step + 1 == time_limit(env)
        assert trunc == at_limit or (term and at_limit and not trunc)  # both flags may be set at the limit


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_replay_stores_exactly_the_consecutive_pairs(mode: AutoresetMode) -> None:
    envs = make_envs(mode)
    buffer = build("replay", envs)
    recorded = drive(envs, buffer)
    data = buffer.sample_all()
    obs, next_obs = data.obs.numpy(), data.next_obs.numpy()
    assert (next_obs[:, 0] == obs[:, 0]).all() and (next_obs[:, 1] == obs[:, 1]).all()
    assert (next_obs[:, 2] == obs[:, 2] + 1).all()  # the final observation ends an episode, never a reset one
    check_transition_flags(obs, data.reward.numpy(), data.terminated.numpy(), data.truncated.numpy())
    check_episodes(obs)
    assert data.truncated.any() and data.terminated.any()
    skipped = recorded.skipped
    assert len(buffer) == NUM_ENVS * STEPS - skipped
    assert (skipped > 0) == (mode == AutoresetMode.NEXT_STEP)
    # The stats saw each episode once, with its real length and return (no reset step counted).
    stats = buffer.stats
    assert stats.episodes_finished == int(data.done.sum())
    assert all(length in range(1, 10) for length in stats.recent_lengths())
    assert set(stats.recent_lengths()) <= {int(s) + 1 for s in obs[data.done.numpy(), 2]}


@pytest.mark.parametrize("mode", [AutoresetMode.SAME_STEP, AutoresetMode.DISABLED], ids=lambda m: m.name)
def test_rollout_truncations_bootstrap_from_their_own_final_observation(mode: AutoresetMode) -> None:
    envs = make_envs(mode)
    buffer = build("rollout", envs)
    drive(envs, buffer)
    assert buffer.is_full
    obs = buffer.view("obs").numpy()                 # [T, N, 3]
    truncated = buffer.view("truncated").numpy()
    terminated = buffer.view("terminated").numpy()
    bootstrap = buffer.view("bootstrap_value").numpy()
    check_episodes(obs.reshape(-1, 3))
    check_transition_flags(obs.reshape(-1, 3), buffer.view("reward").numpy().reshape(-1),
                           terminated.reshape(-1), truncated.reshape(-1))
    assert truncated.any()
    for t, n in zip(*np.nonzero(truncated), strict=True):
        env, episode, step = obs[t, n]
        assert bootstrap[t, n] == code((env, episode, step + 1))  # V(its own final observation)
    assert (bootstrap[~truncated] == 0).all()
    for t in range(STEPS - 1):                        # the next row of an env is its next step or a reset
        ended = terminated[t] | truncated[t]
        following = obs[t + 1]
        assert (following[ended, 2] == 0).all() and (following[ended, 1] == obs[t, ended, 1] + 1).all()
        assert (following[~ended, 2] == obs[t, ~ended, 2] + 1).all()


@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_distillation_stores_every_real_observation_once(mode: AutoresetMode) -> None:
    envs = make_envs(mode)
    buffer = build("distill", envs)
    recorded = drive(envs, buffer)
    data = buffer.sample_all()
    check_episodes(data.obs.numpy())
    assert len(buffer) == NUM_ENVS * STEPS - recorded.skipped
    assert data.expert_action.dtype == torch.int64


def test_rollout_buffer_refuses_next_step_envs_and_says_to_use_same_step() -> None:
    envs = make_envs(AutoresetMode.NEXT_STEP)
    with pytest.raises(ConfigError, match="SAME_STEP"):
        Recorder(envs, build("rollout", envs))


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_the_same_step_spellings_the_refusal_suggests_run_and_the_recorder_takes_them(env_id: str) -> None:
    """CartPole-v1 registers its own vector env: make_vec refuses vector_kwargs there without vectorization_mode."""
    default = gym.make_vec(env_id, num_envs=2)  # NEXT_STEP, gymnasium's default
    spaces = {"observation_space": default.single_observation_space, "action_space": default.single_action_space}
    with pytest.raises(ConfigError) as raised:
        Recorder(default, RolloutBuffer(4, 2, **spaces))
    default.close()
    message = str(raised.value)
    [make_vec] = re.findall(r"gymnasium\.make_vec\(.*?\}\)", message)
    [sync] = re.findall(r"SyncVectorEnv\(fns, .*?\)$", message)
    names = {"gymnasium": gym, "env_id": env_id, "num_envs": 2, "SyncVectorEnv": gym.vector.SyncVectorEnv,
             "fns": [lambda: gym.make(env_id)] * 2}
    for spelling in (make_vec, sync):
        envs = eval(spelling, names)  # the message's own code, run as a user would paste it
        assert envs.metadata["autoreset_mode"] is AutoresetMode.SAME_STEP, spelling
        buffer = RolloutBuffer(4, 2, **spaces)
        recorder = Recorder(envs, buffer, bootstrap=lambda final: np.zeros(len(final), np.float32))
        obs, _ = envs.reset(seed=0)
        for _ in range(4):
            action = envs.action_space.sample()
            next_obs, reward, terminated, truncated, info = envs.step(action)
            recorder.record(obs, action, reward, next_obs, terminated, truncated, info,
                            value=np.zeros(2, np.float32), log_prob=np.zeros(2, np.float32))
            obs = next_obs
        envs.close()
        assert buffer.is_full


def test_a_truncation_without_bootstrap_is_refused_before_anything_is_stored() -> None:
    envs = make_envs(AutoresetMode.SAME_STEP)
    buffer = build("rollout", envs)
    recorder = Recorder(envs, buffer)
    obs, _ = envs.reset(seed=0)
    zeros = np.zeros(NUM_ENVS, np.float32)
    with pytest.raises(MissingFieldError, match="bootstrap"):
        for _ in range(STEPS):
            next_obs, reward, terminated, truncated, info = envs.step(np.zeros(NUM_ENVS, np.int64))
            recorder.record(obs, np.zeros(NUM_ENVS, np.int64), reward, next_obs, terminated, truncated, info,
                            value=zeros, log_prob=zeros, next_code=zeros)
            obs = next_obs
    assert buffer.steps == int(time_limit(0)) - 1  # the truncated step was not stored


def test_a_buffer_built_from_the_batched_space_is_refused_with_the_fix() -> None:
    envs = make_envs(AutoresetMode.SAME_STEP)
    with pytest.warns(BatchedSpaceWarning, match="single_observation_space"):  # warned when built, refused when used
        buffer = ReplayBuffer(100, observation_space=envs.observation_space, action_space=envs.single_action_space,
                              num_envs=NUM_ENVS)
    with pytest.raises(ConfigError, match="single_observation_space"):
        Recorder(envs, buffer)


def test_envs_without_an_autoreset_mode_need_it_named() -> None:
    class Envs:
        num_envs, metadata = 2, {}

    with pytest.raises(ConfigError, match="autoreset_mode='same_step'"):
        Recorder(Envs(), ReplayBuffer(10, obs_shape=(1,), action_shape=(), num_envs=2))
    with pytest.raises(ConfigError, match="autoreset_mode"):
        Recorder(Envs(), ReplayBuffer(10, obs_shape=(1,), action_shape=(), num_envs=2), autoreset_mode="sometimes")


@pytest.mark.parametrize(("mode", "given"), [(AutoresetMode.NEXT_STEP, "disabled"), (AutoresetMode.DISABLED, "next_step"),
                                             (AutoresetMode.SAME_STEP, AutoresetMode.NEXT_STEP)])
def test_an_autoreset_mode_the_envs_metadata_contradicts_is_refused(mode: AutoresetMode, given: object) -> None:
    # It was taken as given: NEXT_STEP envs recorded as DISABLED stored their reset steps (and got past the
    # RolloutBuffer's refusal of NEXT_STEP envs), DISABLED envs as NEXT_STEP lost each first step (helper 48).
    envs = make_envs(mode)
    buffers = [ReplayBuffer(10, obs_shape=(3,), action_shape=(), num_envs=NUM_ENVS),
               RolloutBuffer(4, NUM_ENVS, obs_shape=(3,), action_shape=())]
    for buffer in buffers:
        with pytest.raises(ConfigError, match=f"^autoreset_mode: envs.metadata says the envs reset in mode {mode.name}"):
            Recorder(envs, buffer, autoreset_mode=given)  # type: ignore[arg-type]
    assert Recorder(envs, buffers[0], autoreset_mode=mode.value).autoreset_mode is mode   # the same mode: fine
    envs.metadata = {**envs.metadata, "autoreset_mode": "same-step-ish"}   # names no mode rlbuf reads
    expected = given if isinstance(given, AutoresetMode) else AutoresetMode[str(given).upper()]
    assert Recorder(envs, buffers[0], autoreset_mode=given).autoreset_mode is expected  # type: ignore[arg-type]


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.DISABLED], ids=lambda m: m.name)
def test_torch_outputs_of_gymnasiums_torch_wrapper(mode: AutoresetMode) -> None:
    from gymnasium.wrappers.vector import NumpyToTorch

    envs = NumpyToTorch(make_envs(mode))
    buffer = build("replay", envs)
    drive(envs, buffer, as_torch=True)
    data = buffer.sample_all()
    assert (data.next_obs[:, 2] == data.obs[:, 2] + 1).all()
    check_episodes(data.obs.numpy())


@pytest.mark.parametrize("kind", ["replay", "rollout"])
def test_async_vector_env(kind: str) -> None:  # kept small: it starts processes
    envs = make_envs(AutoresetMode.SAME_STEP, vector="async")
    buffer = build(kind, envs, steps=12)
    drive(envs, buffer, steps=12)
    obs = buffer.sample_all().obs.numpy() if kind == "replay" else buffer.view("obs").numpy().reshape(-1, 3)
    check_episodes(obs)
    if kind == "replay":
        data = buffer.sample_all()
        assert (data.next_obs[:, 2] == data.obs[:, 2] + 1).all()


def test_sb3_vec_env() -> None:
    from stable_baselines3.common.vec_env import DummyVecEnv

    venv = DummyVecEnv([make(i) for i in range(NUM_ENVS)])
    buffer = ReplayBuffer(1000, observation_space=venv.observation_space, action_space=venv.action_space,
                          num_envs=NUM_ENVS)
    recorder = Recorder(venv, buffer, autoreset_mode="same_step")
    obs = venv.reset()
    for _ in range(STEPS):
        action = np.zeros(NUM_ENVS, np.int64)
        next_obs, reward, dones, infos = venv.step(action)
        recorder.record(obs, action, reward, next_obs, *sb3_step(dones, infos))
        obs = next_obs
    data = buffer.sample_all()
    assert len(buffer) == NUM_ENVS * STEPS
    assert (data.next_obs[:, 2] == data.obs[:, 2] + 1).all()
    check_transition_flags(data.obs.numpy(), data.reward.numpy(), data.terminated.numpy(), data.truncated.numpy())
    check_episodes(data.obs.numpy())


class IsaacStyleEnv:
    """Batched torch env in the Isaac Lab style: resets inside step, ``extras["time_outs"]``."""

    num_envs = NUM_ENVS

    def __init__(self) -> None:
        self.episode = torch.zeros(NUM_ENVS)
        self.step_count = torch.zeros(NUM_ENVS)
        self.limits = torch.tensor([float(time_limit(i)) for i in range(NUM_ENVS)])

    def obs(self) -> torch.Tensor:
        return torch.stack([torch.arange(NUM_ENVS, dtype=torch.float32), self.episode, self.step_count], 1)

    def step(self, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any], torch.Tensor]:
        self.step_count += 1
        terminated = torch.tensor([ends_by_termination(i, int(self.episode[i]), int(self.step_count[i]))
                                   for i in range(NUM_ENVS)])
        time_outs = (self.step_count >= self.limits) & ~terminated
        dones = terminated | time_outs
        final = self.obs()
        self.episode[dones] += 1
        self.step_count[dones] = 0
        return self.obs(), self.step_count.clone(), dones, {"time_outs": time_outs}, final


def test_isaac_style_env_with_its_final_observation() -> None:
    env = IsaacStyleEnv()
    buffer = RolloutBuffer(STEPS, NUM_ENVS, obs_shape=(3,), action_shape=())
    recorder = Recorder(env, buffer, bootstrap=lambda final: torch.tensor([code(o) for o in final]),
                        autoreset_mode="same_step")
    obs = env.obs()
    for _ in range(STEPS):
        next_obs, reward, dones, extras, final = env.step(torch.zeros(NUM_ENVS))
        reward = torch.where(dones, final[:, 2], reward)
        recorder.record(obs, torch.zeros(NUM_ENVS), reward, next_obs, *isaac_step(dones, extras, final_obs=final),
                        value=torch.zeros(NUM_ENVS), log_prob=torch.zeros(NUM_ENVS))
        obs = next_obs
    truncated, flat_obs = buffer.view("truncated"), buffer.view("obs").reshape(-1, 3).numpy()
    check_episodes(flat_obs)
    check_transition_flags(flat_obs, buffer.view("reward").reshape(-1).numpy(),
                           buffer.view("terminated").reshape(-1).numpy(), truncated.reshape(-1).numpy())
    for t, n in truncated.nonzero().tolist():
        env_id, episode, step = buffer.view("obs")[t, n].tolist()
        assert buffer.view("bootstrap_value")[t, n] == code((env_id, episode, step + 1))


def test_isaac_style_truncation_without_final_observation_is_refused() -> None:
    env = IsaacStyleEnv()
    buffer = RolloutBuffer(STEPS, NUM_ENVS, obs_shape=(3,), action_shape=())
    recorder = Recorder(env, buffer, bootstrap=lambda final: torch.zeros(len(final)), autoreset_mode="same_step")
    obs = env.obs()
    with pytest.raises(MissingFieldError, match="final_obs"):
        for _ in range(STEPS):
            next_obs, reward, dones, extras, _ = env.step(torch.zeros(NUM_ENVS))
            recorder.record(obs, torch.zeros(NUM_ENVS), reward, next_obs, *isaac_step(dones, extras),
                            value=torch.zeros(NUM_ENVS), log_prob=torch.zeros(NUM_ENVS))
            obs = next_obs


def test_env_mask_validates_every_row_and_stores_the_kept_ones() -> None:
    stats = EpisodeStats(3)
    buffer = ReplayBuffer(10, obs_shape=(2,), action_shape=(), action_dtype=torch.int64, num_envs=3, stats=stats)
    keep = np.array([True, False, True])
    buffer.add(np.arange(6, dtype=np.float32).reshape(3, 2), np.array([0, 1, 2]), np.ones(3), np.zeros((3, 2)),
               np.array([False, False, True]), env_mask=keep, truncated=False)
    assert buffer.sample_all().action.tolist() == [0, 2]
    assert stats.recent_lengths() == [1]
    with pytest.raises(ShapeError, match=r"obs: expected shape \(3, 2\), got \(3, 3\)"):
        buffer.add(np.zeros((3, 3)), np.zeros(3, np.int64), np.ones(3), np.zeros((3, 2)), np.zeros(3, bool),
                   env_mask=keep, truncated=False)
    with pytest.raises(ShapeError, match="env_mask: expected 3 bools"):
        buffer.add(np.zeros((3, 2)), np.zeros(3, np.int64), np.ones(3), np.zeros((3, 2)), np.zeros(3, bool),
                   env_mask=np.array([1, 0, 1]), truncated=False)
    assert len(buffer) == 2
    assert stats.recent_lengths() == [1]


def test_after_a_manual_reset_the_next_step_is_stored() -> None:
    envs = make_envs(AutoresetMode.NEXT_STEP)
    buffer = build("replay", envs)
    recorder = Recorder(envs, buffer)
    obs, _ = envs.reset(seed=0)
    actions = np.zeros(NUM_ENVS, np.int64)
    for _ in range(time_limit(0)):                    # env 0 reaches its time limit at the last step
        next_obs, reward, terminated, truncated, info = envs.step(actions)
        recorder.record(obs, actions, reward, next_obs, terminated, truncated, info)
        obs = next_obs
    assert truncated[0]
    obs, _ = envs.reset(seed=1)                       # gymnasium clears its pending autoresets
    recorder.reset()
    before = len(buffer)
    next_obs, reward, terminated, truncated, info = envs.step(actions)
    recorder.record(obs, actions, reward, next_obs, terminated, truncated, info)
    assert len(buffer) == before + NUM_ENVS
    data = buffer.sample_all()
    assert (data.next_obs[:, 2] == data.obs[:, 2] + 1).all()


class DictCountingEnv(CountingEnv):
    """CountingEnv with a dict observation: ``state`` (env, episode, step) and a tiny uint8 ``camera``."""

    observation_space = gym.spaces.Dict({"state": CountingEnv.observation_space,
                                         "camera": gym.spaces.Box(0, 255, (2, 2), np.uint8)})

    def _obs(self) -> dict[str, np.ndarray]:  # type: ignore[override]
        return {"state": super()._obs(), "camera": np.full((2, 2), self.step_count % 256, np.uint8)}


@pytest.mark.parametrize("kind", ["replay", "rollout", "distill"])
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.name)
def test_dict_observations_through_the_recorder(mode: AutoresetMode, kind: str) -> None:
    makers = [lambda i=i: gym.wrappers.TimeLimit(DictCountingEnv(i), max_episode_steps=time_limit(i))
              for i in range(NUM_ENVS)]
    envs = gym.vector.SyncVectorEnv(makers, autoreset_mode=mode)
    buffer = build(kind, envs)
    if kind == "rollout" and mode == AutoresetMode.NEXT_STEP:  # refused for every observation kind
        with pytest.raises(ConfigError, match="SAME_STEP"):
            Recorder(envs, buffer)
        return
    recorded = drive(envs, buffer)
    data = buffer.sample_all()
    state, camera = data.obs["state"].numpy(), data.obs["camera"].numpy()
    assert camera.dtype == np.uint8 and (camera[:, 0, 0] == state[:, 2] % 256).all()
    check_episodes(state)
    if kind == "replay":
        next_state = data.next_obs["state"].numpy()
        assert (next_state[:, :2] == state[:, :2]).all() and (next_state[:, 2] == state[:, 2] + 1).all()
        assert (data.next_obs["camera"][:, 0, 0].numpy() == next_state[:, 2] % 256).all()
    if kind == "rollout":
        truncated = data.truncated.numpy()
        assert truncated.any()
        assert (buffer.sample_all().extras["next_code"].numpy()[truncated] == 0).all()
    assert len(buffer) == NUM_ENVS * STEPS - recorded.skipped


@pytest.mark.parametrize(("terminated", "error", "message"), [
    (np.zeros(3, bool), ShapeError, r"terminated: expected shape \(2,\), got \(3,\)"),
    (["no", "yes"], DtypeError, "terminated: expected bool, int or float values"),
    ([[False], [True, False]], ShapeError, "terminated: expected a rectangular array"),
    (None, ShapeError, "terminated: expected a tensor, numpy array or number, got NoneType"),
])
def test_flags_the_recorder_cannot_read_are_refused_by_name_before_anything_is_stored(
        terminated: Any, error: type[Exception], message: str) -> None:
    class Envs:
        num_envs, metadata = 2, {"autoreset_mode": "same_step"}

    buffer = ReplayBuffer(10, obs_shape=(1,), action_shape=(), num_envs=2)
    recorder = Recorder(Envs(), buffer)
    with pytest.raises(error, match=message):
        recorder.record(np.zeros((2, 1)), np.zeros(2), np.ones(2), np.ones((2, 1)), terminated, np.zeros(2, bool))
    assert len(buffer) == 0


def test_info_passed_in_truncateds_place_is_named() -> None:
    class Envs:
        num_envs, metadata = 2, {"autoreset_mode": "same_step"}

    buffer = ReplayBuffer(10, obs_shape=(1,), action_shape=(), num_envs=2)
    recorder = Recorder(Envs(), buffer)
    with pytest.raises(MissingFieldError, match=r"truncated: got a dict .* was info passed in its place\? "
                                                r"record\(obs, action, reward, next_obs, terminated, truncated, info\)"):
        recorder.record(np.zeros((2, 1)), np.zeros(2), np.ones(2), np.ones((2, 1)), np.zeros(2, bool), {})
    assert len(buffer) == 0


def test_a_reset_in_the_middle_of_a_rollout_is_refused_while_an_episode_runs_on() -> None:
    """A rollout cannot end a running episode after the fact (its step would need a bootstrap value): refused,
    with the fix; between rollouts, or for envs whose newest step ended, it goes through."""
    envs = gym.make_vec("CartPole-v1", num_envs=2, vectorization_mode="sync",
                        vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP})
    buffer = RolloutBuffer(4, 2, observation_space=envs.single_observation_space,
                           action_space=envs.single_action_space)
    recorder = Recorder(envs, buffer, bootstrap=lambda obs: torch.zeros(len(obs)))
    recorder.reset()                                            # an empty rollout: nothing runs in it
    obs, _ = envs.reset(seed=0)
    for truncated in ([False, False], [False, True]):
        next_obs, reward, terminated, _, info = envs.step(np.zeros(2, np.int64))
        if truncated[1]:
            info = {"final_obs": np.array([None, next_obs[1]], dtype=object), "_final_obs": np.array([False, True])}
        recorder.record(obs, np.zeros(2, np.int64), reward, next_obs, terminated, np.array(truncated), info,
                        value=torch.zeros(2), log_prob=torch.zeros(2))
        obs = next_obs
    envs.reset(seed=1)
    with pytest.raises(StreamError, match=r"reset: env 0's episode runs on in the rollout \(its step 1 ended nothing\)"
                                          r".*truncated=True"):
        recorder.reset()
    recorder.reset(env_mask=np.array([False, True]))            # env 1's newest step ended its episode
    assert buffer.steps == 2
    envs.close()
