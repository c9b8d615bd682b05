"""A new user's first calls with other libraries' habits on a buffer: SB3's and gymnasium's keywords, SB3's
constructor options, other libraries' methods and calls, and pickling a buffer, each answered with rlbuf's own
names and fix. Batches and ``Transition`` read or built the same way: ``tests/test_foreign_names_batches.py``.
"""

from __future__ import annotations

import copy
import io
import pickle
import warnings
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import pytest
import torch
from _foreign import (
    F,
    Z,
    _mixed,
    _ready_rollout,
    _with_advantages,
    distill,
    filled,
    replay,
    rollout,
)
from _snapshot import same, snapshot
from tensordict import TensorDict

from rlbuf import (
    ConfigError,
    DistillationBuffer,
    DtypeError,
    EpisodeStats,
    MissingFieldError,
    NotPicklableError,
    ReplayBuffer,
    RolloutBuffer,
    ShapeError,
    Transition,
)
from rlbuf.mixing import MixedReplay

SB3_ADDS: list[tuple[Callable[[], Any], dict[str, Any], str]] = [
    (replay, dict(observations=Z, actions=torch.zeros(2), rewards=torch.zeros(2), next_observations=Z, dones=F),
     "observations: not a field of this buffer; rlbuf's name is obs$"),
    (rollout, dict(observations=Z, actions=torch.zeros(2), rewards=torch.zeros(2), episode_starts=F,
                   values=torch.zeros(2), log_probs=torch.zeros(2)),
     "observations: not a field of this buffer; rlbuf's name is obs$"),
    (distill, dict(observations=Z, actions=torch.zeros(2)), "observations: not a field of this buffer; rlbuf's name is obs$"),
    (distill, dict(obs=Z, actions=torch.zeros(2)), r"actions: .*rlbuf's name is action \(expert_action in a Distill"),
    (replay, dict(obs=Z, action=torch.zeros(2), reward=torch.zeros(2), next_obs=Z, terminations=F, truncations=F),
     r"^terminations: not a field of this buffer; pass terminated= and truncated= \(rlbuf's names for gymnasium's"),
    (rollout, dict(obs=Z, action=torch.zeros(2), reward=torch.zeros(2), value=torch.zeros(2), log_prob=torch.zeros(2),
                   terminations=F, truncations=F),
     r"^terminations: not a field of this buffer; pass terminated= and truncated="),
    (rollout, dict(obs=Z, action=torch.zeros(2), reward=torch.zeros(2), terminated=F, value=torch.zeros(2),
                   log_prob=torch.zeros(2), truncated=F, infos={}),
     r"^infos: .*rlbuf's add takes no infos; with gymnasium use rlbuf.gym.Recorder, which reads info\['final_obs'\]"),
]


@pytest.mark.parametrize(("make", "keywords", "message"), SB3_ADDS)
def test_other_libraries_keywords_reach_rlbufs_check_and_get_rlbufs_names(
        make: Callable[[], Any], keywords: dict[str, Any], message: str) -> None:
    buf = make()
    with pytest.raises(MissingFieldError, match=message):
        buf.add(**keywords)  # not Python's "missing 1 required positional argument: 'obs'"
    assert len(buf) == 0


@pytest.mark.parametrize(("make", "keywords", "message"), [
    (replay, dict(action=torch.zeros(2), reward=torch.zeros(2), next_obs=Z, terminated=F, truncated=F),
     "^obs: a value is required"),
    (rollout, dict(action=torch.zeros(2), reward=torch.zeros(2), terminated=F, value=torch.zeros(2),
                   log_prob=torch.zeros(2), truncated=F), r"^obs: required with every step \(add\(obs, action"),
    (distill, dict(expert_action=torch.zeros(2)), r"^obs: required with every row \(add\(obs, expert_action\)\)"),
    (distill, {}, r"^obs, expert_action: required with every row"),
])
def test_a_missing_obs_is_refused_by_name(make: Callable[[], Any], keywords: dict[str, Any], message: str) -> None:
    buf = make()
    with pytest.raises(MissingFieldError, match=message):
        buf.add(**keywords)
    assert len(buf) == 0


@pytest.mark.parametrize(("build", "message"), [
    (lambda: RolloutBuffer(buffer_size=4, num_envs=2),
     r"^buffer_size: not an option of RolloutBuffer; rlbuf's name is num_steps \(steps per env; SB3's buffer_size "
     r"is num_steps too\)$"),
    (lambda: RolloutBuffer(capacity=8, num_envs=2), r"^capacity: not an option of RolloutBuffer; .*takes num_steps"),
    (lambda: RolloutBuffer(4, 2, gamma=0.9), r"^gamma: .*compute_returns_and_advantages\(\)"),
    (lambda: ReplayBuffer(buffer_size=4), r"^buffer_size: not an option of ReplayBuffer; rlbuf's name is capacity$"),
    (lambda: ReplayBuffer(8, n_steps=3), r"^n_steps: .*ReplayBuffer has no num_steps.*n_step= sets n-step returns"),
    (lambda: DistillationBuffer(buffer_size=4),
     r"^buffer_size: not an option of DistillationBuffer; rlbuf's name is capacity$"),
    (lambda: DistillationBuffer(8, gamma=0.9), r"^gamma: .*DistillationBuffer stores no rewards or returns"),
    # TorchRL's buffers take batch_size when built (helper 71: the answer listed every option, 'positional' too).
    (lambda: ReplayBuffer(8, obs_shape=(3,), action_shape=(), batch_size=32),
     r"^batch_size: not an option of ReplayBuffer; pass it to sample\(batch_size\) \(TorchRL's buffers take it "
     r"when built\)$"),
    (lambda: RolloutBuffer(4, 2, obs_shape=(3,), action_shape=(), batch_size=4),
     r"^batch_size: not an option of RolloutBuffer; pass it to minibatches\(batch_size=\.\.\.\)"),
    (lambda: ReplayBuffer(8, obs_shape=(3,), action_shape=(), bogus=1),
     r"^bogus: not an option of ReplayBuffer; it takes \['capacity', 'obs_shape', "),
])
def test_each_buffer_class_answers_a_foreign_option_with_its_own_name(build: Callable[[], Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build()


BOX, DISCRETE = gym.spaces.Box(-1, 1, (3,)), gym.spaces.Discrete(2)


@pytest.mark.parametrize(("build", "error", "message"), [
    (lambda: ReplayBuffer(100, BOX, DISCRETE, "cpu", 2), MissingFieldError,
     r"^ReplayBuffer: got 5 arguments by position, it takes 1 \(capacity\); pass the others by keyword "
     r"\(observation_space=, action_space= \.\.\.: SB3's buffers take them by position\)$"),
    (lambda: DistillationBuffer(100, BOX), MissingFieldError, r"^DistillationBuffer: got 2 arguments by position, "
                                                               r"it takes 1 \(capacity\)"),
    (lambda: RolloutBuffer(128, 2, BOX, DISCRETE), MissingFieldError,
     r"^RolloutBuffer: got 4 arguments by position, it takes 2 \(num_steps, num_envs\)"),
    (lambda: RolloutBuffer(128, BOX, action_space=DISCRETE), ConfigError,
     r"^num_envs: expected an int in \[1, 2147483647\], got Box"),
])
def test_sb3s_arguments_by_position_get_the_keywords_to_use(build: Callable[[], Any], error: type[Exception],
                                                            message: str) -> None:
    with pytest.raises(error, match=message):
        build()


def torch_save(value: Any) -> None:
    torch.save(value, io.BytesIO())


@pytest.mark.parametrize("copier", [pickle.dumps, copy.deepcopy, copy.copy, torch_save,
                                    lambda buf: torch.save({"buffer": buf, "step": 3}, io.BytesIO())],
                         ids=["pickle", "deepcopy", "copy", "torch.save", "torch.save of a dict"])
@pytest.mark.parametrize("make", [replay, rollout, distill])
def test_pickling_or_copying_a_buffer_is_refused_with_the_fix_before_any_global_change(
        make: Callable[[], Any], copier: Callable[[Any], Any]) -> None:
    buf = filled(make)
    name = type(buf).__name__
    strategy = torch.multiprocessing.get_sharing_strategy()  # type: ignore[no-untyped-call]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no RuntimeWarning about switching the sharing strategy
        with pytest.raises(NotPicklableError) as error:
            copier(buf)
    assert isinstance(error.value, TypeError) and isinstance(error.value, ConfigError)
    message = str(error.value)
    assert message.startswith(f"{name}: cannot be pickled or copied")
    for fix in ("buffer.save(path)", f"{name}.load(path)", "buffer.state_dict()", "load_state_dict(state)",
                "buffer.torchrl"):
        assert fix in message
    assert torch.multiprocessing.get_sharing_strategy() == strategy  # type: ignore[no-untyped-call]
    assert len(buf) == 2  # still usable
    assert pickle.loads(pickle.dumps(buf.state_dict()))  # the in-memory fix named works


def test_save_and_load_named_by_the_refusal_keep_the_rows(tmp_path: Any) -> None:
    buf = filled(replay)
    buf.save(tmp_path / "ckpt")
    assert ReplayBuffer.load(tmp_path / "ckpt").sample_all().reward.tolist() == [1.0, 1.0]




@pytest.mark.parametrize("make", [replay, rollout, distill, lambda: MixedReplay(filled(replay), filled(replay))])
def test_load_called_on_a_buffer_is_refused_since_it_would_leave_that_buffer_as_it_was(
        tmp_path: Any, make: Callable[[], Any]) -> None:
    # TorchRL's rb.load(path) loads in place; rlbuf's load is a classmethod that returns a new buffer, so
    # buffer.load(path) left buffer as it was, without a word (helper 71).
    buf = make()
    buf.save(tmp_path / "ckpt")
    cls = type(buf).__name__
    with pytest.raises(ConfigError, match=rf"^{cls}\.load: called on a {cls}, it would return a new one and leave "
                                          rf"this one as it was; write buffer = {cls}\.load\(path\)$"):
        buf.load(tmp_path / "ckpt")
    assert type(type(buf).load(tmp_path / "ckpt")) is type(buf)  # the class still loads


FOREIGN_CALLS: list[tuple[Callable[[], Any], str, dict[str, Any], str]] = [
    (_ready_rollout, "compute_returns_and_advantages", dict(last_values=torch.zeros(2), dones=F),
     r"^compute_returns_and_advantages: got last_values=, which it does not take; rlbuf's name is last_value "),
    (_ready_rollout, "compute_returns_and_advantages", dict(last_value=torch.zeros(2), dones=F),
     r"got dones=, which it does not take; drop it: the last step's terminated and truncated came with its add"),
    (_ready_rollout, "compute_returns_and_advantages", dict(next_value=torch.zeros(2), lmbda=0.9),
     r"got next_value=.*rlbuf's name is last_value"),
    (_ready_rollout, "compute_returns_and_advantages", dict(last_value=torch.zeros(2), norm_adv=True),
     r"got norm_adv=.*rlbuf's name is normalize_advantages$"),
    (_with_advantages, "minibatches", dict(minibatch_size=2), r"^minibatches: got minibatch_size=.*name is batch_size"),
    (_with_advantages, "minibatches", dict(batch_size=2, update_epochs=4), r"got update_epochs=.*name is n_epochs$"),
    (lambda: filled(replay), "epochs", dict(batch_size=2, num_epochs=4), r"^epochs: got num_epochs=.*name is n_epochs$"),
    (lambda: filled(replay), "epochs", dict(batch_size=2, num_minibatches=4),
     r"^epochs: got num_minibatches=, which it does not take; its keywords are batch_size, drop_last, n_epochs, shuffle$"),
    (lambda: filled(replay), "sample", dict(batch_size=2, env=None), r"^sample: got env=.*no VecNormalize"),
    (lambda: filled(replay), "sample", dict(batch_size=2, device="cpu"), r"^sample: got device=.*buffer's device="),
    (lambda: filled(replay), "sample", dict(batch_size=2, beta=0.4), r"got beta=.*buffer.beta = "),
    (lambda: filled(replay), "sample_sequences", dict(batch_size=2, seq_len=1), r"got seq_len=.*name is length"),
    (lambda: filled(distill), "sample", dict(batch_size=2, env=None), r"^sample: got env="),
    (_mixed, "sample", dict(batch_size=2, device="cpu"), r"^sample: got device="),
]


@pytest.mark.parametrize(("make", "method", "keywords", "message"), FOREIGN_CALLS)
def test_another_librarys_keyword_to_a_method_gets_rlbufs_word_and_changes_nothing(
        make: Callable[[], Any], method: str, keywords: dict[str, Any], message: str) -> None:
    # SB3's compute_returns_and_advantage(last_values=, dones=), CleanRL's update_epochs, SB3's sample(env=):
    # Python's bare TypeError named no fix. The refusal is still a TypeError, and changes nothing.
    buf = make()
    parts = [buf.offline, buf.online] if isinstance(buf, MixedReplay) else [buf]
    before = [snapshot(part) for part in parts]
    with pytest.raises(MissingFieldError, match=message) as caught:
        getattr(buf, method)(**keywords)
    assert isinstance(caught.value, TypeError)
    assert all(same(snapshot(part), old) for part, old in zip(parts, before, strict=True))


def _collected(*, value: bool = False, log_prob: bool = False) -> TensorDict:
    """A TorchRL collector's [num_envs=2, T=1] batch for ``rollout()``, with or without the policy's outputs."""
    td = TensorDict({"observation": torch.zeros(2, 1, 3), "action": torch.zeros(2, 1),
                     ("next", "reward"): torch.zeros(2, 1, 1), ("next", "terminated"): torch.zeros(2, 1, 1, dtype=torch.bool),
                     ("next", "truncated"): torch.zeros(2, 1, 1, dtype=torch.bool)}, [2, 1])
    if value:
        td["state_value"] = torch.zeros(2, 1, 1)
    if log_prob:
        td["sample_log_prob"] = torch.zeros(2, 1)
    return td


@pytest.mark.parametrize(("call", "error", "message"), [
    (lambda: filled(replay).sample(2, None), MissingFieldError,
     r"^sample: got 2 arguments by position, it takes 1 \(batch_size\); in SB3's version, env comes there"),
    (lambda: _ready_rollout().compute_returns_and_advantages(torch.zeros(2), F), MissingFieldError,
     r"^compute_returns_and_advantages: got 2 arguments by position, .* dones comes there: drop it"),
    (lambda: filled(replay).full, AttributeError, r"'ReplayBuffer' object has no attribute 'full'; buffer.is_full"),
    # TorchRL's ReplayBuffer methods (helper 71: a bare AttributeError before).
    (lambda: filled(replay).dumps("ckpt"), AttributeError, r"'dumps'; buffer.save\(path\) writes a checkpoint"),
    (lambda: filled(replay).loads("ckpt"), AttributeError, r"'loads'; buffer = ReplayBuffer.load\(path\) reads "),
    (lambda: filled(replay).empty(), AttributeError, r"'empty'; clear\(\) empties the buffer \(TorchRL's empty"),
    (lambda: _ready_rollout().sample(2), AttributeError, r"'sample'; a rollout gives minibatches\(batch_size=\.\.\.\)"),
    (lambda: replay().add(Z, torch.zeros(2), torch.ones(2), Z, F, {"final_obs": None}), ShapeError,  # infos as truncated
     r"^truncated: expected a tensor, numpy array or number, got dict; an info dict where the flags belong\? add takes"),
    # SB3's add(obs, next_obs, action, reward, done, infos) habit: its infos, a list of dicts, as the flags.
    (lambda: replay().add(Z, torch.zeros(2), torch.ones(2), Z, F, [{"TimeLimit.truncated": True}, {}]), DtypeError,
     r"^truncated: expected bool, int or float values, got object: .*; an SB3 VecEnv's infos where the flags "
     r"belong\? add takes no infos: terminated, truncated, info = rlbuf.gym.sb3_step\(dones, infos\)$"),
    (lambda: filled(replay).sample(2).dones, AttributeError,
     r"^ReplayBatch has no field 'dones'; rlbuf's name is terminated \(the bootstrap mask: a time limit is no end "),
    (lambda: _with_advantages().get_all_data().dones, AttributeError,  # a rollout batch has no done
     r"^RolloutBatch has no field 'dones'; rlbuf's name is terminated$"),
    (lambda: filled(distill).sample(2).actions, AttributeError, r"rlbuf's name is expert_action$"),
    (lambda: filled(replay).sample(2).values, AttributeError, r"^ReplayBatch has no field 'values' \(a batch from"),
    (lambda: replay().add(Z, torch.zeros(2), torch.ones(2), Z, F, F, (torch.zeros(2).numpy(),) * 2),
     MissingFieldError, r"^hidden_state: this buffer was built without hidden_state_shape$"),  # an (h, c), no infos
    (lambda: filled(replay).sample(2).next_observations, AttributeError, r"rlbuf's name is next_obs$"),
    (lambda: _with_advantages().get_all_data().old_log_prob, AttributeError, r"rlbuf's name is log_prob$"),
    (lambda: replay().add(Z, torch.zeros(2), torch.ones(2), Z, F, F, [{}, {}]), MissingFieldError,
     r"^hidden_state: this buffer was built without hidden_state_shape; the argument after truncated is "
     r"hidden_state, and add takes no infos"),
    (lambda: ReplayBuffer(8, obs_shape=(3,), action_shape=(), device="auto"), ConfigError,
     r"^device: 'auto' is SB3's word, not a torch device; pass 'cuda' if torch.cuda.is_available\(\) else 'cpu'"),
    # SB3's rollout add(obs, action, reward, episode_start, value, log_prob): episode_start lands in terminated.
    (lambda: rollout().add(Z, torch.zeros(2), torch.ones(2), ~F, torch.zeros(2), torch.zeros(2)), MissingFieldError,
     r"^truncated: required .* nor is SB3's episode_start in the 4th place \(the previous step's done"),
    (lambda: replay().extend(TensorDict({"observation": Z, "action": torch.zeros(2), "reward": torch.ones(2),
                                         ("next", "observation"): Z, ("next", "terminated"): F,
                                         ("next", "truncated"): F}, [2])), MissingFieldError,
     r"^reward: key \('next', 'reward'\) not found in the tensordict; it holds 'reward' at the top: TorchRL keeps"),
    (lambda: rollout().extend(TensorDict({"observation": torch.zeros(2, 1, 3)}, [2, 1])), MissingFieldError,
     r"^action: key 'action' not found in the tensordict; it holds 'observation'$"),
    # A TorchRL PPO port whose collector's policy wrote no value or log-probability is told what writes them.
    (lambda: rollout().extend(_collected(log_prob=True)), MissingFieldError,
     r"^value: key 'state_value' not found .*; run the critic on the batch before extend \(a TorchRL ValueOperator"),
    (lambda: rollout().extend(_collected(value=True)), MissingFieldError,
     r"^log_prob: key 'sample_log_prob' not found .*ProbabilisticActor\(\.\.\., return_log_prob=True\): "
     r"'action_log_prob' is read too\)$"),
])
def test_other_libraries_habits_get_rlbufs_way(call: Callable[[], Any], error: type[Exception], message: str) -> None:
    # Each was a bare TypeError or AttributeError, or a message about something else (helper 42).
    with pytest.raises(error, match=message):
        call()


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
@pytest.mark.parametrize("options", [{}, {"n_step": 3}, {"stats": True}], ids=["plain", "n-step", "stats"])
def test_an_add_in_sb3s_argument_order_is_refused_naming_rlbufs_order(env_id: str, options: dict[str, Any]) -> None:
    """SB3's ``add(obs, next_obs, action, reward, done, infos)`` by position: ``action`` gets the next
    observations, ``truncated`` the infos. Refused with rlbuf's order, nothing stored."""
    envs = gym.make_vec(env_id, 2)
    stats = {"stats": EpisodeStats(2)} if options.pop("stats", False) else {}
    buffer = ReplayBuffer(16, observation_space=envs.single_observation_space,
                          action_space=envs.single_action_space, num_envs=2, seed=0, **options, **stats)
    obs, _ = envs.reset(seed=0)
    action = envs.action_space.sample()
    next_obs, reward, terminated, truncated, _ = envs.step(action)
    before = snapshot(buffer)
    with pytest.raises((ShapeError, DtypeError), match=r"SB3 order\? Its add\(obs, next_obs, action, reward, done, "
                                         r"infos\) is rlbuf's add\(obs, action, reward, next_obs, terminated, "
                                         r"truncated\)"):
        buffer.add(obs, next_obs, action, reward, terminated | truncated, [{}, {}])
    assert same(snapshot(buffer), before)
    buffer.add(obs, action, reward, next_obs, terminated, truncated)  # rlbuf's order is stored
    assert len(buffer) == 2


def test_a_refusal_keeps_its_class_where_the_sb3_hint_cannot_read_obs() -> None:
    """The SB3-order hint reads ``obs``'s shape after a refusal; a value numpy cannot read (a list of tensors
    that track gradients) gave torch's RuntimeError in place of the refusal (helper 72)."""
    buffer = ReplayBuffer(10, obs_shape=(3,), action_shape=(), num_envs=2, seed=0, stats=EpisodeStats(2))
    obs = [torch.zeros(3, requires_grad=True), torch.zeros(3, requires_grad=True)]
    before = snapshot(buffer)
    with pytest.raises(ShapeError, match=r"^reward: expected shape \(2,\), got \(3,\)$"):
        buffer.add(obs, [0, 0], [1.0, 1.0, 1.0], torch.zeros(2, 3), [False, False], truncated=False)
    assert same(snapshot(buffer), before)


@pytest.mark.parametrize(("make", "name", "message"), [
    # Velora's push, ObjectRL's method names, rl-buffer's get, ApexRL's and hand-written rollouts'
    # [T, N] attributes: each was a bare AttributeError, or a rollout's answer on a ReplayBuffer (helper 74).
    (replay, "push", r"'push'; add\(\.\.\.\) stores a step; it also takes a Transition \(Velora's push"),
    (distill, "push", r"'push'; add\(obs, expert_action\) stores rows$"),
    (rollout, "push", r"'push'; add\(obs, action, reward, terminated, value, log_prob, truncated=\.\.\.\)"),
    (replay, "add_batch", r"'add_batch'; extend\(td\) stores a TensorDict of rows \(ObjectRL's add_batch\)$"),
    (replay, "sample_batch", r"'sample_batch'; sample\(batch_size\) draws a batch \(ObjectRL's sample_batch\)$"),
    (rollout, "sample_batch", r"'sample_batch'; a rollout gives minibatches\(batch_size=\.\.\.\)"),
    (replay, "sample_by_index_fields", r"sample_by_index\(index, fields=\[\.\.\.\]\)"),
    (replay, "create_epoch_iterator", r"it = buffer.epochs\(batch_size=\.\.\., n_epochs=\.\.\.\)"),
    (replay, "get_next_batch", r"next\(it\) or it.next_batch\(\).*buffer.current_epochs$"),
    (replay, "calculate_num_batches", r"num_batches\(batch_size, drop_last=\.\.\.\)"),
    (replay, "get_steps_and_iterator", r"its steps are len\(it\)$"),
    (replay, "get", r"'get'; sample\(batch_size\) draws a batch \(rl-buffer's get\)"),
    (rollout, "get", r"'get'; minibatches\(batch_size=\.\.\.\) gives a rollout's minibatches"),
    (rollout, "iterate_minibatches", r"minibatches\(batch_size=\.\.\., n_epochs=\.\.\.\) yields typed minibatches"),
    (rollout, "observations", r"'observations'; buffer.view\('obs'\) is the \[num_steps, num_envs, \.\.\.\] tensor"),
    (rollout, "advantages", r"buffer.view\('advantage'\) is the \[num_steps, num_envs, \.\.\.\] tensor"),
    (rollout, "logprobs", r"buffer.view\('log_prob'\)"),
    (rollout, "dones", r"buffer.view\('terminated'\) and buffer.view\('truncated'\)"),
])
def test_other_libraries_methods_and_attributes_name_rlbufs(make: Callable[[], Any], name: str, message: str) -> None:
    buf = make()
    with pytest.raises(AttributeError, match=message):
        getattr(buf, name)
    assert not hasattr(buf, name)


def _full_rollout() -> RolloutBuffer:
    buf = rollout()
    for _ in range(4):
        buf.add(Z, torch.zeros(2), torch.ones(2), F, torch.zeros(2), torch.zeros(2), truncated=False)
    return buf


@pytest.mark.parametrize(("call", "error", "message"), [
    # Velora's Experience fields, a hand-written rollout's logprob, ApexRL's distillation add(obs, action=)
    # were told to declare them in extra_fields (helper 74).
    (lambda: replay().add(state=Z, action=torch.zeros(2), reward=torch.ones(2), next_state=Z, terminated=F,
                          truncated=F), MissingFieldError, r"^state: not a field of this buffer; rlbuf's name is obs$"),
    (lambda: replay().add(Z, torch.zeros(2), torch.ones(2), next_state=Z, terminated=F, truncated=F),
     MissingFieldError, r"^next_state: not a field of this buffer; rlbuf's name is next_obs"),
    (lambda: rollout().add(Z, torch.zeros(2), torch.ones(2), F, torch.zeros(2), logprob=torch.zeros(2),
                           truncated=F), MissingFieldError, r"^logprob: .*rlbuf's name is log_prob$"),
    (lambda: distill().add(obs=Z, action=torch.zeros(2)), MissingFieldError,
     r"^action: not a field of this buffer; rlbuf's name is expert_action in a DistillationBuffer$"),
    (lambda: distill().add(obs=Z, expert_actions=torch.zeros(2)), MissingFieldError,
     r"^expert_actions: .*rlbuf's name is expert_action$"),
    # rl-buffer's stats_tracker= and dtype=, ApexRL's num_privileged_obs=: the list of every option before.
    (lambda: ReplayBuffer(8, obs_shape=(3,), action_shape=(), stats_tracker=EpisodeStats(1)), ConfigError,
     r"^stats_tracker: not an option of ReplayBuffer; rlbuf's name is stats \(an EpisodeStats\)$"),
    (lambda: ReplayBuffer(8, obs_shape=(3,), action_shape=(), dtype=torch.uint8), ConfigError,
     r"^dtype: not an option of ReplayBuffer; rlbuf takes obs_dtype= and action_dtype=$"),
    (lambda: RolloutBuffer(4, 2, obs_shape=(3,), action_shape=(), num_privileged_obs=0), ConfigError,
     r"^num_privileged_obs: .*privileged_obs_shape=\(num_privileged_obs,\); leave it out for none$"),
    # A hand-written rollout's set_extras({"advantages": ..., "returns": ...}): "advantage and returns go together".
    (lambda: _full_rollout().set_extras({"advantages": torch.zeros(4, 2), "returns": torch.zeros(4, 2)}),
     MissingFieldError, r"^set_extras: got 'advantages'; rlbuf's name is advantage"),
    (lambda: _full_rollout().set_extras({"advantages": torch.zeros(4, 2)}),
     MissingFieldError, r"^set_extras: got 'advantages'; rlbuf's name is advantage"),
])
def test_other_libraries_keywords_name_rlbufs(call: Callable[[], Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        call()


@pytest.mark.parametrize("truncated", [torch.zeros(2), F], ids=["float", "bool"])
def test_an_add_with_done_before_next_obs_is_refused_naming_rlbufs_order(truncated: torch.Tensor) -> None:
    """rl-buffer's ``add(obs, action, reward, done, next_obs, truncated)`` by position: the refusal said only
    ``terminated: expected shape (2,), got (2, 3)`` (helper 74). Nothing is stored."""
    buf = ReplayBuffer(8, obs_shape=(3,), action_shape=(), num_envs=2, seed=0)
    with pytest.raises((ShapeError, DtypeError), match=r"; is done before next_obs \(rl-buffer's add\(obs, action, "
                                                      r"reward, done, next_obs, truncated\)\)\? rlbuf's order is "
                                                      r"add\(obs, action, reward, next_obs, terminated, truncated\)$"):
        buf.add(Z, torch.zeros(2), torch.ones(2), F, Z, truncated)
    assert len(buf) == 0


def test_a_tensordict_given_to_add_is_refused_naming_extend() -> None:
    """ObjectRL's ``buffer.add(td)`` of one transition: the refusal said ``truncated: required`` (helper 74)."""
    buf = ReplayBuffer(8, obs_shape=(3,), action_shape=(), seed=0)
    td = TensorDict({"observation": torch.zeros(3), "action": torch.zeros(()), ("next", "observation"): torch.zeros(3),
                     ("next", "reward"): torch.zeros(1), ("next", "terminated"): torch.zeros(1, dtype=torch.bool),
                     ("next", "truncated"): torch.zeros(1, dtype=torch.bool)}, [])
    with pytest.raises(MissingFieldError, match=r"^add: got a TensorDict in place of obs and nothing else; "
                                                r"extend\(td\) stores a TensorDict of rows"):
        buf.add(td)
    assert len(buf) == 0
    buf.extend(td)
    assert len(buf) == 1


@pytest.mark.parametrize(("name", "message"), [
    ("get_statistics", r"summary\(\) gives mean/std/min/max/count of returns, lengths and metrics, and end reasons"),
    ("get_stats", r"summary\(\) gives"),
    ("mean_return", r"summary\(\)\['return'\]\['mean'\]"),
    ("episode_returns", r"recent_returns\(k\)"),
    ("episode_lengths", r"recent_lengths\(k\)"),
    ("num_episodes", r"episodes_finished counts the finished episodes$"),
    ("clear", r"reset\(\) forgets every episode"),
    ("add", r"update\(reward, terminated, truncated\)"),
])
def test_episode_stats_names_its_method_for_another_librarys(name: str, message: str) -> None:
    """rl-buffer's ``StatsTracker.get_statistics()`` and the like: Python's bare AttributeError (helper 75)."""
    with pytest.raises(AttributeError, match=rf"^'EpisodeStats' object has no attribute '{name}'; {message}"):
        getattr(EpisodeStats(1), name)


def test_episode_stats_takes_no_buffers_hint_and_still_copies() -> None:
    stats = EpisodeStats(1)
    with pytest.raises(AttributeError, match=r"^'EpisodeStats' object has no attribute 'get'$"):
        stats.get  # noqa: B018 (a buffer's hint, minibatches(...), would be wrong here)
    stats.update(1.0, True)
    assert copy.deepcopy(stats).recent_returns() == pickle.loads(pickle.dumps(stats)).recent_returns() == [1.0]


@pytest.mark.parametrize("more", [{}, {"truncated": F}], ids=["alone", "with-truncated"])
def test_a_transition_given_to_a_rollouts_add_is_refused_naming_its_fields(more: dict[str, Any]) -> None:
    """Velora's push of an Experience, as a replay's ``add(Transition(...))``: a rollout refused it with
    ``truncated: required`` though the Transition held truncated (helper 75). Nothing is stored."""
    buf = rollout()
    step = Transition(Z, torch.zeros(2), torch.ones(2), Z, F, truncated=F)
    with pytest.raises(MissingFieldError, match=r"^add: got a Transition in place of obs; a rollout's add takes the "
                                                r"fields, add\(obs, action, reward, terminated, value, log_prob, "
                                                r"truncated=\.\.\., bootstrap_value=\.\.\.\), not a Transition"):
        buf.add(step, **more)
    with pytest.raises(MissingFieldError, match=r"^add: got a TensorDict in place of obs; extend\(td\)"):
        buf.add(TensorDict({"observation": Z}, [2]))
    assert len(buf) == 0


@pytest.mark.parametrize(("name", "field"), [("logprobs", "log_prob"), ("log_probs", "log_prob"), ("values", "value"),
                                             ("rewards", "reward"), ("dones", "terminated")])
def test_set_extras_refuses_a_stored_fields_foreign_spelling(name: str, field: str) -> None:
    """A hand-written rollout's ``set_extras({"logprobs": x})`` was attached as a new extra, the field itself
    untouched (helper 75); an extra of another name still attaches."""
    buf = _full_rollout()
    with pytest.raises(MissingFieldError, match=rf"^set_extras: got '{name}'; rlbuf's name is {field}\b.*a step field "
                                                r"stored by add \(set_extras attaches new tensors, or replaces "
                                                r"advantage and returns\)$"):
        buf.set_extras({name: torch.ones(4, 2), "kept": torch.ones(4, 2)})
    buf.compute_returns_and_advantages(torch.zeros(2))
    batch = buf.get_all_data()
    assert batch.extras == {} and torch.equal(batch.value, torch.zeros(8))
    buf.set_extras({"old_values": torch.ones(4, 2)})
    assert sorted(buf.get_all_data().extras) == ["old_values"]


@pytest.mark.parametrize(("options", "expected"), [
    (dict(ratio=0.3), r"^ratio: not an option of MixedReplay; rlbuf's name is offline_fraction, as TorchRL's "),
    (dict(online_fraction=0.7, batch_size=4), r"^online_fraction: .*offline_fraction=1 - online_fraction.*; also "
                                              r"batch_size: not an option of MixedReplay; pass it to sample"),
    (dict(online_capacity=100), r"build the online ReplayBuffer and pass it"),
    (dict(buffer_size=10), r"^buffer_size: not an option of MixedReplay; it takes \['offline', 'online', "),
])
def test_a_mixer_built_with_foreign_options_is_told_its_own(options: dict[str, Any], expected: str) -> None:
    # A newcomer's port took MixedReplay(ratio=...) and got Python's bare TypeError (helper 103); a buffer's hints
    # (buffer_size is a buffer's capacity) would mislead here.
    offline, online = filled(replay), filled(replay)
    before = (len(offline), offline.read_only)
    with pytest.raises(ConfigError, match=expected):
        MixedReplay(offline, online, **options)
    assert (len(offline), offline.read_only) == before  # refused before the offline buffer is made read-only
