"""The service's rate limiter, as a pure object: the band holds under any schedule of inserts and
samples, refused or timed-out calls change no counter, and nothing ever deadlocks that fits the band."""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlbuf import BatchSizeError, ConfigError, RateLimitTimeoutError
from rlbuf._rate_limit import (  # public as rlbuf.ray.RateLimiter; no Ray needed
    RateLimiter,
    wait_until,
)


@dataclass
class _Config:
    spi: float
    min_size: int
    error_buffer: float
    insert_rows: int
    sample_rows: int


@st.composite
def _configs(draw: st.DrawFn) -> _Config:
    spi = draw(st.sampled_from([0.25, 0.5, 1.0, 2.0, 4.0, 8.0]))
    insert_rows = draw(st.integers(1, 16))
    sample_rows = draw(st.integers(1, 64))
    # Wide enough for one insert and one sample at once: the band Reverb asks of its users.
    error_buffer = (insert_rows * spi + sample_rows) / 2 + draw(st.integers(0, 50))
    return _Config(spi, draw(st.integers(1, 40)), error_buffer, insert_rows, sample_rows)


def _counters(limiter: RateLimiter) -> dict[str, int]:
    return limiter.counters()


@settings(max_examples=200, deadline=None)
@given(config=_configs(), schedule=st.lists(st.tuples(st.sampled_from(["insert", "sample"]), st.integers(1, 64)),
                                            max_size=300))
def test_the_band_holds_under_a_random_schedule_and_refusals_change_nothing(
        config: _Config, schedule: list[tuple[str, int]]) -> None:
    limiter = RateLimiter(samples_per_insert=config.spi, min_size_to_sample=config.min_size,
                          error_buffer=config.error_buffer)
    low, high = limiter.band
    capacity = config.min_size + 20
    for kind, rows in schedule:
        before = _counters(limiter)
        if kind == "insert":
            filling = limiter.size < config.min_size
            if not limiter.can_insert(rows):
                assert _counters(limiter) == before and not filling
                continue
            limiter.record_insert(rows)
            limiter.record_delete(max(0, limiter.size - capacity))       # a ring of `capacity` rows
            assert filling or limiter.diff <= high                      # only filling may overshoot
        else:
            if not limiter.can_sample(rows):
                assert _counters(limiter) == before
                continue
            assert limiter.size >= config.min_size
            limiter.record_sample(rows)
            assert limiter.diff >= low                                  # never ahead of the band


@settings(max_examples=100, deadline=None)
@given(config=_configs(), turns=st.lists(st.booleans(), min_size=50, max_size=400))
def test_a_writer_and_a_learner_taking_random_turns_never_deadlock_and_keep_the_ratio(
        config: _Config, turns: list[bool]) -> None:
    """Each turn one side tries its call; a blocked side yields to the other, as the shard's waits do."""
    limiter = RateLimiter(samples_per_insert=config.spi, min_size_to_sample=config.min_size,
                          error_buffer=config.error_buffer)
    low, high = limiter.band
    for writer_first in turns:
        order = ["insert", "sample"] if writer_first else ["sample", "insert"]
        for kind in order:
            if kind == "insert" and limiter.can_insert(config.insert_rows):
                limiter.record_insert(config.insert_rows)
                break
            if kind == "sample" and limiter.can_sample(config.sample_rows):
                limiter.record_sample(config.sample_rows)
                break
        else:
            pytest.fail(f"both sides blocked: {limiter}")
        if limiter.samples:                                             # sampling has started
            overshoot = config.spi * (config.min_size - 1 + config.insert_rows)   # the last filling insert
            assert low <= limiter.diff <= max(high, overshoot)


def test_reverb_style_settings_give_the_documented_band() -> None:
    ratio = RateLimiter(samples_per_insert=4.0, min_size_to_sample=100, error_buffer=50.0)
    assert ratio.band == (350.0, 450.0)
    assert RateLimiter(samples_per_insert=2.0, error_buffer=(-10.0, 10.0)).band == (-10.0, 10.0)
    min_size = RateLimiter(min_size_to_sample=3)                        # Reverb's MinSize: no ratio
    assert min_size.band == (-math.inf, math.inf)
    min_size.record_insert(2)
    assert not min_size.can_sample(1)
    min_size.record_insert(1)
    assert min_size.can_sample(10**9) and min_size.can_insert(10**9)
    copy = RateLimiter.from_config(ratio.config(), {"inserts": 7, "samples": 3, "deletes": 1})
    assert copy.band == ratio.band and copy.counters() == {"inserts": 7, "samples": 3, "deletes": 1}


@pytest.mark.parametrize(("options", "message"), [
    ({"samples_per_insert": 0.0}, r"samples_per_insert: expected a number > 0, got 0.0"),
    ({"samples_per_insert": math.inf}, r"samples_per_insert: expected a finite number, got inf"),
    ({"min_size_to_sample": 0}, r"min_size_to_sample: expected an int >= 1, got 0"),
    ({"error_buffer": -1.0}, r"error_buffer: expected a number >= 0, got -1.0"),
    ({"samples_per_insert": 4.0, "error_buffer": 1.0}, r"error_buffer: expected a band at least samples_per_insert=4"),
    ({"error_buffer": (1.0,)}, r"error_buffer: expected a number or a pair"),
    ({"inserts": 1, "deletes": 2}, r"deletes: expected at most inserts=1, got 2"),
])
def test_bad_settings_are_refused_naming_the_field(options: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RateLimiter(**options)  # type: ignore[arg-type]


def test_a_call_wider_than_the_band_is_refused_before_any_wait() -> None:
    limiter = RateLimiter(samples_per_insert=2.0, min_size_to_sample=10, error_buffer=8.0)   # band 16 wide
    with pytest.raises(BatchSizeError, match=r"rows: a batch of 9 rows moves the rate limiter by 18"):
        limiter.check_insert(9)
    with pytest.raises(BatchSizeError, match=r"batch_size: a sample of 17 rows is wider"):
        limiter.check_sample(17)
    with pytest.raises(BatchSizeError, match=r"batch_size: expected a positive int, got 0"):
        limiter.check_sample(0)
    limiter.check_insert(8)
    limiter.check_sample(16)
    assert limiter.counters() == {"inserts": 0, "samples": 0, "deletes": 0}


class _FakeClock:
    """A clock that moves only when the code under test waits on the condition."""

    def __init__(self) -> None:
        self.now = 0.0
        self.waits: list[float | None] = []

    def __call__(self) -> float:
        return self.now


class _FakeCondition:
    def __init__(self, clock: _FakeClock) -> None:
        self.clock = clock

    def wait(self, timeout: float | None = None) -> bool:
        self.clock.waits.append(timeout)
        self.clock.now += 0.4
        return False


def test_a_held_call_times_out_on_the_clock_and_changes_nothing() -> None:
    limiter = RateLimiter(samples_per_insert=1.0, min_size_to_sample=4, error_buffer=4.0)
    limiter.record_insert(8)                                            # diff 8 = max_diff: inserts wait
    clock = _FakeClock()
    with pytest.raises(RateLimitTimeoutError, match="held 2 rows"):
        wait_until(_FakeCondition(clock), lambda: limiter.can_insert(2), 1.0,  # type: ignore[arg-type]
                   lambda: "extend: the rate limiter held 2 rows", clock=clock)
    assert clock.waits == pytest.approx([1.0, 0.6, 0.2]) and clock.now == pytest.approx(1.2)
    assert limiter.counters() == {"inserts": 8, "samples": 0, "deletes": 0}
    with pytest.raises(RateLimitTimeoutError):                          # timeout 0: no wait at all
        wait_until(_FakeCondition(clock), lambda: False, 0.0, lambda: "held", clock=clock)  # type: ignore[arg-type]
    assert len(clock.waits) == 3


def test_a_held_insert_goes_through_once_a_sample_makes_room() -> None:
    limiter = RateLimiter(samples_per_insert=1.0, min_size_to_sample=4, error_buffer=4.0)
    limiter.record_insert(8)
    condition = threading.Condition()
    done = threading.Event()

    def insert() -> None:
        with condition:
            wait_until(condition, lambda: limiter.can_insert(2), None, lambda: "never")
            limiter.record_insert(2)
        done.set()

    writer = threading.Thread(target=insert)
    writer.start()
    assert not done.wait(0.05) and limiter.inserts == 8                 # held while the band is full
    with condition:
        limiter.record_sample(2)
        condition.notify_all()
    writer.join(10)
    assert done.is_set() and limiter.counters() == {"inserts": 10, "samples": 2, "deletes": 0}


def test_the_band_as_config_writes_it_numpy_numbers_and_an_infinite_band() -> None:
    # config() writes a pair as a list, which the constructor refused as "not a finite number"; numpy numbers
    # were refused; a band past float64 was taken as (0, inf) (helper 44).
    import numpy as np

    assert RateLimiter(samples_per_insert=2.0, error_buffer=[2.0, 10.0]).band == (2.0, 10.0)
    assert RateLimiter(samples_per_insert=np.float64(2.0), error_buffer=np.int64(4)).band == (-2.0, 6.0)
    with pytest.raises(ConfigError, match=r"error_buffer: its band \[0, inf\] is beyond float64"):
        RateLimiter(samples_per_insert=1e308, error_buffer=1e308)


def test_config_of_numpy_settings_is_json_a_service_checkpoint_can_hold() -> None:
    # error_buffer=np.float32(100.0) was accepted, then service.save failed: json cannot write a numpy number (h2).
    import json

    import numpy as np

    for error_buffer, written in ((np.float32(100.0), 100.0), ((np.int64(2), np.float64(10.0)), [2.0, 10.0])):
        config = RateLimiter(samples_per_insert=1.0, error_buffer=error_buffer).config()  # type: ignore[arg-type]
        assert json.loads(json.dumps(config))["error_buffer"] == written
        assert RateLimiter.from_config(json.loads(json.dumps(config))).band == RateLimiter.from_config(config).band
