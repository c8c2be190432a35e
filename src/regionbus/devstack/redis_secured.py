"""A local ``redis-server`` that requires an ACL user and password, optionally over TLS.

The secured counterpart of :class:`regionbus.devstack.redis_server.EmbeddedRedis`, for tests and
local trials
of docker-compose.secured.yml: the default user is switched off, one ACL user is created from the
command line (``--user NAME on >PASSWORD ~PATTERN &* +@all``), and with TLS files the plain
port is closed and only ``--tls-port`` listens (Debian's ``redis-server`` is built with TLS).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import redis

from regionbus.devstack.process import LOOPBACK_HOST, ServiceNotReadyError
from regionbus.devstack.redis_server import EmbeddedRedis
from regionbus.devstack.tls import TlsFiles


class SecuredEmbeddedRedis(EmbeddedRedis):
    """A ``redis-server`` child with one ACL user (the default user off), optionally TLS.

    Args:
        username: The ACL user to create.
        password: Its password.
        key_pattern: Keys the user may touch (ACL ``~pattern``), e.g. ``"rb:*"``.
        tls: TLS files; None for a plain TCP port. With ``tls.client_cert`` set, clients
            must present a certificate signed by the CA (``tls-auth-clients yes``).
        port, work_dir, start_timeout_s, stop_timeout_s: As :class:`EmbeddedRedis`.

    Raises:
        StackError: ``redis-server`` is not on PATH.
    """

    _name = "redis-secured"

    def __init__(
        self,
        *,
        username: str,
        password: str,
        key_pattern: str = "*",
        tls: TlsFiles | None = None,
        port: int | None = None,
        work_dir: Path | None = None,
        start_timeout_s: float = 20.0,
        stop_timeout_s: float = 10.0,
    ) -> None:
        super().__init__(
            port=port,
            work_dir=work_dir,
            start_timeout_s=start_timeout_s,
            stop_timeout_s=stop_timeout_s,
        )
        self.username = username
        self.password = password
        self.key_pattern = key_pattern
        self.tls = tls

    def _command(self, port: int) -> list[str]:
        command = super()._command(port)
        command += [
            "--user",
            "default",
            "off",
            "--user",
            self.username,
            "on",
            f">{self.password}",
            f"~{self.key_pattern}",
            "&*",
            "+@all",
        ]
        if self.tls is not None:
            command[command.index("--port") + 1] = "0"
            command += [
                "--tls-port",
                str(port),
                "--tls-cert-file",
                str(self.tls.server_cert),
                "--tls-key-file",
                str(self.tls.server_key),
                "--tls-ca-cert-file",
                str(self.tls.ca_cert),
                "--tls-auth-clients",
                "yes" if self.tls.client_cert is not None else "no",
            ]
        return command

    def _address(self, port: int) -> str:
        scheme = "rediss" if self.tls is not None else "redis"
        return f"{scheme}://{LOOPBACK_HOST}:{port}/0"

    def _probe(self, port: int) -> None:
        options: dict[str, Any] = {
            "username": self.username,
            "password": self.password,
            "socket_timeout": 1.0,
            **self.ssl_options(),
        }
        client = redis.Redis.from_url(self._address(port), **options)
        try:
            client.ping()
        except redis.RedisError as exc:
            raise ServiceNotReadyError(str(exc)) from exc
        finally:
            client.close()

    def ssl_options(self) -> dict[str, str]:
        """redis-py ``ssl_*`` keywords a client of this server needs (empty without TLS)."""
        if self.tls is None:
            return {}
        options = {"ssl_ca_certs": str(self.tls.ca_cert)}
        if self.tls.client_cert is not None and self.tls.client_key is not None:
            options["ssl_certfile"] = str(self.tls.client_cert)
            options["ssl_keyfile"] = str(self.tls.client_key)
        return options


__all__ = ["SecuredEmbeddedRedis"]
