"""How a record of a shared client topic says whom it is for.

The clients of one Kafka principal share its queue and reply topics
(`regionbus.schemas.naming.Topics.client_queues`); a client reads the partition its id hashes
to and takes the records addressed to it:

- a record for one client is keyed by its client id (UTF-8);
- a record for several (the clients that share an interest, `regionbus.broker.audiences`) is
  keyed by a NUL byte and the CRC-32, as 8 hex digits, of the name of what they share
  (:func:`shared_key`), and lists them in the header
  :data:`RECIPIENTS_HEADER`: their ids, each between NUL bytes. No client id holds a NUL
  (`regionbus.schemas.naming.check_name`), so neither kind can be taken for the other.

Any Kafka consumer can read the values (the Avro frames of `regionbus.schemas.codec`); the
key and the header say whose they are. With security on, a server signs a record for
several clients over its recipients and its value (:func:`signed_bytes`), so no one who
can write the topic can send it to others than the server did.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from typing import Final, NamedTuple, Protocol

from regionbus.schemas.signing import Headers

RECIPIENTS_HEADER: Final = "rb.to"
"""Header of a record for several clients: ``NUL id NUL id ... NUL``."""

_SHARED: Final = 0


class _Request(Protocol):
    @property
    def client_id(self) -> str: ...

    @property
    def kafka_principal(self) -> str | None: ...


class ClientAddress(NamedTuple):
    """Where a server's records for one client go: the client's id (its partition of a
    shared topic, and the record key) and its Kafka principal (whose shared queue and reply
    topics it reads; None: the namespace's unscoped ones).

    A reply goes to the address of the request it answers (:meth:`of`): the principal is
    part of the address, so no reply can lose it on the way (a client with a principal
    never reads the unscoped topics).
    """

    client_id: str
    kafka_principal: str | None

    @classmethod
    def of(cls, request: _Request) -> ClientAddress:
        """The address of the client that sent ``request`` (an operation or a control
        message): the client id and the principal it named."""
        return cls(request.client_id, request.kafka_principal)


def own_marker(client_id: str) -> bytes:
    """How a client's id appears in :data:`RECIPIENTS_HEADER`: between NUL bytes."""
    return b"\x00" + client_id.encode() + b"\x00"


def recipients(client_ids: Iterable[str]) -> bytes:
    """The :data:`RECIPIENTS_HEADER` value of a record for these clients (sorted)."""
    return b"\x00" + b"\x00".join(c.encode() for c in sorted(client_ids)) + b"\x00"


def shared_key(source: str) -> bytes:
    """The key of a record for several clients sharing ``source`` (a NUL byte, then the
    CRC-32 of the source in hex: short, and the same in every process)."""
    return b"\x00" + f"{zlib.crc32(source.encode()):08x}".encode()


def is_shared(key: bytes | None) -> bool:
    """Whether a record's key marks it as addressed to several clients."""
    return bool(key) and key[0] == _SHARED  # type: ignore[index]


def header(headers: Headers | None, name: str) -> bytes | None:
    """A header's value (bytes), or None when absent."""
    pairs = headers.items() if isinstance(headers, dict) else headers or ()
    for key, value in pairs:
        if key == name:
            return value.encode() if isinstance(value, str) else value
    return None


def recipient_ids(headers: Headers | None) -> list[str] | None:
    """The client ids a record's :data:`RECIPIENTS_HEADER` lists, in its order (empty parts
    skipped; UTF-8, undecodable bytes replaced), or None when the record has no such header
    (a record for one client, named by its key, or a record of another topic)."""
    listed = header(headers, RECIPIENTS_HEADER)
    if listed is None:
        return None
    return [part.decode(errors="replace") for part in listed.split(b"\x00") if part]


def addressed_to(key: bytes | None, headers: Headers | None, own_key: bytes, marker: bytes) -> bool:
    """Whether a record of a shared client topic is for the client whose key (its id, UTF-8)
    is ``own_key`` and whose :func:`own_marker` is ``marker``."""
    if key == own_key:
        return True
    if not is_shared(key):
        return False
    listed = header(headers, RECIPIENTS_HEADER)
    return listed is not None and marker in listed


def signed_bytes(key: bytes | None, headers: Headers | None, value: bytes | None) -> bytes:
    """What a server signs of a client topic's record: its value, after its recipients
    when it is for several clients."""
    body = value or b""
    if not is_shared(key):
        return body
    return (header(headers, RECIPIENTS_HEADER) or b"") + body


__all__ = [
    "RECIPIENTS_HEADER",
    "addressed_to",
    "header",
    "is_shared",
    "own_marker",
    "recipient_ids",
    "recipients",
    "shared_key",
    "signed_bytes",
]
