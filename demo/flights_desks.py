"""The subscribed clients of the flights demo: carrier desk, airport desk, dashboard.

Each desk is its own :class:`clients.ClientCache` with a ``CACHING_PROXY`` region
``flights`` and a counting :class:`CacheListener`:

- the **carrier desk** registers a regex on its carrier's keys (``"UA-.*"``);
- the **airport desk** registers the list of keys of every flight departing its airport;
- the **dashboard** is "today's board" with ``receive_values=False``: for each published
  day it registers that day's keys (policy ``KEYS``, so they load as invalid entries) and
  drops the previous day's registration. Per SPEC §3 it then gets invalidates for the
  day's departures and arrivals and destroys for its cancellations;
- the **operations desk** (:class:`OperationsDesk`) is a *durable client* (SPEC §5) with
  durable interest in the keys of every flight arriving at one destination airport. When
  a given day is published it closes with ``keep_alive`` (its subscription queue and
  durable interest stay on the server); when a later day is published it reconnects on a
  thread of its own, as a new :class:`clients.ClientCache` with the same durable id and
  without registering again, and calls ``ready_for_events``: the events queued while it
  was away are replayed to its listener before the marker, then it is live again. It
  records every event's key, version and phase for :mod:`demo.flights_verify`.

A desk runs in the caller's process (:class:`Desk`, :class:`OperationsDesk`; see
:func:`make_desk`) or in a child process of its own (:class:`DeskProcess`, same
interface), and hands back a :class:`DeskResult`: its counters and a snapshot of its
cache, for the caller to check against the server.
"""

from __future__ import annotations

import contextlib
import enum
import multiprocessing
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any, Protocol

from clients import (
    CacheListener,
    ClientCache,
    ClientSettings,
    EntryEvent,
    EventKind,
    InterestResultPolicy,
    Region,
    RegionEvent,
)
from schemas.errors import RegionBusError

REGION = "flights"
"""Name of the replayed region."""


class DeskError(RegionBusError):
    """A desk failed: it could not start, register interest, or report back."""


class DeskKind(enum.Enum):
    """What a desk subscribes to."""

    CARRIER = "carrier"
    AIRPORT = "airport"
    DASHBOARD = "dashboard"
    OPERATIONS = "operations"


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
                self.region.register_interest(list(spec.keys))
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


class _DurableListener(CountingListener):
    """Records the operations desk's events for one connection (on its queue thread).

    Replay is told apart by the cache's ``subscription_stats.replayed`` counter, which the
    queue thread raises just before it hands a replayed event to the region: every
    replayed event reaches listeners exactly once (SPEC §5).
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
            self.region.register_interest(list(self.spec.keys), durable=True)
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


def make_desk(spec: DeskSpec, settings: ClientSettings) -> Desk | OperationsDesk:
    """The in-process desk of a spec: :class:`OperationsDesk` for OPERATIONS, else
    :class:`Desk`.

    Raises:
        As :class:`Desk` and :class:`OperationsDesk`.
    """
    if spec.kind is DeskKind.OPERATIONS:
        return OperationsDesk(spec, settings)
    return Desk(spec, settings)


def _desk_main(spec: DeskSpec, settings: dict[str, Any], conn: Connection) -> None:
    """Body of a desk child process: build the desk, then obey the parent's commands."""
    try:
        desk = make_desk(spec, ClientSettings(**settings))
    except BaseException as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", None))
    try:
        while True:
            try:
                command, *args = conn.recv()
            except EOFError:
                return
            if command == "day":
                desk.show_day(args[0])
            elif command == "published":
                desk.day_published(args[0])
                if args[0] == spec.away_at_day:
                    conn.send(("away", None))
            elif command == "finish":
                try:
                    conn.send(("result", desk.finish(args[0], args[1])))
                except RegionBusError as exc:
                    conn.send(("error", f"{type(exc).__name__}: {exc}"))
            elif command == "close":
                return
    finally:
        desk.close()
        conn.close()


class DeskProcess:
    """A desk in a child process of its own (``spawn``), driven over a pipe.

    Construction starts the child and returns at once; call :meth:`wait_ready` before the
    replay so the desk's interest is registered. As with any ``spawn`` child, the calling
    program's main module must be importable without side effects (``if __name__ ==
    "__main__":``), or the child fails while starting.

    Args:
        spec: What the desk subscribes to.
        settings: Client settings for the child's cache.
    """

    def __init__(self, spec: DeskSpec, settings: ClientSettings) -> None:
        self.spec = spec
        context = multiprocessing.get_context("spawn")
        self._conn, child_conn = context.Pipe()
        self._process = context.Process(
            target=_desk_main,
            args=(spec, settings.model_dump(), child_conn),
            name=f"desk-{spec.kind.value}",
            daemon=True,
        )
        self._process.start()
        child_conn.close()

    def _receive(self, timeout_s: float, expected: str) -> Any:
        if not self._conn.poll(timeout_s):
            raise DeskError(f"{self.spec.name}: no answer from its process within {timeout_s} s")
        try:
            kind, payload = self._conn.recv()
        except EOFError as exc:
            raise DeskError(f"{self.spec.name}: its process exited") from exc
        if kind == "error":
            raise DeskError(f"{self.spec.name}: {payload}")
        if kind != expected:
            raise DeskError(f"{self.spec.name}: expected {expected!r}, got {kind!r}")
        return payload

    def wait_ready(self, timeout_s: float) -> None:
        """Wait until the child is connected and has registered its interest.

        Raises:
            DeskError: it failed, exited or did not answer within ``timeout_s`` seconds.
        """
        self._receive(timeout_s, "ready")

    def show_day(self, keys: tuple[str, ...]) -> None:
        """As :meth:`Desk.show_day`."""
        if self.spec.kind is DeskKind.DASHBOARD:
            self._conn.send(("day", keys))

    def day_published(self, number: int) -> None:
        """As :meth:`OperationsDesk.day_published` (the other desks are not told): on the
        day to go away, returns once the child closed with keep-alive.

        Raises:
            DeskError: the child failed, exited or did not close within 60 s.
        """
        if self.spec.kind is not DeskKind.OPERATIONS:
            return
        self._conn.send(("published", number))
        if number == self.spec.away_at_day:
            self._receive(60.0, "away")

    def finish(self, expected_events: int | None, timeout_s: float) -> DeskResult:
        """As :meth:`Desk.finish`; the snapshot is sent back over the pipe.

        Raises:
            DeskError: the child failed, exited or did not answer in time.
        """
        self._conn.send(("finish", expected_events, timeout_s))
        result: DeskResult = self._receive(timeout_s + 30.0, "result")
        return result

    def close(self) -> None:
        """Tell the child to disconnect and exit; terminate it if it does not within 15 s."""
        with contextlib.suppress(OSError):
            self._conn.send(("close",))
        self._process.join(15)
        if self._process.is_alive():
            self._process.terminate()
            self._process.join(5)
        self._conn.close()


__all__ = [
    "REGION",
    "CountingListener",
    "Desk",
    "DeskError",
    "DeskHandle",
    "DeskKind",
    "DeskProcess",
    "DeskResult",
    "DeskSpec",
    "DurableLog",
    "EventCounts",
    "OperationsDesk",
    "Phase",
    "make_desk",
]
