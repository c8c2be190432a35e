"""Clients' lives as the servers see them: connect, ping, close, silence, and the reaper.

``{ns}.control`` is read by bucket 0's primary for the whole namespace. A second live
connection of a client id, durable or not, is refused (the id addresses the client's queue
records and names the consumer group of its acks). A ping of a connection that lost its id
to another live one is answered ``TAKEN``, so that connection neither reconnects nor
deletes anything when it closes. A client silent for ``maximum_time_between_pings_ms`` is
treated as gone: a non-durable one is forgotten; a durable one keeps its queue and durable
interest (docs/behaviour.md §5, abnormal disconnect) for ``durable_client_timeout_s``, after which
the reaper (one server at a time, by lease) unregisters it (docs/behaviour.md §5).

Forgetting a client has two halves. Every server forgets what it keeps of the client (its
interest in the routing table, its proxy: queue address, depth and counters, and its
principal) when it processes the client's ``DISCONNECT`` in one of its buckets; bucket
0's primary, which holds the client records, also forgets it for the namespace then (its
record, its interest in Redis, its principal binding). What is left in Kafka, the consumer
group holding its acks, the reaper deletes for every client that has no record
(:meth:`ClientLifecycle.reap`). So everything a client owned is gone within its silence
window (non-durable) or its ``durable_client_timeout_s`` (durable), plus at most two reaper
intervals and a DISCONNECT's trip through the buckets' backlogs.

No wall clock decides a client's fate (a server's clock may step: NTP, a VM resumed, skew
between servers). Silence is timed on this server's monotonic clock and starts afresh for
every client when a server takes the records over (as Geode's client health monitor does
on the server a client fails over to); a durable client's time away is timed on Redis's
clock (`ClientRegistry.now_ms`), the one clock every server reads the records by.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future
from functools import partial
from typing import Any, Final

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from regionbus.broker.client_proxy import ClientProxies
from regionbus.broker.client_registry import ClientRecord, ClientRegistry
from regionbus.broker.client_topics import SharedTopicGuard
from regionbus.broker.config import ServerSettings
from regionbus.broker.cq_registry import CqRegistry
from regionbus.broker.interest import InterestRegistry
from regionbus.broker.outbox import Outbox
from regionbus.broker.security import SecurityGuard
from regionbus.broker.stats import ServerStats
from regionbus.runtime.leases import Lease, wall_clock_ms
from regionbus.schemas.addressing import ClientAddress
from regionbus.schemas.codec import encode
from regionbus.schemas.errors import (
    ConfigurationError,
    DuplicateClientError,
    DuplicateDurableClientError,
    RegionBusError,
)
from regionbus.schemas.messages import (
    CLIENT_TAKEN,
    CLIENT_UNKNOWN,
    Control,
    ControlKind,
    Operation,
    OperationKind,
    Reply,
)
from regionbus.schemas.naming import Topics
from regionbus.schemas.topics import queue_retention_ms

log = logging.getLogger("regionbus.server")

LIFECYCLE_BUCKET: Final = 0
"""The bucket whose primary reads ``{ns}.control`` and keeps the client records."""
_GROUP_DELETES_PER_REQUEST: Final = 500


class ClientLifecycle:
    """The clients this server knows, and what happens to them.

    Args:
        settings: The server's settings (liveness window, buckets).
        topics: The namespace's topic names.
        clients: The client records in Redis.
        registry: The interest registry (a client's interest goes with it).
        proxies: The clients served here: each proxy holds its client's record,
            addresses and registrations here, and closes them.
        cqs: The continuous queries (a client's CQs go with it, as its interest does).
        outbox: Replies, and the DISCONNECT operations sent to every bucket.
        stats: The server's counters.
        security: Signs the DISCONNECT operations when security is on.
        reaper: The reaper role's lease.
        admin: Kafka admin client (the shared topics' configs checked at each connect,
            consumer groups of forgotten clients).
    """

    def __init__(
        self,
        settings: ServerSettings,
        topics: Topics,
        clients: ClientRegistry,
        registry: InterestRegistry,
        proxies: ClientProxies,
        outbox: Outbox,
        stats: ServerStats,
        security: SecurityGuard | None,
        reaper: Lease,
        admin: AdminClient,
        cqs: CqRegistry,
    ) -> None:
        self._settings = settings
        self._topics = topics
        self.clients = clients
        self._registry = registry
        self._proxies = proxies
        self._outbox = outbox
        self._stats = stats
        self._security = security
        self._reaper = reaper
        self._admin = admin
        self._cqs = cqs
        self._topic_guard = SharedTopicGuard(
            admin,
            topics,
            outbox.client_topics,
            queue_retention_ms(settings.max_durable_client_timeout_s),
        )
        self._listing: Future[Any] | None = None
        self.groups_deleted = 0
        """Consumer groups of forgotten clients this server deleted as the reaper."""

    @property
    def records(self) -> dict[str, ClientRecord]:
        """``{client id: record}`` as of the last `reload`, kept current by control
        messages (each held by the client's proxy)."""
        return self._proxies.records()

    def reload(self) -> dict[str, ClientRecord]:
        """Read every client record from Redis (at start, and when taking buckets over);
        each client's proxy here keeps its record (made now if new), and the clients that
        have none are forgotten here.

        Raises:
            TransportError: Redis failed.
        """
        loaded = self.clients.all()
        for client_id, record in loaded.items():
            # A client this server was already timing keeps its silence so far; any other
            # starts a full liveness window now (its last ping was timed elsewhere).
            known = self._proxies.record_of(client_id)
            if known is not None and known.connection_id == record.connection_id:
                record.heard_at_s = known.heard_at_s
        for client_id in self._proxies.retain(set(loaded)):
            self._forget_here(client_id)
        for client_id, record in loaded.items():
            self._proxies.keep_record(client_id, record)
        return loaded

    def seen(self, client_id: str) -> None:
        """A connected client sent something: it is alive."""
        record = self._proxies.record_of(client_id)
        if record is not None and record.connected:
            record.heard_at_s = time.monotonic()

    def outage_ended(self) -> None:
        """Do not count a Redis outage as the clients' silence."""
        now = time.monotonic()
        for record in self.records.values():
            if record.connected:
                record.heard_at_s = max(record.heard_at_s, now)

    # --- control messages --------------------------------------------------------------

    def control(self, control: Control) -> None:
        """Handle a connect, ping or close from ``{ns}.control``.

        Raises:
            TransportError: Redis failed.
        """
        if control.kind is ControlKind.CONNECT:
            self._connect(control)
        elif control.kind is ControlKind.PING:
            self._ping(control)
        elif control.kind is ControlKind.CLOSE:
            self._close(control)

    def _connect(self, control: Control) -> None:
        """Record a (re)connection; or refuse it: a second live connection of the client
        id, a durable-client timeout above the servers' bound, or shared topics of its
        principal that would lose its records and cannot be set back."""
        client_id = control.client_id
        durable = control.durable_client_id is not None
        connection_id = control.connection_id or client_id
        limit_s = self._settings.max_durable_client_timeout_s
        if durable and not 0 < control.durable_client_timeout_s <= limit_s:
            self._outbox.refuse_control(
                control,
                ConfigurationError(
                    f"durable_client_timeout_s {control.durable_client_timeout_s} is out of "
                    f"the servers' range of 1 to {limit_s} s (max_durable_client_timeout_s)"
                ),
            )
            return
        try:
            self._topic_guard.check(control.kafka_principal)
        except RegionBusError as exc:
            log.error("refused the connection of %s: %s", client_id, exc)
            self._outbox.refuse_control(control, exc)
            return
        known = self._proxies.record_of(client_id)
        live = known if known is not None and known.connected and self._live(known) else None
        result = self.clients.connect(
            client_id,
            connection_id,
            durable=durable,
            durable_client_timeout_s=control.durable_client_timeout_s,
            live_connection_id=live.connection_id if live is not None else None,
            kafka_principal=control.kafka_principal,
        )
        if result.state == "REFUSED":
            kind = DuplicateDurableClientError if durable else DuplicateClientError
            silent_ms = (time.monotonic() - live.heard_at_s) * 1000 if live is not None else 0.0
            error = kind(
                f"{'durable ' if durable else ''}client {client_id!r} is already connected "
                f"(connection {result.live_connection_id}, last heard from "
                f"{silent_ms:.0f} ms ago)"
            )
            log.warning("refused a second connection %s: %s", connection_id, error)
            self._outbox.refuse_control(control, error)
            return
        proxy = self._proxies.keep_record(
            client_id,
            ClientRecord(
                durable,
                connection_id,
                True,
                result.connected_at_ms,
                control.durable_client_timeout_s,
                kafka_principal=control.kafka_principal,
            ),
        )
        log.info("client %s connected (%s, %s)", client_id, connection_id, result.state)
        proxy.reply(
            Reply(
                request_id=control.request_id,
                bucket=-1,
                ok=True,
                client_state=result.state,
                subscription_conflation=self._settings.enable_subscription_conflation,
                max_value_size_bytes=self._settings.max_value_size_bytes,
            )
        )

    def new_poll_batch(self) -> None:
        """A new poll batch begins: the connects in it check their shared topics afresh."""
        self._topic_guard.new_batch()

    def _ping(self, control: Control) -> None:
        record = self._proxies.record_of(control.client_id)
        current = (
            record is not None
            and record.connected
            and (control.connection_id is None or record.connection_id == control.connection_id)
        )
        if current:
            assert record is not None
            record.heard_at_s = time.monotonic()
        if control.request_id:
            state = None
            if not current:
                taken = record is not None and record.connected and self._live(record)
                state = CLIENT_TAKEN if taken else CLIENT_UNKNOWN
            self._outbox.reply(
                Reply(request_id=control.request_id, bucket=-1, ok=True, client_state=state),
                ClientAddress.of(control),
            )

    def _live(self, record: ClientRecord) -> bool:
        """Heard from within the liveness window, on this server's monotonic clock."""
        silent_ms = (time.monotonic() - record.heard_at_s) * 1000
        return silent_ms <= self._settings.maximum_time_between_pings_ms

    def _close(self, control: Control) -> None:
        client_id = control.client_id
        record = self._proxies.record_of(client_id)
        if record is None or (
            control.connection_id is not None and record.connection_id != control.connection_id
        ):
            return
        # The client has already had every bucket drop its interest (DISCONNECT).
        if record.durable and control.keep_alive:
            self._disconnect_durable(client_id, record, away_for_ms=0)
        else:
            self.forget(client_id)
        log.info("client %s closed (keep_alive=%s)", client_id, control.keep_alive)

    # --- disconnecting -----------------------------------------------------------------

    def disconnect(self, op: Operation, bucket: int) -> None:
        """A DISCONNECT operation in a bucket: drop the client's interest and continuous
        queries (all of them, or all but the durable ones with ``keep_alive``); without
        ``keep_alive`` forget the client here, and in bucket 0 for the namespace; reply
        when asked.

        Raises:
            TransportError: Redis failed.
        """
        self._registry.drop_client(op.client_id, keep_durable=op.keep_alive)
        self._cqs.drop_client(op.client_id, keep_durable=op.keep_alive)
        if not op.keep_alive:
            if bucket == LIFECYCLE_BUCKET:
                self.forget(op.client_id)
            else:
                self._forget_here(op.client_id)
        if op.request_id:
            self._outbox.reply(
                Reply(request_id=op.request_id, bucket=bucket, ok=True),
                ClientAddress.of(op),
            )

    def disconnect_unresponsive(self, client_id: str) -> None:
        """Disconnect a client whose queue stayed full (the operator's choice): routing to
        it stops here at once (the DISCONNECTs wait behind every bucket's backlog), and
        every bucket's primary forgets it."""
        self._disconnect_everywhere(client_id, keep_alive=False)
        self._forget_here(client_id)

    def _disconnect_everywhere(self, client_id: str, *, keep_alive: bool) -> None:
        """Have every bucket's primary drop a client's interest (all, or all but the durable
        registrations), in the order of each bucket's operations."""
        op = Operation(
            request_id=0,
            client_id=client_id,
            kind=OperationKind.DISCONNECT,
            region="",
            timestamp_ms=wall_clock_ms(),
            keep_alive=keep_alive,
        )
        value = encode(op)
        for bucket in range(self._settings.total_buckets):
            headers = None
            if self._security is not None:
                headers = self._security.server_headers(self._topics.ops, bucket, value)
            self._outbox.produce(self._topics.ops, value, None, partition=bucket, headers=headers)

    def _disconnect_durable(
        self, client_id: str, record: ClientRecord, *, away_for_ms: int
    ) -> None:
        """Keep a durable client's queue and durable interest; start its timeout on Redis's
        clock, ``away_for_ms`` ago (it went silent that long before it was noticed)."""
        record.connected = False
        record.disconnected_at_ms = self.clients.now_ms() - away_for_ms
        self.clients.save(client_id, record)

    def forget(self, client_id: str) -> None:
        """Forget a client for the namespace (its record, its principal's binding) and
        here; its consumer group goes at the reaper's next sweep.

        Raises:
            TransportError: Redis failed.
        """
        self._proxies.close(client_id, keep_record=False)
        self.clients.remove(client_id)
        if self._security is not None:
            self._security.forget_client(client_id)

    def _forget_here(self, client_id: str) -> None:
        """Forget what this server keeps of a client (`ClientProxies.close`), but its
        record: that goes when it is forgotten for the namespace."""
        self._proxies.close(client_id)

    # --- silence and the reaper --------------------------------------------------------

    def expire_silent(self) -> None:
        """Treat a client silent for ``maximum_time_between_pings_ms`` as gone: drop a
        non-durable one; keep a durable one's queue and durable interest (docs/behaviour.md §5:
        abnormal disconnect) until its timeout. Silence is timed on this server's
        monotonic clock.

        Raises:
            TransportError: Redis failed.
        """
        now = time.monotonic()
        limit_ms = self._settings.maximum_time_between_pings_ms
        for client_id, record in list(self.records.items()):
            silent_ms = int((now - record.heard_at_s) * 1000)
            if not record.connected or silent_ms <= limit_ms:
                continue
            log.warning(
                "client %s sent nothing for more than %d ms: %s",
                client_id,
                limit_ms,
                "keeping its queue and durable interest" if record.durable else "dropping it",
            )
            self._disconnect_everywhere(client_id, keep_alive=record.durable)
            if record.durable:
                self._disconnect_durable(client_id, record, away_for_ms=silent_ms)
            else:
                self.forget(client_id)

    def prune(self) -> None:
        """Forget here the clients this server still serves that have no record any more
        (forgotten while this server was primary of none of their buckets, so it saw none
        of their DISCONNECTs): their routing, proxies and metric series.

        Raises:
            TransportError: Redis failed.
        """
        served = self._proxies.ids()
        known = self.clients.known(served)
        for client_id in served:
            if client_id not in known:
                self._forget_here(client_id)

    def reap(self) -> None:
        """As the reaper (a singleton role): unregister the durable clients away longer
        than their timeout (every bucket's primary drops their interest, bucket 0's then
        forgets them), and delete the consumer groups of clients that have no record any
        more (listed at one call, deleted at the next, without waiting on Kafka). Time
        away is read on Redis's clock, the one the records were stamped by.

        Raises:
            TransportError: Redis failed.
        """
        if self._reaper.try_acquire() is None:
            self._listing = None
            return
        now = self.clients.now_ms()
        listing, self._listing = self._listing, None
        records = self.clients.all()
        for client_id, record in records.items():
            if record.expired(now):
                self._start_unregistering(client_id, record)
            elif record.reaping:
                # Its DISCONNECTs are on their way (or were lost): send them again.
                self._disconnect_everywhere(client_id, keep_alive=False)
        if listing is not None and listing.done():
            self._delete_orphan_groups(listing, set(records))
        try:
            self._listing = self._admin.list_consumer_groups(request_timeout=10)
        except KafkaException as exc:
            log.warning("cannot list the consumer groups: %s", exc)

    def _delete_orphan_groups(self, listing: Future[Any], registered: set[str]) -> None:
        """Delete the ``{ns}.client.<id>`` groups of ids without a record (listed before the
        records were read, so a client connecting meanwhile keeps its group)."""
        try:
            valid = listing.result(timeout=0).valid
        except (KafkaException, TimeoutError) as exc:
            log.warning("cannot list the consumer groups: %s", exc)
            return
        orphans = []
        for listed in valid:
            client_id = self._topics.client_of_group(listed.group_id)
            if client_id is not None and client_id not in registered:
                orphans.append(listed.group_id)
        for start in range(0, len(orphans), _GROUP_DELETES_PER_REQUEST):
            chunk = orphans[start : start + _GROUP_DELETES_PER_REQUEST]
            try:
                futures = self._admin.delete_consumer_groups(chunk, request_timeout=10)
            except KafkaException as exc:
                log.warning("cannot delete the consumer groups of forgotten clients: %s", exc)
                return
            for group, future in futures.items():
                future.add_done_callback(partial(self._group_deleted, group))

    def _group_deleted(self, group: str, future: Future[Any]) -> None:
        try:
            future.result()
        except KafkaException as exc:
            if exc.args[0].code() not in (KafkaError.GROUP_ID_NOT_FOUND,):
                log.info("deleting group %s: %s", group, exc)
            return
        self.groups_deleted += 1
        log.info("deleted the consumer group of forgotten client: %s", group)

    def release_reaper(self) -> None:
        """Give the reaper role up (the server stops)."""
        self._reaper.release()

    def _start_unregistering(self, client_id: str, record: ClientRecord) -> None:
        log.error(
            "ALERT: durable client %s stayed away longer than its durable-client-timeout of "
            "%d s: unregistering it (queue, offsets, durable interest)",
            client_id,
            record.durable_client_timeout_s,
        )
        self._stats.durable_clients_expired += 1
        record.reaping = True
        self.clients.save(client_id, record)
        self._proxies.drop_record(client_id)
        self._disconnect_everywhere(client_id, keep_alive=False)


__all__ = ["LIFECYCLE_BUCKET", "ClientLifecycle"]
