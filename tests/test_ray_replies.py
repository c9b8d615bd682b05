"""A learner's shard replies forged or corrupted part by part, without Ray: whatever a reply holds in place of what
a shard sends (missing keys, other types, dtypes or shapes, lengths that disagree), the learner's checks and decode
(``check_reply``, ``merged_fields``, ``rebuild``) refuse it with a ``ReplyError`` naming the part, or, where the
forgery is one a shard could have sent, build a batch of the shape the service promised."""

from __future__ import annotations

import copy
import dataclasses
from functools import partial
from typing import Any

import numpy as np
import pytest
import torch
from _stacked_envs import Envs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("ray")

from rlbuf import ConfigError, ReplyError
from rlbuf._compact_wire import FrameDecoders, FramePayload, frame_geometry, rebuild, sample_wire
from rlbuf._ray_batches import check_reply, merged_fields
from rlbuf._ray_shard import ShardHost

ROWS = 8
OPTIONS: dict[str, Any] = {"capacity": 64, "obs_shape": (4, 3, 2), "obs_dtype": torch.uint8, "action_shape": (),
                           "action_dtype": torch.int64, "num_envs": 2, "frame_stack": 4, "n_step": 3}


def filled_shard(compression: str | None, seed: int) -> ShardHost:
    """A compact shard (stacks of four 3x2 frames) that has taken 20 steps of two envs."""
    shard = ShardHost(compression=compression, seed=seed, **OPTIONS)
    envs = Envs(2, 4, "reset", torch.uint8, False, seed=seed)
    for _ in range(20):
        shard.buffer.add(*envs.step([0, 0])[:5], truncated=torch.zeros(2, dtype=torch.bool))
    return shard


SHARDS = {compression: [filled_shard(compression, seed) for seed in range(2)] for compression in (None, "zstd", "lz4")}

# What a forger may put in place of any part: values of every type a reply's parts have, and of others.
JUNK = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 2**40), st.floats(allow_nan=True), st.text(max_size=4),
    st.binary(max_size=8), st.tuples(st.integers(-2, 5), st.integers(-2, 5)), st.lists(st.integers(-2, 5), max_size=3),
    st.tuples(st.sampled_from(["zstd", "lz4", "brotli"]), st.one_of(st.none(), st.integers(-1, 30), st.text(max_size=2))),
    st.builds(np.zeros, st.lists(st.integers(0, 9), max_size=3).map(tuple),
              st.sampled_from(["u1", "i4", "i8", "f4", "f8", "bool", "O"])),
    st.builds(lambda n: torch.zeros(n), st.integers(0, 9)),
    st.dictionaries(st.sampled_from(["a", "index", "size"]), st.integers(0, 3), max_size=2),
)


def refused_or_promised(call: Any) -> Any:
    """``call()``'s result, or ``None`` where it raised ``ReplyError`` (or the ``ConfigError`` of a dictionary the
    learner never received: a payload whose dictionary id names none it holds); any other exception fails."""
    try:
        return call()
    except ReplyError as error:
        assert str(error).startswith(("frames: ", "reply: ")), error   # it names the part that is wrong
    except ConfigError as error:
        assert "which this learner does not hold" in str(error)
    return None


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(compression=st.sampled_from([None, "zstd", "lz4"]), told=st.booleans(),
       changes=st.lists(st.tuples(st.sampled_from([field.name for field in dataclasses.fields(FramePayload)]), JUNK),
                        min_size=1, max_size=3))
def test_a_payload_forged_part_by_part_is_refused_or_rebuilds_the_promised_stacks(
        compression: str | None, told: bool, changes: list[tuple[str, Any]]) -> None:
    """With and without the geometry the shards reported at start (``FrameDecoders(expected)``), as the defect
    was: a payload without its geometry gave a bare TypeError or ValueError, or tried to allocate exabytes."""
    shard = SHARDS[compression][0]
    _, payload = sample_wire(shard.buffer, ROWS, known=())
    forged = dataclasses.replace(payload, **dict(changes))
    stacks = refused_or_promised(lambda: rebuild([forged], FrameDecoders(frame_geometry(shard.buffer) if told else None),
                                                 [ROWS]))
    if stacks is not None and told:
        assert all(part.shape == (ROWS, 4, 3, 2) and part.dtype == torch.uint8 for part in stacks)


def replies(compression: str | None) -> list[dict[str, Any]]:
    """Both shards' replies to a sample of ``ROWS`` rows each, as the learner receives them."""
    return [shard.shard_sample(ROWS, None, []) for shard in SHARDS[compression]]


def merged(answers: list[dict[str, Any]], compression: str | None) -> dict[str, Any]:
    """What ``ReplayService.sample`` makes of two shards' ``answers``: each checked, then merged."""
    for answer in answers:
        check_reply(answer, ROWS)
    return merged_fields([(0, ROWS), (1, ROWS)], answers, shard_capacity=64, weights=(1.0, 0.4),
                         decoders=FrameDecoders(frame_geometry(SHARDS[compression][0].buffer)))


@st.composite
def reply_forgeries(draw: st.DrawFn) -> tuple[list[str | int], Any]:
    """A part of a reply (a path of keys into it) and what replaces it (``...``: the part is left out), or one of
    its arrays cut short or given another dtype."""
    top = draw(st.sampled_from(["fields", "stats", "frames", "whole"]))
    if top == "whole":
        return [], draw(JUNK)
    if top == "stats":
        key = draw(st.sampled_from(["size", "mass", "smallest", "limiter", "write_count", "incarnation", "extra"]))
        return ["stats", key], draw(st.one_of(JUNK, st.just(...)))
    if top == "frames":
        return ["frames"], draw(st.one_of(JUNK, st.just(...)))
    key = draw(st.sampled_from(["obs", "action", "reward", "next_obs", "terminated", "truncated", "done", "index",
                                "weight", "discount", "hidden_state", "extras", "extra"]))
    how = draw(st.sampled_from(["replace", "leave out", "cut", "retype"]))
    if how == "replace":
        return ["fields", key], draw(JUNK)
    if how == "leave out":
        return ["fields", key], ...
    return ["fields", key], how


def forge(reply: dict[str, Any], path: list[str | int], value: Any) -> dict[str, Any]:
    """``reply`` with the part at ``path`` replaced by ``value`` (``...``: left out; ``"cut"``, ``"retype"``: an
    array cut to half its rows, or cast to float64)."""
    if not path:
        return value  # type: ignore[no-any-return]
    forged = copy.deepcopy(reply)
    parent = forged
    for key in path[:-1]:
        parent = parent[key]
    key = path[-1]
    current, change = parent.get(key), value if isinstance(value, str) and value in ("cut", "retype") else None
    if value is ...:
        parent.pop(key, None)
    elif change is None:
        parent[key] = value
    elif isinstance(current, np.ndarray):
        parent[key] = current[:len(current) // 2] if change == "cut" else current.astype(np.float64)
    return forged


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(compression=st.sampled_from([None, "zstd"]), which=st.integers(0, 1), forgery=reply_forgeries())
def test_a_reply_forged_part_by_part_is_refused_with_a_reply_error(
        compression: str | None, which: int, forgery: tuple[list[str | int], Any]) -> None:
    answers = replies(compression)
    answers[which] = forge(answers[which], *forgery)
    fields = refused_or_promised(lambda: merged(answers, compression))
    if fields is not None:
        assert fields["obs"].shape == fields["next_obs"].shape == (2 * ROWS, 4, 3, 2)
        assert fields["index"].shape == (2 * ROWS,)


def test_the_replies_as_sent_are_merged() -> None:
    """The baseline of the two properties above: unforged replies pass every check (raw and compressed frames)."""
    for compression in (None, "zstd", "lz4"):
        fields = merged(replies(compression), compression)
        assert fields["obs"].shape == (2 * ROWS, 4, 3, 2) and fields["weight"].shape == (2 * ROWS,)


@pytest.mark.parametrize(("forgery", "message"), [
    ((["stats", "smallest"], 0.0), "reply: stats smallest 0.0, expected a positive finite float"),
    ((["fields", "action"], "cut"), r"reply: fields action array of int64 \(4,\), expected .* of 8 rows"),
    ((["fields", "index"], ...), "reply: fields .*'discount', 'done', 'extras', 'hidden_state', 'next_obs', 'obs',"),
    ((["fields", "weight"], "retype"), None),  # float64 weights: a kind a shard of another build could send
    ((["frames"], None), r"reply: 1 of 2 shards sent their frames apart"),
    ((["frames"], {"a": 1}), r"frames: \{'a': 1\}, expected a FramePayload"),
    (([], []), r"reply: \[\], expected \['fields', 'frames', 'stats'\]"),
])
def test_each_forgery_is_named(forgery: tuple[list[str | int], Any], message: str | None) -> None:
    answers = replies("zstd")
    answers[1] = forge(answers[1], *forgery)
    if message is None:
        with pytest.raises(ReplyError, match=r"reply: shard 1's weight .* beside .* from shard 0"):
            merged(answers, "zstd")
        return
    with pytest.raises(ReplyError, match=message):
        merged(answers, "zstd")


def test_a_payload_claiming_frames_larger_than_its_bytes_can_hold_is_refused_before_allocating_them() -> None:
    """Without the shards' geometry, frames of 10**12 x 10**6 bytes were allocated (numpy's MemoryError, or an
    allocation the kernel grants); no compressed byte decodes to more than 32 KB."""
    _, payload = sample_wire(SHARDS["zstd"][0].buffer, ROWS, known=())
    with pytest.raises(ReplyError, match="cannot decode to a frame of 1000000000000000000 bytes"):
        rebuild([dataclasses.replace(payload, frame_shape=(10**12, 10**6))], FrameDecoders(), [ROWS])


def zstd_frames(payload: FramePayload, frames: list[bytes]) -> FramePayload:
    """``payload`` with its first ``len(frames)`` compressed frames replaced by ``frames`` (no dictionary)."""
    assert payload.blobs is not None and payload.lengths is not None
    kept = int(payload.lengths[:len(frames)].sum())
    blobs = np.concatenate([np.frombuffer(frame, np.uint8) for frame in frames] + [payload.blobs[kept:]])
    lengths = np.concatenate(([len(frame) for frame in frames], payload.lengths[len(frames):])).astype(np.int64)
    return dataclasses.replace(payload, blobs=blobs, lengths=lengths, dictionary_id="", dictionary=None)


@pytest.mark.parametrize(("sizes", "message"), [
    ((5, 7), "frame 0 decompresses to 5 bytes"),         # two frames whose sizes make up for each other
    ((7, 5), "frame 0 decompresses to more bytes"),
    ((6, 12), "frame 1 decompresses to more bytes"),
    ((6, 0), r"frame \d+ decompresses to 0 bytes"),    # an empty frame adds nothing: the frames run out
])
def test_each_compressed_frame_must_decode_to_one_frame_whatever_the_others_make_up(
        sizes: tuple[int, ...], message: str) -> None:
    """The learner decodes a shard's frames through one stream reader that stops at each frame's end
    (``Codec.decompress_rows``): a frame one byte short beside one a byte long is refused, as a frame
    of the wrong size alone is."""
    import zstandard

    shard = SHARDS["zstd"][0]
    _, payload = sample_wire(shard.buffer, ROWS, known=())
    compressor = zstandard.ZstdCompressor(write_content_size=False)
    frames = [compressor.compress(bytes([7]) * size) for size in sizes]
    decoders = FrameDecoders(frame_geometry(shard.buffer))
    rebuild([zstd_frames(payload, [compressor.compress(bytes([7]) * 6)] * 2)], decoders, [ROWS])  # frames of 6: kept
    with pytest.raises(ReplyError, match=message):
        rebuild([zstd_frames(payload, frames)], decoders, [ROWS])


def test_frames_the_slots_skip_are_not_decoded_and_the_others_are_placed() -> None:
    """A payload whose slots name frames 0 and 2 but not 1 (its frames are then not one after another: they are
    gathered first) rebuilds the slots that named frame 1 as frame 0's."""
    shard = SHARDS["zstd"][0]
    _, payload = sample_wire(shard.buffer, ROWS, known=())
    decoders = FrameDecoders(frame_geometry(shard.buffer))
    obs, next_obs = rebuild([payload], decoders, [ROWS])
    skipping = dataclasses.replace(payload, sources=np.where(payload.sources == 1, 0, payload.sources).astype(np.int32))
    forged_obs, forged_next_obs = rebuild([skipping], decoders, [ROWS])
    both, forged = torch.stack((obs, next_obs)), torch.stack((forged_obs, forged_next_obs))
    named = torch.from_numpy(payload.sources)
    assert (named == 1).any() and torch.equal(forged[named != 1], both[named != 1])
    assert (forged[named == 1] == both[named == 0][0]).all()


@pytest.mark.parametrize("rows", [[2, 0], [0, 2]])
def test_a_frame_too_long_for_the_last_row_of_the_stacks_is_refused(rows: list[int]) -> None:
    """The last row has no byte of room past it in the stacks: it is read through a row of its own that has."""
    from rlbuf._codec import Codec

    codec = Codec("zstd", None)
    good, long = codec.compress(bytes([1]) * 4), codec.compress(bytes([2]) * 8)
    out = bytearray(12)
    for first, second, refused in ((good, good, False), (long, good, True), (good, long, True)):
        arena = np.frombuffer(first + second, np.uint8)
        call = partial(codec.decompress_rows, arena, np.array([0, len(first)]), np.array([len(first), len(second)]),
                       memoryview(out), np.array(rows), 4)
        if refused:
            with pytest.raises(ValueError, match=r"decompresses to more bytes|bytes after frame 1"):
                call()
        else:
            call()
            assert out[rows[0] * 4:rows[0] * 4 + 4] == out[rows[1] * 4:rows[1] * 4 + 4] == bytes([1]) * 4


def test_dict_observation_replies_pass_and_a_followed_key_they_lack_is_refused() -> None:
    """Compact shards of dict observations send ``obs`` as a TensorDict whose followed key is ``[rows, 0]``."""
    options = {**OPTIONS, "obs_shape": {"image": (4, 3, 2), "state": (4, 2)}, "obs_dtype": {"image": torch.uint8},
               "padding_type": "zero"}
    shards = [ShardHost(seed=seed, **options) for seed in range(2)]
    for seed, shard in enumerate(shards):
        envs = Envs(2, 4, "zero", torch.uint8, True, seed=seed)
        for _ in range(20):
            step = envs.step([0, 0])
            shard.buffer.add(*step[:5], truncated=step[5])
    answers = [shard.shard_sample(ROWS, None, []) for shard in shards]
    decoders = FrameDecoders(frame_geometry(shards[0].buffer))
    for answer in answers:
        check_reply(answer, ROWS)
    fields = merged_fields([(0, ROWS), (1, ROWS)], answers, shard_capacity=64, weights=None, decoders=decoders)
    assert fields["obs"]["image"].shape == (2 * ROWS, 4, 3, 2) and fields["next_obs"]["state"].shape == (2 * ROWS, 4, 2)
    answers[1]["fields"]["obs"] = answers[1]["fields"]["obs"].exclude("image")
    with pytest.raises(ReplyError, match="reply: shard 1's obs"):
        merged_fields([(0, ROWS), (1, ROWS)], answers, shard_capacity=64, weights=None, decoders=decoders)
