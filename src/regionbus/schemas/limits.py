"""How much one request may ask: the bounds the client API refuses before anything is sent
and the servers refuse from anyone else (a producer that skips the client), and how a
large legal request is cut so that other clients are not kept waiting behind it.

A cache server does one thing at a time on its loop (every bucket it is primary of), so
an operation that takes it long holds every other client's operations for that long. A
registration of many keys and a ``put_all`` of many entries are therefore sent as many
small operations, only a few in flight at a time: the server takes them between other
clients' operations, each step a few milliseconds of its time.

Values are bounded by `regionbus.schemas.entry_checks` (``MAX_VALUE_SIZE_BYTES`` on the wire,
the servers' ``max_value_size_bytes``, which a client learns when it connects).
"""

from __future__ import annotations

from typing import Final

from regionbus.schemas.errors import RequestLimitError

MAX_KEYS_PER_REGISTRATION: Final = 100_000
"""Keys one ``register_interest`` call may name. Geode sets no limit; here a server keeps
every registered key of every client in memory to route by (about 0.3 KiB each, and as
much again in Redis), so one call may add at most about 30 MiB to a server. Register more
keys in several calls, or by regex."""

KEYS_PER_REGISTRATION_MESSAGE: Final = 500
"""Keys of one registration operation: a larger list is sent as operations of at most this
many keys of one bucket, each registered and bulk-loaded in one step of its bucket's order
(so each key's registration is still gap-free). Servers refuse an operation with more.

With :data:`REGISTRATION_MESSAGES_IN_FLIGHT`, it bounds what another client's put may wait
behind: ``bench.fleet`` measured another client's put p99 at 65-79 ms during a
registration of 100,000 keys (which took 1.5-1.7 s), against about 110 ms with 1,000
keys and 4 in flight (1.1 s)."""

MAX_KEYS_PER_CLIENT: Final = 250_000
"""Keys one client may hold registered, over all its regions and calls: the per-call limit
alone let a client grow a server by 160 MB in three calls of 100,000. 250,000 keys are
about 130 MiB of a server's memory; a year of one airport's flights (some 120,000) fits.
A server counts the keys of the buckets it holds."""

REGISTRATION_MESSAGES_IN_FLIGHT: Final = 2
"""Registration operations of one call sent and not yet answered, at most: one being
worked on while the next travels."""

MAX_REGEXES_PER_CLIENT: Final = 100
"""Regex registrations one client may hold, over all its regions: a server matches each
against every changed key of its region (RE2, linear in the key, but once per regex)."""

MAX_BULK_ENTRIES: Final = 100_000
"""Entries of one ``put_all`` or ``remove_all``. Larger loads are several calls, or
`regionbus.spark.bulkload.bulk_load`."""

BULK_ENTRIES_IN_FLIGHT: Final = 128
"""Entries of one ``put_all`` / ``remove_all`` sent and not yet answered, at most: the
server works through at most this many of its entries before taking another client's
operation, and at most this many are in flight when the call gives up on a timeout.
``bench.fleet`` measured another client's put p99 at 42-46 ms during a ``put_all`` of
100,000 entries (21-23 s), against about 100 ms with 256 in flight (20 s)."""

BULK_SEND_GROUP: Final = 32
"""Entries sent together once that many places of the window are free (one Kafka message
per bucket rather than one per entry)."""

MAX_FUNCTION_FILTER_KEYS: Final = 1_000
"""Keys of one function execution's filter (``Execution.with_filter``). Geode sets no limit;
here each bucket's keys travel in the one operation that runs the function there, and one
Kafka message holds about 1 MB. A filter routes an execution: process more keys by
passing them as arguments, or running without a filter over every bucket's entries."""


def check_count(what: str, requested: int, limit: int) -> None:
    """Refuse a request that asks for more than a limit.

    Args:
        what: What is counted, for the message (``"keys per registration"``).
        requested: How many the request asks for.
        limit: The most allowed.

    Raises:
        RequestLimitError: ``requested > limit``.
    """
    if requested > limit:
        raise RequestLimitError(
            f"{requested:,} {what} is over the limit of {limit:,} (regionbus.schemas.limits)",
            limit_name=what,
            limit=limit,
            requested=requested,
        )


__all__ = [
    "BULK_ENTRIES_IN_FLIGHT",
    "BULK_SEND_GROUP",
    "KEYS_PER_REGISTRATION_MESSAGE",
    "MAX_BULK_ENTRIES",
    "MAX_FUNCTION_FILTER_KEYS",
    "MAX_KEYS_PER_CLIENT",
    "MAX_KEYS_PER_REGISTRATION",
    "MAX_REGEXES_PER_CLIENT",
    "REGISTRATION_MESSAGES_IN_FLIGHT",
    "check_count",
]
