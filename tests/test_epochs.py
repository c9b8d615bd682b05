"""EpochIterator and batch_bounds: every row exactly once per epoch, reshuffled, resumable."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlbuf import DistillationBuffer, ReplayBuffer, RolloutBuffer
from rlbuf.epochs import EpochIterator, batch_bounds
from rlbuf.errors import (
    BatchSizeError,
    CheckpointError,
    ConfigError,
    EmptyBufferError,
    StoredIndexError,
)


def iterator(size: int, seed: int = 0, **kwargs: object) -> EpochIterator[torch.Tensor]:
    return EpochIterator(size, lambda index: index, generator=torch.Generator().manual_seed(seed), **kwargs)  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(size=st.integers(1, 200), data=st.data(), n_epochs=st.integers(1, 4), drop_last=st.booleans(),
       by_count=st.booleans())
def test_each_row_once_per_epoch(size: int, data: st.DataObject, n_epochs: int, drop_last: bool, by_count: bool) -> None:
    if by_count:
        count = data.draw(st.integers(1, size))
        it, per_epoch = iterator(size, num_batches=count, n_epochs=n_epochs), count
        drop_last = False
    else:
        batch = data.draw(st.integers(1, size))
        it = iterator(size, batch_size=batch, n_epochs=n_epochs, drop_last=drop_last)
        per_epoch = size // batch if drop_last or size % batch == 0 else size // batch + 1
    assert len(it) == per_epoch * n_epochs
    batches = list(it)
    assert len(batches) == per_epoch * n_epochs and len(it) == 0
    for epoch in range(n_epochs):
        rows = torch.cat(batches[epoch * per_epoch:(epoch + 1) * per_epoch]).tolist()
        assert len(rows) == len(set(rows))                       # nothing duplicated
        if not drop_last:
            assert sorted(rows) == list(range(size))             # nothing lost
    if by_count:
        sizes = {len(b) for b in batches}
        assert max(sizes) - min(sizes) <= 1


def test_epochs_are_reshuffled_and_len_counts_down() -> None:
    it = iterator(64, batch_size=64, n_epochs=3)
    first = it.next_batch()
    assert len(it) == 2
    second = next(it)
    assert not torch.equal(first, second) and sorted(first.tolist()) == sorted(second.tolist())


def test_no_shuffle_is_storage_order() -> None:
    assert torch.cat(list(iterator(7, batch_size=3, shuffle=False))).tolist() == list(range(7))


def test_zero_epochs_draws_random_batches_forever() -> None:
    it = iterator(10, batch_size=8, n_epochs=0)
    batches = [it.next_batch() for _ in range(50)]
    assert all(len(b) == 8 for b in batches)
    assert torch.cat(batches).max() < 10
    with pytest.raises(TypeError, match="never ends"):
        len(it)


def test_zero_epochs_sees_rows_added_later_and_allows_batches_larger_than_the_data() -> None:
    rows = [4]
    it: EpochIterator[torch.Tensor] = EpochIterator(lambda: rows[0], lambda index: index, batch_size=16, n_epochs=0,
                                                    generator=torch.Generator().manual_seed(0))
    assert int(it.next_batch().max()) < 4
    rows[0] = 100
    assert int(torch.cat([it.next_batch() for _ in range(20)]).max()) >= 4


def test_state_dict_resumes_at_the_next_batch_mid_epoch() -> None:
    original = iterator(50, seed=3, batch_size=8, n_epochs=3)
    for _ in range(9):
        original.next_batch()
    state = original.state_dict()
    resumed = iterator(50, seed=99, batch_size=8, n_epochs=3)
    resumed.load_state_dict(state)
    assert len(resumed) == len(original)
    assert all(torch.equal(a, b) for a, b in zip(original, resumed, strict=True))
    with pytest.raises(CheckpointError, match="batch_size is 4 here but 8"):
        iterator(50, batch_size=4, n_epochs=3).load_state_dict(state)


def test_each_epoch_covers_the_rows_present_when_it_starts() -> None:
    rows = [6]
    it: EpochIterator[torch.Tensor] = EpochIterator(lambda: rows[0], lambda index: index, batch_size=4, n_epochs=2,
                                                    generator=torch.Generator().manual_seed(0))
    first = it.next_batch()
    rows[0] = 10                    # data added during the first epoch
    first_epoch = torch.cat([first, it.next_batch()])
    assert sorted(first_epoch.tolist()) == list(range(6))
    second_epoch = torch.cat(list(it))
    assert sorted(second_epoch.tolist()) == list(range(10))


@pytest.mark.parametrize(("kwargs", "error", "message"), [
    ({"size": 10}, BatchSizeError, "exactly one"),
    ({"size": 10, "batch_size": 0}, BatchSizeError, "batch_size: expected a positive int, got 0"),
    ({"size": 10, "batch_size": 11}, BatchSizeError, "batch_size: expected at most 10 (the rows stored), got 11"),
    ({"size": 10, "num_batches": 11}, BatchSizeError, "num_minibatches: expected at most 10"),
    ({"size": 0, "batch_size": 1}, EmptyBufferError, "empty"),
])
def test_bad_sizes(kwargs: dict[str, int], error: type[Exception], message: str) -> None:
    size = kwargs.pop("size")
    with pytest.raises(error) as raised:
        batch_bounds(size, **kwargs)
    assert message in str(raised.value)


def test_bad_epoch_count() -> None:
    with pytest.raises(ConfigError, match="n_epochs"):
        iterator(4, batch_size=2, n_epochs=-1)


# -- sizes by keyword: `minibatches(4)` would silently mean batches OF 4 rows to a CleanRL port --------
def _replay(seed: int = 0) -> ReplayBuffer:
    buf = ReplayBuffer(16, obs_shape=(1,), action_shape=(), seed=seed)
    for row in range(12):
        buf.add(torch.zeros(1), 0.0, float(row), torch.zeros(1), terminated=False, truncated=False)
    return buf


def _distillation(seed: int = 0) -> DistillationBuffer:
    buf = DistillationBuffer(16, obs_shape=(1,), action_shape=(), action_dtype=torch.int64, seed=seed)
    buf.add(torch.arange(12.0)[:, None], torch.arange(12))
    return buf


def _rollout(seed: int = 0) -> RolloutBuffer:
    buf = RolloutBuffer(4, 3, obs_shape=(1,), action_shape=(), seed=seed)
    for step in range(4):
        rows = torch.arange(3.0) + 3 * step
        buf.add(rows[:, None], rows, rows, torch.zeros(3, dtype=torch.bool), torch.zeros(3), torch.zeros(3),
                truncated=torch.zeros(3, dtype=torch.bool))
    buf.compute_returns_and_advantages(torch.zeros(3))
    return buf


def _rows(batch: Any) -> list[float]:
    return [float(value) for value in batch.expert_action] if hasattr(batch, "expert_action") else batch.reward.tolist()


ITERATORS = {
    "RolloutBuffer.minibatches": (_rollout, "minibatches"),
    "RolloutBuffer.epochs": (_rollout, "epochs"),
    "ReplayBuffer.epochs": (_replay, "epochs"),
    "DistillationBuffer.epochs": (_distillation, "epochs"),
}


@pytest.mark.parametrize("which", ITERATORS)
@settings(max_examples=10, deadline=None)
@given(size=st.one_of(st.integers(-3, 12), st.floats(allow_nan=False), st.none()), more=st.booleans())
def test_a_size_given_by_position_is_refused_with_both_keyword_spellings(which: str, size: Any, more: bool) -> None:
    make, method = ITERATORS[which]
    buf, twin = make(), make()
    positional = (size, 2) if more else (size,)
    with pytest.raises(BatchSizeError) as raised:
        getattr(buf, method)(*positional)
    n = size if isinstance(size, int) and size > 0 else 4
    message = str(raised.value)
    assert message.startswith(f"{method}: expected sizes by keyword, got {method}({size!r}")
    assert f"{method}(batch_size={n}) for minibatches of {n} rows" in message
    second = (f"minibatches(num_minibatches={n}) for {n} minibatches per epoch" if method == "minibatches"
              else f"epochs(batch_size=..., n_epochs={n}) for {n} passes over the stored rows")
    assert second in message
    # Refused before anything changed: the next iterator shuffles as the untouched twin's does.
    assert buf.current_epochs is None
    ours, theirs = getattr(buf, method)(batch_size=5), getattr(twin, method)(batch_size=5)
    assert [_rows(b) for b in ours] == [_rows(b) for b in theirs]


@pytest.mark.parametrize("which", ITERATORS)
def test_sizes_by_keyword_still_split_as_before(which: str) -> None:
    make, method = ITERATORS[which]
    buf = make()
    by_size = getattr(buf, method)(batch_size=5, n_epochs=2)
    assert [len(_rows(b)) for b in by_size] == [5, 5, 2, 5, 5, 2]
    assert [len(_rows(b)) for b in getattr(buf, method)(batch_size=5, drop_last=True)] == [5, 5]
    epoch = sorted(value for batch in getattr(buf, method)(batch_size=4) for value in _rows(batch))
    assert epoch == sorted(_rows(buf.get_all_data() if method == "minibatches" else buf.sample_all()))
    if method == "minibatches":
        assert [len(_rows(b)) for b in buf.minibatches(num_minibatches=5)] == [3, 3, 2, 2, 2]


def test_the_iterator_saved_with_a_checkpoint_is_made_again_by_keyword(tmp_path: Path) -> None:
    buf = _rollout()
    iterator = buf.minibatches(num_minibatches=4, n_epochs=2)
    next(iterator)
    buf.save(tmp_path / "rollout")
    loaded = RolloutBuffer.load(tmp_path / "rollout")
    assert loaded.current_epochs is not None
    assert [_rows(b) for b in loaded.current_epochs] == [_rows(b) for b in iterator]


def test_an_iterator_made_before_a_clear_or_a_load_refuses_its_next_batch() -> None:
    """Its rows are gone: it must not hand out rows no longer stored, nor rows stored since at their positions."""
    def filled(rows: int) -> ReplayBuffer:
        buffer = ReplayBuffer(16, obs_shape=(1,), action_shape=(), seed=0)
        for i in range(rows):
            buffer.add(torch.full((1,), float(i)), 0.0, float(i), torch.zeros(1), False, truncated=False)
        return buffer

    buffer = filled(10)
    held = buffer.epochs(batch_size=4, n_epochs=2)
    next(held)
    buffer.clear()
    buffer.add(torch.zeros(1), 0.0, 900.0, torch.zeros(1), False, truncated=False)
    with pytest.raises(StoredIndexError, match="cleared or loaded after this iterator was made"):
        next(held)
    saved = filled(10)
    saved_epochs = saved.epochs(batch_size=4, n_epochs=2)
    next(saved_epochs)
    held = buffer.epochs(batch_size=1)
    buffer.load_state_dict(saved.state_dict())
    with pytest.raises(StoredIndexError, match="cleared or loaded"):
        next(held)
    assert buffer.current_epochs is not None
    assert torch.equal(next(buffer.current_epochs).index, next(saved_epochs).index)  # the restored one resumes
    rollout = RolloutBuffer(2, 1, obs_shape=(1,), action_shape=())
    for _ in range(2):
        rollout.add(torch.zeros(1, 1), torch.zeros(1), torch.ones(1), torch.zeros(1, dtype=torch.bool), torch.zeros(1),
                    torch.zeros(1), truncated=False)
    rollout.compute_returns_and_advantages(torch.zeros(1))
    minibatches = rollout.minibatches(batch_size=1, n_epochs=2)
    next(minibatches)
    rollout.compute_returns_and_advantages(torch.ones(1))  # advantages again between batches: the rows stay
    next(minibatches)
    rollout.clear()
    with pytest.raises(StoredIndexError, match="cleared or loaded"):
        next(minibatches)


@pytest.mark.parametrize("sequences", [False, True])
def test_an_iterator_follows_advantages_and_extras_set_again_as_a_resumed_one_does(
        sequences: bool, tmp_path: Path) -> None:
    # Its remaining batches mixed the new advantages with the old attached extras (rows), or kept the old
    # advantages (sequences: padded once), while the iterator resumed from a checkpoint gave the new (helper 46).
    steps, envs = 4, 2
    rollout = RolloutBuffer(steps, envs, obs_shape=(1,), action_shape=(), seed=0)
    for t in range(steps):
        rollout.add(torch.full((envs, 1), float(t)), torch.zeros(envs), torch.ones(envs), torch.tensor([t == 1, False]),
                    torch.zeros(envs), torch.zeros(envs), truncated=False)
    zeros = torch.zeros(steps, envs)
    rollout.set_extras({"advantage": zeros, "returns": zeros, "tag": zeros})
    held = rollout.minibatches(num_minibatches=2, sequences=sequences)
    next(held)
    rollout.set_extras({"advantage": zeros + 1, "returns": zeros + 1, "tag": zeros + 1})
    rollout.save(tmp_path / "ckpt")
    resumed = RolloutBuffer.load(tmp_path / "ckpt").current_epochs
    assert resumed is not None
    ours, theirs = next(held), next(resumed)
    for name in ("obs", "advantage", "returns", "tag"):
        assert torch.equal(getattr(ours, name), getattr(theirs, name)), name
    kept = ours.mask if sequences else torch.ones_like(ours.advantage, dtype=torch.bool)
    assert ours.advantage[kept].eq(1).all() and ours.tag[kept].eq(1).all()


@pytest.mark.parametrize(("row", "ended"), [(2, False), (3, True)])
def test_a_sequence_iterator_refuses_once_its_trajectories_were_rewritten(row: int, ended: bool) -> None:
    # A done removed or added through buffer.torchrl changed the trajectories under the iterator: an IndexError,
    # or a trajectory silently left out of the epoch (review).
    steps, envs = 4, 2
    rollout = RolloutBuffer(steps, envs, obs_shape=(1,), action_shape=(), seed=0)
    for t in range(steps):
        rollout.add(torch.full((envs, 1), float(t)), torch.zeros(envs), torch.ones(envs), torch.tensor([t == 1, False]),
                    torch.zeros(envs), torch.zeros(envs), truncated=False)
    rollout.compute_returns_and_advantages(torch.zeros(envs))
    held = rollout.minibatches(batch_size=1, sequences=True, shuffle=False)
    next(held)
    td = rollout.torchrl[row].exclude("advantage", "value_target")
    td["next", "terminated"] = td["next", "done"] = torch.tensor([ended])
    rollout.torchrl[row] = td
    with pytest.raises(StoredIndexError, match="episode ends were rewritten after this iterator was made"):
        next(held)


@pytest.mark.parametrize("make", [_replay, _distillation])
def test_an_epoch_whose_rows_were_emptied_through_torchrl_gives_no_row_past_those_stored(make: Any, tmp_path: Path) -> None:
    # The epoch went on over its permutation of 12 rows: after buffer.torchrl.empty() it handed out rows no longer
    # stored, and once 3 rows were added again a save kept its state, which load refused (helper 69).
    buf = make()
    iterator = buf.epochs(batch_size=5, n_epochs=2)
    next(iterator)
    buf.torchrl.empty()
    with pytest.raises(StoredIndexError, match="holds 0 rows now, the running epoch covers 12"):
        next(iterator)
    for row in range(3):
        if isinstance(buf, DistillationBuffer):
            buf.add(torch.zeros(1), row)
        else:
            buf.add(torch.zeros(1), 0.0, float(row), torch.zeros(1), terminated=False, truncated=False)
    with pytest.raises(StoredIndexError, match="holds 3 rows now, the running epoch covers 12"):
        next(iterator)
    assert len(iterator) == 5  # the refused batch is still the next one
    buf.save(tmp_path / "buffer")
    loaded = type(buf).load(tmp_path / "buffer")
    assert len(loaded) == 3 and loaded.current_epochs is None
    assert sorted(_rows(batch)[0] for batch in buf.epochs(batch_size=1)) == [0.0, 1.0, 2.0]
