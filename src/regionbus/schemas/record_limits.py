"""How large a record may be on a regionbus topic, and how much a consumer fetches at once.

Each limit follows from the largest record a legal writer produces, so that Kafka refuses
anything larger when it is written, and a consumer can always fetch, and never has to
hold more than, what may be there:

- a regionbus producer sends records of at most :data:`MAX_RECORD_BYTES` (librdkafka's
  ``message.max.bytes``), uncompressed (:data:`PRODUCER_COMPRESSION`);
- every topic has ``max.message.bytes`` (the largest record batch Kafka accepts) set from
  what it carries (`regionbus.schemas.topics`), ``compression.type`` set to
  :data:`TOPIC_COMPRESSION`;
- every consumer asks for at most :data:`CONSUMER_FETCH_MAX_BYTES` per fetch and
  :data:`CONSUMER_MAX_PARTITION_FETCH_BYTES` per partition, and librdkafka refuses a
  response, or a compressed batch's decompressed contents, over
  :data:`CONSUMER_RECEIVE_MESSAGE_MAX_BYTES`: such a batch is reported unreadable and
  skipped (`regionbus.schemas.record_guard`), so a record built to decompress to hundreds of
  megabytes costs a consumer at most this much memory once.

The settings are applied by `regionbus.schemas.kafka_clients` (clients) and
`regionbus.schemas.topics` (topics); docs/operations.md, "Topics", lists them with these reasons.
"""

from __future__ import annotations

from typing import Final

MAX_RECORD_BYTES: Final = 1_000_000
"""Largest record a regionbus producer sends, in bytes: librdkafka's ``message.max.bytes``
default. An operation holds at most a 900,000-byte value
(`regionbus.schemas.entry_checks.MAX_VALUE_SIZE_BYTES`), a 1 KiB key, a 64 KiB callback
argument and a few small fields; a server's or client's batch
(`regionbus.schemas.codec.encode_batches`) is at most 512 KiB, or one such record alone."""

RECORD_BATCH_MAX_BYTES: Final = 1_048_588
"""Topic ``max.message.bytes`` of the topics carrying operations, events, replies, queues and
gateway traffic: Kafka's default for one record batch (1 MiB plus its 12-byte log
overhead), which a librdkafka producer's batch of records of up to :data:`MAX_RECORD_BYTES`
fits. Set on each topic so that a cluster whose broker default was raised still refuses
larger batches on regionbus topics."""

CONTROL_BATCH_MAX_BYTES: Final = 64 * 1024
"""Topic ``max.message.bytes`` of ``{ns}.control``: a ``Control`` record (connect, ping,
close) is under 1 KiB, and a client's producer puts few in one batch."""

DEAD_LETTER_HEADERS_MAX_BYTES: Final = 16 * 1024
"""Most bytes of headers a dead letter adds to the record it sets aside (reason, source,
signing headers kept for an audit; the reason is cut to
`regionbus.schemas.dead_letter.MAX_REASON_CHARS`)."""

DEAD_LETTER_BATCH_MAX_BYTES: Final = RECORD_BATCH_MAX_BYTES + DEAD_LETTER_HEADERS_MAX_BYTES
"""Topic ``max.message.bytes`` of ``{ns}.dead-letter``: the largest record any topic takes,
kept whole, plus the dead letter's headers. Without the room a record near the limit
could not be dead-lettered, and a worker that cannot set a record aside reads it again
and again."""

PRODUCER_MAX_MESSAGE_BYTES: Final = DEAD_LETTER_BATCH_MAX_BYTES
"""librdkafka ``message.max.bytes`` of every regionbus producer: room for a dead letter;
each topic's own ``max.message.bytes`` bounds what it takes."""

PRODUCER_COMPRESSION: Final = "none"
"""librdkafka ``compression.type`` of every regionbus producer. Records are Avro of at most
:data:`MAX_RECORD_BYTES`, mostly small, so compressing saves little on a 2-core machine's
busiest path, and uncompressed batches decompress to their size on the wire: the
consumers' bounds below never refuse a legal batch."""

TOPIC_COMPRESSION: Final = "producer"
"""Topic ``compression.type``: keep batches as producers sent them. Any other value makes
the broker decompress every record of a differently compressed batch into its heap to
compress it again (Kafka ``LogValidator``), so a 6 KB batch that decompresses to 200 MB
would cost the broker that memory on every write; with ``producer`` it validates a
compressed batch streaming, and the consumers bound what they decompress."""

CONSUMER_MAX_PARTITION_FETCH_BYTES: Final = 1_048_576
"""librdkafka ``max.partition.fetch.bytes`` (its default, set explicitly): a larger first
batch of a partition still arrives whole (Kafka KIP-74), so no legal record is stuck."""

CONSUMER_FETCH_MAX_BYTES: Final = 4 * 1_048_576
"""librdkafka ``fetch.max.bytes``, records per fetch response (librdkafka's default is
50 MiB): four of the largest batches, so a server reading 16 partitions still takes many
operations per fetch, while a consumer holds little per response."""

CONSUMER_RECEIVE_MESSAGE_MAX_BYTES: Final = CONSUMER_FETCH_MAX_BYTES + 64 * 1024
"""librdkafka ``receive.message.max.bytes`` (its default is 100 MB): the largest fetch
response (records plus framing; librdkafka wants at least ``fetch.max.bytes`` + 512), and
the most one compressed batch may decompress to. A batch that would decompress to more is
reported ``_BAD_COMPRESSION`` and skipped."""


__all__ = [
    "CONSUMER_FETCH_MAX_BYTES",
    "CONSUMER_MAX_PARTITION_FETCH_BYTES",
    "CONSUMER_RECEIVE_MESSAGE_MAX_BYTES",
    "CONTROL_BATCH_MAX_BYTES",
    "DEAD_LETTER_BATCH_MAX_BYTES",
    "DEAD_LETTER_HEADERS_MAX_BYTES",
    "MAX_RECORD_BYTES",
    "PRODUCER_COMPRESSION",
    "PRODUCER_MAX_MESSAGE_BYTES",
    "RECORD_BATCH_MAX_BYTES",
    "TOPIC_COMPRESSION",
]
