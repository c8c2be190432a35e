"""A large call's requests, a bounded number in flight, and the verdict of each entry of a
bulk call: applied, known not applied, or of unknown outcome (a fake pool answers)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from regionbus.clients.server_proxy import raise_first_error
from regionbus.clients.windowed import put_or_remove_all, send_windowed
from regionbus.schemas.errors import (
    KafkaAuthorizationError,
    ServerTimeoutError,
    TransportError,
)
from regionbus.schemas.messages import Operation, OperationKind, Reply

Answer = Callable[[Operation], tuple[list[Reply] | None, BaseException | None]]


class _Pool:
    """Answers each request at once, on another thread, as ``answer`` says; records how
    many were unanswered at most."""

    def __init__(self, answer: Answer, refuse_after: int | None = None) -> None:
        self.answer = answer
        self.refuse_after = refuse_after
        self.sent = 0
        self.in_flight = 0
        self.most_in_flight = 0
        self.lock = threading.Lock()
        self.settings = type("S", (), {"read_timeout_ms": 1000})()

    def request_each_with_callbacks(
        self,
        ops: Sequence[tuple[Operation, int]],
        callbacks: Sequence[Any],
        take_entries: Any = None,
    ) -> None:
        if self.refuse_after is not None and self.sent >= self.refuse_after:
            raise TransportError("the producer queue stayed full")
        with self.lock:
            self.sent += len(ops)
            self.in_flight += len(ops)
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        for (op, _), callback in zip(ops, callbacks, strict=True):
            threading.Thread(target=self._reply, args=(op, callback)).start()

    def _reply(self, op: Operation, callback: Any) -> None:
        replies, error = self.answer(op)
        with self.lock:
            self.in_flight -= 1
        callback(replies, error)

    def forget(self, request_id: int) -> None:
        pass


def _puts(count: int) -> list[tuple[Operation, int]]:
    return [
        (Operation(i, "c", OperationKind.PUT, "r", 0, key=f"k{i}", value=b"v"), i % 16)
        for i in range(count)
    ]


def _ok(op: Operation) -> tuple[list[Reply] | None, BaseException | None]:
    return [Reply(op.request_id, 0, True)], None


def test_no_more_than_the_window_is_ever_unanswered_and_every_request_is_sent() -> None:
    pool = _Pool(_ok)
    seen: list[int] = []
    sent = send_windowed(
        pool,  # type: ignore[arg-type]
        _puts(1000),
        lambda i, *_: seen.append(i) or True,
        window=64,
        group=8,
    )
    assert sent == 1000 and sorted(seen) == list(range(1000))
    assert pool.most_in_flight <= 64


def test_each_entry_is_applied_refused_or_unknown_and_none_is_sent_after_a_timeout() -> None:
    def answer(op: Operation) -> tuple[list[Reply] | None, BaseException | None]:
        if op.request_id == 3:
            return [Reply(op.request_id, 0, False, "CacheWriterError", "vetoed")], None
        if op.request_id == 4:
            return None, KafkaAuthorizationError("refused", resource="topic x", kafka_error="X")
        if op.request_id == 200:
            return None, ServerTimeoutError("no reply")
        return _ok(op)

    def finish(op: Operation, reply: Reply) -> None:
        raise_first_error([reply])

    pool = _Pool(answer)
    outcome = put_or_remove_all(
        pool,  # type: ignore[arg-type]
        _puts(1000),
        finish,
        skip_missing=False,
        window=16,
    )
    assert set(outcome.unknown) == {"k200"}
    assert {"k3", "k4"} <= set(outcome.failures)
    assert not set(outcome.applied) & (set(outcome.failures) | set(outcome.unknown))
    assert set(outcome.applied) | set(outcome.failures) | set(outcome.unknown) == {
        f"k{i}" for i in range(1000)
    }
    # Sending stopped at the timeout: at most a window more went out after it.
    assert pool.sent <= 200 + 1 + 16
    assert len(outcome.failures) >= 1000 - pool.sent


def test_entries_the_producer_refused_to_take_are_failed_not_unknown() -> None:
    pool = _Pool(_ok, refuse_after=64)
    outcome = put_or_remove_all(
        pool,  # type: ignore[arg-type]
        _puts(200),
        lambda op, reply: None,
        skip_missing=False,
        window=32,
    )
    assert len(outcome.applied) == 64
    assert not outcome.unknown
    assert len(outcome.failures) == 136
