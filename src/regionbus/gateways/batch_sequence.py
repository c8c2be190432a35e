"""The gateway receiver's check that a sender's batches are applied in the order it sent
them, with several of them in flight.

A gateway sender keeps up to ``max_batches_in_flight`` batches unacked, numbered per run
(:attr:`GatewayBatch.sequence`). They reach the receiver's one inbound partition in send
order, except when one is lost on the way (the remote Kafka refused it, the sender's
producer gave up on it) while a later one got through. Applying that later batch first
would break the sender's order and, worse, lose the first one's events: the servers
track the highest sequence applied per (member, thread, bucket) and would then drop the
earlier events as duplicates. So the receiver applies batch ``n`` only when it applied
``n - 1`` of the same run itself, or when the batch says the sender had an ack for
``n - 1`` (:attr:`GatewayBatch.acked_through`: a resend starts from the first unacked
batch, and names the acked prefix before it). A batch refused here is not acked; the
sender resends it, with the ones after it, from the first unacked one.

What was applied per sender is kept with the receiver's committed inbound offset (the
commit's metadata, :meth:`BatchSequencer.to_metadata`), so a restarted receiver goes on
from where it left instead of waiting for the sender's ack timeout.
"""

from __future__ import annotations

import json
import logging
from typing import Final

from regionbus.gateways.protocol import GatewayBatch

log = logging.getLogger("regionbus.gateways.receiver")

METADATA_LIMIT: Final = 3500
"""Longest commit metadata written, in characters (Kafka's default
``offset.metadata.max.bytes`` is 4096); the oldest senders are dropped past it."""


class BatchSequencer:
    """Per sender (site id, sender id): the run and sequence of the last batch applied.

    Args:
        metadata: A previous :meth:`to_metadata`, or None / "" / garbage for none.
    """

    def __init__(self, metadata: str | None = None) -> None:
        self._applied: dict[str, tuple[str, int]] = {}
        if metadata:
            try:
                loaded = json.loads(metadata)
                self._applied = {
                    str(k): (str(v[0]), int(v[1]))
                    for k, v in loaded.items()
                    if isinstance(v, list) and len(v) == 2
                }
            except (ValueError, TypeError, AttributeError) as exc:
                log.warning("ignoring the committed batch sequences %r: %s", metadata, exc)

    @staticmethod
    def _sender(batch: GatewayBatch) -> str:
        return f"{batch.site_id}/{batch.sender_id}"

    def admits(self, batch: GatewayBatch) -> bool:
        """True when every batch of the run before ``batch`` was applied here or acked.

        Args:
            batch: The decoded batch; one with ``sequence`` 0 (not numbered) is admitted.
        """
        if batch.sequence <= 0 or batch.sequence <= batch.acked_through + 1:
            return True
        run, applied = self._applied.get(self._sender(batch), ("", 0))
        return run == batch.run_id and batch.sequence <= applied + 1

    def applied(self, batch: GatewayBatch) -> None:
        """Note that ``batch`` was applied (a resend of an older one changes nothing)."""
        if batch.sequence <= 0:
            return
        sender = self._sender(batch)
        run, applied = self._applied.get(sender, ("", 0))
        if run != batch.run_id:
            applied = 0
        self._applied.pop(sender, None)  # the most recent sender last, for the limit
        self._applied[sender] = (batch.run_id, max(applied, batch.sequence))

    def to_metadata(self) -> str:
        """The state as text for the inbound offset commit (at most :data:`METADATA_LIMIT`
        characters: the senders heard from least recently are left out)."""
        items = list(self._applied.items())
        while True:
            text = json.dumps({k: list(v) for k, v in items}, separators=(",", ":"))
            if len(text) <= METADATA_LIMIT or not items:
                return text
            items = items[1:]


__all__ = ["METADATA_LIMIT", "BatchSequencer"]
