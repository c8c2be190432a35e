"""The durable operations desk of the flights demo (docs/behaviour.md §5): a durable client that
goes away while days are published and comes back to have the queued events replayed.

It records every event's key, version and phase (:class:`regionbus.demo.flights_desks.DurableLog`)
for :mod:`regionbus.demo.flights_verify`: what replay delivered, what was applied live, and the
cache at the marker, which replay must have left as it was.
"""

from __future__ import annotations

import threading
import time

from regionbus.clients import (
    ClientCache,
    ClientSettings,
    EntryEvent,
    EventKind,
    Region,
    RegionEvent,
)
from regionbus.demo.flights_desks import (
    REGION,
    CountingListener,
    DeskError,
    DeskResult,
    DeskSpec,
    DurableLog,
    EventCounts,
    Phase,
    register_keys,
)


class _DurableListener(CountingListener):
    """Records the operations desk's events for one connection (on its queue thread).

    Replay is told apart by the cache's ``subscription_stats.replayed`` counter, which the
    queue thread raises just before it hands a replayed event to the region: every
    replayed event reaches listeners exactly once (docs/behaviour.md §5).
    """

    def __init__(
        self, log: DurableLog, counts: EventCounts, connection: int, applied_phase: Phase
    ) -> None:
        super().__init__()
        self.counts = counts
        self.log = log
        self.connection = connection
        self.applied_phase = applied_phase
        self.cache: ClientCache | None = None
        self.region: Region | None = None
        self.live = threading.Event()
        self._replayed = 0
        log.live_calls.append(0)

    def _record(self, event: EntryEvent) -> None:
        assert self.cache is not None
        replayed = self.cache.subscription_stats.replayed
        phase = Phase.REPLAY if replayed != self._replayed else self.applied_phase
        self._replayed = replayed
        self.log.events.append((event.key, event.version, phase))
        if phase is not Phase.REPLAY and not self.live.is_set():
            if event.kind in (EventKind.CREATE, EventKind.UPDATE):
                self.log.applied_before_live[event.key] = event.new_value
            elif event.kind is EventKind.INVALIDATE:
                self.log.applied_before_live[event.key] = None
            else:
                self.log.applied_before_live.pop(event.key, None)

    def after_create(self, event: EntryEvent) -> None:
        """Count and record a create."""
        super().after_create(event)
        self._record(event)

    def after_update(self, event: EntryEvent) -> None:
        """Count and record an update."""
        super().after_update(event)
        self._record(event)

    def after_invalidate(self, event: EntryEvent) -> None:
        """Count and record an invalidate."""
        super().after_invalidate(event)
        self._record(event)

    def after_destroy(self, event: EntryEvent) -> None:
        """Count and record a destroy."""
        super().after_destroy(event)
        self._record(event)

    def after_region_live(self, event: RegionEvent) -> None:
        """The marker: snapshot the cache, which replay must have left as it was."""
        assert self.region is not None
        self.log.live_calls[self.connection] += 1
        if not self.live.is_set():
            self.log.cache_at_live = self.region.local_entries()
        self.live.set()


class OperationsDesk:
    """The durable operations desk of a destination airport, in this process.

    Connects as durable client ``spec.durable_client_id``, registers durable interest in
    ``spec.keys``, calls ``ready_for_events`` and waits for its marker before returning, so
    every later change of its keys is applied live. A durable registration left by an
    earlier run in the namespace is dropped first (close without keep-alive, reconnect).

    Args:
        spec: An OPERATIONS spec with ``durable_client_id`` and ``keys``.
        settings: Client settings (namespace, Kafka).

    Raises:
        DeskError: its marker did not arrive within ``read_timeout_ms``.
        DuplicateDurableClientError: another live process uses the durable id.
        TransportError, RegionNotFoundError, ServerTimeoutError: as :class:`Desk`.
    """

    def __init__(self, spec: DeskSpec, settings: ClientSettings) -> None:
        assert spec.durable_client_id is not None
        self.spec = spec
        self._settings = settings.model_copy(update={"durable_client_id": spec.durable_client_id})
        self._wait_s = settings.read_timeout_ms / 1000
        self.log = DurableLog()
        self._counts = EventCounts()
        self._received_before = 0
        self._delivered_before = 0
        self._duplicates_before = 0
        self._reconnect: threading.Thread | None = None
        self._reconnect_error: BaseException | None = None
        self.cache = ClientCache(self._settings)
        if self.cache.client_state != "NEW":
            self.cache.close(keep_alive=False)
            self.cache = ClientCache(self._settings)
        try:
            self.listener = self._start(self.cache, Phase.CONNECTED, register=True)
        except BaseException:
            self.cache.close()
            raise

    def _start(self, cache: ClientCache, applied: Phase, *, register: bool) -> _DurableListener:
        """Create the region and listener of a connection, then get ready for events."""
        listener = _DurableListener(self.log, self._counts, len(self.log.live_calls), applied)
        listener.cache = cache
        listener.region = self.region = cache.create_region(REGION, listeners=[listener])
        self.log.client_state = cache.client_state
        self.log.pending_event_count = cache.pending_event_count
        self.log.cache_at_live = None
        self.log.applied_before_live = {}
        if register:
            register_keys(self.region, self.spec.keys, durable=True)
        cache.ready_for_events()
        if not listener.live.wait(self._wait_s):
            raise DeskError(f"{self.spec.name}: no marker within {self._wait_s} s")
        return listener

    def show_day(self, keys: tuple[str, ...]) -> None:
        """Ignored: only the dashboard shows days."""

    def day_published(self, number: int) -> None:
        """Close with keep-alive on day ``spec.away_at_day`` (before returning, so every
        later operation is queued while the desk is away); on day ``spec.back_at_day``
        start reconnecting on the desk's own thread and return at once."""
        if number == self.spec.away_at_day:
            stats = self.cache.subscription_stats
            self.cache.close(keep_alive=True)
            self._received_before += stats.events_received
            self._delivered_before += stats.events_delivered
            self._duplicates_before += stats.duplicates_dropped
        elif number == self.spec.back_at_day and self.cache.closed:
            self._reconnect = threading.Thread(
                target=self._come_back, name="operations-desk-reconnect", daemon=True
            )
            self._reconnect.start()

    def _come_back(self) -> None:
        """Reconnect under the same durable id; its durable interest was kept."""
        try:
            cache = ClientCache(self._settings)
            self.cache = cache
            self.log.away = True
            self.listener = self._start(cache, Phase.LIVE, register=False)
        except BaseException as exc:
            self._reconnect_error = exc

    def finish(self, expected_events: int | None, timeout_s: float) -> DeskResult:
        """Wait for the reconnection (if any), for ``expected_events`` listener calls over
        both connections and for a quiet queue, then report.

        Raises:
            DeskError: the reconnection failed, did not finish in time, or the desk is
                still away (the day to come back was never published).
        """
        deadline = time.monotonic() + timeout_s
        if self._reconnect is not None:
            self._reconnect.join(max(0.0, deadline - time.monotonic()))
            if self._reconnect.is_alive():
                raise DeskError(f"{self.spec.name}: reconnection did not finish in time")
            if self._reconnect_error is not None:
                raise DeskError(
                    f"{self.spec.name}: reconnection failed: {self._reconnect_error}"
                ) from self._reconnect_error
        if self.cache.closed:
            raise DeskError(f"{self.spec.name}: still away at the end of the replay")
        while expected_events is not None and len(self.log.events) < expected_events:
            if time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        remaining_s = max(1.0, deadline - time.monotonic())
        quiet = self.cache.wait_for_quiet(idle_s=0.5, timeout_s=remaining_s)
        stats = self.cache.subscription_stats
        return DeskResult(
            name=self.spec.name,
            events_received=self._received_before + stats.events_received,
            events_delivered=self._delivered_before + stats.events_delivered,
            duplicates_dropped=self._duplicates_before + stats.duplicates_dropped,
            counts=EventCounts(**vars(self._counts)),
            entries=self.region.local_entries(),
            quiet=quiet,
            durable=self.log,
        )

    def close(self) -> None:
        """Disconnect for good: the durable queue and interest are removed."""
        if self._reconnect is not None:
            self._reconnect.join(30)
        self.cache.close()


__all__ = ["OperationsDesk"]
