"""Wire records to and from the dicts fastavro writes and reads, per record class.

The other half of :mod:`regionbus.schemas.codec` (which frames and checks what these give):
each NamedTuple of :mod:`regionbus.schemas.messages` has a function to the Avro dict of its
``*.avsc`` and one back. An ``int`` field is range-checked both ways (fastavro does not).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from regionbus.schemas.eventid import EventID
from regionbus.schemas.messages import (
    Control,
    ControlKind,
    CqEvent,
    CqMatch,
    CqSpec,
    Entry,
    Event,
    EventKind,
    FunctionSpec,
    InterestKind,
    InterestResultPolicy,
    InterestSpec,
    Marker,
    Operation,
    OperationKind,
    QuerySpec,
    Reply,
)

_EVENT_KINDS: Final = {k.value: k for k in EventKind}
_OPERATION_KINDS: Final = {k.value: k for k in OperationKind}
_INT_MIN: Final = -(2**31)
_INT_MAX: Final = 2**31 - 1


def _int32(value: int, field: str) -> int:
    """``value`` if it fits an Avro ``int``, else ValueError.

    fastavro reads and writes an ``int`` as a variable-length long without a range check, so
    without this a garbled varint decodes into a bucket or site id no peer (nor Spark's
    32-bit column) can hold.
    """
    if not _INT_MIN <= value <= _INT_MAX:
        raise ValueError(f"{field}={value} does not fit an Avro int")
    return value


def _eid_to(e: EventID) -> dict[str, Any]:
    return {
        "member": e.member,
        "thread": e.thread,
        "sequence": e.sequence,
        "bucket": _int32(e.bucket, "bucket"),
    }


def _eid_from(d: dict[str, Any]) -> EventID:
    return EventID(d["member"], d["thread"], d["sequence"], _int32(d["bucket"], "bucket"))


def _interest_to(s: InterestSpec) -> dict[str, Any]:
    return {
        "kind": s.kind.value,
        "keys": list(s.keys),
        "regex": s.regex,
        "policy": s.policy.value,
        "durable": s.durable,
        "receive_values": s.receive_values,
    }


def _interest_from(d: dict[str, Any]) -> InterestSpec:
    return InterestSpec(
        kind=InterestKind(d["kind"]),
        keys=tuple(d["keys"]),
        regex=d["regex"],
        policy=InterestResultPolicy(d["policy"]),
        durable=d["durable"],
        receive_values=d["receive_values"],
    )


def _cq_spec_to(c: CqSpec) -> dict[str, Any]:
    return {
        "name": c.name,
        "query": c.query,
        "durable": c.durable,
        "initial_results": c.initial_results,
        "value_schema": c.value_schema,
    }


def _cq_spec_from(d: dict[str, Any]) -> CqSpec:
    return CqSpec(d["name"], d["query"], d["durable"], d["initial_results"], d["value_schema"])


def _query_spec_to(q: QuerySpec) -> dict[str, Any]:
    return {
        "query": q.query,
        "parameters": [_parameter_to(p) for p in q.parameters],
        "value_schema": q.value_schema,
    }


def _parameter_to(value: Any) -> Any:
    # A tuple would read to fastavro as a union's (type name, value): collections go as lists.
    return list(value) if isinstance(value, list | tuple | set | frozenset) else value


def _query_spec_from(d: dict[str, Any]) -> QuerySpec:
    return QuerySpec(d["query"], tuple(d["parameters"]), d["value_schema"])


def _function_spec_to(f: FunctionSpec) -> dict[str, Any]:
    return {
        "function_id": f.function_id,
        "execution_id": f.execution_id,
        "arguments": f.arguments,
        "arguments_serializer": f.arguments_serializer,
        "filter": list(f.filter),
        "re_execute": f.re_execute,
    }


def _function_spec_from(d: dict[str, Any]) -> FunctionSpec:
    return FunctionSpec(
        d["function_id"],
        d["execution_id"],
        d["arguments"],
        d["arguments_serializer"],
        tuple(d["filter"]),
        d["re_execute"],
    )


def _operation_to(o: Operation) -> dict[str, Any]:
    return {
        "request_id": o.request_id,
        "client_id": o.client_id,
        "event_id": _eid_to(o.event_id) if o.event_id is not None else None,
        "kind": o.kind.value,
        "region": o.region,
        "key": o.key,
        "value": o.value,
        "serializer": o.serializer,
        "callback_argument": o.callback_argument,
        "timestamp_ms": o.timestamp_ms,
        "possible_duplicate": o.possible_duplicate,
        "interest": _interest_to(o.interest) if o.interest is not None else None,
        "origin_site_id": _int32(o.origin_site_id, "origin_site_id"),
        "sites_reached": [_int32(s, "sites_reached") for s in o.sites_reached],
        "keep_alive": o.keep_alive,
        "cq": _cq_spec_to(o.cq) if o.cq is not None else None,
        "kafka_principal": o.kafka_principal,
        "expected_value": o.expected_value,
        "query": _query_spec_to(o.query) if o.query is not None else None,
        "function": _function_spec_to(o.function) if o.function is not None else None,
    }


def _operation_from(d: dict[str, Any]) -> Operation:
    return Operation(
        request_id=d["request_id"],
        client_id=d["client_id"],
        event_id=_eid_from(d["event_id"]) if d["event_id"] is not None else None,
        kind=_OPERATION_KINDS[d["kind"]],
        region=d["region"],
        key=d["key"],
        value=d["value"],
        serializer=d["serializer"],
        callback_argument=d["callback_argument"],
        timestamp_ms=d["timestamp_ms"],
        possible_duplicate=d["possible_duplicate"],
        interest=_interest_from(d["interest"]) if d["interest"] is not None else None,
        origin_site_id=_int32(d["origin_site_id"], "origin_site_id"),
        sites_reached=tuple(_int32(s, "sites_reached") for s in d["sites_reached"]),
        keep_alive=d["keep_alive"],
        cq=_cq_spec_from(d["cq"]) if d["cq"] is not None else None,
        kafka_principal=d["kafka_principal"],
        expected_value=d["expected_value"],
        query=_query_spec_from(d["query"]) if d["query"] is not None else None,
        function=_function_spec_from(d["function"]) if d["function"] is not None else None,
    )


def _event_to(e: Event) -> dict[str, Any]:
    return {
        "event_id": _eid_to(e.event_id),
        "kind": e.kind.value,
        "region": e.region,
        "key": e.key,
        "value": e.value,
        "serializer": e.serializer,
        "version": e.version,
        "timestamp_ms": e.timestamp_ms,
        "originator": e.originator,
        "possible_duplicate": e.possible_duplicate,
        "callback_argument": e.callback_argument,
        "origin_site_id": _int32(e.origin_site_id, "origin_site_id"),
        "sites_reached": [_int32(s, "sites_reached") for s in e.sites_reached],
        "expiration": e.expiration,
        "load": e.load,
    }


def _event_from(d: dict[str, Any]) -> Event:
    return Event(
        event_id=_eid_from(d["event_id"]),
        kind=_EVENT_KINDS[d["kind"]],
        region=d["region"],
        key=d["key"],
        value=d["value"],
        serializer=d["serializer"],
        version=d["version"],
        timestamp_ms=d["timestamp_ms"],
        originator=d["originator"],
        possible_duplicate=d["possible_duplicate"],
        callback_argument=d["callback_argument"],
        origin_site_id=_int32(d["origin_site_id"], "origin_site_id"),
        sites_reached=tuple(_int32(s, "sites_reached") for s in d["sites_reached"]),
        expiration=d["expiration"],
        load=d["load"],
    )


def _reply_to(r: Reply) -> dict[str, Any]:
    return {
        "request_id": r.request_id,
        "bucket": _int32(r.bucket, "bucket"),
        "ok": r.ok,
        "error_type": r.error_type,
        "error_message": r.error_message,
        "event_kind": r.event_kind.value if r.event_kind is not None else None,
        "duplicate": r.duplicate,
        "found": r.found,
        "version": r.version,
        "value": r.value,
        "serializer": r.serializer,
        "entries": [
            {"key": e.key, "value": e.value, "serializer": e.serializer, "version": e.version}
            for e in r.entries
        ],
        "more": r.more,
        "client_state": r.client_state,
        "subscription_conflation": r.subscription_conflation,
        "cq_names": list(r.cq_names),
        "max_value_size_bytes": _int32(r.max_value_size_bytes, "max_value_size_bytes"),
        "entry_count": r.entry_count,
        "function_state": _int32(r.function_state, "function_state"),
    }


def _reply_from(d: dict[str, Any]) -> Reply:
    return Reply(
        request_id=d["request_id"],
        bucket=_int32(d["bucket"], "bucket"),
        ok=d["ok"],
        error_type=d["error_type"],
        error_message=d["error_message"],
        event_kind=_EVENT_KINDS[d["event_kind"]] if d["event_kind"] is not None else None,
        duplicate=d["duplicate"],
        found=d["found"],
        version=d["version"],
        value=d["value"],
        serializer=d["serializer"],
        entries=tuple(
            Entry(key=e["key"], version=e["version"], value=e["value"], serializer=e["serializer"])
            for e in d["entries"]
        ),
        more=d["more"],
        client_state=d["client_state"],
        subscription_conflation=d["subscription_conflation"],
        cq_names=tuple(d["cq_names"]),
        max_value_size_bytes=_int32(d["max_value_size_bytes"], "max_value_size_bytes"),
        entry_count=d["entry_count"],
        function_state=_int32(d["function_state"], "function_state"),
    )


def _control_to(c: Control) -> dict[str, Any]:
    return {
        "kind": c.kind.value,
        "client_id": c.client_id,
        "durable_client_id": c.durable_client_id,
        "durable_client_timeout_s": _int32(c.durable_client_timeout_s, "durable_client_timeout_s"),
        "keep_alive": c.keep_alive,
        "timestamp_ms": c.timestamp_ms,
        "request_id": c.request_id,
        "connection_id": c.connection_id,
        "kafka_principal": c.kafka_principal,
    }


def _control_from(d: dict[str, Any]) -> Control:
    return Control(
        kind=ControlKind(d["kind"]),
        client_id=d["client_id"],
        durable_client_id=d["durable_client_id"],
        durable_client_timeout_s=_int32(d["durable_client_timeout_s"], "durable_client_timeout_s"),
        keep_alive=d["keep_alive"],
        timestamp_ms=d["timestamp_ms"],
        request_id=d["request_id"],
        connection_id=d["connection_id"],
        kafka_principal=d["kafka_principal"],
    )


def _marker_to(m: Marker) -> dict[str, Any]:
    return {
        "client_id": m.client_id,
        "timestamp_ms": m.timestamp_ms,
        "bucket": _int32(m.bucket, "bucket"),
        "connection_id": m.connection_id,
    }


def _marker_from(d: dict[str, Any]) -> Marker:
    return Marker(
        client_id=d["client_id"],
        timestamp_ms=d["timestamp_ms"],
        bucket=_int32(d["bucket"], "bucket"),
        connection_id=d["connection_id"],
    )


def _cq_event_to(c: CqEvent) -> dict[str, Any]:
    return {
        "event": _event_to(c.event),
        "cqs": [
            {
                "name": m.name,
                "query_operation": m.query_operation.value if m.query_operation else None,
                "error": m.error,
            }
            for m in c.cqs
        ],
    }


def _cq_event_from(d: dict[str, Any]) -> CqEvent:
    return CqEvent(
        _event_from(d["event"]),
        tuple(
            CqMatch(
                m["name"],
                _EVENT_KINDS[m["query_operation"]] if m["query_operation"] is not None else None,
                m["error"],
            )
            for m in d["cqs"]
        ),
    )


TO_AVRO: Final[dict[type, Callable[[Any], dict[str, Any]]]] = {
    Operation: _operation_to,
    Event: _event_to,
    Reply: _reply_to,
    Control: _control_to,
    Marker: _marker_to,
    CqEvent: _cq_event_to,
}
"""Each record class's function to its Avro dict (``ValueError`` when an int is out of range)."""
FROM_AVRO: Final[dict[type, Callable[[dict[str, Any]], Any]]] = {
    Operation: _operation_from,
    Event: _event_from,
    Reply: _reply_from,
    Control: _control_from,
    Marker: _marker_from,
    CqEvent: _cq_event_from,
}
"""Each record class's function from its Avro dict (``ValueError`` when an int is out of
range, ``KeyError`` for an unknown enum symbol)."""


__all__ = ["FROM_AVRO", "TO_AVRO"]
