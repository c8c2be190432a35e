"""Checks of keys, values and region names, shared by the client API and the servers.

The client runs them before anything is sent, so a bad argument raises a typed error at
the call (not a raw ``TypeError``, ``UnicodeEncodeError`` or a Kafka size error from the
background); the servers run the same ones on every operation they read, so a producer
that skips the client still cannot store what a client could not.
"""

from __future__ import annotations

from typing import Final

from regionbus.schemas.errors import (
    ConfigurationError,
    InvalidKeyError,
    InvalidRegionNameError,
    ValueTooLargeError,
)
from regionbus.schemas.naming import check_name

MAX_KEY_SIZE_BYTES: Final = 1024
"""Longest key, in UTF-8 bytes. Geode sets no limit; here a key rides in every operation,
event, reply and registration message, and interest regexes are matched against it on the
server's thread in time proportional to its length (``regionbus.schemas.interest_regex``)."""

MAX_VALUE_SIZE_BYTES: Final = 900_000
"""Largest encoded value a client sends, in bytes: with the key and the other fields an
operation stays under librdkafka's ``message.max.bytes`` (1,000,000) and Kafka's
(1,048,588), so it can be carried at all. Servers refuse values over their own
``max_value_size_bytes`` (default 512 KiB), which is at most this."""

MAX_CALLBACK_ARGUMENT_BYTES: Final = 64 * 1024
"""Largest callback argument, in bytes (it travels with the value)."""

MAX_REGION_NAME_CHARS: Final = 120
"""Longest region name, in characters."""


def check_key(key: object) -> str:
    """Check an entry key.

    Args:
        key: The key; a ``str`` of 1 to :data:`MAX_KEY_SIZE_BYTES` UTF-8 bytes. The empty
            string is a key like any other (Geode accepts any non-null key).

    Returns:
        The key, unchanged.

    Raises:
        InvalidKeyError: not a ``str`` (``None``, ``int``...), not encodable as UTF-8 (a
            lone surrogate), or longer than :data:`MAX_KEY_SIZE_BYTES`.
    """
    if not isinstance(key, str):
        raise InvalidKeyError(f"keys are str, got {type(key).__name__}")
    try:
        size = len(key.encode())
    except UnicodeEncodeError as exc:
        raise InvalidKeyError(f"key {key[:40]!r} is not valid Unicode: {exc.reason}") from None
    if size > MAX_KEY_SIZE_BYTES:
        raise InvalidKeyError(
            f"key {key[:40]!r}... is {size} bytes in UTF-8, more than {MAX_KEY_SIZE_BYTES}"
        )
    return key


def check_value_size(value: bytes | None, callback_argument: bytes | None = None) -> None:
    """Check that an encoded value and its callback argument can be carried.

    Args:
        value: The encoded value, or None (destroy, invalidate).
        callback_argument: The opaque callback argument, or None.

    Raises:
        ValueTooLargeError: the value is over :data:`MAX_VALUE_SIZE_BYTES` or the callback
            argument over :data:`MAX_CALLBACK_ARGUMENT_BYTES` bytes.
    """
    if value is not None and len(value) > MAX_VALUE_SIZE_BYTES:
        raise ValueTooLargeError(
            f"value of {len(value)} bytes exceeds the largest a message carries, "
            f"{MAX_VALUE_SIZE_BYTES}"
        )
    if callback_argument is not None and len(callback_argument) > MAX_CALLBACK_ARGUMENT_BYTES:
        raise ValueTooLargeError(
            f"callback argument of {len(callback_argument)} bytes exceeds "
            f"{MAX_CALLBACK_ARGUMENT_BYTES}"
        )


def check_region_name(name: object) -> str:
    """Check a region name: Geode's rule (``RegionNameValidation``), with a length limit.

    Args:
        name: The name: 1 to :data:`MAX_REGION_NAME_CHARS` characters of
            ``[A-Za-z0-9._-]``, not beginning with ``__`` (Geode reserves it).

    Returns:
        The name, unchanged.

    Raises:
        InvalidRegionNameError: not a ``str``, empty, too long, a character outside the
            set, or a leading ``__``.
    """
    if not isinstance(name, str):
        raise InvalidRegionNameError(f"region names are str, got {type(name).__name__}")
    shown = name if len(name) <= 80 else f"{name[:80]}..."
    try:
        check_name("region name", name, max_len=MAX_REGION_NAME_CHARS)
    except ConfigurationError:
        raise InvalidRegionNameError(
            f"region name {shown!r} must be 1-{MAX_REGION_NAME_CHARS} characters of [A-Za-z0-9._-]"
        ) from None
    if name.startswith("__"):
        raise InvalidRegionNameError(f"region name {shown!r} must not begin with '__'")
    return name


__all__ = [
    "MAX_CALLBACK_ARGUMENT_BYTES",
    "MAX_KEY_SIZE_BYTES",
    "MAX_REGION_NAME_CHARS",
    "MAX_VALUE_SIZE_BYTES",
    "check_key",
    "check_region_name",
    "check_value_size",
]
