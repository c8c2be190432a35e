"""What idle regions, buckets and continuous queries cost the puts of a busy region.

``python -m bench.idle_cost`` measures, on one Kafka and Redis (the embedded stack), the
cache server's CPU as three things it holds grow while they see no traffic:

* regions: ``--regions`` counts (default 1, 100, 1,000) of regions the server defines,
  every one but the written one holding a single entry, each count a server of its own;
* buckets: ``--buckets`` counts (default 1, 16, 113: Geode's default
  ``total-num-buckets``), each a server and namespace of its own, every put to a key of
  bucket 0 (the others idle);
* continuous queries: ``--cqs`` counts (default 1, 100, 1,000, the most a client may hold)
  registered by one connected client on a region nothing is written to, added in steps on
  one server.

At each point: the server's CPU per second over :data:`bench.fleet_fanout.IDLE_S` without
puts (its timers and scans), then its CPU per put at ``--rate`` lone puts per second for
``--seconds`` (where a timer's cost shows: a lone put shares the server's turns with
them), then over ``--ops`` pipelined puts (the broker's too). One region is written; with
one subscriber-less writer, no event is routed to anyone, so the figure is the apply,
reply and ``{ns}.events`` record of a put and whatever the server does beside it.

Flat means every point within :data:`bench.fleet_fanout.FLAT_FACTOR` of its series' first
point. It prints the table, writes it as Markdown (``--markdown``) and plots both CPU
figures and the idle CPU against each series (``--plot``, default
``bench/scaling_idle.png``, beside ``bench.scaling``'s ``bench/scaling.png``). Machines
are noisy: compare the shapes, not the absolute figures (``bench/README.md``).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import secrets
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

import click
from rich.console import Console
from rich.table import Table

from bench import progress
from bench.core import run_or_exit
from bench.cpu import CpuMeter
from bench.fleet_fanout import FLAT_FACTOR, cpu_per_put, idle_cpu_per_s, puts
from bench.load import paced_puts
from bench.options import CLIENT_FETCH_WAIT_MS, CLIENT_LINGER_MS, counts, json_option
from bench.server import server_services
from bench.services import REGION, BenchOptions, Services
from bench.summary import SummaryRow, emit
from regionbus.clients import BytesSerializer, ClientCache, ClientSettings, CqAttributes, Region
from regionbus.devstack import LocalStack
from regionbus.schemas.naming import bucket_of

IDLE_CQ_REGION: Final = "idle_cq"
"""The region the continuous queries are on: nothing is written to it."""

WARM_UP_PUTS: Final = 1_000
"""Untimed puts before a point's first reading (connections, Redis scripts)."""

KEYS_WRITTEN: Final = 1_000
"""Distinct keys the bucket series writes, all in bucket 0."""

SERIES: Final = ("regions", "buckets", "cqs")
"""The series, in the order they run and are plotted."""

_TITLES: Final = {
    "regions": "regions held",
    "buckets": "buckets",
    "cqs": "idle continuous queries",
}


@dataclass(frozen=True, slots=True)
class IdlePoint:
    """The server's CPU at one point of a series.

    Attributes:
        series: ``regions``, ``buckets`` or ``cqs``.
        count: How many the server holds.
        idle_ms_per_s: Its CPU without puts, milliseconds per second.
        lone_us_per_put: Its CPU per put at the run's rate of lone puts, µs.
        batched_us_per_put: Its CPU per put over the pipelined puts, µs.
        kafka_us_per_put: The broker's over the pipelined puts, µs (NaN when the stack
            was not started by this run).
        load: The load average before the point.
    """

    series: str
    count: int
    idle_ms_per_s: float
    lone_us_per_put: float
    batched_us_per_put: float
    kafka_us_per_put: float
    load: tuple[float, float, float]


@dataclass(frozen=True, slots=True)
class IdleOptions:
    """The options of one run (``python -m bench.idle_cost --help``)."""

    regions: tuple[int, ...]
    buckets: tuple[int, ...]
    cqs: tuple[int, ...]
    rate: int
    seconds: float
    ops: int


def flat(points: Sequence[IdlePoint], figure: str) -> bool:
    """Whether ``figure`` (an :class:`IdlePoint` field) stays within :data:`FLAT_FACTOR`
    of the first point's, over points of one series in count order."""
    first = getattr(points[0], figure)
    return all(getattr(p, figure) <= FLAT_FACTOR * first for p in points)


_SERVER_OPTIONS: Final = BenchOptions(
    ops=WARM_UP_PUTS,
    subscribers=0,
    rate=1,
    latency_seconds=1.0,
    value_bytes=24,
    fetch_wait_max_ms=CLIENT_FETCH_WAIT_MS,
    linger_ms=CLIENT_LINGER_MS,
    writer="async",
    window=WARM_UP_PUTS,
    chunk=WARM_UP_PUTS,
    key_space=WARM_UP_PUTS,
    warmup_seconds=0.0,
    idle_timeout_s=30.0,
)
"""The servers' and clients' Kafka settings: the clients' defaults (the load is this
module's own)."""


@contextmanager
def _server(
    local: LocalStack, work_dir: Path, name: str, regions: tuple[str, ...], env: dict[str, str]
) -> Iterator[tuple[Services, ClientCache]]:
    """A cache server of ``regions`` in a namespace of its own, and a writer's cache."""
    namespace = f"bench.{secrets.token_hex(3)}.{name}"
    with ExitStack() as stack:
        log_path = work_dir / f"server-{name}.log"
        services = server_services(
            stack, local, namespace, _SERVER_OPTIONS, log_path, env=env, regions=regions
        )
        writer = ClientCache(ClientSettings(**_settings(services, subscription_enabled=False)))
        stack.callback(writer.close)
        yield services, writer


def _settings(services: Services, **more: Any) -> dict[str, Any]:
    return services.client_settings(_SERVER_OPTIONS, **more)


def _measure(
    series: str,
    count: int,
    services: Services,
    writer: Region,
    options: IdleOptions,
    keys: Sequence[str] = (),
) -> IdlePoint:
    """One point: idle CPU, lone puts, pipelined puts (see the module docstring), to
    ``keys`` in turn when given."""
    load = os.getloadavg()
    server_pid = services.pids["server"]
    kafka_pid = services.pids.get("kafka")
    assert server_pid is None or isinstance(server_pid, int)
    assert kafka_pid is None or isinstance(kafka_pid, int)
    idle = idle_cpu_per_s(server_pid)
    meter = CpuMeter({"server": server_pid})
    meter.start()
    _, acked, _, _ = paced_puts(writer, options.rate, options.seconds, 24, keys)
    lone_s = meter.stop().get("server", math.nan)
    batched_us, kafka_us, _ = cpu_per_put(server_pid, kafka_pid, writer, options.ops, idle, keys)
    return IdlePoint(
        series,
        count,
        idle * 1e3,
        lone_s / acked * 1e6 if acked else math.nan,
        batched_us,
        kafka_us,
        (load[0], load[1], load[2]),
    )


def _region_points(
    local: LocalStack, work_dir: Path, options: IdleOptions, console: Console
) -> Iterator[IdlePoint]:
    for count in sorted(set(options.regions)):
        idle_regions = tuple(f"idle-{i:05d}" for i in range(count - 1))
        held = (REGION, *idle_regions)
        with _server(local, work_dir, f"r{count}", held, {}) as (services, cache):
            progress.phase(
                console,
                f"{count:,} regions held, {len(idle_regions):,} of them idle with an entry "
                f"each (load {_load()}) ...",
            )
            for name in idle_regions:
                cache.create_region(name, serializer=BytesSerializer()).put("entry", b"idle")
            writer = cache.create_region(REGION, serializer=BytesSerializer())
            puts(writer, WARM_UP_PUTS)
            yield _measure("regions", count, services, writer, options)


def _bucket_points(
    local: LocalStack, work_dir: Path, options: IdleOptions, console: Console
) -> Iterator[IdlePoint]:
    for count in sorted(set(options.buckets)):
        env = {"REGIONBUS_TOTAL_BUCKETS": str(count)}
        with _server(local, work_dir, f"b{count}", (REGION,), env) as (services, cache):
            progress.phase(
                console, f"{count:,} buckets, every put to bucket 0 (load {_load()}) ..."
            )
            writer = cache.create_region(REGION, serializer=BytesSerializer())
            keys = keys_in_bucket_0(count)
            puts(writer, WARM_UP_PUTS, keys)
            yield _measure("buckets", count, services, writer, options, keys)


def keys_in_bucket_0(total_buckets: int, count: int = KEYS_WRITTEN) -> list[str]:
    """``count`` keys of region ``bench`` that live in bucket 0 of ``total_buckets``: the
    bucket series writes only these, so every other bucket sees no traffic."""
    found: list[str] = []
    for n in itertools.count():
        key = f"b0-{n}"
        if bucket_of(REGION, key, total_buckets) == 0:
            found.append(key)
            if len(found) == count:
                return found
    raise AssertionError("unreachable")


def _cq_points(
    local: LocalStack, work_dir: Path, options: IdleOptions, console: Console
) -> Iterator[IdlePoint]:
    regions = (REGION, IDLE_CQ_REGION)
    with _server(local, work_dir, "cq", regions, {}) as (services, cache), ExitStack() as stack:
        holder = ClientCache(ClientSettings(**_settings(services)))
        stack.callback(holder.close)
        holder.create_region(IDLE_CQ_REGION)
        service = holder.query_service()
        writer = cache.create_region(REGION, serializer=BytesSerializer())
        puts(writer, WARM_UP_PUTS)
        held = 0
        for count in sorted(set(options.cqs)):
            progress.phase(
                console,
                f"{count:,} continuous queries on /{IDLE_CQ_REGION}, where nothing is "
                f"written (load {_load()}) ...",
            )
            for index in range(held, count):
                query = f"SELECT * FROM /{IDLE_CQ_REGION} e WHERE e.n > {index}"
                service.new_cq(f"idle-{index}", query, CqAttributes([])).execute()
            held = count
            yield _measure("cqs", count, services, writer, options)


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def run(options: IdleOptions, console: Console) -> list[IdlePoint]:
    """Start the embedded stack and measure every point of the three series.

    Raises:
        BenchError: a server did not start.
        StackError: Kafka or Redis could not be started.
    """
    points: list[IdlePoint] = []
    with ExitStack() as stack:
        local, work_dir = progress.embedded_stack(stack, "idle_cost", console)
        for measure in (_region_points, _bucket_points, _cq_points):
            points.extend(measure(local, work_dir, options, console))
    return points


def _by_series(points: Sequence[IdlePoint]) -> dict[str, list[IdlePoint]]:
    found: dict[str, list[IdlePoint]] = {}
    for point in points:
        found.setdefault(point.series, []).append(point)
    return {s: sorted(found[s], key=lambda p: p.count) for s in SERIES if s in found}


_COLUMNS: Final = (
    "series",
    "count",
    "server CPU without puts (ms/s)",
    "server CPU µs per lone put",
    "÷ first",
    "server CPU µs per put, pipelined",
    "÷ first",
    "Kafka CPU µs per put, pipelined",
    "load avg before",
)


def _rows(points: Sequence[IdlePoint]) -> list[list[str]]:
    rows = []
    for series, members in _by_series(points).items():
        first = members[0]
        for p in members:
            rows.append(
                [
                    _TITLES[series],
                    f"{p.count:,}",
                    f"{p.idle_ms_per_s:.1f}",
                    f"{p.lone_us_per_put:,.0f}",
                    f"{p.lone_us_per_put / first.lone_us_per_put:.2f}x",
                    f"{p.batched_us_per_put:,.0f}",
                    f"{p.batched_us_per_put / first.batched_us_per_put:.2f}x",
                    f"{p.kafka_us_per_put:,.0f}",
                    " ".join(f"{x:.1f}" for x in p.load),
                ]
            )
    return rows


def markdown(points: Sequence[IdlePoint]) -> str:
    """The table as Markdown, for bench/RESULTS.md."""
    lines = [
        "| " + " | ".join(_COLUMNS) + " |",
        "|" + "|".join("---" if i == 0 else "---:" for i in range(len(_COLUMNS))) + "|",
    ]
    lines += ["| " + " | ".join(row) + " |" for row in _rows(points)]
    return "\n".join(lines) + "\n"


def summary_rows(points: Sequence[IdlePoint]) -> list[SummaryRow]:
    """Each series' last point beside its first (bench.all's summary): lone and pipelined."""
    rows = []
    for series, members in _by_series(points).items():
        first, last = members[0], members[-1]
        for figure, name in (
            ("lone_us_per_put", "server CPU µs per lone put"),
            ("batched_us_per_put", "server CPU µs per put, pipelined"),
        ):
            rows.append(
                SummaryRow(
                    "idle_cost",
                    f"{name} ({last.count:,} {_TITLES[series]})",
                    getattr(last, figure),
                    getattr(first, figure),
                    f"the same at {first.count:,}",
                    higher_is_better=False,
                )
            )
    return rows


def plot(points: Sequence[IdlePoint], path: Path) -> Path:
    """Write a PNG: per series, the server's CPU per put (lone and pipelined) and its CPU
    without puts, against the count (log x, linear y from 0)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = _by_series(points)
    figure, axes = plt.subplots(2, len(groups), figsize=(4 * len(groups), 7), squeeze=False)
    for column, (series, members) in enumerate(groups.items()):
        xs = [p.count for p in members]
        top, bottom = axes[0][column], axes[1][column]
        top.plot(xs, [p.lone_us_per_put for p in members], "o-", label="per lone put")
        top.plot(xs, [p.batched_us_per_put for p in members], "s-", label="per put, pipelined")
        bottom.plot(xs, [p.idle_ms_per_s for p in members], "^-", label="without puts")
        for axis, unit in ((top, "server CPU µs per put"), (bottom, "server CPU ms/s")):
            axis.set_xscale("log")
            # Linear from 0: a log scale makes a 2 ms/s wobble look like a slope.
            axis.set_ylim(bottom=0, top=axis.get_ylim()[1] * 1.2)
            axis.set_xticks(xs, [f"{x:,}" for x in xs])
            axis.set_xlabel(_TITLES[series])
            axis.set_ylabel(unit)
            axis.grid(True, which="both", alpha=0.3)
            axis.legend(fontsize="small")
    figure.suptitle("regionbus: what idle regions, buckets and CQs cost (flat is the goal)")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def print_table(points: Sequence[IdlePoint], console: Console) -> None:
    table = Table(title="the server's CPU beside what it holds idle")
    for column in _COLUMNS:
        table.add_column(column, justify="left" if column == "series" else "right")
    for row in _rows(points):
        table.add_row(*row)
    console.print(table)
    for series, members in _by_series(points).items():
        verdicts = [
            f"{name} {'flat' if flat(members, figure) else 'NOT flat'}"
            for figure, name in (("lone_us_per_put", "lone"), ("batched_us_per_put", "pipelined"))
        ]
        console.print(f"{_TITLES[series]}: " + ", ".join(verdicts) + f" (≤ {FLAT_FACTOR}x)")


@click.command()
@click.option(
    "--regions",
    default="1,100,1000",
    type=counts,
    show_default=True,
    help="Regions the server holds (one written, the rest idle).",
)
@click.option(
    "--buckets",
    default="1,16,113",
    type=counts,
    show_default=True,
    help="Buckets (REGIONBUS_TOTAL_BUCKETS).",
)
@click.option(
    "--cqs",
    default="1,100,1000",
    type=counts,
    show_default=True,
    help="Continuous queries on a region nothing is written to (at most 1,000).",
)
@click.option(
    "--rate",
    default=200,
    show_default=True,
    type=click.IntRange(min=1),
    help="Lone puts per second.",
)
@click.option(
    "--seconds",
    default=10.0,
    show_default=True,
    type=click.FloatRange(min=1.0),
    help="How long the lone puts run at each point.",
)
@click.option(
    "--ops",
    default=5_000,
    show_default=True,
    type=click.IntRange(min=1),
    help="Pipelined puts at each point.",
)
@click.option(
    "--markdown",
    "markdown_path",
    type=click.Path(path_type=Path),
    default=None,
    help="Also write the table as Markdown to this file.",
)
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(path_type=Path),
    default=Path(__file__).parent / "scaling_idle.png",
    show_default=True,
    help="Where the plot goes.",
)
@json_option
def main(
    regions: tuple[int, ...],
    buckets: tuple[int, ...],
    cqs: tuple[int, ...],
    rate: int,
    seconds: float,
    ops: int,
    markdown_path: Path | None,
    plot_path: Path,
    as_json: bool,
) -> None:  # fmt: skip
    """What idle regions, buckets and continuous queries cost a busy region's puts."""
    if max(cqs) > 1_000:
        raise click.BadParameter("a client holds at most 1,000 CQs", param_hint="--cqs")
    console = Console(width=max(Console().width, 160))  # the table's nine columns
    options = IdleOptions(regions, buckets, cqs, rate, seconds, ops)
    points = run_or_exit(lambda: run(options, console), console)
    print_table(points, console)
    console.print(f"plot: {plot(points, plot_path)}")
    if markdown_path is not None:
        markdown_path.write_text(markdown(points), encoding="utf-8")
    emit(summary_rows(points))
    if as_json:
        print(json.dumps({"options": asdict(options), "points": [asdict(p) for p in points]}))


if __name__ == "__main__":
    main()
