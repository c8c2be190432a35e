"""Which queued updates subscription conflation drops (pure logic)."""

from __future__ import annotations

from regionbus.clients.conflation import superseded_updates
from regionbus.schemas.eventid import EventID
from regionbus.schemas.messages import Event, EventKind, Marker


def _event(kind: EventKind, key: str | None, region: str = "r", seq: int = 0) -> Event:
    return Event(EventID("m", 1, seq, 0), kind, region, seq, 0, "w", key)


def test_only_updates_followed_by_a_newer_update_of_the_same_key_are_dropped() -> None:
    queue = [
        _event(EventKind.CREATE, "a"),
        _event(EventKind.UPDATE, "a"),
        _event(EventKind.UPDATE, "b"),
        _event(EventKind.UPDATE, "a"),
        _event(EventKind.UPDATE, "a", region="other"),
    ]
    assert superseded_updates(queue) == {1}


def test_a_destroy_invalidate_or_region_event_in_between_keeps_the_earlier_update() -> None:
    for barrier in (
        _event(EventKind.DESTROY, "a"),
        _event(EventKind.INVALIDATE, "a"),
        _event(EventKind.REGION_CLEAR, None),
    ):
        queue = [_event(EventKind.UPDATE, "a"), barrier, _event(EventKind.UPDATE, "a")]
        assert superseded_updates(queue) == set(), barrier


def test_markers_are_never_dropped_and_do_not_stop_conflation() -> None:
    queue = [_event(EventKind.UPDATE, "a"), Marker("c", 0, 0, "x"), _event(EventKind.UPDATE, "a")]
    assert superseded_updates(queue) == {0}
