"""Which messages on a client's own topics come from the cache servers.

With a principal configured (security on), a client accepts from its queue and reply
topics only what a cache server signed for its principal (`regionbus.schemas.signing`: signed as
the servers with the client principal's key). Anything else, unsigned or forged by
whoever can produce to those topics, is dropped, counted and logged, and never reaches
the cache, a listener or a caller.
"""

from __future__ import annotations

import logging

from confluent_kafka import Message as KafkaMessage

from regionbus.schemas.addressing import signed_bytes
from regionbus.schemas.errors import AuthenticationError
from regionbus.schemas.signing import Signer

log = logging.getLogger("regionbus.client")


class ServerMessages:
    """The check of one client topic's messages.

    Args:
        signer: The client's signer (its principal and key); None when the client has no
            principal, and then every message is accepted, as the servers do not sign.
    """

    def __init__(self, signer: Signer | None) -> None:
        self._signer = signer
        self.dropped = 0
        """Messages dropped as not signed by a cache server."""

    @property
    def checking(self) -> bool:
        """True when messages are checked (the client has a principal)."""
        return self._signer is not None

    def problem(self, message: KafkaMessage) -> AuthenticationError | None:
        """Why a message is not a cache server's, or None when it is (or is not checked)."""
        if self._signer is None:
            return None
        headers = message.headers()
        try:
            self._signer.check_from_server(
                headers,
                message.topic() or "",
                message.partition() or 0,
                signed_bytes(message.key(), headers, message.value()),
            )
        except AuthenticationError as exc:
            return exc
        return None

    def drop(self, message: KafkaMessage, problem: AuthenticationError) -> None:
        """Count and log a message dropped for ``problem``."""
        self.dropped += 1
        log.warning(
            "dropped a message not signed by a cache server from %s[%s]@%s: %s",
            message.topic(),
            message.partition(),
            message.offset(),
            problem,
        )

    def accepts(self, message: KafkaMessage) -> bool:
        """Whether to take a message; one that is not a cache server's is dropped
        (:meth:`drop`)."""
        problem = self.problem(message)
        if problem is None:
            return True
        self.drop(message, problem)
        return False


__all__ = ["ServerMessages"]
