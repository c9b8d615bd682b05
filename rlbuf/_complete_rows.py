"""Which stored rows of a compact replay buffer are complete transitions, their priority mass, and exact draws
among them alone.

A row is no complete transition while it waits for its next ``n_step`` rows (the newest rows of
an env's open episode) or once the older frames of its stack were overwritten (the first
``frame_stack - 1`` rows each env still holds); see [`rlbuf._streams`][rlbuf._streams]. So the
incomplete rows lie among each env's newest ``n_step`` and oldest ``frame_stack - 1`` rows, which
``incomplete_positions`` finds near the ring's two ends (the whole ring walked only where an env's
rows there are too few to tell: an env that stopped adding, or one that never added).

Example:
    >>> import torch
    >>> from rlbuf import ReplayBuffer
    >>> buf = ReplayBuffer(8, obs_shape=(1,), action_shape=(), n_step=2, prioritized=True, seed=0)
    >>> for t in range(3):
    ...     buf.add(torch.tensor([t * 1.0]), 0.0, 1.0, torch.tensor([t + 1.0]), False, truncated=False)
    >>> incomplete_positions(buf._compact).tolist()      # rows 1 and 2 wait for their next steps
    [1, 2]
    >>> buf.update_priority([0, 1, 2], [1.0, 1e6, 1e6])
    >>> sampler = buf._ring.rb.sampler
    >>> _, total, _ = sampler.sampled_mass(buf._ring.rb.storage)
    >>> round(complete_mass(buf._compact, sampler, total), 6)    # (p + eps) ** alpha of row 0 alone
    1.0
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import torch

from rlbuf._sumtree import SumTreeSampler
from rlbuf.errors import EmptyBufferError

if TYPE_CHECKING:
    from rlbuf._compact import CompactLayout

_Ints = npt.NDArray[np.int64]
# A complete mass taken as the total less the incomplete rows' loses about total / rest ulps of its own: past
# 2 ** 20 of them (incomplete rows hold nearly all the mass), it is summed over the complete rows instead.
_CANCELLATION = 2.0**-20
NOTHING_COMPLETE = ("sample: no transition is complete yet: each needs the observation after it (n_step of them "
                    "with n_step > 1) unless its episode ended; add more steps first")


def incomplete_positions(layout: CompactLayout) -> _Ints:
    """Positions of the stored rows that are no complete transition now, sorted (the ring flushed, its lock held).

    Walks the rows of two windows, the oldest stored rows and the newest, each ``num_envs * (n_step +
    frame_stack)`` rows wide and doubled until every env with an open episode has ``n_step`` rows in the newest
    and every env ``frame_stack - 1`` in the oldest (then every incomplete row is in them), or until they meet
    (then every stored row is walked).
    """
    ring, streams = layout.ring, layout.streams
    size, write_count, capacity = len(ring), ring.write_count, ring.capacity
    oldest = write_count - size
    width = streams.num_envs * (layout.n_step + layout.frame_stack)
    positions = None
    while 2 * width < size and positions is None:
        serials = np.concatenate([np.arange(oldest, oldest + width), np.arange(write_count - width, write_count)])
        windows = serials % capacity
        if _windows_hold_every_incomplete_row(layout, streams.env[windows], width, oldest):
            positions = np.sort(windows)
        width *= 2
    if positions is None:
        positions = np.arange(size, dtype=np.int64)
    found: _Ints = positions[~layout.walk(positions).complete]
    return found


def _windows_hold_every_incomplete_row(layout: CompactLayout, envs: _Ints, width: int, oldest: int) -> bool:
    """Whether the oldest ``width`` rows and the newest (``envs``: their envs, oldest rows first) hold each env's
    first ``frame_stack - 1`` stored rows and the newest ``n_step`` rows of each open episode."""
    if not (envs >= 0).all():  # rows of a checkpoint that kept no envs: nothing tells which env a row is
        return False
    num_envs = layout.streams.num_envs
    open_ = layout.streams.last >= oldest  # an open episode whose newest row is stored
    newest = np.bincount(envs[width:], minlength=num_envs)
    if not (newest[open_] >= layout.n_step).all():
        return False
    return layout.frame_stack == 1 or bool((np.bincount(envs[:width], minlength=num_envs)
                                            >= layout.frame_stack - 1).all())


def complete_mass(layout: CompactLayout, sampler: SumTreeSampler, total: float) -> float:
    """The total ``q = (p + eps) ** alpha`` of the stored rows that are complete transitions, given ``total``, that
    of every stored row (the ring flushed, its lock held): the mass a Ray service weighs this buffer's share of a
    batch by."""
    held = float(sampler.leaf_values(incomplete_positions(layout)).sum())
    if total - held > total * _CANCELLATION:
        return total - held
    return float(sampler.leaf_values(_complete_positions(layout)).sum())


def _complete_positions(layout: CompactLayout) -> _Ints:
    positions = np.arange(len(layout.ring), dtype=np.int64)
    kept: _Ints = np.delete(positions, incomplete_positions(layout))
    return kept


def draw_among_complete(layout: CompactLayout, count: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``count`` positions drawn among the complete transitions alone, with the buffer's generator: in proportion
    to ``q`` with a prioritized buffer (and the importance weights ``sample`` gives them), else uniformly.

    Raises:
        EmptyBufferError: no transition is complete.
    """
    ring = layout.ring
    positions = _complete_positions(layout)
    if positions.size == 0:
        raise EmptyBufferError(NOTHING_COMPLETE)
    generator, sampler = ring.generator, ring.rb.sampler
    if isinstance(sampler, SumTreeSampler):
        cumulative = np.cumsum(sampler.leaf_values(positions).astype(np.float64))
        uniform = torch.rand(count, generator=generator, dtype=torch.float64, device=generator.device)
        # side="right": a row of q = 0 (eps = 0) is never where a draw lands
        picked = np.searchsorted(cumulative, uniform.cpu().numpy() * cumulative[-1], side="right")
        last = np.searchsorted(cumulative, cumulative[-1])  # the last row with mass: where round-off may carry past
        index = torch.from_numpy(positions[np.minimum(picked, last)])
        index = index.to(ring.storing_device)
        return index, sampler.weights(ring.rb.storage, index).to(torch.float32)
    picked_uniformly = torch.randint(0, positions.size, (count,), generator=generator, device=generator.device)
    return torch.from_numpy(positions)[picked_uniformly.cpu()].to(ring.storing_device), None
