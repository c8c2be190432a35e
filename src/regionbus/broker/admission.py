"""Who may ask what of a cache server, when security is on: the check at its front door.

A Kafka message is authenticated by its signature before anything of it is decoded into
effects; each request it carries is then authorized against its principal's permissions
(:class:`regionbus.broker.security.SecurityGuard` holds the rules). A refusal is audited, the
message is dead-lettered (``category="refused"``) with its signing headers, and every
client it names is told with a reply carrying the error.
"""

from __future__ import annotations

from confluent_kafka import Message as KafkaMessage

from regionbus.broker.outbox import Outbox
from regionbus.broker.principals import Principal
from regionbus.broker.security import SecurityGuard, audit_refusal
from regionbus.broker.stats import ServerStats
from regionbus.schemas.codec import decode, split_batch
from regionbus.schemas.dead_letter import Source
from regionbus.schemas.errors import (
    AuthenticationError,
    MessageDecodeError,
    NotAuthorizedError,
    RegionBusError,
)
from regionbus.schemas.messages import Control, Operation
from regionbus.schemas.signing import HEADER_PRINCIPAL, HeaderList, Headers


class Admission:
    """Authenticates messages and authorizes requests, refusing what fails.

    Args:
        guard: The security rules and principals.
        outbox: Refusal replies and dead letters.
        stats: The server's counters (refused requests count as errors).
    """

    def __init__(self, guard: SecurityGuard, outbox: Outbox, stats: ServerStats) -> None:
        self.guard = guard
        self._outbox = outbox
        self._stats = stats

    def authenticate(self, message: KafkaMessage, source: Source) -> Principal | None:
        """The principal who signed a Kafka message, or None when it is refused (audited,
        dead-lettered, its clients told)."""
        try:
            return self.guard.authenticate(
                message.headers(), source.topic, source.partition, source.offset, message.value()
            )
        except AuthenticationError as exc:
            claimed = _header(message.headers(), HEADER_PRINCIPAL)
            self._refuse(message.value(), source, exc, claimed, message.headers())
            return None

    def authorize(self, decoded: object, raw: bytes, source: Source, principal: Principal) -> bool:
        """Whether the principal may make this request; False when it is refused (audited,
        dead-lettered, replied ``NotAuthorizedError``)."""
        try:
            if isinstance(decoded, Operation):
                self.guard.authorize_operation(principal, decoded)
            elif isinstance(decoded, Control):
                self.guard.authorize_control(principal, decoded)
        except NotAuthorizedError as exc:
            self._refuse(raw, source, exc, principal.name)
            return False
        return True

    def _refuse(
        self,
        raw: bytes | None,
        source: Source,
        exc: RegionBusError,
        principal: str | None,
        headers: Headers | None = None,
    ) -> None:
        where = f"{source.topic}/{source.partition}/{source.offset}"
        try:
            items = [decode(item) for item in split_batch(raw)]
        except MessageDecodeError:
            items = []
        if not items:
            audit_refusal(principal, "message", None, None, str(exc), where)
        for item in items:
            if isinstance(item, Operation):
                audit_refusal(
                    principal, item.kind.value, item.region, item.client_id, str(exc), where
                )
                self._outbox.reply_error(item, source.partition, exc)
            elif isinstance(item, Control):
                audit_refusal(principal, item.kind.value, None, item.client_id, str(exc), where)
                if item.request_id:
                    self._stats.errors += 1
                    self._outbox.refuse_control(item, exc)
        pairs = list(headers.items()) if isinstance(headers, dict) else headers or []
        signing: HeaderList = [(k, v) for k, v in pairs if k.startswith("rb.")]
        self._outbox.dead_letter(
            raw,
            source,
            f"{type(exc).__name__}: {exc}",
            [("rb.refused", b"1"), *signing],
            category="refused",
        )


def _header(headers: Headers | None, name: str) -> str | None:
    pairs = list(headers.items()) if isinstance(headers, dict) else headers or []
    for key, value in pairs:
        if key == name and value is not None:
            return value.decode(errors="replace") if isinstance(value, bytes) else value
    return None


__all__ = ["Admission"]
