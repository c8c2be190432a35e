"""The gateway receiver's batches being applied: their operations sent to this site's
servers, their replies not all in yet.

A batch that needs order per bucket only (:attr:`GatewayBatch.parallel`) does not wait for
the batch before it to be answered: its operations go to the buckets' partitions of
``{ns}.ops`` behind the earlier batch's (one partition per bucket keeps their order), up
to ``max_batches_applying`` batches. Batches are concluded (acked, their inbound offset
committed) strictly in inbound order, so a commit never passes a batch not applied yet.
A batch whose replies do not come in time ends the pipeline: the receiver reads again from
it, and the batches after it are sent again (the servers recognise what they applied by
EventID).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

from regionbus.gateways.protocol import BatchEventException, GatewayBatch
from regionbus.schemas.messages import Event, Operation, Reply


@dataclass
class PreparedBatch:
    """A batch turned into this site's operations.

    Attributes:
        exceptions: Events that failed before any was sent (undecodable, not a gateway
            event).
        sent: ``(index in the batch, event, operation)`` of each operation to send.
        ops: ``(operation, bucket)`` in batch order.
    """

    exceptions: list[BatchEventException] = field(default_factory=list)
    sent: list[tuple[int, Event, Operation]] = field(default_factory=list)
    ops: list[tuple[Operation, int]] = field(default_factory=list)


@dataclass
class ApplyingBatch:
    """One inbound message in the pipeline.

    Attributes:
        offset: Its inbound offset.
        batch: The batch, or None for a message that needs no apply (dead-lettered, or
            left for its resend): only its offset is committed, in turn.
        prepared: Its operations.
        futures: One per operation (``prepared.ops``), in order.
        deadline: ``time.monotonic()`` past which its replies are given up on.
    """

    offset: int
    batch: GatewayBatch | None = None
    prepared: PreparedBatch = field(default_factory=PreparedBatch)
    futures: list[Future[list[Reply]]] = field(default_factory=list)
    deadline: float = 0.0

    @property
    def answered(self) -> bool:
        """Every operation has its reply (or its failure)."""
        return all(f.done() for f in self.futures)


class ApplyPipeline:
    """The inbound messages between their send and their conclusion, in inbound order.

    Args:
        capacity: Most batches applying at once (``max_batches_applying``).
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._applying: deque[ApplyingBatch] = deque()

    def __len__(self) -> int:
        return len(self._applying)

    def add(self, entry: ApplyingBatch) -> None:
        """Append a message whose operations were sent (or that has none)."""
        self._applying.append(entry)

    def conclude(self, keep: int, finish: Callable[[ApplyingBatch], bool]) -> bool:
        """Conclude the oldest entries with ``finish``: while more than ``keep`` are
        applying (waiting for them), then those already answered.

        Args:
            keep: Entries that may stay applying (0: drain).
            finish: Waits for an entry's replies, acks and commits it; False when it was
                not applied (the receiver reads again from it).

        Returns:
            False when an entry was not applied; the later ones are still here, for
            :meth:`dropped`.
        """
        while self._applying:
            oldest = self._applying[0]
            if len(self._applying) <= keep and not oldest.answered:
                return True
            self._applying.popleft()
            if not finish(oldest):
                return False
        return True

    def dropped(self) -> list[ApplyingBatch]:
        """Forget every entry (the receiver reads again from the first one)."""
        entries = list(self._applying)
        self._applying.clear()
        return entries

    @staticmethod
    def deadline(timeout_ms: int) -> float:
        """``time.monotonic()`` ``timeout_ms`` from now."""
        return time.monotonic() + timeout_ms / 1000


__all__ = ["ApplyPipeline", "ApplyingBatch", "PreparedBatch"]
