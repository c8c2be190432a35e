"""A client cache's connection to the cache servers: the connect handshake, the pings that
keep the client live on the servers, the per-bucket requests of its lifecycle (ready for
events, disconnect) and its goodbye.

The region container (:class:`regionbus.clients.cache.ClientCache`) owns one and hears
from it only through two callbacks: the servers forgot this client (re-initialise), and
the servers stopped or started answering (the CQs' status listeners).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout
from typing import NamedTuple

from regionbus.clients.pool import Pool
from regionbus.clients.resend import CONNECT_RESEND_CAP_S, CONNECT_RESEND_FIRST_S, full_jitter_s
from regionbus.clients.settings import ClientSettings
from regionbus.schemas.entry_checks import MAX_VALUE_SIZE_BYTES
from regionbus.schemas.errors import RegionBusError, ServerTimeoutError, error_from_wire
from regionbus.schemas.messages import (
    CLIENT_NEW,
    CLIENT_TAKEN,
    CLIENT_UNKNOWN,
    Control,
    ControlKind,
    Operation,
    OperationKind,
)

log = logging.getLogger("regionbus.client")

CLOSE_CHECK_MS = 2_000
"""Longest wait at close for the servers to confirm this connection still holds its id."""

DISCONNECT_WAIT_MS = 5_000
"""Longest wait at close for every bucket to confirm the disconnect: closing stays quick
when no server answers any more."""


class ConnectAnswer(NamedTuple):
    """What the servers answered a connect.

    Attributes:
        client_state: ``NEW`` or ``RECONNECTED`` (a durable client whose queue and
            registrations the servers kept).
        conflate: Whether this client's queue is conflated (its
            ``subscription_conflation`` setting; ``"server"`` takes the servers').
        max_value_size_bytes: The largest value the servers take, at most what one
            message carries.
    """

    client_state: str
    conflate: bool
    max_value_size_bytes: int


class ServerConnection:
    """The connection of one client cache (one client id, one process) to the servers.

    Args:
        settings: The client's settings (``read_timeout_ms``, ``ping_interval_ms``,
            ``durable_client_id``, ``durable_client_timeout_s``, ...).
        client_id: The client (or durable client) id.
        member_id: This connection's id: the client id and a random suffix, so the
            servers tell two processes of one client id apart.

    Raises:
        TransportError: Kafka cannot be reached, or the namespace's topics are missing
            (the pool's).
    """

    def __init__(self, settings: ClientSettings, client_id: str, member_id: str) -> None:
        self.settings = settings
        self.client_id = client_id
        self.member_id = member_id
        self.pool = Pool(settings, client_id, member_id)
        self.total_buckets = self.pool.total_buckets
        self.id_taken = False
        """Another live connection took this client id while this one was silent: this one
        neither reconnects nor, when closed, disconnects or deletes anything."""
        self._servers_answer = True
        self._stop_ping = threading.Event()
        self._ping_thread: threading.Thread | None = None

    @property
    def _timeout_s(self) -> float:
        return self.settings.read_timeout_ms / 1000

    # --- connecting --------------------------------------------------------------------

    def connect(self) -> ConnectAnswer:
        """CONNECT and wait for the answer, sending the same CONNECT again after a random
        wait while none comes (:func:`regionbus.clients.resend.full_jitter_s`; the servers
        answer a repeated connect alike, and a server that admits connects at a bounded
        rate may drop the oldest of too many waiting).

        Raises:
            ServerTimeoutError: no server answered within ``read_timeout_ms``.
            RegionBusError: the servers refused the connection (the error they named, e.g.
                :class:`DuplicateClientError`).
        """
        control = self.control(ControlKind.CONNECT, request_id=self.pool.next_request_id())
        future = self.pool.request_control(control, first=True)
        deadline_s = time.monotonic() + self._timeout_s
        attempt = 0
        while True:
            wait_s = full_jitter_s(attempt, CONNECT_RESEND_FIRST_S, CONNECT_RESEND_CAP_S)
            left_s = deadline_s - time.monotonic()
            try:
                reply = future.result(max(0.0, min(wait_s, left_s)))[0]
                break
            except FutureTimeout as exc:
                if left_s <= wait_s:
                    self.pool.forget(control.request_id)
                    raise ServerTimeoutError(
                        f"no cache server of namespace {self.settings.namespace!r} answered "
                        f"the connection within {self.settings.read_timeout_ms} ms"
                    ) from exc
            attempt += 1
            self._resend(control)
        if not reply.ok:
            raise error_from_wire(reply.error_type, reply.error_message)
        chosen = self.settings.subscription_conflation
        size = MAX_VALUE_SIZE_BYTES
        if reply.max_value_size_bytes > 0:
            size = min(reply.max_value_size_bytes, MAX_VALUE_SIZE_BYTES)
        return ConnectAnswer(
            reply.client_state or CLIENT_NEW,
            reply.subscription_conflation if chosen == "server" else chosen == "true",
            size,
        )

    def _resend(self, control: Control) -> None:
        """Send an unanswered CONNECT again; a failed send is logged (the wait goes on)."""
        try:
            self.pool.send_control(control)
        except RegionBusError as exc:
            log.warning("connect of %s not sent again: %s", self.client_id, exc)

    def control(
        self, kind: ControlKind, *, keep_alive: bool = False, request_id: int = 0
    ) -> Control:
        """A control message of this connection (connect, ping or close)."""
        return Control(
            kind=kind,
            client_id=self.client_id,
            timestamp_ms=int(time.time() * 1000),
            durable_client_id=self.settings.durable_client_id,
            durable_client_timeout_s=self.settings.durable_client_timeout_s,
            keep_alive=keep_alive,
            request_id=request_id,
            connection_id=self.member_id,
            kafka_principal=self.pool.kafka_principal,
        )

    # --- liveness ----------------------------------------------------------------------

    def start_pings(
        self, *, on_unknown: Callable[[], None], on_answering: Callable[[bool], None]
    ) -> None:
        """Ping the servers every ``ping_interval_ms`` on a thread of its own, so they keep
        this client (Geode ``ClientHealthMonitor``).

        Args:
            on_unknown: Called (on the ping thread) when the servers no longer know this
                client: it was silent past their limit, or a durable client past its
                timeout. The cache connects again and re-initialises.
            on_answering: Called with False when a ping fails after answers, True when one
                is answered after failures.
        """
        self._ping_thread = threading.Thread(
            target=self._ping,
            args=(on_unknown, on_answering),
            name=f"ping-{self.client_id}",
            daemon=True,
        )
        self._ping_thread.start()

    def stop_pings(self) -> None:
        """Stop pinging (at close; a ping under way ends on its own)."""
        self._stop_ping.set()

    def _ping(self, on_unknown: Callable[[], None], on_answering: Callable[[bool], None]) -> None:
        interval_s = self.settings.ping_interval_ms / 1000
        while not self._stop_ping.wait(interval_s):
            try:
                control = self.control(ControlKind.PING, request_id=self.pool.next_request_id())
                future = self.pool.request_control(control)
                try:
                    reply = future.result(self._timeout_s)[0]
                except FutureTimeout:
                    self.pool.forget(control.request_id)
                    raise ServerTimeoutError(
                        f"no server answered a ping within {self.settings.read_timeout_ms} ms"
                    ) from None
                if reply.client_state == CLIENT_TAKEN:
                    self._lost_id()
                elif reply.client_state == CLIENT_UNKNOWN and not self._stop_ping.is_set():
                    on_unknown()
                self._answering(True, on_answering)
            except RegionBusError as exc:
                if self._stop_ping.is_set():
                    continue
                self._answering(False, on_answering)
                # A Kafka outage was logged once as such; its failed pings add nothing.
                outage = self.pool.kafka_outage.ongoing
                log.log(logging.DEBUG if outage else logging.WARNING, "ping failed: %s", exc)

    def _answering(self, answering: bool, on_answering: Callable[[bool], None]) -> None:
        if answering != self._servers_answer:
            self._servers_answer = answering
            on_answering(answering)

    def _lost_id(self) -> None:
        if not self.id_taken:
            log.error(
                "client id %s was taken by another live connection while this one was "
                "silent: this client cache no longer receives events; close it",
                self.client_id,
            )
        self.id_taken = True

    def holds_id(self) -> bool | None:
        """Ask the servers whether this connection still holds the client id: True, False
        (another live connection took it), or None when no server answered within
        :data:`CLOSE_CHECK_MS` (``read_timeout_ms`` if shorter). Never raises."""
        control = self.control(ControlKind.PING, request_id=self.pool.next_request_id())
        try:
            future = self.pool.request_control(control)
            reply = future.result(min(self.settings.read_timeout_ms, CLOSE_CHECK_MS) / 1000)[0]
        except (FutureTimeout, RegionBusError):
            self.pool.forget(control.request_id)
            return None
        if reply.client_state == CLIENT_TAKEN:
            self._lost_id()
            return False
        return True

    # --- per-bucket requests -----------------------------------------------------------

    def _every_bucket(
        self, kind: OperationKind, *, event_ids: bool = False, keep_alive: bool = False
    ) -> tuple[int, list[tuple[Operation, int]]]:
        """One operation of ``kind`` per bucket, under one request id."""
        request_id = self.pool.next_request_id()
        return request_id, [
            (
                Operation(
                    request_id=request_id,
                    client_id=self.client_id,
                    kind=kind,
                    region="",
                    timestamp_ms=int(time.time() * 1000),
                    event_id=self.pool.next_event_id(bucket) if event_ids else None,
                    keep_alive=keep_alive,
                    kafka_principal=self.pool.kafka_principal,
                ),
                bucket,
            )
            for bucket in range(self.total_buckets)
        ]

    def ready_for_events(self) -> None:
        """Tell every bucket's primary this durable client is ready (each writes a marker
        into its queue), and wait for all.

        Raises:
            ServerTimeoutError: not every bucket answered within ``read_timeout_ms``.
            RegionBusError: a bucket refused it.
        """
        request_id, ops = self._every_bucket(OperationKind.READY_FOR_EVENTS, event_ids=True)
        future = self.pool.request(ops)
        try:
            future.result(self._timeout_s)
        except FutureTimeout as exc:
            self.pool.forget(request_id)
            raise ServerTimeoutError(
                f"ready_for_events: not every bucket answered within "
                f"{self.settings.read_timeout_ms} ms"
            ) from exc

    def disconnect_buckets(self, keep_alive: bool, *, wait: bool = True) -> None:
        """Have every bucket's primary drop this client's interest (all but the durable
        registrations when ``keep_alive``) and wait for all (at most
        :data:`DISCONNECT_WAIT_MS`), so no event is routed to the queue once this returns
        and the acks can go. Without ``wait`` (no server answered just now) they are sent
        for a later primary to process. Never raises: a bucket that did not confirm is
        logged."""
        request_id, ops = self._every_bucket(OperationKind.DISCONNECT, keep_alive=keep_alive)
        try:
            future = self.pool.request(ops)
            if not wait:
                self.pool.forget(request_id)
                return
            future.result(min(self.settings.read_timeout_ms, DISCONNECT_WAIT_MS) / 1000)
        except (FutureTimeout, RegionBusError) as exc:
            self.pool.forget(request_id)
            log.warning("not every bucket confirmed the disconnect: %r", exc)

    def say_goodbye(self, keep_alive: bool) -> None:
        """Send CLOSE (a durable client's ``keep_alive`` keeps its queue on the servers for
        ``durable_client_timeout_s``). Never raises: an undelivered goodbye is logged, and
        the servers forget a silent client anyway."""
        try:
            self.pool.send_control(self.control(ControlKind.CLOSE, keep_alive=keep_alive))
        except RegionBusError as exc:
            log.warning("close message not delivered: %s", exc)


__all__ = ["CLOSE_CHECK_MS", "DISCONNECT_WAIT_MS", "ConnectAnswer", "ServerConnection"]
