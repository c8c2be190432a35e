"""A client reader's poll timeout: brisk while in use, slow once left alone."""

from __future__ import annotations

import pytest

from regionbus.clients.poll_pace import BUSY_POLL_S, IDLE_AFTER_S, IDLE_POLL_S, PollPace


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [500.0]
    monkeypatch.setattr("regionbus.clients.poll_pace.time.monotonic", lambda: now[0])
    return now


def test_a_reader_polls_briskly_in_use_and_slowly_once_idle(clock: list[float]) -> None:
    pace = PollPace()
    assert pace.timeout_s() == BUSY_POLL_S, "a new reader is in use (it just connected)"
    clock[0] += IDLE_AFTER_S - 0.01
    assert pace.timeout_s() == BUSY_POLL_S
    clock[0] += 0.02
    assert pace.timeout_s() == IDLE_POLL_S
    pace.busy()
    assert pace.timeout_s() == BUSY_POLL_S
    clock[0] += IDLE_AFTER_S
    assert pace.timeout_s() == IDLE_POLL_S


def test_an_idle_reader_wakes_a_tenth_as_often_and_never_past_a_second() -> None:
    assert IDLE_POLL_S / BUSY_POLL_S >= 10
    assert IDLE_POLL_S <= 1.0, "an idle cache's close waits up to one idle poll"
