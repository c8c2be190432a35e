"""Application hooks of gateways: event filters and the conflict resolver (Geode API names).

- :class:`GatewayEventFilter` (Geode ``GatewayEventFilter``): ``before_enqueue`` runs in the
  cache server when an event would be queued (False = never queued); ``before_transmit``
  runs in the sender processor before a batch is sent (False = not sent, still removed);
  ``after_acknowledgement`` runs after the remote site acked the batch.
- :class:`GatewayConflictResolver` (Geode ``GatewayConflictResolver``): runs in the gateway
  receiver for an event whose entry was last changed by another site, and may disallow the
  event or change its value.

Hooks are named in settings as ``"package.module:ClassName"`` and built by
:func:`load_hook` (never unpickled).
"""

from __future__ import annotations

import importlib
from typing import Any, NamedTuple, TypeVar

from schemas.errors import ConfigurationError
from schemas.messages import Event, EventKind

T = TypeVar("T")


class GatewayEventFilter:
    """Filters what a gateway sender queues and transmits. Every method defaults to pass."""

    def before_enqueue(self, event: Event) -> bool:
        """Called in the cache server before the event is queued; False drops it."""
        return True

    def before_transmit(self, event: Event) -> bool:
        """Called in the sender before the event is sent; False leaves it out of the batch
        (it is still removed from the queue with the batch)."""
        return True

    def after_acknowledgement(self, event: Event) -> None:
        """Called in the sender after the remote site acked the batch holding the event."""


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
    force an older event over a newer one (see README).
    """

    def on_event(self, event: TimestampedEntryEvent, helper: GatewayConflictHelper) -> None:
        """Inspect the conflict; call ``helper.disallow_event()`` or
        ``helper.change_event_value(...)``, or nothing to allow it."""


def load_hook(name: str, base: type[T]) -> T:
    """Instantiate ``"package.module:ClassName"`` and check it is a ``base``.

    Args:
        name: The class's import path.
        base: The class it must derive from.

    Returns:
        A new instance (built with no arguments).

    Raises:
        ConfigurationError: the name does not import or is not a ``base``.
    """
    module_name, _, class_name = name.partition(":")
    try:
        instance: Any = getattr(importlib.import_module(module_name), class_name)()
    except (ImportError, AttributeError, TypeError, ValueError) as exc:
        raise ConfigurationError(f"cannot load {base.__name__} {name!r}: {exc}") from exc
    if not isinstance(instance, base):
        raise ConfigurationError(f"{name!r} is not a {base.__name__}")
    return instance


__all__ = [
    "GatewayConflictHelper",
    "GatewayConflictResolver",
    "GatewayEventFilter",
    "TimestampedEntryEvent",
    "load_hook",
]
