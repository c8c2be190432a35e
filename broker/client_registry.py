"""The servers' record of clients: connections, liveness, durable keep-alive and timeouts.

One JSON record per client in the Redis hash ``rb:{ns}:clients`` (field = client id):
``durable``, ``connection_id`` (one process of the client), ``connected``,
``last_seen_ms``, ``durable_client_timeout_s`` and ``disconnected_at_ms``. Connecting is one
Lua script, so two processes racing for one client id cannot both win (SPEC §5: a second
live client with the same durable id is refused; regionbus refuses a second live connection
of a non-durable id the same way).

A durable client that closes with ``keep_alive`` or goes silent (crash) stays registered,
disconnected, for its ``durable_client_timeout_s``; the reaper (a singleton role, see
:mod:`regionbus.runtime.leases`) then unregisters it (seed 001: "the servers unregister the client
and do the same cleanup as for a non-durable client. The servers also log an alert").
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

import redis

from regionbus.broker.store import redis_errors
from regionbus.schemas.naming import RedisKeys

# Connect atomically: refuse a second live connection of any client id (its topics are
# shared: the first to close would delete them under the other); otherwise record the
# connection and say whether a durable registration (queue, durable interest) was kept.
# KEYS: 1 clients hash. ARGV: 1 client id, 2 connection id, 3 durable "1"/"0",
# 4 timeout s, 5 now ms, 6 liveness window ms.
_CONNECT = """
local raw = redis.call('HGET', KEYS[1], ARGV[1])
local state = 'NEW'
if raw then
  local r = cjson.decode(raw)
  local live = r.connected and (tonumber(ARGV[5]) - (r.last_seen_ms or 0)) <= tonumber(ARGV[6])
  if live and r.connection_id ~= ARGV[2] then
    return {'REFUSED', tostring(r.connection_id), tostring(r.last_seen_ms)}
  end
  if r.durable and ARGV[3] == '1' and not r.reaping then state = 'RECONNECTED' end
end
local record = {
  durable = ARGV[3] == '1', connection_id = ARGV[2], connected = true,
  last_seen_ms = tonumber(ARGV[5]), durable_client_timeout_s = tonumber(ARGV[4]),
  disconnected_at_ms = cjson.null
}
redis.call('HSET', KEYS[1], ARGV[1], cjson.encode(record))
return {state}
"""


@dataclass
class ClientRecord:
    """One client as the servers know it.

    Attributes:
        durable: The client has a durable id.
        connection_id: The live (or last) connection of the client (its member id).
        connected: False once a durable client closed with keep-alive or went silent.
        last_seen_ms: Last message from the client, ms since the Unix epoch.
        durable_client_timeout_s: How long a disconnected durable client is kept.
        disconnected_at_ms: When a durable client was seen disconnecting (ms since the
            Unix epoch), None while connected.
        reaping: The reaper is unregistering the client (its interest is being dropped by
            every bucket's primary; its topics go once all have).
    """

    durable: bool
    connection_id: str | None
    connected: bool
    last_seen_ms: int
    durable_client_timeout_s: int = 300
    disconnected_at_ms: int | None = None
    reaping: bool = False

    def expired(self, now_ms: int) -> bool:
        """True for a disconnected durable client away longer than its timeout."""
        return (
            self.durable
            and not self.connected
            and not self.reaping
            and self.disconnected_at_ms is not None
            and now_ms - self.disconnected_at_ms > self.durable_client_timeout_s * 1000
        )


@dataclass(frozen=True)
class ConnectResult:
    """The answer to a client's CONNECT.

    Attributes:
        state: ``NEW``, ``RECONNECTED`` (a durable registration was kept) or ``REFUSED``.
        live_connection_id: For ``REFUSED``, the connection that holds the client id.
        live_last_seen_ms: For ``REFUSED``, when that connection was last heard from.
    """

    state: str
    live_connection_id: str | None = None
    live_last_seen_ms: int | None = None


class ClientRegistry:
    """Client records of one namespace in Redis.

    Args:
        client: Redis connection.
        namespace: Site namespace.
        liveness_window_ms: A connection silent for longer is not live (the servers'
            ``maximum_time_between_pings_ms``).
    """

    def __init__(self, client: redis.Redis, namespace: str, liveness_window_ms: int) -> None:
        self._redis = client
        self._keys = RedisKeys(namespace)
        self._key = self._keys.clients
        self.liveness_window_ms = liveness_window_ms
        self._connect = client.register_script(_CONNECT)

    def connect(
        self,
        client_id: str,
        connection_id: str,
        *,
        durable: bool,
        durable_client_timeout_s: int,
        now_ms: int,
    ) -> ConnectResult:
        """Record a connection, or refuse a second live connection of the same client id.

        Raises:
            TransportError: Redis failed.
        """
        with redis_errors():
            result = self._connect(
                keys=[self._key],
                args=[
                    client_id,
                    connection_id,
                    "1" if durable else "0",
                    durable_client_timeout_s,
                    now_ms,
                    self.liveness_window_ms,
                ],
            )
        state = result[0].decode()
        if state == "REFUSED":
            return ConnectResult(state, result[1].decode(), int(result[2]))
        return ConnectResult(state)

    def get(self, client_id: str) -> ClientRecord | None:
        """The client's record, or None when unknown (never connected, closed, reaped).

        Raises:
            TransportError: Redis failed.
        """
        with redis_errors():
            raw = self._redis.hget(self._key, client_id)
        return None if raw is None else _record(raw)

    def all(self) -> dict[str, ClientRecord]:
        """Every client record by client id.

        Raises:
            TransportError: Redis failed.
        """
        with redis_errors():
            raw = self._redis.hgetall(self._key)
        return {k.decode(): _record(v) for k, v in raw.items()}

    def save(self, client_id: str, record: ClientRecord) -> None:
        """Write a record (pings, disconnects).

        Raises:
            TransportError: Redis failed.
        """
        with redis_errors():
            self._redis.hset(self._key, client_id, json.dumps(asdict(record)))

    def remove(self, client_id: str) -> None:
        """Forget a client (non-durable close, durable close without keep-alive, reaped).

        Raises:
            TransportError: Redis failed.
        """
        with redis_errors():
            self._redis.hdel(self._key, client_id)

    # --- unregistering a client, bucket by bucket ---------------------------------------

    def mark_dropped(self, client_id: str, bucket: int) -> None:
        """Note that a bucket's primary dropped the client's interest (it is being
        unregistered; the note lasts an hour).

        Raises:
            TransportError: Redis failed.
        """
        key = self._keys.dropped(client_id)
        with redis_errors():
            pipe = self._redis.pipeline()
            pipe.sadd(key, bucket)
            pipe.expire(key, _DROPPED_TTL_S)
            pipe.execute()

    def dropped_buckets(self, client_id: str) -> int:
        """How many buckets' primaries have dropped the client's interest.

        Raises:
            TransportError: Redis failed.
        """
        with redis_errors():
            return int(self._redis.scard(self._keys.dropped(client_id)))

    def clear_dropped(self, client_id: str) -> None:
        """Forget which buckets dropped the client (before or after unregistering it).

        Raises:
            TransportError: Redis failed.
        """
        with redis_errors():
            self._redis.delete(self._keys.dropped(client_id))


_DROPPED_TTL_S = 3600


def _record(raw: bytes) -> ClientRecord:
    data: dict[str, Any] = json.loads(raw)
    return ClientRecord(
        durable=bool(data.get("durable")),
        connection_id=data.get("connection_id"),
        connected=bool(data.get("connected", True)),
        last_seen_ms=int(data.get("last_seen_ms", 0)),
        durable_client_timeout_s=int(data.get("durable_client_timeout_s", 300)),
        disconnected_at_ms=data.get("disconnected_at_ms"),
        reaping=bool(data.get("reaping", False)),
    )
