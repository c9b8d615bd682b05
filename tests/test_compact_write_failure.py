"""A compact add whose ring write fails at run time (out of memory, a device error raised by the storage's write,
after every check passed) leaves the buffer exactly as it was: the stream tables are recorded only once the rows are
written (rlbuf/_compact.py, ``CompactLayout.write_rows``), and the same add then succeeds as if nothing happened."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from _snapshot import same, snapshot
from test_pixels import FRAME, Envs

from rlbuf import ReplayBuffer


class _DeviceLost(RuntimeError):
    """What a storage's write may raise mid-training (CUDA out of memory, a lost device)."""


def _buffer(num_envs: int, prioritized: bool) -> ReplayBuffer:
    return ReplayBuffer(6, obs_shape=(2, *FRAME), action_shape=(), num_envs=num_envs, obs_dtype=torch.uint8,
                        frame_stack=2, n_step=2, gamma=0.9, prioritized=prioritized, seed=0)


def _state(buf: ReplayBuffer) -> Any:
    """Its snapshot but what another buffer fed the same holds otherwise: the memory past the stored rows (never
    written), the epoch iterator's identity."""
    frozen = snapshot(buf)
    del frozen["current_epochs"], frozen["storage"]
    return frozen, {name: leaf[:len(buf)].clone() for name, leaf in buf._ring.leaves.items()}


def _same_as_twin(buf: ReplayBuffer, twin: ReplayBuffer) -> bool:
    (mine, rows), (theirs, their_rows) = _state(buf), _state(twin)
    return same(mine, theirs) and rows.keys() == their_rows.keys() and all(
        torch.equal(rows[name], their_rows[name]) for name in rows)


def _fail_every_ring_write(monkeypatch: pytest.MonkeyPatch, buf: ReplayBuffer) -> None:
    def lost(*args: Any, **kwargs: Any) -> None:
        raise _DeviceLost("CUDA error: out of memory")

    for name in ("write_staged", "_write_one", "write_checked", "write"):  # each way a prepared write may take
        monkeypatch.setattr(buf._ring, name, lost)


@pytest.mark.parametrize("prioritized", [False, True], ids=["uniform", "prioritized"])
@pytest.mark.parametrize("way", ["one-env", "two-envs", "env_mask"])
def test_a_failed_ring_write_leaves_the_buffer_as_it_was_and_the_add_then_succeeds(way: str,
                                                                                   prioritized: bool) -> None:
    num_envs = 1 if way == "one-env" else 2
    buf, twin = _buffer(num_envs, prioritized), _buffer(num_envs, prioritized)
    envs = Envs(num_envs, 2, "reset", 0.3, np.random.default_rng(5))  # episode ends: final frames kept aside
    rng = np.random.default_rng(6)
    for _ in range(14):  # past the wrap: overwritten rows free their final frames
        mask = np.array([True, bool(rng.random() < 0.5)]) if way == "env_mask" else None
        idle = envs._obs(envs.stacks[0])  # a left-out env's row is not read: any stack of the right shape
        steps = [envs.step_one(env) if mask is None or mask[env] else None for env in range(num_envs)]
        args: tuple[Any, ...] = (
            torch.stack([idle if s is None else s.obs for s in steps]),
            torch.tensor([0.0 if s is None else float(s.action) for s in steps]),
            torch.tensor([0.0 if s is None else s.reward for s in steps]),
            torch.stack([idle if s is None else s.next_obs for s in steps]),
            torch.tensor([s is not None and s.terminated for s in steps]),
            torch.tensor([s is not None and s.truncated for s in steps]))
        before = snapshot(buf)
        with pytest.MonkeyPatch.context() as monkeypatch:
            _fail_every_ring_write(monkeypatch, buf)
            with pytest.raises(_DeviceLost):
                buf.add(*args, env_mask=mask)
        assert same(snapshot(buf), before)
        buf.add(*args, env_mask=mask)
        twin.add(*args, env_mask=mask)
        assert _same_as_twin(buf, twin)
        if buf._compact.walk(np.arange(len(buf))).complete.any():
            assert torch.equal(buf.sample(4).obs, twin.sample(4).obs)


def test_a_dictionary_training_that_fails_leaves_the_stored_rows_recorded() -> None:
    """Compressed frames: the rows are stored before the dictionary is trained on them; a training that fails
    (out of memory) raises, but the rows stay linked to their streams: the next step continues them and samples
    are a twin's (whose training succeeded)."""
    from rlbuf._frames import DICTIONARY_AFTER

    num_envs = 8
    options: dict[str, Any] = {"obs_shape": (2, *FRAME), "action_shape": (), "num_envs": num_envs,
                               "obs_dtype": torch.uint8, "frame_stack": 2, "n_step": 2, "gamma": 0.9,
                               "compression": "zstd", "seed": 0}
    buf, twin = ReplayBuffer(DICTIONARY_AFTER + 64, **options), ReplayBuffer(DICTIONARY_AFTER + 64, **options)
    envs = Envs(num_envs, 2, "reset", 0.05, np.random.default_rng(1))
    for t in range(DICTIONARY_AFTER // num_envs + 2):
        steps = envs.step()
        args = (torch.stack([s.obs for s in steps]), torch.tensor([float(s.action) for s in steps]),
                torch.tensor([s.reward for s in steps]), torch.stack([s.next_obs for s in steps]),
                torch.tensor([s.terminated for s in steps]), torch.tensor([s.truncated for s in steps]))
        if t == DICTIONARY_AFTER // num_envs - 1:  # this add reaches DICTIONARY_AFTER frames: training is due
            with pytest.MonkeyPatch.context() as monkeypatch:
                monkeypatch.setattr(buf._compact.log, "train", lambda: (_ for _ in ()).throw(MemoryError()))
                with pytest.raises(MemoryError):
                    buf.add(*args)
        else:
            buf.add(*args)
        twin.add(*args)
    assert twin._compact.log.codec.dictionary and not buf._compact.log.codec.dictionary
    mine, theirs = buf.sample_all(), twin.sample_all()
    assert torch.equal(mine.index, theirs.index)
    assert all(torch.equal(getattr(mine, name), getattr(theirs, name))
               for name in ("obs", "next_obs", "action", "reward", "discount", "terminated", "truncated"))
