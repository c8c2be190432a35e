"""``regionbus gateway sender|receiver|async-event-queue``: run one gateway worker.

Each command reads its typed settings from the options given, the environment
(``REGIONBUS_GATEWAY_SENDER_*``, ``REGIONBUS_GATEWAY_RECEIVER_*``,
``REGIONBUS_ASYNC_EVENT_QUEUE_*``) and the file named by ``REGIONBUS_CONFIG_FILE`` (tables
``[gateway_sender]``, ``[gateway_receiver]``, ``[async_event_queue]``; see
:mod:`regionbus.schemas.settings`), validates them, and runs until SIGINT/SIGTERM. Every
option reads its setting's variable, which ``--help`` shows.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from typing import Any

import click

from regionbus.gateways.async_event_queue import AsyncEventQueue, AsyncEventQueueSettings
from regionbus.gateways.receiver import GatewayReceiver, GatewayReceiverSettings
from regionbus.gateways.sender import GatewaySender
from regionbus.gateways.sender_settings import GatewaySenderSettings
from regionbus.runtime.cli_options import CommandError, logging_options, setting_option
from regionbus.runtime.observability import configure_logging
from regionbus.runtime.worker import BackgroundWorker
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
def sender_command(verbose: bool, **options: Any) -> None:
    """Run a gateway sender: send its queue's batches to the remote site."""
    settings = GatewaySenderSettings.load(**options)
    _logging(settings, verbose)
    _run(GatewaySender(settings), f"gateway sender {settings.sender_id}")


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


__all__ = ["async_event_queue_command", "receiver_command", "sender_command"]
