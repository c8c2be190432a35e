"""Gateways without external processes: the batch/ack wire records, batch conflation,
loop-prevention stamping, what the cache server queues where, and settings defaults."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from regionbus.broker.config import GatewayQueueSpec, GatewaySenderSpec, ServerSettings
from regionbus.broker.gateway_queues import GatewayEnqueuer, stamp_origin
from regionbus.gateways.processor import conflate
from regionbus.gateways.protocol import (
    BatchEventException,
    GatewayAck,
    GatewayBatch,
    decode_ack,
    decode_batch,
    encode_ack,
    encode_batch,
)
from regionbus.gateways.sender_settings import GatewaySenderSettings
from regionbus.schemas.codec import encode
from regionbus.schemas.errors import ConfigurationError, MessageDecodeError
from regionbus.schemas.eventid import EventID
from regionbus.schemas.hooks import GatewayEventFilter, load_hook
from regionbus.schemas.messages import Event, EventKind
from regionbus.schemas.naming import bucket_of


def _event(key: str, kind: EventKind = EventKind.UPDATE, seq: int = 0, **fields: object) -> Event:
    return Event(
        event_id=EventID("m", 1, seq, 3),
        kind=kind,
        region="r",
        version=seq,
        timestamp_ms=1,
        originator="c",
        key=key,
        value=b"1",
        serializer="json",
        **fields,  # type: ignore[arg-type]
    )


def test_batch_and_ack_round_trip() -> None:
    batch = GatewayBatch("run-1", "to-b", 1, "ns.gwack.1.to-b", True, (encode(_event("k")),))
    ack = GatewayAck("run-1", "receiver", 3, (BatchEventException(1, "m:1:1@3", "E", "boom"),))

    assert decode_batch(encode_batch(batch)) == batch
    assert decode_ack(encode_ack(ack)) == ack
    assert ack.last_successful_index == 0
    assert GatewayAck("b", "r", 5).last_successful_index == 4


@pytest.mark.parametrize("data", [b"", b"garbage", encode(_event("k")), b"\xb1\x20\xff"])
def test_anything_else_is_not_a_batch(data: bytes) -> None:
    with pytest.raises(MessageDecodeError):
        decode_batch(data)


def test_conflation_keeps_the_last_update_and_never_crosses_a_create_or_destroy() -> None:
    events = [
        _event("a", EventKind.CREATE, 0),
        _event("a", EventKind.UPDATE, 1),
        _event("b", EventKind.UPDATE, 2),
        _event("a", EventKind.UPDATE, 3),
        _event("a", EventKind.DESTROY, 4),
        _event("a", EventKind.CREATE, 5),
        _event("a", EventKind.UPDATE, 6),
        _event("b", EventKind.UPDATE, 7),
    ]
    assert [e.event_id.sequence for e in conflate(events)] == [0, 3, 4, 5, 6, 7]


def test_stamping_sets_the_origin_once_and_adds_the_site_once() -> None:
    local = stamp_origin(_event("k"), 1)
    assert (local.origin_site_id, local.sites_reached) == (1, (1,))
    remote = stamp_origin(_event("k", origin_site_id=2, sites_reached=(2, 1)), 1)
    assert (remote.origin_site_id, remote.sites_reached) == (2, (2, 1))


class _NoSecrets(GatewayEventFilter):
    def before_enqueue(self, event: Event) -> bool:
        return not (event.key or "").startswith("secret")


def _settings(parallel: bool) -> ServerSettings:
    return ServerSettings(
        namespace="ns",
        distributed_system_id=1,
        gateway_senders={
            "to-b": GatewayQueueSpec(
                parallel=parallel,
                remote_distributed_system_id=2,
                event_filters=[f"{__name__}:_NoSecrets"],
            )
        },
        async_event_queues={"db": GatewayQueueSpec()},
        region_gateway_senders={"r": ["to-b"]},
        region_async_event_queues={"r": ["db"]},
    )


@pytest.mark.parametrize("parallel", [False, True])
def test_the_server_queues_distributable_events_for_each_sender_and_queue(parallel: bool) -> None:
    enqueuer = GatewayEnqueuer(_settings(parallel))
    produced: list[tuple[str, Event, int]] = []

    def produce(topic: str, value: bytes, key: bytes | None, partition: int) -> None:
        from regionbus.schemas.codec import decode_as

        produced.append((topic, decode_as(value, Event), partition))

    # a serial sender: Geode's default five dispatchers, one partition each
    assert enqueuer.topics == {"ns.gw.to-b": 16 if parallel else 5, "ns.aeq.db": 1}
    for kind in EventKind:
        enqueuer.enqueue(_event("k", kind), 3, produce)
    enqueuer.enqueue(_event("secret-k"), 3, produce)
    enqueuer.enqueue(_event("from-b", origin_site_id=2, sites_reached=(2, 1)), 3, produce)
    enqueuer.enqueue(_event("x")._replace(region="unattached"), 3, produce)

    to_b = [(e.kind, e.key, p) for t, e, p in produced if t == "ns.gw.to-b"]
    to_db = [(e.kind, e.key) for t, e, _ in produced if t == "ns.aeq.db"]
    partition = 3 if parallel else bucket_of("r", "k", 5)  # KEY order policy
    assert to_b == [
        (EventKind.CREATE, "k", partition),
        (EventKind.UPDATE, "k", partition),
        (EventKind.DESTROY, "k", partition),
    ]
    assert to_db == [
        (EventKind.CREATE, "k"),
        (EventKind.UPDATE, "k"),
        (EventKind.DESTROY, "k"),
        (EventKind.UPDATE, "secret-k"),
        (EventKind.UPDATE, "from-b"),
    ]
    assert all(e.origin_site_id in (1, 2) and 1 in e.sites_reached for _, e, _ in produced)


def test_settings_refuse_undefined_senders_and_senders_without_a_site_id() -> None:
    with pytest.raises(ValidationError, match="undefined gateway senders"):
        ServerSettings(distributed_system_id=1, region_gateway_senders={"r": ["nope"]})
    with pytest.raises(ValidationError, match="distributed_system_id"):
        ServerSettings(gateway_senders={"s": GatewayQueueSpec(remote_distributed_system_id=2)})


def test_sender_defaults_are_geodes_and_seed_002s() -> None:
    settings = GatewaySenderSettings(
        sender_id="s",
        distributed_system_id=1,
        remote_distributed_system_id=2,
        remote_namespace="b",
        remote_kafka_bootstrap_servers="127.0.0.1:1",
    )
    assert (settings.batch_size, settings.batch_time_interval_ms) == (100, 1000)
    assert settings.retry_interval_ms == 5000
    assert settings.batch_conflation_enabled is False


def test_hooks_load_by_name_and_bad_names_are_configuration_errors() -> None:
    assert isinstance(load_hook(f"{__name__}:_NoSecrets", GatewayEventFilter), _NoSecrets)
    with pytest.raises(ConfigurationError):
        load_hook("no.such.module:X", GatewayEventFilter)
    with pytest.raises(ConfigurationError):
        load_hook("builtins:dict", GatewayEventFilter)


def test_a_queue_is_kept_until_acknowledged_unless_its_spec_bounds_its_retention() -> None:
    week_ms = 7 * 24 * 3_600_000
    settings = ServerSettings(
        namespace="ns",
        distributed_system_id=1,
        gateway_senders={
            "to-b": GatewaySenderSpec(remote_distributed_system_id=2, queue_retention_ms=week_ms)
        },
        async_event_queues={"db": GatewayQueueSpec()},
        region_gateway_senders={"r": ["to-b"]},
        region_async_event_queues={"r": ["db"]},
    )
    specs = {spec.name: spec for spec in GatewayEnqueuer(settings).topic_specs()}
    assert specs["ns.gw.to-b"].config["retention.ms"] == str(week_ms)
    assert specs["ns.gw.to-b"].partitions == 5
    assert specs["ns.aeq.db"].config["retention.ms"] == "-1"
    with pytest.raises(ValidationError, match="queue_retention_ms"):
        GatewaySenderSpec(remote_distributed_system_id=2, queue_retention_ms=60_000)
