"""RolloutBuffer: filling, GAE semantics, minibatches, extras, extend from TorchRL, bad input."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from _snapshot import same, snapshot
from tensordict import TensorDict

from rlbuf import (
    BatchSizeError,
    BufferFullError,
    CheckpointError,
    ConfigError,
    DistillationBuffer,
    DtypeError,
    EpisodeStats,
    MissingFieldError,
    NonFiniteError,
    ReplayBuffer,
    RolloutBuffer,
    RolloutIncompleteError,
    ShapeError,
)
from rlbuf._row_sinks import RowCopies
from rlbuf._row_sinks import snapshot as take_snapshot

T, N = 5, 3


def make(storage: str = "memory", **kwargs: Any) -> RolloutBuffer:
    kwargs.setdefault("obs_shape", (2,))
    kwargs.setdefault("action_shape", ())
    kwargs.setdefault("seed", 0)
    return RolloutBuffer(kwargs.pop("num_steps", T), kwargs.pop("num_envs", N), storage=storage, **kwargs)  # type: ignore[arg-type]


def step_data(t: int, n: int = N) -> dict[str, Any]:
    ids = torch.arange(n, dtype=torch.float32) + 100 * t
    return {
        "obs": ids[:, None].expand(n, 2).clone(), "action": ids.clone(), "reward": ids / 100,
        "terminated": torch.tensor([t == 2] + [False] * (n - 1)), "value": torch.full((n,), 0.5),
        "log_prob": -ids / 1000, "truncated": torch.tensor([False] * (n - 1) + [t == 3]),
        "bootstrap_value": torch.full((n,), 2.0),
    }


def fill(buf: RolloutBuffer) -> None:
    for t in range(buf.num_steps):
        buf.add(**step_data(t, buf.num_envs))


def reference_gae(reward: torch.Tensor, value: torch.Tensor, terminated: torch.Tensor, truncated: torch.Tensor,
                  bootstrap: torch.Tensor, last_value: torch.Tensor, gamma: float, lam: float) -> torch.Tensor:
    steps = reward.shape[0]
    advantage = torch.zeros_like(reward, dtype=torch.float64)
    running = torch.zeros(reward.shape[1], dtype=torch.float64)
    for t in reversed(range(steps)):
        next_value = last_value if t == steps - 1 else value[t + 1]
        next_value = torch.where(truncated[t], bootstrap[t], next_value).double()
        delta = reward[t] + gamma * next_value * (~terminated[t]) - value[t]
        running = delta + gamma * lam * (~(terminated[t] | truncated[t])) * running
        advantage[t] = running
    return advantage.float()


def test_step_wise_adds_fill_a_time_major_layout(storage: str) -> None:
    buf = make(storage)
    assert len(buf) == 0 and buf.steps == 0 and not buf.is_full
    fill(buf)
    assert buf.steps == T and buf.is_full and buf.size == len(buf) == buf.capacity == T * N
    assert buf.view("obs").shape == (T, N, 2)
    assert buf.view("action")[:, 1].tolist() == [100.0 * t + 1 for t in range(T)]
    with pytest.raises(BufferFullError, match="already holds 5 steps"):
        buf.add(**step_data(0))
    buf.clear()
    assert len(buf) == 0 and buf.steps == 0
    buf.add(**step_data(7))
    assert buf.view("action")[0, 0] == 700


def test_gae_bootstraps_timeouts_and_not_terminations(storage: str) -> None:
    buf = make(storage)
    fill(buf)
    last_value = torch.tensor([1.0, -1.0, 3.0])
    buf.compute_returns_and_advantages(last_value, gamma=0.9, gae_lambda=0.8)
    expected = reference_gae(buf.view("reward"), buf.view("value"), buf.view("terminated"), buf.view("truncated"),
                             buf.view("bootstrap_value"), last_value, 0.9, 0.8)
    assert torch.allclose(buf.view("advantage"), expected, atol=1e-6)
    assert torch.allclose(buf.view("returns"), expected + buf.view("value"), atol=1e-6)
    # env 2 is truncated at t=3: its delta uses the bootstrap value 2.0, and the trace stops there
    r, v = buf.view("reward")[3, 2], 0.5
    assert torch.isclose(buf.view("advantage")[3, 2], r + 0.9 * 2.0 - v)
    # env 0 terminates at t=2: no bootstrap at all
    assert torch.isclose(buf.view("advantage")[2, 0], buf.view("reward")[2, 0] - v)


def test_normalized_advantages_have_zero_mean_unit_std() -> None:
    buf = make()
    fill(buf)
    buf.compute_returns_and_advantages(torch.zeros(N), normalize_advantages=True)
    advantage = buf.get_all_data().advantage
    assert abs(float(advantage.mean())) < 1e-5 and abs(float(advantage.std()) - 1) < 1e-4


def test_get_all_data_flattens_step_major(storage: str) -> None:
    buf = make(storage)
    fill(buf)
    buf.compute_returns_and_advantages(torch.zeros(N))
    data = buf.get_all_data()
    assert data.obs.shape == (T * N, 2) and data.returns.shape == (T * N,)
    assert data.action.tolist() == [100.0 * t + n for t in range(T) for n in range(N)]
    assert data.privileged_obs is None


@pytest.mark.parametrize("n_epochs", [1, 3])
def test_minibatches_cover_every_row_once_per_epoch(storage: str, device: str, n_epochs: int) -> None:
    buf = make(storage, device=device)
    fill(buf)
    buf.compute_returns_and_advantages(torch.zeros(N))
    batches = list(buf.minibatches(batch_size=4, n_epochs=n_epochs))
    per_epoch = buf.num_batches(4)
    assert per_epoch == 4 and len(batches) == per_epoch * n_epochs
    for epoch in range(n_epochs):
        actions = torch.cat([b.action for b in batches[epoch * per_epoch:(epoch + 1) * per_epoch]])
        assert sorted(actions.tolist()) == sorted(buf.get_all_data().action.tolist())
    first = batches[0]
    assert first.obs.device.type == device
    # fields of a row stay together after shuffling
    assert torch.equal(first.obs[:, 0], first.action) and torch.allclose(first.log_prob, -first.action / 1000)


def test_minibatches_by_count_and_their_length() -> None:
    buf = make()
    fill(buf)
    buf.compute_returns_and_advantages(torch.zeros(N))
    it = buf.minibatches(num_minibatches=4, n_epochs=2)
    assert len(it) == 8
    sizes = [len(b) for b in it]
    assert sum(sizes) == 2 * T * N and max(sizes) - min(sizes) <= 1


def test_sample_by_index_epochs_and_sample_all_work_on_rollouts(storage: str) -> None:
    buf = make(storage)
    fill(buf)
    buf.compute_returns_and_advantages(torch.zeros(N))
    assert buf.sample_by_index([4]).action.tolist() == [101.0]
    assert buf.sample_all().action.tolist() == buf.get_all_data().action.tolist()
    assert sorted(torch.cat([b.action for b in buf.epochs(batch_size=4)]).tolist()) == sorted(buf.get_all_data().action.tolist())


def test_identical_seeds_shuffle_identically() -> None:
    a, b = make(seed=5), make(seed=5)
    for buf in (a, b):
        fill(buf)
        buf.compute_returns_and_advantages(torch.zeros(N))
    assert all(torch.equal(x.action, y.action) for x, y in zip(a.minibatches(batch_size=4, n_epochs=2), b.minibatches(batch_size=4, n_epochs=2), strict=True))


def test_extend_from_a_collector_layout_equals_step_wise_adds() -> None:
    step_wise = make()
    fill(step_wise)
    steps = [step_data(t) for t in range(T)]

    def stack(name: str) -> torch.Tensor:
        return torch.stack([s[name] for s in steps], dim=1)   # [N, T, ...]: time last

    td = TensorDict({
        "observation": stack("obs"), "action": stack("action"), "state_value": stack("value")[..., None],
        "action_log_prob": stack("log_prob"),
        "next": {"reward": stack("reward")[..., None], "terminated": stack("terminated")[..., None],
                 "truncated": stack("truncated")[..., None], "state_value": stack("bootstrap_value")[..., None]},
    }, batch_size=[N, T])
    extended = make()
    extended.extend(td)
    for name in ("obs", "action", "reward", "terminated", "truncated", "value", "log_prob", "bootstrap_value"):
        assert torch.equal(extended.view(name), step_wise.view(name)), name
    with pytest.raises(BufferFullError):
        extended.extend(td)


def test_extend_keeps_advantages_written_by_a_transform() -> None:
    td = TensorDict({
        "observation": torch.zeros(N, T, 2), "action": torch.zeros(N, T), "state_value": torch.zeros(N, T, 1),
        "sample_log_prob": torch.zeros(N, T), "advantage": torch.arange(N * T, dtype=torch.float32).reshape(N, T, 1),
        "value_target": torch.ones(N, T, 1),
        "next": {"reward": torch.zeros(N, T, 1), "terminated": torch.zeros(N, T, 1, dtype=torch.bool), "truncated": torch.zeros(N, T, 1, dtype=torch.bool)},
    }, batch_size=[N, T])
    buf = make()
    buf.extend(td)
    assert buf.advantages_ready
    assert torch.equal(buf.view("advantage"), td["advantage"].squeeze(-1).T)



@pytest.mark.parametrize("full", [False, True])
def test_extend_of_an_empty_collector_batch_stores_nothing(full: bool) -> None:
    # A [num_envs, 0] batch raised torch's bare RuntimeError (a view of 0 rows as [0, -1]); ReplayBuffer took it.
    td = TensorDict({
        "observation": torch.zeros(N, 0, 2), "action": torch.zeros(N, 0), "state_value": torch.zeros(N, 0, 1),
        "sample_log_prob": torch.zeros(N, 0),
        "next": {"reward": torch.zeros(N, 0, 1), "terminated": torch.zeros(N, 0, 1, dtype=torch.bool),
                 "truncated": torch.zeros(N, 0, 1, dtype=torch.bool)},
    }, batch_size=[N, 0])
    buf = make()
    if full:
        fill(buf)
        buf.compute_returns_and_advantages(torch.zeros(N))
    before = snapshot(buf)
    buf.extend(td)
    assert same(before, snapshot(buf))
    assert buf.advantages_ready == full and buf.check_valid() == (True, "")


def test_extend_of_a_rollout_with_neither_truncated_nor_done_is_refused() -> None:
    td = TensorDict({
        "observation": torch.zeros(N, T, 2), "action": torch.zeros(N, T), "state_value": torch.zeros(N, T, 1),
        "sample_log_prob": torch.zeros(N, T),
        "next": {"reward": torch.zeros(N, T, 1), "terminated": torch.zeros(N, T, 1, dtype=torch.bool)},
    }, batch_size=[N, T])
    buf = make()
    with pytest.raises(MissingFieldError, match=r"truncated: the tensordict has no \('next', 'truncated'\)"):
        buf.extend(td)  # its time limits would bootstrap as nothing
    assert buf.steps == 0
    td["next", "done"] = torch.zeros(N, T, 1, dtype=torch.bool)
    td["next", "done"][1, 2] = True
    td["next", "state_value"] = torch.zeros(N, T, 1)
    buf.extend(td)
    assert buf.view("truncated")[2].tolist() == [False, True, False][:N]


def test_extend_of_a_rollout_whose_done_marks_an_end_its_flags_do_not_is_refused() -> None:
    # GAE's trace ran across an end that only ("next", "done") marked (helper 42).
    td = TensorDict({
        "observation": torch.zeros(N, T, 2), "action": torch.zeros(N, T), "state_value": torch.zeros(N, T, 1),
        "sample_log_prob": torch.zeros(N, T),
        "next": {"reward": torch.zeros(N, T, 1), "terminated": torch.zeros(N, T, 1, dtype=torch.bool),
                 "truncated": torch.zeros(N, T, 1, dtype=torch.bool), "done": torch.zeros(N, T, 1, dtype=torch.bool)},
    }, batch_size=[N, T])
    td["next", "done"][2, 1] = True
    buf = make()
    with pytest.raises(ConfigError, match=r"^done: key \('next', 'done'\) is True at batch index \(2, 1\), where"):
        buf.extend(td)
    assert buf.steps == 0
    td["collector", "mask"] = torch.ones(N, T, dtype=torch.bool)
    td["collector", "mask"][0, -1] = False
    td["next", "done"][2, 1] = False
    with pytest.raises(ShapeError, match=r"^td: \('collector', 'mask'\) marks 1 of 15 rows as padding"):
        buf.extend(td)
    assert buf.steps == 0


def test_set_extras_attaches_aligned_tensors_and_overrides_fields() -> None:
    buf = make()
    fill(buf)
    with pytest.raises(RolloutIncompleteError):
        buf.get_all_data()
    custom = torch.arange(T * N, dtype=torch.float32).reshape(T, N)
    buf.set_extras({"advantage": custom, "returns": custom, "old_mu": torch.zeros(T, N, 4)})
    batch = next(iter(buf.minibatches(batch_size=T * N, shuffle=False)))
    assert batch.advantage.tolist() == custom.flatten().tolist()
    assert batch.old_mu.shape == (T * N, 4) and batch.extras["old_mu"].shape == (T * N, 4)
    with pytest.raises(ShapeError, match=r"old_mu: expected shape \(5, 3, ...\), got \(3, 5\)"):
        buf.set_extras({"old_mu": torch.zeros(N, T)})
    with pytest.raises(ShapeError, match=r"advantage: expected shape \(5, 3\), got \(5, 3, 1\)"):
        buf.set_extras({"advantage": torch.zeros(T, N, 1), "returns": torch.zeros(T, N)})
    with pytest.raises(MissingFieldError, match="advantage and returns go together"):
        buf.set_extras({"advantage": custom})
    with pytest.raises(MissingFieldError, match="terminated: a stored step field"):
        buf.set_extras({"terminated": torch.zeros(T, N, dtype=torch.bool)})


def test_set_extras_keeps_a_copy_of_the_callers_tensor() -> None:
    buf = make()
    fill(buf)
    base = torch.arange(T * N, dtype=torch.float32).view(T, N, 1)
    buf.set_extras({"old_mu": base.expand(T, N, 2)})  # an expanded view: one value per step and env
    base.mul_(-1)  # the caller reuses its tensor
    old_mu = buf.sample_by_index(torch.arange(T * N)).extras["old_mu"]
    assert old_mu.tolist() == [[float(i)] * 2 for i in range(T * N)]


def test_privileged_obs_and_extra_fields_are_stored_per_step() -> None:
    buf = make(privileged_obs_shape=(6,), extra_fields={"mask": ((), torch.bool)})
    for t in range(T):
        buf.add(**step_data(t), privileged_obs=torch.full((N, 6), float(t)), mask=torch.ones(N, dtype=torch.bool))
    buf.compute_returns_and_advantages(torch.zeros(N))
    data = buf.get_all_data()
    assert data.privileged_obs is not None and data.privileged_obs[-1].tolist() == [4.0] * 6
    assert data.mask.all()
    with pytest.raises(MissingFieldError, match="privileged_obs"):
        make(privileged_obs_shape=(6,)).add(**step_data(0), mask=None)


def test_uint8_observations_and_integer_actions() -> None:
    buf = make(obs_shape=(8, 8), obs_dtype=torch.uint8, action_dtype=torch.int64)
    frame = np.full((N, 8, 8), 255, np.uint8)
    for _ in range(T):
        buf.add(frame, np.arange(N), np.ones(N, np.float32), np.zeros(N, bool), np.zeros(N, np.float32), np.zeros(N, np.float32), truncated=False)
    assert buf.view("obs").dtype == torch.uint8 and int(buf.view("obs").max()) == 255
    assert buf.view("action").dtype == torch.int64


def test_stats_are_fed_by_adds() -> None:
    stats = EpisodeStats(N)
    buf = make(stats=stats)
    fill(buf)
    summary = stats.summary()
    assert summary["episodes"] == 2      # env 0 terminated at t=2, env 2 truncated at t=3
    assert summary["reasons"] == {"terminated": 1, "truncated": 1}


def before(buf: RolloutBuffer) -> tuple[int, torch.Tensor]:
    """The filled steps only: the rest of a preallocated rollout is uninitialised memory."""
    return buf.steps, buf.view("obs")[:buf.steps].clone()


@pytest.mark.parametrize(("change", "error", "message"), [
    ({"obs": torch.zeros(N, 3)}, ShapeError, "obs: expected shape (3, 2), got (3, 3)"),
    ({"reward": torch.zeros(N, 1)}, ShapeError, "reward: expected shape (3,), got (3, 1)"),
    ({"value": torch.tensor([0.0, float("nan"), 0.0])}, NonFiniteError, "value: expected finite values"),
    ({"reward": torch.tensor([0.0, float("inf"), 0.0])}, NonFiniteError, "reward"),
    ({"terminated": torch.zeros(N)}, DtypeError, "terminated: expected dtype torch.bool"),
    ({"bootstrap_value": None}, MissingFieldError, "bootstrap_value: required"),
])
def test_bad_step_changes_nothing(change: dict[str, Any], error: type[Exception], message: str) -> None:
    buf = make()
    buf.add(**step_data(0))
    state = before(buf)
    data = step_data(3)            # env 2 truncated at this step
    data.update(change)
    with pytest.raises(error) as raised:
        buf.add(**data)
    assert message in str(raised.value)
    after = before(buf)
    assert after[0] == state[0] and torch.equal(after[1], state[1])


def test_advantages_and_minibatches_need_a_full_rollout() -> None:
    buf = make()
    buf.add(**step_data(0))
    with pytest.raises(RolloutIncompleteError, match="holds 1 of 5 steps"):
        buf.compute_returns_and_advantages(torch.zeros(N))
    with pytest.raises(RolloutIncompleteError):
        buf.minibatches(batch_size=2)
    for t in range(1, T):
        buf.add(**step_data(t))
    with pytest.raises(ShapeError, match=r"last_value: expected shape \(3,\), got \(3, 1\)"):
        buf.compute_returns_and_advantages(torch.zeros(N, 1))
    with pytest.raises(NonFiniteError, match="last_value: expected finite values"):
        buf.compute_returns_and_advantages(torch.tensor([0.0, float("nan"), 0.0]))
    with pytest.raises(DtypeError, match=r"last_value: values up to 1e\+300 in magnitude do not fit torch.float32"):
        buf.compute_returns_and_advantages(torch.tensor([0.0, 1e300, 0.0], dtype=torch.float64))
    assert not buf.advantages_ready
    buf.compute_returns_and_advantages(torch.zeros(N))
    for bad in (0, -1, T * N + 1):
        with pytest.raises(BatchSizeError):
            buf.minibatches(batch_size=bad)


def test_extend_validates_precomputed_advantages_before_storing_anything() -> None:
    td = TensorDict({
        "observation": torch.zeros(N, T, 2), "action": torch.zeros(N, T), "state_value": torch.zeros(N, T, 1),
        "sample_log_prob": torch.zeros(N, T), "advantage": torch.full((N, T, 1), float("nan")),
        "value_target": torch.ones(N, T, 1),
        "next": {"reward": torch.zeros(N, T, 1), "terminated": torch.zeros(N, T, 1, dtype=torch.bool), "truncated": torch.zeros(N, T, 1, dtype=torch.bool)},
    }, batch_size=[N, T])
    buf = make()
    with pytest.raises(NonFiniteError, match="advantage"):
        buf.extend(td)
    td["advantage"] = torch.zeros(N, T, 2)
    with pytest.raises(ShapeError, match="advantage"):
        buf.extend(td)
    assert buf.steps == 0


def test_a_bool_reward_is_refused_before_the_stats_see_it() -> None:
    stats = EpisodeStats(1)
    buf = make(num_envs=1, stats=stats)
    with pytest.raises(DtypeError, match="reward: expected a number, got the bool True"):
        buf.add(torch.zeros(2), 0.0, True, False, 0.0, 0.0, truncated=False)
    assert buf.steps == 0 and stats.summary()["episodes"] == 0


@pytest.mark.parametrize(("options", "named"), [
    ({"n_steps": 4}, "n_steps: .*num_steps"), ({"n_envs": 2}, "n_envs: .*num_envs"),
    ({"gamma": 0.99}, "gamma: .*compute_returns_and_advantages"), ({"bogus": 1}, "bogus: not an option of RolloutBuffer"),
])
def test_foreign_constructor_keywords_get_the_rlbuf_name(options: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        RolloutBuffer(4, 2, obs_shape=(3,), action_shape=(), **options)


def test_an_add_without_terminated_names_it_and_done_gets_the_rlbuf_names() -> None:
    buf = RolloutBuffer(2, 2, obs_shape=(3,), action_shape=())
    zeros = torch.zeros(2)
    with pytest.raises(MissingFieldError, match=r"done: .*terminated= and truncated="):
        buf.add(torch.zeros(2, 3), zeros, zeros, value=zeros, log_prob=zeros, done=torch.zeros(2, dtype=torch.bool), truncated=False)
    with pytest.raises(MissingFieldError, match=r"^terminated: required"):
        buf.add(torch.zeros(2, 3), zeros, zeros, value=zeros, log_prob=zeros, truncated=False)
    assert buf.steps == 0


def _filled_rollout() -> RolloutBuffer:
    buf = RolloutBuffer(3, 2, obs_shape=(1,), action_shape=(), seed=0)
    for t in range(3):
        buf.add(torch.full((2, 1), float(t)), torch.zeros(2), torch.ones(2), torch.tensor([False, t == 1]),
                torch.zeros(2), torch.zeros(2), truncated=False)
    return buf


class _WritesDuringTheCopy:
    """A snapshot's sink whose copy runs ``write`` right after it, as another thread could."""

    def __init__(self, write: Any) -> None:
        self.inner, self.write = RowCopies(), write

    def copy(self, leaves: Any, size: int) -> None:
        self.inner.copy(leaves, size)
        self.write()

    def patch(self, leaves: Any, segments: Any, size: int) -> Any:
        return self.inner.patch(leaves, segments, size)


@pytest.mark.parametrize("how", ["compute", "set_extras"])
def test_a_snapshot_taken_while_advantages_are_written_holds_the_new_ones_not_a_mix(how: str) -> None:
    """Advantages and returns are rewritten in place without a write count: the generation bump makes a
    snapshot in progress copy every row again (it used to keep the advantages of before)."""
    buf = _filled_rollout()
    buf.compute_returns_and_advantages(torch.zeros(2), gamma=0.5)
    ring = buf._ring

    def write() -> None:
        if how == "compute":
            buf.compute_returns_and_advantages(torch.full((2,), 10.0), gamma=0.9)
        else:
            buf.set_extras({"advantage": torch.full((3, 2), 7.0), "returns": torch.full((3, 2), 8.0)})

    generation = ring.generation
    snapshot = take_snapshot(ring, _WritesDuringTheCopy(write), lambda: None)
    assert ring.generation > generation
    for name in ("advantage", "returns"):
        assert torch.equal(snapshot.rows[name], ring.leaves[name]), name


@pytest.mark.parametrize("make", [
    lambda: _filled_rollout(),
    lambda: ReplayBuffer(4, obs_shape=(1,), action_shape=()),
    lambda: DistillationBuffer(4, obs_shape=(1,), action_shape=()),
])
def test_extend_with_a_plain_dict_says_how_to_wrap_it(make: Any) -> None:
    buf = make()
    with pytest.raises(ShapeError, match=r"td: expected a TensorDict with a batch size, got dict; wrap it: "
                                         r"TensorDict\(d, batch_size=\[n\]\)"):
        buf.extend({"observation": torch.zeros(2, 1)})


def test_save_refuses_counters_load_would_refuse_and_keeps_the_previous_checkpoint(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    buf = RolloutBuffer(2, 1, obs_shape=(1,), action_shape=(), seed=0)

    def step() -> None:
        buf.add(torch.zeros(1, 1), torch.zeros(1), torch.ones(1), torch.tensor([False]), torch.zeros(1),
                torch.zeros(1), truncated=False)

    step()
    step()
    buf.save(tmp_path / "ckpt")
    with monkeypatch.context() as patch:  # a rollout broken as a race once broke it: a third step, over step 0
        patch.setattr(RolloutBuffer, "is_full", property(lambda self: False))
        step()
    assert not buf.check_valid()[0]
    with pytest.raises(CheckpointError, match=r"write count 3 is above the capacity 2.*previous checkpoint"):
        buf.save(tmp_path / "ckpt")
    assert RolloutBuffer.load(tmp_path / "ckpt").steps == 2
    assert [entry.name for entry in tmp_path.iterdir()] == ["ckpt"]
