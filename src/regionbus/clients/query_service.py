"""``QueryService``: a client cache's queries, one-shot and continuous (Geode
``QueryService`` and the client half of ``CqServiceImpl``).

It makes one-shot queries (``new_query``, see :mod:`regionbus.clients.oql_query`). It
makes CQs (checking the query against Geode's CQ subset before anything is sent), lists,
executes, stops and closes them, asks the servers for the durable CQs they hold for this
client, and hands each CQ event from the subscription queue to the CQs it names.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable
from typing import Final

from regionbus.clients.cq_query import CqAttributes, CqEvent, CqQuery, CqRegionLookup
from regionbus.clients.oql_query import Query
from regionbus.clients.server_proxy import CacheConnection, ServerRegionProxy
from regionbus.schemas.cq import UNDEFINED, parse_cq
from regionbus.schemas.cq_checks import MAX_CQS_PER_CLIENT, check_cq_name
from regionbus.schemas.errors import (
    CqError,
    CqEvaluationError,
    CqExistsError,
    RegionBusError,
    SerializationError,
)
from regionbus.schemas.messages import CqEvent as WireCqEvent
from regionbus.schemas.messages import EventKind, OperationKind
from regionbus.schemas.query import parse_query

log = logging.getLogger("regionbus.client")


class QueryService:
    """The one-shot and continuous queries of one client cache. Get it with
    ``cache.query_service()``.

    Args:
        cache: The client cache (its pool and subscription queue).
        regions: Gives the serializer of a region of the cache.
    """

    UNDEFINED: Final = UNDEFINED
    """The value of an attribute a value does not have (Geode ``QueryService.UNDEFINED``):
    a projection of one gives it, and any comparison with it but ``<>`` is false."""

    def __init__(self, cache: CacheConnection, regions: CqRegionLookup) -> None:
        self._cache = cache
        self._regions = regions
        self._cqs: dict[str, CqQuery] = {}
        self._lock = threading.Lock()
        self._generated = itertools.count(1)
        self.unknown_cq_events = 0
        """CQ events naming no CQ of this client (closed meanwhile, or never re-made after a
        durable reconnect): dropped, as in Geode."""

    def new_query(self, query: str) -> Query:
        """Make a one-shot OQL query (Geode ``QueryService.newQuery``); run it with
        ``execute(*params)``.

        Args:
            query: ``SELECT [DISTINCT] * | item [AS name], ... FROM /region[.entries |
                .keys] [[AS] alias][, path alias ...] [WHERE predicate] [GROUP BY expr,
                ...] [ORDER BY expr [ASC | DESC], ...] [LIMIT n]``, an item an expression
                or an aggregate (``COUNT``, ``SUM``, ``AVG``, ``MIN``, ``MAX`` of
                ``[DISTINCT] expr``, ``COUNT(*)``), up to two drill-downs into each
                value's collections after the region, with ``$1``, ``$2``, ... where a
                literal, an ``IN`` collection or the LIMIT may stand; the predicates of CQs
                (docs/behaviour.md §9, docs/geode-porting.md).

        Raises:
            QueryInvalidError: the query does not parse or is outside what runs (``rule``
                names how; see `regionbus.schemas.query.rules`); nothing was sent.
        """
        return Query(self._cache, self._regions, parse_query(query))

    def new_cq(
        self,
        name: str | None,
        query: str,
        attributes: CqAttributes | None = None,
        durable: bool = False,
    ) -> CqQuery:
        """Make a continuous query, STOPPED (Geode ``newCq``); ``execute`` it to start.

        Args:
            name: Unique within this client (at most 256 characters); None generates one.
            query: ``SELECT * FROM /region [alias] [WHERE predicate]`` (Geode's CQ subset
                of OQL, docs/behaviour.md §9).
            attributes: Its listeners.
            durable: Kept by the servers while this (durable) client is away, and its
                events replayed before the marker at reconnect.

        Returns:
            The CQ.

        Raises:
            CqInvalidError: the query is outside the CQ subset (``rule`` names how) or the
                name is refused; nothing was sent.
            CqExistsError: this client has a CQ of that name.
            CqError: this client holds :data:`MAX_CQS_PER_CLIENT` CQs already.
        """
        parsed = parse_cq(query)
        with self._lock:
            if name is None:
                name = next(n for n in (f"cq-{i}" for i in self._generated) if n not in self._cqs)
            check_cq_name(name)
            if name in self._cqs:
                raise CqExistsError(f"CQ with the given name already exists. CqName : {name}")
            if len(self._cqs) >= MAX_CQS_PER_CLIENT:
                raise CqError(f"this client holds {MAX_CQS_PER_CLIENT} CQs already")
            cq = CqQuery(
                self._cache,
                self._regions,
                name,
                parsed,
                attributes or CqAttributes(),
                durable,
                self._forget,
            )
            self._cqs[name] = cq
        return cq

    def get_cqs(self, region: str | None = None) -> list[CqQuery]:
        """This client's CQs that are not closed (of one region, when given)."""
        with self._lock:
            cqs = list(self._cqs.values())
        return [cq for cq in cqs if region is None or cq.region_name == region]

    def get_cq(self, name: str) -> CqQuery | None:
        """The CQ of that name, or None (closed ones are forgotten)."""
        with self._lock:
            return self._cqs.get(name)

    def execute_cqs(self) -> None:
        """Execute every CQ that is not running.

        Raises:
            CqError: some could not be executed (the first failure is chained).
        """
        self._each("execute", lambda cq: not cq.is_running())

    def stop_cqs(self) -> None:
        """Stop every running CQ.

        Raises:
            CqError: some could not be stopped (the first failure is chained).
        """
        self._each("stop", CqQuery.is_running)

    def close_cqs(self) -> None:
        """Close every CQ.

        Raises:
            CqError: some were not confirmed closed by the servers (all are closed here).
        """
        self._each("close", lambda cq: True)

    def get_all_durable_cqs_from_server(self) -> list[str]:
        """The names of the durable CQs the servers hold for this client (Geode
        ``getAllDurableCqsFromServer``): after a durable client reconnects, the ones kept
        while it was away.

        Raises:
            ServerTimeoutError: no server answered within ``read_timeout_ms``.
            UnconnectedError: the cache is closed.
        """
        proxy = ServerRegionProxy(self._cache, "", "")
        op = proxy.operation(OperationKind.GET_DURABLE_CQS)
        return list(proxy.one(op, 0).cq_names)

    # --- from the cache ----------------------------------------------------------------

    def on_event(self, message: WireCqEvent) -> None:
        """Hand a CQ event from the subscription queue to each CQ it names (the
        subscription thread); a REGION_DESTROY closes the CQ after its listeners heard it
        (Geode closes the CQs of a destroyed region)."""
        event = message.event
        decoded: dict[str, tuple[object, CqEvaluationError | None]] = {}
        for match in message.cqs:
            cq = self.get_cq(match.name)
            if cq is None:
                self.unknown_cq_events += 1
                continue
            value, failure = self._decode(cq, event.value, event.serializer, decoded)
            throwable = CqEvaluationError(match.error) if match.error is not None else failure
            cq.deliver(
                CqEvent(
                    cq,
                    event.kind,
                    match.query_operation if throwable is None else None,
                    event.key,
                    value,
                    throwable,
                    event.event_id,
                    event.possible_duplicate,
                )
            )
            if match.query_operation is EventKind.REGION_DESTROY:
                cq.closed_locally()

    def connection_changed(self, connected: bool) -> None:
        """The servers answer this client again, or stopped answering: tell every running
        CQ's status listeners (Geode ``CqStatusListener``)."""
        for cq in self.get_cqs():
            cq.connection_changed(connected)

    def close_locally(self) -> None:
        """Close every CQ on this client only (the cache closes; its DISCONNECT has the
        servers drop them, or keep the durable ones)."""
        for cq in self.get_cqs():
            cq.closed_locally()

    # --- internals ---------------------------------------------------------------------

    def _forget(self, name: str) -> None:
        with self._lock:
            self._cqs.pop(name, None)

    def _each(self, method: str, applies: Callable[[CqQuery], bool]) -> None:
        first: RegionBusError | None = None
        failed = 0
        for cq in self.get_cqs():
            if not applies(cq):
                continue
            try:
                getattr(cq, method)()
            except RegionBusError as exc:
                log.warning("%s of CQ %s failed: %s", method, cq.name, exc)
                failed += 1
                first = first or exc
        if first is not None:
            raise CqError(f"{method} failed for {failed} CQs") from first

    @staticmethod
    def _decode(
        cq: CqQuery,
        data: bytes | None,
        serializer: str | None,
        decoded: dict[str, tuple[object, CqEvaluationError | None]],
    ) -> tuple[object, CqEvaluationError | None]:
        """The event's value for one CQ (decoded once per region's serializer)."""
        known = decoded.get(cq.region_name)
        if known is not None:
            return known
        try:
            result: tuple[object, CqEvaluationError | None] = (cq.decode(data, serializer), None)
        except SerializationError as exc:
            result = (None, CqEvaluationError(f"the value does not decode here: {exc}"))
        decoded[cq.region_name] = result
        return result


__all__ = ["QueryService"]
