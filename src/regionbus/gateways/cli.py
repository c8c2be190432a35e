"""``regionbus gateway sender|receiver|async-event-queue``: run one gateway worker;
``regionbus gateway repair``: compare and repair two sites.

Each command reads its typed settings from the options given, the environment
(``REGIONBUS_GATEWAY_SENDER_*``, ``REGIONBUS_GATEWAY_RECEIVER_*``,
``REGIONBUS_ASYNC_EVENT_QUEUE_*``) and the file named by ``REGIONBUS_CONFIG_FILE`` (tables
``[gateway_sender]``, ``[gateway_receiver]``, ``[async_event_queue]``; see
:mod:`regionbus.schemas.settings`), validates them, and runs until SIGINT/SIGTERM. Every
option reads its setting's variable, which ``--help`` shows.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
from collections.abc import Callable
from dataclasses import asdict
from typing import Any, Literal

import click

from regionbus.clients.settings import ClientSettings
from regionbus.gateways.async_event_queue import AsyncEventQueue, AsyncEventQueueSettings
from regionbus.gateways.filters import GatewayConflictResolver
from regionbus.gateways.receiver import GatewayReceiver, GatewayReceiverSettings
from regionbus.gateways.repair import GatewayRepair, RepairReport, RepairSite
from regionbus.gateways.repair_settings import GatewayRepairSettings
from regionbus.gateways.sender import GatewaySender
from regionbus.gateways.sender_settings import GatewaySenderSettings
from regionbus.runtime.cli_options import CommandError, logging_options, setting_option
from regionbus.runtime.observability import configure_logging
from regionbus.runtime.redis_connect import connect_redis, connect_redis_url
from regionbus.runtime.worker import BackgroundWorker, freeze_start_up_objects
from regionbus.schemas.hooks import load_hook
from regionbus.schemas.settings import RegionBusSettings


def _logging(settings: Any, verbose: bool) -> None:
    configure_logging(
        settings.log_format,
        verbose=verbose,
        fields={"member": settings.member_id, "namespace": settings.namespace},
    )


def _run(worker: BackgroundWorker, what: str) -> None:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    worker.start()
    freeze_start_up_objects()
    click.echo(f"{what} running; Ctrl-C stops it")
    if worker.metrics_url is not None:
        click.echo(f"metrics at {worker.metrics_url}")
        logging.getLogger("regionbus.cli").info("metrics of %s at %s", what, worker.metrics_url)
    while not stop.wait(1.0):
        if not worker.alive:
            raise CommandError(f"{what} stopped: {worker.failure}")
    worker.stop()


def _worker_options(settings_class: type[RegionBusSettings]) -> Callable[[Any], Any]:
    """The options every worker takes: its site's namespace, Kafka and Redis, its metrics
    endpoint, and the logging options."""
    options = [
        setting_option(settings_class, "namespace", "--namespace", help="This site's namespace."),
        setting_option(
            settings_class, "kafka_bootstrap_servers", "--kafka", help="This site's Kafka."
        ),
        setting_option(settings_class, "redis_url", "--redis", help="This site's Redis."),
        setting_option(
            settings_class,
            "metrics_port",
            "--metrics-port",
            type=click.IntRange(0, 65535),
            help="Serve Prometheus metrics on this port (0 = any free one).",
        ),
        logging_options(settings_class),
    ]

    def decorate(func: Any) -> Any:
        for option in reversed(options):
            func = option(func)
        return func

    return decorate


_SENDER = GatewaySenderSettings
_RECEIVER = GatewayReceiverSettings
_QUEUE = AsyncEventQueueSettings


@click.command("sender")
@_worker_options(_SENDER)
@setting_option(_SENDER, "sender_id", "--sender-id", help="Sender id (queue {ns}.gw.<id>).")
@setting_option(
    _SENDER, "distributed_system_id", "--site-id", type=int, help="This site's id (1-255)."
)
@setting_option(
    _SENDER,
    "remote_distributed_system_id",
    "--remote-site-id",
    type=int,
    help="The remote site's id (1-255).",
)
@setting_option(_SENDER, "remote_namespace", "--remote-namespace")
@setting_option(_SENDER, "remote_kafka_bootstrap_servers", "--remote-kafka")
@setting_option(_SENDER, "remote_receiver_id", "--remote-receiver-id")
@setting_option(_SENDER, "batch_size", "--batch-size", type=int)
@setting_option(_SENDER, "batch_time_interval_ms", "--batch-time-interval-ms", type=int)
@setting_option(_SENDER, "max_batches_in_flight", "--max-batches-in-flight", type=int)
@setting_option(
    _SENDER,
    "shards",
    "--shards",
    type=int,
    help="Split the queue's partitions into this many shards, each sent by its own primary.",
)
@setting_option(
    _SENDER, "shard", "--shard", type=int, help="The shard this process sends (0 to shards - 1)."
)
def sender_command(verbose: bool, **options: Any) -> None:
    """Run a gateway sender: send its queue's batches to the remote site."""
    settings = GatewaySenderSettings.load(**options)
    _logging(settings, verbose)
    shard = f" shard {settings.shard} of {settings.shards}" if settings.shards > 1 else ""
    _run(GatewaySender(settings), f"gateway sender {settings.sender_id}{shard}")


@click.command("receiver")
@_worker_options(_RECEIVER)
@setting_option(
    _RECEIVER, "receiver_id", "--receiver-id", help="Receiver id (inbound topic {ns}.gwr.<id>)."
)
@setting_option(
    _RECEIVER, "distributed_system_id", "--site-id", type=int, help="This site's id (1-255)."
)
@setting_option(
    _RECEIVER,
    "conflict_resolver",
    "--conflict-resolver",
    help="module:Class of a GatewayConflictResolver.",
)
def receiver_command(verbose: bool, **options: Any) -> None:
    """Run a gateway receiver: apply remote sites' batches to this site and ack them."""
    settings = GatewayReceiverSettings.load(**options)
    _logging(settings, verbose)
    _run(GatewayReceiver(settings), f"gateway receiver {settings.receiver_id}")


@click.command("async-event-queue")
@_worker_options(_QUEUE)
@setting_option(_QUEUE, "queue_id", "--queue-id", help="Queue id (topic {ns}.aeq.<id>).")
@setting_option(
    _QUEUE,
    "listener",
    "--listener",
    help="module:Class of an AsyncEventListener, e.g. "
    "regionbus.gateways.write_behind:SqlWriteBehindListener.",
)
@setting_option(_QUEUE, "batch_size", "--batch-size", type=int)
@setting_option(_QUEUE, "batch_time_interval_ms", "--batch-time-interval-ms", type=int)
def async_event_queue_command(verbose: bool, **options: Any) -> None:
    """Run an async event queue dispatcher with its listener."""
    settings = AsyncEventQueueSettings.load(**options)
    _logging(settings, verbose)
    _run(AsyncEventQueue(settings), f"async event queue {settings.queue_id}")


def repair_from_settings(settings: GatewayRepairSettings) -> GatewayRepair:
    """A :class:`GatewayRepair` of the two sites ``settings`` name (this one with its Kafka
    and Redis security, the other by URL and ``remote_kafka_config``).

    Raises:
        ConfigurationError: as :class:`GatewayRepair`, or a Redis setting is invalid.
    """
    here = RepairSite(
        settings.distributed_system_id,
        settings.namespace,
        connect_redis(settings),
        ClientSettings(namespace=settings.namespace, **settings.kafka_connection()),
    )
    there = RepairSite(
        settings.remote_distributed_system_id,
        settings.remote_namespace,
        connect_redis_url(settings.remote_redis_url),
        ClientSettings(
            namespace=settings.remote_namespace,
            kafka_bootstrap_servers=settings.remote_kafka_bootstrap_servers,
            kafka_config=settings.remote_kafka_config,
        ),
    )
    return GatewayRepair(
        here,
        there,
        settings.total_buckets,
        leaf_bits=settings.leaf_bits,
        dry_run=settings.dry_run,
        apply_timeout_ms=settings.apply_timeout_ms,
        conflict_resolver=(
            load_hook(settings.conflict_resolver, GatewayConflictResolver)
            if settings.conflict_resolver
            else None
        ),
    )


def _by_step(figures: dict[str, Any], form: str) -> str:
    return ", ".join(f"{step} {form.format(value)}" for step, value in figures.items()) or "-"


def report_text(report: RepairReport, as_json: bool = False, decisions: int = 20) -> str:
    """A run's report for people (a summary line and the first ``decisions`` decisions), or
    as one JSON object (every decision the report kept)."""
    if as_json:
        whole = asdict(report)
        for decision in whole["decisions"]:
            decision["version"] = list(decision["version"])
            if decision["loser_version"] is not None:
                decision["loser_version"] = list(decision["loser_version"])
        return json.dumps(whole)
    lines = [
        f"repair {report.run_id}: {report.buckets_compared} region buckets compared, "
        f"{report.buckets_differing} differed ({report.leaves_differing} leaves); "
        f"{report.keys_differing} keys differed: {report.applied} repaired, "
        f"{report.refused} refused as older, {report.failed} failed, "
        f"{report.disallowed} disallowed by the conflict resolver; "
        f"{report.bytes_moved:,} bytes moved ({_by_step(report.bytes_by_step, '{:,}')}) "
        f"in {report.seconds:.1f} s ({_by_step(report.seconds_by_step, '{:.1f} s')})"
    ]
    for d in report.decisions[:decisions]:
        lines.append(
            f"  {d.region} {d.key!r}: {d.action} from site {d.winner_site_id} "
            f"(change of {d.version.timestamp_ms} at site {d.version.site_id}"
            + (
                f", over {d.loser_version.timestamp_ms} at site {d.loser_version.site_id})"
                if d.loser_version is not None
                else ", the other site had none)"
            )
        )
    if report.keys_differing > decisions:
        lines.append(f"  ... and {report.keys_differing - decisions} more")
    lines.extend(f"  failed: {error}" for error in report.errors)
    return "\n".join(lines)


_REPAIR = GatewayRepairSettings


@click.command("repair")
@setting_option(_REPAIR, "namespace", "--namespace", help="This site's namespace.")
@setting_option(_REPAIR, "kafka_bootstrap_servers", "--kafka", help="This site's Kafka.")
@setting_option(_REPAIR, "redis_url", "--redis", help="This site's Redis.")
@setting_option(
    _REPAIR, "distributed_system_id", "--site-id", type=int, help="This site's id (1-255)."
)
@setting_option(_REPAIR, "remote_namespace", "--remote-namespace")
@setting_option(_REPAIR, "remote_kafka_bootstrap_servers", "--remote-kafka")
@setting_option(_REPAIR, "remote_redis_url", "--remote-redis")
@setting_option(
    _REPAIR,
    "remote_distributed_system_id",
    "--remote-site-id",
    type=int,
    help="The other site's id (1-255).",
)
@setting_option(
    _REPAIR, "regions", "--region", multiple=True, help="A region to compare (repeatable)."
)
@setting_option(_REPAIR, "leaf_bits", "--leaf-bits", type=click.IntRange(1, 24))
@setting_option(
    _REPAIR,
    "conflict_resolver",
    "--conflict-resolver",
    help="module:Class of a GatewayConflictResolver.",
)
@setting_option(_REPAIR, "dry_run", "--dry-run", is_flag=True, default=None)
@setting_option(_REPAIR, "interval_s", "--interval-s", type=float)
@click.option("--json", "as_json", is_flag=True, help="Print each run's report as JSON.")
@logging_options()
def repair_command(
    verbose: bool, log_format: Literal["text", "json"], as_json: bool, **options: Any
) -> None:
    """Compare two sites' regions with Merkle trees and make them equal: each key that
    differs takes the later change, as WAN delivery would have (docs/gateways.md)."""
    if not options.get("regions"):
        options.pop("regions", None)
    settings = GatewayRepairSettings.load(**options)
    configure_logging(log_format, verbose=verbose, fields={"namespace": settings.namespace})
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    repair = repair_from_settings(settings)
    while True:
        report = repair.run(settings.regions)
        click.echo(report_text(report, as_json))
        if settings.interval_s <= 0 or stop.wait(settings.interval_s):
            return


__all__ = [
    "async_event_queue_command",
    "receiver_command",
    "repair_command",
    "repair_from_settings",
    "report_text",
    "sender_command",
]
