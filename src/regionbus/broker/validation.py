"""Checks of an operation that decoded, before anything of it is applied."""

from __future__ import annotations

from regionbus.broker.config import ServerSettings
from regionbus.schemas.cq import parse_cq
from regionbus.schemas.cq_checks import check_cq_name
from regionbus.schemas.entry_checks import check_key, check_region_name, check_value_size
from regionbus.schemas.errors import (
    CqInvalidError,
    InvalidOperationError,
    QueryInvalidError,
    ValueTooLargeError,
)
from regionbus.schemas.eventid import EXPIRY_MEMBER, EXPIRY_THREAD, LOAD_MEMBER
from regionbus.schemas.functions import check_function_id
from regionbus.schemas.interest_regex import compile_interest_regex
from regionbus.schemas.limits import (
    KEYS_PER_REGISTRATION_MESSAGE,
    MAX_FUNCTION_FILTER_KEYS,
    check_count,
)
from regionbus.schemas.messages import InterestKind, Operation, OperationKind
from regionbus.schemas.naming import bucket_of
from regionbus.schemas.operation_kinds import Scope, kind_row
from regionbus.schemas.query import parse_query


def validate(op: Operation, bucket: int, settings: ServerSettings) -> None:
    """Refuse an operation that is malformed or not this bucket's.

    Args:
        op: The operation, as read from partition ``bucket`` of ``{ns}.ops``.
        bucket: The partition it was read from.
        settings: The server's settings (``total_buckets``, ``max_value_size_bytes``).

    Raises:
        InvalidOperationError: an entry operation without a key or in another key's
            bucket, a change or expiration without an EventID, an EventID in the
            expirations' thread on anything but an expiration (or the reverse), a PUT
            without a value, a registration without a spec.
        InvalidRegionNameError: the region name breaks the clients' rule
            (`regionbus.schemas.entry_checks.check_region_name`).
        InvalidKeyError: a key (of the operation or of a KEYS registration) the clients
            would refuse (`regionbus.schemas.entry_checks.check_key`).
        ValueTooLargeError: a PUT's value is over ``max_value_size_bytes``, or its callback
            argument over the clients' limit.
        InvalidInterestError: a REGEX registration whose pattern the clients would refuse
            (`regionbus.schemas.interest_regex.compile_interest_regex`).
        RequestLimitError: a registration operation with more keys than a client sends
            in one (`regionbus.schemas.limits.KEYS_PER_REGISTRATION_MESSAGE`).
        CqInvalidError: a CQ operation without a CQ, with a name the clients would refuse,
            or (to execute) a query outside the CQ subset or of another region.
        QueryInvalidError: a QUERY whose query does not parse, is of another region, or
            whose parameters do not fit it (`regionbus.schemas.query.ParsedQuery.bind`).

    A function execution is refused (``InvalidOperationError``) without a function spec,
    with an id the clients would refuse, arguments neither JSON nor bytes, or a filter
    anywhere but on a region, of more than
    `regionbus.schemas.limits.MAX_FUNCTION_FILTER_KEYS` keys or of keys of another bucket;
    its arguments over ``max_value_size_bytes`` raise ``ValueTooLargeError``.
    """
    kind = op.kind
    row = kind_row(kind)
    if row.scope in (Scope.CLIENT, Scope.SERVERS):
        if row.scope is Scope.SERVERS and op.region:
            raise InvalidOperationError(f"{kind.value} is of no region, not of {op.region!r}")
    else:
        check_region_name(op.region)
    check_value_size(None, op.callback_argument)
    if row.scope is Scope.ENTRY:
        if op.key is None:
            raise InvalidOperationError(f"{kind.value} needs a key")
        check_key(op.key)
        expected = bucket_of(op.region, op.key, settings.total_buckets)
        if expected != bucket:
            raise InvalidOperationError(
                f"key {op.key!r} of region {op.region!r} belongs to bucket {expected}, not {bucket}"
            )
    if row.change and op.event_id is None:
        raise InvalidOperationError(f"{kind.value} needs an EventID")
    if op.event_id is not None and row.expiration != (
        op.event_id.member == EXPIRY_MEMBER and op.event_id.thread == EXPIRY_THREAD
    ):
        # The expirations' EventID thread is theirs alone: another operation in it would
        # make their events look like duplicates to clients and to the servers.
        raise InvalidOperationError(
            f"{kind.value} with EventID {op.event_id}: only an expiration, and every "
            f"expiration, has member {EXPIRY_MEMBER!r} and thread {EXPIRY_THREAD}"
        )
    if op.event_id is not None and (kind is OperationKind.LOAD_CREATE) != (
        op.event_id.member == LOAD_MEMBER
    ):
        raise InvalidOperationError(
            f"{kind.value} with EventID {op.event_id}: only a loader's create, and every "
            f"one, has member {LOAD_MEMBER!r}"
        )
    if row.needs_value:
        if op.value is None:
            raise InvalidOperationError(f"{kind.value} needs a value")
        if len(op.value) > settings.max_value_size_bytes:
            raise ValueTooLargeError(
                f"value of {len(op.value)} bytes exceeds max_value_size_bytes="
                f"{settings.max_value_size_bytes}"
            )
    if op.expected_value is not None and len(op.expected_value) > settings.max_value_size_bytes:
        raise ValueTooLargeError(
            f"expected value of {len(op.expected_value)} bytes exceeds max_value_size_bytes="
            f"{settings.max_value_size_bytes}"
        )
    if row.needs_interest:
        if op.interest is None:
            raise InvalidOperationError(f"{kind.value} needs an interest spec")
        if op.interest.kind is InterestKind.REGEX:
            compile_interest_regex(op.interest.regex)
        check_count(
            "keys per registration message", len(op.interest.keys), KEYS_PER_REGISTRATION_MESSAGE
        )
        for key in op.interest.keys:
            check_key(key)
    if row.needs_query:
        _check_query(op)
    if row.needs_function:
        _check_function(op, bucket, settings)
    if row.needs_cq:
        if op.cq is None:
            raise InvalidOperationError(f"{kind.value} needs a CQ")
        check_cq_name(op.cq.name)
        if row.parses_query:
            parsed = parse_cq(op.cq.query)
            if parsed.region != op.region:
                raise CqInvalidError(
                    f"the query selects from /{parsed.region}, the operation is on {op.region!r}",
                    rule="one-region",
                    query=op.cq.query,
                )


def _check_function(op: Operation, bucket: int, settings: ServerSettings) -> None:
    """A function execution names a function, carries arguments a server decodes and
    bounds, and a filter of its own bucket's keys, on a region only."""
    spec = op.function
    if spec is None:
        raise InvalidOperationError(f"{op.kind.value} needs a function")
    check_function_id(spec.function_id)
    if spec.arguments is not None:
        if spec.arguments_serializer not in ("json", "bytes"):
            raise InvalidOperationError(
                f"function arguments are json or bytes, not {spec.arguments_serializer!r}"
            )
        if len(spec.arguments) > settings.max_value_size_bytes:
            raise ValueTooLargeError(
                f"function arguments of {len(spec.arguments)} bytes exceed "
                f"max_value_size_bytes={settings.max_value_size_bytes}"
            )
    if not spec.filter:
        return
    if op.kind is not OperationKind.EXECUTE_REGION_FUNCTION:
        raise InvalidOperationError(f"{op.kind.value} takes no filter")
    check_count("keys in a function filter", len(spec.filter), MAX_FUNCTION_FILTER_KEYS)
    for key in spec.filter:
        if bucket_of(op.region, check_key(key), settings.total_buckets) != bucket:
            raise InvalidOperationError(
                f"filter key {key!r} of region {op.region!r} is not of bucket {bucket}"
            )


def _check_query(op: Operation) -> None:
    """A QUERY carries a query of its own region that parses and binds its parameters."""
    if op.query is None:
        raise InvalidOperationError(f"{op.kind.value} needs a query")
    parsed = parse_query(op.query.query).bind(op.query.parameters)
    if parsed.region != op.region:
        raise QueryInvalidError(
            f"the query selects from /{parsed.region}, the operation is on {op.region!r}",
            rule="one-region",
            query=op.query.query,
        )


__all__ = ["validate"]
