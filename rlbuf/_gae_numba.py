"""The CPU GAE kernels: one pass over the rollout, compiled by numba (imported on first use).

Both kernels accumulate in float64 for float32 and float64 rollouts alike, round each output once,
and flag NaN/inf in the values they read, and results beyond the output dtype, during the same
pass; the caller then locates and reports them. numba compiles a kernel the first time a process uses it with a given dtype (about
a second) and keeps the machine code in its on-disk cache (``__pycache__``, or the user cache
directory where that is read-only), so later processes load it in a fraction of that.

- rows: ``[T, N]`` C-contiguous inputs (step-wise adds), one step of every env at a time; the
  inner loop over envs is branch-free so that it vectorises.
- envs: ``[N, T]`` C-contiguous inputs (TorchRL collectors), env by env, walking time backwards.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numba
import numpy as np
import torch

if TYPE_CHECKING:
    from rlbuf._gae_checks import Rollout

_JIT = {"cache": True, "nogil": True, "boundscheck": False, "error_model": "numpy"}


@numba.njit(**_JIT)
def _step(reward, value, next_v, boot_v, term, trunc, advantage, returns, carry, check, gamma, coef):  # type: ignore[no-untyped-def]
    # Every load is unconditional and every choice a select, so the loop vectorises. x - x is
    # NaN for NaN and inf and 0 otherwise, so ``check`` stays 0 exactly while inputs are finite.
    for n in range(reward.shape[0]):
        terminated = term[n] != 0
        stop = terminated | (trunc[n] != 0)
        boot = stop & (term[n] == 0)
        r, v, x, b = reward[n], value[n], next_v[n], boot_v[n]
        check[n] += (r - r) + (v - v) + (x - x) + ((b - b) if boot else 0.0)
        target = np.float64(b) if boot else np.float64(x)
        delta = (np.float64(r) + (0.0 if terminated else gamma * target)) - np.float64(v)
        a = delta + (0.0 if stop else coef * carry[n])
        carry[n] = a
        advantage[n] = a
        returns[n] = advantage[n] + v
        check[n] += returns[n] - returns[n]  # NaN where a result overflowed the output dtype


@numba.njit(**_JIT)
def _rows(reward, value, term, trunc, last_value, boot_v, next_v, advantage, returns,  # type: ignore[no-untyped-def]
          gamma, coef, use_boot, use_next):
    num_steps, num_envs = reward.shape
    carry = np.zeros(num_envs)
    check = np.zeros(num_envs)
    for t in range(num_steps - 1, -1, -1):
        following = last_value if t == num_steps - 1 else value[t + 1]
        x = next_v[t] if use_next else following
        _step(reward[t], value[t], x, boot_v[t] if use_boot else x, term[t], trunc[t],
              advantage[t], returns[t], carry, check, gamma, 0.0 if t == num_steps - 1 else coef)
    return check.sum() == 0.0


@numba.njit(**_JIT)
def _envs(reward, value, term, trunc, last_value, boot_v, next_v, advantage, returns,  # type: ignore[no-untyped-def]
          gamma, coef, use_boot, use_next):
    num_envs, num_steps = reward.shape
    check = 0.0
    for n in range(num_envs):
        carry = 0.0
        for t in range(num_steps - 1, -1, -1):
            if use_next:
                x = next_v[n, t]
            else:
                x = last_value[n] if t == num_steps - 1 else value[n, t + 1]
            terminated = term[n, t] != 0
            stop = terminated | (trunc[n, t] != 0)
            boot = use_boot & stop & (term[n, t] == 0)
            r, v, b = reward[n, t], value[n, t], boot_v[n, t]
            check += (r - r) + (v - v) + (x - x) + ((b - b) if boot else 0.0)
            target = np.float64(b) if boot else np.float64(x)
            delta = (np.float64(r) + (0.0 if terminated else gamma * target)) - np.float64(v)
            carry = delta + (0.0 if stop or t == num_steps - 1 else coef * carry)
            advantage[n, t] = carry
            returns[n, t] = advantage[n, t] + v
            check += returns[n, t] - returns[n, t]  # NaN where a result overflowed the output dtype
    return check == 0.0


def gae_numba(
    views: Rollout, gamma: float, gae_lambda: float, advantage: torch.Tensor, returns: torch.Tensor
) -> bool:
    """Fill ``advantage`` and ``returns`` (``[T, N]`` views of CPU tensors) in one kernel pass.

    Inputs that are not contiguous in the kernel's layout are copied first; outputs that are not
    are computed into fresh tensors and copied back. Returns ``False`` when a non-finite input
    was read or a result overflowed the output dtype (the outputs then hold garbage).
    """
    # [T, N] views that are transposes of contiguous [N, T] tensors go env by env.
    envs_major = views.reward.stride(0) == 1 and views.reward.shape[0] > 1
    kernel = _envs if envs_major else _rows

    def array(tensor: torch.Tensor) -> np.ndarray:
        laid = tensor.t() if envs_major and tensor.dim() == 2 else tensor
        laid = laid.detach().contiguous()
        return (laid.view(torch.uint8) if laid.dtype == torch.bool else laid).numpy()

    value = array(views.value)
    terminated = array(views.terminated)
    truncated = terminated if views.truncated is None else array(views.truncated)
    next_v = value if views.next_value is None else array(views.next_value)
    use_boot = views.next_value is None and views.bootstrap_value is not None and views.truncated is not None
    boot_v = array(views.bootstrap_value) if use_boot and views.bootstrap_value is not None else value
    last = value[0] if views.last_value is None else array(views.last_value)
    outputs = []
    for out in (advantage, returns):
        laid = (out.t() if envs_major else out).detach()
        outputs.append(laid if laid.is_contiguous() else torch.empty_like(laid, memory_format=torch.contiguous_format))
    finite = bool(
        kernel(array(views.reward), value, terminated, truncated, last, boot_v, next_v,
               outputs[0].numpy(), outputs[1].numpy(), float(gamma), float(gamma * gae_lambda),
               use_boot, views.next_value is not None)
    )
    for out, computed in zip((advantage, returns), outputs, strict=True):
        laid = out.t() if envs_major else out
        if computed.data_ptr() != laid.data_ptr():
            laid.copy_(computed)
    return finite
