"""Debian's ``redis-server`` as a child process on a loopback port."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import redis

from regionbus.devstack.process import (
    LOOPBACK_HOST,
    ChildService,
    ServiceNotReadyError,
    free_port,
)
from regionbus.schemas.errors import StackError


class EmbeddedRedis(ChildService):
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
        cluster_node_timeout_ms: Run as a Redis Cluster node (``cluster-enabled``) with this
            ``cluster-node-timeout``: how long a node may be unreachable before the others
            mark it failed and promote its replica. None runs a stand-alone server. A
            cluster node keeps its cluster configuration (``nodes.conf``) and its bus port
            in ``work_dir``, so it rejoins its cluster on a restart; its slots need not all
            be served for it to answer (``cluster-require-full-coverage no``), so the loss
            of one master stops only that master's slots.

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
        cluster_node_timeout_ms: int | None = None,
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
        self.cluster_node_timeout_ms = cluster_node_timeout_ms
        kept_bus_port = self.kept_state().get("cluster_port")
        self.cluster_port: int | None = kept_bus_port if isinstance(kept_bus_port, int) else None
        """The cluster bus port of a cluster node (Redis' default, port + 10000, can pass
        65535 for a free port), chosen at the first start and kept with the work dir."""

    def forget_ports(self) -> None:
        """Choose new ports (the client port and the cluster bus port) at the next launch:
        for a node that never started, whose port something else took before it bound.

        Raises:
            StackError: the node started before (clients and its cluster keep its ports).
        """
        if self._fixed_port:
            raise StackError(f"{self._name}: a node that started keeps its ports")
        self._port = None
        self.cluster_port = None

    @property
    def url(self) -> str:
        """``"redis://127.0.0.1:PORT/0"`` of the running server.

        Raises:
            StackError: the server is not running.
        """
        if self.pid is None or self._port is None:
            raise StackError("EmbeddedRedis is not running")
        return self._address(self._port)

    def _state(self) -> dict[str, Any]:
        return {} if self.cluster_port is None else {"cluster_port": self.cluster_port}

    def _command(self, port: int) -> list[str]:
        cluster: list[str] = []
        if self.cluster_node_timeout_ms is not None:
            if self.cluster_port is None:
                self.cluster_port = free_port()
            cluster = [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-port",
                str(self.cluster_port),
                "--cluster-node-timeout",
                str(self.cluster_node_timeout_ms),
                "--cluster-require-full-coverage",
                "no",
            ]
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
            *cluster,
        ]

    def _address(self, port: int) -> str:
        return f"redis://{LOOPBACK_HOST}:{port}/0"

    def _probe(self, port: int) -> None:
        client = redis.Redis(host=LOOPBACK_HOST, port=port, socket_timeout=1.0)
        try:
            client.ping()
        except redis.RedisError as exc:
            raise ServiceNotReadyError(str(exc)) from exc
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
