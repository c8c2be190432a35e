"""The gateway benchmarks' two sites: site A (distributed system 1) with sender ``to-b``,
site B (2) with its receivers, a cache server per site and every gateway worker a child
process (``python -m regionbus ...``), a writer on site A and a reader on site B that
records each value's arrival. Used by ``bench.gateway`` and ``bench.gateway_shards``."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from bench import progress
from bench.gateway_raw import Arrivals, GatewayBenchOptions
from bench.workers import stamped_value
from regionbus.clients import (
    BytesSerializer,
    CacheListener,
    ClientCache,
    ClientSettings,
    EntryEvent,
    Region,
)
from regionbus.devstack import EmbeddedKafka, LocalStack

REGION = "bench"
"""The region both sites define and the benchmarks write."""

SENDER_ID = "to-b"
"""Site A's gateway sender."""


class ArrivalListener(CacheListener):
    """Records each created or updated value's arrival (its first 8 bytes are the send
    time) in ``arrivals``."""

    def __init__(self, arrivals: Arrivals) -> None:
        self.arrivals = arrivals

    def after_create(self, event: EntryEvent) -> None:
        self.arrivals.hit(event.new_value_bytes)

    def after_update(self, event: EntryEvent) -> None:
        self.arrivals.hit(event.new_value_bytes)


class Child:
    """A ``python -m regionbus`` child process logging to ``<log_dir>/<name>.log``
    (appended), in a session of its own.

    Args:
        name: Its name (the log file's).
        args: The command line after ``python -m regionbus``.
        env: Environment variables beside this process's.
        log_dir: Where its log goes.
    """

    def __init__(self, name: str, args: list[str], env: dict[str, str], log_dir: Path) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        with self.log_path.open("ab") as log_file:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "regionbus", *args],
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
                start_new_session=True,
            )

    def wait_ready(self, ready_text: str, timeout_s: float = 60.0) -> None:
        """Wait until the log shows ``ready_text``.

        Raises:
            click.ClickException: The process ended, or ``timeout_s`` passed first (with
                the log's tail).
        """
        deadline = time.monotonic() + timeout_s
        while ready_text not in self.log_path.read_text(errors="replace"):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise click.ClickException(
                    f"{self.name} did not start: {self.log_path.read_text()[-2000:]}"
                )
            time.sleep(0.1)

    def stop(self) -> None:
        """SIGTERM (a graceful stop), then SIGKILL after 20 s."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


def stop_all(children: list[Child]) -> None:
    """Stop ``children``, the last started first."""
    for child in reversed(children):
        child.stop()


@contextmanager
def two_brokers(console: Console) -> Iterator[tuple[LocalStack, str]]:
    """The run's services, with the progress heartbeat on ``console`` and the stack's
    logs kept: the local stack (site A's broker, and the Redis both sites use, unless
    ``KAFKA_BOOTSTRAP_SERVERS`` / ``REDIS_URL`` name others) and site B's broker, an
    embedded Kafka of its own. Yields ``(stack, site B's bootstrap servers)``."""
    with (
        progress.heartbeat(console),
        LocalStack() as stack,
        progress.keep_stack_logs(stack),
        EmbeddedKafka() as remote,
    ):
        yield stack, remote.bootstrap_servers


@dataclass
class SitePair:
    """Site A and site B of one measurement, in namespaces of their own on the run's two
    brokers and its Redis; every worker started is stopped by :meth:`stop`.

    Attributes:
        a_kafka: Site A's bootstrap servers.
        b_kafka: Site B's bootstrap servers.
        redis_url: The Redis both sites use.
        options: The run's options (``fetch_wait_ms``, batch settings, value size).
        log_dir: Where the workers' logs go.
        prefix: The namespaces' prefix (``<prefix>.<random>.a`` / ``.b``).
    """

    a_kafka: str
    b_kafka: str
    redis_url: str
    options: GatewayBenchOptions
    log_dir: Path
    prefix: str = "bench.gw"

    def __post_init__(self) -> None:
        tag = secrets.token_hex(3)
        self.ns_a, self.ns_b = f"{self.prefix}.{tag}.a", f"{self.prefix}.{tag}.b"
        self.children: list[Child] = []
        self.log_dir.mkdir(parents=True, exist_ok=True)

    def stop(self) -> None:
        """Stop every worker started, the last first."""
        stop_all(self.children)

    def _child(self, name: str, args: list[str], env: dict[str, str]) -> Child:
        child = Child(name, args, env, self.log_dir)
        self.children.append(child)
        return child

    def start_servers(
        self, sender_spec: dict[str, Any] | None = None, env: dict[str, str] | None = None
    ) -> None:
        """Start a cache server per site, site A's with sender ``to-b`` to site B (more
        ``GatewaySenderSpec`` fields in ``sender_spec``, e.g. ``parallel``), and wait
        until both serve. ``env``: more ``REGIONBUS_*`` settings of both.

        Raises:
            click.ClickException: A server did not start.
        """
        common = {"REGIONBUS_FETCH_WAIT_MAX_MS": str(self.options.fetch_wait_ms), **(env or {})}
        spec = {"remote_distributed_system_id": 2, **(sender_spec or {})}
        site = ["--redis", self.redis_url, "--region", REGION]
        server_a = self._child(
            "server-a",
            ["serve", "--namespace", self.ns_a, "--kafka", self.a_kafka, *site],
            {
                **common,
                "REGIONBUS_DISTRIBUTED_SYSTEM_ID": "1",
                "REGIONBUS_GATEWAY_SENDERS": json.dumps({SENDER_ID: spec}),
                "REGIONBUS_REGION_GATEWAY_SENDERS": json.dumps({REGION: [SENDER_ID]}),
            },
        )
        server_b = self._child(
            "server-b",
            ["serve", "--namespace", self.ns_b, "--kafka", self.b_kafka, *site],
            {**common, "REGIONBUS_DISTRIBUTED_SYSTEM_ID": "2"},
        )
        server_a.wait_ready("serving namespace")
        server_b.wait_ready("serving namespace")

    def start_receiver(self, receiver_id: str = "receiver") -> Child:
        """Start a gateway receiver on site B (not waited for: :meth:`Child.wait_ready`)."""
        return self._child(
            f"receiver-{receiver_id}",
            [
                *("gateway", "receiver", "--namespace", self.ns_b, "--kafka", self.b_kafka),
                *("--redis", self.redis_url, "--site-id", "2", "--receiver-id", receiver_id),
            ],
            {"REGIONBUS_GATEWAY_RECEIVER_FETCH_WAIT_MAX_MS": str(self.options.fetch_wait_ms)},
        )

    def start_sender(
        self,
        name: str = "sender",
        *,
        receiver_id: str = "receiver",
        more_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
    ) -> Child:
        """Start sender ``to-b`` on site A to ``receiver_id`` on site B, with the run's
        batch settings (not waited for). ``more_args``: more command-line options (e.g.
        ``--shards``); ``env``: more ``REGIONBUS_GATEWAY_SENDER_*`` settings."""
        options = self.options
        return self._child(
            name,
            [
                *("gateway", "sender", "--namespace", self.ns_a, "--kafka", self.a_kafka),
                *("--redis", self.redis_url, "--sender-id", SENDER_ID, "--site-id", "1"),
                *("--remote-site-id", "2", "--remote-namespace", self.ns_b),
                *("--remote-kafka", self.b_kafka, "--remote-receiver-id", receiver_id),
                *("--batch-size", str(options.batch_size)),
                *("--batch-time-interval-ms", str(options.batch_time_interval_ms)),
                *more_args,
            ],
            {
                "REGIONBUS_GATEWAY_SENDER_FETCH_WAIT_MAX_MS": str(options.fetch_wait_ms),
                **(env or {}),
            },
        )

    def reader(self, stack: ExitStack, arrivals: Arrivals) -> Region:
        """A client cache on site B (closed with ``stack``) whose region hears every key,
        recording arrivals in ``arrivals``."""
        cache = stack.enter_context(ClientCache(self._client_settings(self.ns_b, self.b_kafka)))
        region = cache.create_region(
            REGION, listeners=[ArrivalListener(arrivals)], serializer=BytesSerializer()
        )
        region.register_interest_regex(".*")
        return region

    def writer(self, stack: ExitStack) -> Region:
        """A client cache on site A (closed with ``stack``): its region, values as bytes."""
        cache = stack.enter_context(ClientCache(self._client_settings(self.ns_a, self.a_kafka)))
        return cache.create_region(REGION, serializer=BytesSerializer())

    def _client_settings(self, namespace: str, kafka: str) -> ClientSettings:
        return ClientSettings(
            namespace=namespace,
            kafka_bootstrap_servers=kafka,
            fetch_wait_max_ms=self.options.fetch_wait_ms,
        )


def put_all(region: Region, prefix: str, options: GatewayBenchOptions) -> float:
    """``options.events`` pipelined puts of ``<prefix>-<n>`` (2,000 unanswered at most);
    returns puts acked per second."""
    start_ns = time.time_ns()
    window: list[Any] = []
    for index in range(options.events):
        window.append(region.put_async(f"{prefix}-{index}", stamped_value(options.value_bytes)))
        if len(window) >= 2000:
            for future in window:
                future.result(60)
            window.clear()
    for future in window:
        future.result(60)
    return options.events / ((time.time_ns() - start_ns) / 1e9)
