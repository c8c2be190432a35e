"""When a client sends an unanswered change again.

A resend is rarely needed: a change on ``{ns}.ops`` whose primary dies unanswered is
processed again by the bucket's new primary, from the committed offset, which answers it
(from the stored result of its EventID). It helps when the change itself is gone (the
topic was recreated) or the servers are stalled. While the servers are alive but behind,
a resend is one more operation in their backlog, and resending a whole backlog at a short
``retry_interval_ms`` multiplied the load of servers already too slow (a burst of
1,500 puts to a slow server at 300 ms: 2,700 resends). So a change is resent:

- after ``retry_interval_ms``, then after twice as long each time, up to
  :data:`RESEND_BACKOFF_CAP_S` (:func:`resend_delay_s`);
- only when no server has answered this client anything since the change was last sent
  (replies that still come show servers alive and working through their backlog; a
  primary that died is replaced and its backlog answered without a resend);
- never during a Kafka outage (the producer would only queue it);
- with at most :data:`MAX_RESENDS_IN_FLIGHT` resent changes unanswered at a time.

The caller still fails every request at ``read_timeout_ms``, resent or not.

A connect unanswered is sent again too, after a random wait (:func:`full_jitter_s`): the
connects of a fleet that lost its servers at the same moment must not come back in step.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from regionbus.schemas.messages import Operation

RESEND_BACKOFF_CAP_S = 30.0
"""Longest wait between two resends of one change."""

MAX_RESENDS_IN_FLIGHT = 256
"""Most resent changes awaiting their reply at once; others wait for their turn."""

CONNECT_RESEND_FIRST_S = 2.0
"""Longest wait before an unanswered connect is first sent again: the servers answer each
connect of a storm of 1,000 within 2 s (they admit 1,000 a second), so a resend rarely
adds to a storm."""

CONNECT_RESEND_CAP_S = 16.0
"""Longest wait between two sends of one connect."""


def full_jitter_s(
    attempt: int,
    first_s: float,
    cap_s: float,
    uniform: Callable[[float, float], float] = random.uniform,
) -> float:
    """How long to wait before the next try: a random time up to an exponential ceiling
    ("full jitter", as tenacity's ``wait_random_exponential``; here a function of the
    attempt, so the caller waits for an answer meanwhile rather than sleeps).

    Args:
        attempt: Tries so far (0 before the first wait).
        first_s: The ceiling of the first wait, seconds.
        cap_s: The highest ceiling, seconds.
        uniform: The random source (``random.uniform``).

    Returns:
        Seconds, uniform in ``[0, min(cap_s, first_s * 2**attempt)]``.
    """
    # Past 2**32 the product only overflows the cap anyway.
    return uniform(0.0, min(cap_s, first_s * 2.0 ** min(attempt, 32)))


def resend_delay_s(
    attempt: int, retry_interval_s: float, cap_s: float = RESEND_BACKOFF_CAP_S
) -> float:
    """How long after its last send a change is sent again.

    Args:
        attempt: Resends so far (0 before the first).
        retry_interval_s: The client's ``retry_interval_ms`` in seconds: the first wait.
        cap_s: The longest wait (at least ``retry_interval_s``).

    Returns:
        ``retry_interval_s * 2**attempt`` seconds, at most ``max(cap_s, retry_interval_s)``.
    """
    ceiling = max(cap_s, retry_interval_s)
    # Past 2**32 the product only overflows the ceiling anyway.
    return min(retry_interval_s * 2.0 ** min(attempt, 32), ceiling)


class LastReply:
    """When a server last answered this client (monotonic seconds).

    Written and read by the pool's reply thread alone: no lock of its own.
    """

    def __init__(self) -> None:
        self._last_s: float | None = None

    def answered(self, at_s: float) -> None:
        """A reply arrived at ``at_s``."""
        self._last_s = at_s

    def quiet_since(self, since_s: float) -> bool:
        """True when nothing was answered after ``since_s`` (monotonic s)."""
        return self._last_s is None or self._last_s < since_s


class Resendable(Protocol):
    """What this policy reads and moves on of a pending request
    (:class:`regionbus.clients.pending.PendingRequest`)."""

    ops: Sequence[tuple[Operation, int]]
    """Its changes, ``(operation, bucket)``: the only operations ever sent again."""
    sent_at: float
    """When they were last sent (monotonic s)."""
    resend_at: float
    """When they may be sent again (monotonic s)."""
    attempts: int
    """Resends so far."""


def due_for_resend(
    pending: Iterable[Resendable], now_s: float, retry_interval_s: float, last_reply: LastReply
) -> list[tuple[Operation, int]]:
    """The unanswered changes to send again now, marked ``possible_duplicate``, by the rules
    above; each chosen request's attempt count and next resend time move on.

    Args:
        pending: The client's pending requests (the caller holds their lock).
        now_s: Now (monotonic seconds).
        retry_interval_s: The client's ``retry_interval_ms`` in seconds.
        last_reply: When a server last answered this client.

    Returns:
        ``(operation, bucket)`` pairs to send, with the same EventIDs.
    """
    requests = list(pending)
    in_flight = sum(len(p.ops) for p in requests if p.attempts)
    again: list[tuple[Operation, int]] = []
    for request in requests:
        if not request.ops or now_s < request.resend_at:
            continue
        if not last_reply.quiet_since(request.sent_at):
            continue
        if not request.attempts:
            if in_flight + len(request.ops) > MAX_RESENDS_IN_FLIGHT:
                continue
            in_flight += len(request.ops)
        request.attempts += 1
        request.sent_at = now_s
        request.resend_at = now_s + resend_delay_s(request.attempts, retry_interval_s)
        again.extend((op._replace(possible_duplicate=True), b) for op, b in request.ops)
    return again


__all__ = [
    "CONNECT_RESEND_CAP_S",
    "CONNECT_RESEND_FIRST_S",
    "MAX_RESENDS_IN_FLIGHT",
    "RESEND_BACKOFF_CAP_S",
    "LastReply",
    "Resendable",
    "due_for_resend",
    "full_jitter_s",
    "resend_delay_s",
]
