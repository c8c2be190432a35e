"""Principals, their derived MAC keys and permissions, in Redis (``rb:{ns}:sec:*``).

Only the PBKDF2-derived key of a secret is stored (:mod:`regionbus.schemas.signing`), never the
secret. ``regionbus user add/remove/list`` and the servers use this module.

Keys:

``rb:{ns}:sec:principals``
    Set of principal names.
``rb:{ns}:sec:principal:<name>``
    Hash ``key`` (hex), ``kdf``, ``iterations``, ``permissions`` (JSON list of
    ``RESOURCE:OPERATION[:REGION[:KEY]]``), ``created_ms``.
``rb:{ns}:sec:client-principals``
    Hash client id -> principal: the principal a client id was first used by; another
    principal may not act as that client.
``rb:{ns}:sec:server-key``
    The key servers sign their own messages with (random, made by the first server).
``rb:{ns}:sec:seen:<mac>``
    A MAC already accepted (replay protection), with a TTL.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from typing import NamedTuple

import redis

from regionbus.broker.permissions import ResourcePermission
from regionbus.runtime.redis_connect import redis_errors
from regionbus.schemas.errors import ConfigurationError
from regionbus.schemas.naming import RedisKeys, check_name
from regionbus.schemas.signing import KDF_ITERATIONS, KDF_NAME, SERVER_PRINCIPAL, derive_key


class Principal(NamedTuple):
    """A principal as the servers know it.

    Attributes:
        name: The principal name.
        key: Its MAC key (derived, :data:`regionbus.schemas.signing.KEY_BYTES` bytes).
        permissions: What it is granted.
        created_ms: When it was added, milliseconds since the Unix epoch UTC.
    """

    name: str
    key: bytes
    permissions: tuple[ResourcePermission, ...]
    created_ms: int = 0


class PrincipalStore:
    """Reads and changes the principals of one namespace.

    Args:
        client: A redis-py client created with ``decode_responses=False``.
        namespace: The site namespace.
        cache_ttl_ms: How long a server trusts a principal it read (a removed principal or
            changed permission takes effect after at most this long), milliseconds.
    """

    def __init__(self, client: redis.Redis, namespace: str, cache_ttl_ms: int = 2_000) -> None:
        self._redis = client
        self.namespace = namespace
        prefix = RedisKeys(namespace).prefix + "sec:"
        self._names_key = prefix + "principals"
        self._principal_prefix = prefix + "principal:"
        self.client_principals_key = prefix + "client-principals"
        self.server_key_key = prefix + "server-key"
        self.seen_prefix = prefix + "seen:"
        self.cache_ttl_ms = cache_ttl_ms
        self._cache: dict[str, tuple[float, Principal | None]] = {}
        self._lock = threading.Lock()

    # --- administration ------------------------------------------------------------

    def add(self, name: str, secret: str, permissions: list[ResourcePermission]) -> Principal:
        """Add a principal, or replace its key and permissions if it exists.

        Args:
            name: Principal name: 1-100 characters of ``[A-Za-z0-9._-]``.
            secret: Its secret (only the derived key is stored).
            permissions: What it is granted.

        Returns:
            The stored principal.

        Raises:
            ConfigurationError: the name is not legal or the secret is empty.
            TransportError: Redis failed.
        """
        check_name("principal", name, max_len=100)
        if not secret:
            raise ConfigurationError("the secret of a principal may not be empty")
        key = derive_key(secret, self.namespace, name, KDF_ITERATIONS)
        created_ms = time.time_ns() // 1_000_000
        with redis_errors():
            pipe = self._redis.pipeline()
            pipe.delete(self._principal_prefix + name)
            pipe.hset(
                self._principal_prefix + name,
                mapping={
                    "key": key.hex(),
                    "kdf": KDF_NAME,
                    "iterations": KDF_ITERATIONS,
                    "permissions": json.dumps([str(p) for p in permissions]),
                    "created_ms": created_ms,
                },
            )
            pipe.sadd(self._names_key, name)
            pipe.execute()
        self.invalidate(name)
        return Principal(name, key, tuple(permissions), created_ms)

    def remove(self, name: str) -> bool:
        """Remove a principal; servers refuse it within ``cache_ttl_ms``.

        Returns:
            False when there was no such principal.

        Raises:
            TransportError: Redis failed.
        """
        with redis_errors():
            pipe = self._redis.pipeline()
            pipe.delete(self._principal_prefix + name)
            pipe.srem(self._names_key, name)
            deleted, _ = pipe.execute()
        self.invalidate(name)
        return bool(deleted)

    def names(self) -> list[str]:
        """Every principal name, sorted.

        Raises:
            TransportError: Redis failed.
        """
        with redis_errors():
            raw = self._redis.smembers(self._names_key)
        return sorted(n.decode() if isinstance(n, bytes) else str(n) for n in raw)

    # --- lookup --------------------------------------------------------------------

    def get(self, name: str) -> Principal | None:
        """The principal of that name (cached for ``cache_ttl_ms``), None if unknown.

        Raises:
            TransportError: Redis failed.
        """
        now = time.monotonic()
        with self._lock:
            cached = self._cache.get(name)
        if cached is not None and now - cached[0] < self.cache_ttl_ms / 1000:
            return cached[1]
        principal = self._read(name)
        with self._lock:
            self._cache[name] = (now, principal)
        return principal

    def invalidate(self, name: str) -> None:
        """Forget the cached copy of a principal."""
        with self._lock:
            self._cache.pop(name, None)

    def _read(self, name: str) -> Principal | None:
        if name == SERVER_PRINCIPAL:
            return Principal(name, self.server_key(), (ResourcePermission.parse("*:*"),))
        with redis_errors():
            raw = self._redis.hgetall(self._principal_prefix + name)
        if not raw:
            return None
        fields = {
            (k.decode() if isinstance(k, bytes) else str(k)): (
                v.decode() if isinstance(v, bytes) else str(v)
            )
            for k, v in raw.items()
        }
        permissions = tuple(ResourcePermission.parse(p) for p in json.loads(fields["permissions"]))
        return Principal(
            name, bytes.fromhex(fields["key"]), permissions, int(fields.get("created_ms", 0))
        )

    def server_key(self) -> bytes:
        """The servers' own MAC key, created by the first server that asks.

        Raises:
            TransportError: Redis failed.
        """
        with redis_errors():
            self._redis.set(self.server_key_key, secrets.token_bytes(32).hex(), nx=True)
            raw = self._redis.get(self.server_key_key)
        assert raw is not None
        return bytes.fromhex(raw.decode() if isinstance(raw, bytes) else str(raw))

    # --- client ids ----------------------------------------------------------------

    def bind_client(self, client_id: str, principal: str) -> str:
        """Bind a client id to the principal that first used it.

        Args:
            client_id: The client id.
            principal: The authenticated principal using it now.

        Returns:
            The principal the client id is bound to (``principal`` unless another one
            used it first).

        Raises:
            TransportError: Redis failed.
        """
        with redis_errors():
            self._redis.hsetnx(self.client_principals_key, client_id, principal)
            raw = self._redis.hget(self.client_principals_key, client_id)
        if raw is None:
            return principal
        return raw.decode() if isinstance(raw, bytes) else str(raw)

    def principal_of_client(self, client_id: str) -> str | None:
        """The principal a client id is bound to, or None.

        Raises:
            TransportError: Redis failed.
        """
        with redis_errors():
            raw = self._redis.hget(self.client_principals_key, client_id)
        if raw is None:
            return None
        return raw.decode() if isinstance(raw, bytes) else str(raw)

    def unbind_client(self, client_id: str) -> None:
        """Forget which principal a client id belongs to (the client was unregistered).

        Raises:
            TransportError: Redis failed.
        """
        with redis_errors():
            self._redis.hdel(self.client_principals_key, client_id)

    # --- replay protection ---------------------------------------------------------

    def first_sight(self, mac: bytes, where: str, ttl_ms: int) -> bool:
        """Record a MAC as accepted; tell whether this is its first sight.

        A message re-read at the same place (a server re-processing after a restart or a
        failover) is not a replay: ``where`` (topic, partition, offset) tells them apart.

        Args:
            mac: The message's MAC.
            where: ``"topic/partition/offset"`` of the message.
            ttl_ms: How long to remember it, milliseconds.

        Returns:
            True when the MAC is new, or was seen at the same ``where``.

        Raises:
            TransportError: Redis failed.
        """
        key = self.seen_prefix + mac.hex()
        with redis_errors():
            if self._redis.set(key, where, nx=True, px=ttl_ms):
                return True
            raw = self._redis.get(key)
        stored = raw.decode() if isinstance(raw, bytes) else raw
        return stored == where

    def was_seen_at(self, mac: bytes, where: str) -> bool:
        """Whether a MAC was accepted at exactly ``where`` (and is still remembered).

        Raises:
            TransportError: Redis failed.
        """
        with redis_errors():
            raw = self._redis.get(self.seen_prefix + mac.hex())
        if raw is None:
            return False
        return (raw.decode() if isinstance(raw, bytes) else raw) == where


__all__ = ["SERVER_PRINCIPAL", "Principal", "PrincipalStore"]
