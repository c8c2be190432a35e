"""`config_repairs`: what an existing topic must have set back to keep and take every
record its kind needs."""

from __future__ import annotations

from regionbus.schemas.topics import (
    DEFAULT_RETENTION_MS,
    KEEP_UNTIL_ACKED,
    TopicSpec,
    config_repairs,
    retention,
)

_QUEUE = TopicSpec("ns.queues", 16, retention(DEFAULT_RETENTION_MS + 3_600_000))
_ACKED = TopicSpec("ns.gw.s", 1, retention(KEEP_UNTIL_ACKED))
_KEPT = {
    "cleanup.policy": "delete",
    "retention.ms": str(DEFAULT_RETENTION_MS + 3_600_000),
    "retention.bytes": "-1",
    "max.message.bytes": "1048588",
}


def test_a_topic_as_made_needs_nothing() -> None:
    assert config_repairs(_QUEUE, _KEPT) == {}


def test_broker_defaults_need_only_the_longer_retention() -> None:
    assert config_repairs(_QUEUE, {}) == {"retention.ms": _KEPT["retention.ms"]}


def test_a_longer_or_unlimited_retention_and_a_larger_size_are_kept() -> None:
    longer = {**_KEPT, "retention.ms": "-1", "max.message.bytes": "5000000"}
    assert config_repairs(_QUEUE, longer) == {}


def test_every_losing_setting_is_set_back() -> None:
    losing = {
        "cleanup.policy": "compact,delete",
        "retention.ms": "1000",
        "retention.bytes": "1000",
        "max.message.bytes": "200",
    }
    assert config_repairs(_QUEUE, losing) == {
        "cleanup.policy": "delete",
        "retention.ms": _KEPT["retention.ms"],
        "retention.bytes": "-1",
        "max.message.bytes": "1048588",
    }


def test_a_queue_kept_until_acknowledged_must_keep_forever() -> None:
    assert config_repairs(_ACKED, {**_KEPT, "retention.ms": "999999999999"}) == {
        "retention.ms": "-1"
    }
    assert config_repairs(_ACKED, {**_KEPT, "retention.ms": "-1"}) == {}


def test_configs_the_spec_does_not_name_are_not_checked() -> None:
    bare = TopicSpec("kept", 2, {})
    assert config_repairs(bare, {**_KEPT, "retention.ms": "1", "max.message.bytes": "10"}) == {}
