"""Traces of a change's way, writer -> cache server -> each subscriber's listener, with
OpenTelemetry (the optional extra ``otel``: ``pip install 'regionbus[otel]'``).

Off by default (``tracing_enabled``). Turned on, the writer's operation gets a PRODUCER
span, whose W3C ``traceparent`` travels in the Kafka headers of the operation's record; the
server's ``process`` span of the operation (the apply) is its child and links to it, the
server's routing span is the child of that, and its ``traceparent`` travels in the headers
of every subscription-queue record the event goes into; each subscriber's listener span is
its child and links to it. Span names and attributes follow OpenTelemetry's messaging
conventions (``messaging.system`` ``kafka``, ``messaging.destination.name``,
``messaging.operation.type`` ``send`` / ``process``, ...).

Records hold batches of items (a client's operations for one bucket, a server's events for
one queue), and each item has its own trace. So a record carries one ``traceparent``
header per traced item, in the order of the items, and, unless its only traced item is
its first, ``rb.trace-items``: the indexes of those items in the batch, comma separated
(ASCII). The Avro frames are unchanged; a reader that knows nothing of tracing ignores the
headers. Only sampled contexts travel: an unsampled operation adds no header at all.

With tracing off nothing here is imported by the hot paths' callers but the names: no
header is read or written, no span object made. This module imports OpenTelemetry only
inside :func:`tracing_for`, which raises :class:`ExtraNotInstalledError` without it.
"""

from __future__ import annotations

import os
import random
import threading
from collections.abc import Callable, Mapping, Sequence
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, Final

from pydantic import Field

from regionbus.schemas.addressing import header
from regionbus.schemas.codec import MAX_BATCH_ITEMS, split_batch
from regionbus.schemas.errors import ConfigurationError, ExtraNotInstalledError
from regionbus.schemas.settings import RegionBusSettings
from regionbus.schemas.signing import HeaderList, Headers

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

TRACEPARENT_HEADER: Final = "traceparent"
"""The W3C Trace Context header (``00-<trace id>-<span id>-<flags>``), one per traced item."""
TRACE_ITEMS_HEADER: Final = "rb.trace-items"
"""Which items of a batch the ``traceparent`` headers belong to, in their order: item
indexes, comma separated; absent when the only one is item 0."""
_MAX_TRACEPARENT_BYTES: Final = 64
"""Longest ``traceparent`` header read (version 00 is 55 bytes): a longer one is ignored."""
_MAX_TRACE_ITEMS_BYTES: Final = 5 * MAX_BATCH_ITEMS
"""Longest ``rb.trace-items`` read (4096 indexes of at most 4 digits, with commas)."""

_INSTRUMENTATION: Final = "regionbus"
_SETUP_LOCK = threading.Lock()


class TracingSettings(RegionBusSettings):
    """Traces with OpenTelemetry, on a cache server or a client cache.

    Attributes:
        tracing_enabled: Whether this process makes spans and carries ``traceparent`` in
            Kafka headers (default off: nothing is traced, no header is added). Needs the
            ``otel`` extra (``pip install 'regionbus[otel]'``); without it the process
            refuses to start with ``ExtraNotInstalledError``.
        tracing_sample_ratio: Share of the changes that start a trace here, 0 to 1
            (default 0.01, one in a hundred): a client's changes (a cache server's own
            default is 0: see its settings). A change whose context arrives
            sampled is always traced, so one writer's sampled put is followed through
            every server and subscriber; so is a put made inside an application's
            sampled span. Decided before any span is made, so an unsampled change costs
            one random number; the tracer provider's own sampler (OpenTelemetry's
            default, ``parentbased_always_on``, or an application's) then sees only the
            changes kept.
    """

    tracing_enabled: bool = False
    tracing_sample_ratio: float = Field(default=0.01, ge=0.0, le=1.0)


class Tracing:
    """The spans of one cache server or client cache (made by :func:`tracing_for`).

    Args:
        tracer: The OpenTelemetry tracer spans are made with.
        ratio: ``tracing_sample_ratio``: the share of changes without a sampled context
            that start a trace.
        caller_spans: Whether a change made inside a sampled span of the caller's starts
            a trace too (a client's puts in an application's request; a server's loop
            has no such span to look up).
    """

    def __init__(self, tracer: Tracer, ratio: float, caller_spans: bool = True) -> None:
        from opentelemetry.trace import Link, SpanKind, get_current_span, set_span_in_context
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self._tracer = tracer
        self._propagator = TraceContextTextMapPropagator()
        self._link = Link
        self._kinds = SpanKind
        self._in_context = set_span_in_context
        self._span_of = get_current_span
        self._ratio = ratio
        self._caller_spans = caller_spans

    def starts_trace(self) -> bool:
        """Whether a change without a context of its own is traced: one in ``ratio``, or
        one made inside a sampled span of the caller's. Asked before a span is made: at
        1 % the SDK's own decision, a span object per change, cost the other 99 % more
        than the traces (a cache server's CPU per operation +66 %, measured in
        ``bench.core``'s phase (g))."""
        if self._ratio and (self._ratio >= 1.0 or random.random() < self._ratio):
            return True
        return self._caller_spans and self._span_of().get_span_context().trace_flags.sampled

    def send(
        self, name: str, attributes: Callable[[], Mapping[str, Any]], parent: Span | None = None
    ) -> Span | None:
        """Start a PRODUCER span (``messaging.operation.type`` ``send``).

        Args:
            name: The span's name: ``send <destination>``.
            attributes: Makes its attributes, called only when the span is recorded.
            parent: Its parent; None (asked when :meth:`starts_trace` said so): the
                caller's current span, if any, else a new trace.

        Returns:
            The span, or None when it is not recorded (the provider's sampler dropped
            it): nothing to end or carry on.
        """
        context = None if parent is None else self._in_context(parent)
        span = self._tracer.start_span(name, context, self._kinds.PRODUCER)
        if not span.is_recording():
            return None
        span.set_attributes(attributes())
        return span

    def process(
        self,
        name: str,
        traceparent: bytes | None,
        attributes: Callable[[], Mapping[str, Any]],
    ) -> Span | None:
        """Start a CONSUMER span (``messaging.operation.type`` ``process``) of one item.

        Args:
            name: The span's name: ``process <destination>``.
            traceparent: The item's ``traceparent`` header: the span is its child and
                links to it. None (asked when :meth:`starts_trace` said so): a new trace.
            attributes: Makes its attributes, called only when the span is recorded.

        Returns:
            The span, or None when it is not recorded (not sampled, or a ``traceparent``
            that does not parse): nothing to end or carry on.
        """
        context = None
        links = None
        if traceparent is not None:
            carrier = {TRACEPARENT_HEADER: traceparent.decode("ascii", "replace")}
            context = self._propagator.extract(carrier)
            parent = self._span_of(context).get_span_context()
            if not parent.is_valid:
                return None
            links = [self._link(parent)]
        span = self._tracer.start_span(name, context, self._kinds.CONSUMER, links=links)
        if not span.is_recording():
            return None
        span.set_attributes(attributes())
        return span

    def traceparent(self, span: Span) -> bytes | None:
        """The ``traceparent`` header value of a recorded span, None when it is not
        recorded (an unsampled trace travels no further)."""
        if not span.is_recording():
            return None
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier, self._in_context(span))
        value = carrier.get(TRACEPARENT_HEADER)
        return value.encode("ascii") if value else None

    def current(self, span: Span) -> Any:
        """A context manager making ``span`` the current one (a listener's own spans and
        the puts it makes become its children); it does not end the span."""
        from opentelemetry.trace import use_span

        return use_span(span, end_on_exit=False)


def tracing_for(
    settings: TracingSettings, service: str, caller_spans: bool = True
) -> Tracing | None:
    """The spans of a process part, or None with tracing off (nothing imported then).

    The first part of a process to turn tracing on sets up OpenTelemetry's global tracer
    provider, unless the application installed an SDK provider already (then that one,
    with its sampler and exporters, is used): the SDK's sampler (``OTEL_TRACES_SAMPLER``,
    default ``parentbased_always_on``; ``tracing_sample_ratio`` is applied before it);
    resource from ``OTEL_SERVICE_NAME`` (default ``service``)
    and ``OTEL_RESOURCE_ATTRIBUTES``; span exporter named by ``OTEL_TRACES_EXPORTER``
    (default ``otlp``, sent over OTLP/HTTP, or gRPC when ``OTEL_EXPORTER_OTLP_PROTOCOL``
    is ``grpc``, to ``OTEL_EXPORTER_OTLP_ENDPOINT``; ``console``; ``none``), behind a batch
    span processor (``OTEL_BSP_*``).

    Args:
        settings: The part's settings.
        service: ``service.name`` when ``OTEL_SERVICE_NAME`` is not set:
            ``regionbus-server``, ``regionbus-client``.
        caller_spans: As for :class:`Tracing`.

    Raises:
        ExtraNotInstalledError: tracing is on and the ``otel`` extra (OpenTelemetry's SDK,
            its OTLP exporter) is not installed.
        ConfigurationError: ``OTEL_TRACES_EXPORTER`` names an exporter that is not
            installed.
    """
    if not settings.tracing_enabled:
        return None
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
    except ImportError as missing:
        raise ExtraNotInstalledError(
            "tracing (tracing_enabled)", "otel", ("opentelemetry-sdk",)
        ) from missing
    with _SETUP_LOCK:
        if not isinstance(trace.get_tracer_provider(), TracerProvider):
            trace.set_tracer_provider(_provider(service))
    return Tracing(trace.get_tracer(_INSTRUMENTATION), settings.tracing_sample_ratio, caller_spans)


def _provider(service: str) -> Any:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    named = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": service}
    # The sampler is the SDK's (OTEL_TRACES_SAMPLER, default parentbased_always_on): the
    # ratio was applied before a span was asked for.
    provider = TracerProvider(resource=Resource.create(named))
    for exporter in _exporters():
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def _exporters() -> list[Any]:
    """The span exporters ``OTEL_TRACES_EXPORTER`` names, made (OpenTelemetry's entry
    points ``opentelemetry_traces_exporter``); ``otlp`` is the OTLP exporter of the
    protocol ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`` / ``OTEL_EXPORTER_OTLP_PROTOCOL``
    asks (default ``http/protobuf``, what the extra installs)."""
    names = os.environ.get("OTEL_TRACES_EXPORTER", "otlp")
    protocol = os.environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "")
    )
    made = []
    for name in (n.strip() for n in names.split(",")):
        if name in ("", "none"):
            continue
        if name == "otlp":
            name = "otlp_proto_grpc" if protocol == "grpc" else "otlp_proto_http"
        found = entry_points(group="opentelemetry_traces_exporter", name=name)
        if not found:
            if name.startswith("otlp_proto_"):
                package = f"opentelemetry-exporter-{name.replace('_', '-')}"
                raise ExtraNotInstalledError("OTLP export of traces", "otel", (package,))
            raise ConfigurationError(
                f"OTEL_TRACES_EXPORTER names {name!r}, which no installed package provides"
            )
        made.append(next(iter(found)).load()())
    return made


def messaging_attributes(operation: str, destination: str | None = None) -> dict[str, Any]:
    """OpenTelemetry's messaging attributes every span of regionbus carries: ``kafka``,
    ``operation`` (``send`` or ``process``) as its type and name, and the topic."""
    attributes: dict[str, Any] = {
        "messaging.system": "kafka",
        "messaging.operation.type": operation,
        "messaging.operation.name": operation,
    }
    if destination is not None:
        attributes["messaging.destination.name"] = destination
    return attributes


# --- the headers -----------------------------------------------------------------------


def record_headers(traced: Mapping[int, bytes]) -> HeaderList:
    """The trace headers of one record: ``traced`` is ``{item index: traceparent}`` of
    its traced items (at least one)."""
    indexes = sorted(traced)
    headers: HeaderList = [(TRACEPARENT_HEADER, traced[i]) for i in indexes]
    if indexes != [0]:
        headers.append((TRACE_ITEMS_HEADER, ",".join(map(str, indexes)).encode("ascii")))
    return headers


def batch_headers(values: Sequence[bytes], traced: Mapping[int, bytes]) -> list[HeaderList | None]:
    """The trace headers of each record that framed items were packed into.

    Args:
        values: The records' values (:func:`regionbus.schemas.codec.encode_batches`), in
            order.
        traced: ``{index of the item among all of them: traceparent}``.

    Returns:
        One entry per record: its headers, None when none of its items is traced.
    """
    if len(values) == 1:
        return [record_headers(traced)]
    found: list[HeaderList | None] = []
    start = 0
    for value in values:
        count = len(split_batch(value))
        own = {i - start: p for i, p in traced.items() if start <= i < start + count}
        found.append(record_headers(own) if own else None)
        start += count
    return found


def item_traceparents(headers: Headers | None) -> dict[int, bytes]:
    """``{item index: traceparent}`` of a record read from Kafka; empty when it carries
    none or its trace headers are malformed (a record from anyone: the headers are read
    within fixed bounds and anything off is ignored, never raised)."""
    if not headers:
        return {}
    pairs = headers.items() if isinstance(headers, dict) else headers
    values = [
        v.encode("ascii", "replace") if isinstance(v, str) else v
        for k, v in pairs
        if k == TRACEPARENT_HEADER
    ]
    if not values or len(values) > MAX_BATCH_ITEMS:
        return {}
    listed = header(headers, TRACE_ITEMS_HEADER)
    if listed is None:
        indexes = [0]
    elif len(listed) > _MAX_TRACE_ITEMS_BYTES:
        return {}
    else:
        try:
            indexes = [int(i) for i in listed.split(b",")]
        except ValueError:
            return {}
    if len(indexes) != len(values):
        return {}
    return {
        i: v
        for i, v in zip(indexes, values, strict=True)
        if v and len(v) <= _MAX_TRACEPARENT_BYTES and 0 <= i < MAX_BATCH_ITEMS
    }


__all__ = [
    "TRACEPARENT_HEADER",
    "TRACE_ITEMS_HEADER",
    "Tracing",
    "TracingSettings",
    "batch_headers",
    "item_traceparents",
    "messaging_attributes",
    "record_headers",
    "tracing_for",
]
