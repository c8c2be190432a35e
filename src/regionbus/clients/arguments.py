"""Checks of a region call's arguments, before anything is sent or changed locally.

A bad key, value, callback argument or interest spec raises a typed
:class:`~schemas.errors.RegionBusError` at the call, with the same rules the servers apply
to what they read (:mod:`regionbus.schemas.entry_checks`, :mod:`regionbus.schemas.interest_regex`).
"""

from __future__ import annotations

from regionbus.schemas.entry_checks import check_key, check_value_size
from regionbus.schemas.errors import SerializationError, ValueTooLargeError
from regionbus.schemas.interest_regex import compile_interest_regex
from regionbus.schemas.messages import InterestKind, InterestSpec


def check_entry(
    key: object,
    value: bytes | None = None,
    callback_argument: object = None,
    max_value_size_bytes: int | None = None,
) -> str:
    """Check the arguments of an entry operation.

    Args:
        key: The entry key (see `regionbus.schemas.entry_checks.check_key`).
        value: The encoded value of a put, or None.
        callback_argument: Opaque ``bytes`` or None.
        max_value_size_bytes: The largest value the servers take, if known (their
            ``max_value_size_bytes``, told when the client connected).

    Returns:
        The key.

    Raises:
        InvalidKeyError: the key is not a ``str``, not valid Unicode, or too long.
        SerializationError: the callback argument is neither ``bytes`` nor None.
        ValueTooLargeError: the value or the callback argument is too large to be sent,
            or the value is larger than the servers take.
    """
    checked = check_key(key)
    if callback_argument is not None and not isinstance(callback_argument, bytes):
        raise SerializationError(
            f"a callback argument is bytes, got {type(callback_argument).__name__}"
        )
    check_value_size(value, callback_argument)
    if value is not None and max_value_size_bytes is not None and len(value) > max_value_size_bytes:
        raise ValueTooLargeError(
            f"value of {len(value)} bytes exceeds the servers' max_value_size_bytes="
            f"{max_value_size_bytes}"
        )
    return checked


def check_interest(spec: InterestSpec) -> InterestSpec:
    """Check an interest spec: each key of a KEYS spec, the pattern of a REGEX spec.

    Returns:
        The spec, unchanged.

    Raises:
        InvalidKeyError: a key of a KEYS spec is refused (see :func:`check_entry`).
        InvalidInterestError: the regex of a REGEX spec is refused (the message says why;
            see `regionbus.schemas.interest_regex.compile_interest_regex`).
    """
    if spec.kind is InterestKind.REGEX:
        compile_interest_regex(spec.regex)
    elif spec.kind is InterestKind.KEYS:
        for key in spec.keys:
            check_key(key)
    return spec


__all__ = ["check_entry", "check_interest"]
