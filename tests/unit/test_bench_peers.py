"""The peers' pure logic: the Geode harness's answer, its rows paired with regionbus's rows
of the same run, MirrorMaker 2's configuration and rows."""

from __future__ import annotations

import json
import math

import pytest

from bench.core import summary_rows as core_rows
from bench.gateway_raw import GatewayBenchOptions, PhaseResult
from bench.peers.geode_figures import CORE_VS_GEODE, FAILOVER_VS_GEODE, parse, summary_rows
from bench.peers.mirror_maker import mirror_maker_rows, mm2_properties
from bench.reads_figures import ReadFigures, ReadOptions, ReadSeries
from bench.reads_figures import summary_rows as read_rows
from bench.report import Figures, Latency, Targets, Throughput
from bench.summary import SummaryRow, markdown_table, with_peers

# As the harness prints it: progress on stderr, one JSON object last on stdout, NaN bare.
HARNESS_STDOUT = (
    '{"peer":"Apache Geode","geode_version":"1.15.1","settings":{"ops":"2000"},'
    '"latency":{"count":400,"first_ns":1,"last_ns":2,"latency_samples":200,"p50_ms":1.5,'
    '"p99_ms":30.0,"max_ms":34.0,"sent":400},'
    '"throughput":{"sent":2000,"acked":2000,"errors":0,"writer_threads":16,'
    '"puts_per_s":8000.0,"subscribers":4,"counts":[2000,2000,2000,2000],"delivered":8000,'
    '"events_per_s":30000.0,"complete":true},'
    '"failover":{"sent":800,"acked":800,"put_errors":0,"killed":"failover-server-1",'
    '"acked_never_delivered":2,"longest_put_after_kill_ms":6067.4,"count":801,'
    '"distinct":798,"duplicates":1,"kill_to_first_event_after_kill_ms":6085.3,'
    '"longest_silence_after_kill_ms":6085.3,"p50_before_kill_ms":1.8,'
    '"p99_before_kill_ms":NaN,"max_latency_after_kill_ms":6061.5}}\n'
)


def _throughput(acked_per_s: float, delivered_per_s: float, readers: int) -> Throughput:
    return Throughput(10, 10, 0, acked_per_s, readers, 10, delivered_per_s, 1.0, True, {})


def _latency(p50_ms: float, p99_ms: float) -> Latency:
    return Latency(10, 10, 10, 1000.0, p50_ms, p99_ms, p99_ms)


def test_the_harness_answer_is_read_from_its_last_json_line() -> None:
    figures = parse("warming up\n" + HARNESS_STDOUT)
    assert figures.version == "1.15.1"
    assert (figures.puts_per_s, figures.events_per_s, figures.subscribers) == (8000.0, 30000.0, 4)
    assert (figures.p50_ms, figures.p99_ms, figures.complete) == (1.5, 30.0, True)
    assert figures.failover is not None
    assert (figures.failover.acked_never_delivered, figures.failover.duplicates) == (2, 1)
    assert math.isnan(figures.failover.p99_before_kill_ms)


def test_a_run_without_the_failover_phase_has_no_failover_figures() -> None:
    answer = json.loads(HARNESS_STDOUT.replace("NaN", "null"))
    del answer["failover"]
    figures = parse(json.dumps(answer))
    assert figures.failover is None
    assert [row.benchmark for row in summary_rows(figures)] == [CORE_VS_GEODE] * 4


@pytest.mark.parametrize(
    "stdout",
    ["", "geode-peer: no figures\n", '{"peer": "Apache Geode", "latency": {}}'],
)
def test_an_answer_without_figures_is_an_error(stdout: str) -> None:
    with pytest.raises(ValueError, match="Geode harness"):
        parse(stdout)


def test_geode_rows_take_regionbus_figures_from_the_core_and_failover_rows_of_the_run() -> None:
    core = core_rows(
        Figures(
            settings={},
            regionbus_throughput=_throughput(4000.0, 15000.0, 4),
            regionbus_latency=_latency(3.0, 60.0),
            raw_throughput=_throughput(40000.0, 40000.0, 1),
            raw_fanout=_throughput(40000.0, 150000.0, 4),
            raw_relay_latency=_latency(2.0, 20.0),
            targets=Targets(),
        )
    )
    failover = [
        SummaryRow(
            "failover",
            "kill → every orphaned bucket delivering (ms)",
            6000.0,
            100.0,
            "two-hop relay p99",
            higher_is_better=False,
        ),
        SummaryRow(
            "failover", "acknowledged puts lost / listener duplicates", 0.0, math.nan, "must be 0"
        ),
    ]
    geode = summary_rows(parse(HARNESS_STDOUT))
    rows = with_peers([*core, *failover, *geode])
    peers = {(row.benchmark, row.figure): row for row in rows[len(core) + 2 :]}
    ops = peers[(CORE_VS_GEODE, "ops applied/s")]
    assert (ops.regionbus, ops.baseline, ops.ratio) == (4000.0, 8000.0, 0.5)
    assert peers[(CORE_VS_GEODE, "events delivered/s (4 subscribers)")].regionbus == 15000.0
    p99 = peers[(CORE_VS_GEODE, "put→listener latency p99 (ms)")]
    assert (p99.ratio, p99.higher_is_better) == (2.0, False)
    gap = peers[(FAILOVER_VS_GEODE, "kill → delivering puts sent after the kill (ms)")]
    assert (gap.regionbus, gap.baseline) == (6000.0, 6085.3)
    lost = peers[(FAILOVER_VS_GEODE, "acknowledged puts lost / listener duplicates")]
    assert (lost.regionbus, lost.baseline) == (0.0, 3.0)
    assert "| core vs Apache Geode | ops applied/s | 4,000 | 8,000 |" in markdown_table(rows)


def _with_reads(stdout: str) -> str:
    answer = json.loads(stdout.replace("NaN", "null"))
    series = {"calls": 500, "per_s": 400.0, "p50_ms": 2.0, "p99_ms": 8.0, "items": 50_000}
    answer["reads"] = {
        "entries": 10_000,
        "keys_per_call": 100,
        "oql": "SELECT * FROM /bench_query v WHERE v.price >= $1",
        "load_average": "4.0 5.0 6.0",
        "get_all": series,
        "query": {**series, "calls": 20, "per_s": 25.0, "p50_ms": 40.0, "items": 20_000},
    }
    return json.dumps(answer)


def test_geode_read_rows_pair_with_the_core_read_rows_of_the_run() -> None:
    figures = parse(_with_reads(HARNESS_STDOUT))
    assert figures.reads is not None and figures.reads.get_all.per_s == 400.0
    ours = ReadSeries(500, 200.0, 4.0, 16.0, 50_000)
    core = read_rows(
        ReadFigures(
            ReadOptions(),
            ours,
            ours,
            ReadSeries(20, 5.0, 200.0, 400.0, 20_000),
            ours,
            1000,
            (1.0, 2.0, 3.0),
        )
    )
    rows = with_peers([*core, *summary_rows(figures)])
    peers = {row.figure: row for row in rows if row.benchmark == CORE_VS_GEODE}
    calls = peers["get_all of 100 keys, calls/s"]
    assert (calls.regionbus, calls.baseline, calls.ratio) == (200.0, 400.0, 0.5)
    p99 = peers["get_all of 100 keys, p99 (ms)"]
    assert (p99.ratio, p99.higher_is_better) == (2.0, False)
    query = peers["OQL query over 10,000 entries (a tenth selected), p50 (ms)"]
    assert (query.regionbus, query.baseline, query.ratio) == (200.0, 40.0, 5.0)
    # The core rows carry the load average of their phases beside the raw Redis baseline.
    assert "load 1.0 2.0 3.0" in core[0].baseline_name
    assert "load 4.0 5.0 6.0" in calls.baseline_name and "load 4.0 5.0 6.0" in query.baseline_name
    assert len(peers) == 4 + 6


def test_a_harness_answer_without_read_phases_has_no_read_rows() -> None:
    figures = parse(HARNESS_STDOUT)
    assert figures.reads is None
    assert not any("get_all" in row.figure for row in summary_rows(figures))


def test_a_geode_row_whose_regionbus_row_did_not_run_stays_not_available() -> None:
    rows = with_peers(summary_rows(parse(HARNESS_STDOUT)))
    assert all(math.isnan(row.regionbus) for row in rows)
    assert "| core vs Apache Geode | ops applied/s | n/a | 8,000 |" in markdown_table(rows)


def test_mirror_maker_mirrors_one_topic_one_way_on_single_broker_sites() -> None:
    properties = mm2_properties("127.0.0.1:1", "127.0.0.1:2", "mm2.abc", 100)
    lines = {line.split(" = ")[0]: line.split(" = ")[1] for line in properties.splitlines()}
    assert lines["a->b.enabled"] == "true" and lines["b->a.enabled"] == "false"
    assert lines["a->b.topics"] == "mm2.abc"
    assert lines["a.consumer.fetch.max.wait.ms"] == "100"
    assert all(v == "1" for k, v in lines.items() if k.endswith("replication.factor"))


def test_mirror_maker_rows_compare_the_sender_with_mirror_maker() -> None:
    options = GatewayBenchOptions(rate=500)
    sender = PhaseResult(events_per_s=1000.0, lag_p99_ms=400.0, drain_events_per_s=4000.0)
    mm2 = PhaseResult(events_per_s=20000.0, lag_p99_ms=200.0)
    rows = mirror_maker_rows(sender, mm2, options)
    assert [(row.figure, row.ratio) for row in rows] == [
        ("events/s through one serial sender", 0.05),
        ("events/s drained from a backlog by one serial sender", 0.2),
        ("replication lag p99 at 500/s (ms)", 2.0),
    ]
    assert mirror_maker_rows(sender, None, options) == []
