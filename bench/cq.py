"""The continuous-query benchmark: CQ events beside interest events and raw Kafka, one run.

``python -m bench.cq`` starts the local stack (unless ``KAFKA_BOOTSTRAP_SERVERS`` /
``REDIS_URL`` name one) and one cache server, and measures with JSON values
``{"t": send time, "n": i, "pad": ...}`` of ``--value-bytes``:

(L) put → listener latency at ``--rate`` puts/s for ``--latency-seconds``, one client:
    with ``ALL_KEYS`` interest, then holding the CQ ``SELECT * FROM /bench v WHERE v.n >= 0``
    (every put is in its result set); beside the raw two-hop relay (``bench.raw``);
(T) ``--ops`` pipelined puts with ``--subscribers`` clients: interest, then the same CQ in
    every client; events delivered per second and the server's CPU per change; beside raw
    produce → ``--subscribers`` consumers;
(S) the server's CPU per change (``--scaling-ops`` puts) with 1, 10 and 100 clients holding
    the same CQ, each beside as many clients with ``ALL_KEYS`` interest (the query is
    evaluated once per change whatever the number of holders, so what a holder adds is
    what an interested client adds: the goal is a flat ratio), and with one client holding
    1, 10 and 100 distinct CQs (one evaluation each).

Apache Geode's CQ on the same workload is ``bench.peers.geode --cq`` (a Geode 1.15.1 cache
server and CQ clients, in the peer harness). Machines are noisy: compare the ratios.
"""

from __future__ import annotations

import gc
import logging
import math
import os
import secrets
import sys
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from bench import progress
from bench.core import run_or_exit
from bench.cpu import CpuMeter
from bench.cq_workers import run_followers
from bench.load import Acks
from bench.raw import raw_relay_latency, raw_throughput
from bench.report import Latency, Throughput, latency, throughput
from bench.server import one_server_stack
from bench.services import ACK_TIMEOUT_S, REGION, RESULT_TIMEOUT_S, BenchOptions, Services
from bench.summary import SummaryRow, emit
from bench.workers import Child
from regionbus.clients import ClientCache, ClientSettings, Region

log = logging.getLogger("regionbus.bench")

CQ_QUERY = f"SELECT * FROM /{REGION} v WHERE v.n >= 0"
"""The benchmark's CQ: every put is in its result set (a CREATE, then UPDATEs)."""

SCALING_POINTS = (1, 10, 100)
_POSITIVE = click.IntRange(min=1)


def json_value(n: int, pad: int) -> dict[str, Any]:
    """A benchmark value stamped with its send time."""
    return {"t": time.time_ns(), "n": n, "pad": "x" * pad}


def write_json(region: Region, *, ops: int, window: int, key_space: int, pad: int) -> Acks:
    """``put_async`` of ``ops`` JSON values, at most ``window`` in flight; returns the
    answers once all came (or ``ACK_TIMEOUT_S`` passed)."""
    acks = Acks(ops)
    slots = threading.Semaphore(window)

    def answered(future: Any) -> None:
        acks.done(future)
        slots.release()

    for i in range(ops):
        slots.acquire()
        region.put_async(f"tp-{i % key_space}", json_value(i, pad)).add_done_callback(answered)
    acks.wait(ACK_TIMEOUT_S)
    return acks


def paced_json_puts(region: Region, rate: int, seconds: float, pad: int) -> tuple[int, int, int]:
    """Paced ``put_async`` of JSON values; returns ``(sent, start ns, end ns)`` once every
    answer came."""
    count = max(1, int(rate * seconds))
    acks = Acks(count)
    start = time.monotonic()
    start_ns = time.time_ns()
    for i in range(count):
        wait_s = start + i / rate - time.monotonic()
        if wait_s > 0:
            time.sleep(wait_s)
        region.put_async(f"lat-{i % 1000}", json_value(i, pad)).add_done_callback(acks.done)
    end_ns = time.time_ns()
    acks.wait(ACK_TIMEOUT_S)
    return count, start_ns, end_ns


@dataclass(frozen=True)
class CqFigures:
    """Every figure of a run."""

    interest_latency: Latency
    cq_latency: Latency
    relay_latency: Latency
    interest_throughput: Throughput
    cq_throughput: Throughput
    raw_fanout: Throughput
    holders_cpu_us: dict[int, float]
    interested_cpu_us: dict[int, float]
    distinct_cpu_us: dict[int, float]
    load_average: str


class _Run:
    def __init__(self, services: Services, options: BenchOptions, writer: Region) -> None:
        self.services = services
        self.options = options
        self.writer = writer
        self.settings = services.client_settings(options)
        self.pad = max(0, options.value_bytes - 40)

    def followers(self, clients: int, queries: list[str], record_latency: bool) -> Child:
        return Child(
            run_followers,
            "cq-followers",
            settings=self.settings,
            region=REGION,
            clients=clients,
            queries=queries,
            record_latency=record_latency,
            idle_timeout_s=self.options.idle_timeout_s,
        )

    def latency(self, queries: list[str]) -> Latency:
        with self.followers(1, queries, record_latency=True) as follower:
            follower.wait_ready()
            sent, start_ns, end_ns = paced_json_puts(
                self.writer, self.options.rate, self.options.latency_seconds, self.pad
            )
            follower.expect(sent)
            result = follower.wait_result(RESULT_TIMEOUT_S)
        return latency(
            sent=sent,
            start_ns=start_ns,
            end_ns=end_ns,
            warmup_s=self.options.warmup_seconds,
            readers=result,
        )

    def throughput(self, clients: int, queries: list[str], ops: int) -> Throughput:
        """Puts with ``clients`` followers; each expects one call per put and query."""
        with self.followers(clients, queries, record_latency=False) as followers:
            followers.wait_ready(timeout_s=60.0 + 10.0 * clients)
            cpu = CpuMeter({"writer": os.getpid(), **self.services.pids})
            cpu.start()
            start_ns = time.time_ns()
            acks = write_json(
                self.writer,
                ops=ops,
                window=self.options.window,
                key_space=self.options.key_space,
                pad=self.pad,
            )
            followers.expect(acks.acked * max(1, len(queries)))
            result = followers.wait_result(RESULT_TIMEOUT_S + 2.0 * clients)
            cpu.stop()
        return throughput(
            sent=ops,
            acked=acks.acked,
            errors=acks.errors,
            start_ns=start_ns,
            last_ack_ns=acks.last_ns,
            readers=result,
            cpu_s=cpu.used_s,
        )


def run(options: BenchOptions, scaling_ops: int, console: Console) -> CqFigures:
    """Start the stack and a cache server; run every phase.

    Raises:
        BenchError: a child process failed or did not answer in time.
        StackError: Kafka or Redis could not be started.
    """
    namespace = f"bench.cq.{secrets.token_hex(3)}"
    load_average = " ".join(f"{x:.1f}" for x in os.getloadavg())
    with ExitStack() as stack:
        _, services = one_server_stack(stack, "cq", namespace, options, console)
        progress.phase(console, f"(w) warm-up, untimed: raw produce of {options.ops:,} ...")
        raw_throughput(services, options, 1, "warmup")
        cache = ClientCache(
            ClientSettings(**services.client_settings(options, subscription_enabled=False))
        )
        try:
            rb = _Run(services, options, cache.create_region(REGION))
            progress.phase(console, f"(L) interest: {options.rate} puts/s ...")
            interest_latency = rb.latency([])
            progress.phase(console, f"(L) CQ: {options.rate} puts/s ...")
            cq_latency = rb.latency([CQ_QUERY])
            progress.phase(console, "(L) raw two-hop relay ...")
            relay = raw_relay_latency(services, options)
            progress.phase(console, f"(T) interest: {options.ops:,} puts ...")
            interest_tp = rb.throughput(options.subscribers, [], options.ops)
            progress.phase(console, f"(T) CQ: {options.ops:,} puts ...")
            cq_tp = rb.throughput(options.subscribers, [CQ_QUERY], options.ops)
            holders: dict[int, float] = {}
            interested: dict[int, float] = {}
            distinct: dict[int, float] = {}
            for count in SCALING_POINTS:
                progress.phase(console, f"(S) {count} clients holding the same CQ ...")
                holders[count] = _server_us(rb.throughput(count, [CQ_QUERY], scaling_ops))
                progress.phase(console, f"(S) {count} clients with ALL_KEYS interest ...")
                interested[count] = _server_us(rb.throughput(count, [], scaling_ops))
            for count in SCALING_POINTS:
                progress.phase(console, f"(S) one client holding {count} distinct CQs ...")
                queries = [f"SELECT * FROM /{REGION} v WHERE v.n >= {-i}" for i in range(count)]
                distinct[count] = _server_us(rb.throughput(1, queries, scaling_ops))
        finally:
            cache.close()
        gc.collect()
        progress.phase(console, f"(T) raw: {options.ops:,} messages, {options.subscribers} ...")
        raw_fan = raw_throughput(services, options, options.subscribers, "fanout")
    return CqFigures(
        interest_latency,
        cq_latency,
        relay,
        interest_tp,
        cq_tp,
        raw_fan,
        holders,
        interested,
        distinct,
        load_average,
    )


def _server_us(figures: Throughput) -> float:
    return figures.cpu_us_per_op("server")


def print_figures(figures: CqFigures, console: Console) -> None:
    """Print the phases' figures."""
    table = Table(title=f"continuous queries (load average before: {figures.load_average})")
    for column in ("figure", "interest", "CQ", "raw"):
        table.add_column(column, justify="left" if column == "figure" else "right")
    lat = (figures.interest_latency, figures.cq_latency, figures.relay_latency)
    for name in ("p50", "p99"):
        table.add_row(
            f"put→listener {name} (ms)", *(f"{getattr(x, f'{name}_ms'):.1f}" for x in lat)
        )
    tp = (figures.interest_throughput, figures.cq_throughput, figures.raw_fanout)
    table.add_row(
        f"events delivered/s ({figures.cq_throughput.readers} clients)",
        *(f"{x.delivered_per_s:,.0f}" for x in tp),
    )
    table.add_row("every client got every put", *(str(x.complete) for x in tp))
    table.add_row(
        "server CPU µs per change",
        *(_us(x.cpu_us_per_op("server")) for x in tp[:2]),
        "-",
    )
    console.print(table)
    scaling = Table(title="server CPU µs per change")
    for column in ("clients / CQs", *(str(n) for n in SCALING_POINTS)):
        scaling.add_column(column, justify="right")
    scaling.add_row(
        "clients holding the same CQ", *(_us(figures.holders_cpu_us[n]) for n in SCALING_POINTS)
    )
    scaling.add_row(
        "clients with ALL_KEYS interest",
        *(_us(figures.interested_cpu_us[n]) for n in SCALING_POINTS),
    )
    scaling.add_row(
        "distinct CQs of one client", *(_us(figures.distinct_cpu_us[n]) for n in SCALING_POINTS)
    )
    console.print(scaling)


def _us(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:,.0f}"


def summary_rows(figures: CqFigures) -> list[SummaryRow]:
    """The headline figures for ``bench.all``: CQ beside raw Kafka, and beside interest."""
    cq, interest = figures.cq_throughput, figures.interest_throughput
    rows = [
        SummaryRow(
            "cq",
            f"CQ events delivered/s ({cq.readers} clients)",
            cq.delivered_per_s,
            figures.raw_fanout.delivered_per_s,
            f"produce→{figures.raw_fanout.readers} consumers msg/s",
        ),
        SummaryRow(
            "cq",
            f"CQ events delivered/s ({cq.readers} clients) vs interest",
            cq.delivered_per_s,
            interest.delivered_per_s,
            "ALL_KEYS interest events/s",
        ),
    ]
    for name in ("p50", "p99"):
        rows.append(
            SummaryRow(
                "cq",
                f"put→CQ listener {name} (ms)",
                getattr(figures.cq_latency, f"{name}_ms"),
                getattr(figures.relay_latency, f"{name}_ms"),
                f"two-hop relay {name}",
                higher_is_better=False,
            )
        )
        rows.append(
            SummaryRow(
                "cq",
                f"put→CQ listener {name} (ms) vs interest",
                getattr(figures.cq_latency, f"{name}_ms"),
                getattr(figures.interest_latency, f"{name}_ms"),
                f"put→interest listener {name}",
                higher_is_better=False,
            )
        )
    for count in SCALING_POINTS:
        rows.append(
            SummaryRow(
                "cq",
                f"server CPU µs/change, {count} clients holding the same CQ",
                figures.holders_cpu_us[count],
                figures.interested_cpu_us[count],
                f"{count} clients with ALL_KEYS interest",
                higher_is_better=False,
            )
        )
    one = figures.distinct_cpu_us[SCALING_POINTS[0]]
    for count in SCALING_POINTS[1:]:
        rows.append(
            SummaryRow(
                "cq",
                f"server CPU µs/change, {count} distinct CQs",
                figures.distinct_cpu_us[count],
                one,
                "with 1 CQ",
                higher_is_better=False,
            )
        )
    return rows


@click.command()
@click.option("--ops", default=20_000, type=_POSITIVE, show_default=True, help="Puts in (T).")
@click.option(
    "--subscribers", default=10, type=_POSITIVE, show_default=True, help="Clients in (T)."
)
@click.option("--rate", default=500, type=_POSITIVE, show_default=True, help="Puts/s in (L).")
@click.option("--latency-seconds", default=10.0, show_default=True)
@click.option(
    "--scaling-ops", default=3_000, type=_POSITIVE, show_default=True, help="Puts per (S) point."
)
@click.option("--value-bytes", default=200, type=click.IntRange(min=40), show_default=True)
@click.option("--window", default=2_000, type=_POSITIVE, show_default=True)
@click.option("--key-space", default=10_000, type=_POSITIVE, show_default=True)
@click.option("--fetch-wait-max-ms", default=100, type=_POSITIVE, show_default=True)
@click.option("--linger-ms", default=5, type=click.IntRange(min=0), show_default=True)
@click.option("--warmup-seconds", default=1.0, show_default=True)
@click.option("--idle-timeout-s", default=60.0, show_default=True)
def main(scaling_ops: int, **values: Any) -> None:
    """Measure CQ events against interest events and raw Kafka, and CQ scaling, in one run."""
    logging.basicConfig(level=logging.WARNING)
    options = BenchOptions(writer="async", chunk=1_000, **values)
    console = Console(width=None if sys.stdout.isatty() else 120)
    figures = run_or_exit(lambda: run(options, scaling_ops, console), console)
    print_figures(figures, console)
    emit(summary_rows(figures))


if __name__ == "__main__":
    main()
