"""Sequences for recurrent policies: padded rollout trajectories and replay sequences, and their batches.

[`RolloutBuffer.minibatches(..., sequences=True)`][rlbuf.RolloutBuffer.minibatches] splits each
env's rollout at episode ends (``done = terminated | truncated``) into trajectories, and every
minibatch pads its trajectories to ``[L, B, ...]`` (time first, as ``torch.nn.LSTM`` reads
them), with a ``mask`` that is False on padding and the stored hidden state at each
trajectory's first step. This is what rsl_rl's recurrent mini-batch generator gives, with
every field padded (not only observations) and trajectories shuffled across envs.

[`ReplayBuffer.sample_sequences`][rlbuf.ReplayBuffer.sample_sequences] draws ``[B, S]``
sequences of consecutive steps of one env from the replay ring (R2D2, DreamerV3).

Example:
    >>> import torch
    >>> done = torch.tensor([[False, False], [True, False], [False, False]])   # [T=3, N=2]
    >>> trajectories = split_trajectories(done)
    >>> trajectories.env.tolist(), trajectories.start.tolist(), trajectories.length.tolist()
    ([0, 0, 1], [0, 2, 0], [2, 1, 3])
    >>> rows, mask = trajectories.rows(num_envs=2)   # [L=3, B=3]: row t * num_envs + n
    >>> rows.tolist(), mask.tolist()
    ([[0, 4, 1], [2, 4, 3], [2, 4, 5]], [[True, True, True], [True, False, True], [False, False, True]])
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

import torch
from tensordict import TensorDict

from rlbuf._delivery import deliver
from rlbuf._fields import SEQUENCE_COLUMNS, TRAJECTORY_COLUMNS, refuse_hidden_columns
from rlbuf._obs import leaf_names
from rlbuf.batches import _OnPolicyFields, _torchrl_layout, _TransitionFields, set_hidden_state
from rlbuf.errors import BatchSizeError, ConfigError
from rlbuf.spec import positive_int
from rlbuf.storage import check_batch_memory

if TYPE_CHECKING:
    from rlbuf._obs import Layout
    from rlbuf._ring import RowRing


@dataclass(frozen=True)
class Trajectories:
    """The trajectories of a ``[T, N]`` rollout: env, first step and length of each, env by env."""

    env: torch.Tensor
    start: torch.Tensor
    length: torch.Tensor

    def __len__(self) -> int:
        return int(self.env.shape[0])

    def rows(self, *, num_envs: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Storage rows ``[L, B]`` (row ``t * num_envs + n``) of every trajectory, and their mask.

        ``L`` is the longest trajectory; padded positions repeat the trajectory's last row (so
        every row is valid to gather) and have mask False.
        """
        offset = torch.arange(int(self.length.max()), device=self.length.device).unsqueeze(1)
        mask = offset < self.length
        time = self.start + torch.minimum(offset, self.length - 1)
        return time * num_envs + self.env, mask

    def first_rows(self, *, num_envs: int) -> torch.Tensor:
        """The storage row of each trajectory's first step."""
        return self.start * num_envs + self.env


def split_trajectories(done: torch.Tensor) -> Trajectories:
    """Split a ``[T, N]`` rollout at ``done`` into trajectories, env 0's first, each env's in time order.

    The last step of every env ends a trajectory (it is cut by the rollout's end). The order is
    rsl_rl's ``split_and_pad_trajectories`` order.

    Example:
        >>> split_trajectories(torch.tensor([[True], [False]])).length.tolist()
        [1, 1]
    """
    steps = done.shape[0]
    ends = done.to(torch.bool).clone()
    ends[-1] = True
    flat_ends = ends.T.reshape(-1).nonzero().squeeze(1)
    flat_starts = torch.cat((flat_ends.new_zeros(1), flat_ends[:-1] + 1))
    return Trajectories(flat_starts // steps, flat_starts % steps, flat_ends - flat_starts + 1)


def gather_padded(columns: Mapping[str, torch.Tensor], rows: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each column's ``rows`` as ``[L, B, ...]``, zero (False) where ``mask`` is False."""
    flat = rows.reshape(-1)
    padding = ~mask
    out = {}
    for name, column in columns.items():
        value = column.index_select(0, flat).view(*rows.shape, *column.shape[1:])
        out[name] = value.masked_fill_(padding.view(*rows.shape, *(1,) * (column.dim() - 1)), 0)
    return out


class PaddedTrajectories:
    """Every trajectory of a ``[T, N]`` rollout, padded once; minibatches are then column gathers.

    Args:
        columns: the rollout's columns, row ``t * N + n``.
        done: episode ends ``[T, N]``.
        first_step: columns read at each trajectory's first step only (hidden states).

    Raises:
        ConfigError: a column has the name of a sequence batch's own (an extra field ``mask``).

    Example:
        >>> done = torch.tensor([[False, False], [True, False], [False, False]])
        >>> padded = PaddedTrajectories({"x": torch.arange(6.0)}, done, first_step=())
        >>> columns, mask, first, env, start = padded.select(torch.tensor([2, 1]))
        >>> columns["x"].tolist(), mask.tolist(), env.tolist(), start.tolist()
        ([[1.0, 4.0], [3.0, 0.0], [5.0, 0.0]], [[True, True], [True, False], [True, False]], [1, 0], [0, 2])
    """

    def __init__(self, columns: Mapping[str, torch.Tensor], done: torch.Tensor, *, first_step: Sequence[str]) -> None:
        refuse_hidden_columns(columns, TRAJECTORY_COLUMNS, "minibatches(sequences=True)")
        self.trajectories = split_trajectories(done)
        rows, self.mask = self.trajectories.rows(num_envs=done.shape[1])
        self.padded = gather_padded({name: column for name, column in columns.items() if name not in first_step},
                                    rows, self.mask)
        first = self.trajectories.first_rows(num_envs=done.shape[1])
        self.first = {name: columns[name].index_select(0, first) for name in first_step}

    @classmethod
    def of_rollout(cls, columns: Mapping[str, torch.Tensor], num_envs: int, *,
                   first_step: Sequence[str]) -> PaddedTrajectories:
        """The trajectories of a rollout's columns, rows ``t * N + n`` (split where ``done`` says)."""
        return cls({name: column for name, column in columns.items() if name not in ("done", "bootstrap_value")},
                   columns["done"].view(-1, num_envs), first_step=first_step)

    def __len__(self) -> int:
        return len(self.trajectories)

    def select(self, index: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor, dict[str, torch.Tensor],
                                                   torch.Tensor, torch.Tensor]:
        """Trajectories ``index``: padded columns ``[L, B, ...]``, mask, first-step columns, env, start."""
        steps = int(self.trajectories.length[index].max())
        columns = {name: padded[:steps].index_select(1, index) for name, padded in self.padded.items()}
        first = {name: value.index_select(0, index) for name, value in self.first.items()}
        return (columns, self.mask[:steps].index_select(1, index), first, self.trajectories.env[index],
                self.trajectories.start[index])


@dataclass(slots=True, frozen=True, eq=False, repr=False)
class SequenceBatch(_OnPolicyFields):
    """A minibatch of whole trajectories, time first and padded: ``[L, B, ...]`` with a ``mask``.

    ``B`` trajectories (from any envs, in shuffled order), each padded to the longest one's
    length ``L``. Padded positions hold zeros (False for flags) and have ``mask`` False: average
    losses over ``mask`` (``(loss * batch.mask).sum() / batch.mask.sum()``), or pick the valid
    steps with ``batch.advantage[batch.mask]``.

    Attributes:
        obs: observations ``[L, B, *obs_shape]`` (a ``TensorDict`` for dict observations).
        privileged_obs: privileged observations ``[L, B, ...]``, or ``None``.
        action: actions ``[L, B, *action_shape]``.
        reward: rewards ``[L, B]``.
        terminated: ``[L, B]`` bool.
        truncated: ``[L, B]`` bool.
        value: values at collection time ``[L, B]``.
        log_prob: log-probabilities at collection time ``[L, B]``.
        advantage: GAE advantages ``[L, B]``.
        returns: value targets ``[L, B]``.
        mask: True on real steps, False on padding ``[L, B]``.
        hidden_state: the stored hidden state at each trajectory's first step ``[B, *shape]``
            (a ``TensorDict`` for ``{"h": ..., "c": ...}``), or ``None`` without hidden states.
        env: the env each trajectory comes from ``[B]``.
        start: the rollout step each trajectory starts at ``[B]``.
        extras: extra fields, padded like the rest (also readable as attributes).
    """

    mask: torch.Tensor
    hidden_state: torch.Tensor | TensorDict | None
    env: torch.Tensor
    start: torch.Tensor
    extras: dict[str, torch.Tensor] = field(default_factory=dict)
    _time_first: ClassVar[frozenset[str]] = frozenset({
        "obs", "privileged_obs", "action", "reward", "terminated", "truncated", "value", "log_prob", "advantage",
        "returns", "mask", "extras"})  # batch[rows] selects trajectories on dim 1 of these

    def __len__(self) -> int:
        """Trajectories in the batch (``B``)."""
        return int(self.mask.shape[1])

    def to_tensordict(self) -> TensorDict:
        """The batch in TorchRL's sequence layout: batch size ``[B, L]`` (time last), with ``"mask"``.

        The hidden state is at TorchRL's ``recurrent_state*`` keys, at the first step (zeros
        after), and ``"is_init"`` is False: TorchRL's ``LSTMModule``/``GRUModule`` in recurrent
        mode start each trajectory from its stored state.

        Example:
            >>> from rlbuf import RolloutBuffer
            >>> buf = RolloutBuffer(3, 2, obs_shape=(1,), action_shape=(), seed=0)
            >>> for t in range(3):
            ...     buf.add(torch.zeros(2, 1), torch.zeros(2), torch.ones(2), torch.tensor([t == 1, False]),
            ...             torch.zeros(2), torch.zeros(2), truncated=False)
            >>> buf.compute_returns_and_advantages(torch.zeros(2))
            >>> td = next(iter(buf.minibatches(num_minibatches=1, sequences=True, shuffle=False))).to_tensordict()
            >>> td.batch_size, td["mask"].tolist()
            (torch.Size([3, 3]), [[True, True, False], [True, False, False], [True, True, True]])
        """
        steps, width = self.mask.shape
        def scalar(value: torch.Tensor) -> torch.Tensor:
            return _torchrl_layout(value, 2)

        td = TensorDict({
            "observation": self.obs, "action": self.action, "state_value": scalar(self.value),
            "sample_log_prob": self.log_prob, "advantage": scalar(self.advantage),
            "value_target": scalar(self.returns), "mask": self.mask,
            "next": {"reward": scalar(self.reward), "terminated": scalar(self.terminated),
                     "truncated": scalar(self.truncated), "done": scalar(self.terminated | self.truncated)},
        }, batch_size=[steps, width], device=self.mask.device)
        if self.privileged_obs is not None:
            td.set("privileged_observation", self.privileged_obs)
        for name, value in self.extras.items():
            td.set(name, value)
        td = td.transpose(0, 1)
        td.set("is_init", torch.zeros(width, steps, 1, dtype=torch.bool, device=self.mask.device))
        set_hidden_state(td, self.hidden_state, steps)
        return td


@dataclass(slots=True, frozen=True, eq=False, repr=False)
class ReplaySequenceBatch(_TransitionFields):
    """Sequences of consecutive steps of one env each, from [`ReplayBuffer.sample_sequences`][rlbuf.ReplayBuffer.sample_sequences].

    Batch first: every field is ``[B, burn_in + length, ...]``; the first ``burn_in`` steps
    are for warming up a recurrent state. A sequence never crosses the ring's write cursor,
    but it may run past the end of an episode into the env's next one: ``mask`` is False from
    the step after the first episode end on (R2D2-style losses average over ``mask``), and
    ``is_first`` marks each episode's first step (DreamerV3-style models reset their state there).

    Attributes:
        obs: observations ``[B, S, *obs_shape]`` (a ``TensorDict`` for dict observations).
        action: actions ``[B, S, *action_shape]``.
        reward: rewards ``[B, S]``.
        next_obs: next observations ``[B, S, *obs_shape]``.
        terminated: ``[B, S]`` bool.
        truncated: ``[B, S]`` bool.
        done: ``terminated | truncated`` ``[B, S]`` bool.
        mask: True while the sequence is still in its first step's episode ``[B, S]``.
        is_first: True at an episode's first step ``[B, S]`` (at step 0: when the env's
            previous row ended an episode or the env had none; False when unknown because
            that row was overwritten).
        hidden_state: the hidden state stored with each sequence's first step ``[B, *shape]``,
            or ``None`` when the buffer stores none.
        index: storage positions of the steps ``[B, S]``.
        burn_in: how many leading steps are burn-in.
        extras: extra fields ``[B, S, ...]`` (also readable as attributes).
    """

    mask: torch.Tensor
    is_first: torch.Tensor
    hidden_state: torch.Tensor | TensorDict | None
    index: torch.Tensor
    burn_in: int
    extras: dict[str, torch.Tensor] = field(default_factory=dict)

    def __len__(self) -> int:
        """Sequences in the batch (``B``)."""
        return int(self.mask.shape[0])

    def to_tensordict(self) -> TensorDict:
        """The batch in TorchRL's layout, batch size ``[B, S]``, with ``"mask"`` and ``"is_init"``.

        ``"is_init"`` is ``is_first`` (``[B, S, 1]``), and the hidden state is at TorchRL's
        ``recurrent_state*`` keys, at the first step (zeros after): TorchRL's ``LSTMModule``/
        ``GRUModule`` in recurrent mode start from the stored state and from zeros where an
        episode starts inside the sequence.

        Example:
            >>> from rlbuf import ReplayBuffer
            >>> buf = ReplayBuffer(20, obs_shape=(2,), action_shape=(), hidden_state_shape=(1, 4), seed=0)
            >>> for t in range(6):
            ...     buf.add(torch.zeros(2), 0.0, 1.0, torch.zeros(2), t == 2, hidden_state=torch.zeros(1, 4), truncated=False)
            >>> td = buf.sample_sequences(3, 4).to_tensordict()
            >>> td.batch_size, td["next", "reward"].shape, td["recurrent_state"].shape
            (torch.Size([3, 4]), torch.Size([3, 4, 1]), torch.Size([3, 4, 1, 4]))
        """
        sequences, steps = self.mask.shape
        td = TensorDict({
            "observation": self.obs, "action": self.action, "index": self.index, "mask": self.mask,
            "is_init": self.is_first.unsqueeze(-1),
            "next": {"observation": self.next_obs, "reward": _torchrl_layout(self.reward, 2),
                     "terminated": _torchrl_layout(self.terminated, 2),
                     "truncated": _torchrl_layout(self.truncated, 2), "done": _torchrl_layout(self.done, 2)},
        }, batch_size=[sequences, steps], device=self.mask.device)
        for name, value in self.extras.items():
            td.set(name, value)
        set_hidden_state(td, self.hidden_state, steps)
        return td


def burn_in_steps(value: object) -> int:
    """``burn_in`` as an int ≥ 0, else ``BatchSizeError``.

    Example:
        >>> burn_in_steps(-1)
        Traceback (most recent call last):
        ...
        rlbuf.errors.BatchSizeError: burn_in: expected an int >= 0, got -1
    """
    try:
        steps = None if isinstance(value, bool) else operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        steps = None
    if steps is None or steps < 0:
        raise BatchSizeError(f"burn_in: expected an int >= 0, got {value!r}")
    return steps


def sequence_starts(*, write_count: int, size: int, num_envs: int, span: int, batch_size: int,
                    generator: torch.Generator) -> torch.Tensor:
    """Serials (rows written before) of ``batch_size`` sequence starts drawn uniformly.

    Rows of one env follow each other ``num_envs`` serials apart, so a sequence of ``span``
    steps starting at serial ``s`` is ``s, s + num_envs, ...``; it must lie between the oldest
    stored row and the newest one, never across the write cursor.

    Raises:
        BatchSizeError: fewer stored steps per env than ``span``.

    Example:
        >>> starts = sequence_starts(write_count=12, size=8, num_envs=2, span=3, batch_size=4,
        ...                          generator=torch.Generator().manual_seed(0))
        >>> bool(((starts >= 4) & (starts + 2 * 2 < 12)).all())
        True
    """
    oldest = write_count - size
    choices = write_count - (span - 1) * num_envs - oldest
    if choices <= 0:
        raise BatchSizeError(f"length: burn_in + length = {span} steps per sequence, but the buffer holds "
                             f"at most {-(-size // num_envs)} consecutive steps of one env")
    return oldest + torch.randint(0, choices, (batch_size,), generator=generator, device=generator.device)


def sequence_flags(done: torch.Tensor, first_is_first: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``mask`` and ``is_first`` ``[B, S]`` from the ``done`` flags of the steps ``[B, S]``.

    Example:
        >>> done = torch.tensor([[False, True, False, False]])
        >>> mask, is_first = sequence_flags(done, torch.tensor([True]))
        >>> mask.tolist(), is_first.tolist()
        ([[True, True, False, False]], [[True, False, True, False]])
    """
    ended_before = done.cumsum(1) - done.to(torch.int64)
    is_first = torch.cat((first_is_first.unsqueeze(1), done[:, :-1]), dim=1)
    return ended_before == 0, is_first


def sample_replay_sequences(ring: RowRing, batch_size: int, length: int, burn_in: int, *, num_envs: int,
                            interleaved: Callable[[], bool], hidden: Layout | None,
                            device: torch.device) -> tuple[dict[str, torch.Tensor], int]:
    """The columns of ``batch_size`` sequences of ``burn_in + length`` steps of one env each, and that span.

    What [`ReplayBuffer.sample_sequences`][rlbuf.ReplayBuffer.sample_sequences] draws: columns
    ``[B, span, ...]`` with ``mask``, ``is_first`` and ``index``, hidden-state leaves at each
    sequence's first step, delivered on ``device``. ``interleaved()`` says, under the ring's lock (no
    write between it and the draw), whether each env's rows are ``num_envs`` apart.

    Raises:
        BatchSizeError, EmptyBufferError: see ``sample_sequences``.
        ConfigError: steps of one env are not ``num_envs`` rows apart, or an extra field is named
            like a column of the sequence batch (``mask``, ``is_first``).

    Example:
        >>> from rlbuf import ReplayBuffer
        >>> buf = ReplayBuffer(8, obs_shape=(1,), action_shape=(), seed=0)
        >>> for t in range(4):
        ...     buf.add(torch.full((1,), float(t)), 0.0, 0.0, torch.full((1,), t + 1.0), False, truncated=False)
        >>> columns, span = sample_replay_sequences(buf._ring, 2, 3, 0, num_envs=1, interleaved=lambda: True, hidden=None,
        ...                                         device=torch.device("cpu"))
        >>> span, columns["obs"].shape
        (3, torch.Size([2, 3, 1]))
    """
    refuse_hidden_columns(ring.by_name, SEQUENCE_COLUMNS, "sample_sequences")
    with ring.lock:
        batch_size = ring.require_rows(batch_size, without_replacement=False)
        span = positive_int("length", length, BatchSizeError) + burn_in_steps(burn_in)
        try:  # a batch of batch_size * span rows: refused before anything is drawn, as sample's batch is
            check_batch_memory(batch_size * span, ring.row_bytes)
        except BatchSizeError as error:
            raise BatchSizeError(f"batch_size, length: {batch_size} sequences of burn_in + length = {span} steps "
                                 f"are {batch_size * span} rows ({error})") from None
        if not interleaved():
            raise ConfigError("sample_sequences: steps of one env are not num_envs rows apart: rows were "
                              "extended env-major (batch size (num_envs, T)), added with an env_mask that left "
                              "envs out, extended into a buffer of num_envs=1 with batches of several envs' steps ((envs, T)), "
                              "or written through buffer.torchrl. Build it with num_envs=envs, extend time-major "
                              "batches (T, num_envs) or add every env's step (a Recorder: SAME_STEP envs), then clear() "
                              "and refill")
        ring.flush()
        size, write_count, n, capacity = len(ring), ring.write_count, num_envs, ring.capacity
        starts = sequence_starts(write_count=write_count, size=size, num_envs=n, span=span,
                                 batch_size=batch_size, generator=ring.generator)
        serials = starts.unsqueeze(1) + n * torch.arange(span, device=starts.device)
        index = (serials % capacity).reshape(-1)
        previous = starts - n
        stored_before = previous >= write_count - size
        previous_done = ring.gather(torch.where(stored_before, previous, starts) % capacity, ["done"])["done"]
        first_is_first = torch.where(stored_before, previous_done, previous < 0)
        columns = {name: column.view(batch_size, span, *column.shape[1:])
                   for name, column in ring.gather(index).items()}
        mask, is_first = sequence_flags(columns["done"], first_is_first)
        columns |= {"mask": mask, "is_first": is_first, "index": index.view(batch_size, span)}
        if hidden is not None:
            columns |= {name: columns[name][:, 0] for name in leaf_names("hidden_state", hidden)}
        return deliver(columns, device), span
