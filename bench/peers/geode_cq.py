"""Apache Geode's continuous queries in the peer harness: the workload of ``bench.cq``.

``python -m bench.peers.geode_cq`` runs the Geode harness (:mod:`bench.peers.geode`) with
``--cq``: one Geode 1.15.1 cache server, and every subscriber client cache holding the CQ
``SELECT * FROM /bench`` instead of ALL_KEYS interest. It measures put → CQ listener
latency at ``--rate`` puts/s with one CQ client, and CQ events delivered per second with
``--subscribers`` CQ clients. Geode's values here are byte arrays, which have no attributes
to test, so its CQ has no WHERE clause: every put is in its result set, as every put is in
``bench.cq``'s (whose servers read ``v.n`` of a JSON value: more work on regionbus's side).

Under ``bench.all`` its rows have Geode as baseline and take regionbus's figure from the
``bench.cq`` row of the same run.
"""

from __future__ import annotations

import logging
import math
import sys
from typing import Any

import click
from rich.console import Console

from bench import progress
from bench.peers.geode import report, run_harness
from bench.peers.geode_figures import GeodeFigures
from bench.summary import SummaryRow, emit

GEODE_CQ_QUERY = "SELECT * FROM /bench"
CQ_VS_GEODE = "cq vs Apache Geode"

_POSITIVE = click.IntRange(min=1)


def summary_rows(figures: GeodeFigures) -> list[SummaryRow]:
    """Rows whose baseline is Geode's CQ; regionbus's figure comes from ``bench.cq``."""
    geode = f"Geode {figures.version} CQ"
    delivered = f"CQ events delivered/s ({figures.subscribers} clients)"
    return [
        SummaryRow(
            CQ_VS_GEODE,
            delivered,
            math.nan,
            figures.events_per_s,
            f"{geode} to {figures.subscribers} client caches",
            True,
            ("cq", delivered),
        ),
        *(
            SummaryRow(
                CQ_VS_GEODE,
                f"put→CQ listener {name} (ms)",
                math.nan,
                getattr(figures, f"{name}_ms"),
                f"{geode} {name}",
                False,
                ("cq", f"put→CQ listener {name} (ms)"),
            )
            for name in ("p50", "p99")
        ),
    ]


@click.command()
@click.option("--ops", default=20_000, type=_POSITIVE, show_default=True)
@click.option("--subscribers", default=10, type=_POSITIVE, show_default=True)
@click.option("--rate", default=500, type=_POSITIVE, show_default=True)
@click.option("--latency-seconds", default=10.0, show_default=True)
@click.option("--value-bytes", default=200, type=click.IntRange(min=8), show_default=True)
@click.option("--key-space", default=10_000, type=_POSITIVE, show_default=True)
@click.option("--warmup-seconds", default=1.0, show_default=True)
@click.option("--writer-threads", default=16, type=_POSITIVE, show_default=True)
@click.option("--idle-timeout-s", default=60.0, show_default=True)
@click.option("--timeout-s", default=1_200.0, show_default=True)
def main(timeout_s: float, **values: Any) -> None:
    """Measure Apache Geode's CQ with bench.cq's workload."""
    logging.basicConfig(level=logging.WARNING)
    console = Console()
    work_dir = progress.log_dir("peers.geode_cq", console)
    try:
        with progress.heartbeat(console):
            stderr_path = work_dir / "harness.stderr"
            progress.phase(console, "Geode CQ harness ...", lambda: progress.last_line(stderr_path))
            figures = run_harness(
                {**values, "failover": "false", "cq": GEODE_CQ_QUERY}, work_dir, timeout_s
            )
    except RuntimeError as exc:
        console.print(f"benchmark failed: {exc}", style="red", highlight=False, markup=False)
        sys.exit(1)
    report(figures, console)
    emit(summary_rows(figures))


if __name__ == "__main__":
    main()
