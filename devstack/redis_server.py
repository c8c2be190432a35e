"""Debian's ``redis-server`` as a child process on a loopback port."""

from __future__ import annotations

import shutil
from pathlib import Path

import redis

from regionbus.devstack.process import LOOPBACK_HOST, ChildService, ServiceNotReadyError
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
