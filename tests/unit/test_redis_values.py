"""The formats of values stored in Redis: each parse reads what its format (and the Lua
scripts) write."""

from __future__ import annotations

import pytest

from regionbus.schemas.messages import EventKind
from regionbus.schemas.redis_values import (
    EntryMeta,
    GatewayVersion,
    LeaseValue,
    StoredResult,
    format_lease,
    format_result,
    parse_gateway_version,
    parse_lease,
    parse_meta,
    parse_result,
)


def test_a_lease_round_trips_and_splits_at_its_last_separator() -> None:
    assert parse_lease(format_lease("server-a|b", 42)) == LeaseValue("server-a|b", 42)
    assert parse_lease(b"m|7") == LeaseValue("m", 7)


def test_a_stored_result_round_trips() -> None:
    for kind in EventKind:
        assert parse_result(format_result(kind, 9)) == StoredResult(kind, 9)
    assert parse_result(b"UPDATE|3") == StoredResult(EventKind.UPDATE, 3)


def test_entry_meta_and_gateway_versions_as_the_scripts_write_them() -> None:
    assert parse_meta(b"12|json") == EntryMeta(12, "json")
    assert parse_meta(b"12|") == EntryMeta(12, None)
    assert parse_meta(b"12|avro:a|b") == EntryMeta(12, "avro:a|b")
    assert parse_gateway_version(b"1700000000000|2") == GatewayVersion(1_700_000_000_000, 2)


@pytest.mark.parametrize("raw", [b"", b"no-separator", b"|", b"x|y"])
def test_a_malformed_value_is_a_value_error(raw: bytes) -> None:
    with pytest.raises(ValueError):
        parse_lease(raw)
    with pytest.raises(ValueError):
        parse_result(raw)
