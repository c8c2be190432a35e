"""A cache server's spans (tracing on: :mod:`regionbus.schemas.tracing`).

Per traced change, two spans:

- ``process {ns}.ops`` (CONSUMER): the operation, from the moment its item is taken from
  its record to the end of its routing and reply; the child of the writer's ``send``
  span, linked to it, when the operation's record carried its ``traceparent``; else a new
  trace, sampled at the server's ``tracing_sample_ratio``.
- ``send <queue topic>`` (PRODUCER): the routing of its event into the subscription
  queues, the child of the first. Its ``traceparent`` is written into the headers of
  every queue record the event goes into (:attr:`regionbus.broker.queue_runs.Addressed.traced`),
  found by what routing added to the poll batch's runs.

Only changes (operations with an EventID) are traced. With tracing off none of this
exists: the loop holds None and makes no call here.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from confluent_kafka import Message as KafkaMessage

from regionbus.broker.outbox import Outbox
from regionbus.broker.queue_runs import Addressed
from regionbus.schemas.messages import Operation
from regionbus.schemas.naming import Topics
from regionbus.schemas.tracing import Tracing, item_traceparents, messaging_attributes

if TYPE_CHECKING:
    from opentelemetry.trace import Span


class ServerSpans:
    """The spans of one server's loop (its thread alone).

    Args:
        tracing: The server's spans.
        topics: The namespace's topics.
        outbox: Where routing gathers the queue records (their trace headers are set
            there).
        member_id: The server's member id.
    """

    def __init__(self, tracing: Tracing, topics: Topics, outbox: Outbox, member_id: str) -> None:
        self._tracing = tracing
        self._outbox = outbox
        self._process = f"process {topics.ops}"
        self._attributes = {
            **messaging_attributes("process", topics.ops),
            "messaging.consumer.group.name": f"{topics.ops} primaries",
            "regionbus.member": member_id,
        }
        self._traceparents: dict[int, bytes] = {}
        self.item = 0
        """Index of the item of the record being processed (set by the intake)."""

    def reading(self, message: KafkaMessage) -> None:
        """Note the trace contexts of the record whose items are processed next."""
        self._traceparents = item_traceparents(message.headers())
        self.item = 0

    def process(self, op: Operation, bucket: int, offset: int) -> Span | None:
        """Start the span of a change about to be batched; None when it is not traced (a
        read, or not sampled)."""
        if op.event_id is None:
            return None
        traceparent = self._traceparents.get(self.item) if self._traceparents else None
        if traceparent is None and not self._tracing.starts_trace():
            return None
        return self._tracing.process(
            self._process, traceparent, partial(self._of, op, bucket, offset)
        )

    def _of(self, op: Operation, bucket: int, offset: int) -> dict[str, Any]:
        """The attributes of a change's ``process`` span."""
        assert op.event_id is not None
        attributes: dict[str, Any] = {
            **self._attributes,
            "messaging.destination.partition.id": str(bucket),
            "messaging.kafka.offset": offset,
            "messaging.message.id": str(op.event_id._replace(bucket=bucket)),
            "regionbus.operation": op.kind.value,
            "regionbus.region": op.region,
            "regionbus.client": op.client_id,
        }
        if op.key is not None:
            attributes["regionbus.key"] = op.key
        return attributes

    def applied(self, span: Span, status: str, distribute: Callable[[], None]) -> None:
        """Run ``distribute`` (the routing and reply of one applied change) in its routing
        span, mark its queue records with that span's context, and end both spans.

        Args:
            span: The change's ``process`` span (:meth:`process`).
            status: The apply's status (``OK``, ``DUP``, ``NOOP``, ``FENCED``, ``ERR``).
            distribute: What follows the apply.
        """
        span.set_attribute("regionbus.apply.status", status)
        route = self._tracing.send("send subscription queues", self._route_attributes.copy, span)
        if route is None:  # an application's sampler dropped it
            try:
                distribute()
            finally:
                span.end()
            return
        traceparent = self._tracing.traceparent(route)
        runs = self._outbox.gathered
        before = [len(run.framed) for run in runs]
        try:
            with self._tracing.current(route):
                distribute()
        finally:
            self._mark(runs, before, route, traceparent)
            route.end()
            span.end()

    @staticmethod
    def _mark(
        runs: list[Addressed], before: list[int], route: Span, traceparent: bytes | None
    ) -> None:
        """Give the queue records routing added to ``runs`` (each ``before`` long when it
        began) the routing span's context, and the span the topics and count."""
        topics: set[str] = set()
        records = 0
        for index, run in enumerate(runs):
            start = before[index] if index < len(before) else 0
            if run.account is None or len(run.framed) == start or traceparent is None:
                continue  # a reply, or nothing of this change
            traced = run.traced if run.traced is not None else {}
            for position in range(start, len(run.framed)):
                traced[position] = traceparent
            run.traced = traced
            topics.add(run.topic)
            records += len(run.framed) - start
        if len(topics) == 1:
            (topic,) = topics
            route.update_name(f"send {topic}")
            route.set_attribute("messaging.destination.name", topic)
        route.set_attribute("regionbus.events_queued", records)

    _route_attributes = messaging_attributes("send")


__all__ = ["ServerSpans"]
