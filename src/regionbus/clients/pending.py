"""The requests of a client waiting for their replies, and how callers hear the outcome.

A :class:`RequestTable` keeps one :class:`PendingRequest` per request id until every
bucket it went to has answered, it fails, or ``read_timeout_ms`` passes; the unanswered
changes among its operations are what `regionbus.clients.resend` sends again. The table
is the bookkeeping alone, under its own lock: `regionbus.clients.pool.Pool` does the Kafka
I/O and calls the callbacks the table hands back, outside the lock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future

from regionbus.clients.resend import LastReply, due_for_resend
from regionbus.schemas.messages import Entry, Operation, Reply

PENDING_CHECK_INTERVAL_S = 0.25
"""How often unanswered requests are checked for a resend or their timeout."""

ReplyCallback = Callable[[list[Reply] | None, BaseException | None], None]
"""Called once with ``(replies, None)`` when a request completes, or ``(None, error)``."""

EntriesTaker = Callable[[tuple[Entry, ...]], None]
"""Takes the entries of each chunk of a request's successful replies as the chunk arrives
(on the reply thread), so a large answer (a registration's initial entries) is never held
whole: the replies the request completes with carry no entries then."""


class PendingRequest:
    """One request waiting for its replies.

    Args:
        expected: Replies that complete it (one per bucket it went to).
        callback: Told of its outcome, once.
        ops: Its ``(operation, bucket)`` pairs; only the changes (with EventIDs) are kept,
            since only they are sent again.
        timeout_s: Its ``read_timeout_ms``, in seconds.
        retry_interval_s: Its ``retry_interval_ms``, in seconds: the first resend's wait.
        take_entries: Takes each successful reply's entries as it arrives (None: they
            stay in the replies).
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
        "take_entries",
    )

    def __init__(
        self,
        expected: int,
        callback: ReplyCallback,
        ops: Sequence[tuple[Operation, int]],
        timeout_s: float,
        retry_interval_s: float,
        take_entries: EntriesTaker | None = None,
    ) -> None:
        self.expected = expected
        self.take_entries = take_entries
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


class RequestTable:
    """The pending requests of one client, by request id; thread-safe.

    Args:
        timeout_s: ``read_timeout_ms``, in seconds: how long a request waits.
        retry_interval_s: ``retry_interval_ms``, in seconds: the first resend's wait.
    """

    def __init__(self, timeout_s: float, retry_interval_s: float) -> None:
        self._timeout_s = timeout_s
        self._retry_interval_s = retry_interval_s
        self._pending: dict[int, PendingRequest] = {}
        self._lock = threading.Lock()

    def __bool__(self) -> bool:
        return bool(self._pending)

    def add(
        self,
        requests: Sequence[tuple[int, int, ReplyCallback]],
        ops: Sequence[Sequence[tuple[Operation, int]]] = (),
        take_entries: EntriesTaker | None = None,
    ) -> None:
        """Wait for ``(request id, replies expected, callback)`` each, with ``ops[i]`` the
        ``(operation, bucket)`` pairs of the i-th (what a resend sends again), and
        ``take_entries`` taking their replies' entries as they arrive."""
        with self._lock:
            for i, (request_id, expected, callback) in enumerate(requests):
                self._pending[request_id] = PendingRequest(
                    expected,
                    callback,
                    ops[i] if i < len(ops) else (),
                    self._timeout_s,
                    self._retry_interval_s,
                    take_entries,
                )

    def entries_taker(self, request_id: int) -> EntriesTaker | None:
        """What takes the entries of a pending request's replies, if anything."""
        with self._lock:
            pending = self._pending.get(request_id)
            return None if pending is None else pending.take_entries

    def answered(self, reply: Reply) -> PendingRequest | None:
        """Note a reply; the request it completed (now forgotten), if it did."""
        with self._lock:
            pending = self._pending.get(reply.request_id)
            if pending is None:
                return None
            pending.replies.append(reply)
            if not reply.more:
                pending.done += 1
            if pending.done < pending.expected:
                return None
            del self._pending[reply.request_id]
        return pending

    def expired(self, now_s: float) -> list[PendingRequest]:
        """Forget and return the requests unanswered past their timeout."""
        with self._lock:
            expired = [rid for rid, p in self._pending.items() if now_s >= p.expires_at]
            return [self._pending.pop(rid) for rid in expired]

    def due_for_resend(self, now_s: float, last_reply: LastReply) -> list[tuple[Operation, int]]:
        """The unanswered changes to send again now (`regionbus.clients.resend`)."""
        with self._lock:
            return due_for_resend(self._pending.values(), now_s, self._retry_interval_s, last_reply)

    def take(self, request_ids: Sequence[int] | None = None) -> list[PendingRequest]:
        """Forget and return these requests (those still pending), or every one (None)."""
        with self._lock:
            if request_ids is None:
                taken, self._pending = list(self._pending.values()), {}
                return taken
            return [self._pending.pop(rid) for rid in request_ids if rid in self._pending]


def future_callback() -> tuple[Future[list[Reply]], ReplyCallback]:
    """A future and the callback that completes it (with the replies, or the error)."""
    future: Future[list[Reply]] = Future()

    def complete(replies: list[Reply] | None, error: BaseException | None) -> None:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(replies or [])

    return future, complete


__all__ = [
    "PENDING_CHECK_INTERVAL_S",
    "EntriesTaker",
    "PendingRequest",
    "ReplyCallback",
    "RequestTable",
    "future_callback",
]
