"""The client's resend schedule: exponential backoff up to a cap, and quiet servers."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from regionbus.clients.resend import RESEND_BACKOFF_CAP_S, LastReply, resend_delay_s


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
