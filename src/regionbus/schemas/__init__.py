"""The wire contract of regionbus: Avro schemas and codec, ``EventID``, naming, errors.

This package imports nothing else of the project; every other package imports it.
"""

from regionbus.schemas.codec import decode, decode_as, encode
from regionbus.schemas.eventid import EventID
from regionbus.schemas.messages import (
    Control,
    ControlKind,
    Entry,
    Event,
    EventKind,
    InterestKind,
    InterestResultPolicy,
    InterestSpec,
    Marker,
    Operation,
    OperationKind,
    Reply,
)
from regionbus.schemas.naming import (
    DEFAULT_TOTAL_BUCKETS,
    QueueTopic,
    RedisKeys,
    Topics,
    bucket_of,
    region_bucket,
)

__all__ = [
    "DEFAULT_TOTAL_BUCKETS",
    "Control",
    "ControlKind",
    "Entry",
    "Event",
    "EventID",
    "EventKind",
    "InterestKind",
    "InterestResultPolicy",
    "InterestSpec",
    "Marker",
    "Operation",
    "OperationKind",
    "QueueTopic",
    "RedisKeys",
    "Reply",
    "Topics",
    "bucket_of",
    "decode",
    "decode_as",
    "encode",
    "region_bucket",
]
