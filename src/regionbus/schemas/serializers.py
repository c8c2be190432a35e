"""Value serializers: how entry values become the bytes stored and sent.

Each serializer has a ``name`` that travels with the value, so any reader can decode it.
Never pickle (ARCHITECTURE.md).
"""

from __future__ import annotations

import io
import json
from typing import Any, Protocol

from fastavro import parse_schema, schemaless_reader, schemaless_writer

from regionbus.schemas.errors import SerializationError


class Serializer(Protocol):
    """Turns values into bytes and back. ``name`` is sent with every value."""

    name: str

    def dumps(self, value: Any) -> bytes:
        """Encode a value. Raises :class:`SerializationError` when it cannot."""
        ...

    def loads(self, data: bytes) -> Any:
        """Decode bytes. Raises :class:`SerializationError` when they are not valid."""
        ...


class JsonSerializer:
    """JSON (UTF-8, compact). The default: readable from any language and from Spark."""

    name = "json"

    def dumps(self, value: Any) -> bytes:
        try:
            return json.dumps(value, separators=(",", ":"), allow_nan=False).encode()
        except (TypeError, ValueError) as exc:
            raise SerializationError(f"value is not JSON-serializable: {exc}") from exc

    def loads(self, data: bytes) -> Any:
        try:
            return json.loads(data)
        except (ValueError, RecursionError) as exc:
            # RecursionError: nesting deeper than the interpreter's recursion limit (e.g. a
            # value of 100,000 "[") is as undecodable as a syntax error.
            raise SerializationError(f"value is not valid JSON: {exc}") from exc


class StrSerializer:
    """UTF-8 text."""

    name = "str"

    def dumps(self, value: Any) -> bytes:
        if not isinstance(value, str):
            raise SerializationError(f"expected str, got {type(value).__name__}")
        return value.encode()

    def loads(self, data: bytes) -> Any:
        try:
            return data.decode()
        except UnicodeDecodeError as exc:
            raise SerializationError(f"value is not UTF-8: {exc}") from exc


class BytesSerializer:
    """Raw bytes, unchanged."""

    name = "bytes"

    def dumps(self, value: Any) -> bytes:
        if not isinstance(value, bytes | bytearray | memoryview):
            raise SerializationError(f"expected bytes, got {type(value).__name__}")
        return bytes(value)

    def loads(self, data: bytes) -> Any:
        return data


class AvroSerializer:
    """Avro records of one schema, for typed regions. Name: ``avro:<schema full name>``.

    Args:
        schema: An Avro record schema as a dict.
    """

    def __init__(self, schema: dict[str, Any]) -> None:
        self.schema_json = json.dumps(schema, separators=(",", ":"))
        """The schema as JSON text (sent with a continuous query, so the servers can read
        the values' attributes)."""
        self._schema = parse_schema(schema)
        parsed: dict[str, Any] = self._schema  # type: ignore[assignment]
        self.name = f"avro:{parsed['name']}"

    def dumps(self, value: Any) -> bytes:
        buf = io.BytesIO()
        try:
            schemaless_writer(buf, self._schema, value)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise SerializationError(f"value does not fit {self.name}: {exc}") from exc
        return buf.getvalue()

    def loads(self, data: bytes) -> Any:
        try:
            return schemaless_reader(io.BytesIO(data), self._schema, None)
        except Exception as exc:  # fastavro raises many types on bad bytes
            raise SerializationError(f"value is not a valid {self.name}: {exc}") from exc


_BUILTIN: dict[str, Serializer] = {
    s.name: s for s in (JsonSerializer(), StrSerializer(), BytesSerializer())
}


def serializer_named(name: str | None, extra: dict[str, Serializer] | None = None) -> Serializer:
    """Find a serializer by the name that travelled with a value.

    Args:
        name: The serializer name (``json``, ``str``, ``bytes``, ``avro:...``); None means bytes.
        extra: More serializers by name (e.g. a region's Avro serializer).

    Returns:
        The serializer.

    Raises:
        SerializationError: no serializer of that name is known here.
    """
    if name is None:
        return _BUILTIN["bytes"]
    found = (extra or {}).get(name) or _BUILTIN.get(name)
    if found is None:
        raise SerializationError(f"unknown value serializer {name!r}")
    return found


def plain_bytes(value: Any) -> tuple[bytes, str]:
    """A value server-side code hands over (a loader's value, a function's argument, result
    or put), encoded with no region's serializer at hand: ``bytes`` as they are (serializer
    ``bytes``), anything else as JSON (serializer ``json``); every reader decodes it by the
    name that travels with it.

    Raises:
        SerializationError: the value is not JSON-serializable.
    """
    if isinstance(value, bytes | bytearray):
        return bytes(value), "bytes"
    return _BUILTIN["json"].dumps(value), "json"
