"""The region store's Redis connection: the client, the key names, each bucket's hash slot,
and the one pipelined round trip every part of the store runs its commands in."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from redis.cluster import RedisCluster
from redis.crc import key_slot

from regionbus.runtime.redis_connect import redis_errors
from regionbus.runtime.redis_replication import ReplicaWait
from regionbus.runtime.redis_scripts import PipelinedScript, execute_with_scripts
from regionbus.schemas.naming import RedisKeys


class StoreBase:
    """What every part of the region store shares.

    Args:
        client: A redis-py client (``redis.Redis`` or ``RedisCluster``) created with
            ``decode_responses=False``.
        namespace: The site namespace.
        total_buckets: Number of buckets.
        replica_wait: Makes every change wait for replicas before it counts as applied
            (:mod:`regionbus.runtime.redis_replication`); None waits for none.
    """

    scripts: tuple[PipelinedScript, ...] = ()
    """Every script the store may queue: all are loaded after a ``NOSCRIPT``, whichever
    one Redis missed."""

    def __init__(
        self,
        client: Any,
        namespace: str,
        total_buckets: int,
        replica_wait: ReplicaWait | None = None,
    ) -> None:
        self.redis = client
        self.keys = RedisKeys(namespace)
        self.total_buckets = total_buckets
        self.replica_wait = replica_wait
        self.cluster = isinstance(client, RedisCluster)
        self._slots = [
            key_slot(self.keys.bucket_prefix(b).encode()) if self.cluster else 0
            for b in range(total_buckets)
        ]
        """Hash slot of each bucket on a Redis Cluster; all 0 on one Redis, where a script
        may take keys of several buckets."""
        self._slot_of_tracking = {
            self.keys.tracking(b): self._slots[b] for b in range(total_buckets)
        }

    def execute(
        self, build: Callable[[Any], None], written_buckets: Iterable[int] = ()
    ) -> list[Any]:
        """Run what ``build`` queues in one pipeline, waiting for replicas of the buckets
        written (see :func:`regionbus.runtime.redis_scripts.execute_with_scripts`).

        Args:
            build: Queues the commands on the pipeline it is given.
            written_buckets: The buckets ``build`` writes (their slots wait for replicas).

        Returns:
            The replies, in the order queued.

        Raises:
            TransportError: Redis failed, or too few replicas confirmed the writes
                (:class:`regionbus.schemas.errors.ReplicationTimeoutError`).
        """
        return self._execute(build, [self.keys.tracking(b) for b in written_buckets])

    def _execute(self, build: Callable[[Any], None], written_keys: Iterable[str]) -> list[Any]:
        with redis_errors():
            return execute_with_scripts(
                self.redis,
                build,
                self.scripts,
                replica_wait=self.replica_wait,
                written_keys=written_keys,
            )


__all__ = ["StoreBase"]
