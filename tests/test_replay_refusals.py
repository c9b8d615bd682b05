"""ReplayBuffer: refusals that name what to do instead (foreign keywords, env masks, devices, PER exponents, sizes)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from _snapshot import same, snapshot
from tensordict import TensorDict
from test_replay import GOOD, add_ids, make

import rlbuf._buffer
from rlbuf import (
    BatchSizeError,
    ConfigError,
    DeviceError,
    DtypeError,
    EmptyBufferError,
    MissingFieldError,
    NonFiniteError,
    PriorityError,
    ReplayBuffer,
    RlbufError,
    ShapeError,
    StoredIndexError,
)


# -- the first hour: refusals that name what to do instead -----------------------------------
@pytest.mark.parametrize(("keyword", "hint"), [
    ("done", "pass terminated= and truncated= instead; done is derived"),
    ("dones", "pass terminated= and truncated= instead; done is derived"),
    ("rewards", "rlbuf's name is reward"),
    ("next_observations", "rlbuf's name is next_obs"),
    ("observations", "rlbuf's name is obs"),
    ("actions", "rlbuf's name is action"),
    ("infos", "rlbuf's add takes no infos; with gymnasium use rlbuf.gym.Recorder, which reads info\\['final_obs'\\]"),
    ("info", "rlbuf's add takes no infos; with gymnasium use rlbuf.gym.Recorder"),
    ("terminations", "pass terminated= and truncated="),
    ("truncations", "pass terminated= and truncated="),
    ("values", "rlbuf's name is value"),
    ("log_probs", "rlbuf's name is log_prob"),
    ("episode_starts", "rlbuf derives episode starts"),
])
def test_foreign_keywords_are_answered_with_the_rlbuf_name(keyword: str, hint: str) -> None:
    buf = make(num_envs=2)
    add_ids(buf, range(1))
    before = snapshot(buf)
    step = {"obs": torch.zeros(2, 3), "action": torch.zeros(2, 2), "reward": torch.zeros(2),
            "next_obs": torch.zeros(2, 3), "terminated": torch.zeros(2, dtype=torch.bool)}
    with pytest.raises(MissingFieldError, match=f"^{keyword}: not a field of this buffer; {hint}") as error:
        buf.add(**step, **{keyword: torch.zeros(2)})
    assert "extra_fields" not in str(error.value) or keyword.startswith("info")
    assert same(before, snapshot(buf))


@pytest.mark.parametrize("env_mask", ["ab", [[True], [True, False]], object(), [True, None], [1, 0], [True],
                                      torch.zeros(2, dtype=torch.bool, device="meta"), np.array([True, False, True])])
def test_a_bad_env_mask_is_refused_by_name_and_changes_nothing(env_mask: Any) -> None:
    buf = make(num_envs=2)
    add_ids(buf, range(1))
    before = snapshot(buf)
    with pytest.raises(RlbufError, match=r"^env_mask: "):
        buf.add(torch.zeros(2, 3), torch.zeros(2, 2), torch.zeros(2), torch.zeros(2, 3), torch.zeros(2, dtype=torch.bool),
                env_mask=env_mask, truncated=False)
    assert same(before, snapshot(buf))
    buf.add(torch.ones(2, 3), torch.zeros(2, 2), torch.zeros(2), torch.zeros(2, 3), torch.zeros(2, dtype=torch.bool),
            env_mask=[False, True], truncated=False)
    assert len(buf) == 3


def test_done_cannot_be_declared_either() -> None:
    with pytest.raises(ConfigError, match="'done' is reserved"):
        make(extra_fields={"done": ((), torch.bool)})


@pytest.mark.parametrize("device", ["mps", "xpu", "meta"])
def test_a_device_type_this_machine_lacks_is_refused_at_construction(device: str) -> None:
    if device != "meta" and getattr(torch, device).is_available():
        pytest.skip(f"this machine has a {device} device")
    for option in ("device", "storing_device"):
        with pytest.raises(ConfigError, match=f"^{option}: {device} was asked for, but this machine has no {device}"):
            make(**{option: device})


@pytest.mark.parametrize(("capacity", "num_envs"), [(2, 4), (3, 4)])
def test_capacity_below_num_envs_is_refused(capacity: int, num_envs: int) -> None:
    with pytest.raises(ConfigError, match=f"capacity: expected at least num_envs={num_envs} rows"):
        make(capacity=capacity, num_envs=num_envs)
    buf = make(capacity=num_envs, num_envs=num_envs)  # exactly one add fits
    add_ids(buf, range(2))
    assert buf.sample_all().reward.tolist() == [1000.0 + e for e in range(num_envs)]


@pytest.mark.parametrize("options", [{"alpha": 0.6}, {"beta": 0.4}, {"alpha": 0.6, "beta": 0.4}, {"alpha": 1.0}])
def test_per_exponents_without_prioritized_are_refused(options: dict[str, float]) -> None:
    given = ", ".join(f"{k}={v}" for k, v in options.items())
    with pytest.raises(ConfigError, match=f"^{given}: only used by prioritized replay; pass prioritized=True"):
        make(**options)
    assert make(prioritized=True, **options).prioritized


@pytest.mark.parametrize(("options", "message"), [
    ({"alpha": -0.1}, "alpha: expected a finite number >= 0, got -0.1"),
    ({"beta": float("inf")}, "beta: expected a finite number >= 0, got inf"),
    ({"alpha": 10**400}, "alpha: expected a finite number >= 0, got 1000"),
    ({"beta": True}, "beta: expected a finite number >= 0, got True"),
    ({"alpha": np.float32(0.5)}, "alpha: expected a finite number >= 0, got np.float32(0.5)"),
])
def test_bad_per_exponents_are_refused_before_any_storage_is_built(options: dict[str, Any], message: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    def no_storage(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a storage was built for a refused buffer")

    monkeypatch.setattr(rlbuf._buffer, "build_storage", no_storage)
    with pytest.raises(ConfigError) as raised:
        make(prioritized=True, **options)
    assert str(raised.value).startswith(message)


@pytest.mark.parametrize("options", [
    {"obs_shape": (3,), "action_shape": (2,)},
    {"obs_shape": (3,), "action_shape": (), "action_dtype": torch.int64, "prioritized": True},
    {"obs_shape": (3,), "action_shape": (2,), "extra_fields": {"value": ((), torch.float64)}},
    {"obs_shape": {"camera": (2, 3), "proprio": (4,)}, "obs_dtype": {"camera": torch.uint8}, "action_shape": ()},
    {"obs_shape": (3,), "action_shape": (), "hidden_state_shape": {"h": (1, 8), "c": (1, 8)}},
    {"obs_shape": (4, 6, 6), "obs_dtype": torch.uint8, "action_shape": (), "frame_stack": 4, "prioritized": True},
    {"obs_shape": (5,), "action_shape": (), "n_step": 3},
])
def test_the_repr_shows_bytes_per_transition_of_the_same_options(options: dict[str, Any]) -> None:
    from rlbuf._replay_layout import human_bytes

    expected = human_bytes(ReplayBuffer.bytes_per_transition(**options))
    assert f"bytes_per_transition~{expected}," in repr(ReplayBuffer(8, **options))


def test_per_exponents_default_to_0_6_and_0_4() -> None:
    buf = make(prioritized=True)
    assert buf.beta == 0.4 and buf.torchrl.sampler.alpha == 0.6


def test_a_uniform_buffer_saved_by_0_1_0_still_loads(tmp_path: Any) -> None:
    """rlbuf 0.1.0 recorded alpha=0.6, beta=0.4 in the options of every replay buffer."""
    from rlbuf.checkpoint import load_state, save_state

    buf = make(num_envs=2)
    add_ids(buf, range(3))
    state = buf.state_dict()
    state["options"] = {**state["options"], "alpha": 0.6, "beta": 0.4}
    save_state(state, tmp_path / "old")
    assert load_state(tmp_path / "old", kind="ReplayBuffer")["options"]["alpha"] == 0.6
    restored = ReplayBuffer.load(tmp_path / "old")
    assert not restored.prioritized
    assert restored.sample_all().reward.tolist() == buf.sample_all().reward.tolist()


def test_one_number_tensors_are_checked_like_any_input() -> None:
    buf = make(4, action_shape=())
    zeros = torch.zeros(1, 3)
    buf.add(zeros, torch.tensor([1.0]), torch.tensor([2.5], requires_grad=True), zeros, torch.tensor([True]), truncated=False)
    before = snapshot(buf)
    refusals = [
        (NonFiniteError, "reward: expected finite values, got nan at row 0", torch.tensor([float("nan")]),
         torch.tensor([False])),
        (ShapeError, r"reward: expected shape \(1,\) or \(\), got \(1, 1\)", torch.ones(1, 1), torch.tensor([False])),
        (DtypeError, "terminated", torch.ones(1), torch.tensor([1.0])),
    ]
    for error, message, reward, terminated in refusals:
        with pytest.raises(error, match=message):
            buf.add(zeros, torch.tensor([0.0]), reward, zeros, terminated, truncated=False)
        assert same(snapshot(buf), before)
    batch = buf.sample_all()
    assert batch.reward.tolist() == [2.5] and batch.action.tolist() == [1.0] and batch.terminated.tolist() == [True]


@pytest.mark.parametrize(("options", "named"), [
    ({"buffer_size": 10}, "buffer_size: .*capacity"), ({"handle_timeout_termination": True}, "truncated="),
    ({"optimize_memory_usage": True}, r"compact=True .*pass frame_stack=k"),
    ({"bogus": 1}, "bogus: not an option of ReplayBuffer"),
])
def test_foreign_replay_options_get_the_rlbuf_name(options: dict[str, Any], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        ReplayBuffer(obs_shape=(3,), action_shape=(), **options)


def test_an_sb3_constructor_ported_whole_is_answered_for_every_foreign_option_at_once() -> None:
    with pytest.raises(ConfigError, match=r"^buffer_size: .*capacity; also n_envs: .*num_envs; also "
                                          r"optimize_memory_usage: .*frame_stack=k.*; also handle_timeout_termination: "
                                          r"not an option of ReplayBuffer; always on in rlbuf"):
        ReplayBuffer(buffer_size=10, obs_shape=(3,), action_shape=(), n_envs=2, optimize_memory_usage=True,
                     handle_timeout_termination=True)


def test_the_state_sent_to_a_worker_carries_none_of_the_learners_own_attributes(monkeypatch: pytest.MonkeyPatch) -> None:
    import rlbuf._torchrl

    buf = make(num_envs=2)
    add_ids(buf, range(3))
    rb = buf.torchrl
    monkeypatch.setattr(rlbuf._torchrl, "get_spawning_popen", lambda: object())  # as while a worker is spawned
    strategy = torch.multiprocessing.get_sharing_strategy()  # type: ignore[no-untyped-call]
    torch.multiprocessing.set_sharing_strategy("file_system")  # type: ignore[no-untyped-call]  # as rlbuf sets it
    try:
        for _ in range(2):  # the second send finds the files of the first already kept
            state = rb.__getstate__()
            assert not {"_flush_owner", "_rlbuf_shared_files", "_rlbuf_unlink_shared_files"} & set(state)
    finally:
        torch.multiprocessing.set_sharing_strategy(strategy)  # type: ignore[no-untyped-call]
    assert "_rlbuf_unlink_shared_files" in vars(rb)  # the learner still unlinks the files when collected
    assert buf.sample_all().reward.tolist() == [1000.0 * t + e for t in range(3) for e in range(2)]


# -- bad input leaves everything unchanged ------------------------------------------------
@pytest.mark.parametrize(("change", "error", "message"), [
    ({"obs": torch.zeros(4)}, ShapeError, "obs: expected shape (1, 3) or (3,), got (4,)"),
    ({"obs": torch.zeros(2, 3)}, ShapeError, "obs: expected shape (1, 3) or (3,), got (2, 3)"),
    ({"reward": torch.zeros(1, 1)}, ShapeError, "reward: expected shape (1,) or (), got (1, 1)"),
    ({"truncated": np.zeros((1, 1), bool)}, ShapeError, "truncated:"),
    ({"terminated": torch.tensor([0.5])}, DtypeError, "terminated: expected dtype torch.bool"),
    ({"obs": torch.zeros(3, dtype=torch.float64), "action": torch.zeros(2, dtype=torch.complex64)}, DtypeError, "action"),
    ({"reward": float("nan")}, NonFiniteError, "reward: expected finite values, got nan"),
    ({"reward": np.array([np.inf])}, NonFiniteError, "reward: expected finite values, got inf"),
    ({"obs": torch.zeros(3, device="meta")}, DeviceError, "obs: expected a tensor on cpu, got one on meta"),
    ({"next_obs": "abc"}, ShapeError, "next_obs: expected a tensor, numpy array or number, got str"),
    ({"terminated": None}, MissingFieldError, "terminated: a value is required"),
])
def test_bad_add_raises_a_specific_error_and_changes_nothing(
    storage: str, change: dict[str, Any], error: type[Exception], message: str
) -> None:
    buf = make(capacity=4, storage=storage)
    add_ids(buf, range(6))           # wrapped around: cursor in the middle
    buf.add(**GOOD)                  # one staged row
    before = snapshot(buf)
    with pytest.raises(error) as raised:
        buf.add(**{**GOOD, **change})
    assert message in str(raised.value)
    assert same(snapshot(buf), before)


def test_bad_input_on_the_direct_write_path_changes_nothing() -> None:
    buf = make(capacity=300, num_envs=300)
    add_ids(buf, range(1))
    before = snapshot(buf)
    bad = {name: torch.zeros(300, *shape) for name, shape in (("obs", (3,)), ("action", (2,)), ("next_obs", (3,)))}
    with pytest.raises(NonFiniteError):
        buf.add(bad["obs"], bad["action"], torch.full((300,), float("nan")), bad["next_obs"],
                torch.zeros(300, dtype=torch.bool), truncated=False)
    with pytest.raises(ShapeError, match=r"terminated: expected shape \(300,\), got \(299,\)"):
        buf.add(bad["obs"], bad["action"], torch.zeros(300), bad["next_obs"], torch.zeros(299, dtype=torch.bool), truncated=False)
    assert same(snapshot(buf), before)


def test_extras_must_be_declared_and_given() -> None:
    buf = make(extra_fields={"cost": ((), torch.float32)})
    with pytest.raises(MissingFieldError, match="cost: missing"):
        buf.add(**GOOD)
    with pytest.raises(MissingFieldError, match="bonus: not a field"):
        buf.add(**GOOD, cost=1.0, bonus=2.0)
    buf.add(**GOOD, cost=0.5)
    assert buf.sample_all().cost.tolist() == [0.5]


def _four_rows(reward: torch.Tensor, **flags: torch.Tensor) -> TensorDict:
    """Four rows for ``make()``'s buffer with ``reward`` and each of ``flags`` at ``("next", name)``."""
    return TensorDict({"observation": torch.zeros(4, 3), "action": torch.zeros(4, 2),
                       ("next", "observation"): torch.zeros(4, 3), ("next", "reward"): reward,
                       **{("next", name): value for name, value in flags.items()}}, batch_size=[4])


def test_bad_extend_raises_before_writing() -> None:
    buf = make()
    add_ids(buf, range(2))
    before = snapshot(buf)
    td = _four_rows(torch.zeros(4, 2), terminated=torch.zeros(4, 1, dtype=torch.bool),
                    truncated=torch.zeros(4, 1, dtype=torch.bool))
    with pytest.raises(ShapeError, match=r"reward: expected shape \(4, 1\) at key \('next', 'reward'\), got \(4, 2\)"):
        buf.extend(td)
    with pytest.raises(MissingFieldError, match="action"):
        buf.extend(td.exclude("action"))
    td["next", "reward"] = torch.full((4,), float("nan"))          # [B] is accepted as well as [B, 1]
    with pytest.raises(NonFiniteError):
        buf.extend(td)
    assert same(snapshot(buf), before)


def test_an_extend_with_neither_truncated_nor_done_is_refused_and_done_derives_it() -> None:
    buf = make()
    add_ids(buf, range(2))
    before = snapshot(buf)
    td = _four_rows(torch.zeros(4, 1), terminated=torch.tensor([False, True, False, False]))
    with pytest.raises(MissingFieldError, match=r"truncated: the tensordict has no \('next', 'truncated'\) and no "
                                                r"\('next', 'done'\).*add \('next', 'truncated'\)"):
        buf.extend(td)  # its time limits would be stored as no end
    assert same(snapshot(buf), before)
    td["next", "done"] = torch.tensor([False, True, True, False])
    buf.extend(td)
    stored = buf.sample_all()
    assert stored.truncated[-4:].tolist() == [False, False, True, False]
    assert stored.terminated[-4:].tolist() == [False, True, False, False]


@pytest.mark.parametrize(("terminated", "truncated", "done", "message"), [
    ([False] * 4, [False] * 4, [False, True, False, False], r"is True at batch index \(1,\), where terminated and "
                                                            r"truncated are False, so that episode end would be lost"),
    ([False, False, True, False], [False] * 4, [False] * 4, r"is False at batch index \(2,\), where terminated or "
                                                            r"truncated is True"),
    ([False, False, True, False], None, [False] * 4, r"is False at batch index \(2,\)"),
])
def test_an_extend_whose_done_is_not_terminated_or_truncated_is_refused(
        terminated: list[bool], truncated: list[bool] | None, done: list[bool], message: str) -> None:
    # A hand-written time limit that only set ("next", "done") had that end stored as no end (helper 42).
    buf = make()
    add_ids(buf, range(2))
    before = snapshot(buf)
    flags = {"terminated": torch.tensor(terminated)[:, None], "done": torch.tensor(done)[:, None]}
    if truncated is not None:
        flags["truncated"] = torch.tensor(truncated)[:, None]
    with pytest.raises(ConfigError, match=r"^done: key \('next', 'done'\) " + message):
        buf.extend(_four_rows(torch.zeros(4, 1), **flags))
    assert same(snapshot(buf), before)


def test_an_extend_of_a_split_trajs_batch_with_padding_is_refused() -> None:
    buf = make()
    before = snapshot(buf)
    td = _four_rows(torch.zeros(4, 1), terminated=torch.zeros(4, 1, dtype=torch.bool),
                    truncated=torch.zeros(4, 1, dtype=torch.bool))
    td["collector", "mask"] = torch.tensor([True, True, True, False])  # a collector's split_trajs=True padding
    for write in (buf.extend, buf.torchrl.extend):
        with pytest.raises(ShapeError, match=r"^td: \('collector', 'mask'\) marks 1 of 4 rows as padding .* "
                                             r"split_trajs=False"):
            write(td)
        assert same(snapshot(buf), before)
    td["collector", "mask"] = torch.ones(4, dtype=torch.bool)  # no padding: stored
    buf.extend(td)
    assert len(buf) == 4


def test_sampling_errors() -> None:
    buf = make()
    with pytest.raises(EmptyBufferError):
        buf.sample(4)
    with pytest.raises(EmptyBufferError):
        buf.sample_all()
    add_ids(buf, range(2))
    for bad in (0, -3, 2.5, True):
        with pytest.raises(BatchSizeError):
            buf.sample(bad)  # type: ignore[arg-type]
    with pytest.raises(StoredIndexError, match=r"index: expected positions in \[0, 2\)"):
        buf.sample_by_index([0, 2])
    with pytest.raises(StoredIndexError):
        buf.sample_by_index(torch.tensor([0.5]))


def test_priority_errors_change_nothing() -> None:
    buf = make(prioritized=True, seed=0)
    add_ids(buf, range(4))
    buf.update_priority([0, 1, 2, 3], [1.0, 1.0, 1.0, 1.0])
    tree = buf.torchrl.sampler.state_dict()
    for index, priority, message in (
        ([0, 1], [1.0], "expected 2 values (one per index), got 1"),
        ([0], [-1.0], "non-negative"),
        ([0], [float("nan")], "finite"),
    ):
        with pytest.raises(PriorityError, match=message.replace("(", r"\(").replace(")", r"\)")):
            buf.update_priority(index, priority)
    with pytest.raises(StoredIndexError):
        buf.update_priority([9], [1.0])
    batch = buf.sample(2)  # MixedReplay.update_priority takes a batch; a buffer's is told to pass its index
    with pytest.raises(StoredIndexError, match=r"^index: .*got ReplayBatch; pass batch\.index"):
        buf.update_priority(batch, [1.0, 1.0])
    after = buf.torchrl.sampler.state_dict()
    assert all(torch.equal(torch.as_tensor(tree[k]), torch.as_tensor(after[k])) for k in tree if not isinstance(tree[k], (dict, type(None))))
    with pytest.raises(PriorityError, match="not prioritized"):
        make().update_priority([0], [1.0])


def test_config_errors() -> None:
    with pytest.raises(ConfigError, match="capacity"):
        make(capacity=0)
    with pytest.raises(ConfigError, match="num_envs"):
        make(num_envs=0)
    with pytest.raises(ConfigError, match="storage"):
        make(storage="disk")
    with pytest.raises(ConfigError, match="reserved"):
        make(extra_fields={"obs": ((1,), torch.float32)})
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="CUDA is not available"):
            make(device="cuda")
