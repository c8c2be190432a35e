"""Reading whom a shared client topic's record is for, as the clients and Spark read it."""

from __future__ import annotations

from regionbus.schemas.addressing import (
    RECIPIENTS_HEADER,
    addressed_to,
    own_marker,
    recipient_ids,
    recipients,
    shared_key,
)


def test_recipient_ids_are_the_ids_the_header_lists_and_none_without_it() -> None:
    listed = recipients(["c-2", "c-1", "c\u00e9"])
    assert recipient_ids([("rb.mac", b"x"), (RECIPIENTS_HEADER, listed)]) == [
        "c-1",
        "c-2",
        "c\u00e9",
    ]
    assert recipient_ids({RECIPIENTS_HEADER: "\x00a\x00"}) == ["a"]
    assert recipient_ids([(RECIPIENTS_HEADER, b""), (RECIPIENTS_HEADER, b"\x00b\x00")]) == []
    assert recipient_ids([("rb.mac", b"x")]) is None
    assert recipient_ids(None) is None


def test_recipient_ids_name_exactly_the_clients_a_shared_record_is_addressed_to() -> None:
    headers = [(RECIPIENTS_HEADER, recipients(["a", "ab", "b"]))]
    key = shared_key("r|all")
    for client_id in ("a", "ab", "b", "abc", "c"):
        assert addressed_to(key, headers, client_id.encode(), own_marker(client_id)) == (
            client_id in (recipient_ids(headers) or [])
        )
