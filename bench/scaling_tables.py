"""``bench.scaling``'s tables on the terminal: each series with its ratios to the raw
baselines, the subscriber series beside Apache Geode, and the registered subscribers'
series (the figures and cells are :mod:`bench.scaling_figures`')."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from bench.scaling_figures import (
    COLUMNS,
    GEODE_COLUMNS,
    REGISTERED_COLUMNS,
    REGISTERED_TITLE,
    GeodePoint,
    PointFigures,
    RegisteredPoint,
    cells,
    geode_cells,
    geode_title,
    registered_cells,
    series,
)


def print_tables(
    points: Sequence[PointFigures],
    console: Console,
    *,
    fixed_subscribers: int,
    ops: int,
    rate: int,
    registered_ops: int,
    geode: Sequence[GeodePoint] = (),
    registered: Sequence[RegisteredPoint] = (),
) -> None:
    """Print both series, each rate with its ratio to the raw baseline; then, with Geode's
    points, the subscriber series beside them; then the registered subscribers' series.

    Args:
        points: The figures of both series.
        console: Where they are printed.
        fixed_subscribers: The subscriber count of the bucket series.
        ops: Puts per point (titles).
        rate: Puts per second of the latency phase (titles).
        registered_ops: Puts per registered count (titles).
        geode: Apache Geode's points, if run.
        registered: The registered subscribers' points, if run.
    """
    for name, members in series(points, fixed_subscribers).items():
        _print_table(
            console,
            f"scaling by {name}: {ops:,} puts, latency at {rate} puts/s",
            COLUMNS,
            [cells(point) for point in members],
        )
    if geode:
        _print_table(
            console,
            f"{geode_title(geode)}: {ops:,} puts",
            GEODE_COLUMNS,
            geode_cells(points, geode),
        )
    if registered:
        _print_table(
            console,
            f"{REGISTERED_TITLE}: {registered_ops:,} puts a count",
            REGISTERED_COLUMNS,
            registered_cells(points, registered),
        )


def _print_table(
    console: Console, title: str, columns: Sequence[str], rows: Sequence[list[str]]
) -> None:
    table = Table(title=title)
    for column in columns:
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(*row)
    console.print(table)


__all__ = ["print_tables"]
