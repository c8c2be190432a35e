"""The one way servers, the CLI and tools open Redis: URL plus ACL user, password and TLS,
to one Redis or to a Redis Cluster.

Redis ACL users (``AUTH user password``, Redis >= 6) and TLS (``rediss://`` URLs, with a CA
bundle and optionally a client certificate for mutual TLS) come from
:class:`regionbus.runtime.settings.RedisConnectionSettings` (part of the cache server's and the
gateway workers' settings), so every process talks to a secured Redis the same way.

A Redis Cluster is named the way redis-py names one: ``RedisCluster.from_url`` takes the
``redis://`` or ``rediss://`` URL of any one node and learns the others from it (redis-py
has no URL scheme or parameter of its own for a cluster). So ``redis_url`` stays the URL
of a node, and ``redis_cluster`` says whether it is a cluster: True or False, or None (the
default) to ask the node (``INFO cluster``: ``cluster_enabled:1``) when connecting.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Final

import redis
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException

from regionbus.runtime.redis_replication import ReplicaWait
from regionbus.runtime.settings import RedisConnectionSettings
from regionbus.schemas.errors import TransportError
from regionbus.schemas.masking import mask_url

log = logging.getLogger("regionbus.redis")

RedisClient = redis.Redis | RedisCluster
"""What :func:`connect_redis` returns: redis-py's client of one Redis or of a cluster."""

REDIS_ERRORS: Final = (redis.RedisError, RedisClusterException)
"""What redis-py raises when Redis fails; its Redis Cluster client raises some errors
(no node serves a slot, a key spread over slots) that do not derive from ``RedisError``."""


@contextmanager
def redis_errors(what: str = "Redis") -> Iterator[None]:
    """Translate what redis-py raises (:data:`REDIS_ERRORS`) into :class:`TransportError`:
    the one place regionbus turns a Redis failure into its own error.

    Args:
        what: What was being done, starting the message (``"lease bucket:3: renew"``).

    Raises:
        TransportError: redis-py raised; the original is its cause.
    """
    try:
        yield
    except REDIS_ERRORS as exc:
        raise TransportError(f"{what}: {type(exc).__name__}: {exc}") from exc


_PROBE_TIMEOUT_S: Final = 5.0


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


def is_cluster_node(url: str, **options: Any) -> bool:
    """Whether the Redis at ``url`` runs in cluster mode (``INFO cluster``).

    Args:
        url: A ``redis://``, ``rediss://`` or ``unix://`` URL.
        **options: redis-py connection keywords (user, password, TLS).

    Returns:
        True for a cluster node; False for a stand-alone Redis, and for one that cannot be
        asked now (it is then used as a stand-alone Redis: set ``redis_cluster`` to say).
    """
    probe_options = {
        **options,
        "socket_timeout": _PROBE_TIMEOUT_S,
        "socket_connect_timeout": _PROBE_TIMEOUT_S,
    }
    client = redis.Redis.from_url(url, **probe_options)
    try:
        return bool(client.info("cluster").get("cluster_enabled"))
    except REDIS_ERRORS as exc:
        log.warning(
            "cannot ask Redis at %s whether it is a cluster (%s): using it as one Redis; set "
            "redis_cluster (REGIONBUS_REDIS_CLUSTER) to say",
            mask_url(url),
            exc,
        )
        return False
    finally:
        client.close()


def connect_redis(settings: RedisConnectionSettings, **overrides: Any) -> Any:
    """A redis-py client for ``settings.redis_url`` with its ACL user, password and TLS: a
    ``RedisCluster`` when it is a cluster (see the module docstring), else a ``Redis``.

    Args:
        settings: Server, gateway worker or CLI settings.
        **overrides: Further redis-py keywords (e.g. ``decode_responses``).

    Returns:
        A :data:`RedisClient` (connections open lazily; a cluster client reads the
        cluster's slots from the node at once).

    Raises:
        TransportError: a cluster's node did not answer (a cluster client needs the
            cluster's layout to start).
    """
    return connect_redis_url(
        settings.redis_url,
        cluster=settings.redis_cluster,
        **{**redis_options(settings), **overrides},
    )


def connect_redis_url(url: str, *, cluster: bool | None = None, **options: Any) -> Any:
    """A redis-py client for a Redis URL: :func:`connect_redis` for tools, tests and
    benchmarks that have a URL, not settings.

    Args:
        url: A ``redis://``, ``rediss://`` or ``unix://`` URL (of any node of a cluster).
        cluster: True for a Redis Cluster, False for one Redis, None to ask the node.
        **options: redis-py connection keywords.

    Returns:
        A :data:`RedisClient`.

    Raises:
        TransportError: a cluster's node did not answer.
    """
    if cluster is None:
        cluster = is_cluster_node(url, **options)
    if not cluster:
        return redis.Redis.from_url(url, **options)
    try:
        # A cluster has one database; the URL's "/0" is the only one there is.
        return RedisCluster.from_url(url, **options)
    except REDIS_ERRORS as exc:
        raise TransportError(f"Redis Cluster at {mask_url(url)}: {exc}") from exc


def replica_wait(client: Any, settings: RedisConnectionSettings) -> ReplicaWait:
    """How changes made through ``client`` wait for replicas: ``redis_wait_replicas`` and
    ``redis_wait_timeout_ms`` of the settings (see
    :mod:`regionbus.runtime.redis_replication`)."""
    return ReplicaWait(client, settings.redis_wait_replicas, settings.redis_wait_timeout_ms)


def ping_every_master(client: Any) -> bool:
    """``PING`` what a worker writes to: the one Redis, or every master of a cluster (a
    master that died is then waited for until its replica took its slots over).

    Raises:
        redis.RedisError: a master did not answer.
    """
    if isinstance(client, RedisCluster):
        return bool(client.ping(target_nodes=RedisCluster.PRIMARIES))
    return bool(client.ping())


__all__ = [
    "REDIS_ERRORS",
    "RedisClient",
    "connect_redis",
    "connect_redis_url",
    "is_cluster_node",
    "ping_every_master",
    "redis_options",
    "replica_wait",
]
