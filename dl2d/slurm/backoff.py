"""Exponential backoff with jitter for talking to a Slurm controller that may be down.

:func:`backoff_delay` is pure (the random source is a parameter); :class:`RetryingDriver`
wraps any :class:`~dl2d.slurm.driver.SlurmDriver` and retries calls that raised
:class:`~dl2d.slurm.driver.SlurmUnavailable`; other errors pass straight through.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

from dl2d.slurm.driver import SlurmUnavailable

T = TypeVar("T")


@dataclass(frozen=True)
class BackoffPolicy:
    """Delay before retry ``n`` (0-based) is ``min(cap, base * factor**n)``, then "full jitter"
    scaled into ``[(1 - jitter) * d, d]`` so that many clients do not retry in lockstep.
    ``max_attempts`` counts all tries (None: retry until ``max_elapsed`` s have passed)."""

    base: float = 0.5
    factor: float = 2.0
    cap: float = 30.0
    jitter: float = 0.5
    max_attempts: int | None = 8
    max_elapsed: float | None = None

    def __post_init__(self) -> None:
        if self.base < 0 or self.cap < 0 or self.factor < 1 or not 0 <= self.jitter <= 1:
            raise ValueError(f"invalid backoff policy {self}")
        if self.max_attempts is None and self.max_elapsed is None:
            raise ValueError("backoff policy needs max_attempts or max_elapsed (or both)")


def backoff_delay(attempt: int, policy: BackoffPolicy = BackoffPolicy(),
                  rand: Callable[[], float] = random.random) -> float:
    """Seconds to wait after failed try number ``attempt`` (0-based). ``rand`` returns [0, 1)."""
    ceiling = min(policy.cap, policy.base * policy.factor ** min(attempt, 64))
    return ceiling * (1.0 - policy.jitter * rand())


def retry(fn: Callable[[], T], policy: BackoffPolicy = BackoffPolicy(), *,
          sleep: Callable[[float], None] = time.sleep,
          clock: Callable[[], float] = time.monotonic,
          rand: Callable[[], float] = random.random,
          on_retry: Callable[[int, float, SlurmUnavailable], None] | None = None) -> T:
    """Call ``fn`` until it does not raise :class:`SlurmUnavailable` or the policy gives up
    (then the last error is raised). ``on_retry(attempt, delay, error)`` is told each wait."""
    start = clock()
    attempt = 0
    while True:
        try:
            return fn()
        except SlurmUnavailable as e:
            delay = backoff_delay(attempt, policy, rand)
            attempt += 1
            if policy.max_attempts is not None and attempt >= policy.max_attempts:
                raise
            if policy.max_elapsed is not None and clock() - start + delay > policy.max_elapsed:
                raise
            if on_retry is not None:
                on_retry(attempt, delay, e)
            sleep(delay)


class RetryingDriver:
    """A driver wrapper whose every method retries :class:`SlurmUnavailable` per ``policy``.
    ``ping`` is not retried (it answers the question "is it up now?")."""

    def __init__(self, driver: Any, policy: BackoffPolicy = BackoffPolicy(), **retry_options: Any):
        self.driver = driver
        self.policy = policy
        self.retry_options = retry_options

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.driver, name)
        if not callable(attr) or name == "ping" or name.startswith("_"):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            return retry(lambda: attr(*args, **kwargs), self.policy, **self.retry_options)

        call.__name__ = name
        call.__doc__ = attr.__doc__
        return call
