"""Hidden states and sequence minibatches for recurrent PPO, checked against rsl_rl's generator."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from rlbuf import ReplayBuffer, RolloutBuffer, SequenceBatch
from rlbuf.errors import BatchSizeError, CheckpointError, ConfigError, MissingFieldError, ShapeError
from rlbuf.sequences import split_trajectories

T, N, LAYERS, H = 12, 4, 2, 3


def rollout_data(seed: int = 0, done_rate: float = 0.2) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    done = torch.rand(T, N, generator=g) < done_rate
    truncated = done & (torch.rand(T, N, generator=g) < 0.5)
    return {
        "proprio": torch.randn(T, N, 5, generator=g),
        "camera": torch.randint(0, 255, (T, N, 2, 2), generator=g).to(torch.uint8),
        "action": torch.randn(T, N, 2, generator=g),
        "reward": torch.randn(T, N, generator=g),
        "terminated": done & ~truncated,
        "truncated": truncated,
        "value": torch.randn(T, N, generator=g),
        "log_prob": torch.randn(T, N, generator=g),
        # rsl_rl's layout: [T, layers, N, H].
        "h": torch.randn(T, LAYERS, N, H, generator=g),
        "c": torch.randn(T, LAYERS, N, H, generator=g),
    }


def filled_buffer(data: dict[str, torch.Tensor], **kwargs: Any) -> RolloutBuffer:
    buf = RolloutBuffer(T, N, obs_shape={"proprio": (5,), "camera": (2, 2)}, obs_dtype={"camera": torch.uint8},
                        action_shape=(2,), hidden_state_shape={"h": (LAYERS, H), "c": (LAYERS, H)}, seed=0, **kwargs)
    for t in range(T):
        buf.add({"proprio": data["proprio"][t], "camera": data["camera"][t]}, data["action"][t], data["reward"][t],
                data["terminated"][t], data["value"][t], data["log_prob"][t], truncated=data["truncated"][t],
                bootstrap_value=torch.zeros(N),
                hidden_state={"h": data["h"][t].transpose(0, 1), "c": data["c"][t].transpose(0, 1)})
    buf.compute_returns_and_advantages(torch.zeros(N))
    return buf


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(st.booleans(), min_size=3, max_size=3), min_size=1, max_size=8))
def test_trajectories_cover_every_step_once_and_end_only_at_done(flags: list[list[bool]]) -> None:
    done = torch.tensor(flags)
    steps = done.shape[0]
    trajectories = split_trajectories(done)
    covered = torch.zeros_like(done, dtype=torch.int64)
    for env, start, length in zip(trajectories.env.tolist(), trajectories.start.tolist(),
                                  trajectories.length.tolist(), strict=True):
        covered[start:start + length, env] += 1
        inside = done[start:start + length - 1, env]
        assert not inside.any(), "a trajectory crosses an episode end"
        assert start + length == steps or done[start + length - 1, env]
    assert bool((covered == 1).all())


def test_sequence_minibatches_hold_whole_trajectories_with_their_first_hidden_state() -> None:
    data = rollout_data()
    buf = filled_buffer(data)
    done = data["terminated"] | data["truncated"]
    seen: list[tuple[int, int]] = []
    batches = list(buf.minibatches(num_minibatches=3, sequences=True, n_epochs=2))
    assert len(batches) == 6
    for batch in batches:
        assert isinstance(batch, SequenceBatch)
        steps, width = batch.mask.shape
        assert batch.obs["camera"].shape == (steps, width, 2, 2) and batch.action.shape == (steps, width, 2)
        assert batch.hidden_state is not None and batch.hidden_state["h"].shape == (width, LAYERS, H)
        assert steps == int(batch.mask.sum(0).max())
        for b, (env, start) in enumerate(zip(batch.env.tolist(), batch.start.tolist(), strict=True)):
            length = int(batch.mask[:, b].sum())
            assert batch.mask[:length, b].all()
            seen.append((env, start))
            torch.testing.assert_close(batch.obs["proprio"][:length, b], data["proprio"][start:start + length, env])
            torch.testing.assert_close(batch.reward[:length, b], data["reward"][start:start + length, env])
            assert not (batch.terminated | batch.truncated)[:length - 1, b].any()
            assert start + length == T or done[start + length - 1, env]
            torch.testing.assert_close(batch.hidden_state["h"][b], data["h"][start, :, env])
            torch.testing.assert_close(batch.hidden_state["c"][b], data["c"][start, :, env])
            assert batch.action[length:, b].eq(0).all() and batch.obs["camera"][length:, b].eq(0).all()
    trajectories = split_trajectories(done)
    everything = sorted(zip(trajectories.env.tolist(), trajectories.start.tolist(), strict=True))
    assert sorted(seen[:len(seen) // 2]) == everything == sorted(seen[len(seen) // 2:])


@settings(max_examples=25, deadline=None)
@given(steps=st.integers(1, 6), envs=st.integers(1, 3), seed=st.integers(0, 1000), done_rate=st.floats(0.0, 1.0),
       batch=st.integers(1, 8), drop_last=st.booleans())
def test_every_trajectory_once_per_epoch_padded_with_zeros_from_its_first_state(
        steps: int, envs: int, seed: int, done_rate: float, batch: int, drop_last: bool) -> None:
    g = torch.Generator().manual_seed(seed)
    done = torch.rand(steps, envs, generator=g) < done_rate
    step_id = (torch.arange(steps)[:, None] * 10 + torch.arange(envs)[None, :] + 1).float()  # never 0
    buf = RolloutBuffer(steps, envs, obs_shape=(1,), action_shape=(), hidden_state_shape=(1,), seed=seed)
    for t in range(steps):
        buf.add(step_id[t, :, None], torch.zeros(envs), torch.ones(envs), done[t], torch.zeros(envs),
                torch.zeros(envs), hidden_state=step_id[t, :, None], truncated=False)
    buf.compute_returns_and_advantages(torch.zeros(envs))
    count = len(split_trajectories(done))
    if batch > count:
        with pytest.raises(BatchSizeError, match="trajectories in the rollout"):
            buf.minibatches(batch_size=batch, sequences=True)
        return
    seen: list[tuple[int, int]] = []
    for minibatch in buf.minibatches(batch_size=batch, n_epochs=1, sequences=True, drop_last=drop_last):
        obs, mask = minibatch.obs[..., 0], minibatch.mask  # type: ignore[index]
        assert torch.equal(obs == 0, ~mask)  # zeros exactly on padding
        assert minibatch.hidden_state is not None and torch.equal(minibatch.hidden_state[:, 0], obs[0])
        for b, (env, start) in enumerate(zip(minibatch.env.tolist(), minibatch.start.tolist(), strict=True)):
            length = int(mask[:, b].sum())
            assert torch.equal(obs[:length, b], step_id[start:start + length, env])
            assert not done[start:start + length - 1, env].any()  # nothing crosses an episode end
            seen.append((env, start))
    assert len(set(seen)) == len(seen)
    assert len(seen) == (count - count % batch if drop_last else count)


def test_sequence_minibatches_are_shuffled_by_trajectory() -> None:
    buf = filled_buffer(rollout_data())
    unshuffled = torch.cat([b.env * T + b.start for b in buf.minibatches(num_minibatches=2, sequences=True,
                                                                          shuffle=False)])
    shuffled = torch.cat([b.env * T + b.start for b in buf.minibatches(num_minibatches=2, sequences=True)])
    assert unshuffled.tolist() == sorted(unshuffled.tolist())
    assert shuffled.tolist() != unshuffled.tolist() and sorted(shuffled.tolist()) == unshuffled.tolist()


def test_batch_size_counts_trajectories() -> None:
    buf = filled_buffer(rollout_data())
    count = len(split_trajectories(buf.view("done")))
    sizes = [len(batch) for batch in buf.minibatches(batch_size=5, sequences=True)]
    assert sum(sizes) == count and max(sizes) == 5


def _rsl_rl_storage(data: dict[str, torch.Tensor]) -> Any:
    rollout_storage = pytest.importorskip("rsl_rl.storage.rollout_storage")
    first = TensorDict({"proprio": data["proprio"][0], "camera": data["camera"][0]}, batch_size=[N])
    storage = rollout_storage.RolloutStorage("rl", N, T, first, (2,))
    for t in range(T):
        step = rollout_storage.RolloutStorage.Transition()
        step.observations = TensorDict({"proprio": data["proprio"][t], "camera": data["camera"][t]}, batch_size=[N])
        step.actions = data["action"][t]
        step.rewards = data["reward"][t]
        step.dones = (data["terminated"][t] | data["truncated"][t]).to(torch.uint8)
        step.values = data["value"][t].unsqueeze(1)
        step.actions_log_prob = data["log_prob"][t]
        step.distribution_params = (data["action"][t],)
        step.hidden_states = ((data["h"][t], data["c"][t]), None)
        storage.add_transition(step)
    return storage


@pytest.mark.parametrize("num_minibatches", [1, 2])
def test_same_trajectories_masks_and_initial_states_as_rsl_rl(num_minibatches: int) -> None:
    data = rollout_data(seed=3)
    storage = _rsl_rl_storage(data)
    utils = pytest.importorskip("rsl_rl.utils")
    theirs = list(storage.recurrent_mini_batch_generator(num_minibatches, num_epochs=1))
    mine = list(filled_buffer(data).minibatches(num_minibatches=num_minibatches, sequences=True, shuffle=False))

    def padded_to_t(value: torch.Tensor) -> torch.Tensor:
        pad = torch.zeros(T - value.shape[0], *value.shape[1:], dtype=value.dtype)
        return torch.cat((value, pad))

    # rsl_rl splits minibatches by env, rlbuf by trajectory count: compare the trajectories in order.
    their_obs = torch.cat([b.observations["proprio"] for b in theirs], dim=1)
    their_masks = torch.cat([b.masks for b in theirs], dim=1)
    their_h = torch.cat([b.hidden_states[0][0] for b in theirs], dim=1)
    their_c = torch.cat([b.hidden_states[0][1] for b in theirs], dim=1)
    my_obs = torch.cat([padded_to_t(b.obs["proprio"]) for b in mine], dim=1)
    my_masks = torch.cat([padded_to_t(b.mask) for b in mine], dim=1)
    assert torch.equal(my_masks, their_masks)
    assert torch.equal(my_obs, their_obs)
    assert torch.equal(torch.cat([b.hidden_state["h"] for b in mine]).transpose(0, 1), their_h)  # type: ignore[index]
    assert torch.equal(torch.cat([b.hidden_state["c"] for b in mine]).transpose(0, 1), their_c)  # type: ignore[index]
    # rsl_rl pads only observations; rlbuf pads every field the same way.
    their_actions, _ = utils.split_and_pad_trajectories(data["action"], storage.dones)
    assert torch.equal(torch.cat([padded_to_t(b.action) for b in mine], dim=1), their_actions)


def test_padded_trajectories_replay_an_lstm_as_cleanrl_replays_the_whole_rollout() -> None:
    """CleanRL's ppo_atari_lstm replays each env's whole rollout from its first state, zeroing the
    state after every episode end; replaying each padded trajectory from its stored initial state
    must give the same output at every real step."""
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(5, H, num_layers=LAYERS)
    data = rollout_data(seed=7, done_rate=0.3)
    done = data["terminated"] | data["truncated"]
    h, c = torch.zeros(LAYERS, N, H), torch.zeros(LAYERS, N, H)
    outputs, states_h, states_c = [], [], []
    with torch.no_grad():  # collection: the state each step's action was computed from is stored
        for t in range(T):
            states_h.append(h)
            states_c.append(c)
            out, (h, c) = lstm(data["proprio"][t].unsqueeze(0), (h, c))
            outputs.append(out[0])
            keep = (~done[t]).view(1, N, 1)
            h, c = h * keep, c * keep
    data["h"], data["c"] = torch.stack(states_h), torch.stack(states_c)
    reference = torch.stack(outputs)  # [T, N, H]
    buf = filled_buffer(data)
    seen = 0
    with torch.no_grad():
        for batch in buf.minibatches(num_minibatches=3, sequences=True):
            assert batch.hidden_state is not None
            initial = (batch.hidden_state["h"].transpose(0, 1).contiguous(),
                       batch.hidden_state["c"].transpose(0, 1).contiguous())
            out, _ = lstm(batch.obs["proprio"], initial)
            steps = batch.start.unsqueeze(0) + torch.arange(batch.mask.shape[0]).unsqueeze(1)
            expected = reference[steps.clamp(max=T - 1), batch.env.expand_as(steps)]
            torch.testing.assert_close(out[batch.mask], expected[batch.mask])
            seen += int(batch.mask.sum())
    assert seen == T * N


def test_exact_resume_mid_epoch_with_sequence_minibatches(tmp_path: Any) -> None:
    buf = filled_buffer(rollout_data())
    iterator = buf.minibatches(num_minibatches=3, n_epochs=3, sequences=True)
    for _ in range(4):
        next(iterator)
    buf.save(tmp_path / "ckpt")
    restored = RolloutBuffer.load(tmp_path / "ckpt")
    resumed = restored.current_epochs
    assert resumed is not None and len(resumed) == len(iterator) == 5
    for mine, theirs in zip(iterator, resumed, strict=True):
        assert isinstance(theirs, SequenceBatch)
        assert torch.equal(mine.env, theirs.env) and torch.equal(mine.start, theirs.start)
        assert torch.equal(mine.mask, theirs.mask) and torch.equal(mine.advantage, theirs.advantage)
        assert (mine.hidden_state == theirs.hidden_state).all()  # type: ignore[operator]


def sequence_order(batches: Any) -> list[int]:
    return torch.cat([batch.env * T + batch.start for batch in batches]).tolist()


def test_refused_sequence_minibatches_leave_the_epoch_generator_untouched() -> None:
    buf, twin = filled_buffer(rollout_data()), filled_buffer(rollout_data())
    count = len(split_trajectories(buf.view("done")))
    assert count < T * N  # sizes are checked against trajectories, not rows
    rng = buf.state_dict()["rng"]
    with pytest.raises(BatchSizeError, match=rf"batch_size: expected at most {count} \(the trajectories in the "
                                             rf"rollout\), got {count + 1}"):
        buf.minibatches(batch_size=count + 1, sequences=True)
    with pytest.raises(BatchSizeError, match=rf"num_minibatches: expected at most {count} \(the trajectories"):
        buf.minibatches(num_minibatches=count + 1, sequences=True)
    with pytest.raises(BatchSizeError, match="exactly one of batch_size and num_minibatches"):
        buf.minibatches(batch_size=2, num_minibatches=2, sequences=True)
    with pytest.raises(ConfigError, match="n_epochs"):
        buf.minibatches(num_minibatches=1, n_epochs=-1, sequences=True)
    assert buf.current_epochs is None
    after = buf.state_dict()["rng"]
    assert torch.equal(after["epochs"], rng["epochs"]) and torch.equal(after["sample"], rng["sample"])
    # The next iterator draws what it would have drawn without the refused calls.
    assert sequence_order(buf.minibatches(batch_size=count, sequences=True, n_epochs=2)) == \
        sequence_order(twin.minibatches(batch_size=count, sequences=True, n_epochs=2))
    assert len(list(buf.minibatches(batch_size=count, sequences=True))) == 1


def _forge(state: dict[str, Any], **changes: Any) -> dict[str, Any]:
    forged = dict(state)
    forged["iterator"] = {**state["iterator"], "state": {**state["iterator"]["state"], **changes}}
    return forged


def test_forged_sequence_iterator_checkpoints_are_refused_and_change_nothing() -> None:
    source = filled_buffer(rollout_data())
    iterator = source.minibatches(num_minibatches=3, n_epochs=3, sequences=True)
    for _ in range(4):
        next(iterator)
    state = source.state_dict()
    saved = state["iterator"]["state"]
    count = saved["size"]
    assert count == len(split_trajectories(source.view("done"))) and saved["position"] == 1
    target = filled_buffer(rollout_data(seed=5))
    target_iterator = target.minibatches(num_minibatches=3, n_epochs=3, sequences=True)
    next(target_iterator)
    before = target.state_dict()
    permutation = saved["permutation"]
    forgeries = [
        ("position", _forge(state, position=99)),
        ("size", _forge(state, size=T * N, permutation=torch.randperm(T * N))),  # rows, not trajectories
        ("permutation", _forge(state, permutation=torch.zeros_like(permutation))),
        ("permutation", _forge(state, permutation=permutation + count)),
        ("permutation", _forge(state, permutation=permutation.float())),
        ("permutation", _forge(state, permutation=None)),
        ("epoch", _forge(state, epoch=7)),
    ]
    for field, forged in forgeries:
        with pytest.raises(CheckpointError, match=rf"iterator state: epoch iterator: {field}"):
            target.load_state_dict(forged)
    partial = {**state, "size": T * N - N, "cursor": T * N - N, "write_count": T * N - N,
               "fields": {name: value[:-N] for name, value in state["fields"].items()}}
    with pytest.raises(CheckpointError, match=r"minibatches\(\) iterator runs over a full rollout"):
        target.load_state_dict(partial)
    after = target.state_dict()
    for name in before["fields"]:
        assert torch.equal(before["fields"][name], after["fields"][name]), name
    assert torch.equal(before["rng"]["epochs"], after["rng"]["epochs"])
    assert target.current_epochs is target_iterator
    assert after["iterator"]["state"]["position"] == 1 and torch.equal(
        after["iterator"]["state"]["permutation"], before["iterator"]["state"]["permutation"])
    target.load_state_dict(state)  # the genuine state still loads and resumes where the source is
    resumed = target.current_epochs
    assert resumed is not None and sequence_order(resumed) == sequence_order(iterator)


def test_an_epoch_that_began_with_fewer_rows_still_resumes(tmp_path: Any) -> None:
    buf = replay_with_steps(40, 2, 5)
    iterator = buf.epochs(batch_size=3, n_epochs=2)
    next(iterator)
    buf.add(torch.zeros(2, 1), torch.zeros(2), torch.zeros(2), torch.zeros(2, 1), torch.zeros(2, dtype=torch.bool), truncated=False)
    buf.save(tmp_path / "ckpt")
    restored = ReplayBuffer.load(tmp_path / "ckpt")
    resumed = restored.current_epochs
    assert resumed is not None
    assert [b.index.tolist() for b in resumed] == [b.index.tolist() for b in iterator]


def test_row_minibatches_carry_the_hidden_state_of_each_step() -> None:
    data = rollout_data()
    buf = filled_buffer(data)
    whole = buf.get_all_data()
    assert whole.hidden_state is not None
    torch.testing.assert_close(whole.hidden_state["h"], data["h"].permute(0, 2, 1, 3).reshape(T * N, LAYERS, H))
    td = whole.to_tensordict()
    assert td["recurrent_state_h"].shape == (T * N, LAYERS, H)
    view = buf.view("hidden_state")
    assert isinstance(view, TensorDict) and view.batch_size == (T, N)
    assert torch.equal(view["c"], data["c"].transpose(1, 2))


def test_a_gru_hidden_state_is_one_tensor_at_torchrl_key() -> None:
    buf = RolloutBuffer(2, 1, obs_shape=(3,), action_shape=(), hidden_state_shape=(1, 4))
    assert [spec.key for spec in buf.fields if spec.name == "hidden_state"] == ["recurrent_state"]
    for _ in range(2):
        buf.add(torch.zeros(1, 3), torch.zeros(1), torch.ones(1), torch.tensor([False]), torch.zeros(1),
                torch.zeros(1), hidden_state=torch.ones(1, 1, 4), truncated=False)
    buf.compute_returns_and_advantages(torch.zeros(1))
    batch = next(iter(buf.minibatches(num_minibatches=1, sequences=True)))
    assert isinstance(batch.hidden_state, torch.Tensor) and batch.hidden_state.shape == (1, 1, 4)


def test_hidden_state_inputs_are_validated_by_key() -> None:
    buf = RolloutBuffer(2, 2, obs_shape=(3,), action_shape=(), hidden_state_shape={"h": (1, 4), "c": (1, 4)})
    args = (torch.zeros(2, 3), torch.zeros(2), torch.ones(2), torch.tensor([False, False]), torch.zeros(2),
            torch.zeros(2), False)
    with pytest.raises(MissingFieldError, match="hidden_state: this buffer stores one"):
        buf.add(*args)
    with pytest.raises(MissingFieldError, match=r'hidden_state\["c"\]: missing'):
        buf.add(*args, hidden_state={"h": torch.zeros(2, 1, 4)})
    with pytest.raises(ShapeError, match=r'hidden_state\["c"\]: expected shape \(2, 1, 4\), got \(2, 4\)'):
        buf.add(*args, hidden_state={"h": torch.zeros(2, 1, 4), "c": torch.zeros(2, 4)})
    assert buf.steps == 0
    plain = RolloutBuffer(2, 2, obs_shape=(3,), action_shape=())
    with pytest.raises(MissingFieldError, match="built without hidden_state_shape"):
        plain.add(*args, hidden_state=torch.zeros(2, 1, 4))
    with pytest.raises(ConfigError, match="nested keys"):
        RolloutBuffer(2, 2, obs_shape=(3,), action_shape=(), hidden_state_shape={"a": {"h": (1, 4)}})


def test_extend_reads_torchrl_recurrent_state_keys() -> None:
    td = TensorDict({"observation": torch.zeros(2, 3, 1), "action": torch.zeros(2, 3), "state_value": torch.zeros(2, 3, 1),
                     "sample_log_prob": torch.zeros(2, 3), "recurrent_state_h": torch.arange(12.0).view(2, 3, 1, 2),
                     "recurrent_state_c": torch.zeros(2, 3, 1, 2),
                     "next": {"reward": torch.ones(2, 3, 1), "terminated": torch.zeros(2, 3, 1, dtype=torch.bool), "truncated": torch.zeros(2, 3, 1, dtype=torch.bool)}},
                    batch_size=[2, 3])
    buf = RolloutBuffer(3, 2, obs_shape=(1,), action_shape=(), hidden_state_shape={"h": (1, 2), "c": (1, 2)})
    buf.extend(td)
    buf.compute_returns_and_advantages(torch.zeros(2))
    batch = next(iter(buf.minibatches(num_minibatches=1, sequences=True, shuffle=False)))
    assert batch.hidden_state is not None
    assert batch.hidden_state["h"].flatten(1).tolist() == [[0.0, 1.0], [6.0, 7.0]]


# -- ReplayBuffer.sample_sequences -------------------------------------------------------------

def replay_with_steps(capacity: int, num_envs: int, steps: int, done_every: int = 0,
                      **kwargs: Any) -> ReplayBuffer:
    """Observation = env * 1000 + step; env e's episode ends every ``done_every`` steps (offset by e)."""
    buf = ReplayBuffer(capacity, obs_shape=(1,), action_shape=(), num_envs=num_envs, seed=0, **kwargs)
    envs = torch.arange(num_envs, dtype=torch.float32)
    for t in range(steps):
        done = (torch.tensor([(t + e) % done_every == done_every - 1 for e in range(num_envs)])
                if done_every else torch.zeros(num_envs, dtype=torch.bool))
        extra = {"hidden_state": {"h": (envs * 1000 + t).view(num_envs, 1, 1).expand(num_envs, 1, 2)}} \
            if "hidden_state_shape" in kwargs else {}
        buf.add((envs * 1000 + t).unsqueeze(1), torch.zeros(num_envs), torch.zeros(num_envs),
                (envs * 1000 + t + 1).unsqueeze(1), done, truncated=False, **extra)
    return buf


@settings(max_examples=30, deadline=None)
@given(capacity=st.integers(6, 40), num_envs=st.integers(1, 3), steps=st.integers(2, 30),
       span=st.integers(1, 4), done_every=st.integers(0, 5))
def test_sequences_are_consecutive_steps_of_one_env_within_what_is_stored(
        capacity: int, num_envs: int, steps: int, span: int, done_every: int) -> None:
    buf = replay_with_steps(capacity, num_envs, steps, done_every)
    if len(buf) <= (span - 1) * num_envs:  # no env has span steps stored
        longest = -(-len(buf) // num_envs)  # the env with the most stored steps: the message said len // num_envs
        assert longest < span
        with pytest.raises(BatchSizeError, match=f"holds at most {longest} consecutive steps of one env$"):
            buf.sample_sequences(4, span)
        return
    batch = buf.sample_sequences(8, span - 1, burn_in=1) if span > 1 else buf.sample_sequences(8, 1)
    obs = batch.obs[..., 0]  # type: ignore[index]
    env, step = obs // 1000, obs % 1000
    assert (env == env[:, :1]).all() and (step[:, 1:] - step[:, :-1] == 1).all()
    serial = step * num_envs + env  # rows written before this one: every row is still stored
    assert (serial >= steps * num_envs - len(buf)).all() and (step <= steps - 1).all()
    done = batch.done
    for b in range(len(batch)):
        ended = done[b].nonzero()
        first_end = int(ended[0]) if len(ended) else span
        assert batch.mask[b, :first_end + 1].all() and not batch.mask[b, first_end + 1:].any()
        assert torch.equal(batch.is_first[b, 1:], done[b, :-1])


def test_is_first_at_a_sequence_start_follows_the_previous_row() -> None:
    buf = replay_with_steps(100, 2, 10, done_every=3)
    batch = buf.sample_sequences(64, 2)
    step, env = batch.obs[:, 0, 0] % 1000, batch.obs[:, 0, 0] // 1000  # type: ignore[index]
    expected = (step == 0) | ((step - 1 + env) % 3 == 2)
    assert torch.equal(batch.is_first[:, 0], expected)


def test_sequences_carry_the_hidden_state_of_their_first_step() -> None:
    buf = replay_with_steps(50, 2, 20, hidden_state_shape={"h": (1, 2)})
    batch = buf.sample_sequences(16, 4, burn_in=3)
    assert batch.burn_in == 3 and batch.obs.shape == (16, 7, 1)
    assert batch.hidden_state is not None
    torch.testing.assert_close(batch.hidden_state["h"][:, 0, 0], batch.obs[:, 0, 0])  # type: ignore[index]
    assert buf.sample(3).hidden_state["h"].shape == (3, 1, 2)  # type: ignore[index]
    assert buf.sample(3).to_tensordict()["recurrent_state_h"].shape == (3, 1, 2)


def test_refused_sequence_calls_change_nothing() -> None:
    buf = replay_with_steps(20, 2, 5)
    state = buf.state_dict()
    for bad in ({"batch_size": 0, "length": 2}, {"batch_size": 2, "length": 0},
                {"batch_size": 2, "length": 2, "burn_in": -1}, {"batch_size": 2, "length": 9}):
        with pytest.raises(BatchSizeError):
            buf.sample_sequences(**bad)
    assert torch.equal(buf.state_dict()["rng"]["sample"], state["rng"]["sample"])


def test_env_major_extends_are_refused_and_time_major_ones_work() -> None:
    def rollout(lead: tuple[int, int]) -> TensorDict:
        return TensorDict({"observation": torch.zeros(*lead, 1), "action": torch.zeros(lead),
                           "next": {"observation": torch.zeros(*lead, 1), "reward": torch.zeros(lead),
                                    "terminated": torch.zeros(lead, dtype=torch.bool), "truncated": torch.zeros(lead, dtype=torch.bool)}}, batch_size=list(lead))
    buf = ReplayBuffer(100, obs_shape=(1,), action_shape=(), num_envs=2)
    buf.extend(rollout((5, 2)))
    assert buf.sample_sequences(2, 3).obs.shape == (2, 3, 1)
    buf.extend(rollout((2, 5)))
    with pytest.raises(ConfigError, match="env-major"):
        buf.sample_sequences(2, 3)
    buf.clear()
    buf.extend(rollout((5, 2)))
    assert len(buf.sample_sequences(2, 3)) == 2


def test_a_collector_batch_of_several_envs_in_a_one_env_buffer_is_refused_for_sequences() -> None:
    # A TorchRL habit: ReplayBuffer(...) (num_envs=1) fed a collector's [num_envs, T] batches. Sequences ran from
    # env 0's last step into env 1's first, with mask True and is_first False (helper 68).
    n, steps = 2, 5
    code = (torch.arange(n).view(n, 1) * 100 + torch.arange(steps)).float()   # env * 100 + t, [N, T]

    def batch(lead: tuple[int, ...]) -> TensorDict:
        flags = torch.zeros(*lead, 1, dtype=torch.bool)
        return TensorDict({"observation": code.reshape(*lead, 1), "action": torch.zeros(lead),
                           "next": {"observation": code.reshape(*lead, 1) + 1, "reward": torch.zeros(*lead, 1),
                                    "terminated": flags, "truncated": flags}}, batch_size=list(lead))
    buf = ReplayBuffer(100, obs_shape=(1,), action_shape=(), seed=0)
    buf.extend(batch((n, steps)))
    assert len(buf.sample(4)) == 4   # transitions are fine
    rng = buf.state_dict()["rng"]["sample"]
    with pytest.raises(ConfigError, match=r"num_envs=1.*several envs"):
        buf.sample_sequences(4, 3)
    assert torch.equal(buf.state_dict()["rng"]["sample"], rng)
    buf.clear()
    for lead in ((n * steps,), (1, n * steps), (n * steps, 1)):   # one env's steps, however shaped
        buf.extend(batch(lead))
        assert len(buf.sample_sequences(2, 3)) == 2


def test_an_add_that_leaves_envs_out_stops_sequences_until_clear() -> None:
    buf = replay_with_steps(40, 2, 4)
    step = (torch.zeros(2, 1), torch.zeros(2), torch.zeros(2), torch.zeros(2, 1), torch.zeros(2, dtype=torch.bool), False)
    buf.add(*step, env_mask=torch.tensor([True, True]))  # every env: rows stay interleaved
    assert len(buf.sample_sequences(2, 3)) == 2
    buf.add(*step, env_mask=torch.tensor([False, True]))  # one row: env 1's steps no longer 2 rows apart
    with pytest.raises(ConfigError, match="env_mask that left envs out"):
        buf.sample_sequences(2, 3)
    buf.clear()
    buf.add(*step)
    assert len(buf.sample_sequences(2, 1)) == 2


def test_sequence_sampling_resumes_exactly_after_a_checkpoint(tmp_path: Any) -> None:
    buf = replay_with_steps(30, 3, 25, done_every=4)
    buf.sample_sequences(4, 2)
    buf.save(tmp_path / "ckpt")
    restored = ReplayBuffer.load(tmp_path / "ckpt")
    mine, theirs = buf.sample_sequences(8, 3, burn_in=1), restored.sample_sequences(8, 3, burn_in=1)
    assert torch.equal(mine.index, theirs.index) and torch.equal(mine.mask, theirs.mask)
    assert torch.equal(mine.is_first, theirs.is_first)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("storing_device", ["cpu", "cuda"])
def test_dict_observations_hidden_states_and_sequences_on_cuda(storing_device: str) -> None:
    data = rollout_data()
    reference = filled_buffer(data)
    buf = filled_buffer(data, storing_device=storing_device, device="cuda")
    theirs = list(reference.minibatches(num_minibatches=2, sequences=True, shuffle=False))
    mine = list(buf.minibatches(num_minibatches=2, sequences=True, shuffle=False))
    for a, b in zip(mine, theirs, strict=True):
        assert a.obs.device.type == "cuda" and a.hidden_state is not None and a.hidden_state.device.type == "cuda"
        assert bool((a.obs.cpu() == b.obs).all()) and torch.equal(a.mask.cpu(), b.mask)
        assert bool((a.hidden_state.cpu() == b.hidden_state).all())  # type: ignore[union-attr]
    assert sorted(sequence_order(buf.minibatches(batch_size=3, sequences=True))) == sorted(sequence_order(theirs))
    replay = replay_with_steps(40, 2, 12, done_every=3, storing_device=storing_device, device="cuda",
                               hidden_state_shape={"h": (1, 2)})
    sequences = replay.sample_sequences(8, 3, burn_in=1)
    step = sequences.obs[..., 0].cpu() % 1000  # type: ignore[index]
    assert sequences.mask.device.type == "cuda" and bool((step[:, 1:] - step[:, :-1] == 1).all())
    assert sequences.hidden_state is not None
    torch.testing.assert_close(sequences.hidden_state["h"][:, 0, 0].cpu(), sequences.obs[:, 0, 0].cpu())  # type: ignore[index]


def test_sequence_batches_drive_torchrl_lstm_modules_in_recurrent_mode() -> None:
    """``to_tensordict()`` of both sequence batches is what TorchRL's ``LSTMModule`` reads: the
    stored state at the first step, a zero state where an episode starts inside a sequence."""
    from torchrl.modules import LSTMModule, set_recurrent_mode

    torch.manual_seed(0)
    module = LSTMModule(input_size=5, hidden_size=H, num_layers=LAYERS, in_key=("observation", "proprio"),
                        out_key="features")
    lstm = torch.nn.LSTM(5, H, num_layers=LAYERS, batch_first=True)
    lstm.load_state_dict(module.lstm.state_dict())

    def reference(x: torch.Tensor, h: torch.Tensor, c: torch.Tensor, reset: torch.Tensor) -> torch.Tensor:
        state, outputs = (h.transpose(0, 1).contiguous(), c.transpose(0, 1).contiguous()), []
        for s in range(x.shape[1]):
            keep = (~reset[:, s] | (s == 0)).view(1, -1, 1)  # from the stored state, zeros at episode starts
            out, state = lstm(x[:, s:s + 1], (state[0] * keep, state[1] * keep))
            outputs.append(out)
        return torch.cat(outputs, dim=1)

    batch = next(iter(filled_buffer(rollout_data()).minibatches(num_minibatches=1, sequences=True)))
    td = batch.to_tensordict()
    assert batch.hidden_state is not None and td["recurrent_state_h"].shape == (len(batch), td.shape[1], LAYERS, H)
    assert not td["recurrent_state_h"][:, 1:].any()
    replay = ReplayBuffer(64, obs_shape={"proprio": (5,)}, action_shape=(), num_envs=2, seed=0,
                          hidden_state_shape={"h": (LAYERS, H), "c": (LAYERS, H)})
    for t in range(20):
        replay.add({"proprio": torch.randn(2, 5)}, torch.zeros(2), torch.ones(2), {"proprio": torch.randn(2, 5)},
                   torch.tensor([t % 4 == 3, t % 5 == 4]),
                   hidden_state={"h": torch.randn(2, LAYERS, H), "c": torch.randn(2, LAYERS, H)}, truncated=False)
    sequences = replay.sample_sequences(6, 5, burn_in=2)
    replay_td = sequences.to_tensordict()
    assert bool(sequences.is_first[:, 1:].any()) and replay_td["next", "done"].shape == (6, 7, 1)
    with torch.no_grad(), set_recurrent_mode(True):
        for data, hidden, reset in ((td, batch.hidden_state, torch.zeros_like(td["mask"])),
                                    (replay_td, sequences.hidden_state, sequences.is_first)):
            assert hidden is not None
            expected = reference(data["observation", "proprio"], hidden["h"], hidden["c"], reset)
            valid = data["mask"] if data is td else torch.ones_like(data["mask"])  # replay: across episodes too
            torch.testing.assert_close(module(data.clone())["features"][valid], expected[valid])
