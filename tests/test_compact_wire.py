"""rlbuf._compact_wire: a compact buffer's batch sent as distinct frames and rebuilt on the learner is, bit for
bit, the batch its own ``sample`` draws with the same seed: raw and compressed frames, across wraps, episode
ends, truncations, both padding types, n-step, dict observations, and a dictionary sent once."""

from __future__ import annotations

import dataclasses
import pickle
from typing import Any

import numpy as np
import pytest
import torch
from _stacked_envs import FRAME, STATE, Envs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensordict import TensorDictBase

import rlbuf._frames as frames_module
from rlbuf import ConfigError, EmptyBufferError, ReplayBuffer, ReplyError
from rlbuf._compact_wire import (
    FrameDecoders,
    FramePayload,
    frame_geometry,
    put_frames,
    rebuild,
    sample_wire,
)
from rlbuf.batches import ReplayBatch


def frozen(value: Any) -> Any:
    """``value`` with every tensor as (dtype, shape, bytes): equal means bit for bit equal."""
    if isinstance(value, TensorDictBase):
        return {str(key): frozen(leaf) for key, leaf in value.items(include_nested=True, leaves_only=True)}
    if isinstance(value, torch.Tensor):
        tensor = value.detach().contiguous()
        return (str(tensor.dtype), tuple(tensor.shape), tensor.view(torch.uint8).numpy().tobytes())
    if isinstance(value, dict):
        return {key: frozen(item) for key, item in value.items()}
    if isinstance(value, list):
        return [frozen(item) for item in value]
    if dataclasses.is_dataclass(value):
        return {field.name: frozen(getattr(value, field.name)) for field in dataclasses.fields(value)}
    return value


def make(num_envs: int, frame_stack: int, n_step: int, padding_type: str, dtype: torch.dtype, dict_obs: bool,
         capacity: int, **options: Any) -> ReplayBuffer:
    image = (frame_stack, *FRAME) if frame_stack > 1 else FRAME
    if dict_obs:
        state = (frame_stack, *STATE) if frame_stack > 1 else STATE
        obs: dict[str, Any] = {"obs_shape": {"image": image, "state": state}, "obs_dtype": {"image": dtype}}
    else:
        obs = {"obs_shape": image, "obs_dtype": dtype}
    return ReplayBuffer(capacity, **obs, action_shape=(), action_dtype=torch.int64, num_envs=num_envs,
                        frame_stack=frame_stack, n_step=n_step, padding_type=padding_type, compact=True, seed=3,
                        **options)


def rebuilt(buffer: ReplayBuffer, batch_sizes: list[int], decoders: FrameDecoders) -> Any:
    """The batches ``sample_wire`` draws, their frames rebuilt together (one merged batch's frames)."""
    drawn = [sample_wire(buffer, size, known=decoders.known) for size in batch_sizes]
    obs, next_obs = rebuild([payload for _, payload in drawn], decoders)
    starts = np.cumsum([0, *batch_sizes])
    batches = []
    for (batch, payload), low, high in zip(drawn, starts[:-1], starts[1:], strict=True):
        fields = {"obs": batch.obs, "next_obs": batch.next_obs}
        put_frames(fields, payload.path, obs[low:high], next_obs[low:high])
        batches.append(dataclasses.replace(batch, **fields))
    return batches


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frame_stack=st.sampled_from([1, 2, 4]), n_step=st.sampled_from([1, 2, 3]),
       padding_type=st.sampled_from(["reset", "zero"]), compression=st.sampled_from([None, "zstd", "lz4"]),
       prioritized=st.booleans(), num_envs=st.sampled_from([2, 3]), capacity=st.integers(6, 24),
       float_frames=st.booleans(), dict_obs=st.booleans(),
       ends=st.lists(st.lists(st.sampled_from([0, 0, 0, 0, 1, 2]), min_size=3, max_size=3), min_size=4, max_size=40),
       batch_sizes=st.lists(st.integers(1, 12), min_size=1, max_size=3))
def test_the_rebuilt_batch_is_the_buffers_own_sample(frame_stack: int, n_step: int, padding_type: str,
                                                     compression: str | None, prioritized: bool, num_envs: int,
                                                     capacity: int, float_frames: bool, dict_obs: bool,
                                                     ends: list[list[int]], batch_sizes: list[int]) -> None:
    dtype = torch.float32 if float_frames and not dict_obs else torch.uint8
    shape = (num_envs, frame_stack, n_step, padding_type, dtype, dict_obs, capacity)
    options = {"compression": compression, "prioritized": prioritized}
    local, shard = make(*shape, **options), make(*shape, **options)
    envs = Envs(num_envs, frame_stack, padding_type, dtype, dict_obs, seed=capacity)
    decoders = FrameDecoders(frame_geometry(shard))  # honest payloads match what the shard says it sends
    for t, step_ends in enumerate(ends):
        step = envs.step(step_ends[:num_envs])
        local.add(*step[:5], truncated=step[5])
        shard.add(*step[:5], truncated=step[5])
        if t % 3 != 2:
            continue
        try:
            expected = [local.sample(size) for size in batch_sizes]
        except EmptyBufferError:
            with pytest.raises(EmptyBufferError):
                sample_wire(shard, batch_sizes[0], known=decoders.known)
            continue
        got = rebuilt(shard, batch_sizes, decoders)
        assert frozen(got) == frozen(expected)
        if prioritized:
            for buffer, batches in ((local, expected), (shard, got)):
                for batch in batches:
                    buffer.update_priority(batch.index, batch.reward.abs() + batch.index.float() * 0.01 + 0.1)


def test_a_trained_dictionary_travels_once_and_is_cached_by_its_id(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(frames_module, "DICTIONARY_AFTER", 40)
    shape = (2, 4, 3, "reset", torch.uint8, False, 64)
    local, shard = make(*shape, compression="zstd"), make(*shape, compression="zstd")
    envs = Envs(2, 4, "reset", torch.uint8, False, seed=0)
    for t in range(60):
        step = envs.step([1 if t % 11 == 10 else 0, 2 if t % 17 == 16 else 0])
        local.add(*step[:5], truncated=step[5])
        shard.add(*step[:5], truncated=step[5])
    assert shard._compact is not None and shard._compact.log is not None and shard._compact.log.codec.dictionary
    decoders = FrameDecoders()
    _, first = sample_wire(shard, 16, known=decoders.known)
    assert first.dictionary == shard._compact.log.codec.dictionary and first.blobs is not None
    rebuild([first], decoders)
    assert decoders.known == [first.dictionary_id]
    batch, second = sample_wire(shard, 16, known=decoders.known)
    assert second.dictionary is None and second.dictionary_id == first.dictionary_id   # sent once
    obs, next_obs = rebuild([second], decoders)
    local.sample(16)
    expected = local.sample(16)
    assert frozen(dataclasses.replace(batch, obs=obs, next_obs=next_obs)) == frozen(expected)
    with pytest.raises(ConfigError, match=f"compressed with dictionary {second.dictionary_id}, which this learner"):
        rebuild([second], FrameDecoders())


def test_a_buffer_that_stores_next_obs_with_each_row_is_refused() -> None:
    plain = ReplayBuffer(8, obs_shape=(2,), action_shape=())
    plain.add(torch.zeros(2), 0.0, 0.0, torch.ones(2), False, truncated=False)
    with pytest.raises(ConfigError, match="sample_wire: expected a compact buffer"):
        sample_wire(plain, 4, known=())


def test_the_payload_holds_each_distinct_frame_once() -> None:
    """A batch of one transition drawn many times: its frames travel once; 256 Atari-like transitions
    spanning 7 frames each need 7 frames each at most, not 8."""
    shape = (2, 4, 3, "reset", torch.uint8, False, 64)
    buffer = make(*shape)
    envs = Envs(2, 4, "reset", torch.uint8, False, seed=0)
    for _ in range(40):
        buffer.add(*envs.step([0, 0])[:5], truncated=torch.zeros(2, dtype=torch.bool))
    batch, payload = sample_wire(buffer, 256, known=())
    assert payload.frames is not None and isinstance(batch, ReplayBatch)
    assert len(payload.frames) == len(np.unique(payload.sources)) <= 2 * 40
    # As Ray hands it over: unpickled (protocol 5, the arrays out of band), its arrays read-only.
    sent = pickle.loads(pickle.dumps(payload, protocol=5))
    sent.frames.flags.writeable = False
    assert [torch.equal(a, b) for a, b in zip(rebuild([sent], FrameDecoders()), rebuild([payload], FrameDecoders()),
                                              strict=True)] == [True, True]


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_the_learners_merge_of_two_shards_replies_rebuilds_each_shards_batch(compression: str | None) -> None:
    """What ``ReplayService`` does with its shards' replies (``rlbuf._ray_batches``), without Ray: dict
    observations, two shards' payloads rebuilt into one batch, global indices, prioritized weights."""
    from rlbuf._ray_batches import batch_of, merged_fields
    from rlbuf._ray_wire import fields_of, to_wire

    shape = (2, 4, 3, "zero", torch.uint8, True, 32)
    shards = [make(*shape, compression=compression, prioritized=True) for _ in range(2)]
    twins = [make(*shape, compression=compression, prioritized=True) for _ in range(2)]
    for k, envs in enumerate([Envs(2, 4, "zero", torch.uint8, True, seed=k) for k in range(2)]):
        for t in range(20):
            step = envs.step([1 if t % 6 == 5 else 0, 2 if t % 9 == 8 else 0])
            for buffer in (shards[k], twins[k]):
                buffer.add(*step[:5], truncated=step[5])
    decoders = FrameDecoders(frame_geometry(shards[0]))
    replies = []
    for shard in shards:
        batch, payload = sample_wire(shard, 8, known=decoders.known)
        replies.append({"fields": to_wire(fields_of(batch)), "stats": {"smallest": 1.0}, "frames": payload})
    merged = batch_of(merged_fields([(0, 8), (1, 8)], replies, shard_capacity=32, weights=(1.0, 0.4),
                                    decoders=decoders), torch.device("cpu"))
    expected = [twin.sample(8) for twin in twins]
    for k, batch in enumerate(expected):
        part = slice(8 * k, 8 * (k + 1))
        for name in ("obs", "next_obs"):
            assert frozen(getattr(merged, name)[part]) == frozen(getattr(batch, name))
        for name in ("action", "reward", "discount", "terminated", "truncated", "done", "weight"):
            assert frozen(getattr(merged, name)[part]) == frozen(getattr(batch, name)), name
        assert torch.equal(merged.index[part], batch.index + 32 * k)


def forged(payload: FramePayload, frame: bytes | None = None, **changes: Any) -> FramePayload:
    """``payload`` with its first frame's bytes replaced by ``frame`` and its other parts by ``changes``."""
    if frame is not None:
        assert payload.blobs is not None and payload.lengths is not None
        first = int(payload.lengths[0])
        lengths = payload.lengths.copy()
        lengths[0] = len(frame)
        changes.update(blobs=np.concatenate((np.frombuffer(frame, np.uint8), payload.blobs[first:])), lengths=lengths)
    return dataclasses.replace(payload, **changes)


def zstd_frame(data: bytes, *, content_size: bool) -> bytes:
    import zstandard

    frame: bytes = zstandard.ZstdCompressor(write_content_size=content_size).compress(data)
    return frame


def lz4_block(data: bytes) -> bytes:
    import lz4.block

    block: bytes = lz4.block.compress(data, store_size=False)
    return block


def wrapping_lengths(payload: FramePayload) -> FramePayload:
    """Lengths whose int64 sum wraps around to the bytes sent: frame 1 of 2**63 - 1 bytes (its end wraps negative,
    inside the bytes by a signed comparison), an unnamed frame 2 of the rest (negative)."""
    assert payload.blobs is not None and payload.lengths is not None
    first, huge = int(payload.lengths[0]), 2**63 - 1
    rest = (len(payload.blobs) - first - huge + 2**63) % 2**64 - 2**63  # as int64 arithmetic wraps
    sources = np.where(payload.sources == -1, -1, payload.sources % 2).astype(np.int32)
    return forged(payload, lengths=np.array([first, huge, rest], np.int64), sources=sources)


FORGERIES: dict[str, tuple[str, Any, str]] = {
    # name: (compression, the forgery of a sampled payload, what the error says)
    "a zstd header giving 64 MB": ("zstd", lambda p: forged(p, zstd_frame(bytes(1 << 26), content_size=True)),
                                   "do not decompress to frames of 6 bytes"),
    "a zstd frame of 5 bytes": ("zstd", lambda p: forged(p, zstd_frame(bytes(5), content_size=False)),
                                "do not decompress to frames of 6 bytes"),
    "a zstd frame of 7 bytes": ("zstd", lambda p: forged(p, zstd_frame(bytes(7), content_size=False)),
                                "do not decompress to frames of 6 bytes"),
    "bytes that are no zstd frame": ("zstd", lambda p: forged(p, b"garbage!"), "do not decompress"),
    "an lz4 block of 64 KB": ("lz4", lambda p: forged(p, lz4_block(bytes(1 << 16))), "not a lz4 frame of 6 bytes"),
    "lengths that overrun the bytes": ("zstd", lambda p: forged(p, lengths=p.lengths + 1),
                                       "lengths adding up to"),
    "lengths whose sum wraps around": ("zstd", wrapping_lengths, r"expected 1 to \d+ \(the bytes sent\)"),
    "lz4 lengths whose sum wraps around": ("lz4", wrapping_lengths, r"expected 1 to \d+ \(the bytes sent\)"),
    "a slot naming a frame not sent": ("zstd", lambda p: forged(p, sources=p.sources + 1000),
                                       "slots naming frames"),
    "raw frames of another size": (None, lambda p: forged(p, frames=p.frames[:, :-1]), "raw frames of shape"),
    "a raw slot naming a frame not sent": (None, lambda p: forged(p, sources=p.sources * 0 + len(p.frames)),
                                           "slots naming frames"),
    "frames of 1,000,000 x 1,000,000": ("zstd", lambda p: forged(p, frame_shape=(10**6, 10**6)),
                                        r"frame_stack\) \(\(\), \(1000000, 1000000\), 'uint8', 4\), expected"),
    "raw frames of 1,000,000 x 1,000,000": (None, lambda p: forged(p, frame_shape=(10**6, 10**6)), "expected"),
    "stacks of 5": ("zstd", lambda p: forged(p, sources=np.concatenate((p.sources, p.sources[:, :, :1]), axis=2)),
                    r"\(\(\), \(3, 2\), 'uint8', 5\), expected"),
    "more transitions than the batch's rows": ("zstd", lambda p: forged(p, sources=np.concatenate((p.sources,) * 2, 1)),
                                               r"payloads of \[16\] transitions for batches of \[8\]"),
    "frames of a negative size": ("zstd", lambda p: forged(p, frame_shape=(-3, 2)), "expected"),
    "stacks said unstacked": ("zstd", lambda p: forged(p, stacked=False), r"\(stacked=False\)"),
    "an unknown codec": ("zstd", lambda p: forged(p, codec=("brotli", 3)), "compressed with 'brotli'"),
    "a dictionary its id does not name": ("zstd", lambda p: forged(p, dictionary=b"\x37\xa4\x30\xec" + bytes(60),
                                                                   dictionary_id="0123456789abcdef"),
                                          "a dictionary whose digest is"),
}


@pytest.mark.parametrize("forgery", sorted(FORGERIES))
def test_a_forged_or_corrupted_payload_is_refused_with_a_reply_error(forgery: str) -> None:
    """The learner decodes what a shard sent checked frame by frame (``Codec.decompress_rows``): a frame
    whose header claims 64 MB is refused before any of it is allocated, a frame of another size is not
    placed, slots may only name frames that were sent, and frames or batches other than the receiver
    expects are refused before their stacks are allocated."""
    compression, forge, message = FORGERIES[forgery]
    shape = (2, 4, 3, "reset", torch.uint8, False, 64)
    buffer = make(*shape, compression=compression)
    envs = Envs(2, 4, "reset", torch.uint8, False, seed=0)
    for _ in range(20):
        buffer.add(*envs.step([0, 0])[:5], truncated=torch.zeros(2, dtype=torch.bool))
    _, payload = sample_wire(buffer, 8, known=())
    expected = frame_geometry(buffer)
    assert expected == ((), (3, 2), "uint8", 4)
    rebuild([payload], FrameDecoders(expected), [8])   # the payload as sent is rebuilt
    with pytest.raises(ReplyError, match=message):
        rebuild([forge(payload)], FrameDecoders(expected), [8])


def test_a_receiver_told_no_geometry_still_refuses_frames_of_no_size_or_dtype() -> None:
    buffer = make(2, 4, 3, "reset", torch.uint8, False, 64, compression="zstd")
    envs = Envs(2, 4, "reset", torch.uint8, False, seed=0)
    for _ in range(10):
        buffer.add(*envs.step([0, 0])[:5], truncated=torch.zeros(2, dtype=torch.bool))
    _, payload = sample_wire(buffer, 4, known=())
    for changes in ({"frame_shape": (-3, 2)}, {"frame_shape": (3, 2.0)}, {"dtype": "object"}, {"dtype": "no dtype"}):
        with pytest.raises(ReplyError, match=r"expected positive sizes of a numeric dtype|expected a tuple of int"):
            rebuild([forged(payload, **changes)], FrameDecoders())
