"""``regionbus gateway sender|receiver|async-event-queue``: run one gateway worker.

Each command reads its typed settings from the options given, the environment
(``REGIONBUS_GATEWAY_SENDER_*``, ``REGIONBUS_GATEWAY_RECEIVER_*``,
``REGIONBUS_ASYNC_EVENT_QUEUE_*``) and the file named by ``REGIONBUS_CONFIG_FILE`` (tables
``[gateway_sender]``, ``[gateway_receiver]``, ``[async_event_queue]``; see
:mod:`regionbus.schemas.settings`), validates them, and runs until SIGINT/SIGTERM.
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

import click

from regionbus.gateways.async_event_queue import AsyncEventQueue, AsyncEventQueueSettings
from regionbus.gateways.receiver import GatewayReceiver, GatewayReceiverSettings
from regionbus.gateways.sender import GatewaySender
from regionbus.gateways.sender_settings import GatewaySenderSettings
from regionbus.runtime.observability import configure_logging
from regionbus.runtime.worker import BackgroundWorker
from regionbus.schemas.errors import RegionBusError


def _build(settings_class: Any, options: dict[str, Any]) -> Any:
    try:
        return settings_class.load(**options)
    except RegionBusError as exc:
        raise click.UsageError(str(exc)) from exc


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
            raise click.ClickException(f"{what} stopped: {worker.failure}")
    worker.stop()


_verbose = click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
_local = [
    click.option("--namespace", help="This site's namespace."),
    click.option("--kafka", "kafka_bootstrap_servers", help="This site's Kafka."),
    click.option("--redis", "redis_url", help="This site's Redis."),
    click.option(
        "--metrics-port",
        type=click.IntRange(0, 65535),
        help="Serve Prometheus metrics on this port (0 = any free one).",
    ),
    click.option("--log-format", type=click.Choice(["text", "json"]), help="Log line format."),
]


def _with_local(func: Any) -> Any:
    for option in reversed(_local):
        func = option(func)
    return func


@click.command("sender")
@_with_local
@click.option("--sender-id", help="Sender id (queue {ns}.gw.<id>).")
@click.option("--site-id", "distributed_system_id", type=int, help="This site's id.")
@click.option("--remote-site-id", "remote_distributed_system_id", type=int)
@click.option("--remote-namespace")
@click.option("--remote-kafka", "remote_kafka_bootstrap_servers")
@click.option("--remote-receiver-id")
@click.option("--batch-size", type=int)
@click.option("--batch-time-interval-ms", type=int)
@click.option("--max-batches-in-flight", type=int, help="Unacked batches at once (default 10).")
@_verbose
def sender_command(verbose: bool, **options: Any) -> None:
    """Run a gateway sender: send its queue's batches to the remote site."""
    settings = _build(GatewaySenderSettings, options)
    _logging(settings, verbose)
    _run(GatewaySender(settings), f"gateway sender {settings.sender_id}")


@click.command("receiver")
@_with_local
@click.option("--receiver-id", help="Receiver id (inbound topic {ns}.gwr.<id>).")
@click.option("--site-id", "distributed_system_id", type=int, help="This site's id.")
@click.option("--conflict-resolver", help="module:Class of a GatewayConflictResolver.")
@_verbose
def receiver_command(verbose: bool, **options: Any) -> None:
    """Run a gateway receiver: apply remote sites' batches to this site and ack them."""
    settings = _build(GatewayReceiverSettings, options)
    _logging(settings, verbose)
    _run(GatewayReceiver(settings), f"gateway receiver {settings.receiver_id}")


@click.command("async-event-queue")
@_with_local
@click.option("--queue-id", help="Queue id (topic {ns}.aeq.<id>).")
@click.option(
    "--listener",
    help="module:Class of an AsyncEventListener, e.g. "
    "regionbus.gateways.write_behind:SqlWriteBehindListener.",
)
@click.option("--batch-size", type=int)
@click.option("--batch-time-interval-ms", type=int)
@_verbose
def async_event_queue_command(verbose: bool, **options: Any) -> None:
    """Run an async event queue dispatcher with its listener."""
    settings = _build(AsyncEventQueueSettings, options)
    _logging(settings, verbose)
    _run(AsyncEventQueue(settings), f"async event queue {settings.queue_id}")


__all__ = ["async_event_queue_command", "receiver_command", "sender_command"]
