"""The one way servers, the CLI and tools open Redis: URL plus ACL user, password and TLS.

Redis ACL users (``AUTH user password``, Redis >= 6) and TLS (``rediss://`` URLs, with a CA
bundle and optionally a client certificate for mutual TLS) come from
:class:`broker.config.ServerSettings`, so every process configured by it talks to a secured
Redis the same way.
"""

from __future__ import annotations

from typing import Any

import redis

from broker.config import ServerSettings
from schemas.errors import ConfigurationError


def redis_options(settings: ServerSettings) -> dict[str, Any]:
    """The redis-py connection keywords the settings ask for, beyond the URL.

    Args:
        settings: Server (or CLI) settings.

    Returns:
        ``username``, ``password`` and ``ssl_*`` keywords, only those that are set.

    Raises:
        ConfigurationError: TLS files are given but the URL is not ``rediss://``.
    """
    options: dict[str, Any] = {}
    if settings.redis_username:
        options["username"] = settings.redis_username
    if settings.redis_password is not None:
        options["password"] = settings.redis_password.get_secret_value()
    tls = {
        "ssl_ca_certs": settings.redis_ssl_ca_certs,
        "ssl_certfile": settings.redis_ssl_certfile,
        "ssl_keyfile": settings.redis_ssl_keyfile,
    }
    tls = {k: v for k, v in tls.items() if v}
    if tls and not settings.redis_url.startswith("rediss://"):
        raise ConfigurationError(
            f"Redis TLS files are set but redis_url {settings.redis_url!r} is not rediss://"
        )
    options.update(tls)
    return options


def connect_redis(settings: ServerSettings, **overrides: Any) -> redis.Redis:
    """A redis-py client for ``settings.redis_url`` with its ACL user, password and TLS.

    Args:
        settings: Server (or CLI) settings.
        **overrides: Further redis-py keywords (e.g. ``decode_responses``).

    Returns:
        A client (connections open lazily).

    Raises:
        ConfigurationError: as :func:`redis_options`.
    """
    return redis.Redis.from_url(settings.redis_url, **{**redis_options(settings), **overrides})


__all__ = ["connect_redis", "redis_options"]
