"""Checkpoints: exact resume for every buffer kind and storage, ``data=False``, damaged, crafted
and malicious directories refused, memmap storage, format versions (saves: tests/test_checkpoint_saves.py)."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import pickle
import re
import tempfile
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
import xxhash
from _lockstep import (
    KINDS,
    STORAGES,
    Buffer,
    add_steps,
    assert_lockstep,
    assert_same,
    close_all,
    counters,
    make,
    rest,
    update_priorities,
)
from _snapshot import same, snapshot
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torchrl.data import LazyMemmapStorage

from rlbuf import (
    CheckpointError,
    ConfigError,
    DistillationBuffer,
    EpisodeStats,
    ReplayBuffer,
    RolloutBuffer,
)
from rlbuf._manifest import read_manifest
from rlbuf._state import MetadataOnlyWarning
from rlbuf.checkpoint import MANIFEST, load_state
from rlbuf.mixing import MixedReplay

REPO = Path(__file__).resolve().parents[1]


# -- exact resume ------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["replay", "prioritized", "distillation"])
@settings(max_examples=12, deadline=None)
@given(storage=st.sampled_from(STORAGES), capacity=st.integers(1, 20), num_envs=st.integers(1, 3),
       adds=st.integers(1, 14), samples=st.integers(0, 3), batch_size=st.integers(1, 6), n_epochs=st.integers(0, 3),
       earlier=st.integers(0, 2), taken=st.integers(0, 8), drop_last=st.booleans(), shuffle=st.booleans(),
       more=st.integers(1, 9), seed=st.integers(0, 2**31))
def test_a_loaded_buffer_continues_exactly_like_the_original(
    kind: str, storage: str, capacity: int, num_envs: int, adds: int, samples: int, batch_size: int,
    n_epochs: int, earlier: int, taken: int, drop_last: bool, shuffle: bool, more: int, seed: int,
) -> None:
    assume(capacity >= num_envs)  # a smaller capacity is refused at construction
    # `twin` never saves: saving must not change what the original draws next either.
    original, twin = (make(kind, storage, capacity=capacity, num_envs=num_envs, seed=seed) for _ in range(2))
    buffers: list[Buffer] = [original, twin]
    data = torch.Generator().manual_seed(seed)
    try:
        add_steps(buffers, kind, data, adds)
        for _ in range(samples):
            assert_lockstep(buffers, lambda buf: buf.sample(batch_size))
        if kind == "prioritized":
            update_priorities(buffers, data, batch_size)
        epoch_batch = min(batch_size, len(original))
        for _ in range(earlier):  # each iterator draws its seed from the buffer's epoch generator
            assert_same([next(buf.epochs(batch_size=epoch_batch)) for buf in buffers])
        iterators = [buf.epochs(batch_size=epoch_batch, n_epochs=n_epochs, drop_last=drop_last, shuffle=shuffle) for buf in buffers]
        for _ in range(taken if n_epochs == 0 else min(taken, len(iterators[0]))):
            assert_same([next(iterator) for iterator in iterators])
        with tempfile.TemporaryDirectory() as scratch:
            original.save(Path(scratch) / "ckpt")
            loaded = type(original).load(Path(scratch) / "ckpt")
        buffers = [original, twin, loaded]

        assert counters(original) == counters(twin) == counters(loaded)
        assert loaded.current_epochs is not None
        iterators.append(loaded.current_epochs)
        if n_epochs:
            assert len(iterators[0]) == len(iterators[1]) == len(iterators[2])
        for triple in zip(*(rest(iterator, n_epochs) for iterator in iterators), strict=True):
            assert_same(triple)
        for _ in range(2):
            assert_lockstep(buffers, lambda buf: buf.sample(batch_size))
        if kind == "prioritized":
            update_priorities(buffers, data, batch_size)
            assert_lockstep(buffers, lambda buf: buf.sample(batch_size))
        add_steps(buffers, kind, data, more)
        assert counters(original) == counters(twin) == counters(loaded)
        assert_lockstep(buffers, lambda buf: buf.sample_all())
        assert_lockstep(buffers, lambda buf: buf.sample(batch_size))
        fresh = [buf.epochs(batch_size=min(batch_size, len(buf)), n_epochs=1) for buf in buffers]
        for pair in zip(*fresh, strict=True):
            assert_same(pair)
    finally:
        close_all(buffers)


@settings(max_examples=15, deadline=None)
@given(storage=st.sampled_from(STORAGES), num_steps=st.integers(1, 6), num_envs=st.integers(1, 3),
       batch_size=st.integers(1, 8), by_count=st.booleans(), n_epochs=st.integers(1, 3), earlier=st.integers(0, 2),
       taken=st.integers(0, 10), drop_last=st.booleans(), shuffle=st.booleans(), attach=st.booleans(),
       seed=st.integers(0, 2**31))
def test_a_loaded_rollout_continues_exactly_like_the_original(
    storage: str, num_steps: int, num_envs: int, batch_size: int, by_count: bool, n_epochs: int, earlier: int,
    taken: int, drop_last: bool, shuffle: bool, attach: bool, seed: int,
) -> None:
    original, twin = (make("rollout", storage, capacity=num_steps, num_envs=num_envs, seed=seed) for _ in range(2))
    buffers: list[Buffer] = [original, twin]
    data = torch.Generator().manual_seed(seed)
    size = min(batch_size, num_steps * num_envs)
    split: dict[str, Any] = {"num_minibatches": size} if by_count else {"batch_size": size, "drop_last": drop_last}

    def collect(buffers: Sequence[Buffer]) -> None:
        add_steps(buffers, "rollout", data, num_steps)
        last_value = torch.randn(num_envs, generator=data)
        for buf in buffers:
            buf.compute_returns_and_advantages(last_value, gamma=0.9, gae_lambda=0.8)

    try:
        collect(buffers)
        if attach:
            old_logits = torch.randn(num_steps, num_envs, 2, generator=data)
            for buf in buffers:
                buf.set_extras({"old_logits": old_logits})
        for _ in range(earlier):
            assert_same([next(buf.minibatches(**split)) for buf in buffers])
        iterators = [buf.minibatches(**split, n_epochs=n_epochs, shuffle=shuffle) for buf in buffers]
        for _ in range(min(taken, len(iterators[0]))):
            assert_same([next(iterator) for iterator in iterators])
        with tempfile.TemporaryDirectory() as scratch:
            original.save(Path(scratch) / "ckpt")
            loaded = RolloutBuffer.load(Path(scratch) / "ckpt")
        buffers = [original, twin, loaded]

        assert {(counters(buf), buf.steps, buf.advantages_ready) for buf in buffers} == {
            (counters(twin), num_steps, True)}
        assert loaded.current_epochs is not None
        assert len(loaded.current_epochs) == len(iterators[0])
        for triple in zip(*iterators, loaded.current_epochs, strict=True):
            assert_same(triple)
        assert_lockstep(buffers, lambda buf: buf.get_all_data())
        for buf in buffers:  # the next rollout
            buf.clear()
        collect(buffers)
        fresh = [buf.minibatches(**split, n_epochs=n_epochs, shuffle=shuffle) for buf in buffers]
        for triple in zip(*fresh, strict=True):
            assert_same(triple)
    finally:
        close_all(buffers)


@pytest.mark.parametrize("storage", STORAGES)
def test_a_rollout_saved_mid_collection_resumes_collecting(storage: str, tmp_path: Path) -> None:
    original = make("rollout", storage, capacity=4, num_envs=3)
    data = torch.Generator().manual_seed(1)
    add_steps([original], "rollout", data, 2)
    original.save(tmp_path / "ckpt")
    loaded = RolloutBuffer.load(tmp_path / "ckpt")
    buffers = [original, loaded]
    assert [(buf.steps, buf.is_full, buf.advantages_ready) for buf in buffers] == [(2, False, False)] * 2
    add_steps(buffers, "rollout", data, 2)
    for buf in buffers:
        buf.compute_returns_and_advantages(torch.ones(3))
    for pair in zip(*(buf.minibatches(batch_size=5, n_epochs=2) for buf in buffers), strict=True):
        assert_same(pair)
    close_all(buffers)


def test_a_rollout_saved_mid_collection_after_an_earlier_rollout_loads(tmp_path: Path) -> None:
    buf = make("rollout", capacity=2, num_envs=2)
    data = torch.Generator().manual_seed(0)
    add_steps([buf], "rollout", data, 2)
    buf.compute_returns_and_advantages(torch.zeros(2))
    for _ in buf.minibatches(batch_size=2):
        pass
    buf.clear()
    add_steps([buf], "rollout", data, 1)  # a PPO run checkpointed while collecting
    buf.save(tmp_path / "ckpt")
    assert RolloutBuffer.load(tmp_path / "ckpt").steps == 1


def test_changing_a_state_dict_leaves_the_buffer_and_its_next_state_dict_as_they_were(tmp_path: Path) -> None:
    buf = ReplayBuffer(8, obs_shape={"image": (2, 3), "state": (4,)}, action_shape=(), seed=0)
    state, before = buf.state_dict(), json.dumps(buf.state_dict()["options"], sort_keys=True)
    state["options"]["capacity"] = 99
    state["options"]["obs_shape"]["state"] = [5]
    assert json.dumps(buf.state_dict()["options"], sort_keys=True) == before
    buf.save(tmp_path / "ckpt")
    assert ReplayBuffer.load(tmp_path / "ckpt").capacity == 8


def test_a_replay_buffer_saved_after_clear_and_a_few_adds_loads(tmp_path: Path) -> None:
    buf = make("replay", capacity=8, num_envs=1)
    data = torch.Generator().manual_seed(0)
    add_steps([buf], "replay", data, 8)
    buf.epochs(batch_size=4)
    buf.clear()
    add_steps([buf], "replay", data, 2)
    buf.save(tmp_path / "ckpt")
    assert len(ReplayBuffer.load(tmp_path / "ckpt")) == 2


def test_episode_stats_are_restored(tmp_path: Path) -> None:
    buf = ReplayBuffer(8, obs_shape=(3,), action_shape=(2,), num_envs=2, seed=0, stats=EpisodeStats(2, window=5))
    for step in range(5):
        buf.add(torch.zeros(2, 3), torch.zeros(2, 2), torch.tensor([1.0, 2.0]), torch.zeros(2, 3),
                torch.tensor([step == 2, False]), truncated=False)
    buf.save(tmp_path / "ckpt")
    loaded = ReplayBuffer.load(tmp_path / "ckpt")
    assert loaded.stats is not None and buf.stats is not None
    for tracker in (buf.stats, loaded.stats):  # running episodes carry over
        tracker.update(torch.tensor([1.0, 2.0]), torch.tensor([True, True]))
    assert loaded.stats.recent_returns() == buf.stats.recent_returns() == [3.0, 3.0, 12.0]
    assert loaded.stats.recent_lengths() == buf.stats.recent_lengths() == [3, 3, 6]


# -- data=False ---------------------------------------------------------------------------------
@pytest.mark.parametrize("storage", STORAGES)
@pytest.mark.parametrize("kind", KINDS)
def test_data_false_saves_options_only_and_loads_an_empty_buffer_with_a_warning(
    kind: str, storage: str, tmp_path: Path
) -> None:
    buf = make(kind, storage, capacity=6, num_envs=2)
    add_steps([buf], kind, torch.Generator().manual_seed(0), 6 if kind == "rollout" else 4)
    path = tmp_path / "ckpt"
    buf.save(path, data=False)
    assert not [name for name in read_manifest(path)["files"] if "fields" in name]
    with pytest.warns(MetadataOnlyWarning, match=rf"{re.escape(str(path))}: saved with data=False .* the loaded "
                                                 rf"buffer is empty; the original held {len(buf)} rows"):
        loaded = type(buf).load(path)
    empty = make(kind, storage, capacity=6, num_envs=2)
    assert len(loaded) == 0
    assert loaded._options == buf._options
    assert repr(loaded) == repr(empty)  # kind, capacity, storage, devices, prioritized, fields
    add_steps([loaded, empty], kind, torch.Generator().manual_seed(1), 6 if kind == "rollout" else 3)
    assert_lockstep([loaded, empty], lambda b: b.sample_all())
    close_all([buf, loaded, empty])


# -- damaged, crafted and malicious checkpoints --------------------------------------------------
@pytest.fixture
def saved(tmp_path: Path) -> Path:
    buf = make("replay", capacity=8, num_envs=2)
    add_steps([buf], "replay", torch.Generator().manual_seed(0), 3)
    path = tmp_path / "ckpt"
    buf.save(path)
    return path


def field_file(path: Path, field: str = "obs") -> str:
    [name] = [name for name in read_manifest(path)["files"] if name.endswith(f"fields.{field}.bin")]
    return name


def edit_manifest(path: Path, change: Callable[[dict[str, Any]], object]) -> None:
    manifest = json.loads((path / MANIFEST).read_text())
    change(manifest)
    (path / MANIFEST).write_text(json.dumps(manifest))


def relist(path: Path, old: str, new: str) -> None:
    """List file ``old`` under the name ``new`` in the manifest (entry and reference)."""
    def rename(manifest: dict[str, Any]) -> None:
        manifest["files"][new] = manifest["files"].pop(old)
        text = json.dumps(manifest["state"]).replace(json.dumps(old), json.dumps(new))
        manifest["state"] = json.loads(text)
    edit_manifest(path, rename)


def truncate(path: Path) -> str:
    target = path / field_file(path)
    data = target.read_bytes()
    target.write_bytes(data[:-4])
    return rf"{re.escape(str(target))}: {len(data) - 4} bytes, expected {len(data)} \(truncated or corrupted\)"


def flip_a_byte(path: Path) -> str:
    target = path / field_file(path)
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x10
    target.write_bytes(bytes(data))
    return rf"{re.escape(str(target))}: XXH3-128 mismatch \(corrupted\)"


def remove_a_file(path: Path) -> str:
    target = path / field_file(path, "reward")
    target.unlink()
    return rf"{re.escape(str(target))}: missing"


def newer_format(path: Path) -> str:
    edit_manifest(path, lambda manifest: manifest.update(format_version=3))
    return rf"{re.escape(str(path / MANIFEST))}: format version 3; this rlbuf reads versions 1, 2"


def broken_json(path: Path) -> str:
    (path / MANIFEST).write_text('{"format": "rlbuf-checkpoint", "files": {')
    return rf"{re.escape(str(path / MANIFEST))}: not valid JSON"


def parent_path(path: Path) -> str:
    name = field_file(path)
    os.rename(path / name, path.parent / "outside.bin")  # same bytes, so only the path is wrong
    relist(path, name, "../outside.bin")
    return rf"{re.escape(str(path / MANIFEST))}: file name '../outside.bin' escapes the checkpoint directory"


def nested_parent_path(path: Path) -> str:
    name = field_file(path)
    os.rename(path / name, path.parent / "outside.bin")
    relist(path, name, "tensors/../../outside.bin")
    return r"file name 'tensors/../../outside.bin' escapes the checkpoint directory"


def absolute_path(path: Path) -> str:
    name = field_file(path)
    outside = path.parent / "outside.bin"
    os.rename(path / name, outside)
    relist(path, name, str(outside))
    return rf"{re.escape(str(path / MANIFEST))}: file name '{re.escape(str(outside))}' is not a relative path"


def symlink_out(path: Path) -> str:
    target = path / field_file(path)
    os.rename(target, path.parent / "outside.bin")
    target.symlink_to(path.parent / "outside.bin")
    return rf"{re.escape(str(target))}: a link or a path outside the checkpoint"


def unlisted_file(path: Path) -> str:
    (path / "tensors" / "notes.txt").write_text("hello")
    return rf"{re.escape(str(path))}: unexpected file 'tensors/notes.txt'"


@pytest.mark.parametrize("damage", [truncate, flip_a_byte, remove_a_file, newer_format, broken_json, parent_path,
                                    nested_parent_path, absolute_path, symlink_out, unlisted_file])
def test_a_damaged_or_crafted_checkpoint_is_refused_naming_the_file_and_the_problem(
    saved: Path, damage: Callable[[Path], str]
) -> None:
    expected = damage(saved)
    with pytest.raises(CheckpointError, match=expected):
        ReplayBuffer.load(saved)
    with pytest.raises(CheckpointError, match=expected):
        read_manifest(saved)


@pytest.mark.parametrize("other", [RolloutBuffer, DistillationBuffer])
def test_a_checkpoint_of_another_kind_is_refused(saved: Path, other: type[Buffer]) -> None:
    with pytest.raises(CheckpointError, match=rf"{re.escape(str(saved / MANIFEST))}: holds a ReplayBuffer, not "
                                              rf"a {other.__name__}"):
        other.load(saved)


def in_a_demo_output_folder(saved: Path) -> Path:
    """``saved`` moved to where a demo keeps its buffer: ``out/checkpoints/frames-<n>/buffer``."""
    inner = saved.parent / "runs" / "dqn" / "checkpoints" / "frames-000000002000" / "buffer"
    inner.parent.mkdir(parents=True)
    saved.rename(inner)
    return inner


@pytest.mark.parametrize("levels", [1, 3])  # the demo checkpoint, the demo output folder
def test_loading_a_demo_folder_names_the_buffer_checkpoint_inside_it(saved: Path, levels: int) -> None:
    inner = in_a_demo_output_folder(saved)
    outer = inner.parents[levels - 1]
    with pytest.raises(CheckpointError, match=rf"{re.escape(str(outer))}: .*demo.*; its buffer's checkpoint is "
                                              rf"{re.escape(str(inner))}"):
        ReplayBuffer.load(outer)
    assert len(ReplayBuffer.load(inner)) > 0


class TouchOnUnpickle:
    """Unpickling this creates ``marker``: a stand-in for any code a crafted pickle runs."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return pathlib.Path.touch, (self.marker,)


def write_payload(marker: Path, target: Path) -> None:
    """A pickle as TorchRL writes one: ``pickle.dump`` for ``.pkl`` files, ``torch.save`` for the others."""
    if target.suffix == ".pkl":
        target.write_bytes(pickle.dumps(TouchOnUnpickle(marker)))
    else:
        torch.save(TouchOnUnpickle(marker), target)


@pytest.mark.parametrize("name", ["payload.pkl", "payload.pt"])
def test_the_payload_runs_when_unpickled(tmp_path: Path, name: str) -> None:
    write_payload(tmp_path / "ran", tmp_path / name)
    if name.endswith(".pkl"):
        pickle.loads((tmp_path / name).read_bytes())
    else:
        torch.load(tmp_path / name, weights_only=False)
    assert (tmp_path / "ran").exists()  # so its absence below means it never ran


@pytest.mark.parametrize("name", ["prefetch.pkl", "tensors/buffer.pt", "transform.t"])
def test_a_pickle_in_a_checkpoint_is_refused_and_never_unpickled(saved: Path, tmp_path: Path, name: str) -> None:
    marker = tmp_path / "ran"
    write_payload(marker, saved / name)
    with pytest.raises(CheckpointError, match=rf"unexpected file {re.escape(repr(name))} .* refusing the checkpoint"):
        ReplayBuffer.load(saved)
    assert not marker.exists()


def test_a_listed_file_holding_a_pickle_is_read_as_raw_bytes_never_unpickled(saved: Path, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    write_payload(marker, saved / "tensors" / "evil.pt")
    raw = (saved / "tensors" / "evil.pt").read_bytes()

    def list_it(manifest: dict[str, Any]) -> None:
        manifest["files"]["tensors/evil.pt"] = {"dtype": "uint8", "shape": [len(raw)], "bytes": len(raw),
                                                "xxh3_128": xxhash.xxh3_128(raw).hexdigest()}
        manifest["state"]["evil"] = {"__tensor__": "tensors/evil.pt"}
    edit_manifest(saved, list_it)
    state = load_state(saved, kind="ReplayBuffer")
    assert bytes(state["evil"].numpy()) == raw
    assert not marker.exists()


def test_torchrl_loads_of_the_pickle_that_rlbuf_refuses_is_refused_too(tmp_path: Path) -> None:
    crafted, marker = tmp_path / "crafted", tmp_path / "ran"
    crafted.mkdir()
    write_payload(marker, crafted / "prefetch.pkl")
    with pytest.raises(CheckpointError, match=r"manifest\.json: missing"):
        ReplayBuffer.load(crafted)
    assert not marker.exists()
    buf = make("replay")
    # TorchRL's loads would unpickle it; rlbuf's buffer.torchrl sends every load to rlbuf's one check.
    with pytest.raises(ConfigError, match=r"torchrl\.loads: refused .* use ReplayBuffer\.load"):
        buf.torchrl.loads(crafted)
    assert not marker.exists()


# -- memmap storage -----------------------------------------------------------------------------
def test_a_memmap_buffer_loads_into_a_new_scratch_dir_and_never_writes_to_the_checkpoint(tmp_path: Path) -> None:
    buf = ReplayBuffer(64, obs_shape=(3,), action_shape=(2,), storage="memmap", scratch_dir=tmp_path / "scratch",
                       seed=0, extra_fields={"cost": ((), torch.float32)})
    data = torch.Generator().manual_seed(0)
    add_steps([buf], "replay", data, 40)
    path = tmp_path / "ckpt"
    buf.save(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error", MetadataOnlyWarning)
        loaded = ReplayBuffer.load(path)
    scratch = loaded._ring.scratch_dir
    assert isinstance(loaded.torchrl.storage, LazyMemmapStorage)
    assert scratch is not None and scratch.is_dir() and any(scratch.rglob("*.memmap"))
    assert scratch != tmp_path / "scratch" and not scratch.is_relative_to(path)
    assert_same([loaded.sample_all(), buf.sample_all()])
    add_steps([loaded], "replay", data, 64)  # overwrite every row of the loaded buffer
    read_manifest(path)  # checksums still hold: the checkpoint files were not written to
    again = ReplayBuffer.load(path)
    assert_same([again.sample_all(), buf.sample_all()])
    loaded.save(path)  # over the checkpoint it was loaded from
    assert_same([ReplayBuffer.load(path).sample_all(), loaded.sample_all()])
    loaded.close()
    assert not scratch.exists()
    close_all([buf, again])


def test_state_of_another_capacity_or_sampler_is_refused_before_anything_changes() -> None:
    small = ReplayBuffer(4, obs_shape=(3,), action_shape=(2,), seed=0)
    big = ReplayBuffer(10, obs_shape=(3,), action_shape=(2,), seed=0)
    prioritized = ReplayBuffer(4, obs_shape=(3,), action_shape=(2,), seed=0, prioritized=True)
    for _ in range(6):
        small.add(torch.ones(3), torch.ones(2), 1.0, torch.ones(3), False, truncated=False)
    big.add(torch.zeros(3), torch.zeros(2), 0.0, torch.zeros(3), False, truncated=False)
    with pytest.raises(CheckpointError, match="options: capacity is 4 in the state, 10 in this buffer"):
        big.load_state_dict(small.state_dict())
    with pytest.raises(CheckpointError, match="options: prioritized is False in the state, True in this buffer"):
        prioritized.load_state_dict(small.state_dict())
    assert len(big) == 1 and len(prioritized) == 0


def _rewrite_manifest(path: Path, change: Any) -> None:
    manifest = json.loads((path / "manifest.json").read_text())
    change(manifest["state"])
    (path / "manifest.json").write_text(json.dumps(manifest))


def test_a_crafted_manifest_cannot_call_other_methods_or_pass_other_options(tmp_path: Path) -> None:
    buf = ReplayBuffer(8, obs_shape=(3,), action_shape=(2,), seed=0)
    for _ in range(4):
        buf.add(torch.ones(3), torch.ones(2), 1.0, torch.ones(3), False, truncated=False)
    buf.epochs(batch_size=2)
    buf.save(tmp_path / "a")
    _rewrite_manifest(tmp_path / "a", lambda state: state["iterator"].update(
        method="save", arguments={"path": str(tmp_path / "written")}))
    with pytest.raises(CheckpointError, match="unknown iterator method 'save'"):
        ReplayBuffer.load(tmp_path / "a")
    assert not (tmp_path / "written").exists()
    buf.save(tmp_path / "b")
    _rewrite_manifest(tmp_path / "b", lambda state: state["options"].update(scratch_dir="/"))
    with pytest.raises(CheckpointError, match=r"options \['scratch_dir'\] are not options of ReplayBuffer"):
        ReplayBuffer.load(tmp_path / "b")


def _as_format_one(path: Path) -> None:
    """Rewrite a checkpoint as rlbuf wrote it before issue 10: format version 1, SHA-256 per file."""
    def downgrade(manifest: dict[str, Any]) -> None:
        manifest["format_version"] = 1
        for rel, entry in manifest["files"].items():
            del entry["xxh3_128"]
            entry["sha256"] = hashlib.sha256((path / rel).read_bytes()).hexdigest()
    edit_manifest(path, downgrade)


def test_a_format_one_checkpoint_with_sha256_still_loads(saved: Path) -> None:
    def stored(buffer: ReplayBuffer) -> Any:  # rows past the stored ones are uninitialised memory
        return {key: value for key, value in snapshot(buffer).items() if key != "storage"}

    expected = stored(ReplayBuffer.load(saved))
    _as_format_one(saved)
    assert read_manifest(saved)["format_version"] == 1
    assert same(stored(ReplayBuffer.load(saved)), expected)
    target = saved / field_file(saved)
    data = bytearray(target.read_bytes())
    data[0] ^= 0x01
    target.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=rf"{re.escape(str(target))}: SHA-256 mismatch \(corrupted\)"):
        ReplayBuffer.load(saved)


def test_new_checkpoints_carry_xxh3_of_each_file(saved: Path) -> None:
    manifest = read_manifest(saved)
    assert manifest["format_version"] == 2
    for rel, entry in manifest["files"].items():
        assert "sha256" not in entry
        assert entry["xxh3_128"] == xxhash.xxh3_128((saved / rel).read_bytes()).hexdigest()


@pytest.mark.parametrize("cls", [ReplayBuffer, RolloutBuffer, DistillationBuffer, MixedReplay])
def test_loading_a_path_that_does_not_exist_says_so(cls: Any, tmp_path: Path) -> None:
    """``load('/no/such/path')`` said "not a checkpoint directory" (a MixedReplay: ".../mixer: not a checkpoint
    directory"), not that the path does not exist (helper 75)."""
    missing = tmp_path / "no" / "such" / "path"
    with pytest.raises(CheckpointError, match=rf"^{re.escape(str(missing))}: does not exist \(expected a "
                                              r"(MixedReplay )?checkpoint directory: check the path\)$"):
        cls.load(missing)
    (tmp_path / "file").write_text("")
    with pytest.raises(CheckpointError, match=r"file: not a (MixedReplay )?checkpoint directory"):
        cls.load(tmp_path / "file")
