"""Hostile and careless input is refused with a typed error by the checks the client API and
the servers share, and interest routing runs in bounded time whatever the regex and key."""

from __future__ import annotations

import time
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from regionbus.broker.cli import main as regionbus
from regionbus.broker.config import ServerSettings
from regionbus.broker.interest import InterestTable
from regionbus.broker.validation import validate
from regionbus.clients.arguments import check_entry, check_interest
from regionbus.schemas.entry_checks import (
    MAX_KEY_SIZE_BYTES,
    MAX_VALUE_SIZE_BYTES,
    check_key,
    check_region_name,
    check_value_size,
)
from regionbus.schemas.errors import (
    ConfigurationError,
    InvalidInterestError,
    InvalidKeyError,
    InvalidRegionNameError,
    SerializationError,
    ValueTooLargeError,
    error_from_wire,
)
from regionbus.schemas.eventid import EventID
from regionbus.schemas.interest_regex import MAX_INTEREST_REGEX_CHARS, compile_interest_regex
from regionbus.schemas.messages import InterestKind, InterestSpec, Operation, OperationKind
from regionbus.schemas.naming import bucket_of

SETTINGS = ServerSettings(namespace="unit", total_buckets=16)

# --- interest regexes ---------------------------------------------------------------------


@pytest.mark.parametrize("depth", [500, 5_000])
def test_deeply_nested_regex_is_refused_with_a_reason_not_a_recursion_error(depth: int) -> None:
    with pytest.raises(InvalidInterestError, match="interest regex"):
        compile_interest_regex("(" * depth + "a" + ")" * depth)


def test_backtracking_regex_matches_in_linear_time() -> None:
    pattern = compile_interest_regex("(a+)+$")
    started = time.perf_counter()
    for length in (27, 40, 1000):
        assert pattern.fullmatch("a" * length + "!") is None
        assert pattern.fullmatch("a" * length) is not None
    assert time.perf_counter() - started < 0.5


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [
        (r"(a)\1", "invalid interest regex"),
        ("(?P<x>a)(?P=x)", "invalid interest regex"),
        ("(?=a)a", "lookaround"),
        ("(?<!b)a", "invalid interest regex"),
        ("(", "missing"),
        ("a" * (MAX_INTEREST_REGEX_CHARS + 1), "more than 1000"),
        ("(.*a){90}", "instructions"),
        (None, "needs a pattern"),
        (42, "is a str"),
        ("\ud800", "not valid Unicode"),
    ],
)
def test_refused_regex_says_why(pattern: Any, reason: str) -> None:
    with pytest.raises(InvalidInterestError, match=reason):
        compile_interest_regex(pattern)


@pytest.mark.parametrize(
    ("pattern", "key", "matches"),
    [
        ("UA-.*", "UA-1-EWR", True),
        ("UA-.*", "xUA-1", False),
        (r"(?i)flight-\d{1,5}", "FLIGHT-42", True),
        ("[[:alpha:]]+", "abc", True),
        ("a|b", "ab", False),
    ],
)
def test_accepted_regex_matches_the_whole_key(pattern: str, key: str, matches: bool) -> None:
    assert (compile_interest_regex(pattern).fullmatch(key) is not None) is matches


# --- keys, values, region names -----------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    [None, 42, b"bytes", "\ud800", "x" * (MAX_KEY_SIZE_BYTES + 1), "é" * 513, "k" * 1_000_000],
)
def test_bad_keys_raise_invalid_key_error(key: Any) -> None:
    with pytest.raises(InvalidKeyError):
        check_key(key)
    with pytest.raises(InvalidKeyError):
        check_entry(key, b"1")


@pytest.mark.parametrize("key", ["", "k", "x" * MAX_KEY_SIZE_BYTES, "é" * 512, "a b/*\x00"])
def test_good_keys_pass(key: str) -> None:
    assert check_key(key) == key


def test_values_and_callback_arguments_too_large_to_send_are_refused() -> None:
    check_value_size(b"x" * MAX_VALUE_SIZE_BYTES)
    with pytest.raises(ValueTooLargeError):
        check_value_size(b"x" * (MAX_VALUE_SIZE_BYTES + 1))
    with pytest.raises(ValueTooLargeError):
        check_entry("k", b"1", b"x" * 1_000_000)
    with pytest.raises(SerializationError):
        check_entry("k", b"1", "not bytes")


@pytest.mark.parametrize(
    "name", ["", "a b", "*", "r" * 5_000, "a/b", "__internal", "r\n", None, 7, "rég"]
)
def test_bad_region_names_raise_invalid_region_name_error(name: Any) -> None:
    with pytest.raises(InvalidRegionNameError):
        check_region_name(name)


@pytest.mark.parametrize("name", ["r", "flights", "Region_1", "a.b-c", "r" * 120])
def test_good_region_names_pass(name: str) -> None:
    assert check_region_name(name) == name


def test_new_errors_cross_the_wire_as_themselves() -> None:
    assert isinstance(error_from_wire("InvalidKeyError", "m"), InvalidKeyError)
    assert isinstance(error_from_wire("InvalidRegionNameError", "m"), InvalidRegionNameError)


def test_interest_specs_are_checked_like_entries() -> None:
    with pytest.raises(InvalidKeyError):
        check_interest(InterestSpec(InterestKind.KEYS, ("ok", "\ud800")))
    with pytest.raises(InvalidInterestError):
        check_interest(InterestSpec(InterestKind.REGEX, (), "(a)\\1"))


# --- the servers apply the same checks to what they read ----------------------------------


def _op(kind: OperationKind, **fields: Any) -> Operation:
    return Operation(
        request_id=1,
        client_id="c",
        kind=kind,
        region=fields.pop("region", "r"),
        timestamp_ms=0,
        event_id=EventID("c", 1, 0),
        **fields,
    )


def test_server_refuses_what_the_client_refuses() -> None:
    big_key = "k" * (MAX_KEY_SIZE_BYTES + 1)
    with pytest.raises(InvalidKeyError):
        validate(
            _op(OperationKind.PUT, key=big_key, value=b"1"),
            bucket_of("r", big_key, 16),
            SETTINGS,
        )
    with pytest.raises(InvalidRegionNameError):
        validate(_op(OperationKind.CLEAR, region="a b"), 0, SETTINGS)
    with pytest.raises(InvalidInterestError):
        poison = InterestSpec(InterestKind.REGEX, (), "(" * 500 + "a" + ")" * 500)
        validate(_op(OperationKind.REGISTER_INTEREST, interest=poison), 0, SETTINGS)
    with pytest.raises(InvalidKeyError):
        keys = InterestSpec(InterestKind.KEYS, (big_key,))
        validate(_op(OperationKind.REGISTER_INTEREST, interest=keys), 0, SETTINGS)
    validate(_op(OperationKind.DISCONNECT, region=""), 0, SETTINGS)


# --- configuration errors exit 2 ----------------------------------------------------------


def test_non_json_list_variable_is_a_configuration_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REGIONBUS_REGIONS", "r1,r2")
    with pytest.raises(ConfigurationError, match="REGIONBUS_REGIONS"):
        ServerSettings.load()


def test_bad_region_name_in_server_settings_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="region name"):
        ServerSettings.load(namespace="unit", regions=["a b"])


@pytest.mark.parametrize(
    "args",
    [
        ["serve"],
        ["config", "show"],
        ["status"],
        ["region", "list"],
        ["user", "list"],
    ],
)
def test_configuration_errors_exit_2(args: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REGIONBUS_REGIONS", "r1,r2")
    result = CliRunner().invoke(regionbus, args)
    assert result.exit_code == 2, result.output
    assert "REGIONBUS_REGIONS" in result.output


def test_bad_region_name_on_the_command_line_exits_2() -> None:
    result = CliRunner().invoke(regionbus, ["region", "create", "a b"])
    assert result.exit_code == 2, result.output


# --- property: whatever the regex and key, the check and routing finish in bounded time ---

_TOKENS = st.sampled_from(
    [
        *("a", "b", ".", "(", ")", "+", "*", "?", "|", "{2,}", "(a+)+", "(a|aa)*", "(.*a)"),
        *("\\1", "[a-z]", "\\d", "$", "^", "(?=a)", "(?:", "{1000}", "\ud800", "é"),
    ]
)
_KEYS = st.one_of(
    st.text(max_size=200),
    st.builds(lambda n, tail: "a" * n + tail, st.integers(0, 60), st.sampled_from(["", "!", "b"])),
)

ROUTE_BOUND_S = 0.5
"""Longest a registration plus one routing may take (RE2: about a millisecond)."""


@hypothesis_settings(max_examples=300)
@given(pattern=st.lists(_TOKENS, max_size=30).map("".join), keys=st.lists(_KEYS, max_size=5))
def test_random_regexes_and_keys_are_checked_and_routed_in_bounded_time(
    pattern: str, keys: list[str]
) -> None:
    started = time.perf_counter()
    try:
        compile_interest_regex(pattern)
    except InvalidInterestError:
        assert time.perf_counter() - started < ROUTE_BOUND_S
        return
    table = InterestTable()
    table.add("c", "r", InterestSpec(InterestKind.REGEX, (), pattern), range(16))
    for key in keys:
        try:
            check_key(key)
        except InvalidKeyError:
            continue
        began = time.perf_counter()
        table.audiences("r", key, bucket_of("r", key, 16))
        assert time.perf_counter() - began < ROUTE_BOUND_S, (pattern, key)
    assert time.perf_counter() - started < ROUTE_BOUND_S * (1 + len(keys))
