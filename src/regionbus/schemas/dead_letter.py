"""How a message no worker can process is set aside in ``{ns}.dead-letter``.

The message goes there unchanged, with headers saying why and where it came from, so an
operator can read, fix and replay it; the worker goes on (invariant 6).
"""

from __future__ import annotations

from typing import Final, NamedTuple

REASON_HEADER: Final = "rb.reason"
"""Why the message could not be processed (UTF-8 text)."""

LAST_OFFSET_HEADER: Final = "rb.source.last-offset"
"""Of a dead letter standing for several records (an unreadable record batch, which has no
value to keep): the last offset it covers; ``rb.source.offset`` is the first."""

MAX_REASON_CHARS: Final = 2000
"""Longest reason kept, in characters: an error's text can quote the input."""


class Source(NamedTuple):
    """Where a message was read: its topic, partition and offset."""

    topic: str
    partition: int
    offset: int


def dead_letter_headers(
    reason: str, source: Source, member_id: str, last_offset: int | None = None
) -> list[tuple[str, str | bytes | None]]:
    """The headers of a dead-lettered message.

    Args:
        reason: Why it could not be processed (cut to :data:`MAX_REASON_CHARS`).
        source: Where it was read (its first offset, for several records).
        member_id: The worker that set it aside.
        last_offset: The last offset, when the dead letter stands for several records.

    Returns:
        ``rb.reason``, ``rb.source.topic``, ``rb.source.partition``, ``rb.source.offset``,
        ``rb.server`` and, with ``last_offset``, ``rb.source.last-offset``, as bytes.
    """
    headers: list[tuple[str, str | bytes | None]] = [
        (REASON_HEADER, reason[:MAX_REASON_CHARS].encode(errors="replace")),
        ("rb.source.topic", source.topic.encode()),
        ("rb.source.partition", str(source.partition).encode()),
        ("rb.source.offset", str(source.offset).encode()),
        ("rb.server", member_id.encode()),
    ]
    if last_offset is not None:
        headers.append((LAST_OFFSET_HEADER, str(last_offset).encode()))
    return headers


__all__ = [
    "LAST_OFFSET_HEADER",
    "MAX_REASON_CHARS",
    "REASON_HEADER",
    "Source",
    "dead_letter_headers",
]
