"""Pure security logic: key derivation, MAC signing and verification, header parsing,
Geode-style permission matching and the permission each operation needs."""

from __future__ import annotations

import hashlib
import hmac

import pytest
import redis

from regionbus.broker.config import ServerSettings
from regionbus.broker.permissions import (
    CLUSTER_MANAGE,
    ResourcePermission,
    is_granted,
    required_permissions,
)
from regionbus.broker.principals import SERVER_PRINCIPAL, Principal
from regionbus.broker.security import SecurityGuard
from regionbus.schemas.errors import (
    AuthenticationError,
    ConfigurationError,
    NotAuthorizedError,
    error_from_wire,
)
from regionbus.schemas.eventid import EventID
from regionbus.schemas.messages import InterestKind, InterestSpec, Operation, OperationKind
from regionbus.schemas.signing import (
    Signer,
    compute_mac,
    derive_key,
    parse_headers,
    signing_input,
)

VALUE = b"\xb1\x01some operation bytes"


def _parse(text: str) -> ResourcePermission:
    return ResourcePermission.parse(text)


def test_derived_key_is_pbkdf2_sha256_salted_by_namespace_and_principal() -> None:
    key = derive_key("s3cret", "site1", "alice", iterations=1_000)
    salt = hashlib.sha256(b"regionbus-principal-salt\x00site1\x00alice").digest()
    assert key == hashlib.pbkdf2_hmac("sha256", b"s3cret", salt, 1_000, 32)
    assert key != derive_key("s3cret", "site1", "bob", iterations=1_000)
    assert key != derive_key("s3cret", "site2", "alice", iterations=1_000)


def test_mac_is_hmac_sha256_over_every_signed_field() -> None:
    key = b"k" * 32
    mac = compute_mac(key, "alice", 1_700_000_000_000, "ns.ops", 3, VALUE)
    expected = hmac.new(
        key, signing_input("alice", 1_700_000_000_000, "ns.ops", 3, VALUE), hashlib.sha256
    )
    assert mac == expected.digest()
    variants = [
        ("bob", 1_700_000_000_000, "ns.ops", 3, VALUE),
        ("alice", 1_700_000_000_001, "ns.ops", 3, VALUE),
        ("alice", 1_700_000_000_000, "ns.control", 3, VALUE),
        ("alice", 1_700_000_000_000, "ns.ops", 4, VALUE),
        ("alice", 1_700_000_000_000, "ns.ops", 3, VALUE[:-1] + b"X"),
    ]
    assert all(compute_mac(key, *v) != mac for v in variants)


def test_length_prefixes_keep_field_boundaries_apart() -> None:
    assert signing_input("ab", 1, "c", 0, b"") != signing_input("a", 1, "bc", 0, b"")


def test_signed_headers_verify_with_the_right_key_only() -> None:
    signer = Signer("alice", b"k" * 32)
    headers = signer.headers("ns.ops", 2, VALUE, timestamp_ms=42)
    signed = parse_headers(headers)
    assert (signed.principal, signed.timestamp_ms) == ("alice", 42)
    assert signed.verify(b"k" * 32, "ns.ops", 2, VALUE)
    assert not signed.verify(b"x" * 32, "ns.ops", 2, VALUE)
    assert not signed.verify(b"k" * 32, "ns.ops", 2, VALUE + b"\x00")
    assert not signed.verify(b"k" * 32, "ns.ops", 5, VALUE)


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        (None, "missing header"),
        ([("rb.principal", b"alice"), ("rb.ts", b"1")], "rb.mac"),
        ([("rb.principal", b"a"), ("rb.ts", b"soon"), ("rb.mac", b"00")], "malformed"),
        ([("rb.principal", b"a"), ("rb.ts", b"1"), ("rb.mac", b"zz")], "malformed"),
        (
            [("rb.principal", b"a"), ("rb.principal", b"b"), ("rb.ts", b"1"), ("rb.mac", b"")],
            "twice",
        ),
    ],
)
def test_missing_or_malformed_headers_are_authentication_errors(
    headers: list[tuple[str, bytes]] | None, message: str
) -> None:
    with pytest.raises(AuthenticationError, match=message):
        parse_headers(headers)


def test_security_errors_travel_by_name() -> None:
    assert isinstance(error_from_wire("AuthenticationError", "x"), AuthenticationError)
    assert isinstance(error_from_wire("NotAuthorizedError", "x"), NotAuthorizedError)


def test_permission_parsing_and_text() -> None:
    assert str(_parse("data:write:flights")) == "DATA:WRITE:flights"
    assert str(_parse("DATA:READ:r:a:b")) == "DATA:READ:r:a:b"
    assert str(_parse("CLUSTER:MANAGE")) == "CLUSTER:MANAGE"
    for bad in ("DATA", "DATA:DELETE", "FILES:READ"):
        with pytest.raises(ConfigurationError):
            _parse(bad)


@pytest.mark.parametrize(
    ("granted", "required", "implied"),
    [
        ("DATA:WRITE:r", "DATA:WRITE:r:k", True),
        ("DATA:WRITE", "DATA:WRITE:r:k", True),
        ("DATA:*:r", "DATA:READ:r", True),
        ("*:*", "CLUSTER:MANAGE", True),
        ("DATA:WRITE:r:k", "DATA:WRITE:r:j", False),
        ("DATA:WRITE:r:k", "DATA:WRITE:r", False),
        ("DATA:WRITE:r", "DATA:WRITE:s", False),
        ("DATA:READ:r", "DATA:WRITE:r", False),
        ("DATA:MANAGE", "DATA:WRITE:r", False),
        ("DATA:MANAGE", "CLUSTER:MANAGE", False),
    ],
)
def test_implies_follows_geode_wildcard_semantics(
    granted: str, required: str, implied: bool
) -> None:
    assert _parse(granted).implies(_parse(required)) is implied


def _op(kind: OperationKind, **fields: object) -> Operation:
    defaults: dict[str, object] = {
        "request_id": 1,
        "client_id": "c",
        "kind": kind,
        "region": "r",
        "timestamp_ms": 0,
    }
    defaults.update(fields)
    return Operation(**defaults)  # type: ignore[arg-type]


def test_each_operation_needs_the_permission_geode_asks_for() -> None:
    eid = EventID("m", 1, 1, 0)
    need = {
        kind: [str(p) for p in required_permissions(_op(kind, key="k", event_id=eid))]
        for kind in OperationKind
    }
    assert need[OperationKind.PUT] == ["DATA:WRITE:r:k"]
    assert need[OperationKind.DESTROY] == ["DATA:WRITE:r:k"]
    assert need[OperationKind.INVALIDATE] == ["DATA:WRITE:r:k"]
    assert need[OperationKind.CLEAR] == ["DATA:WRITE:r"]
    assert need[OperationKind.DESTROY_REGION] == ["DATA:MANAGE:r"]
    assert need[OperationKind.GET] == ["DATA:READ:r:k"]
    assert need[OperationKind.KEYS] == ["DATA:READ:r"]
    assert need[OperationKind.READY_FOR_EVENTS] == []
    assert need[OperationKind.DISCONNECT] == []
    by_keys = _op(
        OperationKind.REGISTER_INTEREST,
        interest=InterestSpec(InterestKind.KEYS, keys=("a", "b")),
    )
    assert [str(p) for p in required_permissions(by_keys)] == ["DATA:READ:r:a", "DATA:READ:r:b"]
    by_regex = _op(
        OperationKind.REGISTER_INTEREST, interest=InterestSpec(InterestKind.REGEX, regex=".*")
    )
    assert [str(p) for p in required_permissions(by_regex)] == ["DATA:READ:r"]


def test_cluster_manage_is_granted_only_by_cluster_or_wildcard_permissions() -> None:
    assert is_granted((_parse("CLUSTER:MANAGE"),), CLUSTER_MANAGE)
    assert is_granted((_parse("DATA:READ:r"), _parse("*:*")), CLUSTER_MANAGE)
    assert not is_granted((_parse("DATA:*"), _parse("CLUSTER:READ")), CLUSTER_MANAGE)


def test_an_expiration_or_a_loads_create_is_refused_from_any_principal_but_the_servers() -> None:
    # No Redis round trip happens for either answer (the client is never connected).
    guard = SecurityGuard(redis.Redis(port=1), ServerSettings())
    admin = Principal("admin", b"k" * 32, (_parse("*:*"),))
    for kind in (
        OperationKind.EXPIRE_DESTROY,
        OperationKind.EXPIRE_INVALIDATE,
        OperationKind.LOAD_CREATE,
    ):
        op = _op(kind, key="k", event_id=EventID("(expiry)", 1, 1, 0))
        with pytest.raises(NotAuthorizedError, match="bucket primaries only"):
            guard.authorize_operation(admin, op)
        guard.authorize_operation(Principal(SERVER_PRINCIPAL, b"s" * 32, ()), op)
