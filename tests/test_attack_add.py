"""Hostile values against the one-row add: tensors whose bytes are not simply their values.

A one-env ``add`` reads a CPU tensor of a field's dtype and shape through its numpy view.
Every input must end as it would through the general paths of the same reader: a twin whose
ring reads each field with ``RowReader.checked``, and a twin whose adds all go the tensor way
(``RowReader.tensor``). All three must store the same bytes and refuse the same inputs with
the same rlbuf error, leaving everything as it was.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from _snapshot import same, snapshot
from hypothesis import given, settings
from hypothesis import strategies as st
from test_staged_add import checked_by_reference, never_staged

from rlbuf import ReplayBuffer, RlbufError

WAYS = ("fast", "reference", "tensor")


def _twin(way: str, buf: ReplayBuffer) -> ReplayBuffer:
    """``buf`` itself (``"fast"``), or made to add the reference way or the tensor way."""
    return {"fast": lambda: buf, "reference": lambda: checked_by_reference(buf), "tensor": lambda: never_staged(buf)}[way]()


def outcome(buf: ReplayBuffer, args: tuple[Any, ...], extras: dict[str, Any]) -> tuple[str, str] | None:
    """``None`` when ``buf`` takes the step, else its rlbuf error; a refused step must change nothing."""
    before = snapshot(buf)
    try:
        buf.add(*args, **extras)
    except RlbufError as error:
        assert same(snapshot(buf), before), f"refused ({error}) but the buffer changed"
        return type(error).__name__, str(error)
    return None


def every_way(make: Callable[[], ReplayBuffer], step: Callable[[], tuple[tuple[Any, ...], dict[str, Any]]],
              ) -> dict[str, Any]:
    """For each way: the step's outcome and the snapshot after it (or the foreign error that escaped)."""
    def run(way: str) -> Any:
        buf = _twin(way, make())
        args, extras = step()
        try:
            return outcome(buf, args, extras), snapshot(buf)
        except Exception as error:  # whatever escapes is the finding
            return "raised", type(error).__name__, str(error)[:200]
    return {way: run(way) for way in WAYS}


def _plain(**options: Any) -> Callable[[], ReplayBuffer]:
    def make() -> ReplayBuffer:
        buf = ReplayBuffer(4, seed=0, **{"obs_shape": (3,), "action_shape": (2,), **options})
        for leaf in buf._ring.leaves.values():  # rows not yet written compare too
            leaf.zero_()
        return buf
    return make


def _step(obs: Any = None, terminated: Any = False, reward: Any = 1.0, **extras: Any,
          ) -> tuple[tuple[Any, ...], dict[str, Any]]:
    obs = torch.arange(3.0) if obs is None else obs
    return (obs, torch.zeros(2), reward, torch.ones(3), terminated, False), extras


# Not tested: a view whose storage was shrunk after the view was made (``untyped_storage().resize_``)
# is a tensor on which torch's own operations (``clone``, ``sum``, ``numpy``) read freed memory or
# crash; rlbuf does not check for it either (docs/reliability.md, "What is not guaranteed").


# -- values whose bytes are not their values ------------------------------------------------
def test_an_int_tensor_with_the_negation_bit_is_stored_by_value() -> None:
    """``torch._neg_view`` of an int tensor holds the bytes of ``x`` and the value ``-x``: every
    way stores the value (a copy of its bytes once stored ``[1, 2]``)."""
    make = _plain(extra_fields={"x": ((2,), torch.int64)})
    results = {way: _twin(way, make()) for way in WAYS}
    for buf in results.values():
        buf.add(*_step()[0], x=torch._neg_view(torch.tensor([1, 2])))
    stored = {way: buf.sample_all().extras["x"].tolist() for way, buf in results.items()}
    assert stored == {way: [[-1, -2]] for way in WAYS}


@pytest.mark.parametrize("form", ["contiguous", "strided", "numpy"])
def test_a_bool_field_stores_zeros_and_ones_whatever_bytes_and_layout_it_is_given(form: str) -> None:
    """A uint8 buffer viewed as bool: every way stores 0/1 (the numpy path, a strided tensor or
    a numpy array, used to store the raw bytes 7 and 255, so the same values were stored
    differently by layout)."""
    raw = np.array([0, 7, 255], np.uint8)
    mask = {"contiguous": lambda: torch.from_numpy(raw.copy()).view(torch.bool),
            "strided": lambda: torch.from_numpy(np.repeat(raw, 2)).view(torch.bool)[::2],
            "numpy": lambda: raw.copy().view(np.bool_)}[form]
    make = _plain(extra_fields={"m": ((3,), torch.bool)})
    for way in WAYS:
        buf = _twin(way, make())
        buf.add(*_step()[0], m=mask())
        assert buf._ring.leaves["m"][0].view(torch.uint8).tolist() == [0, 1, 1], way


LAYOUTS = {
    "sparse-obs": lambda: _step(obs=torch.arange(3.0).to_sparse()),
    "sparse-flag": lambda: _step(terminated=torch.tensor([True]).to_sparse()),
    "csr-obs": lambda: _step(obs=torch.arange(3.0)[None].to_sparse_csr()),
    "mkldnn-obs": lambda: _step(obs=torch.arange(3.0).to_mkldnn()),
    "jagged-obs": lambda: _step(obs=torch.nested.nested_tensor([torch.arange(3.0)], layout=torch.jagged)),
}


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("kind", list(LAYOUTS))
def test_a_tensor_without_strided_cpu_memory_is_refused_by_name_the_same_way_everywhere(kind: str) -> None:
    """The readers used to let torch's own TypeError/RuntimeError out, and the ways disagreed: a
    sparse flag was taken by ``.item()`` on the fast way and refused raw by the reference."""
    results = every_way(_plain(), LAYOUTS[kind])
    for way, result in results.items():
        assert result[0] != "raised", f"{way}: {result}"
        assert result[0] is not None and result[0][0] == "DtypeError", f"{way}: {result}"
    assert results["fast"] == results["reference"] == results["tensor"]


# -- what holds: the fast path stores what the general paths store ---------------------------
def _tensor_forms(values: np.ndarray, batched: bool) -> dict[str, Callable[[], Any]]:
    """One row's values as tensors whose memory may or may not hold the row as it is."""
    shape = ((1,) if batched else ()) + values.shape
    flat = torch.from_numpy(values.reshape(-1).copy())
    dtype = flat.dtype

    def strided_from(source: torch.Tensor) -> torch.Tensor:
        return source.view(shape) if source.is_contiguous() else source.reshape(shape)

    forms: dict[str, Callable[[], Any]] = {
        "plain": lambda: flat.clone().view(shape),
        "offset": lambda: torch.cat([torch.zeros(7, dtype=dtype), flat])[7:].view(shape),
        "every-other": lambda: torch.stack([flat, torch.zeros_like(flat)], 1)[:, 0].view(shape)
        if flat.numel() > 1 else flat.clone().view(shape),
        "reversed": lambda: flat.flip(0).flip(0).view(shape),
        "transposed": lambda: flat.reshape(-1, 1).T.reshape(shape),
        "expanded-first": lambda: flat[:1].expand(flat.numel()).reshape(shape) if flat.numel() else flat.view(shape),
        "column-major": lambda: torch.empty_strided(shape, _column_major(shape), dtype=dtype).copy_(flat.view(shape)),
        "from-numpy-readonly": lambda: torch.from_numpy(_readonly(values.reshape(shape))),
        "misaligned": lambda: torch.from_numpy(_misaligned(values.reshape(shape))),
        "frombuffer": lambda: torch.frombuffer(bytearray(values.tobytes()), dtype=dtype).view(shape)
        if values.size else flat.view(shape),
        "inference": lambda: _in_inference(flat.view(shape)),
        "subclass": lambda: flat.clone().view(shape).as_subclass(_Plain),
        "numpy": lambda: values.reshape(shape).copy(),
        "mixed-list": lambda: values.reshape(shape).tolist(),
        "strided-from": lambda: strided_from(flat.clone()),
    }
    if dtype.is_floating_point:
        forms["requires-grad"] = lambda: flat.clone().view(shape).requires_grad_()
        forms["negated"] = lambda: _negated(flat.view(shape))
        forms["conj-of-real"] = lambda: flat.clone().view(shape).conj()
    return forms


def _column_major(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in shape:
        strides.append(step)
        step *= max(size, 1)
    return tuple(strides)


class _Plain(torch.Tensor):
    """A subclass with nothing added: never exactly a ``torch.Tensor``."""


def _readonly(array: np.ndarray) -> np.ndarray:
    array = array.copy()
    array.setflags(write=False)
    return array


def _misaligned(array: np.ndarray) -> np.ndarray:
    raw = np.zeros(array.nbytes + 1, np.uint8)
    shifted = raw[1:].view(array.dtype).reshape(array.shape) if array.size else array.copy()
    shifted[...] = array
    return shifted


def _in_inference(tensor: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return tensor.clone()


def _negated(tensor: torch.Tensor) -> torch.Tensor:
    """The values of ``tensor`` held as the bytes of ``-tensor`` with the negation bit set."""
    complex_ = torch.complex(torch.zeros_like(tensor, dtype=torch.float32), -tensor.float())
    view = complex_.conj().imag
    return view if tensor.dtype is torch.float32 else view.to(tensor.dtype)


CONFIGS: dict[str, dict[str, Any]] = {
    "float": {"obs_shape": (3,), "action_shape": (2,)},
    "capacity-1": {"capacity": 1, "obs_shape": (3,), "action_shape": (2,)},
    "pixels-uint8": {"obs_shape": (2, 3, 3), "obs_dtype": torch.uint8, "action_shape": ()},
    "float16-int-action": {"obs_shape": (2,), "obs_dtype": torch.float16, "action_shape": (),
                           "action_dtype": torch.int64},
    "float64-obs": {"obs_shape": (1, 2), "obs_dtype": torch.float64, "action_shape": (1,)},
    "dict-obs": {"obs_shape": {"a": (2,), "b": (3,)}, "action_shape": (2,)},
    "extras": {"obs_shape": (3,), "action_shape": (2,),
               "extra_fields": {"x": ((2,), torch.int64), "flag": ((), torch.bool), "u": ((4,), torch.uint8)}},
    "hidden": {"obs_shape": (3,), "action_shape": (2,), "hidden_state_shape": (4,)},
    "prioritized": {"obs_shape": (3,), "action_shape": (2,), "prioritized": True},
    "zero-size": {"obs_shape": (2, 0), "action_shape": (0,)},
    "memmap": {"obs_shape": (3,), "action_shape": (2,), "storage": "memmap"},
}


def _config_buffer(config: str) -> ReplayBuffer:
    """``config``'s buffer with its storage zeroed, so twins compare whole (rows not yet written included)."""
    options = {"capacity": 3, "seed": 0, **CONFIGS[config]}
    buf = ReplayBuffer(options.pop("capacity"), **options)
    for leaf in buf._ring.leaves.values():
        leaf.zero_()
    return buf


@st.composite
def _config_steps(draw: st.DrawFn, config: str) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """Steps for ``config``'s buffer, every tensor-like field in a drawn form."""
    buf_fields = {spec.name: spec for spec in _config_buffer(config)._ring.input_specs}
    steps = []
    for _ in range(draw(st.integers(1, 4))):
        values: dict[str, Any] = {}
        for name, spec in buf_fields.items():
            size = int(np.prod(spec.shape))
            np_dtype = spec.np_dtype
            if np_dtype.kind == "b":
                raw = np.array(draw(st.lists(st.booleans(), min_size=size, max_size=size)), np.bool_)
            elif np_dtype.kind in "iu":
                raw = np.array(draw(st.lists(st.integers(0, 200), min_size=size, max_size=size)), np_dtype)
            else:
                raw = np.array(draw(st.lists(st.floats(-1e4, 1e4, width=16), min_size=size, max_size=size)), np_dtype)
            raw = raw.reshape(spec.shape)
            forms = _tensor_forms(raw, draw(st.booleans()))
            values[name] = forms[draw(st.sampled_from(sorted(forms)))]()
        steps.append(_as_call(config, values))
    return steps


def _as_call(config: str, values: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if config == "dict-obs":
        obs = {key: values.pop(f'obs["{key}"]') for key in ("a", "b")}
        next_obs = {key: values.pop(f'next_obs["{key}"]') for key in ("a", "b")}
        values = {"obs": obs, "next_obs": next_obs, **values}
    args = tuple(values.pop(name) for name in ("obs", "action", "reward", "next_obs", "terminated", "truncated"))
    if "hidden_state" in values:
        args += (values.pop("hidden_state"),)
    return args, values


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("config", list(CONFIGS))
@settings(max_examples=12, deadline=None, derandomize=True, database=None)
@given(data=st.data())
def test_every_tensor_form_is_stored_as_the_reference_ways_store_it(config: str, data: st.DataObject) -> None:
    steps = data.draw(_config_steps(config))
    bufs = {way: _twin(way, _config_buffer(config)) for way in WAYS}
    for args, extras in steps:
        outcomes = {way: outcome(buf, args, extras) for way, buf in bufs.items()}
        assert outcomes["fast"] == outcomes["reference"] == outcomes["tensor"], outcomes
    assert same(snapshot(bufs["fast"]), snapshot(bufs["reference"]))
    assert same(snapshot(bufs["fast"]), snapshot(bufs["tensor"]))


@pytest.mark.parametrize("form", ["contiguous", "channels-last", "channels-last-unbatched", "offset", "flipped"])
def test_an_image_observation_in_any_memory_format_is_stored_as_the_reference_ways_store_it(form: str) -> None:
    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (2, 1, 4, 84, 84), dtype=torch.uint8, generator=generator)
    make = {
        "contiguous": lambda image: image.clone(),
        "channels-last": lambda image: image.contiguous(memory_format=torch.channels_last),
        "channels-last-unbatched": lambda image: image.contiguous(memory_format=torch.channels_last)[0],
        "offset": lambda image: torch.cat([torch.zeros(5, dtype=torch.uint8), image.flatten()])[5:].view(image.shape),
        "flipped": lambda image: image.flip(-1).flip(-1),  # a copy, whatever flip returns
    }[form]
    bufs = {way: _twin(way, _plain(obs_shape=(4, 84, 84), obs_dtype=torch.uint8)()) for way in WAYS}
    for buf in bufs.values():
        buf.add(make(images[0]), torch.zeros(2), 1.0, make(images[1]), False, truncated=False)
        assert buf.sample_all().obs.tolist() == images[0].tolist()
        assert buf.sample_all().next_obs.tolist() == images[1].tolist()
    assert same(snapshot(bufs["fast"]), snapshot(bufs["reference"]))
    assert same(snapshot(bufs["fast"]), snapshot(bufs["tensor"]))


# -- what holds: threads, checkpoints and a handed-out TorchRL buffer --------------------------
def _uid_step(uid: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """A step whose every field carries ``uid``: a stored row mixing two steps shows."""
    value = float(uid)
    return ((torch.full((1, 3), value), torch.full((1, 2), value), value, torch.full((1, 3), value + 0.5),
             torch.tensor([uid % 2 == 0]), torch.tensor([uid % 3 == 0])), {"x": torch.tensor([[uid, -uid]])})


def _assert_rows_whole(batch: Any, uids: set[int]) -> None:
    for i, uid in enumerate(batch.obs[:, 0].tolist()):
        uid = int(uid)
        assert uid in uids
        assert batch.obs[i].tolist() == [uid] * 3 and batch.action[i].tolist() == [uid] * 2
        assert batch.reward[i].item() == uid and batch.next_obs[i].tolist() == [uid + 0.5] * 3
        assert batch.terminated[i].item() == (uid % 2 == 0) and batch.truncated[i].item() == (uid % 3 == 0)
        assert batch.extras["x"][i].tolist() == [uid, -uid]


@pytest.mark.parametrize("handed_out", [False, True])
def test_rows_added_by_several_threads_while_saving_are_stored_and_saved_whole(tmp_path: Path,
                                                                               handed_out: bool) -> None:
    buf = ReplayBuffer(64, obs_shape=(3,), action_shape=(2,), extra_fields={"x": ((2,), torch.int64)}, seed=0)
    if handed_out:
        torchrl = buf.torchrl  # from now on every add is committed at once
    threads, per_thread = 3, 120
    uids = {1000 * t + j for t in range(threads) for j in range(per_thread)}
    start = threading.Barrier(threads + 1)

    def adder(thread: int) -> None:
        start.wait()
        for j in range(per_thread):
            args, extras = _uid_step(1000 * thread + j)
            buf.add(*args, **extras)

    workers = [threading.Thread(target=adder, args=(t,)) for t in range(threads)]
    for worker in workers:
        worker.start()
    start.wait()
    saved = []
    for n in range(3):
        buf.save(tmp_path / f"during-{n}")
        saved.append(tmp_path / f"during-{n}")
    for worker in workers:
        worker.join()
    assert len(buf) == 64 and buf._ring.write_count == threads * per_thread
    _assert_rows_whole(buf.sample_all(), uids)
    for path in saved:
        loaded = ReplayBuffer.load(path)
        if len(loaded):
            _assert_rows_whole(loaded.sample_all(), uids)
    if handed_out:
        assert len(torchrl) == 64
        stored = torchrl.storage[:64]
        for i in range(64):
            uid = int(stored["observation"][i, 0].item())
            assert uid in uids and stored["observation"][i].tolist() == [uid] * 3
            assert stored["action"][i].tolist() == [uid] * 2
            assert stored["next", "observation"][i].tolist() == [uid + 0.5] * 3
