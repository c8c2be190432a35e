"""Entry operations (put, destroy, invalidate, Geode's conditional put-if-absent, replace
and remove, and the reads get and contains-key): applied in batches, then distributed.

The entry operations of one poll batch are applied to Redis in one pipelined round trip of
Lua scripts (entry versions, duplicate detection by EventID, fencing epochs); a region with
server writers takes its changes one at a time, as each writer must see the state before
its change. What follows each applied change is `regionbus.broker.distribution`'s, then
its originator gets the reply (docs/behaviour.md §1: writer -> apply -> listeners -> distribution).
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any, NamedTuple

from regionbus.broker.config import ServerSettings
from regionbus.broker.distribution import Distribution
from regionbus.broker.loading import EntryLoads
from regionbus.broker.outbox import Outbox
from regionbus.broker.ownership import BucketOwnership
from regionbus.broker.plugins import ServerPlugins
from regionbus.broker.server_latency import ServerLatency
from regionbus.broker.stats import ServerStats
from regionbus.broker.store import Access, ApplyResult, GatewayVersion, RegionStore
from regionbus.broker.tracing import ServerSpans
from regionbus.runtime.leases import wall_clock_ms
from regionbus.schemas.addressing import ClientAddress
from regionbus.schemas.errors import CacheWriterError, RegionNotFoundError
from regionbus.schemas.messages import Entry, Event, EventKind, Operation, OperationKind, Reply
from regionbus.schemas.operation_kinds import kind_row


class _Pending(NamedTuple):
    op: Operation
    bucket: int
    offset: int
    record_ms: int = 0
    """Kafka timestamp of the operation's record, while latencies are kept."""
    span: Any = None
    """Its ``process`` span, while it is traced (`regionbus.broker.tracing`)."""


class EntryOperations:
    """The batch of entry operations of the poll batch in hand, and what follows an apply.

    Args:
        settings: The server's settings (``distributed_system_id`` for gateway versions).
        store: The region store.
        ownership: The buckets held (epochs to apply with; a fenced write drops a bucket).
        plugins: Server writers, asked before a change.
        distribution: What follows each applied change (listeners, routing, gateways).
        outbox: Replies.
        stats: The server's counters.
        loads: The loads of gets' misses (`regionbus.broker.loading`).
        latency: The server's latency histograms, None while it keeps none (no metrics
            endpoint configured).
        tracing: The server's spans, None with tracing off.
    """

    def __init__(
        self,
        settings: ServerSettings,
        store: RegionStore,
        ownership: BucketOwnership,
        plugins: ServerPlugins,
        distribution: Distribution,
        outbox: Outbox,
        stats: ServerStats,
        loads: EntryLoads,
        latency: ServerLatency | None = None,
        tracing: ServerSpans | None = None,
    ) -> None:
        self._site_id = settings.distributed_system_id
        self._expiration = {r: e for r, e in settings.region_expiration.items() if e.enabled}
        self._store = store
        self._ownership = ownership
        self._plugins = plugins
        self._distribution = distribution
        self._outbox = outbox
        self._stats = stats
        self._loads = loads
        self.latency = latency
        """The server's latency histograms (intake and handlers stamp them), or None."""
        self.tracing = tracing
        """The server's spans (the intake tells it each record's contexts), or None."""
        self._pending: list[_Pending] = []

    def add(self, op: Operation, bucket: int, offset: int) -> None:
        """Add an entry operation to the batch; a change of a region with writers first
        applies the batch so far, then asks the writers (an abort is replied now)."""
        # Geode's local operations ask no CacheWriter.
        row = kind_row(op.kind)
        if op.kind not in _READS and not row.local and self._plugins.has_writers(op.region):
            self.apply()
            if not self._writers_allow(op, bucket):
                return
        latency, tracing = self.latency, self.tracing
        record_ms = 0 if latency is None else latency.record_ms
        span = None if tracing is None else tracing.process(op, bucket, offset)
        self._pending.append(_Pending(op, bucket, offset, record_ms, span))

    def discard(self) -> None:
        """Forget the batch not applied yet (Redis failed: the operations are read again
        from the committed offsets)."""
        self._pending = []

    def apply(self) -> None:
        """Apply the batch in one Redis round trip, then distribute and reply per change."""
        if not self._pending:
            return
        latency = self.latency
        started_s = time.monotonic() if latency is not None else 0.0
        owned = self._ownership.owned
        # A bucket fenced earlier in this poll batch is no longer ours: drop its operations.
        pending = [p for p in self._pending if p.bucket in owned]
        self._pending = []
        batch: list[Any] = []
        now = wall_clock_ms()
        for op, bucket, offset, *_ in pending:
            assert op.key is not None
            expiration = self._expiration.get(op.region)
            if op.kind in _READS:
                # A server get is an access: it pushes an idle timeout back (Geode
                # LocalRegion.updateStatsForGet); containsKeyOnServer is not one.
                access = None
                if (
                    op.kind is OperationKind.GET
                    and expiration is not None
                    and expiration.entry_idle_timeout.timeout_s
                ):
                    access = Access(expiration, now)
                batch.append((op.region, op.key, bucket, access))
                continue
            assert op.event_id is not None
            batch.append(
                self._store.entry_args(
                    op.kind,
                    op.region,
                    op.key,
                    op.value,
                    op.serializer,
                    op.event_id._replace(bucket=bucket),
                    bucket,
                    offset,
                    # A replace answers the value it replaced (Geode Region.replace).
                    want_old=op.kind is OperationKind.REPLACE
                    or self._distribution.wants_old_value(op.region),
                    epoch=owned[bucket],
                    gateway_version=GatewayVersion(
                        op.timestamp_ms, op.origin_site_id or self._site_id
                    )
                    if self._site_id
                    else None,
                    from_gateway=op.origin_site_id not in (0, self._site_id),
                    expiration=expiration,
                    now_ms=now,
                    expected_value=op.expected_value,
                )
            )
        results = self._store.run_batch(batch)
        stats = self._stats
        for (op, bucket, _, record_ms, span), result in zip(pending, results, strict=True):
            if isinstance(result, ApplyResult):
                routed = stats.events_routed
                if span is None:
                    self._applied(op, bucket, result)
                else:
                    assert self.tracing is not None
                    after = partial(self._applied, op, bucket, result)
                    self.tracing.applied(span, result.status, after)
                if latency is not None and record_ms and stats.events_routed != routed:
                    latency.queued_from_ms.append(record_ms)
            else:
                self._reply_get(op, bucket, result)
        if latency is not None:
            latency.apply.observe(time.monotonic() - started_s)

    def _writers_allow(self, op: Operation, bucket: int) -> bool:
        """Run server writers before an entry change; False (error replied) if one aborts.
        A conditional operation whose condition does not hold now asks no writer (nothing
        will change; the apply script answers it)."""
        assert op.key is not None
        exists, entry = self._store.get(op.region, op.key, bucket)
        kind = _writer_event_kind(op, entry) if exists else None
        if kind is None:
            return True  # the apply script reports the missing region / entry
        try:
            self._plugins.veto_entry(op, kind, entry.value if entry else None)
        except CacheWriterError as exc:
            if op.kind is OperationKind.LOAD_CREATE:
                self._loads.failed(op, exc)  # its gets hear the veto
            else:
                self._outbox.reply_error(op, bucket, exc)
            return False
        return True

    def _reply_get(self, op: Operation, bucket: int, result: tuple[bool, Entry | None]) -> None:
        exists, entry = result
        if not exists:
            error = RegionNotFoundError(f"region {op.region!r} not found")
            self._outbox.reply_error(op, bucket, error)
            return
        if op.kind is OperationKind.CONTAINS_KEY:
            reply = Reply(request_id=op.request_id, bucket=bucket, ok=True, found=entry is not None)
            self._outbox.reply(reply, ClientAddress.of(op))
            return
        if (entry is None or entry.value is None) and self._loads.miss(op, bucket):
            return  # answered once loaded (or refused now)
        self._outbox.reply(
            Reply(
                request_id=op.request_id,
                bucket=bucket,
                ok=True,
                found=entry is not None,
                version=entry.version if entry else None,
                value=entry.value if entry else None,
                serializer=entry.serializer if entry else None,
            ),
            ClientAddress.of(op),
        )

    def _applied(self, op: Operation, bucket: int, result: ApplyResult) -> None:
        if refused(op, bucket, result, self._ownership, self._outbox, self._stats):
            return
        if op.kind is OperationKind.LOAD_CREATE:
            self._load_applied(op, bucket, result)
            return
        if kind_row(op.kind).local:
            duplicate = result.status == "DUP"
            event = applied_event(op, bucket, result)
            if event is not None:
                self._distribution.entry_changed_locally(
                    event, result.old_value, duplicate=duplicate
                )
            if duplicate:
                self._stats.duplicates += 1
            else:
                self._stats.applied(op.region, op.kind)
            return  # produced by a server's function, which hears of it no further
        if result.status == "NOOP":
            # A condition that did not hold: no event; the answer is the current value
            # (what Geode's putIfAbsent returns; replace and remove return nothing then).
            self._outbox.reply(
                Reply(
                    request_id=op.request_id,
                    bucket=bucket,
                    ok=True,
                    found=result.old_value is not None,
                    value=result.old_value,
                    serializer=result.old_serializer,
                ),
                ClientAddress.of(op),
            )
            return
        event = applied_event(op, bucket, result)
        if event is not None:
            self._distribution.entry_changed(
                event,
                bucket,
                result.old_value,
                result.old_serializer,
                duplicate=result.status == "DUP",
            )
        reply_applied(op, bucket, result, self._outbox, self._stats)

    def _load_applied(self, op: Operation, bucket: int, result: ApplyResult) -> None:
        """A loader's create was applied (distributed as a load), or found the key valued
        (``NOOP``: a put came first); the gets that waited on the load get the value."""
        if result.status == "NOOP":
            self._loads.applied(op, result.old_value, result.old_serializer, None)
            return
        event = applied_event(op, bucket, result)
        if event is not None:
            self._distribution.entry_changed(
                event._replace(load=True),
                bucket,
                result.old_value,
                result.old_serializer,
                duplicate=result.status == "DUP",
            )
        self._loads.applied(op, op.value, op.serializer, result.version)


def applied_event(op: Operation, bucket: int, result: ApplyResult) -> Event | None:
    """The event of an applied change (entry or region), as subscribers receive it; None
    when the apply changed nothing to tell (e.g. a destroy of a missing entry).

    A recognised duplicate (``DUP``: the EventID was applied before a failover) gives the
    same event again, flagged ``possible_duplicate``; the value travels only with a create
    or an update.
    """
    if result.event_kind is None or result.version is None:
        return None
    assert op.event_id is not None
    carries_value = result.event_kind in (EventKind.CREATE, EventKind.UPDATE)
    return Event(
        event_id=op.event_id._replace(bucket=bucket),
        kind=result.event_kind,
        region=op.region,
        version=result.version,
        timestamp_ms=op.timestamp_ms,
        originator=op.client_id,
        key=op.key,
        value=op.value if carries_value else None,
        serializer=op.serializer,
        possible_duplicate=op.possible_duplicate or result.status == "DUP",
        callback_argument=op.callback_argument,
        origin_site_id=op.origin_site_id,
        sites_reached=op.sites_reached,
    )


def refused(
    op: Operation,
    bucket: int,
    result: ApplyResult,
    ownership: BucketOwnership,
    outbox: Outbox,
    stats: ServerStats,
) -> bool:
    """Handle an apply that did not happen: a stale fencing epoch (``FENCED``: the bucket
    is dropped, no reply: the new primary answers) or an error (``ERR``: replied).

    Returns:
        True when the apply was refused and nothing more is to be done for it.
    """
    if result.status == "FENCED":
        ownership.fenced(bucket)
        return True
    if result.status == "ERR":
        stats.errors += 1
        outbox.reply(
            Reply(
                request_id=op.request_id,
                bucket=bucket,
                ok=False,
                error_type=result.error_type,
                error_message=_error_text(result.error_type, op),
            ),
            ClientAddress.of(op),
        )
        return True
    return False


def reply_applied(
    op: Operation, bucket: int, result: ApplyResult, outbox: Outbox, stats: ServerStats
) -> None:
    """Count an applied (or recognised duplicate) change and tell its originator."""
    duplicate = result.status == "DUP"
    if duplicate:
        stats.duplicates += 1
    else:
        stats.applied(op.region, op.kind)
    replaced = op.kind is OperationKind.REPLACE
    outbox.reply(
        Reply(
            request_id=op.request_id,
            bucket=bucket,
            ok=True,
            event_kind=result.event_kind,
            duplicate=duplicate,
            version=result.version,
            # A replace answers the value it replaced (Geode Region.replace(k, v)).
            found=replaced and result.old_value is not None,
            value=result.old_value if replaced else None,
            serializer=result.old_serializer if replaced else None,
        ),
        ClientAddress.of(op),
    )


_READS = frozenset((OperationKind.GET, OperationKind.CONTAINS_KEY))
"""The batched entry operations that read (an item of the batch's reads, not a change)."""


def _writer_event_kind(op: Operation, entry: Entry | None) -> EventKind | None:
    """The event a change would cause, as server writers are asked about it; None when it
    changes nothing (a missing entry to destroy or invalidate, a condition that does not
    hold: Geode asks writers only for a change that will happen)."""
    kind = op.kind
    if kind is OperationKind.PUT:
        return EventKind.UPDATE if entry is not None else EventKind.CREATE
    if kind is OperationKind.PUT_IF_ABSENT:
        return EventKind.CREATE if entry is None else None
    if kind is OperationKind.LOAD_CREATE:
        if entry is None:
            return EventKind.CREATE
        return EventKind.UPDATE if entry.value is None else None
    if entry is None:
        return None
    if kind is OperationKind.REPLACE:
        holds = op.expected_value is None or entry.value == op.expected_value
        return EventKind.UPDATE if holds else None
    if kind is OperationKind.REMOVE:
        return EventKind.DESTROY if entry.value == op.expected_value else None
    return EventKind.DESTROY if kind is OperationKind.DESTROY else EventKind.INVALIDATE


def _error_text(error_type: str | None, op: Operation) -> str:
    if error_type == "RegionNotFoundError":
        return f"region {op.region!r} not found"
    if error_type == "EntryNotFoundError":
        return f"entry {op.key!r} not found in region {op.region!r}"
    return f"{op.kind.value} failed: {error_type}"


__all__ = ["EntryOperations", "applied_event", "refused", "reply_applied"]
