"""``ClientCache``: a client cache, its regions kept current by the events the servers push.

Its connection to the servers (connect, pings, goodbye) is
:class:`regionbus.clients.connection.ServerConnection`.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

from regionbus.clients.client_metrics import ClientMetrics
from regionbus.clients.connection import ServerConnection
from regionbus.clients.interest import registered_keys
from regionbus.clients.query_service import QueryService
from regionbus.clients.queue_records import SubscriptionStats
from regionbus.clients.region import EvictionAttributes, Region, RegionShortcut
from regionbus.clients.settings import ClientSettings
from regionbus.clients.subscription import SubscriptionQueue
from regionbus.clients.tracking import MessageTracker
from regionbus.schemas.callbacks import CacheListener, CacheWriter
from regionbus.schemas.entry_checks import MAX_VALUE_SIZE_BYTES, check_region_name
from regionbus.schemas.errors import (
    ConfigurationError,
    UnconnectedError,
)
from regionbus.schemas.messages import (
    CLIENT_EVENTS_LOST,
    CLIENT_NEW,
    CLIENT_RECONNECTED,
    CqEvent,
    Event,
    InterestKind,
)
from regionbus.schemas.naming import generated_member_id
from regionbus.schemas.serializers import JsonSerializer, Serializer

log = logging.getLogger("regionbus.client")

T = TypeVar("T")


class _Background(Generic[T]):
    """One call run on a thread of its own, its result or exception taken later."""

    def __init__(self, call: Callable[[], T]) -> None:
        self._result: T | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(call,), daemon=True)
        self._thread.start()

    def _run(self, call: Callable[[], T]) -> None:
        try:
            self._result = call()
        except BaseException as exc:  # handed to the caller of result()
            self._error = exc

    def result(self) -> T:
        """The call's result, once it returned; or what it raised.

        Raises:
            BaseException: what the call raised.
        """
        self._thread.join()
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    def discard(self, close: Callable[[T], object]) -> None:
        """Wait for the call and close what it made, if anything (its error is dropped)."""
        self._thread.join()
        if self._result is not None:
            close(self._result)


class ClientCache:
    """A client cache: regions kept current by events the servers push (Geode ``ClientCache``).

    Connects at construction: finds its partition of the shared queue and reply topics of
    its Kafka principal (making them if it is the principal's first client), starts reading
    its replies, and announces itself to the servers.

    A **durable** client (``durable_client_id``, docs/behaviour.md §5) keeps its queue and durable
    interest on the servers while away, for ``durable_client_timeout_s``. Its queue is not
    read until :meth:`ready_for_events`; the events queued while it was away are then
    replayed to listeners without changing the cache, up to the marker, where every
    region's listeners get ``after_region_live``. :attr:`client_state` says whether the
    servers kept its registration (``RECONNECTED``) or treat it as new (``NEW``), or that
    they kept it but its queue lost records it had not read (``EVENTS_LOST``: the queue
    topic deleted them; :attr:`lost_queue_records` says how many, each of one or more
    events), and :attr:`pending_event_count` how many events wait in its queue.

    Args:
        settings: Client settings; when None they are read from the environment.
        **overrides: Settings fields to override, e.g. ``namespace="geode.site1"``,
            ``kafka_bootstrap_servers="127.0.0.1:9092"``.

    Raises:
        ConfigurationError: settings are invalid.
        DuplicateClientError: another live process uses this client id (durable or not;
            :class:`DuplicateDurableClientError` for a durable one).
        ServerTimeoutError: no server answered the connection within ``read_timeout_ms``.
        TransportError: Kafka cannot be reached, or no server of the namespace created its
            topics within ``read_timeout_ms`` (``metadata_timeout_s`` if shorter); the
            message names the address or namespace and how to fix it.

    Example:
        >>> cache = ClientCache(namespace="demo", kafka_bootstrap_servers="127.0.0.1:9092")
        >>> flights = cache.create_region("flights")
        >>> flights.register_interest_regex("UA-.*")
        >>> flights.put("UA-1545-EWR-2013-01-01", {"dep_delay": 2})
    """

    def __init__(self, settings: ClientSettings | None = None, **overrides: Any) -> None:
        if settings is None:
            self.settings = ClientSettings(**overrides)
        elif overrides:
            self.settings = ClientSettings.model_validate(
                settings.model_copy(update=overrides).model_dump()
            )
        else:
            self.settings = settings
        durable_id = self.settings.durable_client_id
        self.client_id = durable_id or self.settings.client_id or generated_member_id("c")
        # One id per connection, so the servers can tell two processes of one client id
        # apart (the second is refused) and EventIDs of a restarted process are new.
        self.member_id = f"{self.client_id}.{uuid.uuid4().hex[:6]}"

        self.durable = durable_id is not None
        self._regions: dict[str, Region] = {}
        self._regions_lock = threading.Lock()
        self._closed = False
        self._ready = False
        self._conflate = False
        self.client_state = CLIENT_NEW
        self.pending_event_count = 0
        self.lost_queue_records = 0
        """Of a durable client that reconnected: queue records deleted before it read them
        (``client_state`` is then ``EVENTS_LOST``); 0 otherwise."""
        self.max_value_size_bytes = MAX_VALUE_SIZE_BYTES
        """The largest value the servers take: their ``max_value_size_bytes``, as they
        said when this client connected, and at most what one message carries."""
        self._query_service = QueryService(self, self)
        self.connection = ServerConnection(self.settings, self.client_id, self.member_id)
        self.pool = self.connection.pool
        self.total_buckets = self.connection.total_buckets
        self.subscription: SubscriptionQueue | None = None
        self._metrics = (
            ClientMetrics(self, self.settings, self.pool.kafka_outage)
            if self.settings.metrics_port is not None
            else None
        )
        self._ready_at_s = 0.0
        # The queue's reader is made while the servers answer the connection (its own
        # round trips to Kafka need nothing from that answer).
        reader = _Background(self._open_queue) if self.settings.subscription_enabled else None
        try:
            self.client_state = self._connect()
            self.subscription = reader.result() if reader is not None else None
        except BaseException:
            # Refused or unanswered: the acks may belong to a live process of this id.
            self._closed = True
            if reader is not None:
                reader.discard(lambda queue: queue.close())
            self.pool.close(delete_acks=False)
            raise
        if self.subscription is not None:
            self.subscription.conflate = self._conflate
            if self.durable:
                self.pending_event_count = self.subscription.count_pending(
                    self.settings.read_timeout_ms / 1000
                )
                self.lost_queue_records = self.subscription.lost_records
            else:
                self.subscription.start()
        if self.client_state == CLIENT_RECONNECTED and self.lost_queue_records:
            self.client_state = CLIENT_EVENTS_LOST
            log.warning(
                "durable client %s reconnected, but %d records of its queue were deleted "
                "before it read them (the queue topic's retention): %d events pending",
                self.client_id,
                self.lost_queue_records,
                self.pending_event_count,
            )
        elif self.client_state == CLIENT_RECONNECTED:
            log.info(
                "durable client %s reconnected: %d events pending",
                self.client_id,
                self.pending_event_count,
            )
        elif self.durable:
            log.info("durable client %s connected as a new client", self.client_id)
        self.connection.start_pings(
            on_unknown=self._reinitialize, on_answering=self._query_service.connection_changed
        )
        # Connected: the admin client is needed again only to re-initialise or to close.
        self.pool.client_topics.release()
        if self._metrics is not None:
            try:
                self._metrics.endpoint.start()
            except ConfigurationError:
                self.close()
                raise

    @property
    def metrics_url(self) -> str | None:
        """``http://127.0.0.1:<port>/metrics`` of this client's endpoint while it serves
        (``metrics_port`` set, cache open), else None."""
        return self._metrics.endpoint.url if self._metrics is not None else None

    def _connect(self) -> str:
        """Connect (:meth:`ServerConnection.connect`) and keep what the servers said;
        returns ``NEW`` or ``RECONNECTED``."""
        answer = self.connection.connect()
        self._conflate = answer.conflate
        self.max_value_size_bytes = answer.max_value_size_bytes
        return answer.client_state

    def _open_queue(self) -> SubscriptionQueue:
        """The reader of this client's queue, from its last ack or, never acked, from where
        the queue partition ends now (before the servers know the client)."""
        return self._new_subscription(replaying=self.durable, start=self.pool.queue_end())

    def _new_subscription(
        self,
        *,
        replaying: bool,
        start: int,
        tracker: MessageTracker | None = None,
        cq_tracker: MessageTracker | None = None,
    ) -> SubscriptionQueue:
        return SubscriptionQueue(
            self.settings,
            self.client_id,
            self.pool.address,
            start,
            self._on_event if self._metrics is None else self._on_event_timed,
            self._on_live,
            on_cq_event=self._on_cq_event,
            replaying=replaying,
            connection_id=self.member_id,
            total_buckets=self.total_buckets,
            tracker=tracker,
            cq_tracker=cq_tracker,
            conflate=self._conflate,
            kafka_outage=self.pool.kafka_outage,
            signer=self.pool.signer,
            end_of_queue=self.pool.queue_end,
            start_of_queue=self.pool.queue_start,
            tracing=self.pool.tracing,
        )

    def ready_for_events(self) -> None:
        """Tell the servers this durable client is ready: its regions, listeners and
        interest are set up (Geode ``ClientCache.readyForEvents``).

        Every bucket's server writes a marker into the queue; reading starts; the events
        before the markers are replayed to listeners without changing the cache; then
        every region's listeners get ``after_region_live`` once. A second call does nothing.

        Raises:
            ConfigurationError: this client is not durable (Geode: only durable clients
                call ``readyForEvents``).
            ServerTimeoutError: not every bucket answered within ``read_timeout_ms``.
            UnconnectedError: the cache is closed, or has no subscription queue.
        """
        if not self.durable:
            raise ConfigurationError(
                "ready_for_events is for durable clients: set durable_client_id"
            )
        self.require_subscription()
        if self._ready:
            return
        self._ready_at_s = time.monotonic()
        self.connection.ready_for_events()
        self._ready = True
        assert self.subscription is not None
        self.subscription.start()

    @property
    def replaying(self) -> bool:
        """True while a durable client's queue is still before its markers."""
        return self.subscription is not None and self.subscription.replaying

    # --- regions -----------------------------------------------------------------------

    def create_region(
        self,
        name: str,
        shortcut: RegionShortcut = RegionShortcut.CACHING_PROXY,
        *,
        listeners: Iterable[CacheListener] = (),
        writer: CacheWriter | None = None,
        serializer: Serializer | None = None,
        eviction: EvictionAttributes | None = None,
    ) -> Region:
        """Create the client side of a server region.

        Args:
            name: Region name (must be defined on the servers for operations to succeed).
            shortcut: ``CACHING_PROXY`` (local copy, default) or ``PROXY`` (none).
            listeners: ``CacheListener``s, called in order.
            writer: A ``CacheWriter`` that may abort this client's changes.
            serializer: Value serializer (default JSON).
            eviction: Bound the local cache, LRU by entry count or memory size
                (``CACHING_PROXY``); None keeps every entry (Geode's default: no
                eviction).

        Returns:
            The region.

        Raises:
            InvalidRegionNameError: the name breaks Geode's rule (1-120 characters of
                ``[A-Za-z0-9._-]``, no leading ``__``; `regionbus.schemas.entry_checks`).
            ConfigurationError: a region of that name already exists in this cache.
            UnconnectedError: the cache is closed.
        """
        check_region_name(name)
        self._check_open()
        with self._regions_lock:
            if name in self._regions:
                raise ConfigurationError(f"region {name!r} already exists in this client cache")
            region = Region(
                self, name, shortcut, serializer or JsonSerializer(), listeners, writer, eviction
            )
            self._regions[name] = region
        return region

    def get_region(self, name: str) -> Region | None:
        """The region of that name, or None."""
        with self._regions_lock:
            return self._regions.get(name)

    def forget_region(self, name: str) -> None:
        """Remove a destroyed region from this cache (called by the region)."""
        with self._regions_lock:
            self._regions.pop(name, None)

    @property
    def regions(self) -> list[Region]:
        """Every region of this cache."""
        with self._regions_lock:
            return list(self._regions.values())

    def region_serializer(self, name: str) -> Serializer | None:
        """The serializer of this cache's region of that name, None when there is none."""
        region = self._regions.get(name)
        return None if region is None else region.serializer

    # --- queries -----------------------------------------------------------------------

    def query_service(self) -> QueryService:
        """The queries of this cache (Geode ``ClientCache.getQueryService``): one-shot
        ``new_query`` and continuous ``new_cq``, ``get_cqs``, ``execute_cqs``,
        ``stop_cqs``, ``close_cqs``, ``get_all_durable_cqs_from_server`` (docs/behaviour.md §9)."""
        return self._query_service

    # --- subscription ------------------------------------------------------------------

    def require_subscription(self) -> None:
        """Raise unless this cache has a subscription queue (interest needs one).

        Raises:
            UnconnectedError: closed, or ``subscription_enabled`` is False.
        """
        self._check_open()
        if self.subscription is None:
            raise UnconnectedError("subscription_enabled is False: this client has no queue")

    def key_registrations(self) -> int:
        """How many keys this cache holds registered, over all its regions (at most
        `regionbus.schemas.limits.MAX_KEYS_PER_CLIENT`)."""
        return sum(len(registered_keys(r.interest)) for r in self.regions)

    def regex_registrations(self) -> int:
        """How many regex registrations this cache holds, over all its regions (at most
        `regionbus.schemas.limits.MAX_REGEXES_PER_CLIENT`)."""
        return sum(
            1 for r in self.regions for spec in r.interest if spec.kind is InterestKind.REGEX
        )

    def _on_event(self, event: Event, replay: bool) -> None:
        # Once per event: a dict read is atomic under the GIL, so no lock (the lock keeps
        # the check-and-insert of create_region whole).
        region = self._regions.get(event.region)
        if region is not None:
            region.on_event(event, apply=not replay)

    def _on_event_timed(self, event: Event, replay: bool) -> None:
        """:meth:`_on_event`, timing put -> listener of live events (metrics endpoint on)."""
        region = self._regions.get(event.region)
        if region is None:
            return
        if not replay and self._metrics is not None:
            delay_s = time.time() - event.timestamp_ms / 1000
            self._metrics.put_to_listener.observe(max(0.0, delay_s))
        region.on_event(event, apply=not replay)

    def _on_cq_event(self, message: CqEvent) -> None:
        self._query_service.on_event(message)

    def _on_live(self) -> None:
        if self._metrics is not None and self._ready_at_s:
            self._metrics.replay.observe(time.monotonic() - self._ready_at_s)
        for region in self.regions:
            region.fire_region_live()

    @property
    def subscription_stats(self) -> SubscriptionStats:
        """Counters of the subscription queue (events delivered, duplicates dropped, ...)."""
        return self.subscription.stats if self.subscription else SubscriptionStats()

    def wait_for_quiet(self, idle_s: float = 0.5, timeout_s: float = 60.0) -> bool:
        """Wait until the subscription queue has had nothing new for ``idle_s`` seconds.

        For tests and demos; a live system has no "done".

        Returns:
            True when quiet within ``timeout_s`` seconds.
        """
        if self.subscription is None:
            return True
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            before = self.subscription.stats.events_received
            time.sleep(idle_s)
            if self.subscription.stats.events_received == before:
                return True
        return False

    # --- lifecycle ---------------------------------------------------------------------

    def _reinitialize(self) -> None:
        """The servers no longer know this client (it was silent past the ping limit, or
        a durable client past its timeout): connect again and, if the queue is gone,
        re-fetch every region's entries of interest without listener events (docs/behaviour.md
        §3)."""
        log.warning("client %s is unknown to the servers: re-initialising", self.client_id)
        queue_end = self.pool.queue_end()
        self.client_state = self._connect()
        if self.subscription is not None and self.client_state != CLIENT_RECONNECTED:
            # A queue the servers no longer keep for this client: start at its end.
            old = self.subscription
            old.close()
            self.subscription = self._new_subscription(
                replaying=False, start=queue_end, tracker=old.tracker, cq_tracker=old.cq_tracker
            )
            self.subscription.start()
        for region in self.regions:
            region.reinitialize()

    def _check_open(self) -> None:
        if self._closed:
            raise UnconnectedError("the client cache is closed")

    def close(self, keep_alive: bool = False) -> None:
        """Disconnect from the servers.

        Args:
            keep_alive: For a durable client, keep its queue and durable interest on the
                servers for ``durable_client_timeout_s`` (docs/behaviour.md §5); False removes
                them at once. A non-durable client's queue and interest are always removed.

        The cache stays readable afterwards (docs/behaviour.md §1: a disconnected client reads):
        local entries can be read; every update raises ``UnconnectedError``. Every CQ is
        closed here (its listeners' ``close`` runs); the servers keep a durable client's
        durable CQs with ``keep_alive``.
        """
        if self._closed:
            return
        self._closed = True
        if self._metrics is not None:
            self._metrics.endpoint.stop()
        self.connection.stop_pings()
        self._query_service.close_locally()
        keep = self.durable and keep_alive
        holds_id = False if self.connection.id_taken else self.connection.holds_id()
        if holds_id is False:
            # Disconnecting would drop the interest of the live connection that has this
            # client id now, and deleting would pull its acks from under it.
            if self.subscription is not None:
                self.subscription.close()
            self.pool.close(delete_acks=False)
            return
        if self.subscription is not None:
            self.subscription.close()
            self.connection.disconnect_buckets(keep, wait=holds_id is True)
        self.connection.say_goodbye(keep_alive)
        self.pool.close(delete_acks=not keep)

    def __enter__(self) -> ClientCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed
