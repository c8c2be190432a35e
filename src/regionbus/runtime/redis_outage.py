"""Riding out a Redis outage: recognise it, wait with backoff until Redis answers, log it once.

A Redis restart (or a network cut) makes every call of a worker fail with redis-py's
``ConnectionError`` or ``TimeoutError`` (``BusyLoadingError`` while a restarted Redis
loads its append-only file), usually wrapped in our :class:`TransportError` by the
translation boundary (:func:`regionbus.runtime.redis_connect.redis_errors`). A Redis Cluster whose
master died answers ``CLUSTERDOWN`` / ``TRYAGAIN`` (or no node serves the slot) until its
replica is promoted, and changes that too few replicas confirmed raise
:class:`ReplicationTimeoutError`. Such an error is retriable: the worker must not act on
anything it could not write, must wait, and resume once Redis is back. One WARNING marks
the start of an outage and one INFO its end (with its duration), never one line per retry.
"""

from __future__ import annotations

import logging
import threading
import time

import redis
from redis.exceptions import ClusterDownError, SlotNotCoveredError, TryAgainError
from tenacity import (
    RetryError,
    Retrying,
    retry_if_exception,
    stop_when_event_set,
    wait_exponential_jitter,
)

from regionbus.runtime.redis_connect import ping_every_master
from regionbus.schemas.errors import ReplicationTimeoutError

log = logging.getLogger("regionbus.redis")

_UNAVAILABLE = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    ClusterDownError,
    TryAgainError,
    SlotNotCoveredError,
    ReplicationTimeoutError,
)
# redis-py derives these from ConnectionError, but waiting does not cure them.
_REFUSED = (
    redis.exceptions.AuthenticationError,
    redis.exceptions.AuthorizationError,
)
_FIRST_RETRY_S = 0.05


def is_redis_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` means "Redis cannot be reached right now" (worth waiting for).

    Args:
        exc: Any exception; its ``__cause__`` / ``__context__`` chain is searched, so a
            :class:`TransportError` raised ``from`` a redis-py error counts as well.

    Returns:
        True for redis-py ``ConnectionError`` (which includes ``BusyLoadingError``) and
        ``TimeoutError``, a Redis Cluster without a master for a slot (``ClusterDownError``,
        ``TryAgainError``, ``SlotNotCoveredError``) and a :class:`ReplicationTimeoutError`;
        False for anything else, e.g. a script's ``ResponseError`` or a
        refused authentication (a ``ConnectionError`` subclass in redis-py that waiting
        does not cure).
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, _REFUSED):
            return False
        if isinstance(current, _UNAVAILABLE):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


class RedisOutage:
    """One worker's view of Redis outages: wait them out and log their start and end once.

    Args:
        client: The worker's redis-py client (its connection pool reconnects by itself).
        who: The worker's name for the log lines (e.g. its member id).
        stop: Set when the worker should stop; it ends a wait at once.
        max_retry_interval_ms: Longest pause between two probes, in ms; probes start 50 ms
            apart and double, with jitter, up to this.
    """

    def __init__(
        self,
        client: redis.Redis,
        who: str,
        stop: threading.Event,
        *,
        max_retry_interval_ms: int = 1_000,
    ) -> None:
        self._redis = client
        self.who = who
        self._stop = stop
        self.max_retry_interval_ms = max_retry_interval_ms
        self._began: float | None = None
        self.outages = 0

    @property
    def ongoing(self) -> bool:
        """True between the first failure of an outage and :meth:`ended`."""
        return self._began is not None

    def began(self, cause: BaseException) -> None:
        """Note a failed Redis call; logs a WARNING only if no outage is ongoing yet.

        Args:
            cause: The error of the failed call (for the log line).
        """
        if self._began is not None:
            return
        self._began = time.monotonic()
        self.outages += 1
        log.warning(
            "Redis unavailable for %s (%s): pausing until it answers, retrying every %d ms at most",
            self.who,
            cause,
            self.max_retry_interval_ms,
        )

    def wait(self) -> bool:
        """Probe Redis (``PING``; every master of a cluster) with exponential backoff until it
        answers.

        Returns:
            True once Redis answers; False if ``stop`` was set first.

        Raises:
            redis.RedisError: Redis answered with an error that is not an outage (e.g.
                authentication refused after a restart with another password).
        """
        retrying = Retrying(
            retry=retry_if_exception(is_redis_unavailable),
            wait=wait_exponential_jitter(
                multiplier=_FIRST_RETRY_S, max=self.max_retry_interval_ms / 1000
            ),
            stop=stop_when_event_set(self._stop),
            sleep=self._pause,
            reraise=False,
        )
        try:
            retrying(ping_every_master, self._redis)
        except RetryError:
            return False
        return not self._stop.is_set()

    def _pause(self, seconds: float) -> None:
        self._stop.wait(seconds)

    def ended(self) -> float:
        """Note that the worker works again; logs an INFO with the outage's duration.

        Returns:
            The outage's duration in seconds (0 when none was ongoing).
        """
        if self._began is None:
            return 0.0
        down_s = time.monotonic() - self._began
        self._began = None
        log.info("Redis available again for %s after %.1f s", self.who, down_s)
        return down_s


__all__ = ["RedisOutage", "is_redis_unavailable"]
