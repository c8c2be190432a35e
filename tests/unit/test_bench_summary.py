"""``bench.all``'s report: rows emitted by benchmarks, read back, written as one table."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import pytest

from bench.all import Outcome, write_report
from bench.summary import SUMMARY_FILE_ENV, SummaryRow, emit, markdown_table, read


def test_rows_emitted_by_a_benchmark_are_read_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "summary.jsonl"
    rows = [
        SummaryRow("core", "ops applied/s", 12_000.0, 48_000.0, "produce→consume"),
        SummaryRow("core", "p99 (ms)", 30.0, 10.0, "relay p99", higher_is_better=False),
        SummaryRow("failover", "lost", 0.0, math.nan, "must be 0"),
    ]
    emit(rows[:1])  # not run by bench.all: nothing written
    assert not path.exists()
    monkeypatch.setenv(SUMMARY_FILE_ENV, str(path))
    emit(rows[:2])
    emit(rows[2:])
    back = read(path)
    assert back[:2] == rows[:2]
    assert back[2].benchmark == "failover" and math.isnan(back[2].baseline)


def test_the_table_has_one_line_per_figure_with_its_ratio() -> None:
    table = markdown_table(
        [
            SummaryRow("core", "ops applied/s", 12_000.0, 48_000.0, "produce→consume"),
            SummaryRow("core", "p99 (ms)", 30.0, 10.0, "relay p99", higher_is_better=False),
            SummaryRow("failover", "lost", 0.0, math.nan, "must be 0"),
        ]
    )
    lines = table.splitlines()
    assert lines[0].startswith("| benchmark | figure | regionbus | baseline | baseline is")
    assert lines[2] == ("| core | ops applied/s | 12,000 | 48,000 | produce→consume | 0.25x |")
    assert lines[3] == "| core | p99 (ms) | 30.00 | 10.00 | relay p99 | 3.00x (lower is better) |"
    assert lines[4] == "| failover | lost | 0.00 | n/a | must be 0 | n/a |"


def test_the_report_lists_failed_benchmarks_with_their_output(tmp_path: Path) -> None:
    output = tmp_path / "RESULTS.md"
    write_report(
        output,
        [SummaryRow("core", "ops applied/s", 1.0, 2.0, "raw")],
        [
            Outcome("core", 0, 61.0, "1.0 1.0 1.0", ""),
            Outcome("gateway", 1, 5.0, "2.0 1.0 1.0", "Traceback ...\nBenchError: boom"),
        ],
        "quick",
    )
    text = output.read_text()
    assert "| core | 0 | 61 | 1.0 1.0 1.0 |" in text
    assert "| core | ops applied/s | 1.00 | 2.00 | raw | 0.50x |" in text
    assert "## gateway failed (exit 1)" in text and "BenchError: boom" in text


def test_a_benchmark_run_without_a_terminal_prints_a_progress_line_with_its_log_tail(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from bench.all import run_logged

    child = "import time; print('phase one', flush=True); time.sleep(1.5)"
    log = tmp_path / "child.log"
    code = run_logged(
        [sys.executable, "-c", child], dict(os.environ), log, 30.0, "bench.x", interval_s=0.2
    )

    assert code == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if "bench.x running" in line]
    assert lines, "no progress line"
    assert any(line.endswith("its log ends: phase one") for line in lines)
    assert log.read_text() == "phase one\n"
