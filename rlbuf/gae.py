"""Generalized Advantage Estimation that bootstraps timeouts and never crosses an episode boundary.

For step ``t`` of a rollout of ``T`` steps and ``N`` envs::

    next_v[t] = bootstrap_value[t]  if truncated[t]
                value[t + 1]        elif t < T - 1
                last_value          otherwise
    delta[t]     = reward[t] + gamma * next_v[t] * (1 - terminated[t]) - value[t]
    advantage[t] = delta[t] + gamma * gae_lambda * (1 - done[t]) * advantage[t + 1]
    returns[t]   = advantage[t] + value[t]

with ``done = terminated | truncated``. A timeout (truncated, not terminated) bootstraps from
V(final observation); a termination does not; the lambda-trace stops at both. With ``next_value``
(TorchRL's ``("next", "state_value")``) the first three lines become ``next_v = next_value``.

Two implementations agree to rounding (both accumulate in float64, so float32 rollouts lose
nothing to a long scan):

- ``"numba"``: one pass of a kernel compiled by numba over CPU tensors, in either layout
  (see `rlbuf._gae_numba`). numba is imported on the first call that uses it, and compiles
  the kernel once per dtype (its disk cache spares later processes most of that second).
- ``"torch"``: device-agnostic tensor ops. Short rollouts run one fused ``addcmul_`` per step;
  long ones a log-depth doubling scan (the trace coefficient is either ``gamma * gae_lambda`` or 0).

``backend="auto"`` runs the numba kernel for CPU rollouts of at least 4096 elements and the torch
path otherwise (other devices, and small rollouts, where the first call's compile would cost more
than it saves).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from tensordict import TensorDictBase
from torchrl.envs.transforms import Transform

from rlbuf._fields import check_given_done, done_flag, truncated_from
from rlbuf._gae_checks import (
    Rollout,
    check_finite,
    check_flag,
    check_float,
    check_like,
    check_out,
    check_outputs,
    check_time_dim,
    check_unit_interval,
)
from rlbuf.errors import (
    ConfigError,
    DeviceError,
    DtypeError,
    MissingFieldError,
    NonFiniteError,
    ShapeError,
)

__all__ = ["GAE", "compute_gae"]


Backend = Literal["auto", "numba", "torch"]

_TERMINATED_MISSING = (
    "terminated: GAE needs key ('next', 'terminated'), missing from the rollout; ('next', 'done') cannot stand "
    "in for it, as it holds time limits too (which bootstrap, where terminations do not), and done & ~truncated "
    "would take a step that both terminated and hit its time limit for a timeout; add your env's terminations "
    "as ('next', 'terminated')"
)
"""Why the transform refuses a rollout without ``("next", "terminated")`` (a buffer's ``extend`` does too)."""

# Below this many elements the torch path takes tens of microseconds: not worth numba's import
# and first compile.
_NUMBA_MIN_NUMEL = 4096


def compute_gae(
    reward: torch.Tensor,
    value: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor | None,
    last_value: torch.Tensor | None,
    *,
    gamma: float,
    gae_lambda: float,
    bootstrap_value: torch.Tensor | None = None,
    next_value: torch.Tensor | None = None,
    time_dim: int = 0,
    backend: Backend = "auto",
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Compute GAE advantages and returns of a rollout, bootstrapping timeouts from ``bootstrap_value``.

    Inputs are ``[T, N]`` with ``time_dim=0`` (the layout of step-wise adds) or ``[N, T]`` with
    ``time_dim=1`` or ``-1`` (TorchRL collectors); neither layout is copied into the other.
    Shapes, dtypes, devices and options are validated before anything is computed; NaN and inf
    are caught just before (torch path) or during (numba kernel) the one pass over the values, and
    bad input never returns a result. Outputs carry no gradient.

    Args:
        reward: rewards, float32 or float64, ``[T, N]`` or ``[N, T]``.
        value: V(observation) of each step, same shape and dtype as ``reward``.
        terminated: bool, same shape; True where the episode ended for good (no bootstrap).
        truncated: bool, same shape, or None for no truncation; True where the episode was cut
            off (time limit), so the return bootstraps from ``bootstrap_value``.
        last_value: V(observation after the last step), shape ``[N]``; may be None when
            ``next_value`` is given.
        gamma: discount factor in [0, 1].
        gae_lambda: GAE lambda in [0, 1].
        bootstrap_value: V(final observation) of truncated steps, same shape as ``reward``;
            read only where ``truncated`` (and not ``terminated``) is True.
        next_value: V(next observation) of every step, same shape as ``reward``; when given it
            replaces ``value[t + 1]``, ``last_value`` and ``bootstrap_value``.
        time_dim: 0 for ``[T, N]`` inputs, 1 or -1 for ``[N, T]``.
        backend: ``"auto"``, ``"numba"`` (CPU only) or ``"torch"``; see the module doc.
        out: ``(advantage, returns)`` tensors shaped like ``reward`` to write into instead of
            fresh ones (e.g. a buffer's own columns); they must not share memory with each
            other or with an input. The arguments and inputs are checked before they are
            written; results that overflow are refused after (they then hold those results).

    Returns:
        ``(advantage, returns)``, contiguous, in the layout and dtype of ``reward``, with
        ``returns == advantage + value`` exactly.

    Raises:
        DtypeError: a tensor of the wrong dtype (floats: float32/float64 matching ``reward``;
            flags: bool), not a tensor, or not a dense (strided) tensor.
        ShapeError: a tensor of the wrong shape; the message names the field and both shapes.
        DeviceError: tensors on different devices, tensors on the ``meta`` device (no data),
            or ``backend="numba"`` off the CPU.
        NonFiniteError: NaN or inf in ``reward``, ``value``, ``last_value``, ``next_value``, or
            in ``bootstrap_value`` where it is read; or advantages or returns that overflow the
            dtype of ``reward`` although the inputs are finite (rewards near ``3e38`` in float32).
        ConfigError: ``gamma``/``gae_lambda`` not a number in [0, 1] (NaN included), a bad
            ``time_dim`` or ``backend``, a truncated step with neither ``bootstrap_value`` nor
            ``next_value``, no ``last_value`` without ``next_value``, or ``out`` that is not two
            tensors or shares memory with an input or with itself.

    Example:
        >>> import torch
        >>> from rlbuf.gae import compute_gae
        >>> reward = torch.ones(3, 1)
        >>> value = torch.zeros(3, 1)
        >>> terminated = torch.tensor([[False], [False], [True]])
        >>> advantage, returns = compute_gae(
        ...     reward, value, terminated, None, torch.zeros(1), gamma=0.5, gae_lambda=1.0
        ... )
        >>> advantage.squeeze(1).tolist()
        [1.75, 1.5, 1.0]
        >>> truncated = torch.tensor([[False], [True], [False]])  # timeout after step 1
        >>> advantage, _ = compute_gae(
        ...     reward, value, torch.zeros(3, 1, dtype=torch.bool), truncated, torch.zeros(1),
        ...     gamma=0.5, gae_lambda=1.0, bootstrap_value=torch.full((3, 1), 4.0),
        ... )
        >>> advantage.squeeze(1).tolist()  # step 1 bootstraps 0.5 * 4; the trace stops there
        [2.5, 3.0, 1.0]
    """
    check_time_dim(time_dim)
    if not isinstance(backend, str) or backend not in ("auto", "numba", "torch"):
        raise ConfigError(f"backend: expected 'auto', 'numba' or 'torch', got {backend!r}")
    gamma = check_unit_interval("gamma", gamma)
    gae_lambda = check_unit_interval("gae_lambda", gae_lambda)
    check_float("reward", reward, None)
    if reward.device.type == "meta":
        raise DeviceError("reward: expected a tensor with data (cpu, cuda, ...), got a tensor on meta")
    if reward.dim() != 2:
        layout = "[T, N]" if time_dim == 0 else "[N, T]"
        raise ShapeError(
            f"reward: expected a 2-D tensor {layout} (time_dim={time_dim}), got shape {tuple(reward.shape)}"
        )
    # Everything below works on [T, N] views; for time_dim=1 these are transposes, not copies.
    time_major = time_dim == 0
    shape = tuple(reward.shape)
    num_steps, num_envs = shape if time_major else shape[::-1]
    if num_steps == 0:
        raise ShapeError(f"reward: expected at least one step, got shape {shape}")
    dtype, device = reward.dtype, reward.device
    check_like("value", value, shape, dtype, device)
    check_flag("terminated", terminated, shape, device)
    if truncated is not None:
        check_flag("truncated", truncated, shape, device)
    for name, tensor in (("bootstrap_value", bootstrap_value), ("next_value", next_value)):
        if tensor is not None:
            check_like(name, tensor, shape, dtype, device)
    if last_value is not None:
        check_like("last_value", last_value, (num_envs,), dtype, device)
    elif next_value is None:
        raise ConfigError("last_value: required unless next_value is given, got None")

    def steps_first(tensor: torch.Tensor | None) -> torch.Tensor | None:
        return tensor if tensor is None or time_major else tensor.t()

    views = Rollout(
        reward=reward if time_major else reward.t(),
        value=value if time_major else value.t(),
        terminated=terminated if time_major else terminated.t(),
        truncated=steps_first(truncated),
        last_value=last_value,
        bootstrap_value=steps_first(bootstrap_value),
        next_value=steps_first(next_value),
    )
    if next_value is None and views.truncated is not None and bootstrap_value is None:
        # Only the truncation flags are scanned here; values are checked by the kernels.
        timeouts = int(torch.count_nonzero(views.truncated & ~views.terminated))
        if timeouts:
            raise ConfigError(
                f"bootstrap_value: required because truncated marks {timeouts} step(s) that did "
                "not terminate; pass V(final observation) of those steps as bootstrap_value, "
                "or pass next_value"
            )
        views.truncated = None

    if out is None:
        advantage = torch.empty(shape, dtype=dtype, device=device)
        returns = torch.empty(shape, dtype=dtype, device=device)
    else:
        inputs = {
            "reward": reward, "value": value, "terminated": terminated, "truncated": truncated,
            "last_value": last_value, "bootstrap_value": bootstrap_value, "next_value": next_value,
        }
        advantage, returns = check_out(out, shape, dtype, device, inputs)
    if advantage.numel() == 0:
        return advantage, returns
    advantage_tn = advantage if time_major else advantage.t()
    returns_tn = returns if time_major else returns.t()
    if _use_numba(backend, device, num_steps * num_envs):
        from rlbuf._gae_numba import gae_numba

        if not gae_numba(views, gamma, gae_lambda, advantage_tn, returns_tn):
            # The kernel flags non-finite input or results beyond the dtype; these name the field and the place.
            check_finite(views)
            check_outputs(advantage_tn, returns_tn)
            raise NonFiniteError("reward/value: expected finite values, got NaN or inf")
    else:
        with torch.no_grad():
            check_finite(views)
            advantage_tn.copy_(_gae_torch(views, gamma, gae_lambda))
            torch.add(advantage_tn, views.value, out=returns_tn)
        check_outputs(advantage_tn, returns_tn)
    return advantage, returns


class GAE(Transform):  # type: ignore[misc]
    """A TorchRL transform writing GAE ``"advantage"`` and ``"value_target"`` into a rollout.

    It reads a TensorDict rollout in TorchRL layout: batch ``[N, T]`` (time last, as collectors
    produce) or ``[T]`` (one env), with ``("next", "reward")``, ``value_key``,
    ``("next", value_key)``, ``("next", "terminated")`` and ``("next", "truncated")``. Entries
    may carry a trailing singleton dim (``[N, T, 1]``). A missing ``truncated`` is
    ``("next", "done") & ~terminated``; a rollout with neither is refused, as is one without
    ``terminated`` (``done`` alone does not tell a time limit from a termination), as
    ``RolloutBuffer.extend`` refuses them; a ``done`` given beside both must be
    ``terminated | truncated``. Timeouts bootstrap from ``("next", value_key)``, terminations do
    not, and the lambda-trace stops at both. The outputs have the layout of ``value_key``'s entry.

    Use it as a collector ``postproc=``, call it on a rollout (``gae(td)`` or ``gae.forward(td)``),
    or append it to a replay buffer whose samples are whole rollouts. It works on whole rollouts
    only, so it refuses to sit inside an environment.

    Args:
        gamma: discount factor in [0, 1].
        lmbda: GAE lambda in [0, 1].
        value_key: key of V(observation); ``("next", value_key)`` holds V(next observation).
        advantage_key: key the advantages are written to.
        value_target_key: key the returns (``advantage + value``) are written to.
        time_dim: batch dim that is time for a 2-D batch: -1 or 1 (TorchRL layout), or 0.

    Raises:
        ConfigError: ``gamma`` or ``lmbda`` not a number in [0, 1], or a bad ``time_dim``.

    Example:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from rlbuf.gae import GAE
        >>> N, T = 2, 3
        >>> td = TensorDict(
        ...     {
        ...         "state_value": torch.zeros(N, T, 1),
        ...         "next": {
        ...             "reward": torch.ones(N, T, 1),
        ...             "state_value": torch.zeros(N, T, 1),
        ...             "terminated": torch.zeros(N, T, 1, dtype=torch.bool),
        ...             "truncated": torch.zeros(N, T, 1, dtype=torch.bool),
        ...         },
        ...     },
        ...     batch_size=[N, T],
        ... )
        >>> td = GAE(gamma=0.5, lmbda=1.0)(td)
        >>> td["advantage"][0].squeeze(-1).tolist()
        [1.75, 1.5, 1.0]
        >>> td["value_target"].shape
        torch.Size([2, 3, 1])
    """

    def __init__(
        self,
        gamma: float,
        lmbda: float,
        *,
        value_key: str = "state_value",
        advantage_key: str = "advantage",
        value_target_key: str = "value_target",
        time_dim: int = -1,
    ) -> None:
        gamma = check_unit_interval("gamma", gamma)
        lmbda = check_unit_interval("lmbda", lmbda)
        check_time_dim(time_dim)
        super().__init__(
            in_keys=[("next", "reward"), value_key, ("next", value_key), ("next", "terminated")],
            out_keys=[advantage_key, value_target_key],
        )
        self.value_key = value_key
        self.advantage_key = advantage_key
        self.value_target_key = value_target_key
        self.gamma = float(gamma)
        self.lmbda = float(lmbda)
        self.time_dim = time_dim

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Write advantages and value targets into a rollout and return it.

        Args:
            tensordict: a rollout with batch ``[N, T]`` (time at ``time_dim``) or ``[T]``.

        Returns:
            The same TensorDict, with ``advantage_key`` and ``value_target_key`` set.

        Raises:
            MissingFieldError: a required entry is absent: ``("next", "terminated")``, or both
                ``("next", "truncated")`` and ``("next", "done")``, among them.
            ConfigError: ``("next", "done")`` is not ``terminated | truncated``.
            ShapeError: a batch that is not 1-D or 2-D, or an entry whose shape is neither
                the batch shape nor the batch shape plus a trailing 1.
            DtypeError, DeviceError, NonFiniteError: as [`compute_gae`][rlbuf.gae.compute_gae] raises them.

        Example:
            >>> import torch
            >>> from tensordict import TensorDict
            >>> from rlbuf.gae import GAE
            >>> td = TensorDict(
            ...     {
            ...         "state_value": torch.zeros(3),
            ...         ("next", "reward"): torch.ones(3),
            ...         ("next", "state_value"): torch.full((3,), 2.0),
            ...         ("next", "terminated"): torch.tensor([False, True, False]),
            ...         ("next", "done"): torch.tensor([True, True, False]),  # step 0: a time limit
            ...     },
            ...     batch_size=[3],
            ... )
            >>> GAE(gamma=0.5, lmbda=1.0).forward(td)["advantage"].tolist()
            [2.0, 1.0, 2.0]
        """
        batch = tuple(tensordict.batch_size)
        if len(batch) not in (1, 2):
            raise ShapeError(
                f"tensordict: expected batch [N, T] or [T], got batch_size {batch}"
            )
        value_entry = self._get(tensordict, self.value_key)
        reward = self._get(tensordict, ("next", "reward"))
        next_value = self._get(tensordict, ("next", self.value_key))
        terminated = self._get(tensordict, ("next", "terminated"), missing=_TERMINATED_MISSING)
        terminated = _required(_batch_only(("next", "terminated"), terminated, batch))
        truncated = truncated_from(tensordict, batch, terminated)
        check_given_done(done_flag(tensordict, ("next", "done"), batch), terminated, truncated)
        fields: dict[str | tuple[str, ...], torch.Tensor | None] = {
            self.value_key: value_entry,
            ("next", "reward"): reward,
            ("next", self.value_key): next_value,
            ("next", "terminated"): terminated,
            ("next", "truncated"): truncated,
        }
        flat = {key: _batch_only(key, entry, batch) for key, entry in fields.items()}
        if len(batch) == 1:
            time_dim = 0
            flat = {key: None if entry is None else entry.unsqueeze(1) for key, entry in flat.items()}
        else:
            time_dim = self.time_dim
        advantage, returns = compute_gae(
            _required(flat[("next", "reward")]),
            _required(flat[self.value_key]),
            _required(flat[("next", "terminated")]),
            flat[("next", "truncated")],
            None,
            gamma=self.gamma,
            gae_lambda=self.lmbda,
            next_value=flat[("next", self.value_key)],
            time_dim=time_dim,
        )
        tensordict.set(self.advantage_key, advantage.reshape(value_entry.shape))
        tensordict.set(self.value_target_key, returns.reshape(value_entry.shape))
        return tensordict

    def _call(self, next_tensordict: TensorDictBase) -> TensorDictBase:
        raise ConfigError(
            "GAE: works on whole rollouts; use it as a collector postproc, a replay-buffer "
            "transform, or call it on a rollout, not inside an environment"
        )

    @staticmethod
    def _get(tensordict: TensorDictBase, key: str | tuple[str, ...], *, missing: str | None = None) -> torch.Tensor:
        entry = tensordict.get(key, None)
        if entry is None:
            raise MissingFieldError(missing or f"{key!r}: required by GAE, missing from the rollout")
        if not isinstance(entry, torch.Tensor):
            raise DtypeError(f"{key!r}: expected a tensor, got {type(entry).__name__}")
        return entry

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(gamma={self.gamma}, lmbda={self.lmbda}, "
            f"value_key={self.value_key!r}, advantage_key={self.advantage_key!r}, "
            f"value_target_key={self.value_target_key!r}, time_dim={self.time_dim})"
        )


def _batch_only(
    key: str | tuple[str, ...], entry: torch.Tensor | None, batch: tuple[int, ...]
) -> torch.Tensor | None:
    """Drop a trailing singleton dim so the entry has exactly the batch shape."""
    if entry is None:
        return None
    shape = tuple(entry.shape)
    if shape == batch:
        return entry
    if shape == (*batch, 1):
        return entry.squeeze(-1)
    raise ShapeError(f"{key!r}: expected shape {batch} or {(*batch, 1)}, got {shape}")


def _required(entry: torch.Tensor | None) -> torch.Tensor:
    assert entry is not None  # _get() made sure of it
    return entry


# ----------------------------------------------------------------------------- backend


def _use_numba(backend: Backend, device: torch.device, numel: int) -> bool:
    if backend == "torch":
        return False
    if backend == "numba":
        if device.type != "cpu":
            raise DeviceError(f"backend: 'numba' runs on the CPU, got tensors on {device}")
        return True
    return device.type == "cpu" and numel >= _NUMBA_MIN_NUMEL


# ----------------------------------------------------------------------------- torch path


def _gae_torch(views: Rollout, gamma: float, gae_lambda: float) -> torch.Tensor:
    """Advantages as a float64 time-major ``[T, N]`` tensor, with tensor ops on any device."""
    num_steps, num_envs = views.reward.shape
    f64 = torch.float64
    device = views.reward.device

    def mask(flags: torch.Tensor) -> torch.Tensor:
        # bool -> float through a uint8 view: on CPU several times faster than bool -> float.
        return flags.view(torch.uint8).to(f64)

    # Time-major work tensors whatever the input layout, so each step is a contiguous row.
    delta = torch.empty((num_steps, num_envs), dtype=f64, device=device)
    if views.next_value is not None:
        delta.copy_(views.next_value)
    else:
        assert views.last_value is not None
        delta[:-1] = views.value[1:]
        delta[-1] = views.last_value
        if views.truncated is not None and views.bootstrap_value is not None:
            # Bootstrap values are read at timeouts only (NaN elsewhere must not leak in).
            timeout = views.truncated & ~views.terminated
            delta = torch.where(timeout, views.bootstrap_value.to(f64), delta)
    # delta = reward + gamma * next_v * (1 - terminated) - value; next_v is finite here, so the
    # product by the 0/1 mask equals the definition exactly.
    delta.mul_(mask(~views.terminated)).mul_(gamma).add_(views.reward.to(f64)).sub_(views.value.to(f64))
    stop = views.terminated if views.truncated is None else views.terminated | views.truncated
    trace = mask(~stop).mul_(gamma * gae_lambda)
    if _doubling_is_cheaper(num_steps, num_envs):
        return _scan_doubling(delta, trace)
    return _scan_steps(delta, trace)


def _doubling_is_cheaper(num_steps: int, num_envs: int) -> bool:
    """Compare rough costs: ~4 us per tensor op plus ~1.5 ns per float64 element."""
    per_op, per_element = 4.0, 1.5e-3
    steps = (num_steps - 1) * (per_op + per_element * num_envs)
    levels = math.ceil(math.log2(max(num_steps, 2)))
    doubling = 3 * levels * (per_op + per_element * num_steps * num_envs)
    return doubling < steps


def _scan_steps(delta: torch.Tensor, trace: torch.Tensor) -> torch.Tensor:
    """advantage[t] = delta[t] + trace[t] * advantage[t + 1], one fused op per step, in place."""
    rows = delta.unbind(0)
    coefs = trace.unbind(0)
    for t in range(len(rows) - 2, -1, -1):
        rows[t].addcmul_(coefs[t], rows[t + 1])
    return delta


def _scan_doubling(delta: torch.Tensor, trace: torch.Tensor) -> torch.Tensor:
    """The same recurrence as ``_scan_steps`` in ``ceil(log2 T)`` rounds of whole-tensor ops.

    After the round with offset ``k``, ``advantage[i]`` sums ``delta`` over ``[i, i + 2k)`` with
    the products of ``trace`` as weights, and ``coef[i]`` is the product of ``trace`` over the
    same window (zero once the window crosses an episode boundary).
    """
    num_steps = delta.shape[0]
    advantage = delta
    coef = trace
    offset = 1
    while offset < num_steps:
        advantage[: num_steps - offset] += coef[: num_steps - offset] * advantage[offset:]
        if 2 * offset < num_steps:
            coef = coef[: num_steps - 2 * offset] * coef[offset : num_steps - offset]
        offset *= 2
    return advantage
