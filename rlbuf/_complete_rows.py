"""Which stored rows of a compact replay buffer are complete transitions, their priority mass, and exact draws
among them alone.

A row is no complete transition while it waits for its next ``n_step`` rows (the newest rows of
an env's open episode) or once the older frames of its stack were overwritten (the first
``frame_stack - 1`` rows each env still holds); see [`rlbuf._streams`][rlbuf._streams]. So the
incomplete rows lie among each env's newest ``n_step`` and oldest ``frame_stack - 1`` rows, which
``incomplete_positions`` finds from the stream tables: back from each open episode's newest row, and
among the ring's oldest rows (a scan of the stacks' oldest links where an env has too few rows there:
one that stopped adding, or never added), then walks those alone.

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

    Walks candidates alone, found in the stream tables: the rows ``n_step - 1`` links or fewer before each open
    episode's newest row (``last``), and the rows whose stack reaches an overwritten row (their oldest ``back``
    serial is older than the oldest stored row), taken from the oldest ``num_envs * (n_step + frame_stack)``
    rows where every env has ``frame_stack - 1`` rows there, else from a scan of ``back``'s first column.
    """
    ring, streams = layout.ring, layout.streams
    size, write_count = len(ring), ring.write_count
    oldest = write_count - size
    width = streams.num_envs * (layout.n_step + layout.frame_stack)
    if 2 * width >= size:
        positions = np.arange(size, dtype=np.int64)
    else:
        waiting = _waiting_rows(layout, oldest, write_count, width)
        positions = np.unique(np.concatenate([waiting, _overwritten_stacks(layout, oldest, width)]) % ring.capacity)
    found: _Ints = positions[~layout.walk(positions).complete]
    return found


def _waiting_rows(layout: CompactLayout, oldest: int, write_count: int, width: int) -> _Ints:
    """Serials of the rows that may wait for their next steps: each open episode's newest stored row and the
    ``n_step - 1`` rows before it in its episode (the rows ``walk`` finds no ``n_step`` rows after)."""
    streams = layout.streams
    frontier = streams.last[streams.last >= oldest]
    chain = [frontier]
    for _ in range(layout.n_step - 1):
        if frontier.size == 0:
            break
        frontier = _previous_rows(layout, frontier, oldest, write_count, width)
        chain.append(frontier)
    return np.concatenate(chain)


def _previous_rows(layout: CompactLayout, serials: _Ints, oldest: int, write_count: int, width: int) -> _Ints:
    """Serials of the stored rows before ``serials`` in their episodes (none for an episode's first row)."""
    streams = layout.streams
    capacity = streams.capacity
    if layout.frame_stack > 1:  # the newest older frame of a row's stack is the row before it
        links = streams.back[serials % capacity, -1]
        kept: _Ints = links[links >= oldest]  # -1 - start at an episode's start; an overwritten row's serial
        return kept
    # No back links: the row before is the one whose next is this one, looked for among the newest rows first.
    window = np.arange(max(oldest, write_count - width), write_count, dtype=np.int64)
    window_next = streams.next[window % capacity]
    order = np.argsort(window_next)
    at = np.minimum(np.searchsorted(window_next[order], serials), len(window) - 1)
    matched = window_next[order[at]] == serials
    before: _Ints = window[order[at[matched]]]
    envs = streams.env[window % capacity]
    first_seen = np.full(streams.num_envs + 1, write_count, np.int64)  # each env's oldest row there (-1: last)
    seen, first = np.unique(envs, return_index=True)
    first_seen[seen] = window[first]
    first_seen[-1] = write_count
    # Settled: found, or the env's row before it is in the window (an env's rows there are its newest) and
    # links elsewhere (it ended its episode): then this row starts one.
    unsettled = serials[~matched & (first_seen[streams.env[serials % capacity]] >= serials)]
    if unsettled.size:  # an env that stopped adding, or rows of a checkpoint that kept no envs: every row's next
        hits = np.flatnonzero(np.isin(streams.next[:len(layout.ring)], unsettled))
        before = np.concatenate([before, oldest + (hits - oldest) % capacity])
    return before


def _overwritten_stacks(layout: CompactLayout, oldest: int, width: int) -> _Ints:
    """Positions among which lie all the rows whose stack reaches an overwritten row: each env's first
    ``frame_stack - 1`` stored rows (a stack reaches back ``frame_stack - 1`` rows of its env at most)."""
    streams = layout.streams
    if layout.frame_stack == 1:
        return np.empty(0, np.int64)
    window = np.arange(oldest, oldest + width, dtype=np.int64) % streams.capacity
    envs = streams.env[window]
    if (envs >= 0).all() and (np.bincount(envs, minlength=streams.num_envs) >= layout.frame_stack - 1).all():
        return window
    # An env with fewer rows there (left out of adds, never adding, rows of a checkpoint that kept no envs):
    # the rows whose oldest stack serial is older than the oldest row's, a slot before an episode's start
    # holding -1 - start (the oldest serial of a stack is its first slot's: serials are in time order).
    first = streams.back[:len(layout.ring), 0]
    reaches: _Ints = np.flatnonzero((first + oldest).view(np.uint64) < 2 * oldest)  # -oldest <= first < oldest
    return reaches


def complete_mass(layout: CompactLayout, sampler: SumTreeSampler, total: float) -> float:
    """The total ``q = (p + eps) ** alpha`` of the stored rows that are complete transitions, given ``total``, that
    of every stored row (the ring flushed, its lock held): the mass a Ray service weighs this buffer's share of a
    batch by."""
    incomplete = incomplete_positions(layout)
    held = float(sampler.leaf_values(incomplete).sum())
    if total - held > total * _CANCELLATION:
        return total - held
    return float(sampler.leaf_values(_complete_positions(layout, incomplete)).sum())


def _complete_positions(layout: CompactLayout, incomplete: _Ints | None = None) -> _Ints:
    """Positions of the stored rows that are complete transitions (``incomplete``: the others, where known)."""
    positions = np.arange(len(layout.ring), dtype=np.int64)
    kept: _Ints = np.delete(positions, incomplete_positions(layout) if incomplete is None else incomplete)
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
