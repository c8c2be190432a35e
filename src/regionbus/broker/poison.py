"""What the server does with a message whose handling raised an unexpected error.

Whatever one message does (a ``RecursionError`` from a pathological input, a bug a rare
input reaches), it must not stop the server: a message that kills the server's thread is
read again from the committed offset after every restart, so it would stop every server of
the namespace for good. Such a message is set aside in ``{ns}.dead-letter`` with the error
as its reason, its sender gets an error reply when it can be told, and the loop goes on
(invariant 6 of ARCHITECTURE.md).

Errors of the infrastructure are not the message's fault and keep their own paths: a
``TransportError`` or a Redis outage still reaches the serve loop, which waits the outage
out and reads the message again.
"""

from __future__ import annotations

import logging
from contextlib import suppress

from regionbus.broker.outbox import Outbox
from regionbus.runtime.redis_outage import is_redis_unavailable
from regionbus.schemas.codec import decode
from regionbus.schemas.dead_letter import Source
from regionbus.schemas.errors import ServerOperationError, TransportError
from regionbus.schemas.messages import Operation

log = logging.getLogger("regionbus.server")

POISON_CATEGORY = "processing_failed"
"""The dead-letter metric's category of these messages."""


def is_infrastructure_error(exc: BaseException) -> bool:
    """True for errors of Kafka or Redis, which the serve loop handles (not the message's)."""
    return isinstance(exc, TransportError) or is_redis_unavailable(exc)


def set_aside(outbox: Outbox, raw: bytes | None, source: Source, exc: Exception) -> None:
    """Dead-letter a message whose handling raised ``exc`` and tell its sender.

    Args:
        outbox: The server's outbox (dead letters and replies).
        raw: The message's bytes as read (one item of a batch, or the whole message).
        source: Where it was read.
        exc: What its handling raised; not an infrastructure error.
    """
    reason = f"{type(exc).__name__} while processing: {exc}"[:2000]
    log.error(
        "processing %s[%d]@%d failed; dead-lettered, going on",
        source.topic,
        source.partition,
        source.offset,
        exc_info=exc,
    )
    outbox.dead_letter(raw, source, reason, category=POISON_CATEGORY)
    op: object = None
    if raw is not None:
        with suppress(Exception):
            op = decode(raw)
    if isinstance(op, Operation):
        outbox.reply_error(op, source.partition, ServerOperationError(reason))


__all__ = ["POISON_CATEGORY", "is_infrastructure_error", "set_aside"]
