"""Traces' pure parts: the trace headers of a record of batched items (written, read back,
and read within bounds from anyone), the tracer provider regionbus sets up from its
settings and the standard ``OTEL_*`` variables, and a process without the ``otel`` extra."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from regionbus.broker.config import ServerSettings
from regionbus.clients import ClientSettings
from regionbus.schemas.codec import encode_batches
from regionbus.schemas.errors import ConfigurationError
from regionbus.schemas.tracing import (
    TRACE_ITEMS_HEADER,
    TRACEPARENT_HEADER,
    Tracing,
    _exporters,
    _provider,
    batch_headers,
    item_traceparents,
    record_headers,
    tracing_for,
)

_A = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
_B = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_a_record_whose_first_item_alone_is_traced_carries_the_standard_header_alone() -> None:
    headers = record_headers({0: _A})
    assert headers == [(TRACEPARENT_HEADER, _A)]
    assert item_traceparents(headers) == {0: _A}


def test_a_batch_names_its_traced_items_in_the_order_of_their_headers() -> None:
    headers = record_headers({3: _B, 1: _A})
    assert headers == [
        (TRACEPARENT_HEADER, _A),
        (TRACEPARENT_HEADER, _B),
        (TRACE_ITEMS_HEADER, b"1,3"),
    ]
    # With the other headers of a record (signing, recipients) around them, as read back.
    read = item_traceparents([("rb.principal", b"p"), *headers, ("rb.mac", b"x")])
    assert read == {1: _A, 3: _B}


def test_items_packed_into_several_records_keep_their_contexts_record_by_record() -> None:
    framed = [bytes([0xC3, 0x01]) + bytes([i]) * 10 for i in range(5)]
    values = encode_batches(framed, max_items=2)  # records of items 0-1, 2-3, 4
    assert len(values) == 3
    stamps = batch_headers(values, {1: _A, 4: _B})
    assert [item_traceparents(s) for s in stamps] == [{1: _A}, {}, {0: _B}]
    assert stamps[1] is None


@pytest.mark.parametrize(
    "headers",
    [
        None,
        [],
        [(TRACE_ITEMS_HEADER, b"0")],  # indexes without contexts
        [(TRACEPARENT_HEADER, _A), (TRACE_ITEMS_HEADER, b"0,1")],  # counts differ
        [(TRACEPARENT_HEADER, _A), (TRACE_ITEMS_HEADER, b"x")],
        [(TRACEPARENT_HEADER, _A), (TRACE_ITEMS_HEADER, b"1" * 30_000)],
        [(TRACEPARENT_HEADER, _A * 3)],  # longer than any traceparent
        [(TRACEPARENT_HEADER, _A)] * 5000,  # more than a batch holds
        [(TRACEPARENT_HEADER, _A), (TRACE_ITEMS_HEADER, b"-1")],
    ],
)
def test_malformed_trace_headers_from_anyone_are_ignored(headers: object) -> None:
    assert item_traceparents(headers) == {}  # type: ignore[arg-type]


def test_tracing_is_off_by_default_and_then_imports_nothing() -> None:
    settings = ClientSettings()
    assert settings.tracing_enabled is False
    assert tracing_for(settings, "regionbus-client") is None


def test_clients_start_traces_at_one_in_a_hundred_and_servers_start_none() -> None:
    assert ClientSettings().tracing_sample_ratio == 0.01
    assert ServerSettings().tracing_sample_ratio == 0.0
    assert ServerSettings(tracing_sample_ratio=0.5).tracing_sample_ratio == 0.5


def test_the_provider_is_named_after_the_service_unless_otel_service_name_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    assert _provider("regionbus-server").resource.attributes["service.name"] == ("regionbus-server")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "pricing")
    assert _provider("regionbus-server").resource.attributes["service.name"] == "pricing"


def _tracing(ratio: float, caller_spans: bool = True) -> tuple[Tracing, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return Tracing(provider.get_tracer("test"), ratio, caller_spans), exporter


def test_a_new_trace_starts_at_the_ratio_and_a_sampled_context_is_always_continued() -> None:
    never, _ = _tracing(0.0)
    assert not never.starts_trace()
    always, _ = _tracing(1.0)
    assert always.starts_trace()
    sent = always.send("send ns.ops", lambda: {"regionbus.key": "k"})
    assert sent is not None
    traceparent = always.traceparent(sent)
    assert traceparent is not None and int(traceparent[-2:], 16) & 1  # sampled
    # Ratio 0 here too: the writer's sampled context is followed all the same.
    continued = never.process("process ns.ops", traceparent, dict)
    assert continued is not None
    assert continued.get_span_context().trace_id == sent.get_span_context().trace_id
    # ... and a put inside an application's sampled span, where caller spans count.
    with always.current(sent):
        assert never.starts_trace()
        assert not _tracing(0.0, caller_spans=False)[0].starts_trace()
    # Unparseable contexts from anyone start nothing.
    assert never.process("process ns.ops", b"00-zz-zz-01", dict) is None


def test_about_the_ratio_of_changes_start_a_trace() -> None:
    tracing, _ = _tracing(0.1)
    started = sum(tracing.starts_trace() for _ in range(5000))
    assert 350 <= started <= 650


def test_exporters_are_the_ones_otel_traces_exporter_names(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    assert _exporters() == []
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    assert [type(e) for e in _exporters()] == [ConsoleSpanExporter]
    monkeypatch.delenv("OTEL_TRACES_EXPORTER")  # the default: OTLP over HTTP
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    assert [type(e).__name__ for e in _exporters()] == ["OTLPSpanExporter"]
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "zipkin-of-nowhere")
    with pytest.raises(ConfigurationError, match="zipkin-of-nowhere"):
        _exporters()


_WITHOUT_OTEL = textwrap.dedent(
    """
    import json, sys
    sys.modules["opentelemetry"] = None  # what a missing package does to its imports

    import regionbus, regionbus.broker.server, regionbus.clients
    from regionbus import ExtraNotInstalledError
    from regionbus.broker.config import ServerSettings
    from regionbus.schemas.tracing import tracing_for

    found = {"off": tracing_for(ServerSettings(), "s") is None}
    try:
        tracing_for(ServerSettings(tracing_enabled=True), "s")
    except ExtraNotInstalledError as exc:
        found["on"] = [exc.extra, str(exc), isinstance(exc, ImportError)]
    print(json.dumps(found))
    """
)


def test_without_the_otel_extra_regionbus_runs_and_turning_tracing_on_names_it() -> None:
    ran = subprocess.run(
        [sys.executable, "-c", _WITHOUT_OTEL],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    found = json.loads(ran.stdout)
    assert found["off"] is True
    extra, message, is_import_error = found["on"]
    assert (extra, is_import_error) == ("otel", True)
    assert "pip install 'regionbus[otel]'" in message


def test_the_otel_extra_is_opentelemetry_and_the_test_install_has_it() -> None:
    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    project = tomllib.loads(pyproject.read_text())["project"]
    assert not any(r.startswith("opentelemetry") for r in project["dependencies"])
    extras = project["optional-dependencies"]
    named = {r.split(">")[0] for r in extras["otel"]}
    assert {"opentelemetry-api", "opentelemetry-sdk"} <= named
    (self_reference,) = [r for r in extras["dev"] if r.startswith("regionbus[")]
    assert "otel" in self_reference[len("regionbus[") : -1].split(",")
