"""How a client region takes an event the servers pushed through its subscription queue.

The event changes the local copy by `regionbus.clients.local_store.LocalStore`'s version rules and
becomes the event the region's listeners hear. During a durable client's replay, events
reach listeners without changing the cache, unless the event is newer than this
connection's registration snapshot of its bucket (it was then not queued while the client
was away).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from regionbus.clients.local_store import LocalStore
from regionbus.schemas.callbacks import EntryEvent, RegionEvent
from regionbus.schemas.messages import Event, EventKind


class Applied(NamedTuple):
    """What a server event did to a client region.

    Attributes:
        listener_event: What the region's listeners should hear, or None when nothing
            (a removal of a key neither held here nor seen in replay, on a caching region).
        region_destroyed: The region was destroyed on the server: it is gone here too.
    """

    listener_event: EntryEvent | RegionEvent | None
    region_destroyed: bool


def apply_server_event(
    store: LocalStore,
    event: Event,
    *,
    replay: bool,
    decoder: Callable[[bytes | None, str | None], Any],
) -> Applied:
    """Apply one server event to a region's local copy.

    Args:
        store: The region's local copy (its name and whether it caches come from it).
        event: The event.
        replay: True during durable replay (see the module's description).
        decoder: Turns a value's bytes and serializer name into the application's value.

    Returns:
        The listener event and whether the region is destroyed.
    """
    apply = True
    if replay:
        registered_at = store.registered_at(event.event_id.bucket)
        apply = registered_at is not None and event.version > registered_at
    kind = event.kind
    if kind is EventKind.UPDATE or kind is EventKind.CREATE:  # nearly every event: first
        key = event.key
        assert key is not None
        local_kind, old = store.apply_value(
            key, event.value, event.serializer, event.version, apply=apply, server_kind=kind
        )
        # EntryEvent.of's fields, positionally (once per event)
        entry_event = EntryEvent(
            event.region,
            key,
            local_kind,
            event.event_id,
            event.version,
            True,  # origin_remote
            event.value,
            old,
            event.serializer,
            event.possible_duplicate,
            event.callback_argument,
            event.load,  # is_load: a server's loader created it
            decoder,
            event.expiration,
        )
        return Applied(entry_event, False)
    if kind is EventKind.REGION_INVALIDATE:
        # Never pushed (docs/behaviour.md §3); an event of it in a queue changes nothing here.
        return Applied(None, False)
    if kind.is_region_event:
        if apply:
            store.cleared(event.version)
        else:
            store.forget_replayed()
        region_event = RegionEvent(
            store.region, kind, event.event_id, True, event.callback_argument
        )
        return Applied(region_event, kind is EventKind.REGION_DESTROY and apply)
    assert event.key is not None
    removal = store.apply_removal(
        kind, event.key, event.version, event.serializer, apply=apply, replay=replay
    )
    if not removal.held and store.caching:
        return Applied(None, False)
    entry_event = EntryEvent.of(
        event._replace(value=None, serializer=removal.serializer),
        old_value_bytes=removal.old_value,
        decoder=decoder,
    )
    return Applied(entry_event, False)


__all__ = ["Applied", "apply_server_event"]
