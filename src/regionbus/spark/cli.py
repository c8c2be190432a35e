"""``regionbus spark ...``: the Spark jobs (queue analytics, flights delays, bulk load), and
a Spark standalone cluster on loopback to run them on.

Loaded lazily by :mod:`regionbus.broker.cli`, so ``regionbus`` starts without importing pyspark.
Kafka settings come from ``--namespace`` / ``--kafka`` (which read ``REGIONBUS_NAMESPACE`` /
``REGIONBUS_KAFKA_BOOTSTRAP_SERVERS``) or the other ``REGIONBUS_*`` variables
(``REGIONBUS_KAFKA_CONFIG`` for security settings), as for clients
(:class:`clients.ClientSettings`). The Spark session is the process's (created on first
use, ended with the process), so a command run inside a Spark application reuses its session.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from regionbus.clients.settings import ClientSettings
from regionbus.runtime.cli_options import CommandError, setting_option, with_logging
from regionbus.runtime.heartbeat import Heartbeat, PhaseStatus

_console = Console()


def _settings(namespace: str | None, kafka: str | None) -> ClientSettings:
    return ClientSettings.load(namespace=namespace, kafka_bootstrap_servers=kafka)


def _extra_kafka_config(settings: ClientSettings) -> dict[str, str]:
    """librdkafka settings beyond the bootstrap servers: security (typed fields) and
    ``kafka_config``, for the Spark source's ``kafka.*`` options."""
    return {k: str(v) for k, v in settings.librdkafka().items() if k != "bootstrap.servers"}


_namespace = setting_option(ClientSettings, "namespace", "--namespace")
_kafka = click.option(
    "--kafka",
    envvar=ClientSettings.env_name("kafka_bootstrap_servers"),
    show_envvar=True,
    help="Kafka bootstrap servers.",
)
_master = click.option(
    "--master",
    default="local[2]",
    show_default=True,
    help="Spark master URL: local[N], or spark://host:port of a standalone cluster "
    "(regionbus spark cluster starts one).",
)


def _session(master: str, app_name: str) -> Any:
    from regionbus.spark.session import local_session

    return local_session(app_name, master=master)


def _print(title: str, rows: list[Any], columns: list[str]) -> None:
    table = Table(title=title)
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*("" if row[c] is None else str(row[c]) for c in columns))
    _console.print(table)


@click.command("analytics")
@_namespace
@_kafka
@_master
@click.option(
    "--output", type=click.Path(file_okay=False), help="Also write the tables as Parquet here."
)
@with_logging()
def analytics_command(
    namespace: str | None,
    kafka: str | None,
    master: str,
    output: str | None,
) -> None:
    """Depth, oldest unacked event and content of every subscription queue; backlog of
    every gateway and async event queue."""
    from regionbus.spark.analytics import queue_analytics

    settings = _settings(namespace, kafka)
    spark = _session(master, "regionbus-analytics")
    result = queue_analytics(
        spark,
        kafka_bootstrap_servers=settings.kafka_bootstrap_servers,
        namespace=settings.namespace,
        kafka_config=_extra_kafka_config(settings),
    )
    tables = {
        "queues": (result.queues, ["client_id", "depth", "oldest_unacked_age_s"]),
        "queue_events": (result.queue_events, ["client_id", "region", "operation", "events"]),
        "gateways": (result.gateways, ["topic", "kind", "backlog", "oldest_age_s"]),
    }
    for name, (frame, columns) in tables.items():
        ordered = frame.orderBy(*columns[:2])
        _print(name, ordered.collect(), columns)
        if output is not None:
            ordered.write.mode("overwrite").parquet(str(Path(output) / name))


@click.command("delays")
@_namespace
@_kafka
@_master
@click.option(
    "--output", required=True, type=click.Path(file_okay=False), help="Parquet table directory."
)
@click.option(
    "--checkpoint", required=True, type=click.Path(file_okay=False), help="Checkpoint directory."
)
@click.option(
    "--available-now/--continuous",
    default=True,
    show_default=True,
    help="Process what the events topic holds now and stop, or run until Ctrl-C.",
)
@click.option(
    "--trigger-interval-s", default=5.0, show_default=True, help="Seconds between batches."
)
@click.option("--max-offsets-per-trigger", type=click.IntRange(min=1), help="Records per batch.")
@with_logging()
def delays_command(
    namespace: str | None,
    kafka: str | None,
    master: str,
    output: str,
    checkpoint: str,
    available_now: bool,
    trigger_interval_s: float,
    max_offsets_per_trigger: int | None,
) -> None:
    """Stream the flights replay's events into a table of per-carrier departure delay per
    scheduled hour (Parquet)."""
    from regionbus.spark.delays import DELAY_COLUMNS, start_delays_job

    settings = _settings(namespace, kafka)
    spark = _session(master, "regionbus-delays")
    query = start_delays_job(
        spark,
        kafka_bootstrap_servers=settings.kafka_bootstrap_servers,
        namespace=settings.namespace,
        output=output,
        checkpoint=checkpoint,
        kafka_config=_extra_kafka_config(settings),
        available_now=available_now,
        trigger_interval_s=trigger_interval_s,
        max_offsets_per_trigger=max_offsets_per_trigger,
    )
    try:
        query.awaitTermination()
    except KeyboardInterrupt:
        query.stop()
    if Path(output).exists():
        table = spark.read.parquet(output)
        click.echo(f"{table.count():,} rows in {output}; largest mean delays:")
        _print(
            "delays",
            table.orderBy("mean_dep_delay_min", ascending=False).take(10),
            list(DELAY_COLUMNS),
        )


@click.command("bulk-load")
@_namespace
@_kafka
@_master
@click.option("--region", required=True, help="Region to load.")
@click.option(
    "--input",
    "input_path",
    required=True,
    type=click.Path(exists=True, resolve_path=True),
    help="The file (or folder) to load.",
)
@click.option(
    "--input-format",
    type=click.Choice(["parquet", "csv", "json"]),
    help="Input format [default: from the file extension].",
)
@click.option("--key-column", default="key", show_default=True, help="Column of keys.")
@click.option(
    "--value-column",
    help="Column of values [default: a struct of every column but the key column].",
)
@click.option(
    "--serializer",
    type=click.Choice(["json", "str", "bytes"]),
    default="json",
    show_default=True,
    help="Value serializer.",
)
@click.option("--load-id", help="Client id of the load (rerun with it to resend the same ids).")
@click.option(
    "--wait-timeout-s",
    default=600.0,
    show_default=True,
    help="Longest wait for the servers' replies; 0 = do not wait.",
)
@with_logging()
def bulk_load_command(
    namespace: str | None,
    kafka: str | None,
    master: str,
    region: str,
    input_path: str,
    input_format: str | None,
    key_column: str,
    value_column: str | None,
    serializer: str,
    load_id: str | None,
    wait_timeout_s: float,
) -> None:
    """Load a region from a Parquet, CSV or JSON file, through the cache servers.

    When stdout is not a terminal, a progress line comes every 10 s.
    """
    from pyspark.sql import functions as F  # noqa: N812

    from regionbus.spark.bulkload import bulk_load

    settings = _settings(namespace, kafka)
    fmt = input_format or Path(input_path).suffix.lstrip(".").lower()
    if fmt not in ("parquet", "csv", "json"):
        raise click.UsageError("cannot tell the input format: give --input-format")
    status = PhaseStatus("starting Spark")
    # Spark's own progress bar is drawn on a terminal only; elsewhere, a line every 10 s.
    heartbeat = Heartbeat(status, sys.stdout, enabled=not sys.stdout.isatty())
    with heartbeat:
        spark = _session(master, "regionbus-bulk-load")
        status.phase(f"reading {input_path}")
        reader = spark.read.format(fmt)
        if fmt == "csv":
            reader = reader.option("header", "true").option("inferSchema", "true")
        df = reader.load(input_path)
        if key_column not in df.columns:
            raise click.UsageError(f"the input has no column {key_column!r}")
        if value_column is None:
            others = [c for c in df.columns if c != key_column]
            df = df.select(F.col(key_column).cast("string"), F.struct(*others).alias("value"))
            value_column = "value"
        report = bulk_load(
            spark,
            df,
            region,
            kafka_bootstrap_servers=settings.kafka_bootstrap_servers,
            namespace=settings.namespace,
            kafka_config=_extra_kafka_config(settings),
            key_column=key_column,
            value_column=value_column,
            serializer=serializer,
            load_id=load_id,
            wait_applied_timeout_s=wait_timeout_s or None,
            status=status,
        )
    click.echo(
        f"load {report.load_id}: {report.entries:,} entries, {report.applied:,} applied, "
        f"{report.duplicates:,} duplicates, {report.failed:,} refused "
        f"(write {report.write_s:.1f} s, apply {report.apply_s:.1f} s)"
    )
    for failure in report.failures:
        click.echo(f"  refused: {failure}", err=True)
    if wait_timeout_s and not report.ok:
        sys.exit(1)


__all__ = ["analytics_command", "bulk_load_command", "delays_command"]


@click.command("cluster")
@click.option(
    "--cores",
    type=click.IntRange(min=1),
    default=2,
    show_default=True,
    help="Cores the worker offers.",
)
@click.option(
    "--memory-mb",
    type=click.IntRange(min=512),
    default=1536,
    show_default=True,
    help="Memory the worker offers executors, MiB.",
)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path, resolve_path=True),
    default=Path(".regionbus") / "spark",
    show_default=True,
    help="Where the master's and the worker's logs and the executors' folders live.",
)
@with_logging()
def cluster_command(cores: int, memory_mb: int, data_dir: Path) -> None:
    """Start a Spark standalone master and one worker on 127.0.0.1, from the installed
    pyspark; print the master URL for the jobs' --master; stop on Ctrl-C."""
    from regionbus.devstack.spark_cluster import EmbeddedSparkCluster

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    began = time.monotonic()
    cluster = EmbeddedSparkCluster(cores=cores, memory_mb=memory_mb, work_dir=data_dir)
    url = cluster.start()
    try:
        click.echo(url)
        click.echo(
            f"Spark master {url} (web UI {cluster.web_ui}) and a worker of {cores} cores, "
            f"{memory_mb} MiB, up in {time.monotonic() - began:.0f} s; logs in {data_dir}; "
            "Ctrl-C stops them",
            err=True,
        )
        while not stop.wait(1.0):
            if cluster.master.pid is None or cluster.worker.pid is None:
                raise CommandError("a Spark daemon exited; see its log in " + str(data_dir))
    finally:
        cluster.stop()
