"""The server's security guard: authenticates each Kafka message, authorizes each request,
filters event routing, and writes the audit log.

Kafka messages carry no principal a cache server can trust, so the server checks the
signature every client puts in the headers (:mod:`regionbus.schemas.signing`) before it decodes a
message into effects:

1. the headers are present and well formed, and name a known principal;
2. the HMAC over principal, timestamp, topic, partition and value matches its key;
3. the timestamp is within ``allowed_skew_ms`` of the server's clock;
4. the MAC was not accepted before at another place of the log (a replay); the same place
   re-read after a restart or failover is not a replay.

Each decoded request then needs the permissions of :mod:`regionbus.broker.permissions`, and its
client id must belong to the same principal (the first principal to use a client id owns
it). Every refusal is logged on the ``regionbus.audit`` logger with principal, operation,
region, client and reason. Events of a region are routed only to clients whose principal
holds ``DATA:READ`` on it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

import redis

from regionbus.broker.config import ServerSettings
from regionbus.broker.permissions import (
    ResourcePermission,
    data_read,
    is_granted,
    required_permissions,
)
from regionbus.broker.principals import SERVER_PRINCIPAL, Principal, PrincipalStore
from regionbus.schemas.errors import AuthenticationError, NotAuthorizedError
from regionbus.schemas.messages import Control, Operation
from regionbus.schemas.operation_kinds import kind_row
from regionbus.schemas.signing import HeaderList, Headers, Signer, parse_headers, signed_headers

audit = logging.getLogger("regionbus.audit")

_REPLAY_MEMORY_EXTRA_MS = 60_000


def audit_refusal(
    principal: str | None,
    operation: str,
    region: str | None,
    client_id: str | None,
    reason: str,
    source: str,
) -> None:
    """Write one audit line for a refused request.

    Args:
        principal: The claimed or authenticated principal, None when unknown.
        operation: What was asked (``PUT``, ``CONNECT``, ``message`` when undecoded).
        region: The region, when there is one.
        client_id: The client id the request named, when known.
        reason: Why it was refused.
        source: ``topic/partition/offset`` of the message.
    """
    audit.warning(
        "REFUSED principal=%s operation=%s region=%s client=%s reason=%s source=%s",
        principal or "-",
        operation,
        region or "-",
        client_id or "-",
        reason,
        source,
    )


class SecurityGuard:
    """Authentication and authorization of one cache server.

    Args:
        client: The server's Redis connection.
        settings: The server's settings (``allowed_skew_ms``, ``principal_cache_ttl_ms``).
    """

    def __init__(self, client: redis.Redis, settings: ServerSettings) -> None:
        self.principals = PrincipalStore(
            client, settings.namespace, cache_ttl_ms=settings.principal_cache_ttl_ms
        )
        self.allowed_skew_ms = settings.allowed_skew_ms
        self.replay_memory_ms = 2 * settings.allowed_skew_ms + _REPLAY_MEMORY_EXTRA_MS
        self._signer: Signer | None = None
        self._client_principals: dict[str, str] = {}
        self._cache_ttl_s = settings.principal_cache_ttl_ms / 1000
        self._unbound: dict[str, float] = {}

    # --- authentication ------------------------------------------------------------

    def authenticate(
        self,
        headers: Headers | None,
        topic: str,
        partition: int,
        offset: int,
        value: bytes | None,
        now_ms: int | None = None,
    ) -> Principal:
        """Check the signature of one Kafka message.

        Args:
            headers: The message's headers.
            topic: Topic it was read from.
            partition: Its partition.
            offset: Its offset.
            value: Its value.
            now_ms: The server's clock, milliseconds since the Unix epoch UTC (now if None).

        Returns:
            The authenticated principal.

        Raises:
            AuthenticationError: missing or malformed signature, unknown principal, MAC
                mismatch, timestamp outside ``allowed_skew_ms`` (unless the message is
                being re-processed at its place), or a replay.
            TransportError: Redis failed.
        """
        signed = parse_headers(headers)
        principal = self.principals.get(signed.principal)
        if principal is None:
            raise AuthenticationError(f"unknown principal {signed.principal!r}")
        if not signed.verify(principal.key, topic, partition, value or b""):
            raise AuthenticationError(f"bad signature for principal {signed.principal!r}")
        now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
        where = f"{topic}/{partition}/{offset}"
        skew_ms = now - signed.timestamp_ms
        if abs(skew_ms) > self.allowed_skew_ms:
            # Only a message accepted before at this very place (re-read after a restart or
            # a failover) may be older than the allowed skew.
            if not self.principals.was_seen_at(signed.mac, where):
                raise AuthenticationError(
                    f"timestamp {signed.timestamp_ms} is {skew_ms} ms from the server clock "
                    f"(allowed skew {self.allowed_skew_ms} ms)"
                )
            return principal
        if not self.principals.first_sight(signed.mac, where, self.replay_memory_ms):
            raise AuthenticationError("replayed message (its MAC was accepted before)")
        return principal

    # --- authorization -------------------------------------------------------------

    def authorize_operation(self, principal: Principal, op: Operation) -> None:
        """Check that a principal may make an operation as its client id.

        Raises:
            NotAuthorizedError: an expiration (``EXPIRE_*``) or a loader's create
                (``LOAD_CREATE``) from anyone but the servers,
                the client id belongs to another principal, or a needed permission is
                missing (the message names it).
            TransportError: Redis failed.
        """
        if principal.name == SERVER_PRINCIPAL:
            return
        if kind_row(op.kind).servers_only:
            raise NotAuthorizedError(
                f"{op.kind.value} is produced by bucket primaries only, not by principal "
                f"{principal.name!r}"
            )
        self._check_client(principal, op.client_id)
        for needed in required_permissions(op):
            if not is_granted(principal.permissions, needed):
                raise NotAuthorizedError(
                    f"principal {principal.name!r} lacks {needed} for {op.kind.value}"
                )

    def authorize_control(self, principal: Principal, control: Control) -> None:
        """Check that a principal may connect, ping or close as the control's client id.

        Raises:
            NotAuthorizedError: the client id belongs to another principal.
            TransportError: Redis failed.
        """
        if principal.name == SERVER_PRINCIPAL:
            return
        self._check_client(principal, control.client_id)

    def _check_client(self, principal: Principal, client_id: str) -> None:
        owner = self._client_principals.get(client_id)
        if owner is None:
            owner = self.principals.bind_client(client_id, principal.name)
            self._client_principals[client_id] = owner
            self._unbound.pop(client_id, None)
        if owner != principal.name:
            raise NotAuthorizedError(
                f"client id {client_id!r} belongs to another principal, not {principal.name!r}"
            )

    def check(self, principal: str, needed: ResourcePermission) -> bool:
        """Whether a principal (by name) holds a permission now.

        Raises:
            TransportError: Redis failed.
        """
        known = self.principals.get(principal)
        return known is not None and is_granted(known.permissions, needed)

    # --- routing -------------------------------------------------------------------

    def may_receive(self, client_id: str, region: str, key: str | None = None) -> bool:
        """Whether a client's principal holds ``DATA:READ`` on the region (and key).

        A client whose principal is not known (it never sent an authenticated request)
        receives nothing.

        Raises:
            TransportError: Redis failed.
        """
        principal = self._principal_of(client_id)
        if principal is None:
            return False
        return self.check(principal, data_read(region, key or "*"))

    def readers(
        self, targets: dict[str, bool], region: str, key: str | None = None
    ) -> dict[str, bool]:
        """The routing targets (client id -> receive values) allowed to read the event.

        Raises:
            TransportError: Redis failed.
        """
        return {c: rv for c, rv in targets.items() if self.may_receive(c, region, key)}

    def region_readers(self, clients: Iterable[str], region: str) -> set[str]:
        """The clients allowed to receive a region-wide event of ``region``.

        Raises:
            TransportError: Redis failed.
        """
        return {c for c in clients if self.may_receive(c, region)}

    def principal_of(self, client_id: str) -> str | None:
        """The principal a client id belongs to, None when not known (it never sent an
        authenticated request).

        Raises:
            TransportError: Redis failed.
        """
        return self._principal_of(client_id)

    def _principal_of(self, client_id: str) -> str | None:
        owner = self._client_principals.get(client_id)
        if owner is not None:
            return owner
        checked = self._unbound.get(client_id)
        if checked is not None and time.monotonic() - checked < self._cache_ttl_s:
            return None
        owner = self.principals.principal_of_client(client_id)
        if owner is None:
            self._unbound[client_id] = time.monotonic()
            return None
        self._client_principals[client_id] = owner
        return owner

    def forget_client(self, client_id: str, *, unbind: bool = True) -> None:
        """Forget what this server remembers of a client id's principal, and with
        ``unbind`` drop the binding itself (the client is gone for good: the namespace's
        lifecycle does that once, every server forgets its own memory of it).

        Raises:
            TransportError: Redis failed.
        """
        self._client_principals.pop(client_id, None)
        self._unbound.pop(client_id, None)
        if unbind:
            self.principals.unbind_client(client_id)

    # --- the server's own messages -------------------------------------------------

    def client_headers(
        self, client_id: str, topic: str, partition: int, value: bytes
    ) -> HeaderList | None:
        """Signing headers for a reply, event or marker to a client: signed as the servers
        with the key of the client's principal, which the client verifies
        (`regionbus.schemas.signing.Signer.check_from_server`).

        Returns:
            The headers, or None when the client id has no known principal (it never sent
            an authenticated request: there is no key it could verify with).

        Raises:
            TransportError: Redis failed.
        """
        name = self._principal_of(client_id)
        principal = None if name is None else self.principals.get(name)
        if principal is None:
            return None
        return signed_headers(principal.key, SERVER_PRINCIPAL, topic, partition, value)

    def server_headers(self, topic: str, partition: int, value: bytes) -> HeaderList:
        """Signing headers for an operation the server itself produces (DISCONNECT).

        Raises:
            TransportError: Redis failed (reading the servers' key).
        """
        if self._signer is None:
            self._signer = Signer(SERVER_PRINCIPAL, self.principals.server_key())
        return self._signer.headers(topic, partition, value)


__all__ = ["SecurityGuard", "audit", "audit_refusal"]
