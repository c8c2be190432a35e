"""One handler per operation kind, in one table (Geode's ``CommandInitializer``).

An operation that decoded and passed validation is handed to the handler of its kind. The
entry operations join the batch of :mod:`regionbus.broker.entry_ops`; every other kind first applies
that batch (operations of a bucket take effect in their order) and then runs on its own;
so do the expirations a bucket's primary produces (:mod:`regionbus.broker.expiration`).
Adding an operation kind is one handler here and one row in :meth:`OperationHandlers.table`
(plus a Lua script if it changes region state).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from regionbus.broker.client_lifecycle import ClientLifecycle
from regionbus.broker.client_proxy import ClientProxy
from regionbus.broker.config import ServerSettings
from regionbus.broker.cq_registry import CqRegistry
from regionbus.broker.distribution import Distribution
from regionbus.broker.entry_ops import EntryOperations, applied_event, refused, reply_applied
from regionbus.broker.expiration import EntryExpiration
from regionbus.broker.functions import FunctionExecutions
from regionbus.broker.initial_results import InitialResults, PagedLoad, WholeLoad, reply_entries
from regionbus.broker.interest import InterestRegistry
from regionbus.broker.notifier import CacheClientNotifier
from regionbus.broker.outbox import Outbox
from regionbus.broker.ownership import BucketOwnership
from regionbus.broker.plugins import ServerPlugins
from regionbus.broker.queries import BucketAnswer, BucketQueries, QueryRunner
from regionbus.broker.stats import ServerStats
from regionbus.broker.store import RegionStore
from regionbus.runtime.leases import wall_clock_ms
from regionbus.schemas.addressing import ClientAddress
from regionbus.schemas.cq import parse_cq
from regionbus.schemas.errors import (
    CacheWriterError,
    CqEvaluationError,
    InvalidOperationError,
    RegionBusError,
    RegionNotFoundError,
    SerializationError,
    TransportError,
)
from regionbus.schemas.interest_regex import compile_interest_regex
from regionbus.schemas.limits import MAX_KEYS_PER_CLIENT, MAX_REGEXES_PER_CLIENT, check_count
from regionbus.schemas.messages import (
    Entry,
    EventKind,
    InterestKind,
    InterestResultPolicy,
    Marker,
    Operation,
    OperationKind,
    Reply,
)
from regionbus.schemas.naming import bucket_of, region_bucket
from regionbus.schemas.operation_kinds import kind_row

Handler = Callable[[Operation, int, int], None]
"""``handler(operation, bucket, offset)``: the bucket (partition) and offset it was read at."""


class OperationHandlers:
    """The handlers of every operation kind, wired to the server's parts.

    Args:
        settings: The server's settings.
        store: The region store.
        registry: The interest registry.
        ownership: The buckets held.
        entries: The batch of entry operations.
        plugins: Server writers (a region change is vetoed before it is applied).
        notifier: The client proxies (markers, serving a client that registers).
        distribution: What follows each applied region change.
        lifecycle: Clients' lives (DISCONNECT).
        outbox: Replies.
        stats: The server's counters.
        expiration: Applies the ``EXPIRE_*`` operations.
        cqs: The continuous queries.
        functions: Runs function executions (`regionbus.broker.functions`).
    """

    def __init__(
        self,
        settings: ServerSettings,
        store: RegionStore,
        registry: InterestRegistry,
        ownership: BucketOwnership,
        entries: EntryOperations,
        plugins: ServerPlugins,
        notifier: CacheClientNotifier,
        distribution: Distribution,
        lifecycle: ClientLifecycle,
        outbox: Outbox,
        stats: ServerStats,
        expiration: EntryExpiration,
        cqs: CqRegistry,
        functions: FunctionExecutions,
    ) -> None:
        self._settings = settings
        self._store = store
        self._registry = registry
        self._ownership = ownership
        self._entries = entries
        self._plugins = plugins
        self._notifier = notifier
        self._distribution = distribution
        self._lifecycle = lifecycle
        self._outbox = outbox
        self._stats = stats
        self._cqs = cqs
        self.queries = QueryRunner(settings, BucketQueries(settings, store, cqs))
        """The one-shot queries running on worker threads (answered by
        :meth:`answer_queries`)."""
        self.initial_results = InitialResults(settings, store, ownership, outbox)
        """Bulk loads and CQ executions waiting for their share of the loop's turns."""
        self._registration_reads: dict[tuple[str, int], tuple[bool, int]] = {}
        """``(region_exists, version)`` per ``(region, bucket)`` read by registrations
        processed in a row (:meth:`forget_reads`)."""
        self._primary_checked: set[int] = set()
        """Buckets whose fencing epoch those registrations checked."""
        self.table: dict[OperationKind, Handler] = {
            OperationKind.PUT: entries.add,
            OperationKind.DESTROY: entries.add,
            OperationKind.INVALIDATE: entries.add,
            OperationKind.GET: entries.add,
            OperationKind.CLEAR: self.region_change,
            OperationKind.DESTROY_REGION: self.region_change,
            OperationKind.INVALIDATE_REGION: self.region_change,
            OperationKind.REGISTER_INTEREST: self.register_interest,
            OperationKind.UNREGISTER_INTEREST: self.unregister_interest,
            OperationKind.DISCONNECT: self.disconnect,
            OperationKind.KEYS: self.keys,
            OperationKind.READY_FOR_EVENTS: self.ready_for_events,
            OperationKind.EXPIRE_DESTROY: expiration.apply,
            OperationKind.EXPIRE_INVALIDATE: expiration.apply,
            OperationKind.EXECUTE_CQ: self.execute_cq,
            OperationKind.STOP_CQ: self.stop_cq,
            OperationKind.CLOSE_CQ: self.close_cq,
            OperationKind.GET_DURABLE_CQS: self.get_durable_cqs,
            OperationKind.PUT_IF_ABSENT: entries.add,
            OperationKind.LOAD_CREATE: entries.add,
            OperationKind.REPLACE: entries.add,
            OperationKind.REMOVE: entries.add,
            OperationKind.CONTAINS_KEY: entries.add,
            OperationKind.SIZE: self.size,
            OperationKind.QUERY: self.query,
            OperationKind.EXECUTE_REGION_FUNCTION: functions.execute,
            OperationKind.EXECUTE_FUNCTION: functions.execute,
            OperationKind.GET_FUNCTION_ATTRIBUTES: functions.attributes,
            OperationKind.LOCAL_DESTROY: entries.add,
            OperationKind.LOCAL_INVALIDATE: entries.add,
        }
        """The handler of each operation kind."""

    def owns(self, bucket: int) -> bool:
        """Whether this server is the bucket's primary now (as of the last election)."""
        return bucket in self._ownership.owned

    def handle(self, op: Operation, bucket: int, offset: int) -> None:
        """Run the operation's handler; anything but an entry operation (an expiration
        included) first applies the entry operations batched before it.

        Raises:
            RegionBusError: the handler refused the operation (the caller replies it).
        """
        if op.kind is not OperationKind.REGISTER_INTEREST:
            self.forget_reads()
        if not kind_row(op.kind).batched:
            self._entries.apply()
        self.table[op.kind](op, bucket, offset)

    def forget_reads(self) -> None:
        """End the reads registrations share: at any other operation (an entry change
        applied before the next registration changes the version it must read) and at the
        end of a batch (an election may change the fencing epoch between batches).

        A storm of clients registering at once sends hundreds of registrations in a row
        to each bucket; each read the bucket's epoch and the region's state on its own,
        a round trip apiece, and held every other client's operations behind them.
        """
        self._registration_reads.clear()
        self._primary_checked.clear()

    def _still_primary_for_registration(self, bucket: int) -> bool:
        # A bucket lost since the check (``drop_lost`` runs between operations) is not
        # vouched for by it.
        if bucket in self._primary_checked and self.owns(bucket):
            return True
        if not self._ownership.still_primary(bucket):
            return False
        self._primary_checked.add(bucket)
        return True

    def _region_state(self, region: str, bucket: int) -> tuple[bool, int]:
        known = self._registration_reads.get((region, bucket))
        if known is None:
            known = self._registration_reads[(region, bucket)] = self._store.region_state(
                region, bucket
            )
        return known

    # --- regions -----------------------------------------------------------------------

    def region_change(self, op: Operation, bucket: int, offset: int) -> None:
        """Clear, destroy or invalidate a region: writers (none for an invalidate, as Geode's
        ``CacheWriter`` has no ``beforeRegionInvalidate``), apply in the region's bucket,
        listeners, distribution to every client with interest in the region (not for an
        invalidate: docs/behaviour.md §3, see `CacheClientNotifier.region_event`)."""
        assert op.event_id is not None
        expected = region_bucket(op.region, self._settings.total_buckets)
        if bucket != expected:
            raise InvalidOperationError(
                f"{op.kind.value} of {op.region!r} belongs to bucket {expected}, not {bucket}"
            )
        try:
            self._plugins.veto_region(op)
        except CacheWriterError as exc:
            self._outbox.reply_error(op, bucket, exc)
            return
        result = self._store.apply_region(
            op.kind,
            op.region,
            op.event_id._replace(bucket=bucket),
            bucket,
            offset,
            epoch=self._ownership.owned[bucket],
        )
        if refused(op, bucket, result, self._ownership, self._outbox, self._stats):
            return
        event = applied_event(op, bucket, result)
        if event is not None:
            self._distribution.region_changed(event, bucket, duplicate=result.status == "DUP")
            if event.kind is EventKind.REGION_DESTROY:
                self._registry.forget_region(op.region)
                self._cqs.forget_region(op.region)
        reply_applied(op, bucket, result, self._outbox, self._stats)

    def keys(self, op: Operation, bucket: int, offset: int) -> None:
        """The keys of the region in this bucket (``keys_on_server``)."""
        exists, entries, _ = self._store.snapshot(op.region, bucket, with_values=False)
        if not exists:
            self._region_missing(op, bucket)
            return
        self._reply_entries(op, bucket, [Entry(e.key, e.version) for e in entries])

    def size(self, op: Operation, bucket: int, offset: int) -> None:
        """How many entries the region has in this bucket, invalid ones included
        (``size_on_server``; Geode ``Region.sizeOnServer``)."""
        exists, count = self._store.region_size(op.region, bucket)
        if not exists:
            self._region_missing(op, bucket)
            return
        reply = Reply(request_id=op.request_id, bucket=bucket, ok=True, entry_count=count)
        self._outbox.reply(reply, ClientAddress.of(op))

    def query(self, op: Operation, bucket: int, offset: int) -> None:
        """Start this bucket's part of a one-shot OQL query on a worker thread (see
        :mod:`regionbus.broker.queries`); :meth:`answer_queries` answers it."""
        if not self._ownership.still_primary(bucket):
            return
        self.queries.submit(op, bucket)

    def answer_queries(self) -> bool:
        """At each turn of the loop: answer the queries done, with the entries each
        selected, ordered and limited, or for ``COUNT(*)`` how many (Geode
        ``Query.execute``); or with the error that ended it (``QueryError``: invalid, over
        its time or row budget, or not evaluable on an entry; ``RequestLimitError``: too
        many pending; ``TransportError``: Redis failed). Returns whether any was answered
        (the caller sends the replies)."""
        finished = self.queries.done()
        for op, bucket, outcome in finished:
            if isinstance(outcome, BucketAnswer):
                self._answer_query(op, bucket, outcome)
            else:
                self._outbox.reply_error(op, bucket, outcome)
        return bool(finished)

    def _answer_query(self, op: Operation, bucket: int, answer: BucketAnswer) -> None:
        if not answer.exists:
            self._region_missing(op, bucket)
        elif answer.selected is not None:
            reply = Reply(
                request_id=op.request_id, bucket=bucket, ok=True, entry_count=answer.selected
            )
            self._outbox.reply(reply, ClientAddress.of(op))
        else:
            self._reply_entries(op, bucket, answer.entries)

    # --- interest ----------------------------------------------------------------------

    def register_interest(self, op: Operation, bucket: int, offset: int) -> None:
        """Register interest in this bucket and answer with its bulk load (docs/behaviour.md §3):
        the registration happens at this point of the bucket's order, so every later change
        is routed to the client (invariant 3). The bulk load of a key list is read here,
        at the same point; that of every key or a regex is read a page at a time on the
        loop's later turns (:mod:`regionbus.broker.initial_results`)."""
        if not self._still_primary_for_registration(bucket):
            return
        spec = op.interest
        assert spec is not None
        keys = [
            k for k in spec.keys if bucket_of(op.region, k, self._settings.total_buckets) == bucket
        ]
        table = self._registry.table
        if spec.kind is InterestKind.KEYS:
            check_count(
                "keys per client",
                table.keys_of(op.client_id) + table.new_keys(op.client_id, op.region, keys),
                MAX_KEYS_PER_CLIENT,
            )
        if spec.kind is InterestKind.REGEX and not self._registry.table.has_regex(
            op.client_id, op.region, spec.regex or ""
        ):
            check_count(
                "regexes per client",
                self._registry.table.regexes_of(op.client_id) + 1,
                MAX_REGEXES_PER_CLIENT,
            )
        key_filter = None
        if spec.kind is InterestKind.REGEX:
            pattern = compile_interest_regex(spec.regex)
            key_filter = lambda key: pattern.fullmatch(key) is not None  # noqa: E731
        if spec.policy is InterestResultPolicy.NONE or spec.kind is not InterestKind.KEYS:
            exists, version = self._region_state(op.region, bucket)
            entries: list[Entry] = []
        else:
            exists, entries, version = self._store.snapshot(
                op.region,
                bucket,
                keys,
                with_values=spec.policy is InterestResultPolicy.KEYS_VALUES,
            )
        if not exists:
            self._region_missing(op, bucket)
            return
        proxy = self._notifier.serve(op.client_id, op.kafka_principal)
        self._registry.register(op.client_id, op.region, spec, bucket, keys)
        if spec.policy is InterestResultPolicy.NONE or spec.kind is InterestKind.KEYS:
            self._reply_entries(op, bucket, entries, version, proxy.reply)
            return
        with_values = spec.policy is InterestResultPolicy.KEYS_VALUES
        self.initial_results.add(PagedLoad(op, bucket, version, with_values, key_filter))

    def unregister_interest(self, op: Operation, bucket: int, offset: int) -> None:
        """Remove a registration."""
        if not self._ownership.still_primary(bucket):
            return
        assert op.interest is not None
        self._registry.unregister(op.client_id, op.region, op.interest)
        self._served(op).reply(Reply(request_id=op.request_id, bucket=bucket, ok=True))

    # --- continuous queries ------------------------------------------------------------

    def execute_cq(self, op: Operation, bucket: int, offset: int) -> None:
        """Run a continuous query in this bucket from this point of its order, answering
        with the bucket's entries in its result set when asked (Geode
        ``executeWithInitialResults``): the snapshot and the start of delivery happen at
        the same point, so the initial results and the events after them leave no gap
        (docs/behaviour.md §9). With initial results that point is the execution's turn among the
        loop's paced loads (:mod:`regionbus.broker.initial_results`), not this one.

        Raises:
            CqInvalidError: the query is outside the CQ subset, or its value schema is bad.
            CqError: the client holds too many CQs.
            TransportError: Redis failed.
        """
        if not self._ownership.still_primary(bucket):
            return
        assert op.cq is not None
        parse_cq(op.cq.query)
        if op.cq.initial_results:
            self.initial_results.add(WholeLoad(op, bucket, lambda: self._paced_cq(op, bucket)))
        else:
            self._execute_cq(op, bucket)

    def _paced_cq(self, op: Operation, bucket: int) -> None:
        """A CQ execution at its turn: refused ones are answered with their error."""
        if not self._ownership.still_primary(bucket):
            return
        try:
            self._execute_cq(op, bucket)
        except TransportError:
            raise
        except RegionBusError as exc:
            self._outbox.reply_error(op, bucket, exc)

    def _execute_cq(self, op: Operation, bucket: int) -> None:
        """Register a CQ in this bucket now, and answer with its initial results.

        Raises:
            CqInvalidError, CqError, TransportError: as :meth:`execute_cq`.
        """
        spec = op.cq
        assert spec is not None
        parsed = parse_cq(spec.query)
        entries: list[Entry] = []
        if spec.initial_results:
            exists, snapshot, _ = self._store.snapshot(op.region, bucket, with_values=True)
        else:
            exists, snapshot = self._store.region_exists(op.region, bucket), []
        if not exists:
            self._region_missing(op, bucket)
            return
        proxy = self._notifier.serve(op.client_id, op.kafka_principal)
        self._cqs.execute(op.client_id, spec, parsed, bucket)
        for entry in snapshot:
            if entry.value is None:
                continue  # an invalid entry is in no result set
            try:
                value = self._cqs.table.value(entry.value, entry.serializer)
                if parsed.selects(value):
                    entries.append(entry)
            except (CqEvaluationError, SerializationError):
                continue  # Geode leaves a value the query cannot read out of the results
        self._reply_entries(op, bucket, entries, reply=proxy.reply)

    def stop_cq(self, op: Operation, bucket: int, offset: int) -> None:
        """Deliver nothing more of a CQ from this bucket; it stays held (Geode ``stopCq``)."""
        if not self._ownership.still_primary(bucket):
            return
        assert op.cq is not None
        self._cqs.stop(op.client_id, op.cq, op.region, bucket)
        self._served(op).reply(Reply(request_id=op.request_id, bucket=bucket, ok=True))

    def close_cq(self, op: Operation, bucket: int, offset: int) -> None:
        """Forget a CQ (Geode ``closeCq``)."""
        if not self._ownership.still_primary(bucket):
            return
        assert op.cq is not None
        self._cqs.close(op.client_id, op.cq.name)
        self._served(op).reply(Reply(request_id=op.request_id, bucket=bucket, ok=True))

    def get_durable_cqs(self, op: Operation, bucket: int, offset: int) -> None:
        """Answer with the names of the client's durable CQs the servers hold (Geode
        ``getAllDurableCqsFromServer``)."""
        names = tuple(self._cqs.durable_names(op.client_id))
        self._served(op).reply(
            Reply(request_id=op.request_id, bucket=bucket, ok=True, cq_names=names)
        )

    # --- clients -----------------------------------------------------------------------

    def disconnect(self, op: Operation, bucket: int, offset: int) -> None:
        """Drop a client's interest in this bucket (see `ClientLifecycle.disconnect`), and
        the initial results it still waits for."""
        if self._ownership.still_primary(bucket):
            self.initial_results.drop(op.client_id, bucket)
            self._lifecycle.disconnect(op, bucket)

    def ready_for_events(self, op: Operation, bucket: int, offset: int) -> None:
        """Write this bucket's marker into the client's queue: what the queue holds of this
        bucket before it was queued while the client was away (docs/behaviour.md §5, step 1)."""
        connection_id = op.event_id.member if op.event_id is not None else None
        self._notifier.marker(
            Marker(op.client_id, wall_clock_ms(), bucket, connection_id), op.kafka_principal
        )
        latency = self._entries.latency
        if latency is not None and latency.record_ms:
            latency.markers_from_ms.append(latency.record_ms)
        self._served(op).reply(Reply(request_id=op.request_id, bucket=bucket, ok=True))

    # --- replies -----------------------------------------------------------------------

    def _served(self, op: Operation) -> ClientProxy:
        """The proxy of the client whose registrations or queue ``op`` concerns (its
        replies go where the op's principal says)."""
        return self._notifier.serve(op.client_id, op.kafka_principal)

    def _region_missing(self, op: Operation, bucket: int) -> None:
        self._outbox.reply_error(op, bucket, RegionNotFoundError(f"region {op.region!r} not found"))

    def _reply_entries(
        self,
        op: Operation,
        bucket: int,
        entries: list[Entry],
        version: int | None = None,
        reply: Callable[[Reply], None] | None = None,
    ) -> None:
        """Reply with entries (see :func:`regionbus.broker.initial_results.reply_entries`),
        through ``reply`` (a client proxy's, for registrations), else to the op's address."""
        send = reply or partial(self._outbox.reply, to=ClientAddress.of(op))
        reply_entries(send, self._settings.reply_chunk_bytes, op, bucket, entries, version)


__all__ = ["Handler", "OperationHandlers"]
