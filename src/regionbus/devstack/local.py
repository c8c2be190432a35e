"""The one Kafka and one Redis that tests, the demo and ``regionbus stack`` run against.

`LocalStack` picks, in order: the addresses in ``REGIONBUS_KAFKA_BOOTSTRAP_SERVERS`` /
``REGIONBUS_REDIS_URL`` (the names every regionbus process reads; the older
``KAFKA_BOOTSTRAP_SERVERS`` / ``REDIS_URL`` still work, with a warning), testcontainers
when a Docker engine answers, else an embedded Apache Kafka (`KafkaNode`) and an embedded
``redis-server`` (`EmbeddedRedis`), each a child process on loopback.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Protocol, Self

from regionbus.devstack.jvm import jvm_lib_dir, kafka_version
from regionbus.devstack.kafka_broker import KafkaCluster, KafkaNode
from regionbus.devstack.process import LOOPBACK_HOST, free_port
from regionbus.devstack.redis_cluster import EmbeddedRedisCluster
from regionbus.devstack.redis_server import EmbeddedRedis

_log = logging.getLogger(__name__)

KAFKA_ENV_VAR = "REGIONBUS_KAFKA_BOOTSTRAP_SERVERS"
REDIS_ENV_VAR = "REGIONBUS_REDIS_URL"
DEPRECATED_ENV_VARS = {KAFKA_ENV_VAR: "KAFKA_BOOTSTRAP_SERVERS", REDIS_ENV_VAR: "REDIS_URL"}
"""Each variable's older name, read when the new one is unset, with a warning."""
CONVENTIONAL_KAFKA_PORT = 9092
CONVENTIONAL_REDIS_PORT = 6379
_DOCKER_INFO_TIMEOUT_S = 3.0


class _Stoppable(Protocol):
    def stop(self) -> object: ...


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


def kafka_container_env(host_port: int) -> dict[str, str]:
    """Environment of an ``apache/kafka`` container: one KRaft node whose client listener
    is advertised as ``127.0.0.1:host_port`` (the port it is published on), topics never
    auto-created, as the embedded node."""
    return {
        "KAFKA_NODE_ID": "1",
        "KAFKA_PROCESS_ROLES": "broker,controller",
        "KAFKA_LISTENERS": "PLAINTEXT://:9092,CONTROLLER://:9093",
        "KAFKA_ADVERTISED_LISTENERS": f"PLAINTEXT://{LOOPBACK_HOST}:{host_port}",
        "KAFKA_CONTROLLER_LISTENER_NAMES": "CONTROLLER",
        "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "KAFKA_CONTROLLER_QUORUM_VOTERS": "1@localhost:9093",
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "1",
        "KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "0",
        "KAFKA_AUTO_CREATE_TOPICS_ENABLE": "false",
    }


class LocalStack:
    """One Kafka and one Redis for a test session or the demo, however they can be had.

    Each service is taken, in order, from its environment variable
    (``REGIONBUS_KAFKA_BOOTSTRAP_SERVERS``, ``REGIONBUS_REDIS_URL``; the older
    ``KAFKA_BOOTSTRAP_SERVERS`` / ``REDIS_URL`` with a warning), from testcontainers when a
    Docker engine answers, else from an embedded `KafkaNode` / `EmbeddedRedis`. Use it as a
    context manager, or call `start` and `stop`.

    Args:
        environ: Where to read the override variables; None reads ``os.environ``.
        use_docker: Force testcontainers on (True) or off (False); None probes
            ``docker info``.
        start_timeout_s: Seconds each embedded service may take to answer.
        redis_appendonly: Start the embedded Redis with the append-only file on.
        data_dir: Keep the embedded services' data here (``kafka/`` and ``redis/``, the
            Redis append-only file on), so a later stack on the same folder comes back on
            the same ports with every topic, offset and entry; None uses temporary
            folders deleted at `stop`.
        kafka_port: Port the embedded Kafka takes when it is free and ``data_dir`` keeps
            none (``regionbus stack`` passes 9092, so code written for a default Kafka
            finds it); None, or a taken port, picks a free one.
        redis_port: The same for the embedded Redis (``regionbus stack``: 6379).
        kafka_brokers: Embedded Kafka brokers: 1 (a `KafkaNode`), or a `KafkaCluster` of
            that many (3: replication 3, ``min.insync.replicas`` 2), in ``kafka-cluster/``
            of ``data_dir``.
        redis_cluster: Embed a Redis Cluster (`EmbeddedRedisCluster`: 3 masters and 3
            replicas, append-only files on) instead of one Redis, in ``redis-cluster/`` of
            ``data_dir``.

    Attributes:
        kafka_bootstrap_servers: ``host:port[,host:port]`` once started.
        redis_url: ``redis://host:port/db`` once started.
        kafka_source: ``"env"``, ``"testcontainers"`` or ``"embedded"``.
        redis_source: Same, for Redis.
        kafka: The embedded `KafkaNode` if one was started, else None.
        redis: The `EmbeddedRedis` if one was started, else None.
        kafka_cluster: The embedded `KafkaCluster` if one was started, else None.
        redis_cluster: The `EmbeddedRedisCluster` if one was started, else None.
        ports_not_taken: ``"kafka 9092"``-like notes of each asked port that was taken
            (the service then runs on another), for the caller to tell its user.
    """

    def __init__(
        self,
        *,
        environ: Mapping[str, str] | None = None,
        use_docker: bool | None = None,
        start_timeout_s: float = 60.0,
        redis_appendonly: bool = False,
        data_dir: Path | None = None,
        kafka_port: int | None = None,
        redis_port: int | None = None,
        kafka_brokers: int = 1,
        redis_cluster: bool = False,
    ) -> None:
        self._kafka_port = kafka_port
        self._kafka_brokers = kafka_brokers
        self._redis_cluster = redis_cluster
        self._redis_port = redis_port
        self.ports_not_taken: list[str] = []
        self._environ = os.environ if environ is None else environ
        self._use_docker = use_docker
        self.start_timeout_s = start_timeout_s
        self.redis_appendonly = redis_appendonly or data_dir is not None
        self.data_dir = None if data_dir is None else Path(data_dir).resolve()
        self.kafka_bootstrap_servers = ""
        self.redis_url = ""
        self.kafka_source = ""
        self.redis_source = ""
        self.kafka: KafkaNode | None = None
        self.redis: EmbeddedRedis | None = None
        self.kafka_cluster: KafkaCluster | None = None
        self.redis_cluster: EmbeddedRedisCluster | None = None
        self._containers: list[_Stoppable] = []

    @property
    def kafka_nodes(self) -> list[KafkaNode]:
        """Every embedded Kafka node (one, or each of the cluster's)."""
        if self.kafka_cluster is not None:
            return list(self.kafka_cluster.nodes)
        return [self.kafka] if self.kafka is not None else []

    @property
    def redis_nodes(self) -> list[EmbeddedRedis]:
        """Every embedded Redis node (one, or each of the cluster's)."""
        if self.redis_cluster is not None:
            return list(self.redis_cluster.nodes)
        return [self.redis] if self.redis is not None else []

    @property
    def log_paths(self) -> list[Path]:
        """The log file of every embedded process (Kafka's, then Redis')."""
        return [node.log_path for node in (*self.kafka_nodes, *self.redis_nodes)]

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

    def _service_dir(self, name: str) -> Path | None:
        return None if self.data_dir is None else self.data_dir / name

    def _from_env(self, name: str) -> str:
        value = self._environ.get(name, "").strip()
        if value:
            return value
        old = DEPRECATED_ENV_VARS[name]
        value = self._environ.get(old, "").strip()
        if value:
            _log.warning("environment variable %s is deprecated: set %s instead", old, name)
        return value

    def _prefer(self, service: KafkaNode | EmbeddedRedis, port: int | None) -> None:
        if port is not None and not service.prefer_port(port):
            self.ports_not_taken.append(f"{service.name} {port}")

    def _start_kafka(self) -> None:
        from_env = self._from_env(KAFKA_ENV_VAR)
        if from_env:
            self.kafka_bootstrap_servers, self.kafka_source = from_env, "env"
            return
        if self._kafka_brokers > 1:
            self.kafka_cluster = KafkaCluster(
                nodes=self._kafka_brokers,
                work_dir=self._service_dir("kafka-cluster"),
                start_timeout_s=self.start_timeout_s * 1.5,
            )
            if self._kafka_port is not None and not self.kafka_cluster.prefer_port(
                self._kafka_port
            ):
                self.ports_not_taken.append(f"kafka {self._kafka_port}")
            self.kafka_bootstrap_servers = self.kafka_cluster.start()
            self.kafka_source = "embedded"
            return
        if self._docker():
            bootstrap = self._kafka_container()
            if bootstrap is not None:
                self.kafka_bootstrap_servers, self.kafka_source = bootstrap, "testcontainers"
                return
        self.kafka = KafkaNode(
            work_dir=self._service_dir("kafka"), start_timeout_s=self.start_timeout_s
        )
        self._prefer(self.kafka, self._kafka_port)
        self.kafka_bootstrap_servers, self.kafka_source = self.kafka.start(), "embedded"

    def _start_redis(self) -> None:
        from_env = self._from_env(REDIS_ENV_VAR)
        if from_env:
            self.redis_url, self.redis_source = from_env, "env"
            return
        if self._redis_cluster:
            self.redis_cluster = EmbeddedRedisCluster(
                work_dir=self._service_dir("redis-cluster"),
                start_timeout_s=self.start_timeout_s,
            )
            self.redis_url, self.redis_source = self.redis_cluster.start(), "embedded"
            return
        if self._docker():
            url = self._redis_container()
            if url is not None:
                self.redis_url, self.redis_source = url, "testcontainers"
                return
        self.redis = EmbeddedRedis(
            appendonly=self.redis_appendonly,
            work_dir=self._service_dir("redis"),
            start_timeout_s=self.start_timeout_s,
        )
        self._prefer(self.redis, self._redis_port)
        self.redis_url, self.redis_source = self.redis.start(), "embedded"

    def _kafka_container(self) -> str | None:
        try:
            from testcontainers.core.container import DockerContainer
            from testcontainers.core.waiting_utils import wait_for_logs

            image = f"apache/kafka:{kafka_version(jvm_lib_dir('kafka'))}"
            host_port = free_port()
            container = DockerContainer(image).with_bind_ports(9092, host_port)
            for name, value in kafka_container_env(host_port).items():
                container.with_env(name, value)
        except Exception:
            _log.warning("testcontainers Kafka unusable; using the embedded one", exc_info=True)
            return None
        self._containers.append(container)
        try:
            container.start()
            wait_for_logs(container, "Kafka Server started", timeout=self.start_timeout_s)
        except Exception:
            _log.warning("testcontainers Kafka failed; using the embedded one", exc_info=True)
            self._stop_container(container)
            return None
        return f"{LOOPBACK_HOST}:{host_port}"

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
        for service in (self.kafka, self.redis, self.redis_cluster):
            if service is not None:
                service.close()
        if self.kafka_cluster is not None:
            self.kafka_cluster.stop()
            self.kafka_cluster.close()
        self.kafka = None
        self.redis = None
        self.kafka_cluster = None
        self.redis_cluster = None
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
