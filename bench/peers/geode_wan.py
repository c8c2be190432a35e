"""The Apache Geode peer of ``bench.gateway``: two Geode 1.15 sites on this machine joined
by a WAN gateway, the same events, beside regionbus's gateway, MirrorMaker 2 and the raw
mirror.

``python -m bench.peers.geode_wan`` resolves the Geode jars on first use
(``scripts/bootstrap.sh --peers``), then runs the Java harness's ``wan`` command
(``bench/peers/geode/src/main/java/.../Wan.java``) once per sender kind: site A (a locator
and a server, distributed system 1) whose region ``bench`` has gateway sender ``to-b``,
serial or parallel, and site B (a locator and a server, distributed system 2) with a
gateway receiver and a listener recording arrivals. Every gateway setting is Geode's
default (batch size 100, batch time interval 1000 ms, 5 dispatcher threads for a serial
sender), as regionbus's sender runs with its Geode-derived defaults in ``bench.gateway``.
It measures, with ``bench.gateway``'s sizes:

- throughput: ``--events`` puts by site A's server, as fast as one thread puts them,
  over the time from the first put to the last arrival at site B;
- lag: puts paced at ``--rate`` for ``--seconds``, the latency from each put's stamped
  send time to site B's listener (p50 / p99 / max), the first ``warmup_seconds`` left out.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from bench import progress
from bench.gateway_raw import GatewayBenchOptions, PhaseResult
from bench.peers.jvm import run_geode_main
from bench.summary import SummaryRow

log = logging.getLogger("regionbus.bench.geode")

MODES = ("serial", "parallel")
"""The gateway sender kinds measured, in order."""

_TIMEOUT_S = 900.0


def parse_wan(stdout: str) -> tuple[str, PhaseResult]:
    """The Geode version and the figures of the harness's last stdout line.

    Raises:
        RuntimeError: the line is not the harness's JSON, or events were lost.
    """
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        raise RuntimeError("the Geode WAN harness printed nothing")
    data: dict[str, Any] = json.loads(lines[-1])
    for sent, received in (("events", "received"), ("lag_events", "lag_received")):
        if data[received] != data[sent]:
            raise RuntimeError(f"Geode's site B received {data[received]} of {data[sent]} events")
    result = PhaseResult(
        events_per_s=float(data["events_per_s"]),
        lag_p50_ms=float(data["lag_p50_ms"]),
        lag_p99_ms=float(data["lag_p99_ms"]),
        lag_max_ms=float(data["lag_max_ms"]),
        lag_samples=int(data["lag_samples"]),
    )
    return str(data["geode_version"]), result


def geode_wan(
    options: GatewayBenchOptions, work_dir: Path, modes: tuple[str, ...] = MODES
) -> dict[str, PhaseResult]:
    """Run the two Geode sites once per sender kind, with ``options``' sizes.

    Args:
        options: ``events``, ``rate``, ``seconds``, ``warmup_seconds``, ``value_bytes``
            (``batch_size`` and ``batch_time_interval_ms`` are Geode's defaults already).
        work_dir: Where each run's members log (``<mode>/site-a.log``, ...).
        modes: Sender kinds, of :data:`MODES`.

    Returns:
        ``{mode: figures}``.

    Raises:
        PeerSetupError: Java or the jars are missing and cannot be resolved.
        RuntimeError: a run failed, took over 15 minutes, or lost events.
    """
    figures: dict[str, PhaseResult] = {}
    for mode in modes:
        mode_dir = work_dir / mode
        mode_dir.mkdir(parents=True, exist_ok=True)
        stdout = run_geode_main(
            "wan",
            {
                "mode": mode,
                "events": options.events,
                "rate": options.rate,
                "seconds": max(1, round(options.seconds)),
                "lag_warmup_s": options.warmup_seconds,
                "value_bytes": options.value_bytes,
            },
            mode_dir,
            _TIMEOUT_S,
        )
        version, figures[mode] = parse_wan(stdout)
        log.info("Geode %s WAN, %s sender: %s", version, mode, figures[mode])
    return figures


def geode_wan_rows(
    rb: PhaseResult, geode: dict[str, PhaseResult], options: GatewayBenchOptions
) -> list[SummaryRow]:
    """``bench.all`` rows whose baseline is Geode's serial sender (none when it did not
    run): regionbus's one serial sender against Geode's."""
    serial = geode.get("serial")
    if serial is None:
        return []
    return [
        SummaryRow(
            "gateway vs Apache Geode WAN",
            "events/s through one serial sender",
            rb.events_per_s,
            serial.events_per_s,
            "Geode serial sender events/s",
        ),
        SummaryRow(
            "gateway vs Apache Geode WAN",
            f"replication lag p99 at {options.rate}/s (ms)",
            rb.lag_p99_ms,
            serial.lag_p99_ms,
            "Geode serial sender lag p99",
            higher_is_better=False,
        ),
    ]


def print_geode_wan(
    geode: dict[str, PhaseResult], options: GatewayBenchOptions, console: Console
) -> None:
    """Print Geode's figures per sender kind."""
    table = Table(title="Apache Geode WAN: two sites on this machine, Geode's default gateway")
    table.add_column("figure")
    for mode in geode:
        table.add_column(f"{mode} sender", justify="right")
    table.add_row("events/s", *(f"{r.events_per_s:,.0f}" for r in geode.values()))
    for name in ("p50", "p99", "max"):
        table.add_row(
            f"lag {name} at {options.rate}/s (ms)",
            *(f"{getattr(r, f'lag_{name}_ms'):,.1f}" for r in geode.values()),
        )
    console.print(table)


@click.command()
@click.option("--events", default=20_000, show_default=True, help="Throughput phase events.")
@click.option("--rate", default=500, show_default=True, help="Lag phase events per second.")
@click.option("--seconds", default=20.0, show_default=True, help="Lag phase length (s).")
@click.option("--value-bytes", default=200, show_default=True, help="Value size in bytes.")
@click.option(
    "--mode",
    "modes",
    type=click.Choice(MODES),
    multiple=True,
    default=MODES,
    show_default=True,
    help="Sender kinds to run (repeat the option for several).",
)
@click.option("-v", "--verbose", is_flag=True, help="Log each run's command.")
def main(
    events: int,
    rate: int,
    seconds: float,
    value_bytes: int,
    modes: tuple[str, ...],
    verbose: bool,
) -> None:
    """Measure Apache Geode's WAN gateway between two sites on this machine."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING)
    options = GatewayBenchOptions(
        events=events, rate=rate, seconds=seconds, value_bytes=value_bytes
    )
    console = Console()
    work_dir = progress.log_dir("geode-wan", console)
    console.print(f"Geode WAN: {', '.join(modes)} sender(s)")
    try:
        figures = geode_wan(options, work_dir, modes)
    except RuntimeError as exc:
        console.print(f"[red]{exc}[/red]")
        sys.exit(1)
    print_geode_wan(figures, options, console)


if __name__ == "__main__":
    main()


__all__ = ["MODES", "geode_wan", "geode_wan_rows", "parse_wan", "print_geode_wan"]
