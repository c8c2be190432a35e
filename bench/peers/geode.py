"""The Apache Geode peer of ``bench.core`` and ``bench.failover``: real Geode 1.15 on this
machine, the same workload, its figures beside regionbus's in ``bench.all``'s table.

``python -m bench.peers.geode`` resolves the Geode jars on first use
(``scripts/bootstrap.sh --peers``), then runs the Java harness
(``bench/peers/geode/src/main/java``) in a child JVM, which starts Geode cache servers,
subscriber client caches (a JVM each: a Geode client cache is one per JVM) and writes
itself. It measures (with ``bench.core``'s keys ``tp-<i mod key-space>`` and stamped values):

(b) put → listener latency at ``--rate`` puts/s for ``--latency-seconds``, one subscriber;
(a) puts/s and events delivered/s with ``--subscribers`` subscribers (ALL_KEYS interest),
    ``--writer-threads`` threads putting (Geode's client put is synchronous);
(g), (q) ``Region.getAll`` of ``--get-all-keys`` keys and a one-shot OQL query over
    ``--read-entries`` entries, one call at a time (``bench.core``'s read phases, the
    workload of ``bench.reads_figures``; ``--no-reads`` skips them);
(f) with two servers and ``subscription-redundancy=1``, a SIGKILL of the subscriber's
    primary: the gap at the listener, and acknowledged puts lost or delivered twice.

It prints the figures and, under ``bench.all``, emits rows whose baseline is Geode; the
regionbus figure of each comes from ``bench.core`` / ``bench.failover`` of the same run.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from bench import progress
from bench.peers.geode_figures import GeodeFigures, parse, summary_rows
from bench.peers.jvm import run_geode_main
from bench.summary import emit

log = logging.getLogger("regionbus.bench.geode")

_POSITIVE = click.IntRange(min=1)


def run_harness(options: dict[str, Any], work_dir: Path, timeout_s: float) -> GeodeFigures:
    """Run the Geode harness once and read its figures.

    Args:
        options: Harness options by name without dashes (``ops``, ``subscribers``, ...);
            booleans as ``true`` / ``false``.
        work_dir: Where every member's log goes (``<member>.log``, ``<member>.stderr``).
        timeout_s: Longest run, in seconds.

    Returns:
        The figures.

    Raises:
        PeerSetupError: Java or the jars are missing and cannot be resolved.
        RuntimeError: the harness failed or took longer than ``timeout_s``.
    """
    return parse(run_geode_main("run", options, work_dir, timeout_s))


def report(figures: GeodeFigures, console: Console) -> None:
    """Print the figures as a table."""
    table = Table(title=f"Apache Geode {figures.version}: one cache server, client subscriptions")
    table.add_column("figure")
    table.add_column("Geode", justify="right")
    table.add_row(f"puts/s ({figures.writer_threads} writer threads)", f"{figures.puts_per_s:,.0f}")
    table.add_row(
        f"events delivered/s ({figures.subscribers} subscribers)", f"{figures.events_per_s:,.0f}"
    )
    table.add_row("every subscriber got every put", str(figures.complete))
    for name in ("p50", "p99", "max"):
        table.add_row(f"put→listener {name} (ms)", f"{getattr(figures, f'{name}_ms'):.1f}")
    reads = figures.reads
    if reads is not None:
        for name, series in (
            (f"getAll of {reads.keys_per_call} keys", reads.get_all),
            (f"OQL query over {reads.entries:,} entries", reads.query),
        ):
            table.add_row(f"{name}: calls/s", f"{series.per_s:,.0f}")
            table.add_row(f"{name}: p50 / p99 (ms)", f"{series.p50_ms:.2f} / {series.p99_ms:.2f}")
    failover = figures.failover
    if failover is not None:
        table.add_row(
            "failover: puts sent / acknowledged / failed",
            f"{failover.sent:,} / {failover.acked:,} / {failover.put_errors}",
        )
        table.add_row(
            "failover: kill → first event of a put sent after it (ms)",
            f"{failover.kill_to_first_event_after_kill_ms:,.0f}",
        )
        table.add_row(
            "failover: longest listener silence after the kill (ms)",
            f"{failover.longest_silence_after_kill_ms:,.0f}",
        )
        table.add_row(
            "failover: longest put after the kill (ms)",
            f"{failover.longest_put_after_kill_ms:,.0f}",
        )
        table.add_row(
            "failover: acknowledged puts never delivered", str(failover.acked_never_delivered)
        )
        table.add_row("failover: duplicates at the listener", str(failover.duplicates))
        table.add_row(
            "failover: put→listener p99 before the kill (ms)", f"{failover.p99_before_kill_ms:.1f}"
        )
    console.print(table)


@click.command()
@click.option(
    "--ops",
    default=50_000,
    type=_POSITIVE,
    show_default=True,
    help="Puts in the throughput phase (bench.core's default).",
)
@click.option(
    "--subscribers",
    default=10,
    type=_POSITIVE,
    show_default=True,
    help="Subscriber client caches (a JVM each) in the throughput phase.",
)
@click.option(
    "--rate",
    default=1_000,
    type=_POSITIVE,
    show_default=True,
    help="Puts per second in the latency phase.",
)
@click.option("--latency-seconds", default=20.0, show_default=True)
@click.option("--value-bytes", default=200, type=click.IntRange(min=8), show_default=True)
@click.option("--key-space", default=10_000, type=_POSITIVE, show_default=True)
@click.option("--warmup-seconds", default=1.0, show_default=True, help="Latency not counted.")
@click.option(
    "--writer-threads",
    default=16,
    type=_POSITIVE,
    show_default=True,
    help="Threads doing synchronous puts (Geode's pipelining).",
)
@click.option(
    "--reads/--no-reads",
    default=True,
    show_default=True,
    help="Run the read phases: getAll and a one-shot OQL query (bench.core's (g) and (q)).",
)
@click.option("--read-entries", default=10_000, type=_POSITIVE, show_default=True)
@click.option("--get-all-keys", default=100, type=_POSITIVE, show_default=True)
@click.option("--get-all-calls", default=500, type=_POSITIVE, show_default=True)
@click.option("--query-runs", default=20, type=_POSITIVE, show_default=True)
@click.option(
    "--failover/--no-failover",
    default=True,
    show_default=True,
    help="Run the failover phase (two servers, SIGKILL of the primary).",
)
@click.option("--failover-rate", default=1_000, type=_POSITIVE, show_default=True)
@click.option("--failover-seconds", default=15.0, show_default=True)
@click.option("--kill-after-s", default=5.0, show_default=True)
@click.option(
    "--member-timeout-ms",
    default=5_000,
    type=_POSITIVE,
    show_default=True,
    help="Geode's member-timeout (its default): how soon a survivor drops a dead peer.",
)
@click.option(
    "--idle-timeout-s",
    default=30.0,
    show_default=True,
    help="Subscribers give up after this long without an event.",
)
@click.option("--timeout-s", default=1_200.0, show_default=True, help="Longest harness run.")
@click.option("--json", "as_json", is_flag=True, help="Also print the harness's figures as JSON.")
@click.option("-v", "--verbose", is_flag=True)
def main(
    as_json: bool, verbose: bool, timeout_s: float, failover: bool, reads: bool, **values: Any
) -> None:
    """Measure Apache Geode with bench.core's workload, and a failover with redundancy 1."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING)
    console = Console()
    work_dir = progress.log_dir("peers.geode", console)
    try:
        with progress.heartbeat(console):
            stderr_path = work_dir / "harness.stderr"
            progress.phase(console, "Geode harness ...", lambda: progress.last_line(stderr_path))
            figures = run_harness(
                {
                    **values,
                    "failover": "true" if failover else "false",
                    "reads": "true" if reads else "false",
                },
                work_dir,
                timeout_s,
            )
    except RuntimeError as exc:
        console.print(f"benchmark failed: {exc}", style="red", highlight=False, markup=False)
        sys.exit(1)
    report(figures, console)
    emit(summary_rows(figures))
    if as_json:
        print(figures, flush=True)


if __name__ == "__main__":
    main()
