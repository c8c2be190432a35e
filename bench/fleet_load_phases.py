"""``bench.fleet``'s phases of greedy and slow clients: huge requests beside a bystander
(goal 5), and a tenth of the subscribers stalled (goal 6)."""

from __future__ import annotations

import logging
import math
import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import ExitStack, contextmanager
from typing import Any

from bench import progress
from bench.fleet_run import (
    Figure,
    FleetOptions,
    Run,
    client_settings,
    fleet_server,
    load_now,
    subscriber_children,
    writer_client,
)
from bench.fleet_workers import run_bystander
from bench.load import paced
from bench.report import NS_PER_S, latency, percentile
from bench.server import BenchError, ServerProcess
from bench.services import REGION, RESULT_TIMEOUT_S, Services
from bench.workers import Child
from regionbus.clients import BytesSerializer, ClientCache, ClientSettings, Region
from regionbus.schemas.errors import BulkOperationError, RequestLimitError
from regionbus.schemas.limits import MAX_BULK_ENTRIES, MAX_KEYS_PER_REGISTRATION

log = logging.getLogger("regionbus.bench")

# --- 5: huge requests -----------------------------------------------------------------------


def requests_phase(run: Run, options: FleetOptions) -> None:
    """Goal 5 (see the module's description).

    The bystander is another client in a process of its own, as another application's
    would be: in the big client's process its puts would also wait for that process's
    own work on the big request (the GIL), which no other client sees.
    """
    with server_and_bystander(run, options, "requests") as (services, _server, bystander):
        big_cache = ClientCache(
            ClientSettings(**client_settings(services, options, read_timeout_ms=60_000))
        )
        try:
            big = big_cache.create_region(REGION, serializer=BytesSerializer())
            load = load_now()
            alone = timed_window(lambda: time.sleep(5))
            progress.phase(
                run.console,
                f"5: a registration of {MAX_KEYS_PER_REGISTRATION:,} keys (load {load_now()}) ...",
            )
            keys = [f"reg-{i}" for i in range(MAX_KEYS_PER_REGISTRATION)]
            during_reg = timed_window(lambda: big.register_interest(keys))
            progress.phase(
                run.console, f"5: a put_all of {MAX_BULK_ENTRIES:,} entries (load {load_now()}) ..."
            )
            entries = {f"bulk-{i}": b"v" * 24 for i in range(MAX_BULK_ENTRIES)}
            during_bulk = timed_window(lambda: _put_all(big, entries))
            refused_ms = _refusals(big)
        finally:
            big_cache.close()
        puts: list[tuple[float, float]] = bystander.result(RESULT_TIMEOUT_S)["puts"]
    base = percentile(latencies_in(puts, alone), 0.99)
    for name, window in (
        (f"register_interest of {MAX_KEYS_PER_REGISTRATION:,} keys", during_reg),
        (f"put_all of {MAX_BULK_ENTRIES:,} entries", during_bulk),
    ):
        add_bystander_figures(
            run,
            "requests",
            latencies_in(puts, window),
            base,
            load,
            f"bystander put p99 during a {name} (ms)",
            "bystander worst put during it (ms)",
        )
        run.add(Figure("requests", f"{name} took (s)", window[1] - window[0], "-", None, load=load))
    run.add(
        Figure(
            "requests",
            "1,000,000 keys / 300,000 entries refused in (ms)",
            refused_ms,
            "refused before sending",
            refused_ms < 5_000,
            load=load,
        )
    )


@contextmanager
def server_and_bystander(
    run: Run, options: FleetOptions, name: str, regions: tuple[str, ...] = (REGION,)
) -> Iterator[tuple[Services, ServerProcess, Child]]:
    """A fleet server defining ``regions``, and a bystander putting to ``REGION`` from a
    process of its own, ready (:func:`bench.fleet_workers.run_bystander`).

    Raises:
        BenchError: the server or the bystander did not start.
    """
    with (
        fleet_server(run, options, name, regions=regions) as (services, server),
        Child(
            run_bystander,
            "bystander",
            settings=client_settings(services, options, subscription_enabled=False),
            region=REGION,
        ) as bystander,
    ):
        bystander.wait_ready()
        yield services, server, bystander


def add_bystander_figures(
    run: Run,
    phase: str,
    latencies: list[float],
    base: float,
    load: str,
    p99_figure: str,
    worst_figure: str,
) -> None:
    """The bystander's put p99 (goal <= 100 ms) and worst put (goal <= 1 s) of a window,
    ``latencies`` sorted (ms), each beside its p99 alone (``base``)."""
    p99 = percentile(latencies, 0.99)
    worst = latencies[-1] if latencies else math.nan
    for figure, value, goal, bound in (
        (p99_figure, p99, "<= 100", 100),
        (worst_figure, worst, "<= 1000", 1000),
    ):
        run.add(
            Figure(
                phase, figure, value, goal, value <= bound, base, "bystander put p99 alone", load
            )
        )


def timed_window(during: Any) -> tuple[float, float]:
    """Run ``during()``; its start and end on ``time.monotonic()``'s clock (s)."""
    began = time.monotonic()
    try:
        during()
    finally:
        ended = time.monotonic()
    return began, ended


def latencies_in(puts: list[tuple[float, float]], window: tuple[float, float]) -> list[float]:
    """Latencies (ms, sorted) of the bystander's puts sent within ``window``."""
    began, ended = window
    return sorted(latency_ms for sent, latency_ms in puts if began <= sent < ended)


def _put_all(region: Region, entries: dict[str, bytes]) -> None:
    try:
        region.put_all(entries)
    except BulkOperationError as exc:
        log.warning("put_all: %s", exc)


def _refusals(region: Region) -> float:
    began = time.perf_counter()
    for ask in (
        lambda: region.register_interest([f"k{i}" for i in range(1_000_000)]),
        lambda: region.put_all({f"k{i}": b"v" for i in range(300_000)}),
    ):
        try:
            ask()
        except RequestLimitError:
            continue
        raise BenchError("a request over the limits was not refused")
    return (time.perf_counter() - began) * 1000


# --- 6: stalled subscribers -----------------------------------------------------------------


def stalled_phase(run: Run, options: FleetOptions) -> None:
    """Goal 6 (see the module's description)."""
    with fleet_server(run, options, "stalled") as (services, _server_process):
        settings = client_settings(services, options)
        figures = {}
        for stalled in (False, True):
            progress.phase(
                run.console,
                f"6: {options.stalled_subscribers} subscribers, "
                f"{'a tenth' if stalled else 'none'} stalled (load {load_now()}) ...",
            )
            figures[stalled] = _stalled_run(services, options, settings, stalled)
        (p99_none, tput_none, load), (p99_some, tput_some, _) = figures[False], figures[True]
        run.add(
            Figure(
                "stalled",
                "others' put→listener p99, a tenth stalled (ms)",
                p99_some,
                "<= 1.1 x none stalled",
                p99_some <= 1.1 * p99_none,
                p99_none,
                "p99 with none stalled",
                load,
            )
        )
        run.add(
            Figure(
                "stalled",
                "writer puts acked/s, a tenth stalled",
                tput_some,
                ">= 0.9 x none stalled",
                tput_some >= 0.9 * tput_none,
                tput_none,
                "puts acked/s with none stalled",
                load,
                higher_is_better=True,
            )
        )


def _stalled_run(
    services: Services, options: FleetOptions, settings: dict[str, Any], stall: bool
) -> tuple[float, float, str]:
    with ExitStack() as stack:
        children = subscriber_children(
            stack, settings, options.stalled_subscribers, "stall", record_latency=True
        )
        stalled = children[: max(1, len(children) // 10)] if stall else []
        for child in stalled:
            assert child.pid is not None
            os.kill(child.pid, signal.SIGSTOP)
        for child in stalled:
            assert child.pid is not None
            stack.callback(os.kill, child.pid, signal.SIGCONT)
        writer_cache, writer = writer_client(services, options)
        stack.callback(writer_cache.close)
        futures: list[Future[None]] = []
        load = load_now()
        sent, first_ns, last_ns = paced(
            lambda i, value: futures.append(writer.put_async(f"s-{i}", value)),
            options.stalled_rate,
            options.stalled_seconds,
            24,
        )
        done_ns = 0
        acked = 0
        for future in futures:
            if future.exception(120) is None:
                acked += 1
        done_ns = time.time_ns()
        healthy = [c for c in children if c not in stalled]
        for child in healthy:
            child.expect(acked)
        results = [child.wait_result(RESULT_TIMEOUT_S) for child in healthy]
        for child in stalled:
            assert child.pid is not None
            os.kill(child.pid, signal.SIGCONT)
    merged = {
        "counts": [c for r in results for c in r["counts"]],
        "sent_ns": [s for r in results for s in r["sent_ns"]],
        "received_ns": [s for r in results for s in r["received_ns"]],
    }
    figures = latency(sent=sent, start_ns=first_ns, end_ns=last_ns, warmup_s=1.0, readers=merged)
    return figures.p99_ms, acked / max((done_ns - first_ns) / NS_PER_S, 1e-9), load
