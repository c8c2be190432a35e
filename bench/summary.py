"""The figures every benchmark hands to ``python -m bench.all``: one row per figure, with
the baseline measured in the same run (raw Kafka / Redis, or a peer system such as Apache
Geode or MirrorMaker 2) and the ratio.

A benchmark calls :func:`emit` at its end; when ``bench.all`` runs it, the environment
variable :data:`SUMMARY_FILE_ENV` names a JSON-lines file the rows are appended to.
Run alone, a benchmark prints its own tables and :func:`emit` does nothing.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

SUMMARY_FILE_ENV = "BENCH_SUMMARY_FILE"
"""Names the JSON-lines file :func:`emit` appends to (set by ``bench.all``)."""


@dataclass(frozen=True, slots=True)
class SummaryRow:
    """One figure of a benchmark beside its baseline.

    Attributes:
        benchmark: The benchmark module, e.g. ``"core"``.
        figure: What was measured, with its unit, e.g. ``"ops applied/s"``.
        regionbus: The regionbus figure (NaN when not measured).
        baseline: The raw Kafka / Redis figure measured in the same run (NaN if none).
        baseline_name: What the baseline is, e.g. ``"produce→consume"``.
        higher_is_better: True for rates, False for latencies (how to read the ratio).
        regionbus_of: For a row whose baseline is a peer system (Apache Geode), the
            ``(benchmark, figure)`` of the row of the same run whose regionbus figure it
            compares; :func:`with_peers` fills ``regionbus`` from it. None otherwise.
    """

    benchmark: str
    figure: str
    regionbus: float
    baseline: float
    baseline_name: str
    higher_is_better: bool = True
    regionbus_of: tuple[str, str] | None = None

    @property
    def ratio(self) -> float:
        """``regionbus ÷ baseline``; NaN when either is missing or the baseline is 0."""
        if not self.baseline or math.isnan(self.baseline) or math.isnan(self.regionbus):
            return math.nan
        return self.regionbus / self.baseline


def emit(rows: Iterable[SummaryRow]) -> None:
    """Append ``rows`` to the file named by :data:`SUMMARY_FILE_ENV`, if it is set.

    Raises:
        OSError: the file cannot be written.
    """
    path = os.environ.get(SUMMARY_FILE_ENV)
    if not path:
        return
    with Path(path).open("a", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps(asdict(row), allow_nan=True) + "\n")


def read(path: Path) -> list[SummaryRow]:
    """The rows appended to ``path`` (none if it does not exist).

    Raises:
        ValueError: a line is not a row :func:`emit` wrote.
    """
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            fields = json.loads(line)
            if fields.get("regionbus_of") is not None:
                fields["regionbus_of"] = tuple(fields["regionbus_of"])
            rows.append(SummaryRow(**fields))
    return rows


def with_peers(rows: Sequence[SummaryRow]) -> list[SummaryRow]:
    """``rows`` with every peer row's regionbus figure taken from the row it names.

    A peer benchmark (``bench.peers.geode``) measures only the peer; the regionbus figure
    it is compared with comes from another benchmark of the same ``bench.all`` run
    (``regionbus_of``). A peer row whose source row is missing (that benchmark did not
    run, or with other sizes) keeps NaN, printed ``n/a``.
    """
    by_name = {(row.benchmark, row.figure): row for row in rows}
    filled = []
    for row in rows:
        source = by_name.get(row.regionbus_of) if row.regionbus_of else None
        filled.append(replace(row, regionbus=source.regionbus) if source else row)
    return filled


def _number(value: float) -> str:
    if math.isnan(value):
        return "n/a"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.2f}"


def markdown_table(rows: Iterable[SummaryRow]) -> str:
    """One Markdown table of every row: benchmark, figure, regionbus, baseline (raw Kafka /
    Redis, or a peer system), ratio."""
    lines = [
        "| benchmark | figure | regionbus | baseline | baseline is | regionbus ÷ baseline |",
        "|---|---|---:|---:|---|---:|",
    ]
    for row in rows:
        ratio = "n/a" if math.isnan(row.ratio) else f"{row.ratio:.2f}x"
        if not math.isnan(row.ratio):
            ratio += "" if row.higher_is_better else " (lower is better)"
        lines.append(
            f"| {row.benchmark} | {row.figure} | {_number(row.regionbus)} | "
            f"{_number(row.baseline)} | {row.baseline_name} | {ratio} |"
        )
    return "\n".join(lines) + "\n"


__all__ = ["SUMMARY_FILE_ENV", "SummaryRow", "emit", "markdown_table", "read", "with_peers"]
