"""A request of a client waiting for its replies, and how its caller hears the outcome.

`regionbus.clients.pool.Pool` keeps one :class:`PendingRequest` per request id until every
bucket it went to has answered, it fails, or ``read_timeout_ms`` passes; the unanswered
changes among its operations are what `regionbus.clients.resend` sends again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future

from regionbus.schemas.messages import Operation, Reply

PENDING_CHECK_INTERVAL_S = 0.25
"""How often unanswered requests are checked for a resend or their timeout."""

ReplyCallback = Callable[[list[Reply] | None, BaseException | None], None]
"""Called once with ``(replies, None)`` when a request completes, or ``(None, error)``."""


class PendingRequest:
    """One request waiting for its replies.

    Args:
        expected: Replies that complete it (one per bucket it went to).
        callback: Told of its outcome, once.
        ops: Its ``(operation, bucket)`` pairs; only the changes (with EventIDs) are kept,
            since only they are sent again.
        timeout_s: Its ``read_timeout_ms``, in seconds.
        retry_interval_s: Its ``retry_interval_ms``, in seconds: the first resend's wait.
    """

    __slots__ = (
        "attempts",
        "callback",
        "done",
        "expected",
        "expires_at",
        "ops",
        "replies",
        "resend_at",
        "sent_at",
    )

    def __init__(
        self,
        expected: int,
        callback: ReplyCallback,
        ops: Sequence[tuple[Operation, int]],
        timeout_s: float,
        retry_interval_s: float,
    ) -> None:
        self.expected = expected
        self.done = 0
        self.replies: list[Reply] = []
        self.callback = callback
        # Changes (with EventIDs) are sent again when unanswered; reads are not.
        self.ops = (
            ops
            if all(op.event_id is not None for op, _ in ops)
            else [(op, b) for op, b in ops if op.event_id is not None]
        )
        self.sent_at = time.monotonic()
        """When the operations were last sent (monotonic s)."""
        self.expires_at = self.sent_at + timeout_s
        self.attempts = 0
        """Resends so far."""
        self.resend_at = self.sent_at + retry_interval_s


def future_callback() -> tuple[Future[list[Reply]], ReplyCallback]:
    """A future and the callback that completes it (with the replies, or the error)."""
    future: Future[list[Reply]] = Future()

    def complete(replies: list[Reply] | None, error: BaseException | None) -> None:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(replies or [])

    return future, complete


__all__ = ["PENDING_CHECK_INTERVAL_S", "PendingRequest", "ReplyCallback", "future_callback"]
