"""A cache server of a benchmark run, as a child process (``python -m regionbus serve``).

A separate process so it gets its own core and its own GIL on a 2-core machine. It runs in
its own session: a Ctrl-C in the terminal reaches only the benchmark, which then stops the
server with SIGTERM (a graceful stop: final flush and offset commit). The failover
benchmark starts several, each with its own member id, and kills one with SIGKILL.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from types import TracebackType
from typing import Self

from rich.console import Console

from bench import progress
from bench.services import REGION, BenchOptions, Services
from regionbus.devstack import LocalStack
from regionbus.schemas.errors import RegionBusError

_READY_TEXT = "serving namespace"
_READY_POLL_INTERVAL_S = 0.1
_LOG_TAIL_CHARS = 2000


class BenchError(RegionBusError):
    """The benchmark could not run: a child process failed, or did not answer in time."""


class ServerProcess:
    """A cache server child process serving one namespace.

    Args:
        namespace: Site namespace.
        kafka_bootstrap_servers: Kafka ``bootstrap.servers``.
        redis_url: Redis URL.
        regions: Regions the server defines at start.
        fetch_wait_max_ms: Passed as ``REGIONBUS_FETCH_WAIT_MAX_MS`` (librdkafka
            ``fetch.wait.max.ms`` of the server's consumer).
        linger_ms: Passed as ``REGIONBUS_LINGER_MS`` (producer ``linger.ms``).
        log_path: Where the server's stdout and stderr go.
        member_id: Passed as ``REGIONBUS_MEMBER_ID``; None lets the server make one up.
        env: Further ``REGIONBUS_*`` settings (e.g. ``REGIONBUS_LEASE_TTL_MS``).
    """

    def __init__(
        self,
        *,
        namespace: str,
        kafka_bootstrap_servers: str,
        redis_url: str,
        regions: tuple[str, ...],
        fetch_wait_max_ms: int,
        linger_ms: int,
        log_path: Path,
        member_id: str | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.namespace = namespace
        self.kafka_bootstrap_servers = kafka_bootstrap_servers
        self.redis_url = redis_url
        self.regions = regions
        self.fetch_wait_max_ms = fetch_wait_max_ms
        self.linger_ms = linger_ms
        self.log_path = log_path
        self.member_id = member_id
        self.env = dict(env or {})
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        """The server's process id while it runs, else None."""
        if self._process is None or self._process.poll() is not None:
            return None
        return self._process.pid

    def command(self) -> list[str]:
        """The command line that starts the server."""
        command = [
            sys.executable,
            "-m",
            "regionbus",
            "serve",
            "--namespace",
            self.namespace,
            "--kafka",
            self.kafka_bootstrap_servers,
            "--redis",
            self.redis_url,
        ]
        for region in self.regions:
            command += ["--region", region]
        return command

    def start(self, ready_timeout_s: float = 60.0) -> None:
        """Start the server and wait until it logs that it serves the namespace.

        Args:
            ready_timeout_s: Longest wait for start-up, in seconds.

        Raises:
            BenchError: the server exited or did not get ready in time (the message ends
                with the tail of its log).
        """
        env = {**os.environ, **self.env}
        if self.member_id is not None:
            env["REGIONBUS_MEMBER_ID"] = self.member_id
        env["REGIONBUS_FETCH_WAIT_MAX_MS"] = str(self.fetch_wait_max_ms)
        env["REGIONBUS_LINGER_MS"] = str(self.linger_ms)
        env["PYTHONUNBUFFERED"] = "1"
        with self.log_path.open("ab") as log_file:
            self._process = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        deadline = time.monotonic() + ready_timeout_s
        while _READY_TEXT not in self.log_text():
            if self._process.poll() is not None:
                raise BenchError(
                    f"cache server exited with {self._process.returncode}: {self._log_tail()}"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise BenchError(
                    f"cache server not ready within {ready_timeout_s} s: {self._log_tail()}"
                )
            time.sleep(_READY_POLL_INTERVAL_S)

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM (graceful), then SIGKILL after ``timeout_s`` seconds. Safe to repeat."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)

    def kill(self, timeout_s: float = 10.0) -> None:
        """SIGKILL: the server stops at once, with no flush, commit or lease release."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.kill()
        process.wait(timeout_s)

    def log_text(self) -> str:
        """Everything the server has logged so far ("" before it starts)."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def _log_tail(self) -> str:
        return self.log_text()[-_LOG_TAIL_CHARS:]

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def server_services(
    stack: ExitStack,
    local: LocalStack,
    namespace: str,
    options: BenchOptions,
    log_path: Path,
    env: dict[str, str] | None = None,
    regions: tuple[str, ...] = (REGION,),
) -> Services:
    """Start a cache server of ``regions`` (region ``bench``) in ``namespace`` on
    ``stack`` (stopped with it), with ``env`` as further ``REGIONBUS_*`` (or ``OTEL_*``)
    variables.

    Returns:
        The :class:`Services` of a run on it (the server's, Kafka's and Redis' pids).

    Raises:
        BenchError: the server did not start.
    """
    server = stack.enter_context(
        ServerProcess(
            namespace=namespace,
            kafka_bootstrap_servers=local.kafka_bootstrap_servers,
            redis_url=local.redis_url,
            regions=regions,
            fetch_wait_max_ms=options.fetch_wait_max_ms,
            linger_ms=options.linger_ms,
            log_path=log_path,
            env=env,
        )
    )
    return Services(
        namespace,
        local.kafka_bootstrap_servers,
        local.redis_url,
        {
            "server": server.pid,
            "kafka": local.kafka.pid if local.kafka else None,
            "redis": local.redis.pid if local.redis else None,
        },
    )


def one_server_stack(
    stack: ExitStack,
    benchmark: str,
    namespace: str,
    options: BenchOptions,
    console: Console,
    regions: tuple[str, ...] = (REGION,),
) -> tuple[LocalStack, Services]:
    """Start the local stack (unless env names one) and one cache server of ``regions``
    (region ``bench``) on ``stack``, with the run's logs kept under the benchmark's log
    folder.

    Returns:
        The stack, and the :class:`Services` of the run (the server's, Kafka's and Redis'
        pids for the CPU figures).

    Raises:
        BenchError: the server did not start.
        StackError: Kafka or Redis could not be started.
    """
    local, work_dir = progress.embedded_stack(stack, benchmark, console, announce=False)
    services = server_services(
        stack, local, namespace, options, work_dir / "server.log", regions=regions
    )
    console.print(
        f"kafka {local.kafka_bootstrap_servers} ({local.kafka_source}), "
        f"redis {local.redis_url} ({local.redis_source}), namespace {namespace}, "
        f"server pid {services.pids['server']}, logs in {work_dir}",
        style="dim",
    )
    return local, services
