"""A Redis Cluster of Debian's ``redis-server`` processes on loopback: masters and replicas.

Each node is an :class:`EmbeddedRedis` in cluster mode with the append-only file on, in its
own folder of the cluster's work dir. The first start forms the cluster with ``redis-cli
--cluster create`` (Redis' own tool: slots spread evenly over the masters, each master
given its replicas on other nodes); a later start on the same work dir brings every node
back on its port with its ``nodes.conf``, and the nodes find each other again.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Final

import redis
from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_fixed

from regionbus.devstack.process import (
    LOOPBACK_HOST,
    PORT_ATTEMPTS,
    Closing,
    PortInUseError,
    ServiceNotReadyError,
    run_tool,
)
from regionbus.devstack.redis_server import EmbeddedRedis
from regionbus.schemas.errors import StackError

_log = logging.getLogger(__name__)

DEFAULT_NODE_TIMEOUT_MS: Final = 5_000
"""``cluster-node-timeout`` of the local cluster: a master unreachable this long is marked
failed and its replica promoted (Redis' default is 15 s; a laptop's loopback cluster wants
a quicker failover, and a loaded machine must not see a busy node as failed)."""

_READY_POLL_INTERVAL_S: Final = 0.2
_CREATE_TIMEOUT_S: Final = 60.0


class EmbeddedRedisCluster(Closing):
    """``masters`` Redis masters with ``replicas`` replicas each, on loopback, one cluster.

    Used as a context manager it starts on enter and on exit stops every node and deletes
    the work dir if it created it.

    Args:
        masters: Master nodes (Redis Cluster needs at least 3).
        replicas: Replicas per master.
        work_dir: Parent of each node's folder (``node-1`` ...); None creates a temporary
            one, deleted by `close`.
        node_timeout_ms: ``cluster-node-timeout`` (default :data:`DEFAULT_NODE_TIMEOUT_MS`).
        appendfsync: Redis ``appendfsync`` of every node (``"everysec"`` or ``"always"``).
        start_timeout_s: Seconds each node may take to answer, and the cluster to report
            ``cluster_state:ok`` on every node.

    Raises:
        StackError: ``redis-server`` or ``redis-cli`` is not on PATH, or fewer than 3
            masters are asked for.
    """

    def __init__(
        self,
        *,
        masters: int = 3,
        replicas: int = 1,
        work_dir: Path | None = None,
        node_timeout_ms: int = DEFAULT_NODE_TIMEOUT_MS,
        appendfsync: str = "everysec",
        start_timeout_s: float = 60.0,
    ) -> None:
        if masters < 3:
            raise StackError(f"a Redis Cluster needs at least 3 masters, not {masters}")
        cli = shutil.which("redis-cli")
        if cli is None:
            raise StackError(
                "redis-cli is not on PATH: install it with `apt-get install redis-tools`"
            )
        self._cli = cli
        self.masters = masters
        self.replicas = replicas
        self.start_timeout_s = start_timeout_s
        self._owns_work_dir = work_dir is None
        self.work_dir = (
            Path(tempfile.mkdtemp(prefix="regionbus-redis-cluster-"))
            if work_dir is None
            else Path(work_dir).resolve()
        )
        self.nodes = [
            EmbeddedRedis(
                appendonly=True,
                appendfsync=appendfsync,
                work_dir=self.work_dir / f"node-{i + 1}",
                start_timeout_s=start_timeout_s,
                cluster_node_timeout_ms=node_timeout_ms,
            )
            for i in range(masters * (1 + replicas))
        ]
        self.started_in_s = 0.0

    @property
    def name(self) -> str:
        """Short name of the service, for logs and errors."""
        return "redis-cluster"

    @property
    def log_path(self) -> Path:
        """The first node's log (each node logs in its own folder)."""
        return self.nodes[0].log_path

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0`` of the first running node: the address a redis-py
        ``RedisCluster`` starts from (it learns the other nodes from it).

        Raises:
            StackError: no node runs.
        """
        for node in self.nodes:
            if node.pid is not None:
                return node.url
        raise StackError("no node of the Redis Cluster is running")

    def start(self) -> str:
        """Start every node, form the cluster on a new work dir, wait until every running
        node reports ``cluster_state:ok``.

        Returns:
            :attr:`url`.

        Raises:
            StackError: a node did not start, ``redis-cli --cluster create`` failed, or the
                cluster was not ok within ``start_timeout_s``.
        """
        began = time.monotonic()
        formed = all((node.work_dir / "nodes.conf").exists() for node in self.nodes)
        try:
            for node in self.nodes:
                node.launch()
            for node in self.nodes:
                self._wait_ready(node, formed)
            if not formed or not self._has_slots():
                self._create()
            self.wait_ok()
        except BaseException:
            self.stop()
            raise
        self.started_in_s = time.monotonic() - began
        return self.url

    @staticmethod
    def _wait_ready(node: EmbeddedRedis, formed: bool) -> None:
        """Wait for one launched node. A node of a cluster not formed yet whose port or bus
        port was taken before it bound (the ports are probed, not reserved) is launched
        again on new ones, as a single server is (`ManagedProcess.start`).

        Raises:
            PortInUseError: a formed cluster's node found its port taken (it must keep
                it), or every attempt found one taken.
            StackError: the node exited or did not answer in time.
        """
        for attempt in range(PORT_ATTEMPTS):
            try:
                node.wait_ready()
                return
            except PortInUseError:
                if formed or attempt == PORT_ATTEMPTS - 1:
                    raise
                _log.info("redis cluster node: a port was taken before it bound, retrying")
                node.forget_ports()
                node.launch()

    def _has_slots(self) -> bool:
        info = self._info(self.nodes[0])
        return info.get("cluster_slots_assigned") == "16384"

    def _create(self) -> None:
        addresses = [f"{LOOPBACK_HOST}:{node.port}" for node in self.nodes]
        command = [
            self._cli,
            "--cluster",
            "create",
            *addresses,
            "--cluster-replicas",
            str(self.replicas),
            "--cluster-yes",
        ]
        run_tool(command, "redis-cli --cluster create", _CREATE_TIMEOUT_S)

    @staticmethod
    def _info(node: EmbeddedRedis) -> dict[str, str]:
        assert node.port is not None
        client = redis.Redis(host=LOOPBACK_HOST, port=node.port, socket_timeout=2.0)
        try:
            info = client.execute_command("CLUSTER INFO")  # parsed by redis-py
        finally:
            client.close()
        return {str(k): str(v) for k, v in info.items()}

    @staticmethod
    def _replication(node: EmbeddedRedis) -> dict[str, Any]:
        assert node.port is not None
        client = redis.Redis(host=LOOPBACK_HOST, port=node.port, socket_timeout=2.0)
        try:
            return dict(client.info("replication"))
        finally:
            client.close()

    def wait_ok(self, timeout_s: float | None = None) -> None:
        """Wait until every running node reports ``cluster_state:ok`` with every slot
        assigned and served, and every running replica is linked to its master (after a
        start, or a failover in a test).

        Args:
            timeout_s: Longest wait in seconds; None waits ``start_timeout_s``.

        Raises:
            StackError: not ok in time.
        """

        def check() -> None:
            for node in self.nodes:
                if node.pid is None:
                    continue
                try:
                    info = self._info(node)
                except redis.RedisError as exc:
                    raise ServiceNotReadyError(f"node {node.port}: {exc}") from exc
                if info.get("cluster_state") != "ok" or info.get("cluster_slots_ok") != "16384":
                    raise ServiceNotReadyError(f"node {node.port}: {info.get('cluster_state')}")
                role = self._replication(node)
                if role.get("role") == "slave" and role.get("master_link_status") != "up":
                    raise ServiceNotReadyError(f"replica {node.port}: not linked to its master")

        try:
            for attempt in Retrying(
                stop=stop_after_delay(self.start_timeout_s if timeout_s is None else timeout_s),
                wait=wait_fixed(_READY_POLL_INTERVAL_S),
                retry=retry_if_exception_type(ServiceNotReadyError),
                reraise=True,
            ):
                with attempt:
                    check()
        except ServiceNotReadyError as exc:
            raise StackError(f"Redis Cluster not ok: {exc}") from exc

    def master_of(self, key: str) -> EmbeddedRedis:
        """The node serving ``key``'s hash slot as master now.

        Raises:
            StackError: no running node serves it.
        """
        for node in self.nodes:
            if node.pid is None:
                continue
            assert node.port is not None
            client = redis.Redis(host=LOOPBACK_HOST, port=node.port, socket_timeout=2.0)
            try:
                slot = int(client.execute_command("CLUSTER KEYSLOT", key))
                for start, end, master, *_ in client.execute_command("CLUSTER SLOTS"):
                    if start <= slot <= end:
                        port = int(master[1])
                        for candidate in self.nodes:
                            if candidate.port == port:
                                return candidate
            finally:
                client.close()
        raise StackError(f"no running node serves the slot of {key!r}")

    def replicas_of(self, master: EmbeddedRedis) -> list[EmbeddedRedis]:
        """The running nodes that replicate ``master`` now."""
        return [
            node
            for node in self.nodes
            if node is not master
            and node.pid is not None
            and self._replication(node).get("master_port") == master.port
        ]

    def stop(self) -> None:
        """Stop every node (SIGTERM, then SIGKILL); the work dir stays until `close`."""
        for node in self.nodes:
            node.stop()

    def close(self) -> None:
        """Stop every node and delete the work dir if this object created it."""
        self.stop()
        if self._owns_work_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)


__all__ = ["DEFAULT_NODE_TIMEOUT_MS", "EmbeddedRedisCluster"]
