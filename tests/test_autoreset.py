"""ReplayBuffer.add at episode boundaries: truncated required, and gymnasium's NEXT_STEP reset steps warned."""

from __future__ import annotations

import warnings
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from _snapshot import same, snapshot
from tensordict import TensorDict

from rlbuf import (
    DistillationBuffer,
    MissingFieldError,
    NextStepResetWarning,
    ReplayBuffer,
    RlbufWarning,
    RolloutBuffer,
    ShapeError,
    Transition,
)
from rlbuf.gym import Recorder

N = 2


# -- truncated required ----------------------------------------------------------------------
def _replay(**options: Any) -> ReplayBuffer:
    return ReplayBuffer(100, obs_shape=(3,), action_shape=(), num_envs=N, seed=0, **options)


def _step(t: float = 0.0, *, terminated: Any = None) -> dict[str, Any]:
    return {"obs": torch.full((N, 3), t), "action": torch.zeros(N), "reward": torch.ones(N),
            "next_obs": torch.full((N, 3), t + 1),
            "terminated": torch.zeros(N, dtype=torch.bool) if terminated is None else terminated}


@pytest.mark.parametrize("how", ["positional", "keyword", "transition", "env_mask", "extras"])
def test_an_add_without_truncated_is_refused_with_the_fix_and_stores_nothing(how: str) -> None:
    buf = _replay(extra_fields={"cost": ((), torch.float32)}) if how == "extras" else _replay()
    step = _step()
    before = snapshot(buf)
    with pytest.raises(MissingFieldError) as error:
        if how == "positional":  # CleanRL's add(obs, action, reward, next_obs, done)
            buf.add(*step.values())
        elif how == "keyword":
            buf.add(**step)
        elif how == "transition":
            buf.add(Transition(*step.values()))
        elif how == "env_mask":
            buf.add(**step, env_mask=np.ones(N, bool))
        else:
            buf.add(**step, cost=torch.zeros(N))
    message = str(error.value)
    assert message.startswith("truncated: required with every step")
    assert "truncated=False" in message and "truncated=truncations" in message and "done is not terminated" in message
    assert same(before, snapshot(buf))


def test_positional_calls_passing_both_flags_and_truncated_false_for_every_env_work() -> None:
    buf = _replay()
    step = _step(terminated=torch.tensor([True, False]))
    buf.add(*step.values(), torch.tensor([False, True]))
    buf.add(Transition(*_step(5.0).values(), False))
    buf.add(**_step(7.0), truncated=False)  # one False for every env
    batch = buf.sample_all()
    assert batch.truncated.tolist() == [False, True, False, False, False, False]
    assert batch.done.tolist() == [True, True, False, False, False, False]


def test_the_done_keyword_still_gets_its_own_answer() -> None:
    step = _step()
    step["done"] = step.pop("terminated")
    with pytest.raises(MissingFieldError, match=r"^done: not a field of this buffer"):
        _replay().add(**step)


def test_a_rollout_add_without_truncated_is_refused_with_the_fix() -> None:
    buf = RolloutBuffer(4, N, obs_shape=(3,), action_shape=())
    args = (torch.zeros(N, 3), torch.zeros(N), torch.ones(N), torch.zeros(N, dtype=torch.bool), torch.zeros(N),
            torch.zeros(N))
    with pytest.raises(MissingFieldError, match=r"^truncated: required with every step: pass truncated=False"):
        buf.add(*args)
    assert buf.steps == 0
    buf.add(*args, truncated=False)
    buf.add(*args, torch.zeros(N, dtype=torch.bool))
    assert buf.steps == 2 and not buf.view("truncated")[:2].any()


# -- NEXT_STEP reset steps -------------------------------------------------------------------
def _pendulum_loop(envs: Any, buf: Any, steps: int, *, final_obs: bool = False, recorder: Any = None) -> None:
    """The README's loop (or SAME_STEP's, storing info["final_obs"] as next_obs, or the Recorder's)."""
    obs, _ = envs.reset(seed=0)
    envs.action_space.seed(0)
    for _ in range(steps):
        action = envs.action_space.sample()
        next_obs, reward, terminated, truncated, info = envs.step(action)
        if recorder is not None:
            recorder.record(obs, action, reward, next_obs, terminated, truncated, info)
        else:
            real_next = next_obs
            if final_obs and "_final_obs" in info:
                real_next = next_obs.copy()
                real_next[info["_final_obs"]] = np.stack(info["final_obs"][info["_final_obs"]])
            buf.add(obs, action, reward, real_next, terminated=terminated, truncated=truncated)
        obs = next_obs


def _pendulum(**kwargs: Any) -> tuple[Any, ReplayBuffer]:
    envs = gym.make_vec("Pendulum-v1", num_envs=4, **kwargs)
    buf = ReplayBuffer(2_000, observation_space=envs.single_observation_space,
                       action_space=envs.single_action_space, num_envs=4)
    return envs, buf


@pytest.mark.parametrize("way", ["readme", "recorder", "same_step", "same_step_without_final_obs"])
def test_gymnasiums_default_next_step_loop_warns_once_and_the_right_loops_do_not(way: str) -> None:
    kwargs = {} if not way.startswith("same_step") else {"vectorization_mode": "sync", "vector_kwargs": {
        "autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}}
    envs, buf = _pendulum(**kwargs)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _pendulum_loop(envs, buf, 410, final_obs=way == "same_step",
                       recorder=Recorder(envs, buf) if way == "recorder" else None)
    ours = [w for w in caught if issubclass(w.category, RlbufWarning)]
    if way in ("readme", "same_step_without_final_obs"):
        assert len(ours) == 1 and ours[0].category is NextStepResetWarning  # two episode ends: warned once
        message = str(ours[0].message)
        assert "env 0" in message and ("NEXT_STEP" if way == "readme" else "SAME_STEP") in message
        assert "rlbuf.gym.Recorder" in message
        assert ("env_mask=" if way == "readme" else "info['final_obs']") in message
        assert ours[0].filename == __file__  # points at the user's add
    else:
        assert ours == []
    envs.close()


def test_the_warning_made_an_error_refuses_the_add_and_stores_nothing() -> None:
    envs, buf = _pendulum()
    with warnings.catch_warnings():
        warnings.simplefilter("error", NextStepResetWarning)
        with pytest.raises(NextStepResetWarning):
            _pendulum_loop(envs, buf, 410)
        assert len(buf) == 200 * 4  # the 200 steps of the first episodes, not the reset step
        before = snapshot(buf)
        obs = buf.sample_all().next_obs[-4:].numpy()  # each env's final observation: the reset step again
        with pytest.raises(NextStepResetWarning):
            buf.add(obs, np.zeros((4, 1), np.float32), np.zeros(4), obs + 1, np.zeros(4, bool), np.zeros(4, bool))
        assert same(before, snapshot(buf))
    envs.close()


def _layouts() -> dict[str, tuple[dict[str, Any], Any]]:
    """Buffer options, and how one observation row is made from a number."""
    flat = lambda v: torch.full((N, 3), float(v))  # noqa: E731
    return {
        "plain": ({"obs_shape": (3,)}, flat),
        "compact": ({"obs_shape": (3,), "compact": True}, flat),
        "n_step": ({"obs_shape": (3,), "n_step": 3}, flat),
        "dict": ({"obs_shape": {"a": (3,), "b": {"c": ()}}}, lambda v: {"a": flat(v), "b": {"c": torch.full((N,), float(v))}}),
        "extras": ({"obs_shape": (3,), "extra_fields": {"cost": ((), torch.float32)}}, flat),
        "hidden": ({"obs_shape": (3,), "hidden_state_shape": 4}, flat),
    }


@pytest.mark.parametrize("layout", list(_layouts()))
@pytest.mark.parametrize("how", ["fields", "transition", "env_mask"])
def test_every_layout_warns_at_the_reset_step(layout: str, how: str) -> None:
    options, make_obs = _layouts()[layout]
    buf = ReplayBuffer(100, action_shape=(), num_envs=N, **options)
    obs_of = make_obs

    extras = {"cost": torch.zeros(N)} if layout == "extras" else {}
    if layout == "hidden":
        extras["hidden_state"] = torch.zeros(N, 4)

    def add(o: float, next_o: float, reward: float, ended: list[bool]) -> None:
        fields = (obs_of(o), torch.zeros(N), torch.full((N,), reward), obs_of(next_o),
                  torch.tensor(ended), torch.zeros(N, dtype=torch.bool))
        if how == "transition":
            hidden = {"hidden_state": extras["hidden_state"]} if "hidden_state" in extras else {}
            buf.add(Transition(*fields, {**{k: v for k, v in extras.items() if k != "hidden_state"}, **hidden}))
        else:
            buf.add(*fields, **extras, **({"env_mask": np.ones(N, bool)} if how == "env_mask" else {}))

    with warnings.catch_warnings():
        warnings.simplefilter("error", NextStepResetWarning)
        add(0, 1, 1.0, [False, False])
        add(1, 2, 1.0, [True, True])  # both end: their final observation is 2
        add(7, 3, 1.0, [False, False])  # both from a reset observation (7, SAME_STEP's next step): real steps
        add(3, 4, 0.0, [False, True])  # env 1 ends at 4
        before = snapshot(buf)
        with pytest.raises(NextStepResetWarning, match="env 1's obs is the next_obs of its previous row"):
            add(4, 9, 0.0, [False, False])  # env 1: from its final 4 to a reset 9, reward 0: NEXT_STEP's reset step
        assert same(before, snapshot(buf))


def test_a_frame_stack_buffer_warns_before_its_stream_check() -> None:
    def stack(older: float, newest: float) -> torch.Tensor:
        return torch.tensor([[older] * 3, [newest] * 3], dtype=torch.float32)

    buf = ReplayBuffer(100, obs_shape=(2, 3), frame_stack=2, action_shape=())
    buf.add(stack(0, 0), 0.0, 1.0, stack(0, 1), terminated=False, truncated=False)
    buf.add(stack(0, 1), 0.0, 1.0, stack(1, 2), terminated=False, truncated=True)
    before = snapshot(buf)
    with warnings.catch_warnings():
        warnings.simplefilter("error", NextStepResetWarning)
        with pytest.raises(NextStepResetWarning, match="env 0"):  # said first: the fix, not only a stream error
            buf.add(stack(1, 2), 0.0, 0.0, stack(5, 5), terminated=False, truncated=False)
    assert same(before, snapshot(buf))
    buf.add(stack(5, 5), 0.0, 1.0, stack(5, 6), terminated=False, truncated=False)  # the new episode
    assert len(buf) == 3


def test_rows_left_out_by_env_mask_do_not_count_as_stored() -> None:
    buf = _replay()
    no_flags = torch.zeros(N, dtype=torch.bool)
    with warnings.catch_warnings():
        warnings.simplefilter("error", NextStepResetWarning)
        buf.add(**_step(0.0, terminated=torch.tensor([True, True])), truncated=False)  # both end, final obs 1
        # Env 0's NEXT_STEP reset step (from its final observation) left out, as the Recorder and the docs do;
        # env 1 left out with another observation (an env that did not step): no warning, nothing stored.
        buf.add(torch.tensor([[1.0] * 3, [7.0] * 3]), torch.zeros(N), torch.zeros(N), torch.full((N, 3), 9.0),
                no_flags, False, env_mask=np.zeros(N, bool))
        # Env 0 from its reset observation, which equals its final one (Breakout's after a life loss): its reset
        # step was left out, so this is no reset step. Env 1 left out again, still not stepped.
        buf.add(torch.tensor([[1.0] * 3, [7.0] * 3]), torch.zeros(N), torch.zeros(N), torch.full((N, 3), 10.0),
                no_flags, False, env_mask=np.array([True, False]))
        # Env 1's last stored row still ended with final observation 1, and no reset step of it was left out.
        with pytest.raises(NextStepResetWarning, match="env 1"):
            buf.add(torch.ones(N, 3), torch.zeros(N), torch.zeros(N), torch.full((N, 3), 9.0), no_flags, False)
    assert len(buf) == 3


def test_a_refused_add_that_leaves_a_reset_step_out_keeps_its_env_watched() -> None:
    buf = _replay()
    no_flags = torch.zeros(N, dtype=torch.bool)
    buf.add(**_step(0.0, terminated=torch.tensor([True, True])), truncated=False)  # final obs 1
    with pytest.raises(ShapeError):  # a reset step left out, in an add refused for its action
        buf.add(torch.ones(N, 3), torch.zeros(N, 5), torch.zeros(N), torch.full((N, 3), 9.0), no_flags, False,
                env_mask=np.zeros(N, bool))
    with pytest.warns(NextStepResetWarning, match="env 0"):  # so the reset step stored next is still caught
        buf.add(torch.ones(N, 3), torch.zeros(N), torch.zeros(N), torch.full((N, 3), 9.0), no_flags, False)


@pytest.mark.parametrize("masked", [False, True])
def test_an_add_refused_after_its_warning_leaves_the_watch_on(masked: bool) -> None:
    """The plain layout's add and the others' (``env_mask``): warned once per buffer, of an add that stored."""
    buf = _replay()
    no_flags = torch.zeros(N, dtype=torch.bool)
    mask = {"env_mask": np.ones(N, bool)} if masked else {}
    buf.add(**_step(0.0, terminated=torch.tensor([True, True])), truncated=False)  # final obs 1
    with pytest.warns(NextStepResetWarning), pytest.raises(ShapeError):  # the reset step, refused for its action
        buf.add(torch.ones(N, 3), torch.zeros(N, 5), torch.zeros(N), torch.full((N, 3), 9.0), no_flags, False, **mask)
    assert len(buf) == N
    with pytest.warns(NextStepResetWarning, match="env 0"):
        buf.add(torch.ones(N, 3), torch.zeros(N), torch.zeros(N), torch.full((N, 3), 9.0), no_flags, False, **mask)
    assert len(buf) == 2 * N


def test_an_equal_observation_with_a_reward_or_after_no_end_is_no_reset_step() -> None:
    buf = _replay()
    with warnings.catch_warnings():
        warnings.simplefilter("error", NextStepResetWarning)
        buf.add(**_step(0.0), truncated=False)
        buf.add(**_step(1.0), truncated=False)  # obs == the previous next_obs, as in every episode
        buf.add(**_step(2.0, terminated=torch.tensor([True, True])), truncated=False)
        # Same obs as the final one, but reward 1: a real step from the ended row's next_obs. Once (two envs'
        # ends), as a discrete env may restart where it ended: not warned.
        buf.add(**_step(3.0), truncated=False)
        buf.add(**_step(4.0, terminated=torch.tensor([True, False])), truncated=False)
        # A third end whose next start came from its next_obs: at every end so far, so those next_obs were reset
        # observations (SAME_STEP's next_obs without info["final_obs"]): warned, before anything is stored.
        with pytest.raises(NextStepResetWarning, match="env 0's obs is the next_obs of its previous row, which ended "
                                                       "an episode, as at every one of the 3 episode ends so far"):
            buf.add(**_step(5.0), truncated=False)
    assert len(buf) == 10


def test_a_start_from_a_new_observation_after_an_end_ends_the_same_step_suspicion() -> None:
    buf = _replay()
    with warnings.catch_warnings():
        warnings.simplefilter("error", NextStepResetWarning)
        buf.add(**_step(0.0, terminated=torch.tensor([True, True])), truncated=False)
        buf.add(**_step(7.0), truncated=False)  # both start from a reset observation (7, not the final 1)
        for t in (8.0, 10.0, 12.0):             # then every end's next start equals its next_obs: not every end
            buf.add(**_step(t, terminated=torch.tensor([True, True])), truncated=False)
            buf.add(**_step(t + 1.0), truncated=False)
    assert len(buf) == 16


@pytest.mark.parametrize("reset", ["clear", "extend"])
def test_clear_and_extend_forget_the_last_rows(reset: str) -> None:
    buf = _replay()
    buf.add(**_step(0.0, terminated=torch.tensor([True, True])), truncated=False)
    if reset == "clear":
        buf.clear()
    else:
        buf.extend(TensorDict({"observation": torch.zeros(N, 3), "action": torch.zeros(N),
                               "next": {"observation": torch.full((N, 3), 5.0), "reward": torch.zeros(N, 1),
                                        "terminated": torch.zeros(N, 1, dtype=torch.bool),
                                        "truncated": torch.zeros(N, 1, dtype=torch.bool)}}, batch_size=[N]))
    with warnings.catch_warnings():
        warnings.simplefilter("error", NextStepResetWarning)
        buf.add(torch.ones(N, 3), torch.zeros(N), torch.zeros(N), torch.full((N, 3), 9.0),
                torch.zeros(N, dtype=torch.bool), False)


def test_a_distillation_buffer_has_no_flags_to_tell_a_reset_step() -> None:
    buf = DistillationBuffer(10, obs_shape=(3,), action_shape=())
    with warnings.catch_warnings():
        warnings.simplefilter("error", RlbufWarning)
        buf.add(torch.ones(3), 0.0)
        buf.add(torch.ones(3), 0.0)  # the same observation again: a duplicate row, labelled by the expert
    assert len(buf) == 2
