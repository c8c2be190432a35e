"""The subscribed clients of the flights demo: carrier desk, airport desk, dashboard.

Each desk is its own :class:`clients.ClientCache` with a ``CACHING_PROXY`` region
``flights`` and a counting :class:`CacheListener`:

- the **carrier desk** registers a regex on its carrier's keys (``"UA-.*"``);
- the **airport desk** registers the list of keys of every flight departing its airport;
- the **dashboard** is "today's board" with ``receive_values=False``: for each published
  day it registers that day's keys (policy ``KEYS``, so they load as invalid entries) and
  drops the previous day's registration. Per docs/behaviour.md §3 it then gets invalidates for the
  day's departures and arrivals and destroys for its cancellations;
- the **CQ desk** (:class:`regionbus.demo.flights_cq_desk.CqDesk`) holds no interest but
  continuous queries, each keeping a live result set (flights delayed over an hour);
- the **operations desk** (:class:`regionbus.demo.flights_operations_desk.OperationsDesk`) is a
  *durable client* (docs/behaviour.md §5) with durable interest in the keys of every flight arriving
  at one destination airport. When a given day is published it closes with
  ``keep_alive`` (its subscription queue and durable interest stay on the server); when a
  later day is published it reconnects on a thread of its own, as a new
  :class:`clients.ClientCache` with the same durable id and without registering again,
  and calls ``ready_for_events``: the events queued while it was away are replayed to its
  listener before the marker, then it is live again. It records every event's key,
  version and phase for :mod:`regionbus.demo.flights_verify`.

A desk runs in the caller's process (:class:`Desk`,
:class:`regionbus.demo.flights_operations_desk.OperationsDesk`; see
:func:`regionbus.demo.flights_desk_process.make_desk`) or in a child process of its own
(:class:`regionbus.demo.flights_desk_process.DeskProcess`, same interface), and hands back a
:class:`DeskResult`: its counters and a snapshot of its cache, for the caller to check
against the server. This module holds what every desk shares and the plain desks.
"""

from __future__ import annotations

import enum
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from regionbus.clients import (
    CacheListener,
    ClientCache,
    ClientSettings,
    EntryEvent,
    InterestResultPolicy,
    Region,
)
from regionbus.schemas.errors import RegionBusError
from regionbus.schemas.limits import MAX_KEYS_PER_REGISTRATION

REGION = "flights"
"""Name of the replayed region."""


def register_keys(region: Region, keys: tuple[str, ...], **options: Any) -> None:
    """Register interest in ``keys``, in as many calls as the limit of keys per registration
    asks (``MAX_KEYS_PER_REGISTRATION``; a year's flights of one airport is over it).

    Args:
        region: The desk's region.
        keys: The flight keys.
        **options: ``Region.register_interest``'s keyword arguments (``durable``, ``policy``,
            ``receive_values``), the same for every call.

    Raises:
        ServerTimeoutError: a registration was not answered within ``read_timeout_ms``.
        RegionBusError: the servers refused a registration.
    """
    for start in range(0, len(keys), MAX_KEYS_PER_REGISTRATION):
        region.register_interest(list(keys[start : start + MAX_KEYS_PER_REGISTRATION]), **options)


class DeskError(RegionBusError):
    """A desk failed: it could not start, register interest, or report back."""


class DeskKind(enum.Enum):
    """What a desk subscribes to."""

    CARRIER = "carrier"
    AIRPORT = "airport"
    DASHBOARD = "dashboard"
    OPERATIONS = "operations"
    CQ = "cq"
    """Continuous queries instead of interest (:mod:`regionbus.demo.flights_cq_desk`)."""


@dataclass(frozen=True)
class DeskSpec:
    """What one desk is.

    Attributes:
        name: Label in reports, e.g. ``"carrier desk UA"``.
        kind: CARRIER (``regex``), AIRPORT or OPERATIONS (``keys``) or DASHBOARD (days
            given later).
        regex: The carrier desk's interest regex.
        keys: The airport or operations desk's interest keys (they need not exist yet).
        durable_client_id: The operations desk's durable client id.
        away_at_day: The operations desk closes with keep-alive when the day of this
            number (1 = the first published) is published; None stays connected.
        back_at_day: ... and reconnects when the day of this number is published (after
            ``away_at_day``).
    """

    name: str
    kind: DeskKind
    regex: str | None = None
    keys: tuple[str, ...] = ()
    durable_client_id: str | None = None
    away_at_day: int | None = None
    back_at_day: int | None = None


@dataclass
class EventCounts:
    """Listener calls of one desk, by kind."""

    creates: int = 0
    updates: int = 0
    invalidates: int = 0
    destroys: int = 0


class CountingListener(CacheListener):
    """Counts the events a desk's listener sees (runs on the subscription thread)."""

    def __init__(self) -> None:
        self.counts = EventCounts()

    def after_create(self, event: EntryEvent) -> None:
        """Count a create."""
        self.counts.creates += 1

    def after_update(self, event: EntryEvent) -> None:
        """Count an update."""
        self.counts.updates += 1

    def after_invalidate(self, event: EntryEvent) -> None:
        """Count an invalidate."""
        self.counts.invalidates += 1

    def after_destroy(self, event: EntryEvent) -> None:
        """Count a destroy."""
        self.counts.destroys += 1


class Phase(enum.IntEnum):
    """When the operations desk got an event; per key, phases never go backwards."""

    CONNECTED = 0
    """First connection, after its marker (applied to the cache)."""
    REPLAY = 1
    """A connection's queue before its marker: listeners only, the cache unchanged."""
    LIVE = 2
    """The reconnection, after its marker (applied to the cache)."""


@dataclass
class DurableLog:
    """What the operations desk saw, over both its connections.

    Attributes:
        events: ``(key, version, phase)`` of every listener call, in arrival order.
        live_calls: ``after_region_live`` calls, one count per connection.
        away: Whether it closed with keep-alive and reconnected.
        client_state: ``client_state`` of its last connection (``NEW``/``RECONNECTED``).
        pending_event_count: Events queued when its last connection was made.
        cache_at_live: Its last connection's cache when ``after_region_live`` fired.
        applied_before_live: The same cache as computed from the events of that connection
            it applied before the marker (for the check that replay changed nothing).
    """

    events: list[tuple[str, int, Phase]] = field(default_factory=list)
    live_calls: list[int] = field(default_factory=list)
    away: bool = False
    client_state: str = ""
    pending_event_count: int = 0
    cache_at_live: dict[str, Any] | None = None
    applied_before_live: dict[str, Any] = field(default_factory=dict)


@dataclass
class DeskResult:
    """What a desk reports at the end.

    Attributes:
        name: The desk's label.
        events_received: Events read from its subscription queue (duplicates included).
        events_delivered: Events handed to its region (duplicates excluded).
        duplicates_dropped: Events dropped by message tracking.
        counts: Listener calls by kind.
        entries: Snapshot of its local cache, ``{key: value, or None when invalid}``.
        quiet: Whether its queue went quiet before the timeout.
        shown_keys: For the dashboard, the keys of the day registered last (None otherwise).
        days_shown: For the dashboard, how many day registrations it made.
        registration_s_max: For the dashboard, the longest day change, in seconds.
        durable: For the operations desk, what it saw per event and connection.
        continuous_queries: For the CQ desk, per CQ name its live result set at the end,
            its events by query operation and its error events.
    """

    name: str
    events_received: int
    events_delivered: int
    duplicates_dropped: int
    counts: EventCounts
    entries: dict[str, Any]
    quiet: bool
    shown_keys: tuple[str, ...] | None = None
    days_shown: int = 0
    registration_s_max: float = 0.0
    durable: DurableLog | None = None
    continuous_queries: dict[str, tuple[dict[str, Any], EventCounts, int]] | None = None


class DeskHandle(Protocol):
    """What the replayer needs of a desk, wherever it runs."""

    spec: DeskSpec

    def show_day(self, keys: tuple[str, ...]) -> None:
        """Ask the dashboard to show a new day (ignored by other desks); returns at once."""

    def day_published(self, number: int) -> None:
        """Tell the desk that day ``number`` (1 = first) is published (the operations
        desk closes or reconnects then; others ignore it)."""

    def finish(self, expected_events: int | None, timeout_s: float) -> DeskResult:
        """Wait for the desk to catch up and go quiet, then report."""

    def close(self) -> None:
        """Disconnect the desk."""


@dataclass
class _DayBoard:
    """The dashboard's pending and shown day registrations (guarded by ``cond``)."""

    cond: threading.Condition = field(default_factory=threading.Condition)
    wanted: tuple[str, ...] | None = None
    shown: tuple[str, ...] | None = None
    days_shown: int = 0
    registration_s_max: float = 0.0
    error: BaseException | None = None
    stop: bool = False


class Desk:
    """A desk in this process.

    Connects and registers the carrier or airport interest before returning, so every
    later change of a matching key reaches it.

    Args:
        spec: What the desk subscribes to.
        settings: Client settings (namespace, Kafka); the client id is generated.

    Raises:
        TransportError: Kafka cannot be reached or no server of the namespace runs.
        RegionNotFoundError: the servers do not define region ``flights``.
        ServerTimeoutError: the registration was not answered within ``read_timeout_ms``.
    """

    def __init__(self, spec: DeskSpec, settings: ClientSettings) -> None:
        self.spec = spec
        self.listener = CountingListener()
        self.cache = ClientCache(settings)
        try:
            self.region = self.cache.create_region(REGION, listeners=[self.listener])
            if spec.kind is DeskKind.CARRIER:
                assert spec.regex is not None
                self.region.register_interest_regex(spec.regex)
            elif spec.kind is DeskKind.AIRPORT:
                register_keys(self.region, spec.keys)
        except BaseException:
            self.cache.close()
            raise
        self._board = _DayBoard()
        self._worker: threading.Thread | None = None
        if spec.kind is DeskKind.DASHBOARD:
            self._worker = threading.Thread(
                target=self._show_days, name="dashboard-days", daemon=True
            )
            self._worker.start()

    def show_day(self, keys: tuple[str, ...]) -> None:
        """Ask the dashboard to show the day of these flight keys; returns at once.

        The registration runs on the dashboard's own thread. If it falls behind, only the
        newest requested day is registered (the board skips days rather than lag).
        Ignored by the carrier and airport desks.
        """
        if self.spec.kind is not DeskKind.DASHBOARD:
            return
        with self._board.cond:
            self._board.wanted = keys
            self._board.cond.notify_all()

    def day_published(self, number: int) -> None:
        """Ignored: these desks stay connected."""

    def _show_days(self) -> None:
        board = self._board
        while True:
            with board.cond:
                while not board.stop and board.wanted == board.shown:
                    board.cond.wait()
                if board.stop:
                    return
                wanted, previous = board.wanted, board.shown
            assert wanted is not None
            started = time.monotonic()
            try:
                # Yesterday off the board: stop its events, drop its entries here only (events
                # of it still queued find nothing held, so they change nothing), then load
                # today's keys as invalid entries. A key list costs the server one read of
                # those keys, where a day regex would scan the whole region.
                if previous is not None:
                    self.region.unregister_interest(list(previous))
                self.region.local_clear()
                self.region.register_interest(
                    list(wanted), policy=InterestResultPolicy.KEYS, receive_values=False
                )
            except BaseException as exc:
                with board.cond:
                    board.error = exc
                    board.stop = True
                    board.cond.notify_all()
                return
            took_s = time.monotonic() - started
            with board.cond:
                board.shown = wanted
                board.days_shown += 1
                board.registration_s_max = max(board.registration_s_max, took_s)
                board.cond.notify_all()

    def _wait_board(self, deadline: float) -> None:
        board = self._board
        with board.cond:
            while board.error is None and board.wanted != board.shown:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise DeskError(f"{self.spec.name}: day registration did not finish in time")
                board.cond.wait(remaining)
            if board.error is not None:
                raise DeskError(
                    f"{self.spec.name}: day registration failed: {board.error}"
                ) from board.error

    def finish(self, expected_events: int | None, timeout_s: float) -> DeskResult:
        """Wait until the desk has caught up and its queue is quiet, then report.

        Args:
            expected_events: Events it must have delivered before it can be quiet (the
                operations on its keys), or None to wait for quiet only.
            timeout_s: Longest wait, in seconds.

        Returns:
            Its counters and a snapshot of its cache (``quiet`` False if time ran out).

        Raises:
            DeskError: the dashboard's last day registration failed or did not finish.
        """
        deadline = time.monotonic() + timeout_s
        self._wait_board(deadline)
        stats = self.cache.subscription_stats
        while expected_events is not None and stats.events_delivered < expected_events:
            if time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        remaining_s = max(1.0, deadline - time.monotonic())
        quiet = self.cache.wait_for_quiet(idle_s=0.5, timeout_s=remaining_s)
        return DeskResult(
            name=self.spec.name,
            events_received=stats.events_received,
            events_delivered=stats.events_delivered,
            duplicates_dropped=stats.duplicates_dropped,
            counts=EventCounts(**vars(self.listener.counts)),
            entries=self.region.local_entries(),
            quiet=quiet,
            shown_keys=self._board.shown,
            days_shown=self._board.days_shown,
            registration_s_max=self._board.registration_s_max,
        )

    def close(self) -> None:
        """Stop the day worker and disconnect (queue and interest are removed)."""
        with self._board.cond:
            self._board.stop = True
            self._board.cond.notify_all()
        if self._worker is not None:
            self._worker.join(10)
        self.cache.close()


__all__ = [
    "REGION",
    "CountingListener",
    "Desk",
    "DeskError",
    "DeskHandle",
    "DeskKind",
    "DeskResult",
    "DeskSpec",
    "DurableLog",
    "EventCounts",
    "Phase",
]
