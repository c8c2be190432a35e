"""Checks of an operation that decoded, before anything of it is applied."""

from __future__ import annotations

from broker.config import ServerSettings
from broker.interest import compile_interest_regex
from schemas.errors import InvalidOperationError, ValueTooLargeError
from schemas.messages import InterestKind, Operation, OperationKind
from schemas.naming import bucket_of


def validate(op: Operation, bucket: int, settings: ServerSettings) -> None:
    """Refuse an operation that is malformed or not this bucket's.

    Args:
        op: The operation, as read from partition ``bucket`` of ``{ns}.ops``.
        bucket: The partition it was read from.
        settings: The server's settings (``total_buckets``, ``max_value_size_bytes``).

    Raises:
        InvalidOperationError: an entry operation without a key or in another key's
            bucket, a change without an EventID, a PUT without a value, a registration
            without a spec.
        ValueTooLargeError: a PUT's value is over ``max_value_size_bytes``.
        InvalidInterestError: a REGEX registration whose pattern does not compile.
    """
    kind = op.kind
    if kind.is_entry_operation:
        if op.key is None:
            raise InvalidOperationError(f"{kind.value} needs a key")
        expected = bucket_of(op.region, op.key, settings.total_buckets)
        if expected != bucket:
            raise InvalidOperationError(
                f"key {op.key!r} of region {op.region!r} belongs to bucket {expected}, not {bucket}"
            )
    if (kind.is_entry_change or kind.is_region_change) and op.event_id is None:
        raise InvalidOperationError(f"{kind.value} needs an EventID")
    if kind is OperationKind.PUT:
        if op.value is None:
            raise InvalidOperationError("PUT needs a value")
        if len(op.value) > settings.max_value_size_bytes:
            raise ValueTooLargeError(
                f"value of {len(op.value)} bytes exceeds max_value_size_bytes="
                f"{settings.max_value_size_bytes}"
            )
    if kind in (OperationKind.REGISTER_INTEREST, OperationKind.UNREGISTER_INTEREST):
        if op.interest is None:
            raise InvalidOperationError(f"{kind.value} needs an interest spec")
        if op.interest.kind is InterestKind.REGEX:
            compile_interest_regex(op.interest.regex)


__all__ = ["validate"]
