"""``ClientCache``: a client's connection to the cache servers of one namespace."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterable
from typing import Any

from clients.pool import Pool
from clients.region import Region, RegionShortcut
from clients.settings import ClientSettings
from clients.subscription import SubscriptionQueue, SubscriptionStats
from schemas.callbacks import CacheListener, CacheWriter
from schemas.errors import ConfigurationError, RegionBusError, UnconnectedError
from schemas.messages import Control, ControlKind, Event, Marker
from schemas.serializers import JsonSerializer, Serializer

log = logging.getLogger("regionbus.client")


def _generated_client_id() -> str:
    host = "".join(c if c.isalnum() or c in "-." else "-" for c in socket.gethostname())[:30]
    return f"c-{host}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


class ClientCache:
    """A client cache: regions kept current by events the servers push (Geode ``ClientCache``).

    Connects at construction: creates the client's subscription queue and reply topics,
    starts reading them, and announces itself to the servers.

    Args:
        settings: Client settings; when None they are read from the environment.
        **overrides: Settings fields to override, e.g. ``namespace="geode.site1"``,
            ``kafka_bootstrap_servers="127.0.0.1:9092"``.

    Raises:
        ConfigurationError: settings are invalid.
        TransportError: Kafka cannot be reached, or no server of the namespace created its
            topics within ``metadata_timeout_s``.

    Example:
        >>> cache = ClientCache(namespace="demo", kafka_bootstrap_servers="127.0.0.1:9092")
        >>> flights = cache.create_region("flights")
        >>> flights.register_interest_regex("UA-.*")
        >>> flights.put("UA-1545-EWR-2013-01-01", {"dep_delay": 2})
    """

    def __init__(self, settings: ClientSettings | None = None, **overrides: Any) -> None:
        base = settings or ClientSettings()
        self.settings = base.model_copy(update=overrides) if overrides else base
        if overrides:
            self.settings = ClientSettings.model_validate(self.settings.model_dump())
        durable_id = self.settings.durable_client_id
        self.client_id = durable_id or self.settings.client_id or _generated_client_id()
        self.member_id = (
            f"{self.client_id}.{uuid.uuid4().hex[:6]}" if durable_id else self.client_id
        )
        self.durable = durable_id is not None
        self._regions: dict[str, Region] = {}
        self._regions_lock = threading.Lock()
        self._closed = False
        self.pool = Pool(self.settings, self.client_id, self.member_id)
        self.total_buckets = self.pool.total_buckets
        self.subscription: SubscriptionQueue | None = None
        if self.settings.subscription_enabled:
            self.subscription = SubscriptionQueue(
                self.settings, self.client_id, self._on_event, self._on_marker
            )
        self._stop_ping = threading.Event()
        self._send_control(ControlKind.CONNECT)
        self._ping_thread = threading.Thread(
            target=self._ping, name=f"ping-{self.client_id}", daemon=True
        )
        self._ping_thread.start()

    # --- regions -----------------------------------------------------------------------

    def create_region(
        self,
        name: str,
        shortcut: RegionShortcut = RegionShortcut.CACHING_PROXY,
        *,
        listeners: Iterable[CacheListener] = (),
        writer: CacheWriter | None = None,
        serializer: Serializer | None = None,
    ) -> Region:
        """Create the client side of a server region.

        Args:
            name: Region name (must be defined on the servers for operations to succeed).
            shortcut: ``CACHING_PROXY`` (local copy, default) or ``PROXY`` (none).
            listeners: ``CacheListener``s, called in order.
            writer: A ``CacheWriter`` that may abort this client's changes.
            serializer: Value serializer (default JSON).

        Returns:
            The region.

        Raises:
            ConfigurationError: a region of that name already exists in this cache.
            UnconnectedError: the cache is closed.
        """
        self._check_open()
        with self._regions_lock:
            if name in self._regions:
                raise ConfigurationError(f"region {name!r} already exists in this client cache")
            region = Region(self, name, shortcut, serializer or JsonSerializer(), listeners, writer)
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

    # --- subscription ------------------------------------------------------------------

    def require_subscription(self) -> None:
        """Raise unless this cache has a subscription queue (interest needs one).

        Raises:
            UnconnectedError: closed, or ``subscription_enabled`` is False.
        """
        self._check_open()
        if self.subscription is None:
            raise UnconnectedError("subscription_enabled is False: this client has no queue")

    def _on_event(self, event: Event) -> None:
        region = self.get_region(event.region)
        if region is not None:
            region.on_event(event)

    def _on_marker(self, marker: Marker) -> None:
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

    def _send_control(self, kind: ControlKind, keep_alive: bool = False) -> None:
        self.pool.send_control(
            Control(
                kind=kind,
                client_id=self.client_id,
                timestamp_ms=int(time.time() * 1000),
                durable_client_id=self.settings.durable_client_id,
                durable_client_timeout_s=self.settings.durable_client_timeout_s,
                keep_alive=keep_alive,
            )
        )

    def _ping(self) -> None:
        interval_s = self.settings.ping_interval_ms / 1000
        while not self._stop_ping.wait(interval_s):
            try:
                self._send_control(ControlKind.PING)
            except RegionBusError as exc:
                log.warning("ping failed: %s", exc)

    def _check_open(self) -> None:
        if self._closed:
            raise UnconnectedError("the client cache is closed")

    def close(self, keep_alive: bool = False) -> None:
        """Disconnect from the servers.

        Args:
            keep_alive: For a durable client, keep its queue and durable interest on the
                servers for ``durable_client_timeout_s`` (SPEC §5). A non-durable client's
                queue and interest are always removed.
        """
        if self._closed:
            return
        self._closed = True
        self._stop_ping.set()
        try:
            self._send_control(ControlKind.CLOSE, keep_alive=keep_alive)
        except RegionBusError as exc:
            log.warning("close message not delivered: %s", exc)
        if self.subscription is not None:
            self.subscription.close()
        self.pool.close(delete_topics=not (self.durable and keep_alive))

    def __enter__(self) -> ClientCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed
