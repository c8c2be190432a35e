"""Clients' lives as the servers see them: connect, ping, close, silence, and the reaper.

``{ns}.control`` is read by bucket 0's primary for the whole namespace. A second live
connection of a client id, durable or not, is refused (the id names the client's topics).
A ping of a connection that lost its id to another live one is answered ``TAKEN``, so that
connection neither reconnects nor deletes the topics when it closes. A client silent for
``maximum_time_between_pings_ms`` is treated as gone: a non-durable one is forgotten; a
durable one keeps its queue and durable interest (seed 001, abnormal disconnect) for
``durable_client_timeout_s``, after which the reaper (one server at a time, by lease)
unregisters it: every bucket's primary drops its interest first, then its topics and
committed offsets are deleted (SPEC §5).
"""

from __future__ import annotations

import logging

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from regionbus.broker.client_registry import ClientRecord, ClientRegistry
from regionbus.broker.config import ServerSettings
from regionbus.broker.cq_registry import CqRegistry
from regionbus.broker.interest import InterestRegistry
from regionbus.broker.outbox import Outbox
from regionbus.broker.queue_depth import QueueDepths
from regionbus.broker.security import SecurityGuard
from regionbus.broker.stats import ServerStats
from regionbus.runtime.leases import Lease, now_ms
from regionbus.schemas.codec import encode
from regionbus.schemas.errors import DuplicateClientError, DuplicateDurableClientError
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

log = logging.getLogger("regionbus.server")

_ADMIN_TIMEOUT_S = 15


class ClientLifecycle:
    """The clients this server knows, and what happens to them.

    Args:
        settings: The server's settings (liveness window, buckets).
        topics: The namespace's topic names.
        clients: The client records in Redis.
        registry: The interest registry (a client's interest goes with it).
        cqs: The continuous queries (a client's CQs go with it, as its interest does).
        outbox: Replies, and the DISCONNECT operations sent to every bucket.
        depths: Queue depth bookkeeping (forgotten with the client).
        stats: The server's counters.
        security: Signs the DISCONNECT operations when security is on.
        reaper: The reaper role's lease.
    """

    def __init__(
        self,
        settings: ServerSettings,
        topics: Topics,
        clients: ClientRegistry,
        registry: InterestRegistry,
        outbox: Outbox,
        depths: QueueDepths,
        stats: ServerStats,
        security: SecurityGuard | None,
        reaper: Lease,
        cqs: CqRegistry,
    ) -> None:
        self._settings = settings
        self._topics = topics
        self.clients = clients
        self._registry = registry
        self._outbox = outbox
        self._depths = depths
        self._stats = stats
        self._security = security
        self._reaper = reaper
        self._cqs = cqs
        self.records: dict[str, ClientRecord] = {}
        """The client records as of the last `reload`, kept current by control messages."""

    def reload(self) -> dict[str, ClientRecord]:
        """Read every client record from Redis (at start, and when taking buckets over).

        Raises:
            TransportError: Redis failed.
        """
        self.records = self.clients.all()
        return self.records

    def seen(self, client_id: str) -> None:
        """A connected client sent something: it is alive."""
        record = self.records.get(client_id)
        if record is not None and record.connected:
            record.last_seen_ms = now_ms()

    def outage_ended(self) -> None:
        """Do not count a Redis outage as the clients' silence."""
        now = now_ms()
        for record in self.records.values():
            if record.connected:
                record.last_seen_ms = max(record.last_seen_ms, now)

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
        """Record a (re)connection, or refuse a second live connection of the client id."""
        client_id = control.client_id
        durable = control.durable_client_id is not None
        connection_id = control.connection_id or client_id
        now = now_ms()
        result = self.clients.connect(
            client_id,
            connection_id,
            durable=durable,
            durable_client_timeout_s=control.durable_client_timeout_s,
            now_ms=now,
        )
        if result.state == "REFUSED":
            kind = DuplicateDurableClientError if durable else DuplicateClientError
            error = kind(
                f"{'durable ' if durable else ''}client {client_id!r} is already connected "
                f"(connection {result.live_connection_id}, last heard from "
                f"{now - (result.live_last_seen_ms or now)} ms ago)"
            )
            log.warning("refused a second connection %s: %s", connection_id, error)
            self._outbox.reply(
                Reply(
                    request_id=control.request_id,
                    bucket=-1,
                    ok=False,
                    error_type=type(error).__name__,
                    error_message=str(error),
                ),
                client_id,
            )
            return
        self.records[client_id] = ClientRecord(
            durable, connection_id, True, now, control.durable_client_timeout_s
        )
        log.info("client %s connected (%s, %s)", client_id, connection_id, result.state)
        self._outbox.reply(
            Reply(
                request_id=control.request_id,
                bucket=-1,
                ok=True,
                client_state=result.state,
                subscription_conflation=self._settings.enable_subscription_conflation,
            ),
            client_id,
        )

    def _ping(self, control: Control) -> None:
        record = self.records.get(control.client_id)
        current = (
            record is not None
            and record.connected
            and (control.connection_id is None or record.connection_id == control.connection_id)
        )
        if current:
            assert record is not None
            record.last_seen_ms = now_ms()
            self.clients.save(control.client_id, record)
        if control.request_id:
            state = None
            if not current:
                taken = record is not None and record.connected and self._live(record)
                state = CLIENT_TAKEN if taken else CLIENT_UNKNOWN
            self._outbox.reply(
                Reply(request_id=control.request_id, bucket=-1, ok=True, client_state=state),
                control.client_id,
            )

    def _live(self, record: ClientRecord) -> bool:
        return now_ms() - record.last_seen_ms <= self._settings.maximum_time_between_pings_ms

    def _close(self, control: Control) -> None:
        client_id = control.client_id
        record = self.records.get(client_id)
        if record is None or (
            control.connection_id is not None and record.connection_id != control.connection_id
        ):
            return
        # The client has already had every bucket drop its interest (DISCONNECT).
        if record.durable and control.keep_alive:
            self._disconnect_durable(client_id, record, now_ms())
        else:
            self.forget(client_id)
        log.info("client %s closed (keep_alive=%s)", client_id, control.keep_alive)

    # --- disconnecting -----------------------------------------------------------------

    def disconnect(self, op: Operation, bucket: int) -> None:
        """A DISCONNECT operation in a bucket: drop the client's interest and continuous
        queries there (all of them, or all but the durable ones with ``keep_alive``), note
        that this bucket did, and reply when the client asked.

        Raises:
            TransportError: Redis failed.
        """
        self._registry.drop_client(op.client_id, keep_durable=op.keep_alive)
        self._cqs.drop_client(op.client_id, keep_durable=op.keep_alive)
        if not op.keep_alive:
            self.clients.mark_dropped(op.client_id, bucket)
        if op.request_id:
            self._outbox.reply(
                Reply(request_id=op.request_id, bucket=bucket, ok=True), op.client_id
            )

    def disconnect_unresponsive(self, client_id: str) -> None:
        """Disconnect a client whose queue stayed full (the operator's choice), and stop
        routing to it here at once: the DISCONNECTs wait behind every bucket's backlog, and
        what is routed meanwhile would fill a new count to the limit."""
        self._disconnect_everywhere(client_id, keep_alive=False)
        self._registry.drop_client(client_id)
        self._cqs.drop_client(client_id)
        self._depths.forget(client_id)
        self.clients.remove(client_id)
        self.records.pop(client_id, None)

    def _disconnect_everywhere(self, client_id: str, *, keep_alive: bool) -> None:
        """Have every bucket's primary drop a client's interest (all, or all but the durable
        registrations), in the order of each bucket's operations."""
        op = Operation(
            request_id=0,
            client_id=client_id,
            kind=OperationKind.DISCONNECT,
            region="",
            timestamp_ms=now_ms(),
            keep_alive=keep_alive,
        )
        value = encode(op)
        for bucket in range(self._settings.total_buckets):
            headers = None
            if self._security is not None:
                headers = self._security.server_headers(self._topics.ops, bucket, value)
            self._outbox.produce(self._topics.ops, value, None, partition=bucket, headers=headers)

    def _disconnect_durable(self, client_id: str, record: ClientRecord, at_ms: int) -> None:
        """Keep a durable client's queue and durable interest; start its timeout clock."""
        record.connected = False
        record.disconnected_at_ms = at_ms
        self.clients.save(client_id, record)

    def forget(self, client_id: str) -> None:
        """Forget a client everywhere on this server and in Redis."""
        self._depths.forget(client_id)
        self._stats.events_routed_by_client.pop(client_id, None)
        self.records.pop(client_id, None)
        self._outbox.forget_client(client_id)
        self.clients.remove(client_id)
        if self._security is not None:
            self._security.forget_client(client_id)

    # --- silence and the reaper --------------------------------------------------------

    def expire_silent(self) -> None:
        """Treat a client silent for ``maximum_time_between_pings_ms`` as gone: drop a
        non-durable one; keep a durable one's queue and durable interest (seed 001:
        abnormal disconnect) until its timeout."""
        now = now_ms()
        limit_ms = self._settings.maximum_time_between_pings_ms
        for client_id, record in list(self.records.items()):
            if not record.connected or now - record.last_seen_ms <= limit_ms:
                continue
            log.warning(
                "client %s sent nothing for more than %d ms: %s",
                client_id,
                limit_ms,
                "keeping its queue and durable interest" if record.durable else "dropping it",
            )
            self._disconnect_everywhere(client_id, keep_alive=record.durable)
            if record.durable:
                self._disconnect_durable(client_id, record, record.last_seen_ms)
            else:
                self.forget(client_id)

    def reap(self, admin: AdminClient) -> None:
        """As the reaper (a singleton role), unregister durable clients away too long: first
        every bucket's primary drops their interest (a DISCONNECT in each bucket), then,
        once all have, their topics and offsets are deleted."""
        if self._reaper.try_acquire() is None:
            return
        now = now_ms()
        for client_id, record in self.clients.all().items():
            if record.expired(now):
                self._start_unregistering(client_id, record)
            elif record.reaping:
                self._finish_unregistering(client_id, admin)

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
        self.records.pop(client_id, None)
        self.clients.clear_dropped(client_id)
        self._disconnect_everywhere(client_id, keep_alive=False)

    def _finish_unregistering(self, client_id: str, admin: AdminClient) -> None:
        if self.clients.dropped_buckets(client_id) < self._settings.total_buckets:
            return
        # What is still on its way to the client's topics goes first; then they go.
        self._outbox.flush(10)
        topics = [self._topics.queue(client_id), self._topics.reply(client_id)]
        for future in admin.delete_topics(topics, operation_timeout=10).values():
            try:
                future.result(timeout=_ADMIN_TIMEOUT_S)
            except KafkaException as exc:
                log.warning("deleting the topics of %s: %s", client_id, exc)
        groups = [self._topics.client_group(client_id), self._topics.client_reply_group(client_id)]
        for future in admin.delete_consumer_groups(groups, request_timeout=10).values():
            try:
                future.result(timeout=_ADMIN_TIMEOUT_S)
            except KafkaException as exc:
                log.info("deleting the offsets of %s: %s", client_id, exc)
        self.forget(client_id)
        self.clients.clear_dropped(client_id)
        log.warning("durable client %s unregistered", client_id)


__all__ = ["ClientLifecycle"]
