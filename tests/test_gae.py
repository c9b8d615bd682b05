"""GAE: timeouts bootstrap, terminations don't, the trace stops at both; both layouts, both backends."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlbuf import gae as gae_module
from rlbuf.errors import (
    ConfigError,
    DeviceError,
    DtypeError,
    NonFiniteError,
    ShapeError,
)
from rlbuf.gae import compute_gae

BACKENDS = ["torch", "numba"]
TOL = {"rtol": 1e-5, "atol": 1e-5}


def reference_gae(
    reward: np.ndarray,
    value: np.ndarray,
    terminated: np.ndarray,
    truncated: np.ndarray | None,
    last_value: np.ndarray,
    bootstrap_value: np.ndarray | None,
    gamma: float,
    lam: float,
) -> tuple[np.ndarray, np.ndarray]:
    """The definition, one step at a time, in float64, on ``[T, N]`` arrays."""
    num_steps, num_envs = reward.shape
    advantage = np.zeros((num_steps, num_envs))
    last = np.zeros(num_envs)
    for t in reversed(range(num_steps)):
        next_v = last_value if t == num_steps - 1 else value[t + 1]
        done = terminated[t]
        if truncated is not None:
            assert bootstrap_value is not None
            next_v = np.where(truncated[t], bootstrap_value[t], next_v)
            done = terminated[t] | truncated[t]
        delta = reward[t] + gamma * next_v * (1 - terminated[t]) - value[t]
        last = delta + gamma * lam * (1 - done) * last
        advantage[t] = last
    return advantage, advantage + value


def make_rollout(
    num_steps: int,
    num_envs: int,
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
    p_term: float = 0.1,
    p_trunc: float = 0.1,
) -> dict[str, torch.Tensor]:
    """A ``[T, N]`` rollout; bootstrap values are NaN where not truncated (they must not be read)."""
    gen = torch.Generator().manual_seed(seed)
    truncated = torch.rand(num_steps, num_envs, generator=gen) < p_trunc
    bootstrap = torch.randn(num_steps, num_envs, generator=gen, dtype=dtype)
    return {
        "reward": torch.randn(num_steps, num_envs, generator=gen, dtype=dtype),
        "value": torch.randn(num_steps, num_envs, generator=gen, dtype=dtype),
        "terminated": torch.rand(num_steps, num_envs, generator=gen) < p_term,
        "truncated": truncated,
        "last_value": torch.randn(num_envs, generator=gen, dtype=dtype),
        "bootstrap_value": torch.where(truncated, bootstrap, torch.nan),
    }


def reference_of(ro: dict[str, torch.Tensor], gamma: float, lam: float) -> tuple[np.ndarray, np.ndarray]:
    f64 = {k: v.double().numpy() if v.is_floating_point() else v.numpy() for k, v in ro.items()}
    return reference_gae(
        f64["reward"], f64["value"], f64["terminated"], f64["truncated"], f64["last_value"],
        f64["bootstrap_value"], gamma, lam,
    )


def run_gae(
    ro: dict[str, torch.Tensor], gamma: float, lam: float, *, time_dim: int = 0, backend: str = "torch", **extra: object
) -> tuple[torch.Tensor, torch.Tensor]:
    """compute_gae on ``ro`` in the requested layout; outputs returned as ``[T, N]``."""

    def lay(x: torch.Tensor | None) -> torch.Tensor | None:
        return x if x is None or time_dim == 0 else x.t().contiguous()

    kwargs = {k: lay(v) if isinstance(v, torch.Tensor) else v for k, v in extra.items()}
    if "bootstrap_value" not in kwargs:
        kwargs["bootstrap_value"] = lay(ro.get("bootstrap_value"))
    advantage, returns = compute_gae(
        lay(ro["reward"]), lay(ro["value"]), lay(ro["terminated"]), lay(ro.get("truncated")),
        ro["last_value"], gamma=gamma, gae_lambda=lam, time_dim=time_dim, backend=backend, **kwargs,
    )
    if time_dim != 0:
        advantage, returns = advantage.t(), returns.t()
    return advantage, returns


def next_values(ro: dict[str, torch.Tensor]) -> torch.Tensor:
    nxt = torch.cat([ro["value"][1:], ro["last_value"][None]])
    return torch.where(ro["truncated"], ro["bootstrap_value"], nxt)


# ----------------------------------------------------------------------------- against the definition


@settings(max_examples=60, deadline=None)
@given(
    num_steps=st.integers(1, 40),
    num_envs=st.integers(1, 12),
    seed=st.integers(0, 2**31 - 1),
    p_term=st.sampled_from([0.0, 0.05, 0.3]),
    p_trunc=st.sampled_from([0.0, 0.05, 0.3]),
    gamma=st.floats(0.0, 1.0),
    lam=st.floats(0.0, 1.0),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    time_dim=st.sampled_from([0, 1, -1]),
    backend=st.sampled_from(BACKENDS),
)
def test_matches_reference(
    num_steps: int, num_envs: int, seed: int, p_term: float, p_trunc: float, gamma: float,
    lam: float, dtype: torch.dtype, time_dim: int, backend: str,
) -> None:
    ro = make_rollout(num_steps, num_envs, seed=seed, dtype=dtype, p_term=p_term, p_trunc=p_trunc)
    adv_ref, ret_ref = reference_of(ro, gamma, lam)
    advantage, returns = run_gae(ro, gamma, lam, time_dim=time_dim, backend=backend)
    assert advantage.dtype == returns.dtype == dtype
    np.testing.assert_allclose(advantage.double().numpy(), adv_ref, **TOL)
    np.testing.assert_allclose(returns.double().numpy(), ret_ref, **TOL)
    assert torch.equal(returns, advantage + ro["value"])
    # next_value built from the same values gives the same answer.
    nxt_adv, _ = run_gae(ro, gamma, lam, time_dim=time_dim, backend=backend, next_value=next_values(ro))
    torch.testing.assert_close(nxt_adv, advantage, rtol=1e-6, atol=1e-6)


@settings(max_examples=30, deadline=None)
@given(
    num_steps=st.integers(1, 70),
    num_envs=st.integers(1, 5),
    seed=st.integers(0, 2**31 - 1),
    lam=st.floats(0.0, 1.0),
)
def test_step_scan_and_doubling_scan_agree(num_steps: int, num_envs: int, seed: int, lam: float) -> None:
    gen = torch.Generator().manual_seed(seed)
    delta = torch.randn(num_steps, num_envs, generator=gen, dtype=torch.float64)
    trace = (torch.rand(num_steps, num_envs, generator=gen) > 0.2).double() * 0.99 * lam
    steps = gae_module._scan_steps(delta.clone(), trace)
    doubling = gae_module._scan_doubling(delta.clone(), trace)
    torch.testing.assert_close(doubling, steps, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("time_dim", [0, 1])
@pytest.mark.parametrize("num_steps,num_envs", [(24, 300), (300, 3), (64, 64)])
def test_numba_and_torch_paths_agree(time_dim: int, num_steps: int, num_envs: int) -> None:
    for dtype in (torch.float32, torch.float64):
        ro = make_rollout(num_steps, num_envs, seed=num_steps, dtype=dtype)
        compiled = run_gae(ro, 0.99, 0.95, time_dim=time_dim, backend="numba")
        eager = run_gae(ro, 0.99, 0.95, time_dim=time_dim, backend="torch")
        torch.testing.assert_close(compiled, eager, rtol=1e-6 if dtype == torch.float32 else 1e-12, atol=1e-6)
        if dtype == torch.float64:  # the kernel's float64 loop rounds exactly like the definition
            np.testing.assert_allclose(compiled[0].numpy(), reference_of(ro, 0.99, 0.95)[0], rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize("backend", BACKENDS)
def test_reads_any_strides(backend: str) -> None:
    ro = make_rollout(30, 20, seed=3)
    adv_ref, ret_ref = reference_of(ro, 0.9, 0.8)
    # Every input a strided view: every other column of a wider tensor, or a transpose.
    wide = {k: torch.repeat_interleave(v, 2, dim=-1)[..., ::2] for k, v in ro.items()}
    wide["reward"] = ro["reward"].t().contiguous().t()
    advantage, returns = compute_gae(
        wide["reward"], wide["value"], wide["terminated"], wide["truncated"], wide["last_value"],
        gamma=0.9, gae_lambda=0.8, bootstrap_value=wide["bootstrap_value"], backend=backend,
    )
    np.testing.assert_allclose(advantage.numpy(), adv_ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(returns.numpy(), ret_ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_outputs_follow_the_input_layout(backend: str) -> None:
    ro = make_rollout(5, 3, dtype=torch.float32)
    for time_dim, shape in ((0, (5, 3)), (1, (3, 5)), (-1, (3, 5))):
        lay = (lambda x: x) if time_dim == 0 else (lambda x: x.t().contiguous())
        value = lay(ro["value"]).requires_grad_()
        advantage, returns = compute_gae(
            lay(ro["reward"]), value, lay(ro["terminated"]), lay(ro["truncated"]), ro["last_value"],
            gamma=0.99, gae_lambda=0.95, bootstrap_value=lay(ro["bootstrap_value"]),
            time_dim=time_dim, backend=backend,
        )
        for out in (advantage, returns):
            assert out.shape == shape and out.is_contiguous() and out.dtype == torch.float32
            assert not out.requires_grad


# ----------------------------------------------------------------------------- against other libraries


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("time_dim", [0, 1])
def test_matches_torchrl_given_the_same_next_values(backend: str, time_dim: int) -> None:
    from torchrl.objectives.value.functional import generalized_advantage_estimate

    ro = make_rollout(33, 6, seed=7, p_term=0.1, p_trunc=0.1)
    advantage, returns = run_gae(ro, 0.97, 0.9, time_dim=time_dim, backend=backend)
    # TorchRL: [T, N] read as [time, features] with time_dim=-2; done ends the trace,
    # terminated drops the bootstrap. (It rounds gamma * (1 - flag) to float32, hence TOL.)
    adv_rl, ret_rl = generalized_advantage_estimate(
        0.97, 0.9, ro["value"], next_values(ro), ro["reward"],
        ro["terminated"] | ro["truncated"], ro["terminated"],
    )
    torch.testing.assert_close(advantage, adv_rl, **TOL)
    torch.testing.assert_close(returns, ret_rl, **TOL)


def no_truncation_rollout(seed: int) -> dict[str, torch.Tensor]:
    ro = make_rollout(20, 5, seed=seed, dtype=torch.float32, p_term=0.15, p_trunc=0.0)
    del ro["truncated"], ro["bootstrap_value"]
    return ro


@pytest.mark.parametrize("backend", BACKENDS)
def test_matches_stable_baselines3_without_truncation(backend: str) -> None:
    import gymnasium as gym
    from stable_baselines3.common.buffers import RolloutBuffer

    ro = no_truncation_rollout(seed=11)
    num_steps, num_envs = ro["reward"].shape
    box = gym.spaces.Box(-1.0, 1.0, (1,))
    buf = RolloutBuffer(num_steps, box, box, device="cpu", gae_lambda=0.95, gamma=0.99, n_envs=num_envs)
    terminated = ro["terminated"].numpy()
    buf.rewards[:] = ro["reward"].numpy()
    buf.values[:] = ro["value"].numpy()
    buf.episode_starts[1:] = terminated[:-1]  # SB3 marks the step after the end
    buf.compute_returns_and_advantage(ro["last_value"].clone(), terminated[-1])
    advantage, returns = run_gae(ro, 0.99, 0.95, backend=backend, bootstrap_value=None)
    np.testing.assert_allclose(advantage.numpy(), buf.advantages, **TOL)
    np.testing.assert_allclose(returns.numpy(), buf.returns, **TOL)


def cleanrl_gae(
    rewards: torch.Tensor, values: torch.Tensor, dones: torch.Tensor, next_value: torch.Tensor,
    next_done: torch.Tensor, gamma: float, gae_lambda: float,
) -> torch.Tensor:
    """CleanRL's ppo.py loop; ``dones[t]`` says the observation at ``t`` starts a new episode."""
    num_steps = rewards.shape[0]
    advantages = torch.zeros_like(rewards)
    lastgaelam = 0
    for t in reversed(range(num_steps)):
        if t == num_steps - 1:
            nextnonterminal = 1.0 - next_done
            nextvalues = next_value
        else:
            nextnonterminal = 1.0 - dones[t + 1]
            nextvalues = values[t + 1]
        delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
        advantages[t] = lastgaelam = delta + gamma * gae_lambda * nextnonterminal * lastgaelam
    return advantages


@pytest.mark.parametrize("backend", BACKENDS)
def test_matches_cleanrl_without_truncation(backend: str) -> None:
    ro = no_truncation_rollout(seed=12)
    terminated = ro["terminated"].float()
    dones = torch.cat([torch.zeros_like(terminated[:1]), terminated[:-1]])
    expected = cleanrl_gae(
        ro["reward"], ro["value"], dones, ro["last_value"], terminated[-1], gamma=0.99, gae_lambda=0.95
    )
    advantage, _ = run_gae(ro, 0.99, 0.95, backend=backend, bootstrap_value=None)
    torch.testing.assert_close(advantage, expected, **TOL)


# ----------------------------------------------------------------------------- small cases by hand


def one_env(*rows: float | bool) -> torch.Tensor:
    return torch.tensor(rows).unsqueeze(1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_timeout_bootstraps_termination_does_not_trace_stops_at_both(backend: str) -> None:
    # gamma 0.5, lambda 1, rewards 1, values 0; step 1 times out (V(final obs) = 4),
    # step 3 terminates, last_value 8 after step 4.
    reward = one_env(1.0, 1.0, 1.0, 1.0, 1.0)
    value = torch.zeros(5, 1)
    terminated = one_env(False, False, False, True, False)
    truncated = one_env(False, True, False, False, False)
    bootstrap = torch.full((5, 1), 4.0)
    advantage, returns = compute_gae(
        reward, value, terminated, truncated, torch.tensor([8.0]), gamma=0.5, gae_lambda=1.0,
        bootstrap_value=bootstrap, backend=backend,
    )
    # t=4: 1 + 0.5*8 = 5.   t=3: terminated -> 1, trace stops.   t=2: 1 + 0.5*1 = 1.5
    # t=1: timeout -> 1 + 0.5*4 = 3, trace stops.   t=0: 1 + 0.5*3 = 2.5
    assert advantage.squeeze(1).tolist() == [2.5, 3.0, 1.5, 1.0, 5.0]
    assert torch.equal(returns, advantage)


@pytest.mark.parametrize("backend", BACKENDS)
def test_terminated_and_truncated_counts_as_terminated(backend: str) -> None:
    both = one_env(True, False)
    advantage, _ = compute_gae(
        one_env(1.0, 1.0), torch.zeros(2, 1), both, one_env(True, False), torch.tensor([2.0]),
        gamma=0.5, gae_lambda=1.0, bootstrap_value=torch.full((2, 1), 100.0), backend=backend,
    )
    assert advantage.squeeze(1).tolist() == [1.0, 2.0]  # no 0.5 * 100 at step 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_lambda_mixes_td_errors(backend: str) -> None:
    # values 1, rewards 0, no ends, last_value 1: delta = gamma - 1 at every step.
    advantage, _ = compute_gae(
        torch.zeros(3, 1), torch.ones(3, 1), torch.zeros(3, 1, dtype=torch.bool), None,
        torch.ones(1), gamma=0.5, gae_lambda=0.5, backend=backend,
    )
    # a2 = -0.5; a1 = -0.5 + 0.25 * a2 = -0.625; a0 = -0.5 + 0.25 * a1 = -0.65625
    assert advantage.squeeze(1).tolist() == [-0.65625, -0.625, -0.5]


def test_truncated_without_bootstrap_is_fine_when_nothing_is_truncated() -> None:
    ro = make_rollout(4, 2, p_trunc=0.0)
    advantage, _ = compute_gae(
        ro["reward"], ro["value"], ro["terminated"], torch.zeros(4, 2, dtype=torch.bool),
        ro["last_value"], gamma=0.9, gae_lambda=0.9,
    )
    expected, _ = compute_gae(
        ro["reward"], ro["value"], ro["terminated"], None, ro["last_value"], gamma=0.9, gae_lambda=0.9
    )
    assert torch.equal(advantage, expected)


def test_empty_env_dim() -> None:
    advantage, returns = compute_gae(
        torch.zeros(3, 0), torch.zeros(3, 0), torch.zeros(3, 0, dtype=torch.bool), None,
        torch.zeros(0), gamma=0.9, gae_lambda=0.9,
    )
    assert advantage.shape == returns.shape == (3, 0)


# ----------------------------------------------------------------------------- bad input


def good_args() -> dict[str, object]:
    ro = make_rollout(4, 3, dtype=torch.float32)
    return {
        "reward": ro["reward"], "value": ro["value"], "terminated": ro["terminated"],
        "truncated": ro["truncated"], "last_value": ro["last_value"],
        "gamma": 0.99, "gae_lambda": 0.95, "bootstrap_value": ro["bootstrap_value"],
    }


def call(**changes: object) -> tuple[torch.Tensor, torch.Tensor]:
    args = good_args()
    args.update(changes)
    positional = [args.pop(k) for k in ("reward", "value", "terminated", "truncated", "last_value")]
    return compute_gae(*positional, **args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "changes,error,message",
    [
        ({"value": torch.zeros(4, 2)}, ShapeError, "value: expected shape (4, 3), got (4, 2)"),
        ({"last_value": torch.zeros(3, 1)}, ShapeError, "last_value: expected shape (3,), got (3, 1)"),
        ({"terminated": torch.zeros(3, 4, dtype=torch.bool)}, ShapeError, "terminated: expected shape (4, 3), got (3, 4)"),
        ({"truncated": torch.zeros(4, dtype=torch.bool)}, ShapeError, "truncated: expected shape (4, 3), got (4,)"),
        ({"bootstrap_value": torch.zeros(4, 3, 1)}, ShapeError, "bootstrap_value: expected shape (4, 3), got (4, 3, 1)"),
        ({"next_value": torch.zeros(5, 3)}, ShapeError, "next_value: expected shape (4, 3), got (5, 3)"),
        ({"reward": torch.zeros(4)}, ShapeError, "reward: expected a 2-D tensor"),
        ({"reward": torch.zeros(0, 3), "value": torch.zeros(0, 3)}, ShapeError, "reward: expected at least one step"),
        ({"reward": torch.zeros(4, 3, dtype=torch.int64)}, DtypeError, "reward: expected dtype torch.float32 or torch.float64"),
        ({"value": torch.zeros(4, 3, dtype=torch.float64)}, DtypeError, "value: expected dtype torch.float32 (the dtype of reward), got torch.float64"),
        ({"last_value": torch.zeros(3, dtype=torch.float16)}, DtypeError, "last_value: expected dtype torch.float32"),
        ({"terminated": torch.zeros(4, 3)}, DtypeError, "terminated: expected dtype torch.bool, got torch.float32"),
        ({"truncated": torch.zeros(4, 3, dtype=torch.uint8)}, DtypeError, "truncated: expected dtype torch.bool"),
        ({"reward": [[1.0]]}, DtypeError, "reward: expected a torch.Tensor, got list"),
        ({"value": torch.zeros(4, 3, device="meta")}, DeviceError, "value: expected device cpu (the device of reward), got meta"),
        ({"gamma": 1.5}, ConfigError, "gamma: expected a float in [0, 1], got 1.5"),
        ({"gae_lambda": -0.1}, ConfigError, "gae_lambda: expected a float in [0, 1], got -0.1"),
        ({"time_dim": 2}, ConfigError, "time_dim: expected 0, 1 or -1, got 2"),
        ({"backend": "cuda"}, ConfigError, "backend: expected 'auto', 'numba' or 'torch'"),
        ({"backend": None}, ConfigError, "backend: expected 'auto', 'numba' or 'torch', got None"),
        ({"time_dim": True}, ConfigError, "time_dim: expected 0, 1 or -1, got True"),
        ({"gamma": float("nan")}, ConfigError, "gamma: expected a float in [0, 1], got nan"),
        ({"gamma": float("inf")}, ConfigError, "gamma: expected a float in [0, 1], got inf"),
        ({"gae_lambda": float("nan")}, ConfigError, "gae_lambda: expected a float in [0, 1], got nan"),
        ({"gamma": "0.99"}, ConfigError, "gamma: expected a float in [0, 1], got '0.99'"),
        ({"gamma": True}, ConfigError, "gamma: expected a float in [0, 1], got True"),
        ({"gae_lambda": torch.tensor(0.9)}, ConfigError, "gae_lambda: expected a float in [0, 1], got tensor(0.9000)"),
        ({"reward": torch.zeros(4, 3, dtype=torch.complex64)}, DtypeError, "reward: expected dtype torch.float32 or torch.float64, got torch.complex64"),
        ({"reward": torch.zeros(4, 3, dtype=torch.bfloat16)}, DtypeError, "reward: expected dtype torch.float32 or torch.float64, got torch.bfloat16"),
        ({"bootstrap_value": torch.zeros(4, 3, dtype=torch.complex128)}, DtypeError, "bootstrap_value: expected dtype torch.float32 (the dtype of reward), got torch.complex128"),
        ({"reward": torch.zeros(4, 3).to_sparse()}, DtypeError, "reward: expected a dense (strided) tensor, got layout torch.sparse_coo"),
        ({"terminated": torch.zeros(4, 3, dtype=torch.bool).to_sparse()}, DtypeError, "terminated: expected a dense (strided) tensor"),
        ({"reward": torch.zeros(4, 3, device="meta")}, DeviceError, "reward: expected a tensor with data (cpu, cuda, ...), got a tensor on meta"),
        ({"out": torch.zeros(4, 3)}, ConfigError, "out: expected a tuple (advantage, returns) of two tensors"),
        ({"out": (torch.zeros(4, 3),)}, ConfigError, "out: expected a tuple (advantage, returns) of two tensors"),
        ({"out": (torch.zeros(4, 3), torch.zeros(4, 3, dtype=torch.float64))}, DtypeError, "out[1] (returns): expected dtype torch.float32"),
        ({"out": (torch.zeros(3, 4), torch.zeros(4, 3))}, ShapeError, "out[0] (advantage): expected shape (4, 3), got (3, 4)"),
        ({"last_value": None}, ConfigError, "last_value: required unless next_value is given"),
        (
            {"bootstrap_value": None, "truncated": torch.tensor([[False] * 3, [True, False, False]] * 2)},
            ConfigError,
            "bootstrap_value: required because truncated marks 2 step(s)",
        ),
    ],
)
def test_bad_input_names_the_field(changes: dict[str, object], error: type[Exception], message: str) -> None:
    with pytest.raises(error) as info:
        call(**changes)
    assert message in str(info.value)
    assert isinstance(info.value, (ValueError, TypeError))


def poisoned(name: str, bad: float, index: tuple[int, ...]) -> torch.Tensor:
    tensor = good_args()[name]
    assert isinstance(tensor, torch.Tensor)
    tensor = tensor.clone()
    tensor[index] = bad
    return tensor


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize(
    "name,index,where",
    [
        ("reward", (2, 1), "at step 2, env 1"),
        ("value", (0, 2), "at step 0, env 2"),
        ("value", (3, 0), "at step 3, env 0"),
        ("last_value", (1,), "at env 1"),
        ("next_value", (1, 1), "at step 1, env 1"),
    ],
)
def test_non_finite_input_is_refused(backend: str, bad: float, name: str, index: tuple[int, ...], where: str) -> None:
    base = good_args()["value"]
    assert isinstance(base, torch.Tensor)
    changes: dict[str, object] = {"backend": backend}
    if name == "next_value":
        changes["next_value"] = torch.where(torch.ones_like(base, dtype=torch.bool), base, 0.0)
        changes["next_value"][index] = bad  # type: ignore[index]
    else:
        changes[name] = poisoned(name, bad, index)
    with pytest.raises(NonFiniteError) as info:
        call(**changes)
    assert str(info.value).startswith(f"{name}: expected finite values")
    assert where in str(info.value)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bootstrap_value_is_checked_only_where_read(backend: str) -> None:
    truncated = torch.zeros(4, 3, dtype=torch.bool)
    truncated[1, 2] = True
    bootstrap = torch.full((4, 3), float("nan"))
    advantage, _ = call(truncated=truncated, bootstrap_value=bootstrap.clone().fill_(0.5), backend=backend)
    bootstrap[1, 2] = 0.5  # NaN everywhere it is not read is fine
    same, _ = call(truncated=truncated, bootstrap_value=bootstrap, backend=backend)
    assert torch.equal(same, advantage)
    bootstrap[1, 2] = float("inf")
    with pytest.raises(NonFiniteError, match="bootstrap_value: expected finite values, got inf at step 1, env 2"):
        call(truncated=truncated, bootstrap_value=bootstrap, backend=backend)


def test_numba_backend_is_cpu_only_and_auto_picks_by_device_and_size() -> None:
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    with pytest.raises(DeviceError, match="backend: 'numba' runs on the CPU, got tensors on cuda"):
        gae_module._use_numba("numba", cuda, 10**6)
    assert gae_module._use_numba("numba", cpu, 1)
    assert not gae_module._use_numba("auto", cuda, 10**6)
    assert not gae_module._use_numba("auto", cpu, gae_module._NUMBA_MIN_NUMEL - 1)
    assert gae_module._use_numba("auto", cpu, gae_module._NUMBA_MIN_NUMEL)
    assert not gae_module._use_numba("torch", cpu, 10**6)


def test_all_tensors_on_meta_are_refused() -> None:
    meta = {k: v.to("meta") if isinstance(v, torch.Tensor) else v for k, v in good_args().items()}
    with pytest.raises(DeviceError, match="reward: expected a tensor with data"):
        call(**meta)


def test_number_types_of_gamma_and_lambda() -> None:
    expected, _ = call()
    same, _ = call(gamma=np.float32(0.99), gae_lambda=np.float64(0.95))
    torch.testing.assert_close(same, expected)
    ones, _ = call(gamma=1, gae_lambda=1)
    reference, _ = call(gamma=1.0, gae_lambda=1.0)
    assert torch.equal(ones, reference)


@pytest.mark.parametrize("backend", BACKENDS)
def test_out_sharing_memory_is_refused_and_left_untouched(backend: str) -> None:
    args = good_args()
    reward, value = args["reward"], args["value"]
    assert isinstance(reward, torch.Tensor) and isinstance(value, torch.Tensor)
    both = torch.full((4, 3), 7.0)
    with pytest.raises(ConfigError, match="out: expected two separate tensors, got advantage and returns sharing memory"):
        call(out=(both, both), backend=backend)
    columns = torch.full((4, 3, 2), 7.0)  # two views of one tensor, overlapping in memory
    with pytest.raises(ConfigError, match="out: expected two separate tensors"):
        call(out=(columns[..., 0], columns.flatten()[:12].view(4, 3)), backend=backend)
    before, value_before = reward.clone(), value.clone()
    with pytest.raises(ConfigError, match=r"out\[0\] \(advantage\): expected a tensor of its own, got one sharing memory with reward"):
        call(reward=reward, value=value, out=(reward, torch.empty(4, 3)), backend=backend)
    assert torch.equal(reward, before)
    with pytest.raises(ConfigError, match=r"out\[1\] \(returns\): .* sharing memory with value"):
        call(reward=reward, value=value, out=(torch.empty(4, 3), value.view(4, 3)), backend=backend)
    assert torch.equal(value, value_before)
    assert torch.equal(both, torch.full((4, 3), 7.0)) and torch.equal(columns, torch.full((4, 3, 2), 7.0))


@pytest.mark.parametrize("backend", BACKENDS)
def test_out_receives_the_result_in_either_layout(backend: str) -> None:
    expected = call(backend=backend)
    out = (torch.empty(4, 3), torch.empty(4, 3))
    got = call(out=out, backend=backend)
    assert got[0] is out[0] and got[1] is out[1]
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    strided = (torch.empty(3, 4).t(), torch.empty(3, 4).t())  # [4, 3] views, not contiguous
    got = call(out=strided, backend=backend)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
