"""A pushed event applied to a client region: what changes in the local copy, what the
listeners hear, and when the region is gone (durable replay included; no Kafka, no
Redis)."""

from __future__ import annotations

from typing import Any

from regionbus.clients.local_store import LocalEntry, LocalStore
from regionbus.clients.server_events import apply_server_event
from regionbus.schemas.callbacks import EntryEvent, RegionEvent
from regionbus.schemas.eventid import EventID
from regionbus.schemas.messages import Event, EventKind


def _event(
    kind: EventKind, version: int, key: str | None = "k", value: bytes | None = None
) -> Event:
    return Event(
        EventID("server-1", 1, version, bucket=3),
        kind,
        "r",
        version,
        0,
        "c-other",
        key=key,
        value=value,
        serializer="json" if value is not None else None,
    )


def _decode(data: bytes | None, serializer: str | None) -> Any:
    return None if data is None else data.decode()


def test_a_live_update_changes_the_cache_and_listeners_hear_the_old_value() -> None:
    store = LocalStore("r", caching=True)
    store.apply_value("k", b"old", "json", 1)

    applied = apply_server_event(
        store, _event(EventKind.UPDATE, 2, value=b"new"), replay=False, decoder=_decode
    )

    assert store.entry("k") == LocalEntry(b"new", "json", 2)
    assert isinstance(applied.listener_event, EntryEvent)
    assert applied.listener_event.kind is EventKind.UPDATE
    assert (applied.listener_event.old_value, applied.listener_event.new_value) == ("old", "new")
    assert not applied.region_destroyed


def test_a_replayed_event_changes_the_cache_only_if_newer_than_the_registration() -> None:
    store = LocalStore("r", caching=True)
    store.registered(3, 10)

    queued = apply_server_event(
        store, _event(EventKind.CREATE, 9, value=b"queued"), replay=True, decoder=_decode
    )
    assert queued.listener_event is not None
    assert "k" not in store, "an event queued while away leaves the cache as it was"

    after = apply_server_event(
        store, _event(EventKind.CREATE, 11, value=b"after"), replay=True, decoder=_decode
    )
    assert after.listener_event is not None
    assert store.entry("k") == LocalEntry(b"after", "json", 11)


def test_a_removal_of_a_key_not_held_is_silent_on_a_caching_region_and_heard_on_a_proxy() -> None:
    caching = apply_server_event(
        LocalStore("r", caching=True), _event(EventKind.DESTROY, 5), replay=False, decoder=_decode
    )
    proxy = apply_server_event(
        LocalStore("r", caching=False), _event(EventKind.DESTROY, 5), replay=False, decoder=_decode
    )

    assert caching.listener_event is None
    assert isinstance(proxy.listener_event, EntryEvent)
    assert proxy.listener_event.kind is EventKind.DESTROY


def test_a_region_destroy_ends_the_region_unless_it_is_replayed_from_before_registration() -> None:
    store = LocalStore("r", caching=True)
    store.apply_value("k", b"v", "json", 1)

    replayed = apply_server_event(
        store, _event(EventKind.REGION_DESTROY, 2, key=None), replay=True, decoder=_decode
    )
    assert not replayed.region_destroyed
    assert "k" in store

    live = apply_server_event(
        store, _event(EventKind.REGION_DESTROY, 3, key=None), replay=False, decoder=_decode
    )
    assert live.region_destroyed
    assert isinstance(live.listener_event, RegionEvent)
    assert len(store) == 0


def test_a_create_or_update_is_heard_as_entry_event_of_builds_it() -> None:
    store = LocalStore("r", caching=True)
    store.apply_value("k", b"old", "json", 1)
    event = Event(
        EventID("server-1", 1, 2, bucket=3),
        EventKind.UPDATE,
        "r",
        2,
        0,
        "c-other",
        key="k",
        value=b"new",
        serializer="json",
        possible_duplicate=True,
        callback_argument=b"cb",
        expiration=True,
    )

    applied = apply_server_event(store, event, replay=False, decoder=_decode)

    assert applied.listener_event == EntryEvent.of(
        event, kind=EventKind.UPDATE, old_value_bytes=b"old", decoder=_decode
    )
