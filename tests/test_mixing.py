"""MixedReplay: the split of each batch, rows from the buffer they claim, priorities, read-only data, checkpoints."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import xxhash
from _replays import same_state
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from rlbuf import Hindsight, ReplayBuffer
from rlbuf.errors import (
    BatchSizeError,
    CheckpointError,
    ConfigError,
    DtypeError,
    EmptyBufferError,
    MissingFieldError,
    PriorityError,
    ReadOnlyError,
    ShapeError,
    StoredIndexError,
)
from rlbuf.mixing import MixedBatch, MixedReplay

FIELDS = ("obs", "action", "reward", "next_obs", "terminated", "truncated", "done", "index", "weight", "discount")


def filled(rows: int, tag: float, *, capacity: int = 64, seed: int = 0, **options: Any) -> ReplayBuffer:
    """A buffer of ``rows`` steps whose obs are ``[i, tag]``: each row says which step and buffer it is."""
    buffer = ReplayBuffer(capacity, obs_shape=(2,), action_shape=(), action_dtype=torch.int64, seed=seed, **options)
    for i in range(rows):
        buffer.add(torch.tensor([float(i), tag]), i % 3, float(i), torch.tensor([i + 1.0, tag]), i % 7 == 6,
                   truncated=i % 11 == 10)
    return buffer


def random_states(mixed: MixedReplay) -> list[torch.Tensor]:
    """The mixer's generator and both buffers' sampling and epoch generators."""
    states = [mixed.state_dict()["generator"]]
    for buffer in (mixed.offline, mixed.online):
        rng = buffer.state_dict(data=False)["rng"]
        states += [rng["sample"], rng["epochs"]]
    return states


def equal(a: Any, b: Any) -> bool:
    """Tensors or TensorDicts (dict observations) equal in every value, dtype and key."""
    if isinstance(a, TensorDict):
        keys = sorted(a.keys(include_nested=True, leaves_only=True), key=str)  # iterating a TensorDict gives rows
        return (isinstance(b, TensorDict) and keys == sorted(b.keys(include_nested=True, leaves_only=True), key=str)
                and all(equal(a[key], b[key]) for key in keys))
    return bool(a.dtype == b.dtype and torch.equal(a, b))


def same_batch(a: MixedBatch, b: MixedBatch) -> bool:
    return all(equal(getattr(a, name), getattr(b, name)) for name in (*FIELDS, "from_online"))


# -- the split ---------------------------------------------------------------------------------
@settings(max_examples=14, deadline=None, derandomize=True)
@given(fraction=st.floats(0.0, 1.0), batch_size=st.integers(1, 48), split=st.sampled_from(["exact", "binomial"]),
       seed=st.integers(0, 2**32))
def test_offline_rows_per_batch_match_the_ratio_within_binomial_error(fraction: float, batch_size: int, split: str,
                                                                        seed: int) -> None:
    offline, online = filled(20, 0.0), filled(20, 1.0)
    mixed = MixedReplay(offline, online, offline_fraction=fraction, split=split, seed=seed)  # type: ignore[arg-type]
    batches = 100
    counts = []
    for _ in range(batches):
        batch = mixed.sample(batch_size)
        claimed = ~batch.from_online
        assert torch.equal(claimed, batch.obs[:, 1] == 0.0)  # the mask says where each row came from
        assert not bool(claimed[int(claimed.sum()):].any())  # offline rows first
        counts.append(int(claimed.sum()))
    expected = fraction * batch_size
    if split == "exact":  # floor or ceil of f * B, ceil with probability frac(f * B)
        low = math.floor(expected + 1e-9)
        assert set(counts) <= {low, low + 1}
        share = max(0.0, expected - low)
        variance = batches * share * (1 - share)
    else:
        variance = batches * batch_size * fraction * (1 - fraction)
    # z within 6 standard errors: a false alarm once in 5e8 runs, and never with these fixed examples
    assert abs(sum(counts) - batches * expected) <= 6 * math.sqrt(variance) + 1e-6


def test_binomial_split_varies_like_a_binomial_and_exact_split_does_not() -> None:
    spread = {}
    for split in ("exact", "binomial"):
        mixed = MixedReplay(filled(20, 0.0), filled(20, 1.0), offline_fraction=0.5, split=split, seed=3)  # type: ignore[arg-type]
        counts = torch.tensor([float((~mixed.sample(64).from_online).sum()) for _ in range(300)])
        spread[split] = float(counts.var())
    assert spread["exact"] == 0.0  # 0.5 * 64 is whole: exactly 32 every batch
    assert 0.6 * 16 < spread["binomial"] < 1.5 * 16  # Binomial(64, 0.5) has variance 16


def test_a_whole_share_is_drawn_exactly_every_batch() -> None:
    mixed = MixedReplay(filled(20, 0.0), filled(20, 1.0), offline_fraction=0.3, seed=0)
    assert {int((~mixed.sample(10).from_online).sum()) for _ in range(50)} == {3}


# -- rows are what their buffers store ------------------------------------------------------------
@pytest.mark.parametrize("prioritized", [(False, True), (True, False), (True, True)])
@settings(max_examples=2, deadline=None, derandomize=True)
@given(seed=st.integers(0, 2**32), split=st.sampled_from(["exact", "binomial"]))
def test_every_row_is_a_stored_row_of_the_buffer_it_claims(seed: int, split: str,
                                                           prioritized: tuple[bool, bool]) -> None:
    offline = filled(40, 0.0, prioritized=prioritized[0], seed=seed, n_step=3, gamma=0.9)
    online = filled(30, 1.0, prioritized=prioritized[1], seed=seed + 1, n_step=3, gamma=0.9)
    generator = torch.Generator().manual_seed(seed)
    for buffer in (offline, online):
        if buffer.prioritized:
            buffer.update_priority(list(range(len(buffer))), torch.rand(len(buffer), generator=generator) + 0.1)
    mixed = MixedReplay(offline, online, offline_fraction=0.4, split=split, seed=seed)  # type: ignore[arg-type]
    for _ in range(10):
        batch = mixed.sample(32)
        for buffer, rows in ((offline, ~batch.from_online), (online, batch.from_online)):
            if not bool(rows.any()):
                continue
            stored = buffer.sample_by_index(batch.index[rows])
            for name in FIELDS:
                assert torch.equal(getattr(batch, name)[rows], getattr(stored, name)), name


def test_until_the_online_buffer_holds_min_online_rows_every_row_is_offline() -> None:
    online = filled(0, 1.0)
    mixed = MixedReplay(filled(20, 0.0), online, offline_fraction=0.2, min_online=5, seed=0)
    for rows in range(6):
        batch = mixed.sample(10)
        assert bool(batch.from_online.any()) == (rows >= 5)
        online.add(torch.tensor([rows, 1.0]), 0, 0.0, torch.tensor([rows, 1.0]), False, truncated=False)
    assert isinstance(batch, MixedBatch) and batch.to_tensordict()["from_online"].shape == (10,)



def test_a_min_online_the_online_buffer_can_never_hold_is_refused() -> None:
    # min_online=65 over a 64-row online buffer: every batch came from the dataset forever, offline_fraction
    # silently ignored (helper 69).
    with pytest.raises(ConfigError, match=r"min_online: expected at most 64 \(the online buffer's capacity\), got 65"):
        MixedReplay(filled(20, 0.0), filled(64, 1.0), min_online=65)
    assert MixedReplay(filled(20, 0.0), filled(64, 1.0), min_online=64, seed=0).sample(8).from_online.any()
    mixed = MixedReplay(filled(20, 0.0), filled(64, 1.0), seed=0)
    state = mixed.state_dict()
    state["options"]["min_online"] = 65
    before = mixed.state_dict()
    with pytest.raises(CheckpointError, match="min_online: expected at most 64"):
        mixed.load_state_dict(state)
    assert same_state(mixed.state_dict(), before)

def test_dict_observations_and_hidden_states_are_joined_row_wise() -> None:
    def buffer(tag: float) -> ReplayBuffer:
        made = ReplayBuffer(16, obs_shape={"pos": (2,), "image": (3, 3)}, obs_dtype={"pos": torch.float32,
                            "image": torch.uint8}, action_shape=(), hidden_state_shape={"h": (1, 4)},
                            extra_fields={"cost": ((), torch.float32)}, seed=0)
        for _ in range(4):
            made.add({"pos": torch.full((2,), tag), "image": torch.zeros(3, 3, dtype=torch.uint8)}, 0.0, 0.0,
                     {"pos": torch.full((2,), tag), "image": torch.ones(3, 3, dtype=torch.uint8)}, False,
                     truncated=False, cost=tag, hidden_state={"h": torch.full((1, 4), tag)})
        return made

    batch = MixedReplay(buffer(0.0), buffer(1.0), seed=0).sample(6)
    expected = batch.from_online.float()
    assert torch.equal(batch.obs["pos"][:, 0], expected) and batch.obs["image"].dtype == torch.uint8
    assert torch.equal(batch.next_obs["image"].sum((1, 2)), torch.full((6,), 9, dtype=torch.int64))
    assert torch.equal(batch.cost, expected) and torch.equal(batch.hidden_state["h"][:, 0, 0], expected)


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_a_frame_stacked_compact_online_buffer_mixes_with_a_plain_offline_one(compression: str | None) -> None:
    offline = ReplayBuffer(16, obs_shape=(4, 5, 5), obs_dtype=torch.uint8, action_shape=(), compact=False, seed=0)
    online = ReplayBuffer(16, obs_shape=(4, 5, 5), obs_dtype=torch.uint8, action_shape=(), frame_stack=4, seed=0,
                          compression=compression)
    for t in range(6):
        stack = torch.stack([torch.full((5, 5), max(0, t + k - 3), dtype=torch.uint8) for k in range(4)])
        step = torch.stack([torch.full((5, 5), max(0, t + k - 2), dtype=torch.uint8) for k in range(4)])
        for buffer in (offline, online):
            buffer.add(stack, 0.0, 0.0, step, t == 5, truncated=False)
    batch = MixedReplay(offline, online, seed=0).sample(8)
    assert batch.obs.shape == (8, 4, 5, 5) and batch.next_obs.shape == (8, 4, 5, 5)
    assert torch.equal(batch.next_obs[:, :3], batch.obs[:, 1:])  # stacks, in both parts


# -- priorities ----------------------------------------------------------------------------------
def weights(buffer: ReplayBuffer) -> torch.Tensor:
    """Every row's importance weight: a function of the priorities alone (no draw)."""
    return buffer.sample_by_index(list(range(len(buffer)))).weight


@pytest.mark.parametrize("offline_prioritized", [False, True])
def test_each_rows_priority_goes_to_the_buffer_it_came_from(offline_prioritized: bool) -> None:
    offline, online = filled(12, 0.0, prioritized=offline_prioritized), filled(12, 1.0, prioritized=True)
    twins = {"offline": filled(12, 0.0, prioritized=offline_prioritized), "online": filled(12, 1.0, prioritized=True)}
    mixed = MixedReplay(offline, online, offline_fraction=0.5, seed=0)
    generator = torch.Generator().manual_seed(0)
    for _ in range(3):
        batch = mixed.sample(16)
        priority = torch.rand(16, generator=generator) * 5
        mixed.update_priority(batch, priority)
        twins["online"].update_priority(batch.index[batch.from_online], priority[batch.from_online])
        if offline_prioritized:
            twins["offline"].update_priority(batch.index[~batch.from_online], priority[~batch.from_online])
    assert torch.equal(weights(online), weights(twins["online"]))
    assert not torch.equal(weights(online), weights(filled(12, 1.0, prioritized=True)))
    if offline_prioritized:
        assert torch.equal(weights(offline), weights(twins["offline"]))
    else:  # a uniform offline buffer has no priorities: its rows' values are left out, its state untouched
        offline_rng = offline.state_dict(data=False)["rng"]
        mixed.update_priority(batch.index, priority, from_online=batch.from_online)
        assert same_state(offline.state_dict(data=False)["rng"], offline_rng)


def test_priority_updates_that_cannot_apply_are_refused_before_any_is_set() -> None:
    online = filled(12, 1.0, prioritized=True)
    mixed = MixedReplay(filled(12, 0.0, prioritized=True), online, seed=0)
    batch = mixed.sample(8)
    before = [weights(mixed.offline), weights(online)]
    bad_index = batch.index.clone()
    bad_index[-1] = 12  # an online row past what is stored: the offline rows are not set either
    calls = [(PriorityError, lambda: mixed.update_priority(batch.index, torch.ones(8))),
             (PriorityError, lambda: mixed.update_priority(batch, torch.ones(8), from_online=batch.from_online)),
             (PriorityError, lambda: mixed.update_priority(batch.index, torch.ones(8), from_online=batch.index)),
             (PriorityError, lambda: mixed.update_priority(batch, torch.ones(7))),
             (PriorityError, lambda: mixed.update_priority(batch, torch.full((8,), -1.0))),
             (StoredIndexError, lambda: mixed.update_priority(bad_index, torch.ones(8), from_online=batch.from_online))]
    for error, call in calls:
        with pytest.raises(error):
            call()
    assert all(torch.equal(a, b) for a, b in zip(before, [weights(mixed.offline), weights(online)], strict=True))
    # A priority each buffer's own check refuses ((p + eps) ** alpha past float64 at alpha 4): the offline
    # part was set before the online part refused (helper 47).
    steep = MixedReplay(filled(12, 0.0, prioritized=True), filled(12, 1.0, prioritized=True, alpha=4.0), seed=0)
    before = [weights(steep.offline), weights(steep.online)]
    with pytest.raises(PriorityError, match=r"\(p \+ eps\) \*\* alpha to fit in float64"):
        steep.update_priority(torch.tensor([0, 1]), torch.tensor([5.0, 1e90], dtype=torch.float64), from_online=torch.tensor([False, True]))
    assert all(torch.equal(a, b) for a, b in zip(before, [weights(steep.offline), weights(steep.online)], strict=True))
    uniform = MixedReplay(filled(12, 0.0), filled(12, 1.0), seed=0)
    with pytest.raises(PriorityError, match="neither buffer is prioritized"):
        uniform.update_priority(uniform.sample(4), torch.ones(4))



def test_an_index_or_mask_that_is_no_array_of_positions_is_refused_by_name() -> None:
    # torch.as_tensor read them: a ReplayBatch, None, a dict, a ragged list or a string mask raised torch's
    # RuntimeError, TypeError or ValueError, naming neither the argument nor the fix (helper 69).
    online = filled(12, 1.0, prioritized=True)
    mixed = MixedReplay(filled(12, 0.0, prioritized=True), online, seed=0)
    batch = mixed.sample(8)
    before = [weights(mixed.offline), weights(online)]
    mask = batch.from_online
    calls = [(PriorityError, "a ReplayBatch of one buffer", lambda: mixed.update_priority(online.sample(8), torch.ones(8),
                                                                                        from_online=mask)),
             (StoredIndexError, "index: expected a tensor", lambda: mixed.update_priority(None, torch.ones(8), from_online=mask)),
             (StoredIndexError, "index: expected a tensor", lambda: mixed.update_priority({"a": 1}, [1.0], from_online=[True])),
             (StoredIndexError, "index: expected a rectangular", lambda: mixed.update_priority([[1], [1, 2]], [1.0, 1.0],
                                                                                             from_online=[True, False])),
             (StoredIndexError, r"index: expected one position per row \(1-D\), got shape \(1, 8\)",
              lambda: mixed.update_priority(batch.index[None], torch.ones(8), from_online=mask[None])),
             (PriorityError, "from_online: expected a tensor", lambda: mixed.update_priority(batch.index, torch.ones(8),
                                                                                              from_online="abc")),
             (PriorityError, "from_online: expected a tensor", lambda: mixed.update_priority(batch.index, torch.ones(8),
                                                                                              from_online={})),
             (PriorityError, r"from_online: expected \(8,\) bools", lambda: mixed.update_priority(
                 batch.index, torch.ones(8), from_online=mask.tolist()[:7]))]
    for error, message, call in calls:
        with pytest.raises(error, match=message):
            call()
    assert all(torch.equal(a, b) for a, b in zip(before, [weights(mixed.offline), weights(online)], strict=True))
    mixed.update_priority(batch.index.numpy(), np.full(8, 2.0), from_online=mask.numpy())  # arrays and lists still go
    mixed.update_priority(batch.index.tolist(), [3.0] * 8, from_online=mask.tolist())


# -- refusals ------------------------------------------------------------------------------------
def test_a_refused_call_leaves_every_random_state_as_it_was() -> None:
    def pair() -> MixedReplay:
        return MixedReplay(filled(20, 0.0), filled(20, 1.0, prioritized=True), offline_fraction=0.3,
                           split="binomial", seed=5)

    mixed, twin = pair(), pair()
    mixed.sample(8)
    twin.sample(8)
    before = random_states(mixed)
    for bad in (0, -3, 2.5, True, "8", None):
        with pytest.raises(BatchSizeError):
            mixed.sample(bad)  # type: ignore[arg-type]
    for fraction in (1.5, -0.1, float("nan"), "0.5", None):
        with pytest.raises(ConfigError, match="offline_fraction"):
            mixed.offline_fraction = fraction  # type: ignore[assignment]
    assert mixed.offline_fraction == 0.3
    assert all(same_state(a, b) for a, b in zip(before, random_states(mixed), strict=True))
    assert all(same_batch(mixed.sample(16), twin.sample(16)) for _ in range(5))


def test_nothing_to_draw_from_is_refused_without_a_draw() -> None:
    mixed = MixedReplay(filled(10, 0.0), filled(0, 1.0), offline_fraction=0.0, seed=0)
    before = random_states(mixed)
    with pytest.raises(EmptyBufferError, match="online buffer holds 0 rows"):
        mixed.sample(4)
    assert all(same_state(a, b) for a, b in zip(before, random_states(mixed), strict=True))
    with pytest.raises(EmptyBufferError, match="offline buffer is empty"):
        MixedReplay(filled(0, 0.0), filled(10, 1.0))


def test_an_online_buffer_refusing_its_part_moves_no_other_generator() -> None:
    online = ReplayBuffer(16, obs_shape=(2,), action_shape=(), action_dtype=torch.int64, n_step=3, seed=0)
    online.add(torch.zeros(2), 0, 0.0, torch.ones(2), False, truncated=False)  # no 3-step transition complete yet
    mixed = MixedReplay(filled(20, 0.0), online, seed=0)
    before = random_states(mixed)[:3]  # the mixer's and the offline buffer's
    with pytest.raises(EmptyBufferError):
        mixed.sample(8)
    assert all(same_state(a, b) for a, b in zip(before, random_states(mixed)[:3], strict=True))


def test_the_offline_buffer_is_read_only_while_mixing(tmp_path: Path) -> None:
    offline = filled(10, 0.0)
    mixed = MixedReplay(offline, filled(10, 1.0), seed=0)
    with pytest.raises(ReadOnlyError, match=r"^add: this buffer is read-only"):  # refused: nothing changed
        offline.add(torch.zeros(2), 0, 0.0, torch.zeros(2), False, truncated=False)
    assert len(offline) == 10 and mixed.check_valid() == (True, "")
    offline.read_only = False  # lifted by hand: the mixer sees the change
    offline.add(torch.zeros(2), 0, 0.0, torch.zeros(2), False, truncated=False)
    with pytest.raises(ConfigError, match=r"read-only while mixing, but it changed \(10 rows, 10 writes and 0 "
                                          r"rewrites when mixing began, 11, 11 and 0 now\)"):
        mixed.sample(4)
    full = filled(8, 0.0, capacity=8)  # a full ring keeps its row count when written to: its writes are counted
    mixed = MixedReplay(full, filled(10, 1.0), seed=0)
    full.read_only = False
    full.add(torch.zeros(2), 0, 0.0, torch.zeros(2), False, truncated=False)
    assert not mixed.check_valid()[0]
    with pytest.raises(ConfigError, match=r"8 rows, 8 writes and 0 rewrites when mixing began, 8, 9 and 0 now"):
        mixed.sample(4)
    with pytest.raises(ConfigError, match=r"8 rows, 8 writes and 0 rewrites when mixing began, 8, 9 and 0 now"):
        mixed.save(tmp_path / "mixed")
    assert not (tmp_path / "mixed").exists()


@pytest.mark.parametrize(("online_options", "error", "message"), [
    ({"obs_shape": (3,)}, ShapeError, r"obs: expected shape \(2,\) \(the offline buffer's\), got \(3,\)"),
    ({"action_dtype": torch.float32}, DtypeError, "action: expected dtype torch.int64"),
    ({"extra_fields": {"cost": ((), torch.float32)}}, MissingFieldError,
     r"cost: in the online buffer's batches \(\(\) torch.float32\), not in the offline buffer's; give both the same "
     "extra_fields"),
    ({"hidden_state_shape": (4,)}, MissingFieldError, "hidden_state: in the online buffer's batches"),
    ({"gamma": 0.9}, ConfigError, "gamma: expected 0.99"),
])
def test_buffers_whose_batches_differ_are_refused_by_field(online_options: dict[str, Any], error: type[Exception],
                                                           message: str) -> None:
    options: dict[str, Any] = {"obs_shape": (2,), "action_shape": (), "action_dtype": torch.int64, **online_options}
    with pytest.raises(error, match=message):
        MixedReplay(filled(4, 0.0), ReplayBuffer(8, **options))


def test_dict_observations_with_other_keys_are_refused_by_key() -> None:
    def buffer(shape: dict[str, Any]) -> ReplayBuffer:
        made = ReplayBuffer(8, obs_shape=shape, action_shape=())
        made.add({key: torch.zeros(2) for key in shape}, 0.0, 0.0, {key: torch.zeros(2) for key in shape}, False,
                 truncated=False)
        return made

    with pytest.raises(MissingFieldError, match=r'obs\["b"\]: in the offline buffer\'s batches'):
        MixedReplay(buffer({"a": (2,), "b": (2,)}), buffer({"a": (2,), "c": (2,)}))
    offline = filled(4, 0.0)
    with pytest.raises(ConfigError, match="same buffer"):
        MixedReplay(offline, offline)
    with pytest.raises(ConfigError, match="expected a ReplayBuffer"):
        MixedReplay(offline, [])  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="split"):
        MixedReplay(offline, filled(4, 1.0), split="fixed")  # type: ignore[arg-type]


# -- checkpoints ---------------------------------------------------------------------------------
def training_pair(seed: int = 0) -> MixedReplay:
    offline = filled(40, 0.0, seed=seed)
    online = filled(10, 1.0, seed=seed + 1, prioritized=True, n_step=2)
    return MixedReplay(offline, online, offline_fraction=0.3, split="binomial", seed=seed)


def resume_steps(mixed: MixedReplay, steps: int, start: int = 0) -> list[MixedBatch]:
    """Sample, set priorities, add online: the loop of an offline-to-online run."""
    batches = []
    for t in range(start, start + steps):
        batch = mixed.sample(16)
        mixed.update_priority(batch, batch.reward.double() + 0.5)
        obs = 10.0 + t  # the online stream goes on from filled(10, ...)
        mixed.online.add(torch.tensor([obs, 1.0]), 1, float(t), torch.tensor([obs + 1, 1.0]), t % 4 == 3, truncated=False)
        batches.append(batch)
    return batches


def test_a_loaded_pair_draws_exactly_the_batches_the_original_would(tmp_path: Path) -> None:
    mixed = training_pair()
    resume_steps(mixed, 5)
    mixed.save(tmp_path / "mixed")
    mixed.save(tmp_path / "mixed")  # a second save replaces the first and leaves only its own parts
    assert sorted(p.name.split("-")[0] for p in (tmp_path / "mixed").iterdir()) == ["mixer", "offline", "online"]
    in_memory = training_pair(seed=9)
    in_memory.load_state_dict(mixed.state_dict())
    restored = MixedReplay.load(tmp_path / "mixed")
    assert (restored.offline_fraction, restored.split) == (0.3, "binomial")
    assert restored.check_valid() == (True, "") and in_memory.check_valid() == (True, "")
    expected = resume_steps(mixed, 8, start=5)
    for copy in (restored, in_memory):
        assert all(same_batch(a, b) for a, b in zip(expected, resume_steps(copy, 8, start=5), strict=True))


def mixer_manifest(path: Path) -> tuple[Path, dict[str, Any]]:
    manifest = path / "mixer" / "manifest.json"
    return manifest, json.loads(manifest.read_text())


def test_a_checkpoint_whose_parts_disagree_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "mixed"
    training_pair().save(path)
    manifest, original = mixer_manifest(path)
    parts = original["state"]["parts"]
    offline, online = (path / parts[name]["directory"] for name in ("offline", "online"))
    offline.rename(tmp_path / "aside")
    online.rename(offline)
    (tmp_path / "aside").rename(online)
    with pytest.raises(CheckpointError, match=r"offline: .* not the checkpoint the mixer was saved with"):
        MixedReplay.load(path)
    online.rename(tmp_path / "aside")
    offline.rename(online)
    (tmp_path / "aside").rename(offline)
    assert len(MixedReplay.load(path).offline) == 40
    for edit, message in [({"offline_fraction": -0.5}, "offline_fraction: expected a number in"),
                          ({"split": "fixed"}, "split: expected one of"),
                          ({"min_online": 0}, "min_online"),
                          ({"surprise": 1}, "options must hold exactly")]:
        changed = json.loads(json.dumps(original))
        changed["state"]["options"].update(edit)
        manifest.write_text(json.dumps(changed))
        with pytest.raises(CheckpointError, match=message):
            MixedReplay.load(path)
    changed = json.loads(json.dumps(original))
    changed["state"]["parts"]["online"]["directory"] = "../elsewhere"
    manifest.write_text(json.dumps(changed))
    with pytest.raises(CheckpointError, match="not one a save writes"):
        MixedReplay.load(path)
    for part in ({"size": 9}, {"size": 10.0}, {"surprise": 1}):  # counters as floats, other keys: never written
        changed = json.loads(json.dumps(original))
        changed["state"]["parts"]["online"].update(part)
        manifest.write_text(json.dumps(changed))
        with pytest.raises(CheckpointError, match=r"online: the buffer holds size 10 .* \(a swapped or stale part\)"):
            MixedReplay.load(path)
    manifest.write_text(json.dumps(original))
    online_part = path / original["state"]["parts"]["online"]["directory"]
    online_part.rename(tmp_path / "outside")
    online_part.symlink_to(tmp_path / "outside")       # the same files, through a link out of the checkpoint
    with pytest.raises(CheckpointError, match=r"online: .* is not the checkpoint the mixer was saved with .*a link"):
        MixedReplay.load(path)
    online_part.unlink()
    (tmp_path / "outside").rename(online_part)
    forged = json.loads(json.dumps(original))  # a generator state of the wrong size, with a valid checksum
    [generator] = [rel for rel in forged["files"] if rel.endswith("generator.bin")]
    (path / "mixer" / generator).write_bytes(bytes(16))
    forged["files"][generator].update(shape=[16], bytes=16, xxh3_128=xxhash.xxh3_128(bytes(16)).hexdigest())
    manifest.write_text(json.dumps(forged))
    with pytest.raises(CheckpointError, match=r"generator: expected a CPU generator state \(uint8, \(5056,\)\)"):
        MixedReplay.load(path)


def test_a_refused_state_leaves_the_mixer_and_both_buffers_as_they_were() -> None:
    mixed = training_pair()
    resume_steps(mixed, 3)
    before = mixed.state_dict()
    good = training_pair(seed=4).state_dict()
    wrong_size = {**good, "generator": torch.zeros(16, dtype=torch.uint8)}
    swapped = {**good, "offline": good["online"], "online": good["offline"]}
    bad_online = {**good, "online": {**good["online"], "cursor": 5}}
    bad_offline = {**good, "offline": {**good["offline"], "rng": {}}}
    for state, message in [(wrong_size, "generator: expected a CPU generator state"),
                           (swapped, "offline: the buffer holds size 10"),
                           ({**good, "options": {**good["options"], "offline_fraction": 2}}, "offline_fraction"),
                           (bad_online, "cursor"), (bad_offline, "rng")]:
        with pytest.raises(CheckpointError, match=message):
            mixed.load_state_dict(state)
        assert same_state(mixed.state_dict(), before)


def test_a_save_that_fails_midway_leaves_the_previous_pair_whole(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    mixed = training_pair()
    mixed.save(tmp_path / "mixed")
    expected = [mixed.sample(16) for _ in range(3)]
    resume_steps(mixed, 2)

    def killed(*args: Any, **kwargs: Any) -> None:
        raise CheckpointError("killed before the mixer's part was written")

    monkeypatch.setattr("rlbuf.mixing.save_state", killed)
    with pytest.raises(CheckpointError, match="killed"):
        mixed.save(tmp_path / "mixed")
    assert len(list((tmp_path / "mixed").glob("offline-*"))) == 2  # the new parts are there, unnamed
    monkeypatch.undo()
    restored = MixedReplay.load(tmp_path / "mixed")  # the previous pair, whole
    assert all(same_batch(a, restored.sample(16)) for a in expected)
    mixed.save(tmp_path / "mixed")
    assert len(list((tmp_path / "mixed").glob("offline-*"))) == 1  # what the failed save left is gone


def test_hindsight_buffers_mix_and_load_with_their_reward_function(tmp_path: Path) -> None:
    def reward_fn(achieved: Any, desired: Any, info: Any) -> Any:
        return np.where((achieved == desired).all(-1), 0.0, -1.0)

    shape = {"observation": 2, "achieved_goal": 2, "desired_goal": 2}
    offline = ReplayBuffer(32, obs_shape=shape, action_shape=(), seed=0)
    online = ReplayBuffer(32, obs_shape=shape, action_shape=(), seed=0,
                          hindsight=Hindsight("final", ratio=1.0, reward_fn=reward_fn))
    for buffer in (offline, online):
        for t in range(4):
            obs = {key: torch.full((2,), float(t)) for key in shape}
            nxt = {key: torch.full((2,), t + 1.0) for key in shape}
            buffer.add(obs, 0.0, -1.0, nxt, False, truncated=t == 3)
    mixed = MixedReplay(offline, online, seed=0)
    batch = mixed.sample(16)
    assert torch.equal(batch.obs["desired_goal"][batch.from_online, 0], torch.full((8,), 4.0))  # relabelled
    mixed.save(tmp_path / "mixed")
    with pytest.raises(CheckpointError, match="reward_fn"):
        MixedReplay.load(tmp_path / "mixed")
    restored = MixedReplay.load(tmp_path / "mixed", reward_fn=reward_fn)
    assert all(same_batch(mixed.sample(16), restored.sample(16)) for _ in range(3))


def test_saving_over_something_else_is_refused(tmp_path: Path) -> None:
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("keep me")
    with pytest.raises(CheckpointError, match="not a mixed checkpoint"):
        training_pair().save(tmp_path / "notes")
    assert (tmp_path / "notes" / "todo.txt").read_text() == "keep me"


def test_a_sample_the_dataset_refuses_leaves_every_generator_as_it_was() -> None:
    """The online part is drawn first: the dataset (n_step=3, no complete transition) refusing must put the online
    buffer's generator back too."""
    offline = filled(1, 1.0, n_step=3)
    mixed = MixedReplay(offline, filled(20, 2.0, n_step=3, seed=1), offline_fraction=0.5, seed=2)
    before = random_states(mixed)
    with pytest.raises(EmptyBufferError, match="no transition is complete yet"):
        mixed.sample(8)
    assert all(torch.equal(a, b) for a, b in zip(before, random_states(mixed), strict=True))


def test_a_load_checks_both_parts_before_either_changes_and_refuses_parts_without_rows() -> None:
    source = MixedReplay(filled(40, 1.0), filled(30, 2.0, seed=1), seed=3)
    target = MixedReplay(filled(20, 1.0), filled(10, 2.0, seed=1), seed=4)
    iterator = target.online.epochs(batch_size=4)
    before = (target.offline.state_dict(), target.online.state_dict(), target.online._change_marks())
    dataless = {**source.state_dict(), "offline": source.offline.state_dict(data=False),
                "online": source.online.state_dict(data=False)}
    broken = source.state_dict()
    broken["offline"]["fields"]["reward"] = broken["offline"]["fields"]["reward"][:-1]
    for state, message in ((dataless, "offline must be that buffer's state_dict\\(\\) with its rows"),
                           (broken, "reward")):
        with pytest.raises(CheckpointError, match=message):
            target.load_state_dict(state)
        assert same_state(target.offline.state_dict(), before[0]) and same_state(target.online.state_dict(), before[1])
        assert target.online._change_marks() == before[2] and target.online.current_epochs is iterator


def test_a_save_while_a_thread_adds_online_loads(tmp_path: Path) -> None:
    # The mixer recorded the online part's counters before the part was saved: a row added in between made
    # every such checkpoint refused at load as "a swapped or stale part" (review).
    import threading

    mixed = MixedReplay(filled(40, 0.0), filled(10, 1.0), seed=0)
    stop = threading.Event()

    def writer() -> None:
        t = 10
        while not stop.is_set():
            mixed.online.add(torch.tensor([float(t), 1.0]), 0, 1.0, torch.tensor([t + 1.0, 1.0]), False,
                             truncated=False)
            t += 1

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        for round_ in range(5):
            mixed.save(tmp_path / f"mixed{round_}")
            MixedReplay(filled(40, 0.0), filled(10, 1.0), seed=0).load_state_dict(mixed.state_dict())
    finally:
        stop.set()
        thread.join()
    for round_ in range(5):
        loaded = MixedReplay.load(tmp_path / f"mixed{round_}")
        assert len(loaded.online) >= 10
