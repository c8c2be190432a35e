"""The Kafka source options and the micro-batch read limit, without Spark or Kafka."""

from __future__ import annotations

import pytest

from regionbus.schemas.errors import ConfigurationError
from regionbus.spark.options import (
    EARLIEST,
    LATEST,
    offsets_from_json,
    offsets_to_json,
    parse_source_options,
    split_limit,
)

_BASE = {"kafka.bootstrap.servers": "k:9092"}


def test_spark_option_names_parse_as_spark_reads_them() -> None:
    options = parse_source_options(
        {
            **_BASE,
            "kafka.security.protocol": "SASL_SSL",
            "kafka.group.id": "ignored",
            "subscribe": "a, b",
            "startingOffsets": '{"a": {"0": 5, "1": -2}}',
            "maxOffsetsPerTrigger": "100",
            "includeHeaders": "TRUE",
        },
        streaming=True,
    )

    assert options.kafka_config == {"bootstrap.servers": "k:9092", "security.protocol": "SASL_SSL"}
    assert options.subscription.topics == ("a", "b")
    assert options.starting_offsets == {("a", 0): 5, ("a", 1): EARLIEST}
    assert options.ending_offsets == "latest"
    assert options.max_offsets_per_trigger == 100
    assert options.include_headers
    assert options.poll_timeout_ms == 120_000


def test_defaults_differ_for_batch_and_stream_and_patterns_match_whole_names() -> None:
    batch = parse_source_options({**_BASE, "subscribePattern": r"ns\.queue\..*"}, streaming=False)
    stream = parse_source_options({**_BASE, "assign": '{"t": [0, 2]}'}, streaming=True)

    assert batch.starting_offsets == "earliest"
    assert batch.subscription.matches("ns.queue.c1")
    assert not batch.subscription.matches("xns.queue.c1")
    assert stream.starting_offsets == "latest"
    assert stream.subscription.assignment == (("t", 0), ("t", 2))
    assert not batch.include_headers


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"subscribe": "t"}, "bootstrap.servers"),
        ({**_BASE}, "exactly one"),
        ({**_BASE, "subscribe": "t", "assign": '{"t": [0]}'}, "exactly one"),
        ({**_BASE, "subscribe": "t", "startingOffsets": "latest"}, "not allowed"),
        ({**_BASE, "subscribe": "t", "endingOffsets": '{"t": {"0": -2}}'}, "not allowed"),
        ({**_BASE, "subscribe": "t", "maxOffsetsPerTrigger": "0"}, "positive"),
        ({**_BASE, "subscribePattern": "("}, "subscribePattern"),
        ({**_BASE, "assign": "[0]"}, "assign"),
    ],
)
def test_bad_options_raise_configuration_errors(options: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        parse_source_options(options, streaming=False)


def test_offsets_round_trip_through_sparks_offset_json() -> None:
    offsets = {("t", 0): 3, ("t", 10): 7, ("u", 1): LATEST}

    encoded = offsets_to_json(offsets)

    assert encoded == {"t": {"0": 3, "10": 7}, "u": {"1": LATEST}}
    assert offsets_from_json(encoded) == offsets


def test_read_limit_shares_the_batch_by_backlog_and_always_progresses() -> None:
    start = {("t", 0): 0, ("t", 1): 100}
    end = {("t", 0): 300, ("t", 1): 200, ("t", 2): 0}

    cut = split_limit(start, end, 200)
    tiny = split_limit(start, end, 1)

    assert sum(cut[tp] - start.get(tp, 0) for tp in cut) == 200
    assert cut == {("t", 0): 150, ("t", 1): 150, ("t", 2): 0}
    assert sum(tiny[tp] - start.get(tp, 0) for tp in tiny) == 1
    assert split_limit(start, end, 10_000) == end


def test_timestamp_options_parse_with_sparks_precedence_and_strategy() -> None:
    per_partition = '{"a": {"0": 1700000000000, "1": 5}}'
    options = parse_source_options(
        {
            **_BASE,
            "subscribe": "a",
            "startingOffsets": '{"a": {"0": 3}}',
            "startingOffsetsByTimestamp": per_partition,
            "startingTimestamp": "1000",
            "endingOffsetsByTimestamp": per_partition,
            "startingOffsetsByTimestampStrategy": "LATEST",
        },
        streaming=False,
    )
    plain = parse_source_options({**_BASE, "subscribe": "a"}, streaming=False)

    assert options.starting_timestamps == 1000
    assert options.ending_timestamps == {("a", 0): 1_700_000_000_000, ("a", 1): 5}
    assert options.starting_timestamp_strategy == "latest"
    assert options.starting_offsets == {("a", 0): 3}
    assert plain.starting_timestamps is None and plain.ending_timestamps is None
    assert plain.starting_timestamp_strategy == "error"


@pytest.mark.parametrize(
    ("options", "streaming", "message"),
    [
        ({"startingTimestamp": "yesterday"}, False, "milliseconds since the epoch"),
        ({"startingTimestamp": "-5"}, False, "negative"),
        ({"endingOffsetsByTimestamp": '{"t": [1]}'}, False, "must be an object"),
        ({"endingOffsetsByTimestamp": '{"t": {"x": 1}}'}, False, "bad partition"),
        ({"startingOffsetsByTimestamp": '{"t": {"0": 1.5}}'}, False, "milliseconds"),
        ({"startingOffsetsByTimestampStrategy": "earliest"}, False, "error or latest"),
        ({"endingTimestamp": "1000"}, True, "batch reads"),
    ],
)
def test_bad_timestamp_options_raise_configuration_errors(
    options: dict[str, str], streaming: bool, message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        parse_source_options({**_BASE, "subscribe": "t", **options}, streaming=streaming)
