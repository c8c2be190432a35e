"""One bucket's part of a one-shot OQL query (Geode ``QueryService.newQuery(oql).execute``):
the bucket's primary reads its entries, selects, orders and limits them, and answers the
entries; the client merges the buckets' answers and projects them
(`regionbus.schemas.query.rows`; Geode's ``PartitionedRegionQueryEvaluator`` splits the
work the same way, each bucket's node running the query over its own entries).

No client is trusted, so a query never runs on the loop that serves every client's
operations: it runs on one of ``query_threads`` worker threads (:class:`QueryRunner`), at
most ``max_pending_queries`` running or waiting on a server (one more is refused with
``RequestLimitError`` at once), and the loop answers it once it is done. Its cost is
bounded twice more: by wall-clock time
(``query_max_execution_time_ms``, checked between entries and between the pages of the
Redis reads, past which the query fails with ``QueryExecutionTimeoutError``; Geode's
``MAX_QUERY_EXECUTION_TIME``) and by the rows one bucket answers
(``query_max_rows_per_bucket``, ``QueryRowLimitError``). With ``ORDER BY`` and ``LIMIT n``
the rows kept while reading are at most ``2n``. With ``DISTINCT`` a bucket projects its
entries and answers each distinct row once (its first ``LIMIT`` of them); for aggregates
and ``GROUP BY`` it groups its entries and answers a partial row per group (at most
``query_max_rows_per_bucket`` groups), which the client merges.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from operator import itemgetter
from typing import Any, Final, NamedTuple

from regionbus.broker.config import ServerSettings
from regionbus.broker.cq_registry import CqRegistry
from regionbus.broker.store import RegionStore
from regionbus.schemas.errors import (
    CqInvalidError,
    QueryExecutionTimeoutError,
    QueryInvalidError,
    QueryInvocationTargetError,
    QueryRowLimitError,
    RegionBusError,
    RequestLimitError,
    SerializationError,
    ServerOperationError,
)
from regionbus.schemas.messages import Entry, Operation, QuerySpec
from regionbus.schemas.query import (
    PARTIAL_SERIALIZER,
    Groups,
    OrderKeys,
    ParsedQuery,
    element,
    frozen,
    parse_query,
    project,
    selected_rows,
)

log = logging.getLogger("regionbus.server.queries")

PAGE_ENTRIES: Final = 500
"""About how many entries one Redis read of a query takes (the ``HSCAN`` hint): a few
milliseconds of Redis' time per page, and the deadline is checked between pages."""


class BucketAnswer(NamedTuple):
    """What a bucket's primary answers for a query.

    Attributes:
        exists: The region exists (else the answer is RegionNotFoundError).
        entries: The entries selected, in ORDER BY order (ties by key), at most the LIMIT;
            keys only over ``/r.keys``; none for ``COUNT(*)``.
        selected: For ``SELECT COUNT(*)``, how many of the bucket's entries the WHERE
            clause selects; else None.
    """

    exists: bool
    entries: list[Entry]
    selected: int | None = None


class BucketQueries:
    """Runs the one-shot queries a bucket's primary is asked.

    Args:
        settings: ``query_max_execution_time_ms`` and ``query_max_rows_per_bucket``.
        store: The region store.
        cqs: The CQs, whose table decodes stored values (with the Avro schemas clients
            brought, for CQs and queries alike).
    """

    def __init__(self, settings: ServerSettings, store: RegionStore, cqs: CqRegistry) -> None:
        self._budget_s = settings.query_max_execution_time_ms / 1000
        self._max_rows = settings.query_max_rows_per_bucket
        self._max_partial_bytes = settings.max_value_size_bytes
        self._store = store
        self._cqs = cqs

    def run(self, spec: QuerySpec, region: str, bucket: int) -> BucketAnswer:
        """The entries of one bucket a query selects, in its ORDER BY order (ties by key),
        at most its LIMIT; or, for ``COUNT(*)``, how many.

        Raises:
            QueryInvalidError: the query does not parse or bind, or its value schema is not
                an Avro record schema.
            QueryExecutionTimeoutError: the bucket's part took longer than
                ``query_max_execution_time_ms``.
            QueryRowLimitError: it would answer more than ``query_max_rows_per_bucket`` rows.
            QueryTypeMismatchError: the WHERE clause or an ORDER BY item cannot be
                evaluated on an entry.
            QueryInvocationTargetError: a value does not decode.
            TransportError: Redis failed.
        """
        deadline = time.monotonic() + self._budget_s
        query = parse_query(spec.query).bind(spec.parameters).bucket_part()
        if spec.value_schema is not None:
            try:
                self._cqs.table.learn_schema(spec.value_schema)
            except CqInvalidError as exc:
                raise QueryInvalidError(str(exc), rule=exc.rule, query=spec.query) from None
        if not self._store.region_exists(region, bucket):
            return BucketAnswer(False, [])
        if query.grouped:
            groups = _Grouped(query, bucket, self._max_rows, self._max_partial_bytes)
            self._select(query, region, bucket, groups, deadline)
            return BucketAnswer(True, groups.answer())
        limit = query.limit if isinstance(query.limit, int) else None
        answer = self._max_rows if limit is None else min(limit, self._max_rows)
        kept = _Kept(query, answer)
        self._select(query, region, bucket, kept, deadline)
        if query.counting:
            return BucketAnswer(True, [], kept.counted)
        entries = kept.answer()
        if len(entries) > self._max_rows:
            raise QueryRowLimitError(
                f"bucket {bucket} would answer more than query_max_rows_per_bucket="
                f"{self._max_rows} rows; add a LIMIT or narrow the WHERE clause"
            )
        if query.iterates == "keys":
            entries = [Entry(e.key, e.version) for e in entries]  # the keys are the answer
        return BucketAnswer(True, entries)

    def _select(
        self,
        query: ParsedQuery,
        region: str,
        bucket: int,
        kept: _Kept | _Grouped,
        deadline: float,
    ) -> None:
        """Keep the bucket's entries the query selects, a page at a time, until every one
        was read or, without ORDER BY, one more than the answer was kept."""
        for page in self._store.pages(region, bucket, PAGE_ENTRIES):
            if time.monotonic() > deadline:
                raise self._timeout(query)
            for entry in page:
                if time.monotonic() > deadline:
                    raise self._timeout(query)
                item = element(query, entry.key, self._decoded(query, entry))
                rows = selected_rows(query, item)
                if not rows:
                    continue
                if isinstance(kept, _Grouped):
                    for row in rows:
                        kept.add(entry, row)
                else:  # the entry once, however many of its rows are selected
                    kept.add(entry, rows[0])
                    if kept.full_unordered():
                        return

    def _decoded(self, query: ParsedQuery, entry: Entry) -> Any:
        if query.iterates == "keys":
            return None  # the keys are what it reads
        try:
            return self._cqs.table.value(entry.value, entry.serializer)
        except SerializationError as exc:
            raise QueryInvocationTargetError(
                f"the value of {entry.key!r} does not decode on the server: {exc}"
            ) from None

    def _timeout(self, query: ParsedQuery) -> QueryExecutionTimeoutError:
        return QueryExecutionTimeoutError(
            f"Query execution cancelled after exceeding max execution time "
            f"{self._budget_s * 1000:.0f}ms (query_max_execution_time_ms). Query: {query.query}"
        )


class QueryRunner:
    """Runs the one-shot queries of a server's buckets on worker threads, off the loop.

    Args:
        settings: ``query_threads`` and ``max_pending_queries``.
        queries: Runs one bucket's part of a query.
    """

    def __init__(self, settings: ServerSettings, queries: BucketQueries) -> None:
        self._queries = queries
        self._threads = settings.query_threads
        self._max_pending = settings.max_pending_queries
        self._executor: ThreadPoolExecutor | None = None
        self._running: list[tuple[Operation, int, Future[BucketAnswer]]] = []
        self._refused: list[tuple[Operation, int, RegionBusError]] = []

    def __len__(self) -> int:
        return len(self._running)

    def submit(self, op: Operation, bucket: int) -> None:
        """Run this bucket's part of ``op``'s query on a worker thread (or refuse it when
        ``max_pending_queries`` are running or waiting); :meth:`done` hands its outcome."""
        assert op.query is not None
        if len(self._running) >= self._max_pending:
            self._refused.append(
                (
                    op,
                    bucket,
                    RequestLimitError(
                        f"{len(self._running)} queries pending on this server already "
                        f"(max_pending_queries); try again later",
                        limit_name="queries pending on a server",
                        limit=self._max_pending,
                        requested=len(self._running) + 1,
                    ),
                )
            )
            return
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self._threads, thread_name_prefix="oql-query")
        future = self._executor.submit(self._queries.run, op.query, op.region, bucket)
        self._running.append((op, bucket, future))

    def done(self) -> list[tuple[Operation, int, BucketAnswer | RegionBusError]]:
        """The queries finished (or refused) since the last call, each with its answer or
        the error to reply; never raises."""
        finished: list[tuple[Operation, int, BucketAnswer | RegionBusError]] = list(self._refused)
        self._refused = []
        if not self._running:
            return finished
        still: list[tuple[Operation, int, Future[BucketAnswer]]] = []
        for op, bucket, future in self._running:
            if not future.done():
                still.append((op, bucket, future))
                continue
            try:
                finished.append((op, bucket, future.result()))
            except RegionBusError as exc:
                finished.append((op, bucket, exc))
            except Exception as exc:  # a bug of ours: the client hears of it, the loop goes on
                log.exception("query %r failed", op.query)
                finished.append((op, bucket, ServerOperationError(f"query failed: {exc!r}")))
        self._running = still
        return finished

    def close(self) -> None:
        """The server stops: drop the queries running (their clients time out)."""
        self._running = []
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)


class _Grouped:
    """The groups of a grouped query's selected entries (aggregates, ``GROUP BY``): at most
    ``max_rows``, answered as one partial row each
    (`regionbus.schemas.query.aggregates.Groups`), each at most ``max_bytes`` (a
    ``DISTINCT`` aggregate's partial holds its distinct values: as large as a value may
    be, ``max_value_size_bytes``, so that its reply fits a Kafka message)."""

    def __init__(self, query: ParsedQuery, bucket: int, max_rows: int, max_bytes: int) -> None:
        self._groups = Groups(query)
        self._bucket = bucket
        self._max_rows = max_rows
        self._max_bytes = max_bytes

    def add(self, entry: Entry, item: Any) -> None:
        self._groups.add(item)
        if len(self._groups) > self._max_rows:
            raise QueryRowLimitError(
                f"bucket {self._bucket} would answer more than query_max_rows_per_bucket="
                f"{self._max_rows} groups; narrow the WHERE clause or the GROUP BY"
            )

    def full_unordered(self) -> bool:
        return False  # every selected entry counts

    def answer(self) -> list[Entry]:
        partials = self._groups.partials()
        if any(len(p) > self._max_bytes for p in partials):
            raise QueryRowLimitError(
                f"bucket {self._bucket} would answer a group's partial result over "
                f"{self._max_bytes} bytes (max_value_size_bytes): its DISTINCT aggregate "
                "holds too many values; narrow the WHERE clause"
            )
        return [Entry(str(i), 0, p, PARTIAL_SERIALIZER) for i, p in enumerate(partials)]


class _Kept:
    """The selected entries kept while a bucket is read: every one up to ``answer + 1``
    without ORDER BY (one past the answer shows the row bound is broken); with ORDER BY the
    best ``answer + 1`` of them, trimmed whenever twice that many are held; for
    ``COUNT(*)`` none, only how many (:attr:`counted`). With ``DISTINCT``, an entry whose
    projected row is one kept already is not kept again (with ORDER BY: the better one)."""

    def __init__(self, query: ParsedQuery, answer: int) -> None:
        self._query = query
        self._keys = OrderKeys(query)
        self._answer = answer
        self._rows: list[tuple[Any, Any, Entry]] = []
        self._seen: set[Any] | None = set() if query.distinct else None
        self.counted = 0

    def add(self, entry: Entry, item: Any) -> None:
        self.counted += 1
        if self._query.counting:
            return
        ordered = bool(self._query.order_by)
        row = None
        if self._seen is not None:
            row = frozen(project(self._query, item))
            if not ordered:
                if row in self._seen:
                    return
                self._seen.add(row)
        key = self._keys.key(entry.key, item) if ordered else None
        self._rows.append((key, row, entry))
        if ordered and len(self._rows) > 2 * (self._answer + 1):
            self._trim()

    def full_unordered(self) -> bool:
        """Without ORDER BY, any rows will do: reading stops once one past the answer."""
        return not (self._query.order_by or self._query.counting) and len(self._rows) > self._answer

    def answer(self) -> list[Entry]:
        """The kept entries in order, at most one past the answer (the caller tells a
        LIMIT from a broken row bound)."""
        if self._query.order_by:
            self._trim()
        limit = self._query.limit
        rows = self._rows if not isinstance(limit, int) else self._rows[:limit]
        return [entry for _, _, entry in rows]

    def _trim(self) -> None:
        self._rows.sort(key=itemgetter(0))
        if self._seen is not None:
            seen: set[Any] = set()
            kept = []
            for kept_row in self._rows:
                if kept_row[1] not in seen:
                    seen.add(kept_row[1])
                    kept.append(kept_row)
            self._rows = kept
        del self._rows[self._answer + 1 :]


__all__ = ["PAGE_ENTRIES", "BucketAnswer", "BucketQueries", "QueryRunner"]
