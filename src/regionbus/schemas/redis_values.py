"""The formats of the values regionbus stores in Redis, each as a format and parse pair,
beside the names of their keys (`regionbus.schemas.naming.RedisKeys`).

Several values are two fields joined by ``|``. The Lua scripts (``broker/lua/``) write
them in these same formats; everything in Python that reads or writes one goes through
this module, so a format lives in one place on each side:

============================ =========================== ===================================
value                        key                          format
============================ =========================== ===================================
a role's lease               ``RedisKeys.lease(role)``    ``<member id>|<fencing epoch>``
an applied change's result   a bucket's applied EventIDs  ``<EventKind>|<entry version>``
an entry's meta              ``region_meta``              ``<entry version>|<serializer>``
a gateway version            ``region_gateway_versions``  ``<timestamp ms>|<site id>``
============================ =========================== ===================================

The member id and the serializer may hold ``|``: a lease is split at its last ``|``, the
others at their first.
"""

from __future__ import annotations

from typing import NamedTuple

from regionbus.schemas.messages import EventKind

_SEPARATOR = "|"


class LeaseValue(NamedTuple):
    """Who holds a role, and the fencing epoch they took it with."""

    member_id: str
    epoch: int


class StoredResult(NamedTuple):
    """What an applied change did: its event kind and the entry (or region) version."""

    kind: EventKind
    version: int


class EntryMeta(NamedTuple):
    """An entry's version and the serializer of its value (None: not named)."""

    version: int
    serializer: str | None


class GatewayVersion(NamedTuple):
    """When and where an entry last changed, for gateway conflict resolution (the WAN
    conflict rules, Geode's ``GatewayConflictResolver``).

    Attributes:
        timestamp_ms: The change's timestamp, ms since the Unix epoch.
        site_id: ``distributed_system_id`` of the site where the change was made.
    """

    timestamp_ms: int
    site_id: int


def _text(raw: bytes | str) -> str:
    return raw.decode() if isinstance(raw, bytes) else raw


def format_lease(member_id: str, epoch: int) -> str:
    """A lease value (as ``leases.lua``-style scripts write it)."""
    return f"{member_id}{_SEPARATOR}{epoch}"


def parse_lease(raw: bytes | str) -> LeaseValue:
    """A lease value read from Redis.

    Raises:
        ValueError: the value is not ``<member id>|<epoch>``.
    """
    member_id, _, epoch = _text(raw).rpartition(_SEPARATOR)
    return LeaseValue(member_id, int(epoch))


def format_result(kind: EventKind, version: int) -> str:
    """An applied change's stored result."""
    return f"{kind.value}{_SEPARATOR}{version}"


def parse_result(raw: bytes | str) -> StoredResult:
    """An applied change's stored result read from Redis (or returned by a script).

    Raises:
        ValueError: the value is not ``<EventKind>|<version>``.
    """
    kind, _, version = _text(raw).partition(_SEPARATOR)
    return StoredResult(EventKind(kind), int(version))


def parse_meta(raw: bytes | str) -> EntryMeta:
    """An entry's meta read from Redis (written by ``apply_entries.lua``).

    Raises:
        ValueError: the value is not ``<version>|<serializer>``.
    """
    version, _, serializer = _text(raw).partition(_SEPARATOR)
    return EntryMeta(int(version), serializer or None)


def parse_gateway_version(raw: bytes | str) -> GatewayVersion:
    """An entry's gateway version read from Redis (written by ``apply_entries.lua``).

    Raises:
        ValueError: the value is not ``<timestamp ms>|<site id>``.
    """
    timestamp_ms, _, site_id = _text(raw).partition(_SEPARATOR)
    return GatewayVersion(int(timestamp_ms), int(site_id))


__all__ = [
    "EntryMeta",
    "GatewayVersion",
    "LeaseValue",
    "StoredResult",
    "format_lease",
    "format_result",
    "parse_gateway_version",
    "parse_lease",
    "parse_meta",
    "parse_result",
]
