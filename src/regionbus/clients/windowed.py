"""Many requests of one call, a bounded number in flight: how a large legal request is sent.

A ``put_all`` of many entries or a registration of many keys is sent as separate requests,
at most a window of them unanswered at a time (`regionbus.schemas.limits`), so a cache
server works through a few of them between other clients' operations instead of all of
them at once, and a call that gives up leaves at most a window of its requests in flight.
Each request's ``read_timeout_ms`` counts from its own sending.

:func:`put_or_remove_all` tells, for each entry, what is known of it: applied, not applied
(refused by the server, or never sent), or unknown (sent, no answer in time).
"""

from __future__ import annotations

import queue
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

from regionbus.clients.pending import EntriesTaker
from regionbus.schemas.errors import (
    BulkOperationError,
    EntryNotFoundError,
    KafkaAuthorizationError,
    RegionBusError,
    ServerTimeoutError,
)
from regionbus.schemas.limits import BULK_ENTRIES_IN_FLIGHT, BULK_SEND_GROUP
from regionbus.schemas.messages import Operation, Reply

if TYPE_CHECKING:
    from regionbus.clients.pool import Pool

Answered = Callable[[int, list[Reply] | None, BaseException | None, bool], bool]
"""``answered(index, replies, error, sent)`` for each request, on the calling thread:
``sent`` is False when the request could not be handed to Kafka at all. Returns False to
stop sending the requests not sent yet."""


def send_windowed(
    pool: Pool,
    ops: Sequence[tuple[Operation, int]],
    answered: Answered,
    *,
    window: int,
    group: int = 1,
    take_entries: EntriesTaker | None = None,
) -> int:
    """Send operations as separate requests, at most ``window`` unanswered at a time, in
    groups of ``group`` once that many places are free; call ``answered`` for each as it
    completes (its reply, an error reply's, a timeout, or a refusal to send).

    Args:
        pool: The client's pool.
        ops: ``(operation, bucket)`` pairs, each with its own request id.
        answered: Told of each request's end (see :data:`Answered`).
        window: Most requests unanswered at a time.
        group: Fewest places to wait for before sending more (fewer Kafka messages).
        take_entries: Takes each successful reply's entries as they arrive
            (`regionbus.clients.pool.Pool.request`).

    Returns:
        How many requests were sent (the rest were not, as ``answered`` asked).
    """
    done: queue.SimpleQueue[tuple[int, list[Reply] | None, BaseException | None]] = (
        queue.SimpleQueue()
    )
    sent = in_flight = 0
    sending = True
    while (sending and sent < len(ops)) or in_flight:
        free = window - in_flight
        left = len(ops) - sent
        if sending and left and free > 0 and (free >= min(group, left) or not in_flight):
            take = min(free, left)
            chunk = ops[sent : sent + take]
            callbacks = [partial(_finished, done, sent + i) for i in range(take)]
            try:
                pool.request_each_with_callbacks(chunk, callbacks, take_entries)
            except RegionBusError as exc:
                for i, (op, _) in enumerate(chunk):
                    pool.forget(op.request_id)
                    answered(sent + i, None, exc, False)
                sending = False
                continue
            sent += take
            in_flight += take
            continue
        index, replies, error = done.get()
        in_flight -= 1
        if not answered(index, replies, error, True):
            sending = False
    return sent


def _finished(
    done: queue.SimpleQueue[tuple[int, list[Reply] | None, BaseException | None]],
    index: int,
    replies: list[Reply] | None,
    error: BaseException | None,
) -> None:
    done.put((index, replies, error))


@dataclass
class BulkOutcome:
    """What is known of each entry of a ``put_all`` / ``remove_all`` (every key in one of
    the three).

    Attributes:
        applied: Keys known applied, in the order answered.
        failures: Keys known not applied: refused by the server, or never sent.
        unknown: Keys sent and not answered within ``read_timeout_ms``.
    """

    applied: list[str] = field(default_factory=list)
    failures: dict[str, RegionBusError] = field(default_factory=dict)
    unknown: dict[str, RegionBusError] = field(default_factory=dict)

    def raise_if_incomplete(self, what: str, total: int) -> None:
        """Raise unless every entry is known applied.

        Args:
            what: The entries' kind, for the message (``"puts"``).
            total: How many entries the call had.

        Raises:
            BulkOperationError: some entry is known not applied, or of unknown outcome.
        """
        if not self.failures and not self.unknown:
            return
        raise BulkOperationError(
            f"{len(self.applied)} of {total} {what} applied, {len(self.failures)} not "
            f"applied, {len(self.unknown)} of unknown outcome (no reply in time)",
            self.failures,
            self.unknown,
            tuple(self.applied),
        )


def put_or_remove_all(
    pool: Pool,
    prepared: Sequence[tuple[Operation, int]],
    finish: Callable[[Operation, Reply], None],
    *,
    skip_missing: bool,
    window: int = BULK_ENTRIES_IN_FLIGHT,
) -> BulkOutcome:
    """Send keyed operations (puts or destroys) windowed, ``finish(op, reply)`` each as its
    reply comes, and say what is known of every entry. After the first entry left
    unanswered no more are sent (the server is gone or overwhelmed): those are reported
    not applied.

    Args:
        pool: The client's pool.
        prepared: ``(operation, bucket)`` pairs; every operation has a key.
        finish: Applies one successful reply locally; may raise what the reply names.
        skip_missing: Count an entry missing on the server as applied (``removeAll``).
        window: Most entries unanswered at a time.

    Returns:
        The outcome of each entry.
    """
    outcome = BulkOutcome()

    def answered(
        index: int, replies: list[Reply] | None, error: BaseException | None, sent: bool
    ) -> bool:
        op = prepared[index][0]
        assert op.key is not None
        if error is None:
            assert replies
            try:
                finish(op, replies[0])
            except EntryNotFoundError as exc:
                if skip_missing:
                    outcome.applied.append(op.key)
                else:
                    outcome.failures[op.key] = exc
            except RegionBusError as exc:
                outcome.failures[op.key] = exc
            else:
                outcome.applied.append(op.key)
            return True
        failure = error if isinstance(error, RegionBusError) else RegionBusError(str(error))
        # Refused before Kafka took it, or refused by Kafka's ACLs: surely not applied.
        if not sent or isinstance(error, KafkaAuthorizationError):
            outcome.failures[op.key] = failure
            return True
        outcome.unknown[op.key] = failure
        return not isinstance(error, ServerTimeoutError)

    sent = send_windowed(
        pool, prepared, answered, window=window, group=min(BULK_SEND_GROUP, window)
    )
    for op, _ in prepared[sent:]:
        assert op.key is not None
        outcome.failures.setdefault(
            op.key,
            ServerTimeoutError(
                "not sent: an earlier entry of the call got no reply within "
                f"{pool.settings.read_timeout_ms} ms"
            ),
        )
    return outcome


__all__ = ["Answered", "BulkOutcome", "put_or_remove_all", "send_windowed"]
