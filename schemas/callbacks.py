"""Application callbacks shared by clients and cache servers: listeners, writers, events.

Geode reference: ``CacheListener``, ``CacheWriter``, ``EntryEvent``, ``RegionEvent``.
Listeners run after a change; writers run before it and abort it by raising
:class:`schemas.errors.CacheWriterError` (any other exception from a writer aborts too
and is wrapped in one).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from schemas.eventid import EventID
from schemas.messages import EventKind


class EntryEvent(NamedTuple):
    """A change to one entry, as a listener or writer sees it.

    Attributes:
        region: Region name.
        key: Entry key.
        kind: CREATE, UPDATE, INVALIDATE or DESTROY.
        event_id: The EventID of the originating operation (None for a local-only change
            such as a client invalidate or a load after a get).
        version: Region-wide entry version after the change (-1 when not known).
        origin_remote: True when the change was made by another member (Geode
            ``isOriginRemote``).
        possible_duplicate: The event may have been delivered before (resent after a failure).
        callback_argument: Opaque bytes the originator attached, or None.
        is_load: True when the change is a value fetched by a ``get`` (Geode ``LOCAL_LOAD_*``).
        serializer: Name of the serializer of the values.
    """

    region: str
    key: str
    kind: EventKind
    event_id: EventID | None
    version: int
    origin_remote: bool
    new_value_bytes: bytes | None = None
    old_value_bytes: bytes | None = None
    serializer: str | None = None
    possible_duplicate: bool = False
    callback_argument: bytes | None = None
    is_load: bool = False
    decoder: Callable[[bytes | None, str | None], Any] | None = None

    @property
    def new_value(self) -> Any:
        """The new value, decoded (None for invalidate and destroy)."""
        return self._decode(self.new_value_bytes)

    @property
    def old_value(self) -> Any:
        """The value before the change, decoded, when known (None otherwise)."""
        return self._decode(self.old_value_bytes)

    def _decode(self, data: bytes | None) -> Any:
        if data is None:
            return None
        if self.decoder is None:
            return data
        return self.decoder(data, self.serializer)


class RegionEvent(NamedTuple):
    """A change to a whole region (clear, destroy, or a durable region going live).

    Attributes:
        region: Region name.
        kind: REGION_CLEAR or REGION_DESTROY; None for ``after_region_live``.
        event_id: EventID of the originating operation, None for local events.
        origin_remote: True when another member made the change.
        callback_argument: Opaque bytes the originator attached, or None.
    """

    region: str
    kind: EventKind | None
    event_id: EventID | None
    origin_remote: bool
    callback_argument: bytes | None = None


class CacheListener:
    """Receives events after changes. Override what you need; every method defaults to no-op.

    Listeners must not block for long: they run on the thread that delivers events.
    """

    def after_create(self, event: EntryEvent) -> None:
        """An entry was created."""

    def after_update(self, event: EntryEvent) -> None:
        """An entry's value was replaced."""

    def after_invalidate(self, event: EntryEvent) -> None:
        """An entry's value was dropped; the key stays."""

    def after_destroy(self, event: EntryEvent) -> None:
        """An entry was removed."""

    def after_region_clear(self, event: RegionEvent) -> None:
        """Every entry of the region was removed."""

    def after_region_destroy(self, event: RegionEvent) -> None:
        """The region was destroyed."""

    def after_region_live(self, event: RegionEvent) -> None:
        """A durable client's replayed events are done (the marker was reached)."""


class CacheWriter:
    """Vetoes changes before they happen: raise ``CacheWriterError`` to abort.

    Every method defaults to allowing the change.
    """

    def before_create(self, event: EntryEvent) -> None:
        """An entry is about to be created."""

    def before_update(self, event: EntryEvent) -> None:
        """An entry's value is about to be replaced."""

    def before_destroy(self, event: EntryEvent) -> None:
        """An entry is about to be removed."""

    def before_region_clear(self, event: RegionEvent) -> None:
        """The region is about to be cleared."""

    def before_region_destroy(self, event: RegionEvent) -> None:
        """The region is about to be destroyed."""
