"""Acknowledged changes reach a replica before their reply: Redis ``WAIT`` after a write.

Redis replicates asynchronously: a master killed right after a change, before its replica
had it, loses the change when the replica is promoted, although the server already told
the client it was applied. With ``redis_wait_replicas`` set, every pipeline that changes
region state ends with ``WAIT numreplicas timeout`` on each master it wrote to: Redis
answers once that many replicas confirmed every write this connection made (``WAIT``
counts per connection, so it goes in the same pipeline, on the same connection, after the
writes). Fewer replicas by the timeout raise :class:`ReplicationTimeoutError`; the server
then sends nothing of the batch and applies it again (the Lua scripts recognise each
EventID and write its tracking field again, so the second ``WAIT`` covers the first
apply, on whichever connection that was).

How many replicas to wait for on a Redis Cluster master: ``redis_wait_replicas``, but at
most the replicas the cluster lists for that master and does not mark failed (``CLUSTER
SHARDS``, read again every :data:`TOPOLOGY_REFRESH_S`), as Kafka's ``acks=all`` waits for
the in-sync replicas. A replica whose link just dropped is still listed, so changes wait
for it; a master whose replica failed, or a replica just promoted after its master died,
has none to wait for until one joins again (the same one restarted, or a new one), so a
failover does not stop writes to the promoted master's slots. A single Redis always waits
for ``redis_wait_replicas``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from typing import Any, Final

import redis
from redis.cluster import ClusterNode, RedisCluster
from redis.exceptions import RedisClusterException

from regionbus.schemas.errors import ReplicationTimeoutError

log = logging.getLogger("regionbus.redis")

TOPOLOGY_REFRESH_S: Final = 2.0
"""How often the replicas of each Redis Cluster master are read again, seconds."""


class ReplicaWait:
    """``WAIT`` commands after a pipeline's writes, and the check of their answers.

    Thread-safe: the cached topology is shared by every thread of the worker.

    Args:
        client: The worker's redis-py client (``redis.Redis`` or ``RedisCluster``).
        replicas: Replicas each change must reach before its reply (``redis_wait_replicas``);
            0 turns waiting off.
        timeout_ms: Longest wait for them, per pipeline (``redis_wait_timeout_ms``).
    """

    def __init__(self, client: Any, replicas: int, timeout_ms: int) -> None:
        self._client = client
        self.replicas = replicas
        self.timeout_ms = timeout_ms
        self._cluster = isinstance(client, RedisCluster)
        self._lock = threading.Lock()
        self._live_replicas: dict[str, int] = {}
        """``{master "host:port": replicas not marked failed}`` from the last read."""
        self._read_at = -TOPOLOGY_REFRESH_S
        self._short: set[str] = set()
        """Masters with fewer replicas than asked, as last logged."""

    @property
    def enabled(self) -> bool:
        """Whether changes wait for replicas at all."""
        return self.replicas > 0

    def queue(self, pipe: Any, written_keys: Iterable[str]) -> list[int]:
        """Queue one ``WAIT`` per master that holds a written key, after the writes.

        Args:
            pipe: The pipeline the writes were queued on (non-transactional).
            written_keys: One key of each hash slot written (more are harmless); none for a
                pipeline that only reads, or whose writes need not survive a failover.

        Returns:
            The replicas each queued ``WAIT`` must report, in order; empty when waiting is
            off or nothing needs it.
        """
        keys = list(written_keys)
        if not self.enabled or not keys:
            return []
        if not self._cluster:
            pipe.execute_command("WAIT", self.replicas, self.timeout_ms)
            return [self.replicas]
        nodes: dict[str, ClusterNode] = {}
        for key in keys:
            node = self._client.get_node_from_key(key)
            nodes.setdefault(node.name, node)
        wanted = self._wanted(nodes)
        queued = []
        for name, node in nodes.items():
            if wanted[name] > 0:
                pipe.execute_command("WAIT", wanted[name], self.timeout_ms, target_nodes=node)
                queued.append(wanted[name])
        return queued

    def check(self, pipe: Any, wanted: list[int], answers: list[Any]) -> None:
        """Check the answers of the ``WAIT`` commands :meth:`queue` queued.

        Args:
            pipe: The pipeline, executed.
            wanted: What :meth:`queue` returned.
            answers: The pipeline's last ``len(wanted)`` replies.

        Raises:
            ReplicationTimeoutError: a ``WAIT`` counted fewer replicas than wanted, failed,
                or may have run on another connection than the writes (redis-py resent
                commands of a cluster pipeline one by one after a redirection or a lost
                connection, which the pipeline's ``reinitialize_counter`` shows).
        """
        if not wanted:
            return
        retried: int = getattr(pipe, "reinitialize_counter", 0)
        if self._cluster and retried:
            self._read_at = -TOPOLOGY_REFRESH_S
            raise ReplicationTimeoutError(
                "Redis Cluster redirected or reconnected during the pipeline: its WAIT may "
                "not have covered the writes"
            )
        for count, answer in zip(wanted, answers, strict=True):
            if isinstance(answer, Exception):
                raise ReplicationTimeoutError(f"Redis WAIT failed: {answer}") from answer
            if int(answer) < count:
                self._read_at = -TOPOLOGY_REFRESH_S
                raise ReplicationTimeoutError(
                    f"{answer} of {count} Redis replicas confirmed the changes within "
                    f"{self.timeout_ms} ms"
                )

    def _wanted(self, nodes: dict[str, ClusterNode]) -> dict[str, int]:
        with self._lock:
            now = time.monotonic()
            if now - self._read_at >= TOPOLOGY_REFRESH_S or any(
                n not in self._live_replicas for n in nodes
            ):
                self._read_topology()
                self._read_at = now
            return {n: min(self.replicas, self._live_replicas.get(n, 0)) for n in nodes}

    def _read_topology(self) -> None:
        try:
            shards = self._client.execute_command("CLUSTER SHARDS")
        except (redis.RedisError, RedisClusterException) as exc:
            log.debug("CLUSTER SHARDS failed, keeping the replicas known: %s", exc)
            return
        live = live_replicas_by_master(shards)
        short = {name for name, count in live.items() if count < self.replicas}
        for name in sorted(short - self._short):
            log.warning(
                "Redis master %s has %d live replicas of the %d changes wait for: its changes "
                "are acknowledged with %d until replicas join",
                name,
                live[name],
                self.replicas,
                live[name],
            )
        for name in sorted(self._short - short):
            if name in live:
                log.info("Redis master %s has %d live replicas again", name, live[name])
        self._short = short
        self._live_replicas = live


def live_replicas_by_master(shards: Any) -> dict[str, int]:
    """How many replicas each master has that the cluster does not mark failed.

    Args:
        shards: The reply of ``CLUSTER SHARDS`` as redis-py returns it (a list of shards, each
            with its ``nodes``; possibly under the name of the node that answered).

    Returns:
        ``{"host:port" of each live master: its replicas not marked failed}``.
    """
    live: dict[str, int] = {}
    for shard in _as_list(shards):
        nodes = [_decoded(n) for n in _field(shard, "nodes")]
        masters = [n for n in nodes if n.get("role") == "master" and n.get("health") != "fail"]
        if not masters:
            continue
        replicas = [n for n in nodes if n.get("role") == "replica" and n.get("health") != "fail"]
        master = masters[0]
        live[f"{master.get('endpoint') or master.get('ip')}:{master.get('port')}"] = len(replicas)
    return live


def _as_list(raw: Any) -> list[Any]:
    # RedisCluster asks one node and may wrap the answer by node name.
    if isinstance(raw, dict) and raw and all(isinstance(v, list) for v in raw.values()):
        return next(iter(raw.values()))
    return list(raw)


def _field(record: Any, name: str) -> Any:
    if isinstance(record, dict):
        return record.get(name, record.get(name.encode(), []))
    fields = list(record)
    for i in range(0, len(fields) - 1, 2):
        key = fields[i].decode() if isinstance(fields[i], bytes) else fields[i]
        if key == name:
            return fields[i + 1]
    return []


def _decoded(node: Any) -> dict[str, Any]:
    if not isinstance(node, dict):
        items = list(node)
        node = dict(zip(items[0::2], items[1::2], strict=False))
    return {
        (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
        for k, v in node.items()
    }


__all__ = ["TOPOLOGY_REFRESH_S", "ReplicaWait", "live_replicas_by_master"]
