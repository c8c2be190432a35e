"""Lua scripts queued on a Redis pipeline by their SHA1, in one round trip.

redis-py's ``Script`` on a pipeline asks ``SCRIPT EXISTS`` of Redis before every
``execute``: a second round trip per poll batch. A :class:`PipelinedScript` knows its SHA1
and is only loaded when Redis answers ``NOSCRIPT`` (a restarted or flushed Redis), after
which :func:`execute_with_scripts` runs the pipeline once more.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from importlib import resources
from typing import Any

import redis
from redis.exceptions import NoScriptError

APPLY_ENTRY_MARK = "--@APPLY_ENTRY@--"
"""Where ``apply_entries.lua`` takes the body of ``apply_entry.lua``."""


def load_lua(name: str) -> str:
    """The text of ``broker/lua/<name>``."""
    return resources.files("regionbus.broker").joinpath("lua", name).read_text()


def apply_entries_source() -> str:
    """``apply_entries.lua`` with ``apply_entry.lua`` as its per-operation function: one
    definition of what applying an entry operation does, run once per operation of a batch."""
    return load_lua("apply_entries.lua").replace(APPLY_ENTRY_MARK, load_lua("apply_entry.lua"))


class PipelinedScript:
    """A Lua script queued by ``EVALSHA`` (see the module docstring).

    Args:
        source: The script's text.
    """

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode(), usedforsecurity=False).hexdigest()

    def queue(self, pipe: redis.client.Pipeline, keys: Sequence[Any], args: Sequence[Any]) -> None:
        """Queue one call of the script on ``pipe``."""
        pipe.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)


def execute_with_scripts(
    client: redis.Redis,
    build: Callable[[redis.client.Pipeline], None],
    scripts: Sequence[PipelinedScript],
) -> list[Any]:
    """Run the commands ``build`` queues as one non-transactional pipeline: one round trip.

    When Redis does not know a script (``NOSCRIPT``: it restarted or its scripts were
    flushed), every script is loaded and the pipeline is built and run again. A call that
    ran the first time runs twice then, which the entry scripts answer as a duplicate by its
    EventID (status ``DUP``, the same event flagged ``possible_duplicate``).

    Args:
        client: A redis-py client.
        build: Queues the commands on the pipeline it is given.
        scripts: The scripts ``build`` may queue.

    Returns:
        One reply per queued command, in order.

    Raises:
        redis.exceptions.RedisError: Redis failed, or a command failed (the first error).
    """
    replies = _run(client, build)
    if any(isinstance(reply, NoScriptError) for reply in replies):
        for script in scripts:
            client.script_load(script.source)
        replies = _run(client, build)
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies


def _run(client: redis.Redis, build: Callable[[redis.client.Pipeline], None]) -> list[Any]:
    pipe = client.pipeline(transaction=False)
    build(pipe)
    return pipe.execute(raise_on_error=False)


__all__ = [
    "APPLY_ENTRY_MARK",
    "PipelinedScript",
    "apply_entries_source",
    "execute_with_scripts",
    "load_lua",
]
