"""Field names: two fields whose names or TorchRL keys meet are refused when a buffer is built
(``ConfigError`` naming both), and every accepted combination keeps each field's own values
through ``add``, ``extend`` and ``sample_all``."""

from __future__ import annotations

import math
import warnings
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlbuf import ConfigError, DistillationBuffer, NonFiniteError, ReplayBuffer, RolloutBuffer
from rlbuf._device_checks import check_finite_together
from rlbuf.spec import FieldSpec

F32 = torch.float32


@pytest.mark.parametrize(("options", "names"), [
    ({"extra_fields": {"recurrent_state_h": ((2,), F32)}, "hidden_state_shape": {"h": (2,)}},
     ("recurrent_state_h", 'hidden_state["h"]')),
    ({"extra_fields": {"recurrent_state_c": ((2,), F32)}, "hidden_state_shape": {"h": (2,), "c": (2,)}},
     ("recurrent_state_c", 'hidden_state["c"]')),
    ({"extra_fields": {"recurrent_state": ((2,), F32)}, "hidden_state_shape": (2,)},
     ("recurrent_state", "hidden_state")),
    ({"extra_fields": {"hidden_state": ((2,), F32)}, "hidden_state_shape": {"h": (2,)}}, ("hidden_state",)),
    ({"extra_fields": {"hidden_state": ((2,), F32)}}, ("hidden_state", "hidden_state_shape")),
    ({"extra_fields": {"a": ((2,), F32)}, "obs_shape": {"a": (2,), "b": (1,)}}, ('obs["a"]', "a")),
    ({"extra_fields": {"a": ((), F32)}, "obs_shape": {"a": {"b": (2,)}}}, ('obs["a"]["b"]', "a")),
])
@pytest.mark.parametrize("kind", ["replay", "rollout"])
def test_a_name_or_key_collision_is_refused_naming_both_fields(options: dict[str, Any], names: tuple[str, ...],
                                                               kind: str) -> None:
    arguments = {"obs_shape": (3,), "action_shape": (), **options}
    with pytest.raises(ConfigError) as caught:
        if kind == "replay":
            ReplayBuffer(8, **arguments)
        else:
            RolloutBuffer(4, 2, **arguments)
    assert all(name in str(caught.value) for name in names), str(caught.value)


def test_an_extra_field_named_hidden_state_is_refused_in_a_distillation_buffer_too() -> None:
    with pytest.raises(ConfigError, match="hidden_state"):
        DistillationBuffer(8, obs_shape=(3,), action_shape=(), extra_fields={"hidden_state": ((2,), F32)})


NAMES = st.sampled_from(["a", "b", "h", "c", "cost", "recurrent_state", "recurrent_state_h", "recurrent_state_c",
                         "hidden_state", "observation", "action", "reward", "next", "done", "obs", "x_1"])


@settings(max_examples=150, deadline=None)
@given(extra=st.lists(NAMES, max_size=3, unique=True), obs_keys=st.lists(NAMES, max_size=2, unique=True),
       hidden_keys=st.lists(st.sampled_from(["h", "c", "a"]), max_size=2, unique=True), hidden=st.booleans())
def test_accepted_fields_keep_their_own_values_through_add_extend_and_sample(
        extra: list[str], obs_keys: list[str], hidden_keys: list[str], hidden: bool) -> None:
    obs_shape: Any = {key: (2,) for key in obs_keys} if obs_keys else (2,)
    hidden_shape: Any = ({key: (2,) for key in hidden_keys} if hidden_keys else (2,)) if hidden else None
    options = dict(obs_shape=obs_shape, action_shape=(), extra_fields={name: ((2,), F32) for name in extra},
                   hidden_state_shape=hidden_shape, seed=0)
    try:
        buffer = ReplayBuffer(8, **options)
    except ConfigError:
        return
    values = iter(range(1, 1000))

    def fresh(shape: Any) -> Any:
        if isinstance(shape, dict):
            return {key: fresh(sub) for key, sub in shape.items()}
        return torch.full(shape, float(next(values)))

    step: dict[str, Any] = dict(obs=fresh(obs_shape), action=0.0, reward=1.0, next_obs=fresh(obs_shape),
                                terminated=False, truncated=False)
    if hidden_shape is not None:
        step["hidden_state"] = fresh(hidden_shape)
    extras = {name: fresh((2,)) for name in extra}
    buffer.add(**step, **extras)
    batch = buffer.sample_all()
    for name, value in extras.items():
        assert torch.equal(batch.extras[name][0], value)
    _same_obs(batch.obs, step["obs"])
    _same_obs(batch.next_obs, step["next_obs"])
    again = ReplayBuffer(8, **options)
    again.extend(buffer.torchrl.storage[:1])
    replayed = again.sample_all()
    for name, value in extras.items():
        assert torch.equal(replayed.extras[name][0], value)
    _same_obs(replayed.obs, step["obs"])
    if hidden_shape is not None:
        _same_obs(replayed.hidden_state, step["hidden_state"])


def _same_obs(got: Any, expected: Any) -> None:
    if isinstance(expected, dict):
        for key, value in expected.items():
            _same_obs(got[key], value)
    else:
        assert torch.equal(got[0], expected)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([torch.float16, torch.float32, torch.float64]),
                          st.lists(st.sampled_from([0.0, -1.5, 6e4, 3e38, 1.7e308, float("nan"), float("inf"),
                                                    float("-inf")]), min_size=1, max_size=6)),
                min_size=1, max_size=4))
def test_finiteness_checked_together_refuses_exactly_what_each_field_alone_refuses(
        fields: list[tuple[torch.dtype, list[float]]]) -> None:
    # One float64 sum of all fields decides; huge finite values that overflow it fall back to the
    # exact check of each field, so only NaN and inf are refused, and the first such field is named.
    checks = []
    for number, (dtype, values) in enumerate(fields):
        limit = torch.finfo(dtype).max
        rows = torch.tensor([v if not math.isfinite(v) or abs(v) <= limit else limit for v in values], dtype=dtype)
        checks.append((FieldSpec(f"f{number}", f"f{number}", (), dtype, finite=True), rows))
    first_bad = next((spec.name for spec, rows in checks if not bool(torch.isfinite(rows).all())), None)
    if first_bad is None:
        check_finite_together(checks)
    else:
        with pytest.raises(NonFiniteError, match=rf"^{first_bad}: expected finite values"):
            check_finite_together(checks)


def test_finiteness_checked_together_reads_a_tensor_that_requires_grad_without_a_warning() -> None:
    # A critic's value passed without .detach(): the sum must not build a graph or warn when read.
    value = FieldSpec("value", "state_value", (), torch.float32, finite=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_finite_together([(value, torch.ones(4, requires_grad=True))])
