"""Traces, against real Kafka and Redis: the spans of a put, read with OpenTelemetry's
in-memory exporter, chain writer -> server (apply, routing) -> each subscriber's listener,
as parents and links, one trace per put; a put_all's entries, batched in one record each
way, keep a trace each; with security on, the trace headers travel beside the signatures."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kafka_users import KafkaUsers
from opentelemetry import trace
from opentelemetry.sdk import trace as sdk_trace
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from support import wait_until
from test_security import (
    SECRETS,
    kafka_users,  # noqa: F401  (a fixture of that module, used here)
    principals,  # noqa: F401
    secured_settings,
)

from regionbus.broker.config import ServerSettings
from regionbus.broker.kafka_acls import client_acls
from regionbus.broker.principals import PrincipalStore
from regionbus.broker.server import CacheServer
from regionbus.clients import ALL_KEYS, ClientCache, ClientSettings
from regionbus.schemas.callbacks import CacheListener, EntryEvent
from regionbus.schemas.naming import client_partition
from regionbus.schemas.topics import DEFAULT_CLIENT_PARTITIONS

ClientFactory = Callable[..., ClientCache]

pytestmark = pytest.mark.integration

_TRACED = {"tracing_enabled": True, "tracing_sample_ratio": 1.0}


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """The spans every part of this process ends from now on. The provider is the one
    regionbus sets up (``OTEL_TRACES_EXPORTER=none``: no exporter of its own), with an
    in-memory exporter added."""
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    exporter = InMemorySpanExporter()
    processor = SimpleSpanProcessor(exporter)
    added = False

    def add() -> None:
        nonlocal added
        provider = trace.get_tracer_provider()
        if not added and isinstance(provider, sdk_trace.TracerProvider):
            provider.add_span_processor(processor)
            added = True

    exporter.add_to_provider = add  # type: ignore[attr-defined]
    try:
        yield exporter
    finally:
        processor.shutdown()


class _Listener(CacheListener):
    """Records each event's key with the span current while the listener ran."""

    def __init__(self) -> None:
        self.heard: dict[str, Any] = {}
        self._lock = threading.Lock()

    def after_create(self, event: EntryEvent) -> None:
        with self._lock:
            self.heard[event.key] = trace.get_current_span().get_span_context()


def _one(spans: list[Any], **wanted: Any) -> Any:
    found = [
        s
        for s in spans
        if all(
            (s.name if k == "name" else s.kind if k == "kind" else s.attributes.get(k)) == v
            for k, v in wanted.items()
        )
    ]
    assert len(found) == 1, (wanted, [(s.name, dict(s.attributes)) for s in spans])
    return found[0]


def _child_and_link(child: Any, parent: Any) -> None:
    """``child`` is ``parent``'s child, in its trace, and links to it."""
    assert child.context.trace_id == parent.context.trace_id
    assert child.parent is not None and child.parent.span_id == parent.context.span_id
    assert [link.context.span_id for link in child.links] == [parent.context.span_id]


def test_a_put_is_traced_from_the_writer_through_the_server_to_each_listener(
    server_settings: ServerSettings,
    client_factory: ClientFactory,
    namespace: str,
    spans: InMemorySpanExporter,
) -> None:
    server = CacheServer(server_settings.model_copy(update=_TRACED))
    spans.add_to_provider()  # type: ignore[attr-defined]
    server.start()
    try:
        listeners = []
        queue_partitions = set()
        for _ in range(2):
            listener = _Listener()
            subscriber = client_factory(**_TRACED)
            subscriber.create_region("r", listeners=[listener]).register_interest(ALL_KEYS)
            listeners.append(listener)
            queue_partitions.add(client_partition(subscriber.client_id, DEFAULT_CLIENT_PARTITIONS))
        writer = client_factory(**_TRACED).create_region("r")
        spans.clear()

        writer.put("one", 1)
        wait_until(
            lambda: all("one" in listener.heard for listener in listeners), 30, "the listeners"
        )
        ops, queues = f"{namespace}.ops", f"{namespace}.queues"
        wait_until(
            lambda: (
                len([s for s in spans.get_finished_spans() if s.name == f"process {queues}"]) == 2
            ),
            30,
            "both listener spans",
        )
        finished = list(spans.get_finished_spans())
        send = _one(finished, name=f"send {ops}", kind=trace.SpanKind.PRODUCER)
        assert send.attributes["messaging.system"] == "kafka"
        assert send.attributes["messaging.operation.type"] == "send"
        assert send.attributes["messaging.destination.name"] == ops
        assert send.attributes["messaging.kafka.message.key"] == "one"
        assert send.attributes["regionbus.operation"] == "PUT"
        apply = _one(finished, name=f"process {ops}", kind=trace.SpanKind.CONSUMER)
        _child_and_link(apply, send)
        assert apply.attributes["messaging.operation.type"] == "process"
        assert apply.attributes["regionbus.apply.status"] == "OK"
        assert apply.attributes["regionbus.key"] == "one"
        assert (
            apply.attributes["messaging.destination.partition.id"]
            == (send.attributes["messaging.destination.partition.id"])
        )
        route = _one(finished, name=f"send {queues}", kind=trace.SpanKind.PRODUCER)
        assert route.parent is not None and route.parent.span_id == apply.context.span_id
        assert route.attributes["messaging.destination.name"] == queues
        # Subscribers of one registration share a record per partition of the queue
        # topic: one record when both ids hash to one partition, else two.
        assert route.attributes["regionbus.events_queued"] == len(queue_partitions)
        heard = [s for s in finished if s.name == f"process {queues}"]
        assert len(heard) == 2
        for span in heard:
            assert span.kind == trace.SpanKind.CONSUMER
            assert span.attributes["regionbus.key"] == "one"
            _child_and_link(span, route)
        # Each listener ran inside its own subscriber's span.
        assert sorted(listener.heard["one"].span_id for listener in listeners) == sorted(
            span.context.span_id for span in heard
        )
        assert {s.context.trace_id for s in finished} == {send.context.trace_id}
    finally:
        server.stop()


def test_each_entry_of_a_batched_put_all_keeps_its_own_trace(
    server_settings: ServerSettings,
    client_factory: ClientFactory,
    namespace: str,
    spans: InMemorySpanExporter,
) -> None:
    server = CacheServer(server_settings.model_copy(update={**_TRACED, "total_buckets": 1}))
    spans.add_to_provider()  # type: ignore[attr-defined]
    server.start()
    try:
        listener = _Listener()
        subscriber = client_factory(**_TRACED)
        subscriber.create_region("r", listeners=[listener]).register_interest(ALL_KEYS)
        writer = client_factory(**_TRACED).create_region("r")
        spans.clear()

        keys = [f"k{i}" for i in range(5)]
        writer.put_all({key: i for i, key in enumerate(keys)})
        wait_until(lambda: len(listener.heard) == len(keys), 30, "the listener")
        queues = f"{namespace}.queues"
        wait_until(
            lambda: (
                len([s for s in spans.get_finished_spans() if s.name == f"process {queues}"])
                == len(keys)
            ),
            30,
            "the listener spans",
        )
        finished = list(spans.get_finished_spans())
        for key in keys:
            send = _one(finished, name=f"send {namespace}.ops", **{"regionbus.key": key})
            apply = _one(finished, name=f"process {namespace}.ops", **{"regionbus.key": key})
            _child_and_link(apply, send)
            heard = _one(finished, name=f"process {queues}", **{"regionbus.key": key})
            assert heard.context.trace_id == send.context.trace_id
            route = next(s for s in finished if s.context.span_id == heard.parent.span_id)
            assert route.parent.span_id == apply.context.span_id
            assert listener.heard[key].span_id == heard.context.span_id
    finally:
        server.stop()


def test_with_security_on_trace_headers_travel_beside_the_signatures(
    kafka_users: KafkaUsers,  # noqa: F811
    principals: PrincipalStore,  # noqa: F811
    namespace: str,
    redis_url: str,
    spans: InMemorySpanExporter,
) -> None:
    """Signed records carry the trace headers too: the servers and the subscriber accept
    them (the signature covers the value, not these headers) and the chain holds."""
    server = CacheServer(
        secured_settings(namespace, kafka_users, redis_url).model_copy(update=_TRACED)
    )
    spans.add_to_provider()  # type: ignore[attr-defined]
    server.start()
    made: list[ClientCache] = []

    def client(principal: str) -> ClientCache:
        client_id = f"{principal}-1"
        kafka_users.grant(principal, client_acls(namespace, client_id, principal))
        settings = ClientSettings(
            namespace=namespace,
            **kafka_users.settings(principal),
            client_id=client_id,
            fetch_wait_max_ms=100,
            read_timeout_ms=30_000,
            security_principal=principal,
            security_secret=SECRETS[principal],
            **_TRACED,
        )
        made.append(ClientCache(settings))
        return made[-1]

    try:
        listener = _Listener()
        reader = client("reader").create_region("r", listeners=[listener])
        reader.register_interest(ALL_KEYS)
        client("writer").create_region("r").put("signed", 1)
        wait_until(lambda: "signed" in listener.heard, 30, "the listener")
        queues = f"{namespace}.queues.reader"
        wait_until(
            lambda: any(s.name == f"process {queues}" for s in spans.get_finished_spans()),
            30,
            "the listener span",
        )
        finished = list(spans.get_finished_spans())
        send = _one(finished, name=f"send {namespace}.ops", **{"regionbus.key": "signed"})
        apply = _one(finished, name=f"process {namespace}.ops", **{"regionbus.key": "signed"})
        _child_and_link(apply, send)
        route = _one(finished, name=f"send {queues}")
        assert route.parent is not None and route.parent.span_id == apply.context.span_id
        heard = _one(finished, name=f"process {queues}")
        _child_and_link(heard, route)
        assert listener.heard["signed"].span_id == heard.context.span_id
    finally:
        for cache in made:
            cache.close()
        server.stop()
