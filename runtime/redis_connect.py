"""The one way servers, the CLI and tools open Redis: URL plus ACL user, password and TLS.

Redis ACL users (``AUTH user password``, Redis >= 6) and TLS (``rediss://`` URLs, with a CA
bundle and optionally a client certificate for mutual TLS) come from
:class:`regionbus.runtime.settings.RedisConnectionSettings` (part of the cache server's and the
gateway
workers' settings), so every process talks to a secured Redis the same way.
"""

from __future__ import annotations

from typing import Any

import redis

from regionbus.runtime.settings import RedisConnectionSettings


def redis_options(settings: RedisConnectionSettings) -> dict[str, Any]:
    """The redis-py connection keywords the settings ask for, beyond the URL.

    Args:
        settings: Server, gateway worker or CLI settings (validated: TLS files come with a
            ``rediss://`` URL).

    Returns:
        ``username``, ``password``, ``ssl_*`` and ``socket_timeout`` /
        ``socket_connect_timeout`` keywords, only those that are set.
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
    options.update({k: v for k, v in tls.items() if v})
    if settings.redis_socket_timeout_s is not None:
        options["socket_timeout"] = settings.redis_socket_timeout_s
        options["socket_connect_timeout"] = settings.redis_socket_timeout_s
    return options


def connect_redis(settings: RedisConnectionSettings, **overrides: Any) -> redis.Redis:
    """A redis-py client for ``settings.redis_url`` with its ACL user, password and TLS.

    Args:
        settings: Server, gateway worker or CLI settings.
        **overrides: Further redis-py keywords (e.g. ``decode_responses``).

    Returns:
        A client (connections open lazily).
    """
    return redis.Redis.from_url(settings.redis_url, **{**redis_options(settings), **overrides})


__all__ = ["connect_redis", "redis_options"]
