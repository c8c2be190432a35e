"""How long a client cache's readers (its replies, its subscription queue) wait in one poll.

A poll returns as soon as a record arrives, so its timeout only sets how often a reader
with nothing to read wakes up for its periodic work (acks, resends, expiries, stopping).
A client in use wakes every :data:`BUSY_POLL_S`; one left alone for :data:`IDLE_AFTER_S`
every :data:`IDLE_POLL_S`. An idle fleet of thousands of caches then costs a tenth of
the wake-ups, and the price is paid only by an idle cache: its ``close`` may wait up to
``IDLE_POLL_S`` for the reader to notice.
"""

from __future__ import annotations

import time
from typing import Final

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


__all__ = ["BUSY_POLL_S", "IDLE_AFTER_S", "IDLE_POLL_S", "PollPace"]
