"""rlbuf.GAE, the TorchRL transform: equal to compute_gae, keys, time layouts, errors, as a collector postproc."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from test_gae import make_rollout, next_values, run_gae

from rlbuf.errors import (
    ConfigError,
    MissingFieldError,
    ShapeError,
)
from rlbuf.gae import GAE, compute_gae

# ----------------------------------------------------------------------------- the transform


def torchrl_rollout(ro: dict[str, torch.Tensor], *, trailing: bool = True) -> TensorDict:
    """``ro`` ([T, N]) as a TorchRL rollout: batch [N, T], entries [N, T, 1]."""

    def lay(x: torch.Tensor) -> torch.Tensor:
        x = x.t().contiguous()
        return x.unsqueeze(-1) if trailing else x

    num_steps, num_envs = ro["reward"].shape
    return TensorDict(
        {
            "state_value": lay(ro["value"]),
            "next": {
                "reward": lay(ro["reward"]),
                "state_value": lay(next_values(ro)),
                "terminated": lay(ro["terminated"]),
                "truncated": lay(ro["truncated"]),
                "done": lay(ro["terminated"] | ro["truncated"]),
            },
        },
        batch_size=[num_envs, num_steps],
    )


@pytest.mark.parametrize("trailing", [True, False])
def test_transform_equals_compute_gae(trailing: bool) -> None:
    ro = make_rollout(16, 4, seed=5, dtype=torch.float32)
    td = GAE(gamma=0.99, lmbda=0.95)(torchrl_rollout(ro, trailing=trailing))
    advantage, returns = run_gae(ro, 0.99, 0.95)
    shape = (4, 16, 1) if trailing else (4, 16)
    assert td["advantage"].shape == td["value_target"].shape == shape
    torch.testing.assert_close(td["advantage"].reshape(4, 16).t(), advantage)
    torch.testing.assert_close(td["value_target"].reshape(4, 16).t(), returns)


def test_transform_keys_time_first_and_forward() -> None:
    ro = make_rollout(10, 3, seed=6)
    td = torchrl_rollout(ro)
    td_time_first = TensorDict(
        {k: v.transpose(0, 1) for k, v in td.items(include_nested=True, leaves_only=True)}, batch_size=[10, 3]
    )
    gae = GAE(0.9, 0.8, value_key="state_value", advantage_key="adv", value_target_key="ret", time_dim=0)
    out = gae.forward(td_time_first)
    advantage, returns = run_gae(ro, 0.9, 0.8)
    torch.testing.assert_close(out["adv"].squeeze(-1), advantage)
    torch.testing.assert_close(out["ret"].squeeze(-1), returns)


def test_transform_derives_truncated_from_done_and_handles_one_env() -> None:
    ro = make_rollout(12, 1, seed=8)
    td = torchrl_rollout(ro)[0]  # batch [T]
    del td["next", "truncated"]
    out = GAE(0.95, 0.9)(td)
    advantage, _ = run_gae(ro, 0.95, 0.9)
    torch.testing.assert_close(out["advantage"].squeeze(-1), advantage[:, 0])


@pytest.mark.parametrize("kept", [("truncated", "done"), ("done",), ("truncated",), ()])
def test_transform_refuses_a_rollout_without_terminated(kept: tuple[str, ...]) -> None:
    # done folds time limits into terminations, and done & ~truncated would take a step that did both
    # for a timeout: as RolloutBuffer.extend, the transform asks for terminated instead of guessing.
    td = torchrl_rollout(make_rollout(6, 2, seed=3))
    for name in ("terminated", "truncated", "done"):
        if name not in kept:
            del td["next", name]
    with pytest.raises(MissingFieldError, match=r"terminated: GAE needs key \('next', 'terminated'\)"):
        GAE(0.9, 0.9)(td)
    assert td.get("advantage", None) is None


def test_transform_refuses_a_rollout_without_truncated_or_done() -> None:
    td = torchrl_rollout(make_rollout(6, 2, seed=3))
    del td["next", "truncated"], td["next", "done"]
    with pytest.raises(MissingFieldError, match=r"no \('next', 'truncated'\) and no \('next', 'done'\)"):
        GAE(0.9, 0.9)(td)
    assert td.get("advantage", None) is None


@pytest.mark.parametrize("step_flag", [True, False])
def test_transform_refuses_done_that_is_not_terminated_or_truncated(step_flag: bool) -> None:
    ro = make_rollout(6, 2, seed=3)
    td = torchrl_rollout(ro)
    ends = (ro["terminated"] | ro["truncated"]).t()
    env, step = (ends if not step_flag else ~ends).nonzero()[0].tolist()
    td["next", "done"][env, step] = step_flag
    with pytest.raises(ConfigError, match=f"done: key \\('next', 'done'\\) is {step_flag} at batch index \\({env}, {step}\\)"):
        GAE(0.9, 0.9)(td)
    assert td.get("advantage", None) is None


def test_transform_errors_name_the_key() -> None:
    td = torchrl_rollout(make_rollout(5, 2))
    del td["next", "state_value"]
    with pytest.raises(MissingFieldError, match=r"\('next', 'state_value'\): required by GAE"):
        GAE(0.9, 0.9)(td)
    td = torchrl_rollout(make_rollout(5, 2))
    td["state_value"] = torch.zeros(2, 5, 2)
    with pytest.raises(ShapeError, match=r"'state_value': expected shape \(2, 5\) or \(2, 5, 1\), got \(2, 5, 2\)"):
        GAE(0.9, 0.9)(td)
    with pytest.raises(ShapeError, match="expected batch"):
        GAE(0.9, 0.9)(TensorDict({}, batch_size=[2, 3, 4]))
    with pytest.raises(ConfigError, match="lmbda: expected a float in"):
        GAE(0.9, 2.0)
    with pytest.raises(ConfigError, match="works on whole rollouts"):
        GAE(0.9, 0.9)._call(td)


def test_transform_as_collector_postproc() -> None:
    from tensordict.nn import TensorDictModule
    from torchrl.collectors import Collector
    from torchrl.envs import GymEnv, SerialEnv, StepCounter, TransformedEnv

    torch.manual_seed(0)
    value_net = TensorDictModule(torch.nn.Linear(4, 1), in_keys=["observation"], out_keys=["state_value"])
    gae = GAE(gamma=0.9, lmbda=0.8)

    def postproc(td: TensorDict) -> TensorDict:
        # The collector leaves ("next", "observation") as the final observation of an episode
        # that ended, so its value is the right bootstrap for a timeout.
        with torch.no_grad():
            value_net(td)
            value_net(td["next"])
        return gae(td)

    def make_env() -> TransformedEnv:
        return TransformedEnv(GymEnv("CartPole-v1"), StepCounter(max_steps=7))  # timeouts at 7

    env = SerialEnv(2, make_env)
    env.set_seed(0)
    collector = Collector(env, None, frames_per_batch=40, total_frames=40, postproc=postproc)
    try:
        td = next(iter(collector))
    finally:
        collector.shutdown()
    assert td.batch_size == (2, 20)
    assert td["next", "truncated"].any()
    advantage, returns = compute_gae(
        td["next", "reward"].squeeze(-1), td["state_value"].squeeze(-1),
        td["next", "terminated"].squeeze(-1), td["next", "truncated"].squeeze(-1), None,
        gamma=0.9, gae_lambda=0.8, next_value=td["next", "state_value"].squeeze(-1), time_dim=1,
    )
    torch.testing.assert_close(td["advantage"].squeeze(-1), advantage)
    torch.testing.assert_close(td["value_target"].squeeze(-1), returns)
