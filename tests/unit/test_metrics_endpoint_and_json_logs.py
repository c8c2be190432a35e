"""Issue 7, without external processes: JSON log lines, the text default, a worker's own
metrics registry and endpoint, and the observability settings."""

from __future__ import annotations

import io
import json
import logging
import urllib.request
from collections.abc import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import ValidationError

from regionbus.broker.config import ServerSettings
from regionbus.gateways.async_event_queue import AsyncEventQueueSettings
from regionbus.gateways.receiver import GatewayReceiverSettings
from regionbus.gateways.sender_settings import GatewaySenderSettings
from regionbus.runtime.observability import (
    TEXT_LOG_FORMAT,
    MetricFamilies,
    MetricsEndpoint,
    configure_logging,
    json_log_formatter,
)


@pytest.fixture
def restore_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def test_a_json_log_line_carries_member_namespace_level_logger_message_extras_and_traceback() -> (
    None
):
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(json_log_formatter({"member": "server-a-1", "namespace": "geode.s1"}))
    logger = logging.getLogger("regionbus.test.json")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("client %s closed", "desk", extra={"client": "desk"})
        try:
            raise RuntimeError("broken")
        except RuntimeError:
            logger.exception("listener failed")
    finally:
        logger.removeHandler(handler)
        logger.propagate = True

    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["message"] == "client desk closed"
    assert first["levelname"] == "WARNING"
    assert first["name"] == "regionbus.test.json"
    assert (first["member"], first["namespace"]) == ("server-a-1", "geode.s1")
    assert first["client"] == "desk"
    assert "asctime" in first and "exc_info" not in first
    assert second["levelname"] == "ERROR" and "RuntimeError: broken" in second["exc_info"]


def test_configure_logging_json_sets_one_root_handler_and_text_keeps_the_classic_line(
    restore_root_logger: None,
) -> None:
    stream = io.StringIO()
    configure_logging("json", fields={"member": "m", "namespace": "ns"}, stream=stream)
    logging.getLogger("regionbus.test").info("hello")
    assert json.loads(stream.getvalue())["member"] == "m"
    assert logging.getLogger().level == logging.INFO

    stream = io.StringIO()
    configure_logging("text", verbose=True, stream=stream)
    logging.getLogger("regionbus.test").debug("hello")
    assert stream.getvalue().rstrip().endswith("DEBUG regionbus.test: hello")
    assert len(logging.getLogger().handlers) == 1
    assert TEXT_LOG_FORMAT == "%(asctime)s %(levelname)s %(name)s: %(message)s"


def test_an_endpoint_on_port_0_serves_its_own_registry_and_frees_the_port_when_stopped() -> None:
    families = MetricFamilies({"namespace": "ns", "member": "m1"})
    count = {"applied": 0}

    def collect() -> list:
        return [
            families.counter(
                "operations_applied",
                "applied",
                {("r", "put"): count["applied"]},
                ("region", "kind"),
            ),
            families.gauge("bucket_primaries", "primaries", 16),
        ]

    first = MetricsEndpoint(0, collect)
    second = MetricsEndpoint(0, lambda: [families.gauge("bucket_primaries", "p", 3)])
    first.start()
    second.start()
    try:
        assert first.port and second.port and first.port != second.port
        second_port = second.port
        count["applied"] = 7  # read at scrape time, not at registration
        assert first.url is not None
        with urllib.request.urlopen(first.url, timeout=5) as response:
            text = response.read().decode()
    finally:
        first.stop()
        second.stop()
    samples = {s.name: s for family in text_string_to_metric_families(text) for s in family.samples}
    applied = samples["regionbus_operations_applied_total"]
    assert applied.value == 7
    assert applied.labels == {"namespace": "ns", "member": "m1", "region": "r", "kind": "put"}
    assert samples["regionbus_bucket_primaries"].value == 16
    assert first.port is None and first.url is None
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{second_port}/metrics", timeout=2)


def test_without_a_port_there_is_no_endpoint_but_the_registry_still_answers() -> None:
    families = MetricFamilies({"namespace": "ns", "member": "m1"})
    endpoint = MetricsEndpoint(None, lambda: [families.gauge("bucket_primaries", "p", 2)])
    endpoint.start()
    assert endpoint.port is None and endpoint.url is None
    assert b'regionbus_bucket_primaries{member="m1",namespace="ns"} 2.0' in endpoint.scrape()


def test_observability_settings_default_to_no_endpoint_and_text_and_are_validated() -> None:
    server = ServerSettings()
    assert (server.metrics_port, server.log_format) == (None, "text")
    for settings in (
        GatewaySenderSettings(
            sender_id="s",
            distributed_system_id=1,
            remote_distributed_system_id=2,
            remote_namespace="b",
            remote_kafka_bootstrap_servers="b:9092",
        ),
        GatewayReceiverSettings(distributed_system_id=1),
        AsyncEventQueueSettings(queue_id="q"),
    ):
        assert (settings.metrics_port, settings.log_format) == (None, "text")
    assert ServerSettings(metrics_port=0, log_format="json").metrics_port == 0
    with pytest.raises(ValidationError):
        ServerSettings(metrics_port=65536)
    with pytest.raises(ValidationError):
        AsyncEventQueueSettings(queue_id="q", log_format="xml")
