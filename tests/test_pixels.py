"""Compact layout, frame stacks and n-step returns: every sampled transition equals a naive buffer's.

Random streams of several envs (gymnasium-style frame stacks, terminations, truncations, a ring
small enough to be overwritten many times) are added to a ReplayBuffer and to a naive list of
whole transitions; every transition the buffer gives (``sample_all`` and ``sample``, uniform or
prioritized, memory or memmap) must equal the reference built from the list, and exactly the
complete transitions must be sampleable.
"""

from __future__ import annotations

import warnings
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from rlbuf import (
    ConfigError,
    DtypeError,
    EmptyBufferError,
    NextStepResetWarning,
    ReplayBuffer,
    ShapeError,
    StoredIndexError,
    StreamError,
)

FRAME = (2, 3)


@dataclass
class Step:
    """One transition as added: whole stacks, flags, action and reward."""

    env: int
    obs: torch.Tensor
    action: int
    reward: float
    next_obs: torch.Tensor
    terminated: bool
    truncated: bool


@dataclass
class Envs:
    """Vectorised toy envs giving gymnasium FrameStackObservation stacks (newest frame last)."""

    num_envs: int
    frame_stack: int
    padding_type: str
    end_chance: float
    rng: np.random.Generator
    stacks: list[deque[np.ndarray[Any, Any]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.stacks = [self._reset() for _ in range(self.num_envs)]

    def _frame(self) -> np.ndarray[Any, Any]:
        return self.rng.integers(0, 256, FRAME, dtype=np.uint8)

    def _reset(self) -> deque[np.ndarray[Any, Any]]:
        first = self._frame()
        pad = first if self.padding_type == "reset" else np.zeros(FRAME, np.uint8)
        return deque([pad] * (self.frame_stack - 1) + [first], maxlen=self.frame_stack)

    def _obs(self, stack: deque[np.ndarray[Any, Any]]) -> torch.Tensor:
        array = np.stack(list(stack))
        return torch.from_numpy(array if self.frame_stack > 1 else array[0])

    def step(self) -> list[Step]:
        return [self.step_one(env) for env in range(self.num_envs)]

    def step_one(self, env: int) -> Step:
        obs = self._obs(self.stacks[env])
        self.stacks[env].append(self._frame())
        next_obs = self._obs(self.stacks[env])
        ends = self.rng.random() < self.end_chance
        terminated = bool(ends and self.rng.random() < 0.5)
        step = Step(env, obs, int(self.rng.integers(0, 4)), float(self.rng.integers(-8, 8)) / 4, next_obs,
                    terminated, ends and not terminated)
        if ends:
            self.stacks[env] = self._reset()
        return step


def reference(steps: list[Step], capacity: int, frame_stack: int, n_step: int,
              gamma: float) -> dict[int, dict[str, Any]]:
    """The complete transitions of the stored rows by serial, computed from whole transitions."""
    written = len(steps)
    oldest = max(0, written - capacity)
    by_env: dict[int, list[int]] = {}
    for serial, step in enumerate(steps):
        by_env.setdefault(step.env, []).append(serial)
    result = {}
    for env_serials in by_env.values():
        episode_start = 0
        for i, serial in enumerate(env_serials):
            if i > 0 and (steps[env_serials[i - 1]].terminated or steps[env_serials[i - 1]].truncated):
                episode_start = i
            oldest_frame = env_serials[max(episode_start, i - frame_stack + 1)]
            if serial < oldest or oldest_frame < oldest:
                continue
            total, m, ended, last = 0.0, 0, False, None
            for j in range(n_step):
                if i + j >= len(env_serials):
                    break
                last = steps[env_serials[i + j]]
                total += gamma**j * last.reward
                m = j + 1
                if last.terminated or last.truncated:
                    ended = True
                    break
            if last is None or (not ended and (m < n_step or i + n_step >= len(env_serials))):
                continue  # the n steps (and the observation after them) are not all added yet
            result[serial] = {
                "obs": steps[serial].obs, "action": float(steps[serial].action), "next_obs": last.next_obs,
                "reward": np.float32(total), "terminated": ended and last.terminated,
                "truncated": ended and last.truncated,
                "discount": np.float32(0.0 if ended and last.terminated else gamma**m),
            }
    return result


def serial_of(position: int, written: int, capacity: int) -> int:
    return written - 1 - ((written - 1 - position) % capacity)


def check_batch(batch: Any, expected: dict[int, dict[str, Any]], written: int, capacity: int) -> None:
    for row, position in enumerate(batch.index.tolist()):
        want = expected[serial_of(position, written, capacity)]
        assert torch.equal(batch.obs[row], want["obs"])
        assert torch.equal(batch.next_obs[row], want["next_obs"])
        assert batch.action[row].item() == want["action"]
        assert batch.reward[row].item() == want["reward"]
        assert batch.discount[row].item() == want["discount"]
        assert bool(batch.terminated[row]) == want["terminated"]
        assert bool(batch.truncated[row]) == want["truncated"]
        assert bool(batch.done[row]) == (want["terminated"] or want["truncated"])


def add_steps(buf: ReplayBuffer, rounds: list[list[Step]], use_extend: bool) -> list[Step]:
    """Add rounds of env steps (one add per round, or one extend of all rounds); the write order."""
    if not use_extend:
        for steps in rounds:
            buf.add(torch.stack([s.obs for s in steps]), torch.tensor([float(s.action) for s in steps]),
                    torch.tensor([s.reward for s in steps]), torch.stack([s.next_obs for s in steps]),
                    torch.tensor([s.terminated for s in steps]), torch.tensor([s.truncated for s in steps]))
        return [s for steps in rounds for s in steps]
    grid = [[rounds[t][e] for t in range(len(rounds))] for e in range(len(rounds[0]))]  # [env, time]

    def column(get: Any) -> torch.Tensor:
        return torch.stack([torch.stack([torch.as_tensor(get(s)) for s in row]) for row in grid])

    td = TensorDict({"observation": column(lambda s: s.obs), "action": column(lambda s: float(s.action)),
                     "next": {"observation": column(lambda s: s.next_obs), "reward": column(lambda s: s.reward),
                              "terminated": column(lambda s: s.terminated),
                              "truncated": column(lambda s: s.truncated)}},
                    batch_size=[len(grid), len(rounds)])
    buf.extend(td)
    return [s for row in grid for s in row]


@st.composite
def scenarios(draw: st.DrawFn, frame_stack: int | None = None, n_step: int | None = None) -> dict[str, Any]:
    num_envs = draw(st.integers(1, 3))
    return {
        "num_envs": num_envs,
        "frame_stack": draw(st.sampled_from([1, 2, 4])) if frame_stack is None else frame_stack,
        "n_step": draw(st.sampled_from([1, 2, 3])) if n_step is None else n_step,
        "capacity": draw(st.integers(max(num_envs, 3), 24)),
        "padding_type": draw(st.sampled_from(["reset", "zero"])),
        "prioritized": draw(st.booleans()),
        "end_chance": draw(st.sampled_from([0.0, 0.15, 0.5])),
        "gamma": draw(st.sampled_from([0.5, 0.75, 1.0])),
        "chunks": draw(st.lists(st.tuples(st.integers(1, 6), st.booleans()), min_size=1, max_size=8)),
        "seed": draw(st.integers(0, 2**16)),
    }


@pytest.mark.parametrize("storage", ["memory", "memmap"])
@pytest.mark.parametrize("prioritized", [False, True])
@pytest.mark.parametrize("n_step", [1, 3])
@pytest.mark.parametrize("frame_stack", [1, 2, 4])
def test_every_sampled_transition_equals_the_naive_buffers(storage: str, prioritized: bool, n_step: int,
                                                           frame_stack: int) -> None:
    """Every combination of frame_stack, n_step, PER and storage; random streams within each."""

    @settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(scenario=scenarios(frame_stack, n_step))
    def check(scenario: dict[str, Any]) -> None:
        check_every_sampled_transition(storage, {**scenario, "prioritized": prioritized})

    check()


def check_every_sampled_transition(storage: str, scenario: dict[str, Any]) -> None:
    envs = Envs(scenario["num_envs"], scenario["frame_stack"], scenario["padding_type"], scenario["end_chance"],
                np.random.default_rng(scenario["seed"]))
    obs_shape = (scenario["frame_stack"], *FRAME) if scenario["frame_stack"] > 1 else FRAME
    capacity = scenario["capacity"]
    buf = ReplayBuffer(capacity, obs_shape=obs_shape, action_shape=(), num_envs=scenario["num_envs"],
                       obs_dtype=torch.uint8, storage=storage, prioritized=scenario["prioritized"],
                       frame_stack=scenario["frame_stack"], padding_type=scenario["padding_type"],
                       n_step=scenario["n_step"], gamma=scenario["gamma"], compact=True, seed=scenario["seed"])
    written: list[Step] = []
    for length, use_extend in scenario["chunks"]:
        written += add_steps(buf, [envs.step() for _ in range(length)], use_extend)
        expected = reference(written, capacity, scenario["frame_stack"], scenario["n_step"], scenario["gamma"])
        if not expected:
            with pytest.raises(EmptyBufferError, match="no transition is complete yet"):
                buf.sample(4)
            continue
        everything = buf.sample_all()
        stored = sorted(serial_of(p, len(written), capacity) for p in everything.index.tolist())
        assert stored == sorted(expected)
        check_batch(everything, expected, len(written), capacity)
        if scenario["prioritized"]:
            buf.update_priority(everything.index, torch.arange(len(everything), dtype=torch.float64) + 0.5)
        check_batch(buf.sample(16), expected, len(written), capacity)
    buf.close()


@settings(max_examples=25, deadline=None)
@given(scenario=scenarios())
def test_compact_one_step_buffer_equals_the_classic_layout(scenario: dict[str, Any]) -> None:
    envs = Envs(scenario["num_envs"], 1, "reset", scenario["end_chance"], np.random.default_rng(scenario["seed"]))
    capacity = scenario["capacity"]
    kwargs = dict(obs_shape=FRAME, action_shape=(), num_envs=scenario["num_envs"], obs_dtype=torch.uint8,
                  gamma=scenario["gamma"], seed=scenario["seed"])
    compact, classic = ReplayBuffer(capacity, compact=True, **kwargs), ReplayBuffer(capacity, **kwargs)
    written: list[Step] = []
    for length, use_extend in scenario["chunks"]:
        rounds = [envs.step() for _ in range(length)]
        written += add_steps(compact, rounds, use_extend)
        add_steps(classic, rounds, use_extend)
    expected = reference(written, capacity, 1, 1, scenario["gamma"])
    if expected:
        batch = compact.sample_by_index(compact.sample_all().index)
        truth = classic.sample_by_index(batch.index)
        for name in ("obs", "action", "reward", "next_obs", "terminated", "truncated", "done", "discount"):
            assert torch.equal(getattr(batch, name), getattr(truth, name)), name


def fill(buf: ReplayBuffer, envs: Envs, rounds: int) -> None:
    add_steps(buf, [envs.step() for _ in range(rounds)], use_extend=False)


@pytest.mark.parametrize("storage", ["memory", "memmap"])
@pytest.mark.parametrize("prioritized", [False, True])
def test_checkpoint_resumes_exactly(tmp_path: Path, storage: str, prioritized: bool) -> None:
    options = dict(obs_shape=(4, *FRAME), action_shape=(), num_envs=2, obs_dtype=torch.uint8, frame_stack=4,
                   n_step=3, gamma=0.5, storage=storage, prioritized=prioritized, seed=3)
    envs = Envs(2, 4, "reset", 0.2, np.random.default_rng(0))
    buf = ReplayBuffer(30, **options)
    fill(buf, envs, 40)
    if prioritized:
        buf.update_priority(torch.arange(30), torch.rand(30, dtype=torch.float64))
    buf.save(tmp_path / "ckpt")
    restored = ReplayBuffer.load(tmp_path / "ckpt")
    twin = Envs(2, 4, "reset", 0.2, np.random.default_rng(1))
    twin.stacks = [deque(s, maxlen=4) for s in envs.stacks]
    twin.rng = np.random.default_rng(7)
    envs.rng = np.random.default_rng(7)
    for _ in range(3):
        a, b = buf.sample(8), restored.sample(8)
        for name in ("index", "obs", "next_obs", "reward", "discount", "weight", "terminated", "truncated"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
        fill(buf, envs, 5)  # the open episodes continue in the restored buffer too
        fill(restored, twin, 5)


def test_an_observation_that_breaks_its_stream_is_refused_and_nothing_changes() -> None:
    buf = ReplayBuffer(10, obs_shape=(2, 1), action_shape=(), frame_stack=2, seed=0)
    buf.add(torch.tensor([[1.0], [1.0]]), 0.0, 1.0, torch.tensor([[1.0], [2.0]]), False, truncated=False)
    before = buf.state_dict()
    with pytest.raises(StreamError, match=r"obs: env 0's observation differs from the next_obs.*first\)$"):
        # frame stacks need the compact layout: no 'build it with compact=False' (refused for them)
        buf.add(torch.tensor([[1.0], [3.0]]), 0.0, 1.0, torch.tensor([[3.0], [4.0]]), False, truncated=False)
    with pytest.raises(StreamError, match=r"next_obs: env 0's stack is not obs shifted by one frame"):
        buf.add(torch.tensor([[1.0], [2.0]]), 0.0, 1.0, torch.tensor([[9.0], [4.0]]), False, truncated=False)
    after = buf.state_dict()
    assert after["size"] == before["size"] and after["write_count"] == before["write_count"]
    assert torch.equal(after["extra"]["streams"]["expected"], before["extra"]["streams"]["expected"])
    buf.add(torch.tensor([[1.0], [2.0]]), 0.0, 1.0, torch.tensor([[2.0], [4.0]]), True, truncated=False)
    with pytest.raises(StreamError, match=r"starts an episode .* expected the older frames of its stack to be "
                                          r"its first frame \(padding_type='reset'\)"):
        buf.add(torch.tensor([[0.0], [5.0]]), 0.0, 1.0, torch.tensor([[5.0], [6.0]]), False, truncated=False)


def test_a_next_step_reset_step_added_by_hand_is_refused_naming_the_recorder() -> None:
    """CleanRL's loop adds every step of NEXT_STEP envs: the reset step (final stack, then a reset one) is no
    transition, and the refusal says how to leave it out."""
    buf = ReplayBuffer(10, obs_shape=(2, 1), action_shape=(), frame_stack=2, seed=0)
    buf.add(torch.tensor([[1.0], [1.0]]), 0.0, 1.0, torch.tensor([[1.0], [2.0]]), False, truncated=True)
    with pytest.raises(StreamError, match=r"if env 0's previous step ended its episode, this is the reset step of "
                                          r"gymnasium's NEXT_STEP autoreset .* rlbuf\.gym\.Recorder.* env_mask="), \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        buf.add(torch.tensor([[1.0], [2.0]]), 0.0, 0.0, torch.tensor([[5.0], [5.0]]), False, truncated=False)
    # warned first; the refusal says it again, where the traceback is
    assert [warning.category for warning in caught] == [NextStepResetWarning]
    assert len(buf) == 1


@pytest.mark.parametrize("num_envs", [1, 2])
def test_a_step_refused_by_its_stream_or_another_field_changes_nothing_and_the_stream_is_named_first(
        num_envs: int) -> None:
    """The other fields are read after the stream check and before the record, and written between them: a
    refused action leaves the tables, the counters and the open stacks as they were; a step whose stack breaks its
    stream is refused for that first, whatever else it gets wrong, as when the check ran before the reads."""
    buf = ReplayBuffer(10, obs_shape=(2, 3), action_shape=(), num_envs=num_envs, frame_stack=2, obs_dtype=torch.uint8,
                       seed=0)
    def stack(*frames: int) -> np.ndarray:  # each env's stack of frames filled with these values
        return np.broadcast_to(np.array(frames, np.uint8)[:, None], (num_envs, 2, 3)).copy()

    flags = np.zeros(num_envs, np.bool_)
    buf.add(stack(1, 1), np.zeros(num_envs), np.ones(num_envs), stack(1, 2), flags, truncated=flags)
    before = buf.state_dict()
    with pytest.raises(DtypeError, match=r"action"):
        buf.add(stack(1, 2), np.full(num_envs, "a"), np.ones(num_envs), stack(2, 3), flags, truncated=flags)
    with pytest.raises(StreamError, match=r"obs: env 0's observation differs"):
        buf.add(stack(5, 5), np.full(num_envs, "a"), np.ones(num_envs), stack(5, 6), flags, truncated=flags)
    after = buf.state_dict()
    assert (after["size"], after["write_count"], after["cursor"]) == (before["size"], before["write_count"],
                                                                      before["cursor"])
    for name, table in before["extra"]["streams"].items():
        if name != "finals":
            assert torch.equal(after["extra"]["streams"][name], table), name
    buf.add(stack(1, 2), np.zeros(num_envs), np.ones(num_envs), stack(2, 3), flags, truncated=flags)
    assert len(buf) == 2 * num_envs


def test_after_clear_a_step_in_mid_episode_is_refused_with_the_fix() -> None:
    buf = ReplayBuffer(10, obs_shape=(2, 1), action_shape=(), frame_stack=2, seed=0)
    buf.add(torch.tensor([[1.0], [1.0]]), 0.0, 1.0, torch.tensor([[1.0], [2.0]]), False, truncated=False)
    buf.clear()
    with pytest.raises(StreamError, match=r"after clear\(\), each env's next step starts an episode: reset the envs"):
        buf.add(torch.tensor([[1.0], [2.0]]), 0.0, 1.0, torch.tensor([[2.0], [3.0]]), False, truncated=False)
    buf.add(torch.tensor([[5.0], [5.0]]), 0.0, 1.0, torch.tensor([[5.0], [6.0]]), False, truncated=False)  # a reset
    assert len(buf) == 1


def test_options_are_checked() -> None:
    with pytest.raises(ConfigError, match=r"obs_shape: with frame_stack=4 the first dim holds the stack.*"
                                          r"SB3's VecFrameStack\) goes in stack first: wrap the VecEnv in VecTransposeImage"):
        ReplayBuffer(10, obs_shape=(84, 84, 4), action_shape=(), frame_stack=4)
    with pytest.raises(ConfigError, match=r"expected \(4, ...\), got \(84, 84, 3\)$"):  # no stack last: no hint
        ReplayBuffer(10, obs_shape=(84, 84, 3), action_shape=(), frame_stack=4)
    with pytest.raises(ConfigError, match="need compact=True"):
        ReplayBuffer(10, obs_shape=(3,), action_shape=(), n_step=3, compact=False)
    with pytest.raises(ConfigError, match=r"gamma: expected a number in \[0, 1\], got 1.5"):
        ReplayBuffer(10, obs_shape=(3,), action_shape=(), gamma=1.5)
    with pytest.raises(ConfigError, match="padding_type: expected 'reset' or 'zero'"):
        ReplayBuffer(10, obs_shape=(2, 3), action_shape=(), frame_stack=2, padding_type="same")  # type: ignore[arg-type]


def test_compact_buffer_refuses_torchrl_handles_epochs_and_incomplete_indices() -> None:
    buf = ReplayBuffer(10, obs_shape=(3,), action_shape=(), compact=True, seed=0)
    buf.add(torch.zeros(3), 0.0, 1.0, torch.ones(3), False, truncated=False)
    with pytest.raises(ConfigError, match="torchrl: this buffer stores next_obs once"):
        _ = buf.torchrl
    with pytest.raises(ConfigError, match="epochs: not available for a compact buffer"):
        buf.epochs(batch_size=1)
    with pytest.raises(StoredIndexError, match="index: the transition at position 0 is not complete"):
        buf.sample_by_index(0)
    buf.add(torch.ones(3), 0.0, 2.0, torch.full((3,), 2.0), False, truncated=False)
    assert buf.sample_by_index(0, fields=["next_obs", "discount"]).next_obs.tolist() == [[1.0, 1.0, 1.0]]


def test_extend_needs_a_batch_that_tells_envs_apart() -> None:
    buf = ReplayBuffer(10, obs_shape=(3,), action_shape=(), num_envs=2, compact=True)
    td = TensorDict({"observation": torch.zeros(6, 3), "action": torch.zeros(6),
                     "next": {"observation": torch.zeros(6, 3), "reward": torch.zeros(6),
                              "terminated": torch.zeros(6, dtype=torch.bool), "truncated": torch.zeros(6, dtype=torch.bool)}}, batch_size=[6])
    with pytest.raises(ShapeError, match=r"td: .* needs batch size \(2, T\)"):
        buf.extend(td)
    assert len(buf) == 0


def test_bytes_per_transition_of_atari_stacks_is_one_frame() -> None:
    atari = dict(obs_shape=(4, 84, 84), action_shape=(), obs_dtype=torch.uint8, action_dtype=torch.int64)
    frame = 84 * 84
    compact = ReplayBuffer.bytes_per_transition(**atari, frame_stack=4, n_step=3, episode_length=500)
    assert frame < compact <= 1.02 * frame
    assert ReplayBuffer.bytes_per_transition(**atari, compact=False) > 8 * frame


def test_repr_and_inspect_show_the_estimate(tmp_path: Path) -> None:
    from rlbuf._inspect import format_report, inspect_checkpoint

    buf = ReplayBuffer(10, obs_shape=(4, 84, 84), action_shape=(), obs_dtype=torch.uint8,
                       action_dtype=torch.int64, frame_stack=4)
    assert "compact=True, frame_stack=4, n_step=1, bytes_per_transition~7.121 kB" in repr(buf)
    buf.save(tmp_path / "ckpt")
    assert "memory      about 7,121 bytes per row (estimate)" in format_report(inspect_checkpoint(tmp_path / "ckpt"))


@settings(max_examples=30, deadline=None)
@given(scenario=scenarios(), calls=st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=5), min_size=1,
                                            max_size=12))
def test_rows_of_any_subset_of_envs_in_any_interleaving_are_followed_per_env(
        scenario: dict[str, Any], calls: list[list[int]]) -> None:
    """The stream bookkeeping takes an env id per row (an add may carry any envs' steps, an env twice)."""
    num_envs = scenario["num_envs"]
    envs = Envs(num_envs, scenario["frame_stack"], scenario["padding_type"], scenario["end_chance"],
                np.random.default_rng(scenario["seed"]))
    obs_shape = (scenario["frame_stack"], *FRAME) if scenario["frame_stack"] > 1 else FRAME
    capacity = scenario["capacity"]
    buf = ReplayBuffer(capacity, obs_shape=obs_shape, action_shape=(), num_envs=num_envs, obs_dtype=torch.uint8,
                       frame_stack=scenario["frame_stack"], padding_type=scenario["padding_type"],
                       n_step=scenario["n_step"], gamma=scenario["gamma"], compact=True, seed=0)
    compact = buf._compact
    assert compact is not None
    written: list[Step] = []
    for call in calls:
        steps = [envs.step_one(env % num_envs) for env in call]
        written += steps
        rows = len(steps)

        def store(frames: torch.Tensor, terminated: torch.Tensor, truncated: torch.Tensor,
                  steps: list[Step] = steps, rows: int = rows) -> Callable[[], None]:
            values = {"obs": frames, "action": torch.tensor([float(s.action) for s in steps]),
                      "reward": torch.tensor([s.reward for s in steps]), "terminated": terminated, "truncated": truncated}
            return buf._ring.prepared([values[spec.name] for spec in buf._ring.input_specs], rows, given="extend")

        compact.write(torch.stack([s.obs for s in steps]), torch.stack([s.next_obs for s in steps]),
                      torch.tensor([s.terminated for s in steps]), torch.tensor([s.truncated for s in steps]),
                      np.array([s.env for s in steps], np.int64), store)
        expected = reference(written, capacity, scenario["frame_stack"], scenario["n_step"], scenario["gamma"])
        if expected:
            everything = buf.sample_all()
            assert sorted(serial_of(p, len(written), capacity) for p in everything.index.tolist()) == sorted(expected)
            check_batch(everything, expected, len(written), capacity)


def test_a_collector_batch_whose_next_observation_breaks_the_stream_is_refused() -> None:
    buf = ReplayBuffer(10, obs_shape=(3,), action_shape=(), num_envs=2, compact=True)
    obs = torch.arange(12, dtype=torch.float32).reshape(2, 2, 3)
    next_obs = obs + 100  # not the next step's observation, and no episode ended
    td = TensorDict({"observation": obs, "action": torch.zeros(2, 2),
                     "next": {"observation": next_obs, "reward": torch.zeros(2, 2),
                              "terminated": torch.zeros(2, 2, dtype=torch.bool), "truncated": torch.zeros(2, 2, dtype=torch.bool)}}, batch_size=[2, 2])
    with pytest.raises(StreamError, match="obs: env 0's observation differs from the next_obs"):
        buf.extend(td)
    assert len(buf) == 0
    td["next", "observation"][:, 0] = obs[:, 1]  # consistent now: step 1 follows step 0 in each env
    buf.extend(td)
    assert torch.equal(buf.sample_all().next_obs, torch.stack([obs[0, 1], obs[1, 1]]))


@pytest.mark.parametrize("layout", [dict(compact=True), dict(frame_stack=2), dict(n_step=3)])
def test_compact_layout_refuses_hidden_states_and_dict_observations_without_an_image(layout: dict[str, Any]) -> None:
    dict_obs = dict(obs_shape={"camera": (2, 3), "proprio": (4,)}, action_shape=())  # float32: no uint8 image
    stack = (2, 3) if "frame_stack" not in layout else (2, 2, 3)
    hidden = dict(obs_shape=stack, action_shape=(), hidden_state_shape={"h": (1, 8), "c": (1, 8)})
    for options, message in ((dict_obs, "compact_key: the compact layout stores one image key of a dict observation"),
                             (hidden, "compact, frame_stack, n_step: the compact layout stores no hidden states; "
                                      "got hidden_state_shape")):
        with pytest.raises(ConfigError, match=message):
            ReplayBuffer(10, **options, **layout)
        with pytest.raises(ConfigError, match=message):
            ReplayBuffer.bytes_per_transition(**options, **layout)
        assert not ReplayBuffer(10, **options).compact  # the default layout for them: next_obs stored
    with pytest.raises(ConfigError, match="sample_sequences: not available for a compact buffer"):
        ReplayBuffer(10, obs_shape=stack, action_shape=(), **layout).sample_sequences(1, 1)


def test_sample_sequences_refuses_a_compact_buffer_and_leaves_its_generator_alone() -> None:
    options = dict(obs_shape=(2, *FRAME), action_shape=(), num_envs=2, obs_dtype=torch.uint8, frame_stack=2,
                   seed=5)
    buf, twin = ReplayBuffer(20, **options), ReplayBuffer(20, **options)
    envs = Envs(2, 2, "reset", 0.2, np.random.default_rng(0))
    rounds = [envs.step() for _ in range(8)]
    add_steps(buf, rounds, use_extend=False)
    add_steps(twin, rounds, use_extend=False)
    with pytest.raises(ConfigError, match="sample_sequences: not available for a compact buffer"):
        buf.sample_sequences(2, 3)
    assert torch.equal(buf.sample(8).index, twin.sample(8).index)


def test_the_seed_alone_decides_the_samples_of_a_compact_buffer() -> None:
    envs = Envs(2, 4, "zero", 0.2, np.random.default_rng(0))
    rounds = [envs.step() for _ in range(20)]
    options = dict(obs_shape=(4, *FRAME), action_shape=(), num_envs=2, obs_dtype=torch.uint8, frame_stack=4,
                   padding_type="zero", n_step=3, prioritized=True)
    draws = []
    for seed in (11, 11, 12):
        buf = ReplayBuffer(16, **options, seed=seed)
        add_steps(buf, rounds, use_extend=False)
        draws.append(torch.cat([buf.sample(32).index for _ in range(3)]))
    assert torch.equal(draws[0], draws[1])
    assert not torch.equal(draws[0], draws[2])


def test_the_estimate_counts_dict_observations_and_hidden_states(tmp_path: Path) -> None:
    from rlbuf._inspect import inspect_checkpoint

    flags = 1 + 1 + 1  # terminated, truncated, done
    cases = [  # (options, bytes: obs + next_obs + action + reward + flags (+ hidden state))
        (dict(obs_shape={"camera": (2, 3), "proprio": (4,)}, obs_dtype={"camera": torch.uint8}, action_shape=()),
         2 * (6 + 16) + 4 + 4 + flags),
        (dict(obs_shape=(3,), action_shape=(), hidden_state_shape={"h": (1, 8), "c": (1, 8)}),
         2 * 12 + 4 + 4 + flags + 2 * 32),
    ]
    for i, (options, expected) in enumerate(cases):
        buf = ReplayBuffer(10, **options)
        assert ReplayBuffer.bytes_per_transition(**options) == expected
        assert f"bytes_per_transition~{expected} B" in repr(buf)
        buf.save(tmp_path / str(i))
        assert inspect_checkpoint(tmp_path / str(i))["bytes_per_transition"] == expected


def test_env_mask_on_a_compact_buffer_stores_the_kept_envs_rows() -> None:
    """The kept rows continue their envs' streams (tests/test_gym.py checks it against a naive buffer)."""
    buf = ReplayBuffer(10, obs_shape=(2, 1), action_shape=(), num_envs=2, frame_stack=2, seed=0)
    stacks = torch.tensor([[[0.0], [0.0]], [[5.0], [5.0]]])
    after = torch.tensor([[[0.0], [1.0]], [[5.0], [6.0]]])
    buf.add(stacks, torch.zeros(2), torch.ones(2), after, torch.tensor([False, True]),
            env_mask=torch.tensor([False, True]), truncated=False)
    assert len(buf) == 1 and torch.equal(buf.sample_all().next_obs, after[1:])
