"""Client message tracking: drop events already seen (docs/behaviour.md §2).

For each (member, thread, bucket) the tracker keeps the highest sequence id seen; an event
whose sequence id is not above it is a duplicate. Entries idle for longer than
``subscription_message_tracking_timeout`` expire (Geode default 900 s).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from regionbus.schemas.eventid import EventID


class MessageTracker:
    """Per (member, thread, bucket) highest sequence id seen, with idle expiry.

    Args:
        timeout_s: Idle time after which an entry is forgotten, in seconds.
        clock: Monotonic clock in seconds (injectable for tests).

    Not thread-safe: one subscription thread owns it.
    """

    def __init__(self, timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._timeout_s = timeout_s
        self._clock = clock
        self._highest: dict[tuple[str, int, int], list[float]] = {}
        self._next_sweep = clock() + timeout_s
        self.duplicates = 0

    def is_new(self, event_id: EventID, now: float | None = None) -> bool:
        """Record an event; tell whether it is new.

        Args:
            event_id: The event's EventID.
            now: The clock's time of the event's arrival, in seconds (one reading serves
                a whole poll of events); None reads the clock.

        Returns:
            True the first time a sequence id above the highest seen arrives for its
            (member, thread, bucket); False for a duplicate (counted in ``duplicates``).
        """
        if now is None:
            now = self._clock()
        if now >= self._next_sweep:
            self.expire(now)
        key = (event_id.member, event_id.thread, event_id.bucket)
        seen = self._highest.get(key)
        if seen is None:
            self._highest[key] = [event_id.sequence, now]
            return True
        seen[1] = now
        if event_id.sequence <= seen[0]:
            self.duplicates += 1
            return False
        seen[0] = event_id.sequence
        return True

    def expire(self, now: float | None = None) -> int:
        """Forget entries idle for longer than the timeout. Returns how many were dropped."""
        now = self._clock() if now is None else now
        cutoff = now - self._timeout_s
        stale = [k for k, (_, last) in self._highest.items() if last < cutoff]
        for k in stale:
            del self._highest[k]
        self._next_sweep = now + min(self._timeout_s, 60.0)
        return len(stale)

    def __len__(self) -> int:
        return len(self._highest)
