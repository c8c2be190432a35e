"""The servers' record of clients: connections, liveness, durable keep-alive and timeouts.

One JSON record per client in the Redis hash ``rb:{ns}:clients`` (field = client id):
``durable``, ``connection_id`` (one process of the client), ``connected``,
``connected_at_ms``, ``durable_client_timeout_s``, ``disconnected_at_ms`` and
``kafka_principal`` (whose shared queue and reply topics it reads).

Times in a record are read off **Redis's clock** (``TIME``, on the node holding the
hash), never a server's: a server's wall clock may step (NTP, a VM resumed, skew between
servers), and a durable client's timeout must not shrink or grow with it. Silence is not
in the record at all: the server reading ``{ns}.control`` times it on its own monotonic
clock (`regionbus.broker.client_lifecycle`). Connecting is one Lua
script, so two processes racing for one client id cannot both win (docs/behaviour.md §5: a second
live client with the same durable id is refused; regionbus refuses a second live connection of
a non-durable id the same way: the id addresses its queue records and names the consumer
group of its acks).

A durable client that closes with ``keep_alive`` or goes silent (crash) stays registered,
disconnected, for its ``durable_client_timeout_s``; the reaper (a singleton role, see
:mod:`regionbus.runtime.leases`) then unregisters it (docs/behaviour.md §5: the servers clean up as
for a non-durable client, and log an alert).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import redis

from regionbus.runtime.redis_connect import redis_errors
from regionbus.schemas.naming import RedisKeys

# Redis's clock in ms since the Unix epoch. Keyed on the clients hash, so in a Redis
# Cluster every server reads the clock of the one node that holds the records.
_REDIS_TIME_MS = "local t = redis.call('TIME') return t[1] * 1000 + math.floor(t[2] / 1000)"

# Connect atomically: refuse a second live connection of any client id (its queue records
# and acks are shared: the first to close would delete the acks under the other); otherwise
# record the connection, stamped on Redis's clock, and say whether a durable registration
# (queue, durable interest) was kept. Whether the recorded connection is still live is the
# caller's judgement (its monotonic clock), passed as the connection id it holds live.
# KEYS: 1 clients hash. ARGV: 1 client id, 2 connection id, 3 durable "1"/"0",
# 4 timeout s, 5 the live connection id ("" for none), 6 Kafka principal ("" for none).
_CONNECT = """
local raw = redis.call('HGET', KEYS[1], ARGV[1])
local state = 'NEW'
if raw then
  local r = cjson.decode(raw)
  if r.connected and r.connection_id ~= ARGV[2] and r.connection_id == ARGV[5] then
    return {'REFUSED', tostring(r.connection_id)}
  end
  if r.durable and ARGV[3] == '1' and not r.reaping then state = 'RECONNECTED' end
end
local t = redis.call('TIME')
local now_ms = t[1] * 1000 + math.floor(t[2] / 1000)
local record = {
  durable = ARGV[3] == '1', connection_id = ARGV[2], connected = true,
  connected_at_ms = now_ms, durable_client_timeout_s = tonumber(ARGV[4]),
  disconnected_at_ms = cjson.null, kafka_principal = ARGV[6] ~= '' and ARGV[6] or cjson.null
}
redis.call('HSET', KEYS[1], ARGV[1], cjson.encode(record))
return {state, now_ms}
"""


@dataclass
class ClientRecord:
    """One client as the servers know it.

    Attributes:
        durable: The client has a durable id.
        connection_id: The live (or last) connection of the client (its member id).
        connected: False once a durable client closed with keep-alive or went silent.
        connected_at_ms: When the connection was recorded, ms since the Unix epoch on
            Redis's clock.
        durable_client_timeout_s: How long a disconnected durable client is kept, in s.
        disconnected_at_ms: When a durable client went away (its close, or the last time
            it was heard from before its silence), ms since the Unix epoch on Redis's
            clock; None while connected.
        reaping: The reaper is unregistering the client (every bucket's primary is told to
            drop its interest; bucket 0's then forgets it).
        kafka_principal: The Kafka principal whose shared queue and reply topics the client
            reads (None: the namespace's unscoped ones).
        heard_at_s: When this server last heard from the client, in seconds of
            ``time.monotonic()``; not stored (another server's monotonic clock means
            nothing here): a server that loads the record starts it afresh.
    """

    durable: bool
    connection_id: str | None
    connected: bool
    connected_at_ms: int
    durable_client_timeout_s: int = 300
    disconnected_at_ms: int | None = None
    reaping: bool = False
    kafka_principal: str | None = None
    heard_at_s: float = field(default_factory=time.monotonic, compare=False)

    def expired(self, now_ms: int) -> bool:
        """True for a disconnected durable client away longer than its timeout.

        Args:
            now_ms: Now on Redis's clock (`ClientRegistry.now_ms`), ms since the Unix epoch.
        """
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
        connected_at_ms: When the connection was recorded, on Redis's clock (ms since the
            Unix epoch); 0 for ``REFUSED``.
        live_connection_id: For ``REFUSED``, the connection that holds the client id.
    """

    state: str
    connected_at_ms: int = 0
    live_connection_id: str | None = None


class ClientRegistry:
    """Client records of one namespace in Redis.

    Args:
        client: Redis connection.
        namespace: Site namespace.
    """

    def __init__(self, client: redis.Redis, namespace: str) -> None:
        self._redis = client
        self._keys = RedisKeys(namespace)
        self._key = self._keys.clients
        self._connect = client.register_script(_CONNECT)
        self._time = client.register_script(_REDIS_TIME_MS)

    def now_ms(self) -> int:
        """Now on Redis's clock (``TIME`` of the node holding the records), in ms since the
        Unix epoch: the one clock every server reads the records' times by.

        Raises:
            TransportError: Redis failed.
        """
        with redis_errors():
            return int(self._time(keys=[self._key]))

    def connect(
        self,
        client_id: str,
        connection_id: str,
        *,
        durable: bool,
        durable_client_timeout_s: int,
        live_connection_id: str | None,
        kafka_principal: str | None = None,
    ) -> ConnectResult:
        """Record a connection, or refuse a second live connection of the same client id.

        Args:
            client_id: The client id.
            connection_id: The connecting process's connection (member) id.
            durable: The client has a durable id.
            durable_client_timeout_s: Its durable-client timeout, in seconds.
            live_connection_id: The connection of this client id the caller still holds
                live (heard from within the liveness window), or None: a connect of
                another connection is refused while the record names this one connected.
            kafka_principal: Whose shared queue and reply topics the client reads.

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
                    live_connection_id or "",
                    kafka_principal or "",
                ],
            )
        state = result[0].decode()
        if state == "REFUSED":
            return ConnectResult(state, live_connection_id=result[1].decode())
        return ConnectResult(state, int(result[1]))

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
        stored = asdict(record)
        del stored["heard_at_s"]
        with redis_errors():
            self._redis.hset(self._key, client_id, json.dumps(stored))

    def remove(self, client_id: str) -> None:
        """Forget a client (non-durable close, durable close without keep-alive, reaped).

        Raises:
            TransportError: Redis failed.
        """
        with redis_errors():
            self._redis.hdel(self._key, client_id)

    def known(self, client_ids: list[str]) -> set[str]:
        """Which of these clients have a record.

        Raises:
            TransportError: Redis failed.
        """
        if not client_ids:
            return set()
        with redis_errors():
            found = self._redis.hmget(self._key, client_ids)
        return {c for c, raw in zip(client_ids, found, strict=True) if raw is not None}


def _record(raw: bytes) -> ClientRecord:
    data: dict[str, Any] = json.loads(raw)
    return ClientRecord(
        durable=bool(data.get("durable")),
        connection_id=data.get("connection_id"),
        connected=bool(data.get("connected", True)),
        # Records written before the connection's time was kept as its own field.
        connected_at_ms=int(data.get("connected_at_ms", data.get("last_seen_ms", 0))),
        durable_client_timeout_s=int(data.get("durable_client_timeout_s", 300)),
        disconnected_at_ms=data.get("disconnected_at_ms"),
        reaping=bool(data.get("reaping", False)),
        kafka_principal=data.get("kafka_principal"),
    )
