"""The wire records of regionbus, as NamedTuples mirroring the ``*.avsc`` files.

NamedTuples rather than frozen dataclasses: equally immutable, and four times cheaper to
build, which matters on the event path (every subscriber builds one per event).

Every record travels Avro-encoded by :mod:`regionbus.schemas.codec`. Field meanings are in the
schema docs; times are milliseconds since the Unix epoch, UTC.
"""

from __future__ import annotations

import enum
from typing import Any, NamedTuple

from regionbus.schemas.eventid import EventID


class OperationKind(enum.Enum):
    """What a client asks of the server (docs/behaviour.md §1, §3); the ``EXPIRE_*`` kinds are what
    a bucket's primary asks of itself. What each kind is (its scope, whether it is a change,
    the permission it needs, ...) is its row in `regionbus.schemas.operation_kinds`."""

    PUT = "PUT"
    DESTROY = "DESTROY"
    INVALIDATE = "INVALIDATE"
    GET = "GET"
    CLEAR = "CLEAR"
    DESTROY_REGION = "DESTROY_REGION"
    REGISTER_INTEREST = "REGISTER_INTEREST"
    UNREGISTER_INTEREST = "UNREGISTER_INTEREST"
    KEYS = "KEYS"
    READY_FOR_EVENTS = "READY_FOR_EVENTS"
    DISCONNECT = "DISCONNECT"
    INVALIDATE_REGION = "INVALIDATE_REGION"
    EXPIRE_DESTROY = "EXPIRE_DESTROY"
    """An entry expiration (Geode ``Operation.EXPIRE_DESTROY``): produced by a bucket's
    primary to its own partition, never by a client (:mod:`regionbus.broker.expiration`)."""
    EXPIRE_INVALIDATE = "EXPIRE_INVALIDATE"
    """An entry expiration that invalidates (Geode ``Operation.EXPIRE_INVALIDATE``)."""
    EXECUTE_CQ = "EXECUTE_CQ"
    """Register (or resume) a continuous query in a bucket, answering with the bucket's
    entries in its result set when asked (Geode ``ExecuteCQ61``)."""
    STOP_CQ = "STOP_CQ"
    """Keep a continuous query, deliver nothing of it (Geode ``StopCQ``)."""
    CLOSE_CQ = "CLOSE_CQ"
    """Remove a continuous query (Geode ``CloseCQ``)."""
    GET_DURABLE_CQS = "GET_DURABLE_CQS"
    """The names of the client's durable CQs the servers hold (Geode ``GetDurableCQs``)."""
    PUT_IF_ABSENT = "PUT_IF_ABSENT"
    """Create the entry only when the key has none, an invalid one included (Geode
    ``Region.putIfAbsent``, ``Operation.PUT_IF_ABSENT``; ``RegionMapPut``'s create
    precondition); else change nothing and answer the current value."""
    REPLACE = "REPLACE"
    """Update the entry only when it exists and, with ``expected_value``, holds that value
    (Geode ``Region.replace(k, v)`` and ``replace(k, old, new)``, ``Operation.REPLACE``)."""
    REMOVE = "REMOVE"
    """Destroy the entry only when it holds ``expected_value`` (null: when it is invalid)
    (Geode ``Region.remove(k, v)``, ``Operation.REMOVE``)."""
    CONTAINS_KEY = "CONTAINS_KEY"
    """Whether the server holds the key, valid or invalid (Geode
    ``Region.containsKeyOnServer``)."""
    SIZE = "SIZE"
    """How many entries the region has in the bucket (Geode ``Region.sizeOnServer``)."""
    LOAD_CREATE = "LOAD_CREATE"
    """Create an entry with the value a server's ``CacheLoader`` loaded on a get's miss,
    only when the key has none (Geode ``Operation.NET_LOAD_CREATE``): produced by a
    bucket's primary to its own partition, never by a client (:mod:`regionbus.broker.loading`)."""
    QUERY = "QUERY"
    """Run a one-shot OQL query over the region's entries in the bucket and answer the
    ordered, limited entries it selects (Geode ``QueryService.newQuery(oql).execute``, one
    bucket's part of ``PartitionedRegionQueryEvaluator``)."""
    EXECUTE_REGION_FUNCTION = "EXECUTE_REGION_FUNCTION"
    """Run a function registered on the servers over the bucket's part of the region, on
    its primary (Geode ``ExecuteRegionFunction``, ``FunctionService.onRegion(r).execute``;
    :mod:`regionbus.broker.functions`)."""
    EXECUTE_FUNCTION = "EXECUTE_FUNCTION"
    """Run a function registered on the servers once on each server (Geode
    ``ExecuteFunction``, ``FunctionService.onServers``): sent to every bucket, run by a
    server at the first copy of the execution it reads, the other copies answered empty."""
    GET_FUNCTION_ATTRIBUTES = "GET_FUNCTION_ATTRIBUTES"
    """A registered function's ``has_result``, ``is_ha`` and ``optimize_for_write``, which a
    client executing it by id needs first (Geode ``GetFunctionAttribute``)."""
    LOCAL_DESTROY = "LOCAL_DESTROY"
    """Destroy an entry in the store and tell no client, CQ or gateway (Geode
    ``Region.localDestroy`` on a server, ``Operation.LOCAL_DESTROY``): produced by a
    server-side function to the key's partition, never by a client."""
    LOCAL_INVALIDATE = "LOCAL_INVALIDATE"
    """Invalidate an entry in the store and tell no client, CQ or gateway (Geode
    ``Region.localInvalidate``, ``Operation.LOCAL_INVALIDATE``); as ``LOCAL_DESTROY``."""


class EventKind(enum.Enum):
    """What an applied change is, as seen by subscribers (docs/behaviour.md §3 table)."""

    CREATE = "CREATE"
    UPDATE = "UPDATE"
    INVALIDATE = "INVALIDATE"
    DESTROY = "DESTROY"
    REGION_CLEAR = "REGION_CLEAR"
    REGION_DESTROY = "REGION_DESTROY"
    REGION_INVALIDATE = "REGION_INVALIDATE"
    """Every entry of the region lost its value; server listeners hear it, clients never
    (docs/behaviour.md §3)."""

    @property
    def is_region_event(self) -> bool:
        """True for events about the whole region (clear, destroy, invalidate)."""
        return self in (
            EventKind.REGION_CLEAR,
            EventKind.REGION_DESTROY,
            EventKind.REGION_INVALIDATE,
        )


class InterestKind(enum.Enum):
    """The shape of an interest registration."""

    KEYS = "KEYS"
    ALL_KEYS = "ALL_KEYS"
    REGEX = "REGEX"


class InterestResultPolicy(enum.Enum):
    """What the registration bulk-loads before it returns (Geode ``InterestResultPolicy``).

    Geode default: ``KEYS_VALUES``.
    """

    KEYS_VALUES = "KEYS_VALUES"
    KEYS = "KEYS"
    NONE = "NONE"


class ControlKind(enum.Enum):
    """Client lifecycle messages on ``{ns}.control``."""

    CONNECT = "CONNECT"
    PING = "PING"
    CLOSE = "CLOSE"


class InterestSpec(NamedTuple):
    """One registration: keys, all keys, or a regex, with its policy and flags.

    ``regex`` is matched against the whole key (Java ``Matcher.matches()`` semantics, as in
    Geode), with Python ``re`` syntax.
    """

    kind: InterestKind
    keys: tuple[str, ...] = ()
    regex: str | None = None
    policy: InterestResultPolicy = InterestResultPolicy.KEYS_VALUES
    durable: bool = False
    receive_values: bool = True


class CqSpec(NamedTuple):
    """A client's continuous query as it travels to the servers (Geode ``newCq``).

    ``value_schema`` is the Avro schema (JSON text) of the region's values when its
    serializer is ``avro:<name>``, so the servers can read their attributes.
    """

    name: str
    query: str
    durable: bool = False
    initial_results: bool = False
    value_schema: str | None = None


class QuerySpec(NamedTuple):
    """A one-shot OQL query as it travels to every bucket's primary (Geode
    ``Query.execute(params)``).

    ``parameters`` are the values of ``$1``, ``$2``, ...: None, bool, int, float, str, or a
    list of those (``IN $n``). ``value_schema`` is the Avro schema (JSON text) of the
    region's values when its serializer is ``avro:<name>``, so the servers can read their
    attributes.
    """

    query: str
    parameters: tuple[Any, ...] = ()
    value_schema: str | None = None


class FunctionSpec(NamedTuple):
    """A function execution as it travels to the servers (Geode's ``ExecuteRegionFunction``
    and ``ExecuteFunction`` messages).

    Attributes:
        function_id: The id the function is registered under on the servers.
        execution_id: Drawn at random by the client for one ``execute`` call, kept by its
            re-executions: a server runs an ``EXECUTE_FUNCTION`` once per execution.
        arguments: The arguments, encoded (Geode ``Execution.setArguments``), or None.
        arguments_serializer: Their serializer's name (``json`` or ``bytes``).
        filter: The keys of the filter in this bucket (Geode ``Execution.withFilter``).
        re_execute: A re-execution after a failure of an ``is_ha`` function (Geode's
            ``isReExecute``): the function's ``is_possible_duplicate``.
    """

    function_id: str
    execution_id: int = 0
    arguments: bytes | None = None
    arguments_serializer: str | None = None
    filter: tuple[str, ...] = ()
    re_execute: bool = False


class Entry(NamedTuple):
    """One entry in a bulk-load or keys reply. ``value`` None means invalid or keys-only."""

    key: str
    version: int
    value: bytes | None = None
    serializer: str | None = None


class Operation(NamedTuple):
    """A request on ``{ns}.ops``, in the partition of its bucket."""

    request_id: int
    client_id: str
    kind: OperationKind
    region: str
    timestamp_ms: int
    event_id: EventID | None = None
    key: str | None = None
    value: bytes | None = None
    serializer: str | None = None
    callback_argument: bytes | None = None
    possible_duplicate: bool = False
    interest: InterestSpec | None = None
    origin_site_id: int = 0
    sites_reached: tuple[int, ...] = ()
    keep_alive: bool = False
    cq: CqSpec | None = None
    kafka_principal: str | None = None
    expected_value: bytes | None = None
    query: QuerySpec | None = None
    function: FunctionSpec | None = None


class Event(NamedTuple):
    """An applied change, routed to subscription queues and appended to ``{ns}.events``."""

    event_id: EventID
    kind: EventKind
    region: str
    version: int
    timestamp_ms: int
    originator: str
    key: str | None = None
    value: bytes | None = None
    serializer: str | None = None
    possible_duplicate: bool = False
    callback_argument: bytes | None = None
    origin_site_id: int = 0
    sites_reached: tuple[int, ...] = ()
    expiration: bool = False
    load: bool = False


class CqMatch(NamedTuple):
    """One CQ of a client, and what a change did to its result set.

    Attributes:
        name: The CQ's name.
        query_operation: CREATE, UPDATE, DESTROY, REGION_CLEAR or REGION_DESTROY (docs/behaviour.md
            §9); None when the CQ could not be evaluated on the change (``error`` says why).
        error: Why the CQ could not be evaluated, or None.
    """

    name: str
    query_operation: EventKind | None
    error: str | None = None


class CqEvent(NamedTuple):
    """An applied change as it reaches a client's continuous queries: the change, and what
    it did to each of the client's CQs it concerns. It travels in the client's
    subscription queue beside the interest events, with the change's EventID."""

    event: Event
    cqs: tuple[CqMatch, ...]


CLIENT_NEW = "NEW"
"""``Reply.client_state`` of a CONNECT: the servers had no registration of this client."""
CLIENT_RECONNECTED = "RECONNECTED"
"""``Reply.client_state`` of a CONNECT: a durable client's queue and durable interest were
kept while it was away."""
CLIENT_EVENTS_LOST = "EVENTS_LOST"
"""``ClientCache.client_state`` of a durable client the servers answered ``RECONNECTED``
whose queue no longer holds everything queued since its last ack: the queue topic deleted
records it had not read (retention, or an operator's delete). The events still there are
replayed before the marker; the client should reload what it caches (never on the wire)."""
CLIENT_UNKNOWN = "UNKNOWN"
"""``Reply.client_state`` of a PING: the servers no longer know this connection."""
CLIENT_TAKEN = "TAKEN"
"""``Reply.client_state`` of a PING: another live connection holds this client id now (this
one was silent too long and was dropped); the topics are that connection's."""


class Reply(NamedTuple):
    """The server's answer to one operation (one per bucket for scattered requests)."""

    request_id: int
    bucket: int
    ok: bool
    error_type: str | None = None
    error_message: str | None = None
    event_kind: EventKind | None = None
    duplicate: bool = False
    found: bool = False
    version: int | None = None
    value: bytes | None = None
    serializer: str | None = None
    entries: tuple[Entry, ...] = ()
    more: bool = False
    client_state: str | None = None
    subscription_conflation: bool = False
    cq_names: tuple[str, ...] = ()
    max_value_size_bytes: int = 0
    entry_count: int = 0
    function_state: int = 0


class Control(NamedTuple):
    """A client lifecycle message on ``{ns}.control``."""

    kind: ControlKind
    client_id: str
    timestamp_ms: int
    durable_client_id: str | None = None
    durable_client_timeout_s: int = 300
    keep_alive: bool = False
    request_id: int = 0
    connection_id: str | None = None
    kafka_principal: str | None = None


class Marker(NamedTuple):
    """The durable-replay marker a server writes into a client's subscription queue."""

    client_id: str
    timestamp_ms: int
    bucket: int = -1
    connection_id: str | None = None


Message = Operation | Event | Reply | Control | Marker | CqEvent
