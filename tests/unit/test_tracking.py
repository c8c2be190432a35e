"""Client message tracking (docs/behaviour.md §2): duplicates dropped per (member, thread, bucket);
idle entries expire after the tracking timeout."""

from __future__ import annotations

from regionbus.clients.tracking import MessageTracker
from regionbus.schemas.eventid import EventID


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_sequence_id_not_above_the_highest_seen_is_a_duplicate() -> None:
    tracker = MessageTracker(900, Clock())
    assert tracker.is_new(EventID("m", 1, 0, 0))
    assert tracker.is_new(EventID("m", 1, 1, 0))
    assert not tracker.is_new(EventID("m", 1, 1, 0))
    assert not tracker.is_new(EventID("m", 1, 0, 0))
    assert tracker.is_new(EventID("m", 1, 5, 0))  # gaps are fine: other buckets took 2-4
    assert tracker.duplicates == 2


def test_tracking_is_per_member_thread_and_bucket() -> None:
    tracker = MessageTracker(900, Clock())
    assert tracker.is_new(EventID("m", 1, 10, 0))
    assert tracker.is_new(EventID("m", 1, 3, 1))  # same thread, another bucket
    assert tracker.is_new(EventID("m", 2, 3, 0))  # another thread
    assert tracker.is_new(EventID("n", 1, 3, 0))  # another member
    assert len(tracker) == 4


def test_idle_entries_expire_after_the_timeout() -> None:
    clock = Clock()
    tracker = MessageTracker(900, clock)
    tracker.is_new(EventID("old", 1, 7, 0))
    clock.now = 500
    tracker.is_new(EventID("young", 1, 7, 0))
    clock.now = 901
    assert tracker.expire() == 1
    assert len(tracker) == 1
    # forgotten: the same sequence id counts as new again (the thread was gone)
    assert tracker.is_new(EventID("old", 1, 7, 0))
    assert not tracker.is_new(EventID("young", 1, 7, 0))


def test_activity_keeps_an_entry_alive() -> None:
    clock = Clock()
    tracker = MessageTracker(100, clock)
    for step in range(10):
        clock.now = step * 60.0
        assert tracker.is_new(EventID("m", 1, step, 0))
    clock.now = 600
    assert tracker.expire() == 0
