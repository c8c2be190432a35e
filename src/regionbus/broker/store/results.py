"""What the region store's calls return, read from the Lua scripts' replies (the values'
formats are `regionbus.schemas.redis_values`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from regionbus.broker.expiration_attributes import RegionExpiration
from regionbus.schemas.messages import Entry, EventKind
from regionbus.schemas.naming import entry_version
from regionbus.schemas.redis_values import GatewayVersion, parse_meta, parse_result


@dataclass(frozen=True, slots=True)
class ApplyResult:
    """What applying one change did.

    Attributes:
        status: ``"OK"`` (applied now), ``"DUP"`` (the EventID was applied before),
            ``"ERR"`` (refused; nothing changed), ``"STALE"`` (a gateway event that lost
            the conflict check; nothing changed), ``"FENCED"`` (the caller is no longer
            the bucket's primary; nothing changed) or ``"NOOP"`` (a conditional operation
            whose condition did not hold; nothing changed, and ``old_value`` is the entry's
            current value).
        event_kind: The resulting event kind (None when refused, or DUP with the stored
            result already pruned).
        version: Region version the change got (None as for ``event_kind``).
        error_type: Class name of the error for ``"ERR"``.
        old_value: Value before the change, when asked for and present (a recognised
            duplicate's too: it is kept with the result until the offsets are committed).
        old_serializer: The name of ``old_value``'s serializer.
    """

    status: str
    event_kind: EventKind | None = None
    version: int | None = None
    error_type: str | None = None
    old_value: bytes | None = None
    old_serializer: str | None = None


class Access(NamedTuple):
    """What a ``get`` of an entry of a region with an entry idle timeout records: the read
    counts as an access and pushes the entry's expiry back (Geode
    ``LocalRegion.updateStatsForGet``).

    Attributes:
        expiration: The region's expiration attributes.
        now_ms: Time of the read, ms since the Unix epoch.
    """

    expiration: RegionExpiration
    now_ms: int


class Snapshot(NamedTuple):
    """What :meth:`RegionStore.snapshot` read."""

    exists: bool
    entries: list[Entry]
    region_version: int


def text_of(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def _parse_result(raw: bytes | None) -> tuple[EventKind | None, int | None]:
    if not raw:
        return None, None
    return parse_result(raw)


def to_apply_result(reply: Sequence[Any]) -> ApplyResult:
    """A script's ``{status, result, old_value, old_serializer}`` reply read. A
    conditional operation that changed nothing is ``NOOP`` whether it is seen for the first
    time or again (status ``DUP``, stored result ``NOOP``): there is no event to send."""
    status = reply[0].decode() if isinstance(reply[0], bytes) else str(reply[0])
    if status == "ERR":
        error = reply[1].decode() if isinstance(reply[1], bytes) else str(reply[1])
        return ApplyResult(status, error_type=error)
    old = reply[2] if len(reply) > 2 and reply[2] else None
    old_serializer = reply[3] if len(reply) > 3 and reply[3] else None
    serializer_name = old_serializer.decode() if isinstance(old_serializer, bytes) else None
    if status == "NOOP" or reply[1] == b"NOOP":
        return ApplyResult("NOOP", old_value=old, old_serializer=serializer_name)
    kind, version = _parse_result(reply[1] or None)
    return ApplyResult(status, kind, version, old_value=old, old_serializer=serializer_name)


def to_entry(
    key: str, exists: Any, meta: bytes | None, value: bytes | None
) -> tuple[bool, Entry | None]:
    if not exists:
        return False, None
    if meta is None:
        return True, None
    version, serializer = parse_meta(meta)
    return True, Entry(key, version, value, serializer)


def version_of(raw: Sequence[Any]) -> int:
    """An entry version from a region version hash's ``gen`` and ``n`` (HMGET)."""
    gen, n = raw
    return entry_version(int(gen or 0), int(n or 0))


__all__ = [
    "Access",
    "ApplyResult",
    "GatewayVersion",
    "Snapshot",
    "text_of",
    "to_apply_result",
    "to_entry",
    "version_of",
]
