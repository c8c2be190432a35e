"""How a client region reads its values and describes the changes it makes itself.

Values are stored as bytes with the name of the serializer that wrote them; a region
decodes them with its own serializer, or with the named one when another wrote them. A
change this client makes (a put, destroy, invalidate or load here) reaches its writer and
listeners as an :class:`EntryEvent` with ``origin_remote=False`` (Geode's
``EntryEvent.isOriginRemote``), decoding its values only when a callback reads them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from regionbus.schemas.callbacks import EntryEvent
from regionbus.schemas.eventid import EventID
from regionbus.schemas.messages import EventKind
from regionbus.schemas.serializers import Serializer, serializer_named


class RegionValues:
    """The value decoding and own-change events of one client region.

    Args:
        region: The region's name.
        serializer: Returns the region's serializer now (it may be replaced after the
            region is made).
    """

    def __init__(self, region: str, serializer: Callable[[], Serializer]) -> None:
        self._region = region
        self._serializer = serializer

    def decode(self, data: bytes, serializer: str | None) -> Any:
        """A stored value as the application sees it.

        Args:
            data: The value's bytes.
            serializer: The name of the serializer that wrote them (None: the region's).

        Raises:
            SerializationError: the bytes do not decode, or the serializer is unknown.
        """
        own = self._serializer()
        if serializer == own.name:
            return own.loads(data)
        return serializer_named(serializer, {own.name: own}).loads(data)

    def decode_value(self, data: bytes | None, serializer: str | None) -> Any:
        """:meth:`decode`, with None for no value (an invalid or absent entry)."""
        return None if data is None else self.decode(data, serializer)

    def entry_event(
        self,
        kind: EventKind,
        key: str,
        version: int,
        *,
        new: bytes | None = None,
        old: bytes | None = None,
        serializer: str | None = None,
        event_id: EventID | None = None,
        callback_argument: bytes | None = None,
        is_load: bool = False,
        is_eviction: bool = False,
    ) -> EntryEvent:
        """A change made by this client (``origin_remote=False``), for its writer or
        listeners; ``version`` is -1 before the server applied it."""
        return EntryEvent(
            region=self._region,
            key=key,
            kind=kind,
            event_id=event_id,
            version=version,
            origin_remote=False,
            new_value_bytes=new,
            old_value_bytes=old,
            serializer=serializer,
            callback_argument=callback_argument,
            is_load=is_load,
            decoder=self.decode_value,
            is_eviction=is_eviction,
        )


__all__ = ["RegionValues"]
