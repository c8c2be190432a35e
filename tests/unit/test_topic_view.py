"""What ``regionbus topic tail`` prints of a record, and what one client's view of its
shared queue partition keeps (docs/wire-format.md): records addressed to it by key or by
``rb.to``, its own changes left out of shared records, each event once."""

from __future__ import annotations

from regionbus.broker.cli_topics import ClientView, record_json
from regionbus.schemas.addressing import RECIPIENTS_HEADER, recipients, shared_key
from regionbus.schemas.eventid import EventID
from regionbus.schemas.messages import Event, EventKind, Marker, Operation, OperationKind


def _event(key: str, sequence: int, originator: str = "writer", **fields: object) -> Event:
    values: dict[str, object] = {"value": b'{"n":1}', "serializer": "json", **fields}
    return Event(
        event_id=EventID(f"{originator}.1a2b3c", 1, sequence, 6),
        kind=EventKind.CREATE,
        region="r",
        key=key,
        version=1,
        timestamp_ms=1767225600000,
        originator=originator,
        **values,  # type: ignore[arg-type]
    )


def test_a_record_is_printed_with_its_value_decoded_by_its_serializer() -> None:
    assert record_json(_event("a", 0)) == {
        "type": "Event",
        "event_id": {"member": "writer.1a2b3c", "thread": 1, "sequence": 0, "bucket": 6},
        "kind": "CREATE",
        "region": "r",
        "key": "a",
        "value": {"n": 1},
        "serializer": "json",
        "version": 1,
        "timestamp_ms": 1767225600000,
        "originator": "writer",
        "possible_duplicate": False,
        "callback_argument": None,
        "origin_site_id": 0,
        "sites_reached": [],
        "expiration": False,
        "load": False,
    }
    raw = record_json(_event("b", 1, value=b"\x00\xff", serializer="bytes"))
    assert (raw["value"], raw["value_encoding"]) == ("AP8=", "base64")
    op = record_json(
        Operation(
            request_id=7,
            client_id="java-1",
            kind=OperationKind.DESTROY,
            region="r",
            timestamp_ms=1,
            event_id=EventID("java-1.x", 1, 3, 6),
            key="a",
        )
    )
    assert (op["type"], op["kind"], op["event_id"]["sequence"], op["value"]) == (
        "Operation",
        "DESTROY",
        3,
        None,
    )


def test_a_client_view_keeps_its_records_once_and_leaves_out_its_own_shared_changes() -> None:
    view = ClientView("desk-1")
    listed = [(RECIPIENTS_HEADER, recipients(["desk-1", "desk-2"]))]
    others = [(RECIPIENTS_HEADER, recipients(["desk-2", "desk-3"]))]
    group = shared_key("r|True|None")
    marker = Marker(client_id="desk-1", timestamp_ms=1, bucket=6)
    first, second = _event("a", 0), _event("b", 1)
    mine = _event("c", 0, originator="desk-1")

    assert view.take(b"desk-1", None, [first, marker]) == [first, marker]
    assert view.take(group, listed, [first, second, mine]) == [second], "first: seen"
    assert view.take(group, others, [_event("d", 2)]) == []
    assert view.take(b"desk-2", None, [_event("e", 3)]) == []
    assert view.take(b"desk-1", None, [mine]) == [mine], "its own record: the servers' choice"
    assert view.duplicates == 1
