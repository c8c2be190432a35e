"""How the server paces what a storm of clients asks at once: a token bucket for the
connects it admits, and a queue that serves its clients in turn.

A storm is many clients asking at the same moment: a fleet restarting and connecting, or
registering interest with initial results in a big region. Each request is cheap alone,
but together they would hold the loop for seconds, and every other client's operations
with it. These two parts let the loop take a bounded share of each turn for them
(:mod:`regionbus.broker.initial_results`, :class:`ConnectAdmission`), the rest waiting in
arrival order, each client in its turn.

Pure logic: time is passed in (monotonic seconds), so the rules are tested without a clock.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

from regionbus.schemas.messages import Control

T = TypeVar("T")


class TokenBucket:
    """At most ``burst`` admissions at once, refilled at ``rate_per_s`` (the classic token
    bucket; a small class rather than a rate-limiting library, because the loop asks it
    with its own monotonic time and never waits on it).

    Args:
        rate_per_s: Tokens added per second (> 0).
        burst: Most tokens held (>= 1): how many are admitted at once after a quiet time.
        now_s: Now, monotonic seconds: the bucket starts full.

    Raises:
        ValueError: ``rate_per_s`` is not positive or ``burst`` is below 1.
    """

    def __init__(self, rate_per_s: float, burst: int, now_s: float) -> None:
        if rate_per_s <= 0 or burst < 1:
            raise ValueError(
                f"a token bucket needs rate_per_s > 0 and burst >= 1, got {rate_per_s} and {burst}"
            )
        self.rate_per_s = rate_per_s
        self.burst = burst
        self._tokens = float(burst)
        self._at_s = now_s

    def take(self, now_s: float) -> bool:
        """Take one token if there is one at ``now_s`` (monotonic s); False otherwise."""
        self._tokens = min(self.burst, self._tokens + (now_s - self._at_s) * self.rate_per_s)
        self._at_s = max(self._at_s, now_s)
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True


class FairQueue(Generic[T]):
    """Items waiting their turn, first in, first out, except that an owner (a client)
    already at its share of running work waits while the items after it go first: one
    client's thousand items delay no other client's beyond that share, and a client's
    own items run together, so it is answered whole before the next (a round-robin over
    clients would answer every client only at the very end)."""

    def __init__(self) -> None:
        self._items: deque[tuple[str, T]] = deque()

    def __len__(self) -> int:
        return len(self._items)

    def push(self, owner: str, item: T) -> None:
        """Queue ``item`` of ``owner`` last."""
        self._items.append((owner, item))

    def pop(self, at_share: Callable[[str], bool]) -> T | None:
        """Take the first item whose owner is not ``at_share`` (None when there is none)."""
        for index, (owner, item) in enumerate(self._items):
            if not at_share(owner):
                del self._items[index]
                return item
        return None

    def remove(self, owner: str, matches: Callable[[T], bool]) -> list[T]:
        """Take out ``owner``'s items that ``matches`` accepts; returns them in order."""
        removed = [item for o, item in self._items if o == owner and matches(item)]
        if removed:
            self._items = deque(
                (o, item) for o, item in self._items if o != owner or not matches(item)
            )
        return removed


class ConnectAdmission:
    """Connects admitted at a bounded rate: the rest wait, in arrival order, for a later
    turn of the loop.

    A connect costs the loop a Redis script and a check of the client's shared topics; a
    thousand arriving together held the loop, and every other client's operations, for as
    long as all of them took. Waiting connects are answered once admitted; past
    ``queued_max`` the oldest are dropped unanswered, and their clients send them again
    (a client resends an unanswered connect after a randomised back-off,
    :func:`regionbus.clients.resend.full_jitter_s`; the servers answer a repeated connect
    alike).

    Args:
        admit: Handles one admitted connect (the client lifecycle's).
        rate_per_s: Connects admitted per second (``connects_admitted_per_s``).
        burst: Connects admitted at once after a quiet time (``connect_burst``).
        queued_max: Most connects waiting; the oldest are dropped past it.
        clock_s: The monotonic clock.
    """

    def __init__(
        self,
        admit: Callable[[Control], None],
        rate_per_s: float,
        burst: int,
        queued_max: int,
        clock_s: Callable[[], float] = time.monotonic,
    ) -> None:
        self._admit = admit
        self._clock_s = clock_s
        self._tokens = TokenBucket(rate_per_s, burst, clock_s())
        self._waiting: deque[Control] = deque()
        self._queued_max = queued_max
        self.dropped = 0
        """Connects dropped unanswered because too many waited."""

    def __len__(self) -> int:
        return len(self._waiting)

    def connect(self, control: Control) -> None:
        """A connect arrived: admitted now if nothing waits and a token is free, else
        queued behind the others."""
        if not self._waiting and self._tokens.take(self._clock_s()):
            self._admit(control)
            return
        self._waiting.append(control)
        while len(self._waiting) > self._queued_max:
            self._waiting.popleft()
            self.dropped += 1

    def admit_due(self) -> int:
        """Admit the waiting connects the rate allows now (at each turn of the loop).

        Returns:
            How many were admitted.

        Raises:
            TransportError: Redis failed (the connect being admitted is kept for the next
                turn).
        """
        admitted = 0
        while self._waiting and self._tokens.take(self._clock_s()):
            self._admit(self._waiting[0])
            self._waiting.popleft()
            admitted += 1
        return admitted


__all__ = ["ConnectAdmission", "FairQueue", "TokenBucket"]
