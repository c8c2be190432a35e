"""How long a client cache's readers (its replies, its subscription queue) wait in one poll.

A poll returns as soon as a record arrives, so its timeout only sets how often a reader
with nothing to read wakes up for its periodic work (acks, resends, expiries, stopping).
A client in use wakes every :data:`BUSY_POLL_S`; one left alone for :data:`IDLE_AFTER_S`
every :data:`IDLE_POLL_S`. An idle fleet of thousands of caches then costs a tenth of
the wake-ups, and the price is paid only by an idle cache: its ``close`` may wait up to
``IDLE_POLL_S`` for the reader to notice. :func:`queue_fetch_pacing` paces how often a
subscription queue's consumer fetches.
"""

from __future__ import annotations

import time
from typing import Final

from regionbus.schemas.record_limits import CONSUMER_FETCH_MAX_BYTES

BUSY_POLL_S: Final = 0.1
"""Poll timeout of a reader in use, in seconds: the granularity of its acks
(``subscription_ack_interval_ms``, Geode default 100 ms) and of resend checks."""

IDLE_POLL_S: Final = 1.0
"""Poll timeout of a reader idle for ``IDLE_AFTER_S``, in seconds."""

IDLE_AFTER_S: Final = 10.0
"""Time without activity after which a reader polls at ``IDLE_POLL_S``, in seconds (the
client's default ``ping_interval_ms``, Geode's 10 s: a ping alone does not count)."""


class PollPace:
    """The poll timeout of one reader, from when it last had something to do."""

    def __init__(self) -> None:
        self._last_busy_s = time.monotonic()

    def busy(self) -> None:
        """The reader has work (a request sent, records read): poll briskly for a while."""
        self._last_busy_s = time.monotonic()

    def timeout_s(self) -> float:
        """The next poll's timeout, in seconds: ``BUSY_POLL_S`` within ``IDLE_AFTER_S`` of
        the last :meth:`busy`, else ``IDLE_POLL_S``."""
        idle_s = time.monotonic() - self._last_busy_s
        return BUSY_POLL_S if idle_s < IDLE_AFTER_S else IDLE_POLL_S


def queue_fetch_pacing(backoff_ms: int) -> dict[str, int]:
    """librdkafka settings that make a subscription queue's consumer fetch at most once per
    ``backoff_ms`` while it holds events not yet taken.

    A consumer fetches again as soon as a fetch returns, and Apache Kafka answers a fetch
    at its first record, so at a steady rate each event costs a fetch round trip and a
    wake-up of the reading thread: half of a busy subscriber's CPU. With
    ``queued.min.messages`` 1, one record still held locally is enough to postpone the next
    fetch by ``fetch.queue.backoff.ms``; an empty local queue (an idle client) fetches at
    once, and the broker holds that fetch until a record arrives. As a paced fetch is one
    per backoff, it may bring a whole response's worth of the queue's one partition
    (``fetch.max.bytes``, not the 1 MiB per partition other consumers ask for): a
    reconnecting durable client counts its backlog a response per backoff.

    A paced consumer holds one fetch locally, not the backlog librdkafka would prefetch:
    with conflation, a slow client conflates what each fetch brought (as a Geode client
    gets, unconflated, what was already dispatched to it), not its whole backlog at once.

    Args:
        backoff_ms: ``ClientSettings.queue_fetch_backoff_ms``, in ms; 0 keeps librdkafka's
            defaults.

    Returns:
        The librdkafka keys to add to the consumer's configuration (empty for 0, which
        also keeps ``max.partition.fetch.bytes`` at 1 MiB).
    """
    if backoff_ms <= 0:
        return {}
    return {
        "queued.min.messages": 1,
        "fetch.queue.backoff.ms": backoff_ms,
        "max.partition.fetch.bytes": CONSUMER_FETCH_MAX_BYTES,
    }


__all__ = ["BUSY_POLL_S", "IDLE_AFTER_S", "IDLE_POLL_S", "PollPace", "queue_fetch_pacing"]
