"""A client cache's spans (tracing on: :mod:`regionbus.schemas.tracing`): the writer's
PRODUCER span of each change it sends, and each subscriber's CONSUMER span around the
listeners of a traced event.

The writer's span ends as its operation is handed to the producer (confluent-kafka
sends asynchronously: the send is that hand-over); its ``traceparent`` travels in the
record's headers. A subscriber reads the ``traceparent`` of the routing span the server
put in the queue record for each traced event, and makes its listener span that span's
child, linked to it: the span is current while the listeners run, so what they trace
(or put) belongs to the same trace.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Final, TypeVar

from regionbus.schemas.messages import CqEvent, Event, Operation
from regionbus.schemas.operation_kinds import kind_row
from regionbus.schemas.signing import Headers
from regionbus.schemas.tracing import Tracing, item_traceparents, messaging_attributes

_Item = TypeVar("_Item")

TRACED_KEPT_MAX: Final = 65_536
"""Most traced events a subscriber keeps between reading and delivering them; past it
(events read but never delivered: duplicates, conflated updates) they are forgotten."""


def writer_spans(
    tracing: Tracing, ops: Sequence[tuple[Operation, int]], topic: str
) -> dict[int, dict[int, bytes]]:
    """Start and end the PRODUCER span of each entry change among ``ops`` about to be sent.

    Args:
        tracing: The client's spans.
        ops: ``(operation, bucket)`` pairs, in the order they are sent.
        topic: ``{ns}.ops``.

    Returns:
        ``{bucket: {position of the operation among the bucket's: traceparent}}`` of the
        sampled ones (empty when none is: nothing to carry).
    """
    traced: dict[int, dict[int, bytes]] = {}
    positions: dict[int, int] = {}
    for op, bucket in ops:
        position = positions.get(bucket, 0)
        positions[bucket] = position + 1
        if op.event_id is None or not kind_row(op.kind).entry_change:
            continue  # reads, interest and region operations are not traced
        if not tracing.starts_trace():
            continue
        span = tracing.send(f"send {topic}", partial(_sent, op, bucket, topic, len(ops) == 1))
        if span is None:
            continue
        traceparent = tracing.traceparent(span)
        span.end()
        if traceparent is not None:
            traced.setdefault(bucket, {})[position] = traceparent
    return traced


def _sent(op: Operation, bucket: int, topic: str, alone: bool) -> dict[str, Any]:
    """The attributes of a writer's span (``alone``: the record holds this change only)."""
    attributes = {
        **messaging_attributes("send", topic),
        "messaging.destination.partition.id": str(bucket),
        "messaging.message.id": str(op.event_id),
        "regionbus.operation": op.kind.value,
        "regionbus.region": op.region,
    }
    if op.key is not None:
        attributes["regionbus.key"] = op.key
        if alone:  # the record's key (a batch's is none)
            attributes["messaging.kafka.message.key"] = op.key
    return attributes


class ListenerSpans:
    """The listener spans of one subscription queue's reader (its thread alone).

    Args:
        tracing: The client's spans.
        topic: The queue's topic.
        partition: The client's partition of it.
        client_id: The client's id (``messaging.consumer.group.name`` is its group).
    """

    def __init__(self, tracing: Tracing, topic: str, partition: int, client_id: str) -> None:
        self._tracing = tracing
        self._name = f"process {topic}"
        self._attributes = {
            **messaging_attributes("process", topic),
            "messaging.destination.partition.id": str(partition),
            "messaging.consumer.group.name": client_id,
        }
        self._found: dict[int, tuple[object, bytes]] = {}
        """``{id(decoded item): (the item, its traceparent)}``, until it is delivered."""

    def traced(self, headers: Headers | None) -> dict[int, bytes]:
        """``{item index: traceparent}`` of one record's traced items (empty for most)."""
        return item_traceparents(headers)

    def took(self, item: object, traceparent: bytes) -> None:
        """Note a traced item just decoded and kept, until it is delivered (its listener
        span is made then): known by its index in its record as it is decoded, so it is
        neither decoded twice nor searched for among the record's items."""
        if len(self._found) >= TRACED_KEPT_MAX:
            self._found.clear()
        self._found[id(item)] = (item, traceparent)

    def listening(self, deliver: Callable[..., None]) -> Callable[..., None]:
        """``deliver`` (an event's or a CQ event's hand-over to the listeners, item first),
        run inside a listener span for the traced items."""

        def traced(item: Event | CqEvent, *rest: Any) -> None:
            if not self._found:  # the usual case: nothing traced waits
                deliver(item, *rest)
                return
            found = self._found.pop(id(item), None)
            span = None
            if found is not None and found[0] is item:
                span = self._tracing.process(self._name, found[1], partial(self._of, item))
            if span is None:
                deliver(item, *rest)
                return
            try:
                with self._tracing.current(span):
                    deliver(item, *rest)
            finally:
                span.end()

        return traced

    def _of(self, item: Event | CqEvent) -> dict[str, Any]:
        event = item.event if isinstance(item, CqEvent) else item
        attributes: dict[str, Any] = {
            **self._attributes,
            "messaging.message.id": str(event.event_id),
            "regionbus.region": event.region,
            "regionbus.event_kind": event.kind.value,
        }
        if event.key is not None:
            attributes["regionbus.key"] = event.key
        return attributes


__all__ = ["TRACED_KEPT_MAX", "ListenerSpans", "writer_spans"]
