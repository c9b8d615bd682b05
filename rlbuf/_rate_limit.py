"""A samples-per-insert rate limiter with Reverb's semantics, as a pure object: counters and a band.

The limiter keeps three counters, ``inserts``, ``samples`` and ``deletes`` (``size`` is
``inserts - deletes``), and the difference ``diff = inserts * samples_per_insert - samples``.
Sampling waits until ``size >= min_size_to_sample``; after that, an insert may not push
``diff`` above ``max_diff`` (the learner is behind) and a sample may not push it below
``min_diff`` (the learner is ahead). Inserts into a buffer still below ``min_size_to_sample``
are always allowed, so filling never waits for a learner that cannot sample yet::

    diff = inserts * samples_per_insert - samples
      ^
      |  max_diff  ---------------------------------  inserts wait above this line
      |                 /\\      /\\  /\\
      |        /\\  /\\  /  \\/\\  /  \\/  \\   <- diff moves up by n * spi per insert,
      |       /  \\/  \\/      \\/          down by n per sample
      |  min_diff  ---------------------------------  samples wait below this line
      |     /
      |    /   filling: size < min_size_to_sample, inserts never wait
      +-----------------------------------------------> time

No clock and no lock here: ``can_insert``/``can_sample`` answer for a call of ``n`` rows, and
``record_*`` move the counters. [`wait_until`][rlbuf._rate_limit.wait_until] blocks on a
``threading.Condition`` with a timeout for the Ray service's shards.
"""

from __future__ import annotations

import math
import numbers
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from rlbuf.errors import BatchSizeError, ConfigError, RateLimitTimeoutError


class RateLimiter:
    """How far sampling may run ahead of inserting: Reverb's ``SampleToInsertRatio`` / ``MinSize``.

    Args:
        samples_per_insert: sampled rows wanted per inserted row (e.g. 4.0 for Ape-X-like
            reuse); only its ratio to the inserts matters.
        min_size_to_sample: rows a buffer must hold before any sample.
        error_buffer: how far ``diff`` may stray from its target
            ``samples_per_insert * min_size_to_sample``: a number ``e`` gives the band
            ``[target - e, target + e]``, a pair ``(min_diff, max_diff)`` gives it directly,
            ``None`` (the default) gives no ratio limit at all (Reverb's ``MinSize``).
        inserts: inserted rows to start from (a checkpoint's counters).
        samples: sampled rows to start from.
        deletes: overwritten rows to start from.

    Raises:
        ConfigError: a ratio that is not positive and finite, a size below 1, or a band
            narrower than one inserted row (``max_diff - min_diff < samples_per_insert``).

    Example:
        >>> limiter = RateLimiter(samples_per_insert=2.0, min_size_to_sample=4, error_buffer=4.0)
        >>> limiter.band
        (4.0, 12.0)
        >>> limiter.can_sample(1)            # 0 rows stored: too few
        False
        >>> limiter.record_insert(6)         # filling: never waits
        >>> limiter.diff, limiter.can_insert(1), limiter.can_sample(8)
        (12.0, False, True)
        >>> limiter.record_sample(8)
        >>> limiter.diff, limiter.can_insert(1), limiter.can_sample(1)
        (4.0, True, False)
    """

    def __init__(self, *, samples_per_insert: float = 1.0, min_size_to_sample: int = 1,
                 error_buffer: float | tuple[float, float] | None = None,
                 inserts: int = 0, samples: int = 0, deletes: int = 0) -> None:
        spi = _positive_number("samples_per_insert", samples_per_insert)
        if isinstance(min_size_to_sample, bool) or not isinstance(min_size_to_sample, int) or min_size_to_sample < 1:
            raise ConfigError(f"min_size_to_sample: expected an int >= 1, got {min_size_to_sample!r}")
        low, high = _band(spi, min_size_to_sample, error_buffer)
        for name, value in (("inserts", inserts), ("samples", samples), ("deletes", deletes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"{name}: expected an int >= 0, got {value!r}")
        if deletes > inserts:
            raise ConfigError(f"deletes: expected at most inserts={inserts}, got {deletes}")
        self.samples_per_insert = spi
        self.min_size_to_sample = min_size_to_sample
        self.error_buffer = error_buffer
        self.min_diff, self.max_diff = low, high
        self.inserts, self.samples, self.deletes = inserts, samples, deletes

    # -- the band ------------------------------------------------------------------------------
    @property
    def band(self) -> tuple[float, float]:
        """``(min_diff, max_diff)``: where ``diff`` stays once sampling has started."""
        return self.min_diff, self.max_diff

    @property
    def size(self) -> int:
        """Rows held: ``inserts - deletes``."""
        return self.inserts - self.deletes

    @property
    def diff(self) -> float:
        """``inserts * samples_per_insert - samples``."""
        return self.inserts * self.samples_per_insert - self.samples

    def can_insert(self, n: int) -> bool:
        """Whether inserting ``n`` rows now keeps the band (always, while still filling)."""
        if self.size < self.min_size_to_sample:
            return True
        return (self.inserts + n) * self.samples_per_insert - self.samples <= self.max_diff

    def can_sample(self, n: int) -> bool:
        """Whether sampling ``n`` rows now keeps the band (never before ``min_size_to_sample``)."""
        return self.size >= self.min_size_to_sample and self.diff - n >= self.min_diff

    def check_insert(self, n: int) -> None:
        """Refuse an insert of ``n`` rows that could never fit the band (before waiting for it).

        Raises:
            BatchSizeError: ``n`` is not a positive int, or ``n * samples_per_insert`` is wider
                than the band.
        """
        _count("rows", n)
        if n * self.samples_per_insert > self.max_diff - self.min_diff:
            raise BatchSizeError(
                f"rows: a batch of {n} rows moves the rate limiter by {n * self.samples_per_insert:g}, more than its"
                f" band {self.band} is wide; send smaller batches or widen error_buffer")

    def check_sample(self, n: int) -> None:
        """Refuse a sample of ``n`` rows that could never fit the band (before waiting for it).

        Raises:
            BatchSizeError: ``n`` is not a positive int, or wider than the band.
        """
        _count("batch_size", n)
        if n > self.max_diff - self.min_diff:
            raise BatchSizeError(
                f"batch_size: a sample of {n} rows is wider than the rate limiter's band {self.band};"
                " sample smaller batches or widen error_buffer")

    def record_insert(self, n: int) -> None:
        """Count ``n`` inserted rows."""
        self.inserts += n

    def record_sample(self, n: int) -> None:
        """Count ``n`` sampled rows."""
        self.samples += n

    def record_delete(self, n: int) -> None:
        """Count ``n`` rows that left the buffer (overwritten by newer ones)."""
        self.deletes += n

    # -- what a checkpoint holds ------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        """The constructor's options, JSON types only (numbers as Python floats, a pair as a list)."""
        given = self.error_buffer
        error_buffer = (None if given is None else [float(bound) for bound in given]
                        if isinstance(given, tuple | list) else float(given))
        return {"samples_per_insert": self.samples_per_insert, "min_size_to_sample": self.min_size_to_sample,
                "error_buffer": error_buffer}

    def counters(self) -> dict[str, int]:
        """``inserts``, ``samples`` and ``deletes``."""
        return {"inserts": self.inserts, "samples": self.samples, "deletes": self.deletes}

    @classmethod
    def from_config(cls, config: Mapping[str, Any], counters: Mapping[str, int] | None = None) -> RateLimiter:
        """The limiter ``config()`` (and ``counters()``) describe.

        Raises:
            ConfigError: a key missing or unknown, or a value the constructor refuses.
        """
        keys = {"samples_per_insert", "min_size_to_sample", "error_buffer"}
        if set(config) != keys:
            raise ConfigError(f"rate_limiter: expected the keys {sorted(keys)}, got {sorted(config)}")
        error_buffer = config["error_buffer"]
        if isinstance(error_buffer, list):
            error_buffer = tuple(error_buffer)
        given = dict(counters or {})
        if counters is not None and set(given) != {"inserts", "samples", "deletes"}:
            raise ConfigError(f"rate_limiter counters: expected inserts, samples, deletes, got {sorted(given)}")
        return cls(samples_per_insert=config["samples_per_insert"], min_size_to_sample=config["min_size_to_sample"],
                   error_buffer=error_buffer, **given)

    def __repr__(self) -> str:
        return (f"RateLimiter(samples_per_insert={self.samples_per_insert:g}, min_size_to_sample="
                f"{self.min_size_to_sample}, band={self.band}, inserts={self.inserts}, samples={self.samples},"
                f" deletes={self.deletes})")


def wait_until(condition: threading.Condition, ready: Callable[[], bool], timeout: float | None,
               describe: Callable[[], str], *, clock: Callable[[], float] = time.monotonic) -> None:
    """Wait on ``condition`` (held by the caller) until ``ready()``; nothing changes on a timeout.

    Raises:
        RateLimitTimeoutError: ``ready()`` still false after ``timeout`` seconds; the message is
            ``describe()``.

    Example:
        >>> condition = threading.Condition()
        >>> with condition:
        ...     wait_until(condition, lambda: False, 0.0, lambda: "extend: held")
        Traceback (most recent call last):
        ...
        rlbuf.errors.RateLimitTimeoutError: extend: held
    """
    deadline = None if timeout is None else clock() + timeout
    while not ready():
        left = None if deadline is None else deadline - clock()
        if left is not None and left <= 0:
            raise RateLimitTimeoutError(describe())
        condition.wait(left)


def _band(spi: float, min_size: int, error_buffer: float | tuple[float, float] | None) -> tuple[float, float]:
    if error_buffer is None:
        return -math.inf, math.inf
    if isinstance(error_buffer, tuple | list):  # config() writes the pair as a JSON list
        if len(error_buffer) != 2:
            raise ConfigError(f"error_buffer: expected a number or a pair (min_diff, max_diff), got {error_buffer!r}")
        low, high = (_finite(f"error_buffer[{i}]", v) for i, v in enumerate(error_buffer))
    else:
        width = _finite("error_buffer", error_buffer)
        if width < 0:
            raise ConfigError(f"error_buffer: expected a number >= 0, got {error_buffer!r}")
        low, high = spi * min_size - width, spi * min_size + width
    if not math.isfinite(high - low):
        raise ConfigError(f"error_buffer: its band [{low:g}, {high:g}] is beyond float64; give a finite band")
    if high - low < spi:
        raise ConfigError(
            f"error_buffer: expected a band at least samples_per_insert={spi:g} wide (one inserted row), got"
            f" [{low:g}, {high:g}]; widen it, e.g. error_buffer={2 * max(1.0, spi):g} or more")
    return low, high


def _finite(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ConfigError(f"{name}: expected a finite number, got {value!r}")
    return float(value)


def _positive_number(name: str, value: Any) -> float:
    number = _finite(name, value)
    if number <= 0:
        raise ConfigError(f"{name}: expected a number > 0, got {value!r}")
    return number


def _count(name: str, n: Any) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise BatchSizeError(f"{name}: expected a positive int, got {n!r}")
