"""Lua scripts queued on a Redis pipeline by their SHA1, in one round trip.

redis-py's ``Script`` on a pipeline asks ``SCRIPT EXISTS`` of Redis before every
``execute``: a second round trip per poll batch (and a Redis Cluster pipeline refuses it).
A :class:`PipelinedScript` knows its SHA1 and is only loaded when Redis answers
``NOSCRIPT`` (a restarted, flushed or newly promoted Redis), after which
:func:`execute_with_scripts` runs the pipeline once more. The pipeline may end with
``WAIT`` for replicas (:mod:`regionbus.runtime.redis_replication`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from redis.exceptions import NoScriptError

from regionbus.runtime.redis_replication import ReplicaWait


class PipelinedScript:
    """A Lua script queued by ``EVALSHA`` (see the module docstring).

    Args:
        source: The script's text.
    """

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode(), usedforsecurity=False).hexdigest()

    def queue(self, pipe: Any, keys: Sequence[Any], args: Sequence[Any]) -> None:
        """Queue one call of the script on ``pipe``."""
        pipe.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)


def execute_with_scripts(
    client: Any,
    build: Callable[[Any], None],
    scripts: Sequence[PipelinedScript],
    *,
    replica_wait: ReplicaWait | None = None,
    written_keys: Iterable[str] = (),
) -> list[Any]:
    """Run the commands ``build`` queues as one non-transactional pipeline: one round trip.

    When Redis does not know a script (``NOSCRIPT``: it restarted, was promoted from a
    replica, or its scripts were flushed), every script is loaded and the pipeline is built
    and run again. A call that ran the first time runs twice then, which the entry scripts
    answer as a duplicate by its EventID (status ``DUP``, the same event flagged
    ``possible_duplicate``).

    Args:
        client: A redis-py client (``redis.Redis`` or ``RedisCluster``).
        build: Queues the commands on the pipeline it is given (on a Redis Cluster, every
            script call's keys in one hash slot).
        scripts: The scripts ``build`` may queue.
        replica_wait: Ends the pipeline with ``WAIT`` on each master written (see
            :mod:`regionbus.runtime.redis_replication`); None or disabled waits for nothing.
        written_keys: A key of each hash slot ``build`` writes, for ``replica_wait``.

    Returns:
        One reply per command ``build`` queued, in order.

    Raises:
        redis.exceptions.RedisError: Redis failed, or a command failed (the first error).
        ReplicationTimeoutError: too few replicas confirmed the writes in time.
    """
    keys = list(written_keys)
    replies, wanted, pipe = _run(client, build, replica_wait, keys)
    if any(isinstance(reply, NoScriptError) for reply in replies):
        for script in scripts:
            client.script_load(script.source)
        replies, wanted, pipe = _run(client, build, replica_wait, keys)
    answers = replies[len(replies) - len(wanted) :]
    replies = replies[: len(replies) - len(wanted)]
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    if replica_wait is not None:
        replica_wait.check(pipe, wanted, answers)
    return replies


def _run(
    client: Any,
    build: Callable[[Any], None],
    replica_wait: ReplicaWait | None,
    written_keys: list[str],
) -> tuple[list[Any], list[int], Any]:
    pipe = client.pipeline(transaction=False)
    build(pipe)
    wanted = replica_wait.queue(pipe, written_keys) if replica_wait is not None else []
    return pipe.execute(raise_on_error=False), wanted, pipe


__all__ = [
    "PipelinedScript",
    "execute_with_scripts",
]
