r"""``CqQuery``: one continuous query of a client (Geode ``CqQuery`` / ``ClientCQImpl``).

A CQ is created STOPPED by ``QueryService.new_cq``. ``execute`` registers it in every
bucket (each bucket's primary starts delivering at that point of the bucket's order);
``execute_with_initial_results`` also returns the entries in its result set at that point,
so together with the events that follow there is no gap (docs/behaviour.md §9). Events that arrive
while an execute is under way are held and handed to the listeners, in order, once it returned
(Geode ``ClientCQImpl.executeWithInitialResults`` queues them the same way). ``stop`` keeps
the CQ on the servers and delivers nothing; ``close`` removes it for good.

What its application code sees lives here too: its listeners, events, attributes, results,
state and statistics (Geode ``CqListener``, ``CqStatusListener``, ``CqEvent``,
``CqAttributes``, ``CqState``, ``CqStatistics``; ``CqResults`` rows are :class:`CqResult`),
since a ``CqEvent`` names its ``CqQuery`` and a ``CqQuery`` hands out ``CqEvent``\ s.
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from regionbus.clients.server_proxy import CacheConnection, ServerRegionProxy
from regionbus.schemas.cq import ParsedCq
from regionbus.schemas.errors import (
    CqClosedError,
    CqError,
    CqEvaluationError,
    CqStateError,
    RegionBusError,
    RegionNotFoundError,
)
from regionbus.schemas.eventid import EventID
from regionbus.schemas.messages import CqSpec, EventKind, OperationKind, Reply
from regionbus.schemas.serializers import Serializer, serializer_named

log = logging.getLogger("regionbus.client")

Operation = EventKind
"""Geode's ``Operation`` for CQ events: a CQ event's ``base_operation`` (the region change:
CREATE, UPDATE, DESTROY, INVALIDATE, REGION_CLEAR, REGION_DESTROY) and its
``query_operation`` (CREATE, UPDATE, DESTROY, REGION_CLEAR, REGION_DESTROY; docs/behaviour.md
§9)."""


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


class CqRegionLookup(Protocol):
    """What a CQ needs of its client cache beside its connection: the region's serializer."""

    def region_serializer(self, name: str) -> Serializer | None:
        """The serializer of the cache's region of that name, None when there is none."""
        ...


def decode_region_value(
    regions: CqRegionLookup, region: str, data: bytes | None, serializer: str | None
) -> Any:
    """A value of a region as the application sees it: decoded by the region's serializer
    when it wrote it, else by the serializer named (None stays None).

    Raises:
        SerializationError: the bytes do not decode, or the serializer is unknown here.
    """
    if data is None:
        return None
    own = regions.region_serializer(region)
    if own is not None and serializer == own.name:
        return own.loads(data)
    return serializer_named(serializer, {own.name: own} if own else None).loads(data)


class CqQuery:
    """A continuous query (Geode ``CqQuery``). Made by ``QueryService.new_cq``.

    Attributes:
        name: Its name, unique within the client.
        query_string: The query as written.
        is_durable: Kept by the servers while a durable client is away (docs/behaviour.md §9).
        cq_attributes: Its listeners.
        statistics: Its event counters (events, inserts, updates, deletes).
    """

    def __init__(
        self,
        cache: CacheConnection,
        regions: CqRegionLookup,
        name: str,
        parsed: ParsedCq,
        attributes: CqAttributes,
        durable: bool,
        forget: Callable[[str], None],
    ) -> None:
        self._cache = cache
        self._regions = regions
        self.name = name
        self.query_string = parsed.query
        self.is_durable = durable
        self.cq_attributes = attributes
        self.statistics = CqStatistics()
        self._parsed = parsed
        self._forget = forget
        self._state = CqState.STOPPED
        self._state_lock = threading.RLock()
        self._delivery_lock = threading.Lock()
        self._held: list[CqEvent] | None = None

    def __repr__(self) -> str:
        return f"CqQuery({self.name!r}, {self.query_string!r}, {self._state.value})"

    @property
    def region_name(self) -> str:
        """The region the query selects from."""
        return self._parsed.region

    @property
    def state(self) -> CqState:
        """RUNNING, STOPPED or CLOSED."""
        return self._state

    def is_running(self) -> bool:
        """True while RUNNING."""
        return self._state is CqState.RUNNING

    def is_stopped(self) -> bool:
        """True while STOPPED."""
        return self._state is CqState.STOPPED

    def is_closed(self) -> bool:
        """True once CLOSED."""
        return self._state is CqState.CLOSED

    # --- the servers -------------------------------------------------------------------

    def execute(self) -> None:
        """Start (or resume) delivering the CQ's events (Geode ``execute``).

        Raises:
            CqClosedError: the CQ is closed.
            CqStateError: the CQ is running already ("CQ is in running state").
            RegionNotFoundError: this client cache has no region of the query's name (Geode:
                "Region on which query is specified not found locally"), or the servers
                have none.
            CqInvalidError: the servers refused the query.
            ServerTimeoutError: not every bucket answered within ``read_timeout_ms``.
            UnconnectedError: the cache is closed, or has no subscription queue.
        """
        self._execute(initial_results=False)

    def execute_with_initial_results(self) -> list[CqResult]:
        """Like :meth:`execute`, returning the entries in the result set as it starts: every
        change after them reaches the listeners, and they reflect every change before
        (gap-free, like a KEYS_VALUES interest registration). Events that arrived meanwhile
        reach the listeners after this returned, in order, on another thread.

        Returns:
            ``CqResult(key, value)`` per entry in the result set (in no order).

        Raises:
            CqClosedError, CqStateError, RegionNotFoundError, CqInvalidError,
            ServerTimeoutError, UnconnectedError: as :meth:`execute`.
        """
        return self._execute(initial_results=True)

    def stop(self) -> None:
        """Stop delivering: the CQ stays on the servers, STOPPED, and can be executed again
        (Geode ``stop``).

        Raises:
            CqClosedError: the CQ is closed.
            CqStateError: the CQ is not running ("stop CQ does not apply").
            CqError: the servers did not confirm (the cause is chained).
        """
        with self._state_lock:
            self._check_open()
            if self._state is not CqState.RUNNING:
                raise CqStateError(
                    f"CQ is not in running state, stop CQ does not apply, CqName : {self.name}"
                )
            try:
                self._send(OperationKind.STOP_CQ)
            except RegionBusError as exc:
                raise CqError(f"Failed to stop the cq. CqName :{self.name}: {exc}") from exc
            self._state = CqState.STOPPED

    def close(self) -> None:
        """Remove the CQ from the servers and this client; its listeners' ``close`` runs. A
        closed CQ cannot be executed again (a new one of the same name can be made).
        Closing twice does nothing.

        Raises:
            CqError: the servers did not confirm (the CQ is closed here all the same).
        """
        with self._state_lock:
            if self._state is CqState.CLOSED:
                return
            failure: RegionBusError | None = None
            try:
                self._send(OperationKind.CLOSE_CQ)
            except RegionBusError as exc:
                failure = exc
            self.closed_locally()
        if failure is not None:
            raise CqError(f"Failed to close the cq. CqName: {self.name}: {failure}") from failure

    def closed_locally(self) -> None:
        """Close the CQ on this client only (the servers forgot it: its region was
        destroyed, or the cache closed): CLOSED, forgotten, its listeners' ``close`` run."""
        with self._state_lock:
            if self._state is CqState.CLOSED:
                return
            self._state = CqState.CLOSED
            self._forget(self.name)
        call_cq_listeners(self.cq_attributes.listeners, "close", self.name)

    # --- events ------------------------------------------------------------------------

    def deliver(self, event: CqEvent) -> None:
        """Hand one event to the listeners (the subscription thread): held while an execute
        is under way, dropped unless the CQ runs."""
        with self._delivery_lock:
            if self._held is not None:
                self._held.append(event)
                return
            if self._state is not CqState.RUNNING:
                return
            self._notify(event)

    def connection_changed(self, connected: bool) -> None:
        """Tell the status listeners the servers answer again, or stopped answering."""
        if self._state is CqState.RUNNING:
            method = "on_cq_connected" if connected else "on_cq_disconnected"
            call_cq_listeners(self.cq_attributes.listeners, method, self.name)

    def decode(self, data: bytes | None, serializer: str | None) -> Any:
        """A value of the CQ's region as the application sees it (the region's serializer,
        or the named one).

        Raises:
            SerializationError: the bytes do not decode.
        """
        return decode_region_value(self._regions, self.region_name, data, serializer)

    # --- internals ---------------------------------------------------------------------

    def _execute(self, *, initial_results: bool) -> list[CqResult]:
        with self._state_lock:
            self._check_open()
            if self._state is CqState.RUNNING:
                raise CqStateError(f"CQ is in running state, CqName : {self.name}")
            serializer = self._regions.region_serializer(self.region_name)
            if serializer is None:
                raise RegionNotFoundError(
                    "Region on which query is specified not found locally, regionName: "
                    f"{self.region_name}"
                )
            self._cache.require_subscription()
            with self._delivery_lock:
                self._held = []
            try:
                replies = self._send(OperationKind.EXECUTE_CQ, initial_results, serializer)
                results = self._results(replies) if initial_results else []
            except BaseException:
                with self._delivery_lock:
                    self._held = None
                self._close_after_failure()
                raise
            self._state = CqState.RUNNING
        threading.Thread(target=self._release_held, name=f"cq-{self.name}", daemon=True).start()
        call_cq_listeners(self.cq_attributes.listeners, "on_cq_connected", self.name)
        return results

    def _results(self, replies: list[Reply]) -> list[CqResult]:
        return [
            CqResult(entry.key, self.decode(entry.value, entry.serializer))
            for reply in replies
            for entry in reply.entries
        ]

    def _release_held(self) -> None:
        with self._delivery_lock:
            held, self._held = self._held or [], None
            for event in held:
                if self._state is CqState.RUNNING:
                    self._notify(event)

    def _notify(self, event: CqEvent) -> None:
        self.statistics.count(event.query_operation)
        notify_cq_listeners(self.cq_attributes.listeners, event)

    def _close_after_failure(self) -> None:
        """An execute that failed may have registered the CQ in some buckets: remove it
        there (Geode ``ClientCQImpl`` closes it on the servers the same way)."""
        try:
            self._send(OperationKind.CLOSE_CQ)
        except RegionBusError as exc:
            log.warning("CQ %s: closing after a failed execute: %s", self.name, exc)

    def _send(
        self,
        kind: OperationKind,
        initial_results: bool = False,
        serializer: Serializer | None = None,
    ) -> list[Reply]:
        spec = CqSpec(
            self.name,
            self.query_string,
            self.is_durable,
            initial_results,
            getattr(serializer, "schema_json", None),
        )
        proxy = ServerRegionProxy(self._cache, self.region_name, "")
        return proxy.every_bucket(kind, spec)

    def _check_open(self) -> None:
        if self._state is CqState.CLOSED:
            raise CqClosedError(f"CQ is closed, CqName : {self.name}")


__all__ = [
    "CqAttributes",
    "CqEvent",
    "CqListener",
    "CqQuery",
    "CqRegionLookup",
    "CqResult",
    "CqState",
    "CqStatistics",
    "CqStatusListener",
    "Operation",
    "call_cq_listeners",
    "decode_region_value",
    "notify_cq_listeners",
]
