"""What a continuous query's application code sees: its listeners, events, attributes,
results, state and statistics (Geode ``CqListener``, ``CqStatusListener``, ``CqEvent``,
``CqAttributes``, ``CqState``, ``CqStatistics``; ``CqResults`` rows are
:class:`CqResult`)."""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from regionbus.schemas.errors import CqEvaluationError
from regionbus.schemas.eventid import EventID
from regionbus.schemas.messages import EventKind

if TYPE_CHECKING:
    from regionbus.clients.cq_query import CqQuery

log = logging.getLogger("regionbus.client")

Operation = EventKind
"""Geode's ``Operation`` for CQ events: a CQ event's ``base_operation`` (the region change:
CREATE, UPDATE, DESTROY, INVALIDATE, REGION_CLEAR, REGION_DESTROY) and its
``query_operation`` (CREATE, UPDATE, DESTROY, REGION_CLEAR, REGION_DESTROY; SPEC §9)."""


class CqState(enum.Enum):
    """A CQ's state (Geode ``CqState``): created STOPPED; ``execute`` makes it RUNNING,
    ``stop`` STOPPED again, ``close`` (or its region's destruction) CLOSED for good."""

    STOPPED = "STOPPED"
    RUNNING = "RUNNING"
    CLOSED = "CLOSED"


@dataclass(frozen=True, slots=True)
class CqEvent:
    """A change as one continuous query sees it (Geode ``CqEvent``).

    Attributes:
        cq: The CQ it belongs to.
        base_operation: The region change (CREATE, UPDATE, DESTROY, INVALIDATE,
            REGION_CLEAR, REGION_DESTROY).
        query_operation: What it did to the CQ's result set: CREATE (the entry entered it),
            UPDATE (it stayed in), DESTROY (it left), REGION_CLEAR, REGION_DESTROY; None
            for an error event (``throwable`` set).
        key: The entry's key (None for a region event).
        new_value: The entry's value after the change (None after a destroy or
            invalidate, or for a region event).
        throwable: Why the servers could not evaluate the CQ on this change (a value of the
            wrong shape or type), for ``CqListener.on_error``; else None.
        event_id: The change's EventID.
        possible_duplicate: The change may have been delivered before (resent after a
            failover); message tracking has already dropped what this client saw.
    """

    cq: CqQuery
    base_operation: EventKind
    query_operation: EventKind | None
    key: str | None
    new_value: Any
    throwable: CqEvaluationError | None
    event_id: EventID
    possible_duplicate: bool = False


class CqResult(NamedTuple):
    """One entry of a CQ's result set, as ``execute_with_initial_results`` returns it
    (Geode's ``Struct`` of ``key`` and ``value``)."""

    key: str
    value: Any


class CqListener:
    """Hears a continuous query's events (Geode ``CqListener``). Subclass and override.

    Listeners run on the client's subscription thread, in the order of each bucket's
    changes; an exception is logged and the next listener still runs.
    """

    def on_event(self, event: CqEvent) -> None:
        """A change entered, changed in, or left the CQ's result set, or its region was
        cleared or destroyed."""

    def on_error(self, event: CqEvent) -> None:
        """The servers could not evaluate the CQ on a change (``event.throwable`` says
        why); the CQ keeps running."""

    def close(self) -> None:
        """The CQ was closed (by ``close``, ``close_cqs``, its region's destruction, or the
        client cache's close)."""


class CqStatusListener(CqListener):
    """A :class:`CqListener` that also hears when the CQ is connected to the servers
    (Geode ``CqStatusListener``)."""

    def on_cq_connected(self) -> None:
        """The CQ runs on the servers: after a successful ``execute``, and when the
        servers answer again after an outage."""

    def on_cq_disconnected(self) -> None:
        """The servers stopped answering this client (its pings fail); events may be
        waiting in its queue."""


@dataclass
class CqAttributes:
    """A CQ's attributes (Geode ``CqAttributes``): its listeners, called in order.

    Args:
        listeners: ``CqListener`` (or ``CqStatusListener``) instances.
    """

    listeners: Sequence[CqListener] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        self.listeners = tuple(self.listeners)


@dataclass
class CqStatistics:
    """Counters of one CQ's events (Geode ``CqStatistics``): every event delivered to its
    listeners, and those whose query operation was CREATE (inserts), UPDATE (updates) or
    DESTROY (deletes)."""

    events: int = 0
    inserts: int = 0
    updates: int = 0
    deletes: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def count(self, operation: EventKind | None) -> None:
        """Count one delivered event of this query operation."""
        with self._lock:
            self.events += 1
            if operation is EventKind.CREATE:
                self.inserts += 1
            elif operation is EventKind.UPDATE:
                self.updates += 1
            elif operation is EventKind.DESTROY:
                self.deletes += 1


def notify_cq_listeners(listeners: Iterable[CqListener], event: CqEvent) -> None:
    """Call ``on_event`` (or ``on_error`` for an error event) of each listener, logging
    what one raises (Geode ``CqServiceImpl.invokeListeners``)."""
    for listener in listeners:
        try:
            if event.throwable is None:
                listener.on_event(event)
            else:
                listener.on_error(event)
        except Exception:
            log.exception("CqListener of CQ %s failed", event.cq.name)


def call_cq_listeners(listeners: Iterable[CqListener], method: str, cq_name: str) -> None:
    """Call ``close``, ``on_cq_connected`` or ``on_cq_disconnected`` on each listener that
    has it, logging what one raises."""
    for listener in listeners:
        callback = getattr(listener, method, None)
        if callback is None:
            continue
        try:
            callback()
        except Exception:
            log.exception("CqListener.%s of CQ %s failed", method, cq_name)


__all__ = [
    "CqAttributes",
    "CqEvent",
    "CqListener",
    "CqResult",
    "CqState",
    "CqStatistics",
    "CqStatusListener",
    "Operation",
    "call_cq_listeners",
    "notify_cq_listeners",
]
