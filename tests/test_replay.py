"""ReplayBuffer: adds, extends, sampling, PER, devices, bad input, and equality with TorchRL's path."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from _snapshot import same, snapshot
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer

from rlbuf import (
    ConfigError,
    DtypeError,
    MissingFieldError,
    NonFiniteError,
    PriorityError,
    ReplayBatch,
    ReplayBuffer,
    ShapeError,
    Transition,
)


def make(capacity: int = 16, storage: str = "memory", **kwargs: Any) -> ReplayBuffer:
    kwargs.setdefault("obs_shape", (3,))
    kwargs.setdefault("action_shape", (2,))
    kwargs.setdefault("seed", 0)
    return ReplayBuffer(capacity, storage=storage, **kwargs)  # type: ignore[arg-type]


def add_ids(buf: ReplayBuffer, ids: range | list[int]) -> None:
    """Add one step per id; every field encodes the id so rows can be traced."""
    n = buf.num_envs
    for i in ids:
        rows = torch.arange(n) + i * 1000
        buf.add(
            obs=rows[:, None].float().expand(n, 3).clone(),
            action=rows[:, None].float().expand(n, 2).clone(),
            reward=rows.float(),
            next_obs=rows[:, None].float().expand(n, 3) + 0.5,
            terminated=(rows % 3 == 0),
            truncated=(rows % 5 == 0),
        )


GOOD: dict[str, Any] = {
    "obs": torch.zeros(3), "action": torch.zeros(2), "reward": 1.0, "next_obs": torch.zeros(3),
    "terminated": False, "truncated": False,
}


# -- writing -------------------------------------------------------------------------------
def test_single_env_add_accepts_numbers_numpy_and_omitted_env_dim(storage: str) -> None:
    buf = make(storage=storage, action_shape=(), action_dtype=torch.int64)
    buf.add(np.zeros(3, np.float32), 1, 0.5, np.ones(3, np.float32), False, True)
    buf.add(torch.ones(1, 3), torch.tensor([0]), torch.tensor([2.0]), torch.zeros(1, 3), torch.tensor([True]), truncated=False)
    batch = buf.sample_all()
    assert batch.action.tolist() == [1, 0]
    assert batch.reward.tolist() == [0.5, 2.0]
    assert batch.terminated.tolist() == [False, True]
    assert batch.truncated.tolist() == [True, False]
    assert batch.done.tolist() == [True, True]
    assert batch.next_obs[0].tolist() == [1.0, 1.0, 1.0]


def test_vectorised_add_stores_one_row_per_env_in_env_order(storage: str) -> None:
    buf = make(storage=storage, num_envs=4)
    add_ids(buf, range(3))
    assert len(buf) == 12
    assert buf.sample_all().reward.tolist() == [float(i * 1000 + e) for i in range(3) for e in range(4)]


def test_add_a_transition_tuple() -> None:
    buf = make(extra_fields={"mask": ((2,), torch.bool)})
    step = Transition(torch.zeros(3), torch.ones(2), 1.0, torch.ones(3), False, True, {"mask": torch.tensor([True, False])})
    buf.add(step)
    batch = buf.sample_all()
    assert batch.truncated.tolist() == [True]
    assert batch.mask.tolist() == [[True, False]]
    assert batch.extras["mask"].dtype == torch.bool


def test_ring_overwrites_oldest_first_and_reports_fullness(storage: str) -> None:
    buf = make(capacity=5, storage=storage)
    add_ids(buf, range(4))
    assert not buf.is_full and buf.size == 4 and buf.capacity == 5
    add_ids(buf, range(4, 8))
    assert buf.is_full and len(buf) == 5
    assert buf.sample_all().reward.tolist() == [3000.0, 4000.0, 5000.0, 6000.0, 7000.0]


def test_float64_numpy_observations_are_stored_as_float32() -> None:
    buf = make()
    buf.add(np.full(3, 0.25), np.zeros(2), 1.0, np.zeros(3), False, truncated=False)
    assert buf.sample_all().obs.dtype == torch.float32
    assert buf.sample_all().obs.tolist() == [[0.25] * 3]


def test_uint8_observations_take_one_byte_per_value() -> None:
    buf = make(capacity=8, obs_shape=(84, 84, 4), obs_dtype=torch.uint8, action_shape=(), action_dtype=torch.int64)
    frame = np.random.default_rng(0).integers(0, 256, (84, 84, 4), dtype=np.uint8)
    buf.add(frame, 3, 1.0, frame, False, truncated=False)
    leaf = buf.torchrl.storage._storage["observation"]
    assert leaf.dtype == torch.uint8 and leaf.element_size() == 1
    assert leaf.numel() * leaf.element_size() == 8 * 84 * 84 * 4
    assert torch.equal(buf.sample_all().obs[0], torch.from_numpy(frame))


def test_extend_flattens_a_collector_batch_row_major(storage: str) -> None:
    buf = make(storage=storage)
    obs = torch.arange(2 * 5 * 3, dtype=torch.float32).reshape(2, 5, 3)
    td = TensorDict({
        "observation": obs, "action": torch.zeros(2, 5, 2), ("next", "observation"): obs + 1,
        ("next", "reward"): torch.arange(10.0).reshape(2, 5, 1),
        ("next", "terminated"): torch.zeros(2, 5, 1, dtype=torch.bool),
        ("next", "done"): torch.ones(2, 5, 1, dtype=torch.bool),
        "ignored": torch.zeros(2, 5),
    }, batch_size=[2, 5])
    buf.extend(td)
    batch = buf.sample_all()
    assert batch.reward.tolist() == list(map(float, range(10)))
    assert torch.equal(batch.obs, obs.reshape(10, 3))
    # truncated is absent: derived as done & ~terminated
    assert batch.truncated.all() and batch.done.all() and not batch.terminated.any()


def test_extend_larger_than_capacity_keeps_the_newest_rows() -> None:
    buf = make(capacity=4)
    add_ids(buf, range(1))
    td = TensorDict({
        "observation": torch.zeros(10, 3), "action": torch.zeros(10, 2), ("next", "observation"): torch.zeros(10, 3),
        ("next", "reward"): torch.arange(10.0)[:, None],
        ("next", "terminated"): torch.zeros(10, 1, dtype=torch.bool),
        ("next", "truncated"): torch.zeros(10, 1, dtype=torch.bool),
    }, batch_size=[10])
    buf.extend(td)
    assert buf.sample_all().reward.tolist() == [6.0, 7.0, 8.0, 9.0]
    assert buf._ring.write_count == 11


@pytest.mark.parametrize("layout", [{}, {"n_step": 2}, {"n_step": 2, "compression": "zstd"}])
@pytest.mark.parametrize("storage", ["memory", "memmap"])
def test_an_empty_extend_of_a_prioritized_buffer_changes_nothing(layout: dict[str, Any], storage: str) -> None:
    # A collector batch of no steps raised StoredIndexError from the priority tree, an empty float index
    # having been made of the no rows written (helper 70).
    buf = make(capacity=8, storage=storage, obs_shape=(3,), obs_dtype=torch.uint8, action_shape=(), num_envs=2,
               prioritized=True, **layout)
    for t in range(3):
        buf.add(torch.full((2, 3), t, dtype=torch.uint8), torch.zeros(2), torch.ones(2),
                torch.full((2, 3), t + 1, dtype=torch.uint8), torch.zeros(2, dtype=torch.bool),
                torch.zeros(2, dtype=torch.bool))
    empty = TensorDict({"observation": torch.zeros(2, 0, 3, dtype=torch.uint8), "action": torch.zeros(2, 0),
                        ("next", "observation"): torch.zeros(2, 0, 3, dtype=torch.uint8),
                        ("next", "reward"): torch.zeros(2, 0), ("next", "terminated"): torch.zeros(2, 0, dtype=torch.bool),
                        ("next", "truncated"): torch.zeros(2, 0, dtype=torch.bool)}, batch_size=[2, 0])
    before = snapshot(buf)
    buf.extend(empty)
    assert same(snapshot(buf), before)
    assert len(buf.sample(4)) == 4


def test_clear_empties_and_keeps_options(storage: str) -> None:
    buf = make(storage=storage)
    add_ids(buf, range(3))
    buf.clear()
    assert len(buf) == 0 and len(buf.torchrl) == 0
    add_ids(buf, range(1))
    assert buf.sample_all().reward.tolist() == [0.0]


def test_memmap_scratch_dir_is_removed_on_close() -> None:
    buf = make(storage="memmap")
    add_ids(buf, range(2))
    directory = buf._ring.scratch_dir
    assert directory is not None and directory.exists()
    buf.close()
    assert not directory.exists()


def test_memmap_buffers_get_their_own_directory_inside_scratch_dir(tmp_path: Any) -> None:
    with make(storage="memmap", scratch_dir=tmp_path / "rb") as first, make(storage="memmap", scratch_dir=tmp_path / "rb") as second:
        add_ids(first, range(2))
        add_ids(second, range(5, 7))
        assert first._ring.scratch_dir != second._ring.scratch_dir
        assert first._ring.scratch_dir is not None and first._ring.scratch_dir.parent == tmp_path / "rb"
        assert first.sample_all().reward.tolist() == [0.0, 1000.0]      # no shared files
    assert (tmp_path / "rb").exists() and not any((tmp_path / "rb").iterdir())


def test_memmap_files_live_as_long_as_the_torchrl_buffer() -> None:
    import gc

    buf = make(storage="memmap")
    add_ids(buf, range(3))
    directory, torchrl_buffer = buf._ring.scratch_dir, buf.torchrl
    del buf
    gc.collect()
    assert directory is not None and directory.exists() and len(torchrl_buffer) == 3
    del torchrl_buffer
    gc.collect()
    assert not directory.exists()


def test_repr_shows_kind_size_devices_and_fields() -> None:
    buf = make(extra_fields={"privileged_obs": ((5,), torch.float32)})
    for _ in range(2):
        buf.add(**GOOD, privileged_obs=torch.zeros(5))
    text = repr(buf)
    for part in ("ReplayBuffer(size=2/16", "storage=memory", "storing_device=cpu", "device=cpu",
                 "obs: (3,) float32", "privileged_obs: (5,) float32"):
        assert part in text


# -- reading -------------------------------------------------------------------------------
def test_sample_returns_typed_batch_with_flat_scalars(storage: str, device: str) -> None:
    buf = make(storage=storage, device=device, num_envs=2)
    add_ids(buf, range(5))
    batch = buf.sample(7)
    assert batch.obs.shape == (7, 3) and batch.action.shape == (7, 2)
    for name in ("reward", "terminated", "truncated", "done", "index", "weight"):
        assert getattr(batch, name).shape == (7,), name
    assert batch.obs.device.type == device and batch.index.device.type == device
    assert torch.equal(batch.weight, torch.ones(7, device=batch.weight.device))
    assert torch.equal(batch.done, batch.terminated | batch.truncated)
    td = batch.to_tensordict()
    assert td["next", "reward"].shape == (7, 1) and td["observation"].shape == (7, 3)


def test_sample_by_index_and_fields(storage: str) -> None:
    buf = make(storage=storage)
    add_ids(buf, range(4))
    batch = buf.sample_by_index([2, 0])
    assert batch.reward.tolist() == [2000.0, 0.0]
    assert batch.index.tolist() == [2, 0]
    only = buf.sample_by_index(torch.tensor([3]), fields=["reward", "obs", "done"])
    assert isinstance(only, ReplayBatch) and only.reward.tolist() == [3000.0] and len(only) == 1
    assert only.done.shape == (1,) and not only.extras and not hasattr(only, "next_obs")
    assert not hasattr(only, "index")
    with pytest.raises(AttributeError, match="fields"):
        _ = only.action
    with pytest.raises(MissingFieldError, match="unknown"):
        buf.sample_by_index([0], fields=["rewards"])


def test_pending_rows_are_seen_by_rlbuf_and_torchrl_reads() -> None:
    buf = make()
    add_ids(buf, range(3))
    assert buf._ring.pending == 3         # written, bookkeeping pending: nothing read yet
    assert len(buf.torchrl) == 3          # a TorchRL read flushes first
    td = buf.torchrl.sample(5)
    assert set(td["next", "reward"].flatten().tolist()) <= {0.0, 1000.0, 2000.0}


def test_a_handed_out_torchrl_storage_is_current_after_every_add() -> None:
    buf = ReplayBuffer(64, obs_shape=(2,), action_shape=(), seed=0)
    rb = buf.torchrl
    for i in range(40):
        buf.add(torch.full((2,), float(i)), 0.0, 1.0, torch.zeros(2), False, truncated=False)
        # Read straight from the storage and writer, not through rb's methods (which flush anyway).
        assert len(rb.storage) == i + 1
    from torchrl.data import TensorDictReplayBuffer

    over_storage = TensorDictReplayBuffer(storage=rb.storage, batch_size=8)
    assert len(over_storage) == 40 and over_storage.sample()["observation"][:, 0].max() < 40


def test_rows_written_through_torchrl_are_seen_in_order() -> None:
    buf = make()
    add_ids(buf, range(2))
    row = buf.sample_all().to_tensordict()[:1].clone()
    row["next", "reward"] = torch.tensor([[42.0]])
    buf.torchrl.extend(row.exclude("index", "priority_weight"))
    add_ids(buf, range(5, 6))
    assert buf.sample_all().reward.tolist() == [0.0, 1000.0, 42.0, 5000.0]


@pytest.mark.parametrize(("key", "value", "error", "message"), [
    (("next", "reward"), torch.tensor(float("nan")), NonFiniteError, "reward: expected finite values, got nan"),
    ("action", torch.tensor(2e300, dtype=torch.float64), DtypeError,
     "action: values up to 2e+300 in magnitude do not fit torch.float32"),
    (("next", "terminated"), torch.tensor(0.5), DtypeError, "terminated: expected dtype torch.bool"),
])
def test_rows_written_through_torchrl_are_read_by_the_same_readers(key: Any, value: torch.Tensor,
                                                                    error: type[Exception], message: str) -> None:
    buf = make()
    add_ids(buf, range(2))
    rb = buf.torchrl
    row = buf.sample_all().to_tensordict()[:1].clone().exclude("index", "priority_weight")
    row.set(key, value.expand(row.get(key).shape), inplace=False)
    before = snapshot(buf)
    for write in (rb.extend, lambda td: rb.add(td[0])):
        with pytest.raises(error) as raised:
            write(row)
        assert message in str(raised.value)
        assert same(snapshot(buf), before)


def test_sampling_uses_its_own_generator_and_never_the_global_one() -> None:
    a, b = make(seed=7), make(seed=7)
    add_ids(a, range(10))
    add_ids(b, range(10))
    state = torch.get_rng_state()
    first = [a.sample(5).index.tolist() for _ in range(3)]
    torch.manual_seed(123)
    second = [b.sample(5).index.tolist() for _ in range(3)]
    assert first == second
    torch.set_rng_state(state)
    a.sample(5)
    assert torch.equal(torch.get_rng_state(), state)


def test_fast_sample_equals_torchrl_sample_from_the_same_state() -> None:
    a, b = make(capacity=32, seed=3, num_envs=2), make(capacity=32, seed=3, num_envs=2)
    add_ids(a, range(20))
    add_ids(b, range(20))
    for _ in range(3):
        fast = a.sample(9).to_tensordict()
        slow = b.torchrl.sample(9)
        assert torch.equal(fast["index"], slow["index"])
        for key in ("observation", "action", ("next", "observation"), ("next", "reward"),
                    ("next", "terminated"), ("next", "truncated"), ("next", "done")):
            assert torch.equal(fast[key], slow[key]), key


@settings(max_examples=25, deadline=None)
@given(capacity=st.integers(1, 12), num_envs=st.integers(1, 3), steps=st.lists(st.integers(1, 6), max_size=6))
def test_direct_writes_leave_the_same_state_as_torchrl_extend(capacity: int, num_envs: int, steps: list[int]) -> None:
    assume(capacity >= num_envs)  # smaller capacities are refused (test_capacity_below_num_envs_is_refused)
    buf = make(capacity=capacity, num_envs=num_envs)
    reference = TensorDictReplayBuffer(storage=LazyTensorStorage(capacity))
    start = 0
    for count in steps:
        add_ids(buf, range(start, start + count))
        rows = torch.arange(num_envs)[None, :] + 1000 * torch.arange(start, start + count)[:, None]
        rows = rows.reshape(-1)
        reference.extend(TensorDict({
            "observation": rows[:, None].float().expand(-1, 3), "action": rows[:, None].float().expand(-1, 2),
            ("next", "observation"): rows[:, None].float().expand(-1, 3) + 0.5,
            ("next", "reward"): rows[:, None].float(),
            ("next", "terminated"): (rows % 3 == 0)[:, None], ("next", "truncated"): (rows % 5 == 0)[:, None],
            ("next", "done"): ((rows % 3 == 0) | (rows % 5 == 0))[:, None],
        }, batch_size=[rows.numel()]))
        start += count
        ours = buf.torchrl
        assert len(ours) == len(reference)
        assert ours.writer._cursor == reference.writer._cursor
        assert ours.writer._write_count == reference.writer._write_count
        stored = ours.storage._storage[: len(ours)]
        expected = reference.storage._storage[: len(reference)]
        for key in stored.keys(include_nested=True, leaves_only=True):
            assert torch.equal(stored[key], expected[key]), key


# -- properties ----------------------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(
    capacity=st.integers(1, 20), num_envs=st.integers(1, 4),
    ops=st.lists(st.one_of(st.integers(1, 8), st.just("sample")), max_size=12),
    storage=st.sampled_from(["memory", "memmap"]),
)
def test_holds_exactly_the_last_capacity_transitions_in_order(
    capacity: int, num_envs: int, ops: list[int | str], storage: str
) -> None:
    assume(capacity >= num_envs)
    with make(capacity=capacity, num_envs=num_envs, storage=storage) as buf:
        history: list[float] = []
        step = 0
        for op in ops:
            if op == "sample":
                if len(buf):
                    buf.sample(3)
                continue
            assert isinstance(op, int)
            add_ids(buf, range(step, step + op))
            history += [float(i * 1000 + e) for i in range(step, step + op) for e in range(num_envs)]
            step += op
        assert len(buf) == min(len(history), capacity)
        if history:
            assert buf.sample_all().reward.tolist() == history[-capacity:]


@settings(max_examples=25, deadline=None)
@given(capacity=st.integers(1, 30), count=st.integers(1, 40), batch=st.integers(1, 64), seed=st.integers(0, 2**31))
def test_sampled_rows_are_stored_rows(capacity: int, count: int, batch: int, seed: int) -> None:
    buf = make(capacity=capacity, seed=seed, prioritized=seed % 2 == 0)
    add_ids(buf, range(count))
    stored = {float(r) for r in buf.sample_all().reward.tolist()}
    sample = buf.sample(batch)
    assert set(sample.reward.tolist()) <= stored
    # every field of a sampled row comes from the same transition
    assert torch.equal(sample.obs[:, 0], sample.reward)
    assert torch.equal(sample.next_obs[:, 0], sample.reward + 0.5)
    assert torch.equal(sample.reward, buf.sample_by_index(sample.index).reward)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31), count=st.integers(1, 30), prioritized=st.booleans())
def test_identically_seeded_buffers_sample_identically(seed: int, count: int, prioritized: bool) -> None:
    a, b = make(seed=seed, prioritized=prioritized), make(seed=seed, prioritized=prioritized)
    add_ids(a, range(count))
    add_ids(b, range(count))
    for _ in range(3):
        assert torch.equal(a.sample(8).reward, b.sample(8).reward)


# -- prioritized ---------------------------------------------------------------------------
def test_prioritized_sampling_follows_priority_to_the_alpha() -> None:
    alpha = 0.6
    buf = make(capacity=4, prioritized=True, alpha=alpha, beta=0.4, seed=1)
    add_ids(buf, range(4))
    priorities = torch.tensor([1.0, 2.0, 4.0, 8.0])
    buf.update_priority(torch.arange(4), priorities)
    counts = torch.zeros(4)
    draws = 40_000
    for _ in range(draws // 1000):
        counts += torch.bincount(buf.sample(1000).index, minlength=4).float()
    expected = priorities**alpha / (priorities**alpha).sum()
    assert torch.allclose(counts / draws, expected, atol=0.01)
    batch = buf.sample(256)
    weight = (4 * expected[batch.index]) ** -0.4
    assert torch.allclose(batch.weight, weight / (4 * expected).pow(-0.4).max(), atol=1e-4)


def test_new_transitions_get_the_highest_priority() -> None:
    buf = make(capacity=8, prioritized=True, alpha=1.0, seed=0)
    add_ids(buf, range(2))
    buf.update_priority([0, 1], [0.001, 5.0])
    add_ids(buf, range(2, 3))
    counts = torch.bincount(buf.sample(3000).index, minlength=3).float()
    assert counts[0] < 10 and abs(counts[1] - counts[2]) < 300


# -- devices -------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cpu_storage_delivers_pinned_batches_on_cuda() -> None:
    buf = make(device="cuda", num_envs=2)
    add_ids(buf, range(5))
    batch = buf.sample(8)
    assert batch.obs.is_cuda and batch.weight.is_cuda
    assert buf.torchrl.storage._storage["observation"].device.type == "cpu"
    assert torch.equal(batch.obs.cpu()[:, 0], batch.reward.cpu())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_storage_takes_cpu_and_cuda_inputs() -> None:
    buf = make(storing_device="cuda", num_envs=2)
    add_ids(buf, range(3))
    buf.add(torch.zeros(2, 3, device="cuda"), torch.zeros(2, 2, device="cuda"), torch.zeros(2, device="cuda"),
            torch.zeros(2, 3, device="cuda"), torch.zeros(2, dtype=torch.bool, device="cuda"), truncated=False)
    assert len(buf) == 8 and buf.sample(4).obs.is_cuda
    assert buf.sample_all().reward.tolist()[:6] == [0.0, 1.0, 1000.0, 1001.0, 2000.0, 2001.0]


# -- TorchRL collector ---------------------------------------------------------------------
def test_extend_from_a_cartpole_collector_stores_exactly_what_it_produced() -> None:
    from torchrl.collectors import Collector
    from torchrl.envs import GymEnv
    from torchrl.envs.utils import RandomPolicy

    env = GymEnv("CartPole-v1")
    env.set_seed(0)
    buf = ReplayBuffer(1000, obs_shape=(4,), action_shape=(2,), action_dtype=torch.int64, seed=0)
    collector = Collector(env, RandomPolicy(env.action_spec), frames_per_batch=64, total_frames=256)
    produced = []
    for td in collector:
        buf.extend(td)
        produced.append(td.clone())
    collector.shutdown()
    everything = torch.cat(produced).reshape(-1)
    stored = buf.sample_all()
    assert len(buf) == 256 == everything.numel()
    assert torch.equal(stored.obs, everything["observation"])
    assert torch.equal(stored.action, everything["action"])
    assert torch.equal(stored.next_obs, everything["next", "observation"])
    assert torch.equal(stored.reward, everything["next", "reward"].squeeze(-1))
    assert torch.equal(stored.terminated, everything["next", "terminated"].squeeze(-1))
    assert torch.equal(stored.truncated, everything["next", "truncated"].squeeze(-1))
    assert stored.terminated.any()  # CartPole under a random policy falls within 256 steps


def test_stats_are_fed_by_adds_and_extends() -> None:
    from rlbuf import EpisodeStats

    stats = EpisodeStats(2)
    buf = make(num_envs=2, stats=stats)
    for step in range(3):
        buf.add(torch.zeros(2, 3), torch.zeros(2, 2), torch.ones(2), torch.zeros(2, 3),
                torch.tensor([step == 1, False]), torch.tensor([False, step == 2]))
    assert stats.summary()["episodes"] == 2
    assert stats.recent_returns() == [2.0, 3.0]
    td = TensorDict({
        "observation": torch.zeros(2, 4, 3), "action": torch.zeros(2, 4, 2), ("next", "observation"): torch.zeros(2, 4, 3),
        ("next", "reward"): torch.ones(2, 4, 1), ("next", "terminated"): torch.zeros(2, 4, 1, dtype=torch.bool),
        ("next", "truncated"): torch.tensor([[False, False, False, True]] * 2)[..., None],
    }, batch_size=[2, 4])
    buf.extend(td)
    assert stats.recent_returns() == [2.0, 3.0, 5.0, 4.0]
    with pytest.raises(ShapeError, match="needs batch size"):
        buf.extend(td.reshape(-1))


def test_a_collector_writes_into_buffer_torchrl_directly() -> None:
    from torchrl.collectors import Collector
    from torchrl.envs import GymEnv
    from torchrl.envs.utils import RandomPolicy

    def run(direct: bool) -> ReplayBuffer:
        torch.manual_seed(0)
        env = GymEnv("CartPole-v1")
        env.set_seed(0)
        buf = ReplayBuffer(500, obs_shape=(4,), action_shape=(2,), action_dtype=torch.int64, seed=0)
        collector = Collector(env, RandomPolicy(env.action_spec), frames_per_batch=50, total_frames=200,
                              replay_buffer=buf.torchrl if direct else None)
        for td in collector:
            if not direct:
                buf.extend(td)
        collector.shutdown()
        return buf

    direct, extended = run(True), run(False)
    assert len(direct) == len(extended) == 200
    a, b = direct.sample_all().to_tensordict(), extended.sample_all().to_tensordict()
    for key in ("observation", "action", ("next", "observation"), ("next", "reward"), ("next", "terminated"),
                ("next", "truncated"), ("next", "done")):
        assert torch.equal(a[key], b[key]), key


def test_beta_can_be_annealed_and_changes_the_weights() -> None:
    buf = make(capacity=4, prioritized=True, alpha=1.0, beta=0.0, seed=0)
    add_ids(buf, range(4))
    buf.update_priority([0, 1, 2, 3], [1.0, 2.0, 4.0, 8.0])
    assert torch.equal(buf.sample(16).weight, torch.ones(16))       # beta 0: no correction
    buf.beta = 1.0
    batch = buf.sample(64)
    assert torch.allclose(batch.weight, 1.0 / torch.tensor([1.0, 2.0, 4.0, 8.0])[batch.index], atol=1e-5)
    with pytest.raises(PriorityError, match="not prioritized"):
        make().beta = 0.5


def test_batch_sizes_may_be_numpy_or_tensor_integers_and_transition_excludes_keywords() -> None:
    buf = make()
    add_ids(buf, range(3))
    assert len(buf.sample(np.int64(4))) == len(buf.sample(torch.tensor(4))) == 4
    with pytest.raises(ConfigError, match="either a Transition or the fields"):
        buf.add(Transition(torch.zeros(3), torch.zeros(2), 1.0, torch.zeros(3), False, truncated=False), reward=5.0)


def test_torchrl_side_extends_without_done_get_it_derived() -> None:
    buf = make()
    td = TensorDict({
        "observation": torch.zeros(3, 3), "action": torch.zeros(3, 2), ("next", "observation"): torch.zeros(3, 3),
        ("next", "reward"): torch.zeros(3, 1), ("next", "terminated"): torch.tensor([[True], [False], [False]]),
        ("next", "truncated"): torch.tensor([[False], [True], [False]]),
    }, batch_size=[3])
    buf.torchrl.extend(td)
    assert buf.sample_all().done.tolist() == [True, True, False]
    assert ("next", "done") not in td.keys(include_nested=True)       # the caller's tensordict is untouched


def test_a_transition_without_truncated_works_for_several_envs() -> None:
    buf = make(num_envs=2)
    buf.add(Transition(torch.zeros(2, 3), torch.zeros(2, 2), torch.ones(2), torch.zeros(2, 3), torch.tensor([True, False]), truncated=False))
    assert buf.sample_all().truncated.tolist() == [False, False]
