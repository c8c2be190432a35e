"""The one exception tree of regionbus.

Every error the library raises derives from :class:`RegionBusError`. Each carries a
``retriable`` flag (aiokafka's model): a retriable error may succeed if the same call is
made again unchanged (a timeout, a broker restart); a non-retriable one will not (a bad
regex, a writer that vetoed the change).

The server reports failures to clients as a reply with ``error_type`` set to one of the
class names below; :func:`error_from_wire` turns that back into the same class.
"""

from __future__ import annotations

from typing import Any, ClassVar


class RegionBusError(Exception):
    """Root of every regionbus error.

    Attributes:
        retriable: True when repeating the same call unchanged may succeed.
        message_ref: The message (operation, event, raw bytes) the error is about, when
            there is one; kept so a caller can inspect or dead-letter it.
    """

    retriable: ClassVar[bool] = False

    def __init__(self, message: str, *, message_ref: Any = None) -> None:
        super().__init__(message)
        self.message_ref = message_ref


# --- not retriable -------------------------------------------------------------------


class ConfigurationError(RegionBusError):
    """A setting is missing, malformed or inconsistent (raised at start-up)."""


class ExtraNotInstalledError(ConfigurationError, ImportError):
    """A feature needs an extra of the package that is not installed, e.g. write-behind
    needs ``sql`` (SQLAlchemy): ``pip install 'regionbus[sql]'``. Also an ``ImportError``,
    as it is raised where the feature's module is imported.

    Attributes:
        extra: The extra to install.
        missing: The modules that are not installed.
    """

    def __init__(self, feature: str, extra: str, missing: tuple[str, ...]) -> None:
        super().__init__(
            f"{feature} needs the {extra} extra: pip install 'regionbus[{extra}]' "
            f"({', '.join(missing)} not installed)"
        )
        self.extra = extra
        self.missing = missing


class SerializationError(RegionBusError):
    """A value or wire message could not be encoded or decoded."""


class MessageDecodeError(SerializationError):
    """Bytes read from a topic are not a valid regionbus message.

    ``message_ref`` holds the raw bytes.
    """


class RegionNotFoundError(RegionBusError):
    """The region is not defined on the server (Geode: ``RegionDestroyedException``)."""


class EntryNotFoundError(RegionBusError):
    """The entry does not exist on the server (Geode: ``EntryNotFoundException``)."""


class EntryExistsError(RegionBusError):
    """``Region.create`` found an entry for the key on the server, valid or invalid
    (Geode: ``EntryExistsException``). Nothing was changed.

    Attributes:
        old_value: The value the server holds (None for an invalid entry), as Geode's
            ``EntryExistsException.getOldValue``.
    """

    def __init__(self, message: str, *, old_value: Any = None) -> None:
        super().__init__(message)
        self.old_value = old_value


class CacheWriterError(RegionBusError):
    """A client or server ``CacheWriter`` aborted the operation.

    Geode: ``CacheWriterException``. Nothing was changed anywhere.
    """


class CacheLoaderError(RegionBusError):
    """A server's ``CacheLoader`` failed, took longer than ``loader_timeout_ms``, or the
    server had ``max_pending_loads`` loads running already, so a get's miss was not loaded.

    Geode: ``CacheLoaderException`` (and ``TimeoutException`` for a load past the
    region's search timeout). Nothing was created.
    """


class InvalidInterestError(RegionBusError):
    """An interest registration is malformed, e.g. the regex does not compile."""


class ValueTooLargeError(RegionBusError):
    """The encoded value exceeds the server's ``max_value_size_bytes``; nothing was applied."""


class UnconnectedError(RegionBusError):
    """The client is not connected, so an update cannot be sent.

    Geode: ``UnconnectedException``. Reads of the local cache still work.
    """


class DuplicateClientError(RegionBusError):
    """Another live connection already uses this client id; this one was refused.

    A client id names the client's queue and reply topics, so two live processes sharing
    one would read each other's replies and events, and the first to close would delete
    the topics under the other. Geode refuses a second durable client id while the first
    is connected (``DuplicateDurableClient``); regionbus applies the same rule to every
    client id, durable or not. A connection counts as live until it has been silent for
    the servers' ``maximum_time_between_pings_ms``, so a process restarted right after a
    crash of the previous one may be refused for that long.
    """


class DuplicateDurableClientError(DuplicateClientError):
    """Another live client already uses this durable client id (docs/behaviour.md §5; Geode
    ``DuplicateDurableClient``). See :class:`DuplicateClientError` for when a connection
    counts as live.
    """


class BulkOperationError(RegionBusError):
    """Not every entry of a ``put_all`` / ``remove_all`` is known applied.

    Geode: ``PutAllPartialResultException``. Each entry is in exactly one of three sets:

    Attributes:
        failures: ``{key: RegionBusError}`` of the entries known not applied: the server
            refused them (a writer, a missing region...), or they were never sent (the
            call stopped sending after a timeout).
        unknown: ``{key: RegionBusError}`` of the entries whose outcome is unknown: sent,
            but no reply came within ``read_timeout_ms`` (they may have been applied, or
            may be later).
        applied: The keys known applied (their reply came; a duplicate counts).
    """

    def __init__(
        self,
        message: str,
        failures: dict[str, RegionBusError],
        unknown: dict[str, RegionBusError] | None = None,
        applied: tuple[str, ...] = (),
    ) -> None:
        super().__init__(message, message_ref=failures)
        self.failures = failures
        self.unknown = unknown or {}
        self.applied = applied


class AuthenticationError(RegionBusError):
    """A request was refused because its sender could not be authenticated.

    Geode: ``AuthenticationFailedException``. The signature is missing or does not match,
    the principal is unknown, the timestamp is outside the servers' allowed skew, or the
    message is a replay. Nothing was applied.
    """


class NotAuthorizedError(RegionBusError):
    """The authenticated principal lacks the permission the request needs.

    Geode: ``NotAuthorizedException`` (e.g. ``DATA:WRITE:flights`` for a put on
    ``flights``). Nothing was applied.
    """


class KafkaAuthorizationError(NotAuthorizedError):
    """Kafka refused a request because the process's Kafka principal has no ACL for it.

    Kafka's ``TOPIC_AUTHORIZATION_FAILED``, ``GROUP_AUTHORIZATION_FAILED`` or
    ``CLUSTER_AUTHORIZATION_FAILED``: e.g. a client reading another client's queue topic,
    or producing to a topic only the servers write. Granting the ACL (``regionbus
    kafka-acls``) is the fix; repeating the call unchanged is not.

    Attributes:
        resource: What was refused, e.g. ``"topic regionbus.queue.desk-1"`` or
            ``"group regionbus.client.desk-1"``.
        kafka_error: Kafka's error name, e.g. ``"TOPIC_AUTHORIZATION_FAILED"``.
    """

    def __init__(
        self, message: str, *, resource: str, kafka_error: str, message_ref: Any = None
    ) -> None:
        super().__init__(message, message_ref=message_ref)
        self.resource = resource
        self.kafka_error = kafka_error


class CqError(RegionBusError):
    """A continuous query could not be created, run, stopped or closed (Geode
    ``CqException``)."""


class CqInvalidError(CqError):
    """A query is outside Geode's CQ subset of OQL, or does not parse (Geode
    ``QueryInvalidException``, and the ``UnsupportedOperationException`` of
    ``CqQueryImpl.validateCq``). Raised by ``QueryService.new_cq`` before anything is sent.

    Attributes:
        rule: The rule the query breaks, e.g. ``"projection"``, ``"distinct"``,
            ``"one-iterator"``, ``"one-region"``, ``"order-by"``, ``"limit"``,
            ``"region-path"``, ``"where-region"``, ``"bind-parameter"``, ``"syntax"``
            (see :data:`regionbus.schemas.cq.rules.CQ_RULES`).
        query: The query text.
    """

    def __init__(self, message: str, *, rule: str = "syntax", query: str = "") -> None:
        super().__init__(message, message_ref=query)
        self.rule = rule
        self.query = query


class CqExistsError(CqError):
    """This client already has a CQ of that name (Geode ``CqExistsException``)."""


class CqClosedError(CqError):
    """The CQ is closed: it can no longer be executed or stopped (Geode
    ``CqClosedException``)."""


class CqStateError(CqError):
    """The CQ is not in a state the call applies to: executing a running CQ, stopping one
    that is not running (Geode ``IllegalStateException``: "CQ is in running state",
    "CQ is not in running state, stop CQ does not apply")."""


class CqEvaluationError(CqError):
    """A CQ's predicate could not be evaluated on a value: a relational comparison of
    values of different types (Geode ``TypeMismatchException``), a value that does not
    decode. The server reports it to the CQ's listeners' ``on_error`` instead of an event."""


class QueryError(RegionBusError):
    """A one-shot OQL query could not be run (Geode ``QueryException``, the root of
    ``org.apache.geode.cache.query``'s checked exceptions)."""


class QueryInvalidError(QueryError):
    """A query does not parse, or is outside the OQL regionbus runs (Geode
    ``QueryInvalidException``). Raised by ``QueryService.new_query`` before anything is
    sent, or by ``Query.execute`` for parameters that do not fit the query.

    Attributes:
        rule: The rule the query breaks (see :data:`regionbus.schemas.query.rules.QUERY_RULES`;
            ``"syntax"`` when it does not parse). Empty when the servers refused it: their
            reply carries the message only.
        query: The query text.
    """

    def __init__(self, message: str, *, rule: str = "", query: str = "") -> None:
        super().__init__(message, message_ref=query)
        self.rule = rule
        self.query = query


class QueryExecutionTimeoutError(QueryError):
    """A bucket's primary spent its ``query_max_execution_time_ms`` on the query and
    stopped it (Geode ``QueryExecutionTimeoutException``, raised past
    ``gemfire.Cache.MAX_QUERY_EXECUTION_TIME``). Not retriable: the same query over the
    same entries takes as long again."""


class QueryRowLimitError(QueryError):
    """A bucket's answer to the query would hold more than the servers'
    ``query_max_rows_per_bucket`` rows: add a LIMIT or narrow the WHERE clause. It stands
    where Geode's ``QueryExecutionLowMemoryException`` does (a query stopped to protect the
    server's memory); Geode bounds no row count."""


class QueryTypeMismatchError(QueryError):
    """The query compared values of different types on some entry: a relational operator
    in the WHERE clause (Geode ``TypeMismatchException``), or ORDER BY values of different
    kinds, or of kinds with no order (Geode's ``OrderByComparator`` fails with a
    ``ClassCastException`` there)."""


class QueryInvocationTargetError(QueryError):
    """Reading a value of the region failed while the query ran: it does not decode on the
    server (Geode ``QueryInvocationTargetException``: a method the query invoked on a value
    threw)."""


class QueryFunctionDomainError(QueryError):
    """A query's result does not fit the call that ran it: ``Region.select_value`` found
    more than one value (Geode ``FunctionDomainException``: "selectValue expects results
    of size 1")."""


class FunctionError(RegionBusError):
    """A function execution failed (Geode ``FunctionException``): the function raised on a
    server (the message names the server's exception), did not send its last result, or
    its results could not be read; or the call was malformed (a filter on ``on_servers``,
    ``is_ha`` without ``has_result``)."""


class FunctionNotRegisteredError(FunctionError):
    """No function of that id is registered on the server that was asked (Geode's
    ``FunctionException``: "Function named ... is not registered to FunctionService")."""


class FunctionTimeoutError(FunctionError):
    """The function ran longer than the servers' ``function_timeout_ms`` and its results
    were dropped, or the results were not all received within ``get_result``'s timeout
    (Geode's ``FunctionException``: "All results not received in time provided")."""


class FunctionInvocationTargetError(FunctionError):
    """The server running the function stopped being the bucket's primary, or stopped,
    before it answered (Geode ``FunctionInvocationTargetException``). An ``is_ha``
    function is re-executed then; this reaches the caller of another, or when the
    re-executions ran out."""

    retriable: ClassVar[bool] = True


class InvalidOperationError(RegionBusError):
    """An operation decoded but is malformed (missing key, wrong bucket, no EventID); the
    server dead-letters it and replies with this."""


class RequestLimitError(InvalidOperationError):
    """A request asks more than one call may (`regionbus.schemas.limits`): too many keys in
    one registration, regexes for one client, or entries in one bulk operation. The client
    refuses it before anything is sent; a server refuses it from anyone else.

    Attributes:
        limit_name: What is counted (``"keys per registration"``).
        limit: The most allowed.
        requested: How many were asked for (0 when the server said so: its reply carries
            the message only).
    """

    def __init__(
        self, message: str, *, limit_name: str = "", limit: int = 0, requested: int = 0
    ) -> None:
        super().__init__(message)
        self.limit_name = limit_name
        self.limit = limit
        self.requested = requested


class InvalidKeyError(InvalidOperationError):
    """An entry key is not a ``str``, is not valid Unicode (a lone surrogate), or is
    longer than ``regionbus.schemas.entry_checks.MAX_KEY_SIZE_BYTES``; nothing was sent or
    applied."""


class InvalidRegionNameError(InvalidOperationError):
    """A region name breaks Geode's rule (``[A-Za-z0-9._-]``, no leading ``__``) or is
    longer than ``regionbus.schemas.entry_checks.MAX_REGION_NAME_CHARS``."""


class ServerOperationError(RegionBusError):
    """The server failed the operation for a reason with no more specific class."""


class StackError(RegionBusError):
    """A local (embedded) Kafka or Redis could not be found, started or reached."""


# --- retriable -----------------------------------------------------------------------


class RetriableError(RegionBusError):
    """Base of the errors where the same call may succeed later."""

    retriable: ClassVar[bool] = True


class ServerTimeoutError(RetriableError):
    """No reply from the server within the client's ``read_timeout_ms``."""


class TransportError(RetriableError):
    """Kafka or Redis could not be reached or refused a request (translated at the boundary)."""


class ReplicationTimeoutError(TransportError):
    """Redis applied a change but too few replicas confirmed it within the wait
    (``redis_wait_replicas``, ``redis_wait_timeout_ms``): it is not acknowledged, and is
    applied again (recognised by its EventID) once the replicas catch up."""


class WorkerStartError(RetriableError):
    """A worker (cache server, gateway worker) did not start: its set-up failed with an
    error of another kind (chained as the cause), or took longer than allowed."""


_WIRE_ERRORS: dict[str, type[RegionBusError]] = {
    cls.__name__: cls
    for cls in (
        ConfigurationError,
        RegionNotFoundError,
        EntryNotFoundError,
        CacheWriterError,
        CacheLoaderError,
        InvalidInterestError,
        ValueTooLargeError,
        CqError,
        CqInvalidError,
        CqExistsError,
        CqClosedError,
        CqStateError,
        QueryError,
        QueryInvalidError,
        QueryExecutionTimeoutError,
        QueryRowLimitError,
        QueryTypeMismatchError,
        QueryInvocationTargetError,
        FunctionError,
        FunctionNotRegisteredError,
        FunctionTimeoutError,
        FunctionInvocationTargetError,
        InvalidOperationError,
        RequestLimitError,
        InvalidKeyError,
        InvalidRegionNameError,
        DuplicateClientError,
        DuplicateDurableClientError,
        AuthenticationError,
        NotAuthorizedError,
        ServerOperationError,
        SerializationError,
        MessageDecodeError,
        TransportError,
    )
}


def error_from_wire(error_type: str | None, message: str | None) -> RegionBusError:
    """Build the exception a server reported in a reply.

    Args:
        error_type: The class name the server sent (e.g. ``"CacheWriterError"``).
        message: The server's message.

    Returns:
        An instance of the named class, or :class:`ServerOperationError` when the name is
        unknown (a newer server, say).
    """
    cls = _WIRE_ERRORS.get(error_type or "", ServerOperationError)
    return cls(message or error_type or "server error")
