"""Holes an attacker found in the one load check (issue 20), each closed: a checkpoint rlbuf would
not have written is refused with ``CheckpointError`` (or ``ConfigError`` for a declaration) naming
what is wrong, checksums recomputed; a refused ``load_state_dict`` leaves the buffer as it was."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import xxhash
from _snapshot import same, snapshot

from rlbuf import (
    CheckpointError,
    ConfigError,
    EpisodeStats,
    MissingFieldError,
    ReplayBuffer,
    RolloutBuffer,
)


def _rehash(path: Path, manifest: dict[str, Any]) -> None:
    for name, entry in manifest["files"].items():
        data = (path / name).read_bytes()
        entry["bytes"] = len(data)
        if "xxh3_128" in entry:
            entry["xxh3_128"] = xxhash.xxh3_128(data).hexdigest()
        if "sha256" in entry:
            entry["sha256"] = hashlib.sha256(data).hexdigest()
    (path / "manifest.json").write_text(json.dumps(manifest))


def _edit(path: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    manifest = json.loads((path / "manifest.json").read_text())
    edit(manifest)
    _rehash(path, manifest)


def _refused_in_place(buffer: Any, state: dict[str, Any], match: str) -> None:
    before = snapshot(buffer)
    with pytest.raises(CheckpointError, match=match):
        buffer.load_state_dict(state)
    assert same(before, snapshot(buffer))


# -- 1. one file per field ----------------------------------------------------------------------
def test_fields_whose_sanitised_names_collide_get_their_own_files(tmp_path: Path) -> None:
    buffer = ReplayBuffer(8, obs_shape={"a": {"b": (2,)}, "a_b": (2,)}, action_shape=(), seed=0)
    obs = {"a": {"b": torch.ones(2)}, "a_b": torch.full((2,), 2.0)}
    buffer.add(obs, 0.0, 1.0, obs, False, truncated=False)
    buffer.save(tmp_path / "ck")
    loaded = ReplayBuffer.load(tmp_path / "ck").sample_all().obs
    assert loaded["a", "b"].tolist() == [[1.0, 1.0]] and loaded["a_b"].tolist() == [[2.0, 2.0]]


def test_a_hidden_state_and_an_extra_field_of_the_same_file_name_stay_apart(tmp_path: Path) -> None:
    buffer = ReplayBuffer(8, obs_shape=(2,), action_shape=(), seed=0, hidden_state_shape={"h": (2,)},
                          extra_fields={"hidden_state_h_": ((2,), torch.float32)})
    buffer.add(torch.zeros(2), 0.0, 1.0, torch.zeros(2), False, hidden_state={"h": torch.ones(2)},
               hidden_state_h_=torch.full((2,), 5.0), truncated=False)
    buffer.save(tmp_path / "ck")
    batch = ReplayBuffer.load(tmp_path / "ck").sample_all()
    assert batch.hidden_state["h"].tolist() == [[1.0, 1.0]] and batch.extras["hidden_state_h_"].tolist() == [[5.0, 5.0]]


def _plain(tmp_path: Path) -> Path:
    buffer = ReplayBuffer(8, obs_shape=(2,), action_shape=(), seed=0)
    for i in range(5):
        buffer.add(torch.full((2,), float(i)), 0.0, float(i), torch.zeros(2), False, truncated=False)
    buffer.save(tmp_path / "ck")
    return tmp_path / "ck"


def test_a_field_pointing_at_another_fields_file_is_refused(tmp_path: Path) -> None:
    path = _plain(tmp_path)
    _edit(path, lambda m: m["state"]["fields"]["reward"].__setitem__("__tensor__", "tensors/state.fields.action.bin"))
    with pytest.raises(CheckpointError, match=r"refers to the file 'tensors/state\.fields\.action\.bin' twice"):
        ReplayBuffer.load(path)


def test_two_fields_swapping_files_are_refused(tmp_path: Path) -> None:
    path = _plain(tmp_path)

    def swap(manifest: dict[str, Any]) -> None:
        fields = manifest["state"]["fields"]
        fields["reward"], fields["action"] = fields["action"], fields["reward"]
    _edit(path, swap)
    with pytest.raises(CheckpointError, match="not its own"):
        ReplayBuffer.load(path)


def test_a_manifest_that_is_a_link_is_refused(tmp_path: Path) -> None:
    path = _plain(tmp_path)
    outside = tmp_path / "elsewhere.json"
    (path / "manifest.json").rename(outside)
    os.symlink(outside, path / "manifest.json")
    with pytest.raises(CheckpointError, match="symbolic link"):
        ReplayBuffer.load(path)


# -- 2. tensors that hold no data -----------------------------------------------------------------
def _filled() -> ReplayBuffer:
    buffer = ReplayBuffer(8, obs_shape=(2,), action_shape=(), seed=0, prioritized=True)
    for i in range(5):
        buffer.add(torch.full((2,), float(i)), 0.0, float(i), torch.zeros(2), False, truncated=False)
    return buffer


def test_a_field_on_the_meta_device_is_refused_and_the_buffer_kept() -> None:
    buffer = _filled()
    state = buffer.state_dict()
    state["fields"]["obs"] = torch.empty_like(state["fields"]["obs"], device="meta")
    _refused_in_place(buffer, state, "meta device")
    assert len(buffer) == 5


def test_a_generator_state_on_the_meta_device_is_refused() -> None:
    buffer = _filled()
    state = buffer.state_dict()
    state["rng"]["sample"] = torch.empty_like(state["rng"]["sample"], device="meta")
    _refused_in_place(buffer, state, "meta device")


# -- 3. max priority ------------------------------------------------------------------------------
@pytest.mark.parametrize(("key", "value", "match"), [
    ("max_priority", 1e300, "outside"), ("max_priority", float("inf"), "inf"), ("max_priority", -3.0, "outside"),
    ("max_priority", 0.5, "below the priority 5"), ("max_priority_index", 99, "not a row position"),
    ("max_priority_index", -1, "not a row position"),
])
def test_a_forged_max_priority_is_refused(key: str, value: Any, match: str) -> None:
    buffer = _filled()
    buffer.update_priority(torch.tensor([1, 2]), torch.tensor([5.0, 2.0]))
    state = buffer.state_dict()
    state["sampler"][key] = value
    _refused_in_place(buffer, state, match)
    assert buffer.check_valid() == (True, "")


def test_no_max_priority_with_an_index_is_refused() -> None:
    buffer = _filled()
    state = buffer.state_dict()
    state["sampler"].update(max_priority=-1.0, max_priority_index=2)
    _refused_in_place(buffer, state, "no priority was set")


def test_genuine_max_priorities_load() -> None:
    buffer = _filled()
    buffer.update_priority(torch.tensor([0]), torch.tensor([0.25]))  # rows 1-4 keep the default 1.0
    copy = ReplayBuffer(8, obs_shape=(2,), action_shape=(), prioritized=True)
    copy.load_state_dict(buffer.state_dict())
    assert copy.check_valid() == (True, "")


# -- 4. compact checkpoints without the env table ----------------------------------------------------
def test_a_legacy_compact_checkpoint_loads_valid_and_round_trips(tmp_path: Path) -> None:
    buffer = ReplayBuffer(8, obs_shape=(2,), action_shape=(), num_envs=2, seed=0, compact=True)
    for t in range(5):
        buffer.add(torch.full((2, 2), float(t)), torch.zeros(2), torch.zeros(2), torch.full((2, 2), t + 1.0),
                   torch.tensor([t == 2, False]), truncated=False)
    buffer.save(tmp_path / "ck")

    def drop_env(manifest: dict[str, Any]) -> None:
        rel = manifest["state"]["extra"]["streams"].pop("env")["__tensor__"]
        del manifest["files"][rel]
        (tmp_path / "ck" / rel).unlink()
    _edit(tmp_path / "ck", drop_env)
    loaded = ReplayBuffer.load(tmp_path / "ck")
    assert loaded.check_valid() == (True, "")
    loaded.add(torch.full((2, 2), 5.0), torch.zeros(2), torch.zeros(2), torch.full((2, 2), 6.0), torch.zeros(2, dtype=torch.bool), truncated=False)
    assert loaded.check_valid() == (True, "")
    loaded.save(tmp_path / "again")
    assert ReplayBuffer.load(tmp_path / "again").check_valid() == (True, "")
    state = loaded.state_dict()
    env = state["extra"]["streams"]["env"]
    env[int((env == -1).nonzero()[0])] = 0  # a row of known env older than rows of unknown env
    _refused_in_place(loaded, state, "unknown env")


def _two_env_compact(**options: Any) -> ReplayBuffer:
    buffer = ReplayBuffer(16, obs_shape=(4, 4), obs_dtype=torch.uint8, action_shape=(), num_envs=2, n_step=3,
                          seed=0, **options)
    for t in range(5):
        frames = torch.stack([torch.full((4, 4), t + 16 * env, dtype=torch.uint8) for env in range(2)])
        buffer.add(frames, torch.zeros(2), torch.tensor([1.0, 100.0]), frames + 1, torch.tensor([t == 3, False]),
                   truncated=False)
    return buffer


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_links_that_cross_envs_are_refused_with_or_without_the_env_table(compression: str | None) -> None:
    # Without the table, env 0's row could link into env 1's stream: its 3-step reward summed env 1's (helper 40).
    buffer = _two_env_compact(compression=compression)
    state = buffer.state_dict()
    streams = state["extra"]["streams"]
    del streams["env"]
    streams["next"][[0, 1]] = streams["next"][[1, 0]].clone()
    if compression:  # a compressed checkpoint always names each row's env
        _refused_in_place(buffer, state, "env is not named")
    state = buffer.state_dict()
    streams = state["extra"]["streams"]
    streams["next"][[0, 1]] = streams["next"][[1, 0]].clone()  # with the table: checked against it
    _refused_in_place(buffer, state, "does not link to the next row of its env")
    state = buffer.state_dict()
    del state["extra"]["streams"]["env"]
    if compression:
        _refused_in_place(buffer, state, "env is not named")
    else:  # a legacy checkpoint (the first compact ones stored no env table): loads
        copy = _two_env_compact(compression=compression)
        copy.load_state_dict(state)
        assert torch.equal(copy.sample_all().reward, buffer.sample_all().reward)


def test_a_one_env_legacy_checkpoint_has_its_links_checked() -> None:
    buffer = ReplayBuffer(8, obs_shape=(2,), action_shape=(), n_step=2, seed=0)
    for t in range(5):
        buffer.add(torch.full((2,), float(t)), 0.0, 1.0, torch.full((2,), t + 1.0), t == 2, truncated=False)
    state = buffer.state_dict()
    del state["extra"]["streams"]["env"]
    state["extra"]["streams"]["next"][0] = 3  # a forward link past row 1: only the env's own order refuses it
    _refused_in_place(buffer, state, "stream table next: the row at position 0 does not link to the next row")
    state = buffer.state_dict()
    state["extra"]["streams"]["env"][1] = 5  # a saved table is checked, not replaced by the derived one
    _refused_in_place(buffer, state, r"stream table env: stored rows must name an env in \[0, 1\)")


# -- 5. rollout counters ----------------------------------------------------------------------------
def _rollout() -> RolloutBuffer:
    buffer = RolloutBuffer(4, 2, obs_shape=(3,), action_shape=(), seed=0)
    for t in range(2):
        buffer.add(torch.full((2, 3), float(t)), torch.zeros(2), torch.ones(2), torch.zeros(2, dtype=torch.bool),
                   torch.zeros(2), torch.zeros(2), truncated=False)
    return buffer


def test_a_rollout_of_half_a_step_is_refused() -> None:
    buffer = _rollout()
    state = buffer.state_dict()
    state.update(size=3, cursor=3, write_count=3)
    state["fields"] = {name: column[:3] for name, column in state["fields"].items()}
    _refused_in_place(buffer, state, "not a whole number of steps of 2 envs")


def test_a_rollout_that_wrapped_is_refused() -> None:
    buffer = _rollout()
    state = buffer.state_dict()
    state.update(size=8, cursor=2, write_count=10)
    state["fields"] = {name: torch.cat([column, column]) for name, column in state["fields"].items()}
    _refused_in_place(buffer, state, "never wraps")


# -- 6. interleaved ---------------------------------------------------------------------------------
def test_interleaved_with_a_write_count_of_part_of_a_step_is_refused() -> None:
    buffer = ReplayBuffer(16, obs_shape=(1,), action_shape=(), num_envs=2, seed=0)
    for t in range(5):
        buffer.add(torch.tensor([[float(t)], [0.0]]), torch.zeros(2), torch.zeros(2), torch.tensor([[t + 1.0], [0.0]]),
                   torch.tensor([False, False]), env_mask=np.array([True, False]), truncated=False)
    state = buffer.state_dict()
    assert state["extra"]["interleaved"] is False
    state["extra"]["interleaved"] = True
    _refused_in_place(buffer, state, "no multiple of num_envs")


# -- 7. episode statistics and reserved names ---------------------------------------------------------
def _with_stats() -> ReplayBuffer:
    buffer = ReplayBuffer(8, obs_shape=(1,), action_shape=(), seed=0, stats=EpisodeStats(1, window=3))
    for t in range(4):
        buffer.add(torch.zeros(1), 0.0, 1.0, torch.zeros(1), t % 2 == 1, truncated=False)
    return buffer


@pytest.mark.parametrize(("edit", "match"), [
    ({"window": 1.5}, "window: expected a positive int"),
    ({"window": 10**20}, "window: expected a positive int"),
    ({"window": 5}, "window: 5 in the state, 3 in this tracker"),
    ({"returns": [1.0] * 4, "lengths": [1] * 4, "reasons": ["terminated"] * 4, "episodes_finished": 4},
     "more than the window"),
    ({"episodes_finished": 1}, "episodes_finished"),
    ({"episodes_finished": 10**30}, "episodes_finished"),
    ({"reasons": [3, 4]}, "reasons"),
])
def test_forged_statistics_are_refused(edit: dict[str, Any], match: str) -> None:
    buffer = _with_stats()
    state = buffer.state_dict()
    state["extra"]["stats"] = {**state["extra"]["stats"], **edit}
    _refused_in_place(buffer, state, match)


def test_a_saved_window_that_is_no_int_is_refused_at_load(tmp_path: Path) -> None:
    _with_stats().save(tmp_path / "ck")
    _edit(tmp_path / "ck", lambda m: m["state"]["extra"]["stats"].__setitem__("window", 1.5))
    with pytest.raises(CheckpointError, match="window"):
        ReplayBuffer.load(tmp_path / "ck")


@pytest.mark.parametrize("name", ["mask", "is_first", "is_init", "burn_in"])
def test_an_extra_named_like_a_sequence_column_is_refused_by_sample_sequences(name: str) -> None:
    # is_init (to_tensordict()'s key of is_first) and burn_in were taken: TorchRL's LSTMModule read the extra.
    buffer = ReplayBuffer(8, obs_shape=(1,), action_shape=(), extra_fields={name: ((), torch.float32)})
    for _ in range(4):
        buffer.add(torch.zeros(1), 0.0, 1.0, torch.zeros(1), False, **{name: 7.0}, truncated=False)
    assert buffer.sample_all().extras[name].tolist() == [7.0] * 4  # stored and sampled as usual
    with pytest.raises(ConfigError, match=f"^sample_sequences: the extra field '{name}' has the name of .* would hide"):
        buffer.sample_sequences(2, 2)


@pytest.mark.parametrize("name", ["mask", "env", "start", "is_init"])
def test_a_rollout_extra_named_like_a_trajectory_column_is_refused_by_sequence_minibatches(name: str) -> None:
    # The extra replaced the padding mask in to_tensordict() (a TorchRL loss then counted padding), or
    # batch.env / batch.start gave the trajectories' own attributes instead of it (helper 46).
    buffer = RolloutBuffer(2, 1, obs_shape=(1,), action_shape=(), extra_fields={name: ((), torch.float32)}, seed=0)
    for _ in range(2):
        buffer.add(torch.zeros(1), 0.0, 1.0, False, 0.0, 0.0, truncated=False, **{name: 7.0})
    buffer.compute_returns_and_advantages(torch.zeros(1))
    assert next(iter(buffer.minibatches(batch_size=2))).extras[name].tolist() == [7.0] * 2   # rows as usual
    before = snapshot(buffer)
    with pytest.raises(ConfigError, match=f"^minibatches\\(sequences=True\\): the extra field '{name}' has the name"):
        buffer.minibatches(num_minibatches=1, sequences=True)
    assert same(snapshot(buffer), before)


def test_a_rollout_keeps_its_action_mask_extra() -> None:
    buffer = RolloutBuffer(2, 1, obs_shape=(1,), action_shape=(), extra_fields={"mask": ((4,), torch.bool)})
    assert "mask" in buffer.state_dict()["fields"]


def _full_rollout(steps: int = 4, reward: float = 1.0) -> RolloutBuffer:
    buffer = RolloutBuffer(4, 2, obs_shape=(3,), action_shape=(), seed=0)
    for t in range(steps):
        value = torch.tensor([t + reward, -t - reward])
        buffer.add(value[:, None].expand(-1, 3), torch.zeros(2), value, torch.tensor([t == 1, False]), value * 0.1,
                   -value.abs(), truncated=False)
    return buffer


@pytest.mark.parametrize("name", ["mask", "env", "is_init", "value_target", "next", "to_tensordict", "index", "_x"])
def test_an_attached_extra_set_extras_would_refuse_is_refused_at_load(name: str) -> None:
    # They loaded: in to_tensordict() "value_target" replaced the returns a TorchRL loss trains towards, "next"
    # the whole next step; "mask" made the restored sequence iterator refuse after the rows were in (helper 50).
    source = _full_rollout()
    source.set_extras({"advantage": torch.ones(4, 2), "returns": torch.ones(4, 2), "keep": torch.zeros(4, 2)})
    next(iter(source.minibatches(num_minibatches=2, sequences=True)))
    state = source.state_dict()
    state["extra"]["attached"] = {name: state["extra"]["attached"]["keep"]}
    target = _full_rollout(reward=7.0)
    target.compute_returns_and_advantages(torch.zeros(2))
    before = snapshot(target)
    with pytest.raises(CheckpointError, match=f"attached extra {name!r} is not a usable name"):
        target.load_state_dict(state)
    assert same(snapshot(target), before)
    with pytest.raises(MissingFieldError, match=f"set_extras: {name!r} is not a usable name"):
        source.set_extras({name: torch.zeros(4, 2)})


def test_a_minibatches_iterator_of_a_partial_rollout_is_refused_before_anything_changes() -> None:
    # minibatches() refuses a partial rollout: such an iterator raised RolloutIncompleteError at load, after
    # the rows were in (helper 50).
    full = _full_rollout()
    full.compute_returns_and_advantages(torch.zeros(2))
    next(full.minibatches(batch_size=3, n_epochs=2))
    partial = _full_rollout(steps=2)
    partial.set_extras({"advantage": torch.ones(4, 2), "returns": torch.ones(4, 2)})
    state = {**partial.state_dict(), "iterator": full.state_dict()["iterator"]}
    target = _full_rollout(reward=7.0)
    target.compute_returns_and_advantages(torch.zeros(2))
    before = snapshot(target)
    with pytest.raises(CheckpointError, match="a minibatches\\(\\) iterator runs over a full rollout, the state holds 4"):
        target.load_state_dict(state)
    assert same(snapshot(target), before)


def test_non_finite_advantages_are_refused_at_load() -> None:
    # set_extras and compute_returns_and_advantages refuse them, yet a state with NaN advantages loaded, marked
    # ready, and went into minibatches (helper 50).
    source = _full_rollout()
    source.compute_returns_and_advantages(torch.zeros(2))
    for name in ("advantage", "returns"):
        state = source.state_dict()
        state["fields"][name] = state["fields"][name].clone()
        state["fields"][name][3] = float("nan")
        target = _full_rollout(reward=7.0)
        before = snapshot(target)
        with pytest.raises(CheckpointError, match=f"field '{name}' holds non-finite values"):
            target.load_state_dict(state)
        assert same(snapshot(target), before)


def test_a_state_without_statistics_is_refused_by_a_buffer_with_them() -> None:
    # The buffer's EpisodeStats kept the episodes of its own run and went on with the loaded one's (helper 50).
    def run(stats: EpisodeStats | None, reward: float) -> ReplayBuffer:
        buffer = ReplayBuffer(8, obs_shape=(1,), action_shape=(), seed=0, stats=stats)
        for t in range(4):
            buffer.add(torch.zeros(1), 0.0, reward, torch.zeros(1), t % 2 == 1, truncated=False)
        return buffer

    target = run(EpisodeStats(1), 5.0)
    before = snapshot(target)
    with pytest.raises(CheckpointError, match="it holds no episode statistics"):
        target.load_state_dict(run(None, 1.0).state_dict())
    assert same(snapshot(target), before)
    state = run(EpisodeStats(1), 1.0).state_dict()
    state["extra"]["stats"]["surprise"] = 1
    with pytest.raises(CheckpointError, match="stats state: unknown key 'surprise'"):
        target.load_state_dict(state)
    assert same(snapshot(target), before)


def _with_iterator() -> ReplayBuffer:
    buffer = ReplayBuffer(8, obs_shape=(1,), action_shape=(), seed=0)
    for i in range(6):
        buffer.add(torch.full((1,), float(i)), 0.0, float(i), torch.zeros(1), False, truncated=False)
    next(buffer.epochs(batch_size=2, n_epochs=2))
    return buffer


@pytest.mark.parametrize(("edit", "message"), [
    (lambda s: s["iterator"].__setitem__("surprise", 1), "the iterator must hold 'method', 'arguments'"),
    (lambda s: s["iterator"]["arguments"].pop("shuffle"), "the iterator must hold 'method', 'arguments'"),
    (lambda s: s["iterator"]["state"].__setitem__("surprise", 1), "a state of keys"),
    (lambda s: s["iterator"]["state"].__setitem__("n_epochs", 2.0), "n_epochs is 2 here but 2.0"),
    (lambda s: s["iterator"]["state"].__setitem__("drop_last", 0), "drop_last is False here but 0"),
    (lambda s: s.update(data=False), "data is false .* yet it holds rows"),
])
def test_an_iterator_or_a_data_free_state_rlbuf_would_not_write_is_refused(
        edit: Callable[[dict[str, Any]], Any], message: str) -> None:
    # Each loaded: a state of the options alone carrying rows and an iterator, iterator states of other keys or
    # types (helper 50).
    state = _with_iterator().state_dict()
    edit(state)
    target = _with_iterator()
    before = snapshot(target)
    with pytest.raises(CheckpointError, match=message):
        target.load_state_dict(state)
    assert same(snapshot(target), before)


@pytest.mark.parametrize(("alpha", "beta"), [("x", 0.4), (-1, 0.4), ([], None), (True, 0.4), (0.6, "0.4")])
def test_a_uniform_buffers_checkpoint_with_sampler_options_rlbuf_never_wrote_is_refused(
        alpha: Any, beta: Any, tmp_path: Path) -> None:
    # Any alpha and beta of a uniform buffer loaded: the shim for older versions' dropped them unread. Those
    # recorded any numbers given, unused (alpha and beta from a config, PER switched off by a flag): they load.
    buffer = ReplayBuffer(8, obs_shape=(1,), action_shape=(), seed=0)
    buffer.add(torch.zeros(1), 0.0, 1.0, torch.zeros(1), False, truncated=False)
    buffer.save(tmp_path / "ck")
    _edit(tmp_path / "ck", lambda m: m["state"]["options"].update(alpha=alpha, beta=beta))
    with pytest.raises(CheckpointError, match=r"a uniform buffer with (alpha|beta)="):
        ReplayBuffer.load(tmp_path / "ck")
    for recorded in ((0.6, 0.4), (0.7, 0.5), (1, 0)):
        _edit(tmp_path / "ck", lambda m, pair=recorded: m["state"]["options"].update(alpha=pair[0], beta=pair[1]))
        assert len(ReplayBuffer.load(tmp_path / "ck")) == 1


def test_the_field_specs_checkpoints_record_are_the_ones_older_versions_wrote() -> None:
    # A load compares them whole: a flag added to a spec (finite=True on the advantage) refused every older
    # rollout checkpoint (review). Change one only with a shim for what older versions wrote.
    def spec(name: str, key: Any, dtype: str = "float32", finite: bool = False) -> dict[str, Any]:
        return {"name": name, "key": key, "shape": [2] if name in ("obs", "next_obs") else [], "dtype": dtype,
                "finite": finite}

    flags = [spec("terminated", ["next", "terminated"], "bool"), spec("truncated", ["next", "truncated"], "bool")]
    replay = [spec("obs", "observation"), spec("action", "action"), spec("reward", ["next", "reward"], finite=True),
              spec("next_obs", ["next", "observation"]), *flags, spec("done", ["next", "done"], "bool")]
    rollout = [spec("obs", "observation"), spec("action", "action"), spec("reward", ["next", "reward"], finite=True),
               *flags, spec("value", "state_value", finite=True), spec("log_prob", "sample_log_prob", finite=True),
               spec("bootstrap_value", ["next", "state_value"], finite=True), spec("advantage", "advantage"),
               spec("returns", "value_target"), spec("done", ["next", "done"], "bool")]
    assert ReplayBuffer(4, obs_shape=(2,), action_shape=()).state_dict(data=False)["spec"] == replay
    assert RolloutBuffer(2, 1, obs_shape=(2,), action_shape=()).state_dict(data=False)["spec"] == rollout
