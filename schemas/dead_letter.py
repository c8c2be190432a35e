"""How a message no worker can process is set aside in ``{ns}.dead-letter``.

The message goes there unchanged, with headers saying why and where it came from, so an
operator can read, fix and replay it; the worker goes on (invariant 6).
"""

from __future__ import annotations

from typing import Final, NamedTuple

REASON_HEADER: Final = "rb.reason"
"""Why the message could not be processed (UTF-8 text)."""


class Source(NamedTuple):
    """Where a message was read: its topic, partition and offset."""

    topic: str
    partition: int
    offset: int


def dead_letter_headers(
    reason: str, source: Source, member_id: str
) -> list[tuple[str, str | bytes | None]]:
    """The headers of a dead-lettered message.

    Args:
        reason: Why it could not be processed.
        source: Where it was read.
        member_id: The worker that set it aside.

    Returns:
        ``rb.reason``, ``rb.source.topic``, ``rb.source.partition``, ``rb.source.offset``
        and ``rb.server``, as bytes.
    """
    return [
        (REASON_HEADER, reason.encode()),
        ("rb.source.topic", source.topic.encode()),
        ("rb.source.partition", str(source.partition).encode()),
        ("rb.source.offset", str(source.offset).encode()),
        ("rb.server", member_id.encode()),
    ]


__all__ = ["REASON_HEADER", "Source", "dead_letter_headers"]
