"""``bench.fleet``'s storms phase: many clients asking at once, beside a bystander (another
client, in a process of its own, putting to another region), at the full size the suite's
storm test (``tests/integration/test_storms_are_paced.py``) cannot run:

- **a registration storm**: ``--storm-clients`` clients (``STORM_CLIENTS_PER_PROCESS`` to a
  process) register ``ALL_KEYS`` with ``KEYS_VALUES`` at once in a region of
  ``--storm-entries`` entries. Before the pacing, 200 clients on 100,000 entries all timed
  out, and another client's puts timed out for over 2 minutes. Measured: that every client
  got every entry, when the last one had them, and the bystander's put p99 and worst during
  the storm, beside its p99 alone.
- **a connect storm**: ``--storm-connects`` CONNECT requests produced at once (before: 300
  took 7.5 s each, median, and others' puts waited 5.1 s). Measured: the slowest answer and
  the median, and the bystander's p99 and worst during the storm.

The goals are the fleet issue's: every registration succeeds, each connect is answered
within 2 s, the bystander's put p99 stays within 100 ms and its worst within 1 s.
"""

from __future__ import annotations

import logging
import statistics
import time
from contextlib import ExitStack

from bench import progress
from bench.fleet_load_phases import (
    add_bystander_figures,
    latencies_in,
    server_and_bystander,
    timed_window,
)
from bench.fleet_run import Figure, FleetOptions, Run, client_settings, load_now
from bench.report import percentile
from bench.services import REGION, RESULT_TIMEOUT_S, Services
from bench.storms import ConnectStorm, fill_region, run_storm_clients
from bench.workers import Child
from regionbus.clients import ClientCache, ClientSettings, RegionShortcut

log = logging.getLogger("regionbus.bench")

STORM_REGION = "storm"
"""The region the registration storm registers in (the bystander puts to ``REGION``)."""
STORM_CLIENTS_PER_PROCESS = 25
"""Storm clients per child process: one Python process decoding every client's initial
results would measure that process, not the servers."""
STORM_NICE = 10
"""Nice value of the storm's processes. The issue's storm is 200 applications, each on a
machine of its own; here they share the 2 cores with the servers, Kafka and the bystander,
and 8 processes decoding 20,000,000 entries as fast as they can would otherwise take most
of them (load average 15-19 when they ran at nice 0: the bystander then measured CPU
contention on this machine more than the servers). Niced, they run on what the rest leaves;
the servers' pacing is what stays measured."""
CONNECT_GOAL_S = 2.0
STORM_TIMEOUT_S = 3_000.0


def storms_phase(run: Run, options: FleetOptions) -> None:
    """The registration storm, then the connect storm, beside one bystander."""
    regions = (REGION, STORM_REGION)
    with server_and_bystander(run, options, "storms", regions) as (services, _server, bystander):
        _fill(services, options, options.storm_entries)
        load = load_now()
        alone = timed_window(lambda: time.sleep(5))
        registration = _registration_storm(run, services, options, load)
        connect_load = load_now()
        connects = _connect_storm(run, services, options, connect_load)
        puts: list[tuple[float, float]] = bystander.result(RESULT_TIMEOUT_S)["puts"]
    base = percentile(latencies_in(puts, alone), 0.99)
    for name, window, at_load in (
        (f"{options.storm_clients} ALL_KEYS registrations", registration, load),
        (f"{options.storm_connects} connects", connects, connect_load),
    ):
        add_bystander_figures(
            run,
            "storms",
            latencies_in(puts, window),
            base,
            at_load,
            f"bystander put p99 during {name} (ms)",
            f"bystander worst put during {name} (ms)",
        )


def _fill(services: Services, options: FleetOptions, entries: int) -> None:
    cache = ClientCache(
        ClientSettings(**client_settings(services, options, subscription_enabled=False))
    )
    try:
        fill_region(cache.create_region(STORM_REGION, RegionShortcut.PROXY), entries)
    finally:
        cache.close()


def _registration_storm(
    run: Run, services: Services, options: FleetOptions, load: str
) -> tuple[float, float]:
    clients, entries = options.storm_clients, options.storm_entries
    progress.phase(
        run.console, f"storms: {clients} clients connect to register over {entries:,} ..."
    )
    settings = client_settings(
        services, options, fetch_wait_max_ms=100, read_timeout_ms=int(STORM_TIMEOUT_S * 1000)
    )
    processes = -(-clients // STORM_CLIENTS_PER_PROCESS)
    with ExitStack() as stack:
        children = [
            stack.enter_context(
                Child(
                    run_storm_clients,
                    f"storm-{p}",
                    settings=settings,
                    region=STORM_REGION,
                    count=len(range(p, clients, processes)),
                    prefix=f"storm-{p}",
                    nice_increment=STORM_NICE,
                )
            )
            for p in range(processes)
        ]
        for child in children:
            child.wait_ready(600)
        progress.phase(run.console, f"storms: {clients} ALL_KEYS registrations at once ...")
        began = time.monotonic()
        for child in children:
            child.expect(0)
        results = [child.wait_result(STORM_TIMEOUT_S) for child in children]
        window = (began, time.monotonic())
    errors = [e for r in results for e in r["errors"]]
    complete = sum(1 for r in results for n in r["entries"] if n == entries)
    seconds = [s for r in results for s in r["seconds"]]
    if errors:
        log.warning("storm registrations failed: %s", errors[:3])
    run.add(
        Figure(
            "storms",
            f"clients with all {entries:,} entries after registering at once (of {clients})",
            complete,
            f"= {clients}",
            complete == clients,
            load=load,
        )
    )
    run.add(
        Figure(
            "storms",
            "the last registration of the storm answered after (s)",
            max(seconds, default=float("nan")),
            "-",
            None,
            load=load,
        )
    )
    return window


def _connect_storm(
    run: Run, services: Services, options: FleetOptions, load: str
) -> tuple[float, float]:
    count = options.storm_connects
    progress.phase(run.console, f"storms: {count} connects at once ...")
    storm = ConnectStorm(
        services.kafka_bootstrap_servers, services.namespace, count, "connect-storm"
    )
    began = time.monotonic()
    storm.send()
    answers = storm.answers(60)
    window = (began, time.monotonic())
    slowest = max(answers.seconds.values(), default=float("nan"))
    run.add(
        Figure(
            "storms",
            f"slowest answer of {count} connects at once (s)",
            slowest,
            f"<= {CONNECT_GOAL_S} s, all answered",
            len(answers.seconds) == count and slowest <= CONNECT_GOAL_S,
            load=load,
        )
    )
    run.add(
        Figure(
            "storms",
            f"median answer of {count} connects at once (s)",
            statistics.median(answers.seconds.values()) if answers.seconds else float("nan"),
            "-",
            None,
            load=load,
        )
    )
    return window
