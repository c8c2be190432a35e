"""bench.gateway's printed table: MirrorMaker 2's columns only when it ran, the drain
figure only when it was measured."""

from __future__ import annotations

from rich.console import Console

from bench.gateway import report
from bench.gateway_raw import GatewayBenchOptions, PhaseResult

REGIONBUS = PhaseResult(
    3000.0, 190.0, 590.0, 630.0, 2500, source_events_per_s=3100.0, drain_events_per_s=2400.0
)
RAW = PhaseResult(60000.0, 4.0, 227.0, 277.0, 2500)


def _printed(mm2: PhaseResult | None) -> str:
    console = Console(width=200, record=True)
    report(REGIONBUS, RAW, GatewayBenchOptions(), console, mm2)
    return console.export_text()


def test_without_mirror_maker_2_its_columns_are_left_out_and_a_line_says_it_was_not_run() -> None:
    text = _printed(None)
    assert "MirrorMaker 2 was not run" in text
    assert "nan" not in text
    assert "÷ MM2" not in text
    assert "0.05x" in text  # regionbus ÷ raw stays
    assert "3,100" in text  # site A's puts acked/s
    assert "2,400" in text  # drained from a backlog


def test_with_mirror_maker_2_its_figures_and_ratios_are_printed() -> None:
    text = _printed(PhaseResult(49000.0, 5.0, 192.0, 200.0, 2500))
    assert "was not run" not in text
    assert "49,000" in text
    assert "3.07x" in text  # lag p99 590 ÷ 192


def test_without_a_drain_figure_its_row_is_left_out() -> None:
    console = Console(width=200, record=True)
    rb = PhaseResult(3000.0, 190.0, 590.0, 630.0, 2500, source_events_per_s=3100.0)
    report(rb, RAW, GatewayBenchOptions(), console, None)
    text = console.export_text()
    assert "drained" not in text
    assert "nan" not in text


def test_the_send_when_idle_run_has_rows_of_its_own_beside_the_raw_mirror() -> None:
    console = Console(width=200, record=True)
    idle = PhaseResult(lag_p50_ms=40.0, lag_p99_ms=170.0, lag_max_ms=290.0, lag_samples=10000)
    report(REGIONBUS, RAW, GatewayBenchOptions(), console, None, idle)
    text = console.export_text()
    assert "lag p99 at 500/s, send_when_idle (ms)" in text
    assert "170.0" in text
    assert "0.75x" in text  # send_when_idle's lag p99 170 ÷ the raw mirror's 227
    assert "nan" not in text


def test_a_warm_up_as_long_as_the_lag_phase_is_refused_before_anything_starts() -> None:
    from click.testing import CliRunner

    from bench.gateway import main

    result = CliRunner().invoke(main, ["--seconds", "8"])  # the default warm-up is 30 s
    assert result.exit_code == 2
    assert "--warmup-seconds (30.0) must be below --seconds (8.0)" in result.output
