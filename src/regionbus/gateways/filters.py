"""The gateway receiver's application hook: the conflict resolver (Geode API names).

:class:`GatewayConflictResolver` (Geode ``GatewayConflictResolver``) runs in the gateway
receiver for an event whose entry was last changed by another site, and may disallow the
event or change its value. It is named in settings as ``"package.module:ClassName"`` and
built by :func:`regionbus.schemas.hooks.load_hook` (never unpickled). Event filters, which run in
the cache servers too, are :class:`regionbus.schemas.hooks.GatewayEventFilter`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from regionbus.schemas.messages import Event, EventKind
from regionbus.schemas.redis_values import GatewayVersion

if TYPE_CHECKING:
    from regionbus.broker.store import RegionStore


class TimestampedEntryEvent(NamedTuple):
    """What a :class:`GatewayConflictResolver` sees (Geode ``TimestampedEntryEvent``).

    Attributes:
        region: Region name.
        key: Entry key.
        kind: The incoming event's kind (CREATE, UPDATE or DESTROY).
        new_value: The incoming value bytes (None for a destroy).
        old_value: The entry's current value bytes (None when invalid or destroyed).
        serializer: Serializer name of the values.
        new_timestamp_ms: The incoming event's timestamp, ms since the Unix epoch.
        old_timestamp_ms: The entry's stored timestamp, ms since the Unix epoch.
        new_distributed_system_id: Site id where the incoming event was made.
        old_distributed_system_id: Site id where the entry was last changed.
    """

    region: str
    key: str
    kind: EventKind
    new_value: bytes | None
    old_value: bytes | None
    serializer: str | None
    new_timestamp_ms: int
    old_timestamp_ms: int
    new_distributed_system_id: int
    old_distributed_system_id: int


class GatewayConflictHelper:
    """Lets a resolver disallow the event or replace its value (Geode ``GatewayConflictHelper``)."""

    def __init__(self) -> None:
        self.disallowed = False
        self.new_value: bytes | None = None
        self.value_changed = False

    def disallow_event(self) -> None:
        """Do not apply the incoming event: the entry keeps its current value."""
        self.disallowed = True

    def change_event_value(self, value: bytes) -> None:
        """Apply the incoming event with this value (encoded bytes) instead of its own."""
        self.new_value = value
        self.value_changed = True


class GatewayConflictResolver:
    """Decides about an incoming event whose entry was last changed by another site.

    Without a resolver, or when it allows the event, the default rule still holds at apply
    time (atomically in Redis): the later timestamp wins, on a tie the higher site id. A
    resolver can therefore keep the existing value or change the incoming one, but cannot
    force an older event over a newer one (docs/gateways.md).
    """

    def on_event(self, event: TimestampedEntryEvent, helper: GatewayConflictHelper) -> None:
        """Inspect the conflict; call ``helper.disallow_event()`` or
        ``helper.change_event_value(...)``, or nothing to allow it."""


def conflicts(current: GatewayVersion | None, origin_site_id: int) -> bool:
    """Whether a change made at ``origin_site_id`` meets an entry last changed at another
    site (``current``: the entry's gateway version here; None: no change known), the only
    case a resolver is asked about (Geode: an event whose entry another distributed system
    last changed)."""
    return current is not None and current.site_id != origin_site_id


def consult(
    resolver: GatewayConflictResolver, event: TimestampedEntryEvent
) -> tuple[bool, bytes | None]:
    """Ask ``resolver`` about ``event``.

    Returns:
        ``(allowed, value)``: whether the change may be applied, and the value to apply
        (the resolver's replacement, else ``event.new_value``).

    Raises:
        Exception: whatever the resolver raises.
    """
    helper = GatewayConflictHelper()
    resolver.on_event(event, helper)
    if helper.disallowed:
        return False, None
    return True, helper.new_value if helper.value_changed else event.new_value


def resolve_conflict(
    store: RegionStore, resolver: GatewayConflictResolver, event: Event, bucket: int
) -> bytes | None:
    """Run ``resolver`` on a gateway event whose entry another site changed last.

    Args:
        store: This site's region store (read: the entry and its gateway version).
        resolver: The receiver's resolver.
        event: The event from the remote site (a keyed entry event).
        bucket: The entry's bucket here.

    Returns:
        The value to apply (the event's, or the resolver's), or None when disallowed.

    Raises:
        TransportError: Redis could not be read.
    """
    assert event.key is not None
    version = store.gateway_version(event.region, event.key, bucket)
    origin = event.origin_site_id
    if not conflicts(version, origin):
        return event.value
    assert version is not None
    _, entry = store.get(event.region, event.key, bucket)
    allowed, value = consult(
        resolver,
        TimestampedEntryEvent(
            region=event.region,
            key=event.key,
            kind=event.kind,
            new_value=event.value,
            old_value=entry.value if entry is not None else None,
            serializer=event.serializer,
            new_timestamp_ms=event.timestamp_ms,
            old_timestamp_ms=version.timestamp_ms,
            new_distributed_system_id=origin,
            old_distributed_system_id=version.site_id,
        ),
    )
    return value if allowed else None


__all__ = [
    "GatewayConflictHelper",
    "GatewayConflictResolver",
    "TimestampedEntryEvent",
    "conflicts",
    "consult",
    "resolve_conflict",
]
