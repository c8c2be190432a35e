"""Run every benchmark of the project in turn and write one Markdown table of their figures,
each beside the raw Kafka / Redis baseline measured in the same run, with the ratio.

``python -m bench.all`` runs ``bench.core``, ``bench.durable_replay``, ``bench.failover``,
``bench.gateway`` (with MirrorMaker 2 beside the sender), ``bench.gateway_shards``,
``bench.spark_read``, ``bench.cq``, the Apache Geode peers ``bench.peers.geode`` and
``bench.peers.geode_cq``, ``bench.scaling`` and ``bench.fleet``, one child process each
(each starts its own
embedded stack unless ``KAFKA_BOOTSTRAP_SERVERS`` / ``REDIS_URL`` name one), collects the rows
they emit (:mod:`bench.summary`) and writes ``--output`` (default ``bench/RESULTS.md``):
the machine, the load average before each benchmark, the table, and any benchmark that
failed with the tail of its output. ``--profile quick`` uses smaller sizes (a few minutes in
all); ``full`` uses each benchmark's own defaults. Machines are noisy: compare the ratios.
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import click
from rich.console import Console

from bench.summary import SUMMARY_FILE_ENV, SummaryRow, markdown_table, read, with_peers
from regionbus.runtime.heartbeat import DEFAULT_INTERVAL_S, Heartbeat, last_line


@dataclass(frozen=True, slots=True)
class Benchmark:
    """One benchmark module and its arguments per profile."""

    name: str
    quick: tuple[str, ...]
    full: tuple[str, ...] = ()


READS_QUICK: tuple[str, ...] = ("--get-all-calls", "200", "--query-runs", "10")
"""The read phases' quick sizes, the same for ``bench.core`` and its Geode peer (10,000
entries and 100 keys a call are both's defaults), so that their rows pair."""

BENCHMARKS: tuple[Benchmark, ...] = (
    # 10 subscribers: the count the core targets are set at (and the Geode peer's clients).
    Benchmark(
        "core",
        ("--ops", "10000", "--subscribers", "10", "--latency-seconds", "5", *READS_QUICK),
    ),
    Benchmark("durable_replay", ("--events", "20000")),
    Benchmark("failover", ("--rate", "1000", "--seconds", "15", "--ops", "10000")),
    Benchmark("gateway", ("--events", "5000", "--seconds", "8", "--warmup-seconds", "3")),
    # A parallel sender's backlog drained by 1 and 2 shards (full: 1, 2 and 4 of 20,000).
    Benchmark("gateway_shards", ("--shards", "1,2", "--events", "5000")),
    # core's quick sizes, so its rows pair with core's; the failover phase as bench.failover.
    Benchmark(
        "peers.geode",
        (
            "--ops",
            "10000",
            "--subscribers",
            "10",
            "--latency-seconds",
            "5",
            "--failover-rate",
            "1000",
            "--failover-seconds",
            "15",
            *READS_QUICK,
        ),
    ),
    Benchmark("spark_read", ("--events", "200000", "--entries", "50000")),
    # Continuous queries beside interest and raw Kafka, and their server CPU per change at 1,
    # 10 and 100 holders / distinct CQs; then Geode's CQ on the same workload (its rows take
    # regionbus's figure from bench.cq's).
    Benchmark(
        "cq",
        (
            "--ops",
            "5000",
            "--subscribers",
            "10",
            "--rate",
            "500",
            "--latency-seconds",
            "5",
            "--scaling-ops",
            "1000",
        ),
    ),
    Benchmark(
        "peers.geode_cq",
        ("--ops", "5000", "--subscribers", "10", "--rate", "500", "--latency-seconds", "5"),
    ),
    # 1, 10 and 100 live subscribers; 1, 16 and 64 buckets; 1, 10 and 100 subscribers
    # registered and away (full: and 1,000). core's 10,000 puts: at 2,000 the raw baselines
    # measured mostly their own start-up.
    Benchmark(
        "scaling",
        (
            *("--ops", "10000", "--latency-seconds", "3", "--subscribers", "1,10,100"),
            *("--registered-subscribers", "1,10,100", "--registered-ops", "5000"),
        ),
        ("--subscribers-per-process", "50"),
    ),
    # What regions, buckets and CQs that see no traffic cost a busy region's puts (flat is
    # the goal); full: its defaults, 1,000 regions and CQs, Geode's 113 buckets.
    Benchmark(
        "idle_cost",
        (
            *("--regions", "1,100", "--buckets", "1,16", "--cqs", "1,100"),
            *("--seconds", "5", "--ops", "2000"),
        ),
    ),
    # The fleet issue's goals: registered, crashed, connecting, oversized, stalled clients.
    # Full: 9,900 durable clients away beside 100 subscribers, 200 killed, 200 connects,
    # 200 ALL_KEYS registrations at once over 100,000 entries.
    Benchmark(
        "fleet",
        (
            *("--durable-clients", "1000", "--live-subscribers", "20", "--sampled", "20"),
            *("--seconds", "10", "--connects", "100", "--cleanup-clients", "50"),
            *("--stalled-subscribers", "20", "--stalled-seconds", "8"),
            *("--idle-caches", "50", "--fanout-subscribers", "1,10,100"),
            *("--fanout-ops", "5000"),
            *("--storm-clients", "40", "--storm-entries", "20000", "--storm-connects", "1000"),
        ),
    ),
)
"""Every benchmark, in the order they run."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """How one benchmark's run ended."""

    name: str
    exit_code: int
    seconds: float
    load_before: str
    output_tail: str


def _load_average() -> str:
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "?"


def run_logged(
    command: list[str],
    environment: dict[str, str],
    log_path: Path,
    timeout_s: float,
    name: str,
    interval_s: float = DEFAULT_INTERVAL_S,
) -> int:
    """Run ``command`` with its output to ``log_path``. Without a terminal, print a line
    every ``interval_s`` seconds naming it and the last line of its log, so a redirected
    run shows it is alive and where it is.

    Returns:
        Its exit code, 124 when it ran longer than ``timeout_s`` seconds (then it is killed).
    """
    heartbeat = Heartbeat(
        lambda: f"{name} running; its log ends: {last_line(log_path)}",
        sys.stdout,
        interval_s=interval_s,
        enabled=not sys.stdout.isatty(),
    )
    with log_path.open("wb") as log, heartbeat:
        try:
            return subprocess.run(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=environment,
                timeout=timeout_s,
                check=False,
            ).returncode
        except subprocess.TimeoutExpired:
            return 124


def run_benchmark(
    benchmark: Benchmark, profile: str, summary_file: Path, log_dir: Path, timeout_s: float
) -> Outcome:
    """Run one benchmark module in a child process; its rows go to ``summary_file``.

    Args:
        benchmark: What to run.
        profile: ``"quick"`` or ``"full"``.
        summary_file: The JSON-lines file the child appends its rows to.
        log_dir: Where its whole output is kept (``<name>.log``).
        timeout_s: Longest run, in seconds; then it is killed and counted failed.

    Returns:
        Its exit code (124 on timeout), duration, the load average before it and the
        last lines of its output.
    """
    arguments = benchmark.quick if profile == "quick" else benchmark.full
    command = [sys.executable, "-m", f"bench.{benchmark.name}", *arguments]
    environment = {**os.environ, SUMMARY_FILE_ENV: str(summary_file), "PYTHONUNBUFFERED": "1"}
    log_path = log_dir / f"{benchmark.name}.log"
    load_before = _load_average()
    started = time.monotonic()
    code = run_logged(command, environment, log_path, timeout_s, f"bench.{benchmark.name}")
    tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-15:])
    return Outcome(benchmark.name, code, time.monotonic() - started, load_before, tail)


def write_report(path: Path, rows: list[SummaryRow], outcomes: list[Outcome], profile: str) -> None:
    """Write the Markdown report: machine, per-benchmark outcome, the table, failures."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# regionbus benchmarks",
        "",
        f"Run {now} on {platform.node()} ({os.cpu_count()} cores, Python "
        f"{platform.python_version()}), profile `{profile}`, by `python -m bench.all`.",
        "Each figure is beside its baseline measured in the same run: raw Kafka / Redis, or",
        "a peer system (rows `... vs Apache Geode`, `... vs MirrorMaker 2`);",
        "machines are noisy, so compare the ratios, not the absolute figures.",
        "",
        "| benchmark | exit | seconds | load average before (1, 5, 15 min) |",
        "|---|---:|---:|---|",
        *(f"| {o.name} | {o.exit_code} | {o.seconds:.0f} | {o.load_before} |" for o in outcomes),
        "",
        markdown_table(rows),
    ]
    for outcome in outcomes:
        if outcome.exit_code != 0:
            lines += [
                f"## {outcome.name} failed (exit {outcome.exit_code})",
                "",
                "```",
                outcome.output_tail,
                "```",
                "",
            ]
    path.write_text("\n".join(lines), encoding="utf-8")


@click.command()
@click.option(
    "--profile",
    type=click.Choice(["quick", "full"]),
    default="quick",
    show_default=True,
    help="quick: smaller sizes; full: each benchmark's defaults.",
)
@click.option(
    "--only",
    multiple=True,
    type=click.Choice([b.name for b in BENCHMARKS]),
    help="Run only these benchmarks (repeatable).",
)
@click.option(
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("bench/RESULTS.md"),
    show_default=True,
    help="Markdown report.",
)
@click.option(
    "--timeout-s", default=1800.0, show_default=True, help="Longest run of one benchmark, seconds."
)
def main(profile: str, only: tuple[str, ...], output: Path, timeout_s: float) -> None:
    """Run every benchmark in turn and write one Markdown table of figures and ratios.

    Exits with status 1 when a benchmark failed (the report still lists the others).
    """
    console = Console()
    chosen = [b for b in BENCHMARKS if not only or b.name in only]
    log_dir = Path(tempfile.mkdtemp(prefix="regionbus-bench-all-"))
    summary_file = log_dir / "summary.jsonl"
    outcomes = []
    for benchmark in chosen:
        console.print(
            f"running bench.{benchmark.name} ({profile}); log {log_dir}/{benchmark.name}.log",
            highlight=False,
        )
        outcome = run_benchmark(benchmark, profile, summary_file, log_dir, timeout_s)
        outcomes.append(outcome)
        verdict = "ok" if outcome.exit_code == 0 else f"FAILED (exit {outcome.exit_code})"
        console.print(f"  {verdict} in {outcome.seconds:.0f} s", highlight=False)
    rows = with_peers(read(summary_file))
    write_report(output, rows, outcomes, profile)
    console.print(markdown_table(rows), highlight=False, markup=False)
    console.print(f"report written to {output}", highlight=False)
    if any(o.exit_code != 0 for o in outcomes):
        sys.exit(1)


if __name__ == "__main__":
    main()
