"""The client's resend schedule: exponential backoff up to a cap, and quiet servers."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from regionbus.clients.pending import PendingRequest
from regionbus.clients.resend import (
    MAX_RESENDS_IN_FLIGHT,
    RESEND_BACKOFF_CAP_S,
    LastReply,
    due_for_resend,
    resend_delay_s,
)
from regionbus.schemas.eventid import EventID
from regionbus.schemas.messages import Operation, OperationKind


def test_the_resend_delay_doubles_from_the_retry_interval_up_to_the_cap() -> None:
    delays = [resend_delay_s(attempt, 0.3, cap_s=5.0) for attempt in range(8)]
    assert delays == [0.3, 0.6, 1.2, 2.4, 4.8, 5.0, 5.0, 5.0]


def test_a_retry_interval_longer_than_the_cap_is_the_delay() -> None:
    assert resend_delay_s(3, 60.0, cap_s=RESEND_BACKOFF_CAP_S) == 60.0


@given(
    attempt=st.integers(min_value=0, max_value=10_000),
    interval_s=st.floats(min_value=0.01, max_value=3600),
)
def test_the_resend_delay_never_shrinks_and_stays_bounded(attempt: int, interval_s: float) -> None:
    now = resend_delay_s(attempt, interval_s)
    assert interval_s <= now <= max(RESEND_BACKOFF_CAP_S, interval_s)
    assert resend_delay_s(attempt + 1, interval_s) >= now


def test_the_servers_are_quiet_since_a_send_until_a_reply_comes_after_it() -> None:
    last = LastReply()
    assert last.quiet_since(100.0)
    last.answered(at_s=100.5)
    assert not last.quiet_since(100.0)
    assert last.quiet_since(101.0)


def _change(i: int) -> tuple[Operation, int]:
    return Operation(
        i, "c", OperationKind.PUT, "r", 0, event_id=EventID("m", 1, i, 0), key=f"k{i}"
    ), 0


def _pending(ops: int, first: int = 0) -> PendingRequest:
    return PendingRequest(1, lambda *_: None, [_change(first + i) for i in range(ops)], 30.0, 1.0)


def test_unanswered_changes_are_resent_marked_possible_duplicate_then_backed_off() -> None:
    request = _pending(2)
    assert due_for_resend([request], request.sent_at + 0.5, 1.0, LastReply()) == []
    now = request.sent_at + 1.0
    again = due_for_resend([request], now, 1.0, LastReply())
    assert [op.event_id for op, _ in again] == [op.event_id for op, _ in request.ops]
    assert all(op.possible_duplicate for op, _ in again)
    assert (request.attempts, request.sent_at, request.resend_at) == (1, now, now + 2.0)
    assert due_for_resend([request], now + 1.0, 1.0, LastReply()) == []


def test_no_resend_while_servers_answer_and_at_most_the_cap_in_flight() -> None:
    busy = _pending(1)
    answering = LastReply()
    answering.answered(busy.sent_at + 0.1)
    assert due_for_resend([busy], busy.sent_at + 5.0, 1.0, answering) == []
    many = [_pending(MAX_RESENDS_IN_FLIGHT // 2, i * 1_000) for i in range(3)]
    again = due_for_resend(many, many[-1].sent_at + 5.0, 1.0, LastReply())
    assert len(again) <= MAX_RESENDS_IN_FLIGHT
    assert [r.attempts for r in many] == [1, 1, 0]
