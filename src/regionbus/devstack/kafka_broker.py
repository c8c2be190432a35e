"""Apache Kafka in KRaft mode as child processes: one node, or a cluster of several.

Each node is a combined broker and controller (``process.roles=broker,controller``) run
from the jars that ``scripts/bootstrap.sh`` resolved (`regionbus.devstack.jvm`), with its log on
disk in its work dir. The storage is formatted on the first start only, so stopping and
starting a node on the same work dir keeps every topic, message and committed offset,
and it comes back on the same ports (kept in ``kafka.json``).

Optionally the client listener is SASL/SCRAM (SCRAM-SHA-512) with Kafka's
``StandardAuthorizer``: the admin user is written into the metadata at format time, and
more users are added with the admin API (see `add_scram_users`). With TLS files as well,
that listener is SASL_SSL, the broker's key and certificate read from a PEM key store.
"""

from __future__ import annotations

import base64
import json
import logging
import socket
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialAlteration,
    UserScramCredentialUpsertion,
)

from regionbus.devstack.jvm import java_program, jvm_lib_dir, kafka_version
from regionbus.devstack.process import (
    LOOPBACK_HOST,
    ChildService,
    Closing,
    PortInUseError,
    ServiceNotReadyError,
    free_port,
    port_free,
    run_tool,
)
from regionbus.devstack.tls import TlsFiles
from regionbus.schemas.errors import StackError
from regionbus.schemas.kafka_clients import kafka_admin

_log = logging.getLogger(__name__)

SCRAM_MECHANISM = "SCRAM-SHA-512"
_SCRAM_ITERATIONS = 8192
_CLUSTER_ATTEMPTS = 3
_STORAGE_FORMAT_TIMEOUT_S = 120.0

_LOG4J2 = """\
# Warnings and errors only, plus the line that says the server started.
rootLogger.level=WARN
rootLogger.appenderRef.stdout.ref=STDOUT
appender.stdout.type=Console
appender.stdout.name=STDOUT
appender.stdout.layout.type=PatternLayout
appender.stdout.layout.pattern=[%d] %p %m (%c)%n
logger.started.name=kafka.server.KafkaRaftServer
logger.started.level=INFO
"""


@dataclass(frozen=True)
class ScramSecurity:
    """SASL/SCRAM-SHA-512 on the client listener, with ACLs enforced; over TLS optionally.

    Attributes:
        admin_user: A super user, created at format time; the brokers also talk to each
            other as this user.
        admin_password: Its password.
        users: More ``{user: password}`` created once the node runs.
        tls: The CA and the broker's certificate and key (for ``127.0.0.1``); None for
            SASL_PLAINTEXT. With them the listener is SASL_SSL and clients verify the
            broker against ``tls.ca_cert``.
    """

    admin_user: str
    admin_password: str
    users: Mapping[str, str] = field(default_factory=dict)
    tls: TlsFiles | None = None

    @property
    def protocol(self) -> str:
        """The client listener's ``security.protocol``: SASL_SSL or SASL_PLAINTEXT."""
        return "SASL_SSL" if self.tls is not None else "SASL_PLAINTEXT"

    def client_config(self, user: str | None = None, password: str | None = None) -> dict[str, str]:
        """librdkafka keys for a client that logs in as ``user`` (the admin when None).

        Raises:
            KeyError: ``user`` is not in :attr:`users` and no ``password`` is given.
        """
        name = self.admin_user if user is None else user
        secret = self.admin_password if user is None else (password or self.users[name])
        config = {
            "security.protocol": self.protocol,
            "sasl.mechanism": SCRAM_MECHANISM,
            "sasl.username": name,
            "sasl.password": secret,
        }
        if self.tls is not None:
            config["ssl.ca.location"] = str(self.tls.ca_cert)
        return config


def new_cluster_id() -> str:
    """A random KRaft cluster id: 16 bytes, URL-safe base64 without padding (22 chars).

    Never one with a ``-``: the storage tool reads an id that starts with one as an option
    (``-t -x...``: "expected one argument"), so Kafka's own ``Uuid.randomUuid`` draws
    again when the id holds a dash, and so does this.
    """
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if "-" not in cluster_id:
            return cluster_id


class KafkaNode(ChildService):
    """One Apache Kafka KRaft node (broker and controller) on two loopback ports.

    Used as a context manager it starts on enter and on exit stops and, if it created its
    work dir, deletes it.

    Args:
        port: Client listener port; None reuses the port kept in ``kafka.json`` of a
            ``work_dir`` used before, else picks a free one.
        controller_port: Controller listener port; None as for ``port``.
        node_id: KRaft ``node.id``.
        voters: ``controller.quorum.voters`` (``"1@127.0.0.1:9093,..."``); None makes this
            node the only voter.
        cluster_id: The KRaft cluster id to format with; None keeps the id of an already
            formatted work dir, else creates one.
        work_dir: Home of ``server.properties``, the ``data`` log dir and ``kafka.log``;
            None creates a temporary one.
        broker_properties: More broker properties, overriding the defaults here.
        security: SCRAM users and ACLs; None for a PLAINTEXT listener with no ACLs.
        heap_max_mb: JVM ``-Xmx`` in MiB.
        start_timeout_s: Seconds `start` waits for a metadata request to succeed.
        stop_timeout_s: Seconds `stop` waits after SIGTERM (controlled shutdown) before
            SIGKILL.

    Raises:
        StackError: no Java, or no Kafka jars (run ``scripts/bootstrap.sh``).
    """

    _name = "kafka"

    def __init__(
        self,
        *,
        port: int | None = None,
        controller_port: int | None = None,
        node_id: int = 1,
        voters: str | None = None,
        cluster_id: str | None = None,
        work_dir: Path | None = None,
        broker_properties: Mapping[str, str] | None = None,
        security: ScramSecurity | None = None,
        heap_max_mb: int = 1024,
        start_timeout_s: float = 60.0,
        stop_timeout_s: float = 20.0,
    ) -> None:
        self._java = java_program()
        self._lib_dir = jvm_lib_dir("kafka")
        super().__init__(
            port=port,
            work_dir=work_dir,
            start_timeout_s=start_timeout_s,
            stop_timeout_s=stop_timeout_s,
        )
        kept = self.kept_state()
        self.controller_port = controller_port or kept.get("controller_port")
        self.node_id = node_id
        self.voters = voters
        self.cluster_id = cluster_id or kept.get("cluster_id") or new_cluster_id()
        self.broker_properties = dict(broker_properties or {})
        self.security = security
        self.heap_max_mb = heap_max_mb
        self.data_dir = self.work_dir / "data"
        self.started_in_s: float | None = None
        """Seconds the last `start` took, from launch to the first metadata answer."""

    @property
    def version(self) -> str:
        """The Apache Kafka version this node runs (from its jars)."""
        return kafka_version(self._lib_dir)

    @property
    def bootstrap_servers(self) -> str:
        """``"127.0.0.1:PORT"`` of the running node.

        Raises:
            StackError: the node is not running.
        """
        if self.pid is None or self._port is None:
            raise StackError("Kafka node is not running")
        return self._address(self._port)

    def client_config(self) -> dict[str, str]:
        """librdkafka keys an admin client of this node needs (bootstrap and, with SCRAM,
        the admin's login)."""
        assert self._port is not None
        config = {"bootstrap.servers": self._address(self._port)}
        if self.security is not None:
            config.update(self.security.client_config())
        return config

    def _state(self) -> dict[str, Any]:
        return {"controller_port": self.controller_port, "cluster_id": self.cluster_id}

    def properties(self, port: int) -> dict[str, str]:
        """The broker's ``server.properties`` for a client listener on ``port``."""
        assert self.controller_port is not None
        listener = self.security.protocol if self.security is not None else "PLAINTEXT"
        props = {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            "controller.quorum.voters": self.voters
            or f"{self.node_id}@{LOOPBACK_HOST}:{self.controller_port}",
            "listeners": f"{listener}://{LOOPBACK_HOST}:{port},"
            f"CONTROLLER://{LOOPBACK_HOST}:{self.controller_port}",
            "advertised.listeners": f"{listener}://{LOOPBACK_HOST}:{port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": listener,
            "listener.security.protocol.map": f"{listener}:{listener},CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.data_dir),
            # Topics are created by the servers and clients, with their partition counts.
            "auto.create.topics.enable": "false",
            "num.partitions": "1",
            "group.initial.rebalance.delay.ms": "0",
            # A local broker: fewer internal partitions start faster and use less memory.
            "offsets.topic.num.partitions": "8",
            "transaction.state.log.num.partitions": "4",
            "offsets.topic.replication.factor": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "num.network.threads": "2",
            "num.io.threads": "4",
            "log.cleaner.threads": "1",
        }
        if self.security is not None:
            admin = self.security
            jaas = f"listener.name.{listener.lower()}.{SCRAM_MECHANISM.lower()}.sasl.jaas.config"
            props.update(
                {
                    "sasl.enabled.mechanisms": SCRAM_MECHANISM,
                    "sasl.mechanism.inter.broker.protocol": SCRAM_MECHANISM,
                    jaas: (
                        "org.apache.kafka.common.security.scram.ScramLoginModule required "
                        f'username="{admin.admin_user}" password="{admin.admin_password}";'
                    ),
                    "authorizer.class.name": (
                        "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
                    ),
                    # The controller listener is PLAINTEXT on loopback and never advertised:
                    # the nodes' own requests to it arrive as ANONYMOUS.
                    "super.users": f"User:{admin.admin_user};User:ANONYMOUS",
                    "allow.everyone.if.no.acl.found": "false",
                }
            )
            if admin.tls is not None:
                props.update(
                    {
                        # Kafka reads PEM directly: the key (unencrypted PKCS#8) and the
                        # certificate in one key store file, the CA as the trust store (the
                        # brokers are also each other's TLS clients).
                        "ssl.keystore.type": "PEM",
                        "ssl.keystore.location": str(self.work_dir / "keystore.pem"),
                        "ssl.truststore.type": "PEM",
                        "ssl.truststore.location": str(admin.tls.ca_cert),
                    }
                )
        props.update(self.broker_properties)
        return props

    def _java_command(self, main_class: str, *args: str) -> list[str]:
        return [
            self._java,
            "-Xms128m",
            f"-Xmx{self.heap_max_mb}m",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-XX:InitiatingHeapOccupancyPercent=35",
            "-XX:+ExitOnOutOfMemoryError",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.work_dir / 'log4j2.properties'}",
            "-cp",
            f"{self._lib_dir}/*",
            main_class,
            *args,
        ]

    def _prepare(self, port: int) -> None:
        if self.controller_port is None:
            self.controller_port = free_port()
        (self.work_dir / "log4j2.properties").write_text(_LOG4J2)
        if self.security is not None and self.security.tls is not None:
            tls = self.security.tls
            keystore = self.work_dir / "keystore.pem"
            keystore.touch(mode=0o600)
            keystore.write_bytes(tls.server_key.read_bytes() + tls.server_cert.read_bytes())
        config = self.work_dir / "server.properties"
        config.write_text(
            "".join(f"{key}={value}\n" for key, value in self.properties(port).items())
        )
        if not (self.data_dir / "meta.properties").is_file():
            self._format(config)

    def _format(self, config: Path) -> None:
        command = self._java_command(
            "kafka.tools.StorageTool", "format", "-t", self.cluster_id, "-c", str(config)
        )
        if self.security is not None:
            command += [
                "--add-scram",
                f"{SCRAM_MECHANISM}=[name={self.security.admin_user},"
                f"password={self.security.admin_password}]",
            ]
        run_tool(
            command,
            f"formatting Kafka storage in {self.data_dir}",
            _STORAGE_FORMAT_TIMEOUT_S,
            cwd=self.work_dir,
        )

    def _command(self, port: int) -> list[str]:
        return self._java_command("kafka.Kafka", str(self.work_dir / "server.properties"))

    def _address(self, port: int) -> str:
        return f"{LOOPBACK_HOST}:{port}"

    def _probe(self, port: int) -> None:
        probe_brokers(self.client_config(), 1)

    def start(self) -> str:
        """Format the storage if new, start the node and wait until it answers metadata.

        Returns:
            The bootstrap servers, ``"127.0.0.1:PORT"``.

        Raises:
            StackError: no Java or jars, formatting failed, the node exited, or it did
                not answer within ``start_timeout_s`` seconds. The message ends with the
                log's tail.
        """
        began = time.monotonic()
        address = super().start()
        self.started_in_s = time.monotonic() - began
        if self.security is not None and self.security.users:
            add_scram_users(self.client_config(), self.security.users)
        return address


EmbeddedKafka = KafkaNode
"""A single-node Apache Kafka: `KafkaNode` with its defaults."""


def probe_brokers(client_config: Mapping[str, str], brokers: int) -> None:
    """Raise `ServiceNotReadyError` until ``brokers`` brokers answer a metadata request.

    Args:
        client_config: librdkafka keys, ``bootstrap.servers`` among them.
        brokers: How many registered brokers the metadata must list.
    """
    first = client_config["bootstrap.servers"].split(",")[0]
    host, _, port = first.rpartition(":")
    # A bare TCP check first keeps librdkafka from logging "connection refused".
    try:
        socket.create_connection((host, int(port)), timeout=1.0).close()
    except OSError as exc:
        raise ServiceNotReadyError(str(exc)) from exc
    admin = kafka_admin({**client_config, "log_level": 3})
    try:
        metadata = admin.list_topics(timeout=2.0)
    except KafkaException as exc:
        raise ServiceNotReadyError(f"metadata request failed: {exc}") from exc
    if len(metadata.brokers) < brokers:
        raise ServiceNotReadyError(f"{len(metadata.brokers)} of {brokers} brokers registered")


def add_scram_users(client_config: Mapping[str, str], users: Mapping[str, str]) -> None:
    """Create or update SCRAM-SHA-512 users with the admin API.

    Args:
        client_config: librdkafka keys of a super user.
        users: ``{user: password}``.

    Raises:
        StackError: the broker refused.
    """
    admin = kafka_admin(dict(client_config))
    upserts: list[UserScramCredentialAlteration] = [
        UserScramCredentialUpsertion(
            user,
            ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, _SCRAM_ITERATIONS),
            password.encode(),
        )
        for user, password in users.items()
    ]
    for user, future in admin.alter_user_scram_credentials(upserts).items():
        try:
            future.result(timeout=30)
        except KafkaException as exc:
            raise StackError(f"cannot create SCRAM user {user}: {exc}") from exc


class KafkaCluster(Closing):
    """Several Apache Kafka KRaft nodes on loopback, each a broker and a voter.

    Topics default to replication factor ``min(3, nodes)`` with ``min.insync.replicas``
    one less (at least 1). Used as a context manager it starts on enter and on exit kills
    every node and deletes the work dirs it created. Started again on a ``work_dir`` used
    before, every node comes back on its ports with its log (each node's ``kafka.json``
    keeps its ports and the cluster id), as a `KafkaNode` does.

    Args:
        nodes: Number of nodes (3 gives a quorum that survives one node's loss).
        work_dir: Parent of each node's work dir; None creates temporary ones.
        broker_properties: More properties for every node.
        security: SCRAM users and ACLs on the client listeners; None for PLAINTEXT.
        heap_max_mb: JVM ``-Xmx`` of each node, in MiB.
        start_timeout_s: Seconds `start` waits for every broker to register.
    """

    def __init__(
        self,
        *,
        nodes: int = 3,
        work_dir: Path | None = None,
        broker_properties: Mapping[str, str] | None = None,
        security: ScramSecurity | None = None,
        heap_max_mb: int = 512,
        start_timeout_s: float = 90.0,
    ) -> None:
        self.size = nodes
        self._work_dir = work_dir
        replication = min(3, nodes)
        self.broker_properties = {
            "default.replication.factor": str(replication),
            "min.insync.replicas": str(max(1, replication - 1)),
            "offsets.topic.replication.factor": str(replication),
            "transaction.state.log.replication.factor": str(replication),
            "transaction.state.log.min.isr": str(max(1, replication - 1)),
            "share.coordinator.state.topic.replication.factor": str(replication),
            "share.coordinator.state.topic.min.isr": str(max(1, replication - 1)),
            **(broker_properties or {}),
        }
        self.security = security
        self.heap_max_mb = heap_max_mb
        self.start_timeout_s = start_timeout_s
        self.nodes: list[KafkaNode] = []
        self._first_port: int | None = None

    def prefer_port(self, port: int) -> bool:
        """Give the first node ``port`` for its client listener when it is free and the
        work dir keeps no ports (``regionbus stack`` asks for 9092).

        Returns:
            True when the first node will use ``port``.
        """
        kept = self._kept()
        if kept:
            return kept[0][0] == port
        if port_free(port):
            self._first_port = port
        return self._first_port == port

    def _kept(self) -> list[tuple[int, int, str]]:
        """``(port, controller port, cluster id)`` of each node from a work dir used before,
        or empty when there is none (or it is incomplete)."""
        if self._work_dir is None:
            return []
        kept = []
        for i in range(self.size):
            try:
                state = json.loads((self._work_dir / f"node-{i + 1}" / "kafka.json").read_text())
                kept.append(
                    (int(state["port"]), int(state["controller_port"]), state["cluster_id"])
                )
            except (OSError, ValueError, KeyError, TypeError):
                return []
        return kept if len({cluster for _, _, cluster in kept}) == 1 else []

    @property
    def bootstrap_servers(self) -> str:
        """Every node's client address, comma-separated."""
        return ",".join(f"{LOOPBACK_HOST}:{node.port}" for node in self.nodes)

    def client_config(self) -> dict[str, str]:
        """librdkafka keys of an admin client of the cluster."""
        config = {"bootstrap.servers": self.bootstrap_servers}
        if self.security is not None:
            config.update(self.security.client_config())
        return config

    def _build(self) -> None:
        kept = self._kept()
        if kept:
            ports = [(port, controller) for port, controller, _ in kept]
            cluster_id = kept[0][2]
        else:
            ports = [(free_port(), free_port()) for _ in range(self.size)]
            if self._first_port is not None and port_free(self._first_port):
                ports[0] = (self._first_port, ports[0][1])
            cluster_id = new_cluster_id()
        voters = ",".join(
            f"{i + 1}@{LOOPBACK_HOST}:{controller}" for i, (_, controller) in enumerate(ports)
        )
        self.nodes = [
            KafkaNode(
                port=port,
                controller_port=controller,
                node_id=i + 1,
                voters=voters,
                cluster_id=cluster_id,
                work_dir=None if self._work_dir is None else self._work_dir / f"node-{i + 1}",
                broker_properties=self.broker_properties,
                security=self.security,
                heap_max_mb=self.heap_max_mb,
                start_timeout_s=self.start_timeout_s,
            )
            for i, (port, controller) in enumerate(ports)
        ]

    def start(self) -> str:
        """Start every node together (a quorum needs a majority) and wait for all brokers.

        Returns:
            The bootstrap servers.

        Raises:
            StackError: a node exited or the brokers did not all register in time.
        """
        for _ in range(_CLUSTER_ATTEMPTS):
            self._build()
            try:
                for node in self.nodes:
                    node.launch()
                for node in self.nodes:
                    node.wait_ready()
                deadline = time.monotonic() + self.start_timeout_s
                while True:
                    try:
                        probe_brokers(self.client_config(), self.size)
                        break
                    except ServiceNotReadyError as exc:
                        if time.monotonic() > deadline:
                            raise StackError(f"Kafka cluster not ready: {exc}") from exc
                        time.sleep(0.1)
            except PortInUseError:
                self.close()
                continue
            except BaseException:
                self.close()
                raise
            if self.security is not None and self.security.users:
                add_scram_users(self.client_config(), self.security.users)
            return self.bootstrap_servers
        raise StackError("Kafka cluster: ports were taken on every attempt")

    def node_of_broker(self, broker_id: int) -> KafkaNode:
        """The node whose ``node.id`` is ``broker_id`` (as metadata names leaders)."""
        return next(node for node in self.nodes if node.node_id == broker_id)

    def stop(self, nodes: Sequence[KafkaNode] | None = None) -> None:
        """SIGTERM the given nodes (every node when None) at once, then wait for each."""
        for node in nodes or self.nodes:
            node.terminate()
        for node in nodes or self.nodes:
            node.stop()

    def close(self) -> None:
        """Kill every node (the data goes too, unless ``work_dir`` was given)."""
        for node in self.nodes:
            node.kill()
            node.close()
