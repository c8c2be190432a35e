"""Liveness and readiness of a worker, as its metrics endpoint answers ``/healthz`` and
``/readyz``.

Two questions, as Kubernetes asks them:

- **liveness** (``/healthz``): is the process worth keeping? The worker's thread runs and
  its loop turned within a bound (``liveness_timeout_s``). A loop stuck in a listener or a
  deadlock is not live: restarting the process is the cure. A loop waiting out an outage on
  purpose (Redis unavailable) is live: a restart would wait the same.
- **readiness** (``/readyz``): does the worker do its work now? Live, started, connected
  (no outage being waited out) and, for each kind of worker, what it needs to serve (a
  cache server: every bucket has a primary).

:class:`LoopWatch` is what a loop touches once per turn (one float stored); the answers
are computed on the endpoint's thread when a probe asks, from what the worker's threads
left there, and only read.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple, Protocol

HEALTHZ_PATH = "/healthz"
"""The liveness probe's path on a metrics endpoint."""
READYZ_PATH = "/readyz"
"""The readiness probe's path on a metrics endpoint."""


class Probe(NamedTuple):
    """One probe's answer: ``ok`` (HTTP 200, else 503) and why, in a few words."""

    ok: bool
    reason: str


OK = Probe(True, "ok")


class HealthChecks(Protocol):
    """What a metrics endpoint asks for ``/healthz`` and ``/readyz`` (a worker, a client
    cache). Both are called on the endpoint's thread: they must only read."""

    def liveness(self) -> Probe: ...

    def readiness(self) -> Probe: ...


class LoopWatch:
    """When a loop last turned, and what it waits for on purpose.

    Args:
        timeout_s: Longest time between two turns of a live loop, in seconds (the
            ``liveness_timeout_s`` setting).
    """

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._turned_at_s = time.monotonic()
        self._waiting_for: str | None = None
        self._lock = threading.Lock()

    def turned(self) -> None:
        """The loop turned (once per turn; one float stored, no lock)."""
        self._turned_at_s = time.monotonic()

    @contextmanager
    def waiting(self, why: str) -> Iterator[None]:
        """The loop waits on purpose while in this block (an outage): live, not ready.

        Args:
            why: What it waits for, e.g. ``"Redis unavailable"`` (the probes' reason).
        """
        with self._lock:
            self._waiting_for = why
        try:
            yield
        finally:
            with self._lock:
                self._waiting_for = None
            self.turned()

    @property
    def waiting_for(self) -> str | None:
        """What the loop waits for on purpose now, else None."""
        return self._waiting_for

    def liveness(self) -> Probe:
        """Live while the loop waits on purpose or turned within :attr:`timeout_s`."""
        if self._waiting_for is not None:
            return Probe(True, f"waiting: {self._waiting_for}")
        stalled_s = time.monotonic() - self._turned_at_s
        if stalled_s > self.timeout_s:
            return Probe(
                False,
                f"loop has not turned for {stalled_s:.1f} s "
                f"(liveness_timeout_s {self.timeout_s:g})",
            )
        return OK


__all__ = ["HEALTHZ_PATH", "OK", "READYZ_PATH", "HealthChecks", "LoopWatch", "Probe"]
