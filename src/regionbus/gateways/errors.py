"""Errors of gateway senders and receivers (retriable: the batch stays queued)."""

from __future__ import annotations

from regionbus.schemas.errors import RetriableError


class RemoteSiteUnreachableError(RetriableError):
    """The remote site's Kafka refused or did not take a batch in time (docs/behaviour.md
    §6: no remote site reachable); the batch stays queued and is retried."""


class BatchApplyTimeoutError(RetriableError):
    """The receiving site's servers did not answer every operation of a batch in time; the
    batch is not acked, so the sender resends it."""


class RegionNotYetDefinedError(RetriableError):
    """A batch names a region this site does not define, and the receiver keeps such a
    batch (unacked) until the region exists."""


__all__ = ["BatchApplyTimeoutError", "RegionNotYetDefinedError", "RemoteSiteUnreachableError"]
