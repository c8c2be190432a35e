"""Application callbacks shared by clients and cache servers: listeners, writers, events.

Geode reference: ``CacheListener``, ``CacheWriter``, ``EntryEvent``, ``RegionEvent``.
Listeners run after a change; writers run before it and abort it by raising
:class:`regionbus.schemas.errors.CacheWriterError` (any other exception from a writer aborts too
and is wrapped in one).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, NamedTuple

from regionbus.schemas.errors import CacheWriterError
from regionbus.schemas.eventid import EventID
from regionbus.schemas.messages import Event, EventKind, OperationKind
from regionbus.schemas.operation_kinds import kind_row

ValueDecoder = Callable[[bytes | None, str | None], Any]
"""Turns a value's bytes and serializer name into the application's value."""


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
        is_load: True when the change is a value fetched by a ``get`` (Geode ``LOCAL_LOAD_*``),
            or one a server's ``CacheLoader`` loaded on a get's miss (Geode
            ``NET_LOAD_CREATE``).
        serializer: Name of the serializer of the values.
        is_expiration: True when the server's entry expiration made the change (Geode
            ``Operation.isExpiration()``: ``EXPIRE_DESTROY`` / ``EXPIRE_INVALIDATE``).
        is_eviction: True when this client's eviction removed the entry from its local
            cache (a local destroy; Geode ``Operation.EVICT_DESTROY``): the server still
            holds it.
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
    decoder: ValueDecoder | None = None
    is_expiration: bool = False
    is_eviction: bool = False

    @classmethod
    def of(
        cls,
        event: Event,
        *,
        kind: EventKind | None = None,
        old_value_bytes: bytes | None = None,
        origin_remote: bool = True,
        decoder: ValueDecoder | None = None,
        is_load: bool = False,
    ) -> EntryEvent:
        """The listener's view of a wire event.

        Args:
            event: An entry event (``key`` set).
            kind: The kind to report, when it differs from the event's (e.g. a client that
                holds no value reports an update as an invalidate).
            old_value_bytes: The value before the change, when known.
            origin_remote: Whether another member made the change.
            decoder: Decodes the values for ``new_value`` / ``old_value``.
            is_load: The change is a value fetched by a ``get``.
        """
        assert event.key is not None
        return cls(
            region=event.region,
            key=event.key,
            kind=event.kind if kind is None else kind,
            event_id=event.event_id,
            version=event.version,
            origin_remote=origin_remote,
            new_value_bytes=event.value,
            old_value_bytes=old_value_bytes,
            serializer=event.serializer,
            possible_duplicate=event.possible_duplicate,
            callback_argument=event.callback_argument,
            is_load=is_load or event.load,
            decoder=decoder,
            is_expiration=event.expiration,
        )

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

    def after_region_invalidate(self, event: RegionEvent) -> None:
        """Every entry of the region lost its value (Geode ``afterRegionInvalidate``): heard
        by server listeners and the invalidating client, never pushed to other clients."""

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


class LoaderHelper(NamedTuple):
    """What a ``CacheLoader`` is asked to load (Geode ``LoaderHelper``).

    Attributes:
        region: The region the get missed in.
        key: The key it missed.
        argument: The callback argument of the get that missed, or None (Geode
            ``LoaderHelper.getArgument``).
    """

    region: str
    key: str
    argument: bytes | None = None


class CacheLoader:
    """Loads the value of a key a server ``get`` misses (Geode ``CacheLoader``): read-through.

    A region has at most one loader, on its servers. It runs on a worker thread of the
    bucket's primary, never on the server's loop, at most ``loader_timeout_ms``; what it
    returns is created in the region (``LOAD_CREATE``, only if the key is still absent)
    and distributed to interested clients as a create whose ``EntryEvent.is_load`` is
    true, then answered to every get that missed it meanwhile: concurrent misses of one
    key load once.
    """

    def load(self, helper: LoaderHelper) -> Any:
        """The value of ``helper.key``, or None when there is none (nothing is created and
        the get answers None). Raising fails the get with ``CacheLoaderError``."""
        return None

    def close(self) -> None:
        """The server stops (Geode ``CacheCallback.close``)."""


AFTER_ENTRY: Final[Mapping[EventKind, str]] = {
    EventKind.CREATE: "after_create",
    EventKind.UPDATE: "after_update",
    EventKind.INVALIDATE: "after_invalidate",
    EventKind.DESTROY: "after_destroy",
}
"""The ``CacheListener`` method of each entry event kind."""

AFTER_REGION: Final[Mapping[EventKind, str]] = {
    EventKind.REGION_CLEAR: "after_region_clear",
    EventKind.REGION_DESTROY: "after_region_destroy",
    EventKind.REGION_INVALIDATE: "after_region_invalidate",
}
"""The ``CacheListener`` method of each region event kind (``None``: ``after_region_live``)."""

BEFORE: Final[Mapping[EventKind, str]] = {
    EventKind.CREATE: "before_create",
    EventKind.UPDATE: "before_update",
    EventKind.DESTROY: "before_destroy",
    EventKind.REGION_CLEAR: "before_region_clear",
    EventKind.REGION_DESTROY: "before_region_destroy",
}
"""The ``CacheWriter`` method of each kind of change a writer may veto (Geode has no
``beforeInvalidate``: an invalidate is never vetoed)."""


def region_event_kind(kind: OperationKind) -> EventKind:
    """The region event a region operation causes (CLEAR -> REGION_CLEAR, DESTROY_REGION ->
    REGION_DESTROY, INVALIDATE_REGION -> REGION_INVALIDATE: its row's ``region_event``).

    Raises:
        ValueError: ``kind`` is not a region change.
    """
    event = kind_row(kind).region_event
    if event is None:
        raise ValueError(f"{kind.value} is not a region change")
    return event


def notify_listeners(
    listeners: Iterable[CacheListener], event: EntryEvent | RegionEvent, log: logging.Logger
) -> None:
    """Call each listener's ``after_*`` method for the event, in order.

    A listener that raises is logged (with its traceback) and the others still run: a
    listener cannot undo a change that has happened.

    Args:
        listeners: The listeners of the event's region.
        event: An entry event, or a region event (``kind=None`` calls ``after_region_live``).
        log: Where a failing listener is reported.
    """
    if isinstance(event, EntryEvent):
        method = AFTER_ENTRY[event.kind]
    else:
        method = "after_region_live" if event.kind is None else AFTER_REGION[event.kind]
    for listener in listeners:
        try:
            getattr(listener, method)(event)
        except Exception:
            # The subject is formatted here only: this runs for every event a client gets.
            subject = (
                f"{event.region}/{event.key}" if isinstance(event, EntryEvent) else event.region
            )
            log.exception("CacheListener %r.%s failed for %s", listener, method, subject)


def run_writer(writer: CacheWriter, event: EntryEvent | RegionEvent, who: str) -> None:
    """Call the writer's ``before_*`` method for the event; nothing for an invalidate.

    Args:
        writer: The writer of the event's region.
        event: The change about to happen.
        who: Whose writer it is, for the error message (``"client"``, ``"server"``).

    Raises:
        CacheWriterError: the writer aborted the change (any other exception it raised is
            wrapped in one, with the original chained).
    """
    assert event.kind is not None
    method = BEFORE.get(event.kind)
    if method is None:
        return
    try:
        getattr(writer, method)(event)
    except CacheWriterError:
        raise
    except Exception as exc:
        raise CacheWriterError(f"{who} CacheWriter aborted: {type(exc).__name__}: {exc}") from exc
