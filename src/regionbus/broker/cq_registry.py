"""The continuous queries of the clients, and what a change does to them.

Geode's ``CqServiceImpl`` / ``ServerCQImpl`` / ``FilterProfile`` CQ part. Each server keeps
the CQs in memory, grouped by region and by canonical query (`regionbus.schemas.cq`), and
in Redis (hash ``rb:{ns}:cqs:<client>``) for failover and durable clients, beside the
client's interest. A change of a region is evaluated once per distinct canonical query,
on its old and its new value, however many clients hold that query (Geode's
``matchingCqMap``); the query operation it gives goes to every holder (docs/behaviour.md §9).

A client's CQs have a budget of the server's CPU time per change
(:data:`MAX_CQ_EVALUATION_S_PER_CLIENT`): once a change's evaluation has spent it on the
queries a client holds, its other queries of the region are not evaluated for that change
and their listeners get an error event, so no client's queries hold another client's
change for long. One evaluation is itself bounded (`regionbus.schemas.cq.evaluate`).

A CQ is executed, stopped and closed bucket by bucket, each in the order of that bucket's
operations (as an interest registration is), so delivery in a bucket starts exactly where
that bucket's initial results were read.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final

import redis

from regionbus.broker.interest import drop_stored
from regionbus.runtime.redis_connect import redis_errors
from regionbus.schemas.cq import ParsedCq, has_new_value, parse_cq, query_operation
from regionbus.schemas.cq.operations import region_query_operation
from regionbus.schemas.cq_checks import MAX_CQS_PER_CLIENT
from regionbus.schemas.errors import (
    CqError,
    CqEvaluationError,
    CqInvalidError,
    RegionBusError,
    SerializationError,
)
from regionbus.schemas.messages import CqMatch, CqSpec, Event, EventKind
from regionbus.schemas.naming import RedisKeys
from regionbus.schemas.serializers import AvroSerializer, Serializer, serializer_named

log = logging.getLogger("regionbus.cq")

MAX_VALUE_SCHEMA_CHARS: Final = 65_536
"""Longest Avro schema a CQ may bring for reading its region's values."""

_MAX_AVRO_SCHEMAS: Final = 256
"""Most Avro value schemas kept for reading values (they come from clients)."""

_NOT_READ: Final = object()

MAX_CQ_EVALUATION_S_PER_CLIENT: Final = 0.02
"""Most of a server's CPU time the queries one client holds may take to evaluate one
change, in seconds (20 ms: with one evaluation at most about 12 ms, a change waits at most
some 30 ms for one client's queries, however many it holds). CPU time of the server's
thread, not wall time: on a loaded machine the thread waits for a core, and that wait is
no client's doing. Geode sets no limit."""


@dataclass(slots=True)
class _Holder:
    """One client's CQ on a shared query: delivered in the buckets it runs in."""

    durable: bool
    running: set[int]


@dataclass(slots=True)
class _SharedQuery:
    """One canonical query of a region and the clients' CQs that are it."""

    parsed: ParsedCq
    holders: dict[tuple[str, str], _Holder] = field(default_factory=dict)


class CqTable:
    """The CQs in memory: who holds which query, and the evaluation of a change.

    Args:
        budget_s: Most seconds of CPU time the queries of one client may take per change
            (:data:`MAX_CQ_EVALUATION_S_PER_CLIENT`).
        clock: Seconds of the evaluating thread's CPU time (tests pass their own).
    """

    def __init__(
        self,
        budget_s: float = MAX_CQ_EVALUATION_S_PER_CLIENT,
        clock: Callable[[], float] = time.thread_time,
    ) -> None:
        self._budget_s = budget_s
        self._clock = clock
        self._regions: dict[str, dict[str, _SharedQuery]] = {}
        self._by_client: dict[str, dict[str, tuple[str, str]]] = {}
        self._avro: dict[str, Serializer] = {}

    # --- changes -----------------------------------------------------------------------

    def add(
        self,
        client_id: str,
        name: str,
        parsed: ParsedCq,
        *,
        durable: bool,
        running: Iterable[int],
        value_schema: str | None = None,
    ) -> None:
        """Hold a CQ (or resume it: the buckets it runs in are added).

        Args:
            client_id: The holder.
            name: The CQ's name within the client.
            parsed: Its query.
            durable: Kept while a durable client is away.
            running: The buckets it is delivered from now on.
            value_schema: The Avro schema of the region's values, for ``avro:`` values.

        Raises:
            CqInvalidError: the value schema is not an Avro record schema.
        """
        if value_schema is not None:
            self.learn_schema(value_schema)
        held = self._by_client.setdefault(client_id, {})
        place = held.get(name)
        if place is not None and place != (parsed.region, parsed.canonical):
            self.remove(client_id, name)
            held = self._by_client.setdefault(client_id, {})
        queries = self._regions.setdefault(parsed.region, {})
        shared = queries.get(parsed.canonical)
        if shared is None:
            shared = queries[parsed.canonical] = _SharedQuery(parsed)
        holder = shared.holders.get((client_id, name))
        if holder is None:
            holder = shared.holders[(client_id, name)] = _Holder(durable, set())
        holder.durable = durable
        holder.running.update(running)
        held[name] = (parsed.region, parsed.canonical)

    def stop(self, client_id: str, name: str, buckets: Iterable[int]) -> bool:
        """Stop delivering a CQ from ``buckets``. Returns whether the client holds it."""
        holder = self._holder(client_id, name)
        if holder is None:
            return False
        holder.running.difference_update(buckets)
        return True

    def remove(self, client_id: str, name: str) -> bool:
        """Forget a CQ. Returns whether the client held it."""
        held = self._by_client.get(client_id)
        place = None if held is None else held.pop(name, None)
        if place is None:
            return False
        assert held is not None
        if not held:
            del self._by_client[client_id]
        region, canonical = place
        queries = self._regions[region]
        shared = queries[canonical]
        del shared.holders[(client_id, name)]
        if not shared.holders:
            del queries[canonical]
            if not queries:
                del self._regions[region]
        return True

    def drop_client(self, client_id: str, *, keep_durable: bool = False) -> list[str]:
        """Forget a client's CQs (all, or all but the durable ones). Returns their names."""
        dropped = []
        for name in list(self._by_client.get(client_id, {})):
            holder = self._holder(client_id, name)
            if keep_durable and holder is not None and holder.durable:
                continue
            self.remove(client_id, name)
            dropped.append(name)
        return dropped

    def forget_region(self, region: str) -> list[tuple[str, str]]:
        """Forget every CQ of a destroyed region (Geode closes them). Returns ``(client
        id, name)`` of each."""
        closed = [
            key for shared in self._regions.get(region, {}).values() for key in shared.holders
        ]
        for client_id, name in closed:
            self.remove(client_id, name)
        return closed

    def clear(self) -> None:
        """Forget every CQ."""
        self._regions.clear()
        self._by_client.clear()

    # --- reading -----------------------------------------------------------------------

    def has_queries(self, region: str) -> bool:
        """Whether any client holds a CQ of the region."""
        return region in self._regions

    def names(self, client_id: str) -> list[str]:
        """The names of the CQs a client holds here."""
        return list(self._by_client.get(client_id, {}))

    def queries_of(self, region: str) -> int:
        """How many distinct (canonical) queries of the region are evaluated per change."""
        return len(self._regions.get(region, {}))

    def value(self, data: bytes | None, serializer: str | None) -> Any:
        """A stored value as the CQs read it.

        Raises:
            SerializationError: the bytes do not decode, or the serializer is unknown here.
        """
        if data is None:
            return None
        return serializer_named(serializer, self._avro).loads(data)

    def entry_matches(
        self,
        event: Event,
        bucket: int,
        old_value: bytes | None,
        old_serializer: str | None = None,
    ) -> dict[str, list[CqMatch]]:
        """What an applied entry change does to the CQs running in its bucket.

        Each canonical query of the region is evaluated once: on the new value (a create or
        update), and on the old one when there was one, giving the query operation of
        every holder (docs/behaviour.md §9 table). A value that does not decode, or a predicate that
        cannot be evaluated on it, gives each holder an error match instead; so does a
        query whose every holder has spent its budget of this change's evaluation (the
        time of a query held by several clients counts for each of them).

        Returns:
            ``{client id: [CqMatch, ...]}``, only for CQs with a query operation or an error.
        """
        queries = self._regions.get(event.region)
        if not queries:
            return {}
        new: Any = _NOT_READ
        old: Any = _NOT_READ
        with_new = has_new_value(event.kind)
        out: dict[str, list[CqMatch]] = {}
        spent_s: dict[str, float] = {}
        for shared in queries.values():
            active = [key for key, h in shared.holders.items() if bucket in h.running]
            if not active:
                continue
            holders = {client_id for client_id, _ in active}
            match: CqMatch | None
            try:
                if with_new and new is _NOT_READ:
                    new = self.value(event.value, event.serializer)
                if old_value is not None and old is _NOT_READ:
                    old = self.value(old_value, old_serializer or event.serializer)
                if all(spent_s.get(c, 0.0) >= self._budget_s for c in holders):
                    match = CqMatch("", None, self._over_budget())
                else:
                    match = self._evaluate(shared.parsed, new, old, holders, spent_s)
            except SerializationError as exc:
                match = CqMatch("", None, str(exc))
            if match is None:
                continue
            for client_id, name in active:
                out.setdefault(client_id, []).append(match._replace(name=name))
        return out

    def _evaluate(
        self,
        parsed: ParsedCq,
        new: Any,
        old: Any,
        holders: set[str],
        spent_s: dict[str, float],
    ) -> CqMatch | None:
        """One query on a change's new and old values (``_NOT_READ``: none), its time
        counted for each holder."""
        started = self._clock()
        try:
            is_in = new is not _NOT_READ and parsed.selects(new)
            was_in = old is not _NOT_READ and parsed.selects(old)
            operation = query_operation(was_in, is_in)
            return None if operation is None else CqMatch("", operation)
        except CqEvaluationError as exc:
            return CqMatch("", None, str(exc))
        finally:
            took_s = self._clock() - started
            for client_id in holders:
                spent_s[client_id] = spent_s.get(client_id, 0.0) + took_s

    def _over_budget(self) -> str:
        return (
            f"not evaluated: this client's CQs took their {self._budget_s * 1000:.0f} ms of "
            "this change's evaluation (MAX_CQ_EVALUATION_S_PER_CLIENT)"
        )

    def region_matches(self, region: str, kind: EventKind) -> dict[str, list[CqMatch]]:
        """A region clear or destroy reaches every CQ of the region that runs (in any
        bucket), as REGION_CLEAR or REGION_DESTROY; a region invalidate none (docs/behaviour.md
        §3)."""
        operation = region_query_operation(kind)
        if operation is None:
            return {}
        out: dict[str, list[CqMatch]] = {}
        for shared in self._regions.get(region, {}).values():
            for (client_id, name), holder in shared.holders.items():
                if holder.running:
                    out.setdefault(client_id, []).append(CqMatch(name, operation))
        return out

    def _holder(self, client_id: str, name: str) -> _Holder | None:
        place = self._by_client.get(client_id, {}).get(name)
        if place is None:
            return None
        return self._regions[place[0]][place[1]].holders.get((client_id, name))

    def learn_schema(self, value_schema: str) -> None:
        """Read ``avro:`` values of this schema from now on (:meth:`value`); the one-shot
        queries bring theirs too.

        Raises:
            CqInvalidError: (rule ``value-schema``) it is longer than
                :data:`MAX_VALUE_SCHEMA_CHARS` or not an Avro record schema.
        """
        if len(value_schema) > MAX_VALUE_SCHEMA_CHARS:
            raise CqInvalidError(
                f"the value schema is {len(value_schema)} characters, more than "
                f"{MAX_VALUE_SCHEMA_CHARS}",
                rule="value-schema",
            )
        try:
            serializer = AvroSerializer(json.loads(value_schema))
        except Exception as exc:  # json and fastavro raise many types on a bad schema
            raise CqInvalidError(
                f"the value schema is not an Avro record schema: {exc}", rule="value-schema"
            ) from None
        if serializer.name not in self._avro and len(self._avro) >= _MAX_AVRO_SCHEMAS:
            self._avro.clear()
        self._avro[serializer.name] = serializer


class CqRegistry:
    """The CQs of one server: a :class:`CqTable` for evaluation, persisted in Redis.

    Args:
        client: redis-py client (``decode_responses=False``).
        namespace: The site namespace.
        total_buckets: Number of buckets (CQs loaded from Redis run in all).
    """

    def __init__(self, client: redis.Redis, namespace: str, total_buckets: int) -> None:
        self._redis = client
        self._keys = RedisKeys(namespace)
        self._all_buckets = frozenset(range(total_buckets))
        self.table = CqTable()

    def execute(self, client_id: str, spec: CqSpec, parsed: ParsedCq, bucket: int) -> None:
        """Hold a CQ in one bucket, running, and persist it (Geode ``executeCq``: a CQ the
        servers already hold, a durable one kept while its client was away, is resumed).

        Raises:
            CqError: the client holds :data:`MAX_CQS_PER_CLIENT` CQs already.
            CqInvalidError: the value schema is not an Avro record schema.
            TransportError: Redis failed.
        """
        names = self.table.names(client_id)
        if spec.name not in names and len(names) >= MAX_CQS_PER_CLIENT:
            raise CqError(f"client {client_id!r} holds {MAX_CQS_PER_CLIENT} CQs already")
        self.table.add(
            client_id,
            spec.name,
            parsed,
            durable=spec.durable,
            running=(bucket,),
            value_schema=spec.value_schema,
        )
        self._save(client_id, spec, parsed.region, running=True)

    def stop(self, client_id: str, spec: CqSpec, region: str, bucket: int) -> None:
        """Stop delivering a CQ from one bucket (it stays held, and persisted as stopped).

        Raises:
            TransportError: Redis failed.
        """
        if self.table.stop(client_id, spec.name, (bucket,)):
            self._save(client_id, spec, region, running=False)

    def close(self, client_id: str, name: str) -> None:
        """Forget a CQ, here and in Redis.

        Raises:
            TransportError: Redis failed.
        """
        self.table.remove(client_id, name)
        with redis_errors():
            self._redis.hdel(self._keys.cqs(client_id), name)

    def drop_client(self, client_id: str, *, keep_durable: bool = False) -> None:
        """Forget a client's CQs (all, or all but the durable ones), here and in Redis.

        Raises:
            TransportError: Redis failed.
        """
        self.table.drop_client(client_id, keep_durable=keep_durable)
        drop_stored(self._redis, self._keys.cqs(client_id), keep_durable=keep_durable)

    def forget_region(self, region: str) -> None:
        """Close every CQ of a destroyed region, here and in Redis.

        Raises:
            TransportError: Redis failed.
        """
        for client_id, name in self.table.forget_region(region):
            with redis_errors():
                self._redis.hdel(self._keys.cqs(client_id), name)

    def durable_names(self, client_id: str) -> list[str]:
        """The names of the client's durable CQs, as persisted (Geode
        ``getAllDurableCqsFromServer``).

        Raises:
            TransportError: Redis failed.
        """
        with redis_errors():
            stored = self._redis.hgetall(self._keys.cqs(client_id))
        return sorted(f.decode() for f, v in stored.items() if _record(v).get("durable"))

    def load(self, client_ids: Iterable[str]) -> int:
        """Forget what is in memory and load the persisted CQs of these clients, running
        ones in every bucket (at start, and when taking buckets over).

        Returns:
            How many CQs were loaded.

        Raises:
            TransportError: Redis failed.
        """
        self.table.clear()
        count = 0
        for client_id in client_ids:
            with redis_errors():
                stored = self._redis.hgetall(self._keys.cqs(client_id))
            for raw_name, raw_record in stored.items():
                record = _record(raw_record)
                try:
                    parsed = parse_cq(record.get("query"))
                    self.table.add(
                        client_id,
                        raw_name.decode(),
                        parsed,
                        durable=bool(record.get("durable")),
                        running=self._all_buckets if record.get("running") else (),
                        value_schema=record.get("value_schema"),
                    )
                except RegionBusError as exc:
                    # Written by a hostile writer or an older server: refusing to start
                    # would make every restart fail on it.
                    log.error("skipped a stored CQ of client %s: %s", client_id, exc)
                    continue
                count += 1
        return count

    def _save(self, client_id: str, spec: CqSpec, region: str, *, running: bool) -> None:
        record = {
            "region": region,
            "query": spec.query,
            "durable": spec.durable,
            "running": running,
            "value_schema": spec.value_schema,
        }
        with redis_errors():
            self._redis.hset(self._keys.cqs(client_id), spec.name, json.dumps(record))


def _record(raw: bytes) -> dict[str, Any]:
    try:
        record = json.loads(raw)
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


__all__ = ["MAX_VALUE_SCHEMA_CHARS", "CqRegistry", "CqTable"]
