"""Topic names, Redis key names and the bucket function: the addresses every part shares.

``{ns}`` is a per-site namespace (e.g. ``geode.site1``) so two sites can share one Kafka in
tests (ARCHITECTURE.md). Member ids and namespaces must be legal in Kafka topic names.
"""

from __future__ import annotations

import os
import re
import socket
import uuid
import zlib
from collections.abc import Callable
from typing import Final, Literal, NamedTuple

from regionbus.schemas.errors import ConfigurationError

DEFAULT_TOTAL_BUCKETS: Final = 16
"""Buckets (= partitions of ``{ns}.ops``). Geode's ``total-num-buckets`` default is 113; we
use fewer because each bucket is a Kafka partition that every primary fetches."""

BULK_LOAD_ID_PREFIX: Final = "spark-load-"
"""How the client ids of Spark bulk loads begin when the caller names none (a fresh one per
load: a load id is the member of its EventIDs), and so what their Kafka ACLs are granted on."""

# fullmatch, not match with "$": "$" also matches before a trailing newline.
_TOPIC_PART = re.compile(r"[A-Za-z0-9._-]+")


def check_name(kind: str, value: str, max_len: int = 180) -> str:
    """Check that a namespace, member id or sender id is legal inside a Kafka topic name.

    Args:
        kind: What the value is, for the error message.
        value: The name.
        max_len: Longest allowed length in characters (Kafka topics: 249 in all).

    Returns:
        The value, unchanged.

    Raises:
        ConfigurationError: empty, too long, or holding characters other than
            ``[A-Za-z0-9._-]``.
    """
    if not value or len(value) > max_len or not _TOPIC_PART.fullmatch(value):
        raise ConfigurationError(
            f"{kind} {value!r} must be 1-{max_len} characters of [A-Za-z0-9._-]"
        )
    return value


def generated_member_id(kind: str) -> str:
    """A member or client id unique to this process: ``<kind>-<host>-<pid>-<8 hex>``.

    The host name is cut to 40 characters and anything outside ``[A-Za-z0-9.-]`` becomes
    ``-``, so the id is legal inside a topic name (`check_name`).

    Args:
        kind: What the member is, e.g. ``"server"``, ``"c"`` (a client), ``"gateway-sender"``.
    """
    host = "".join(c if c.isalnum() or c in "-." else "-" for c in socket.gethostname())[:40]
    return f"{kind}-{host}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def bucket_of(region: str, key: str, total_buckets: int) -> int:
    """The bucket an entry lives in: ``crc32(region NUL key) % total_buckets``.

    CRC-32 (not Python's salted ``hash``) so every process, and Spark, agrees.

    Args:
        region: Region name.
        key: Entry key.
        total_buckets: Number of buckets (partitions of ``{ns}.ops``).

    Returns:
        The bucket index in ``[0, total_buckets)``.
    """
    return zlib.crc32(f"{region}\x00{key}".encode()) % total_buckets


def bucket_role(bucket: int) -> str:
    """The election role name of a bucket's primary (lease and fencing epoch keys)."""
    return f"bucket:{bucket}"


REAPER_ROLE: Final = "reaper"
"""The election role of the durable-client reaper (one server of a namespace at a time)."""


def sender_role(sender_id: str, shard: int = 0, shards: int = 1) -> str:
    """The election role of a gateway sender's primary (Redis ``rb:{ns}:lease:<role>``):
    ``gateway-sender:<id>``, or ``gateway-sender:<id>/<shard>`` for one shard of a queue
    split into ``shards`` (each shard a primary of its own)."""
    role = f"gateway-sender:{sender_id}"
    return role if shards == 1 else f"{role}/{shard}"


def sender_shard_id(sender_id: str, shard: int = 0, shards: int = 1) -> str:
    """The id a gateway sender's batches carry (``GatewayBatch.sender_id``), by which the
    receiver keeps each sender's batch sequence: the sender id, or ``<id>.shard-<shard>``
    for one shard of a queue split into ``shards``, whose batches are a sequence of
    their own."""
    return sender_id if shards == 1 else f"{sender_id}.shard-{shard}"


def dispatcher_role(queue_id: str) -> str:
    """The election role of an async event queue's primary dispatcher."""
    return f"async-event-queue:{queue_id}"


def receiver_client_id(receiver_id: str) -> str:
    """The client id a gateway receiver applies its batches with (the address of its
    replies)."""
    return f"gw-receiver-{receiver_id}"


def client_partition(client_id: str, partitions: int) -> int:
    """The partition of the shared queue and reply topics a client reads:
    ``crc32(client id) % partitions`` (every process, and Spark, agrees).

    Args:
        client_id: The client (or durable client) id.
        partitions: Partition count of the topic.
    """
    return zlib.crc32(client_id.encode()) % partitions


class ClientTopic(NamedTuple):
    """A shared client topic, parsed (`Topics.client_topic`).

    Attributes:
        kind: ``"queues"`` (subscription queues) or ``"replies"``.
        kafka_principal: The Kafka principal whose clients it carries, None for the
            namespace's unscoped topic.
    """

    kind: str
    kafka_principal: str | None


def region_bucket(region: str, total_buckets: int) -> int:
    """The bucket that orders region-wide operations (clear, destroy_region) of a region."""
    return zlib.crc32(region.encode()) % total_buckets


QueueKind = Literal["gateway", "async-event-queue"]
"""A gateway sender's queue or an async event queue (the topics named by one owner; the
clients' subscription queues share topics, parsed by :meth:`Topics.client_topic`)."""


class QueueTopic(NamedTuple):
    """A queue topic taken apart (:meth:`Topics.parse_queue`).

    Attributes:
        kind: What queue it is.
        owner_id: The gateway sender id or async event queue id it is named by.
        ack_group: The consumer group whose committed offsets are the queue's head: what
            its sender or dispatcher removed once acked.
    """

    kind: QueueKind
    owner_id: str
    ack_group: str


class Topics:
    """Kafka topic names of one namespace.

    Args:
        namespace: The site namespace, e.g. ``"geode.site1"``.

    Raises:
        ConfigurationError: the namespace is not legal in a topic name.
    """

    def __init__(self, namespace: str) -> None:
        self.namespace = check_name("namespace", namespace, max_len=120)
        ns = self.namespace
        self.ops = f"{ns}.ops"
        self.events = f"{ns}.events"
        self.control = f"{ns}.control"
        self.dead_letter = f"{ns}.dead-letter"

        self.client_queues_topic = f"{ns}.queues"
        self.client_replies_topic = f"{ns}.replies"
        self.gateway_prefix = f"{ns}.gw."
        self.async_event_queue_prefix = f"{ns}.aeq."
        self.gateway_inbound_prefix = f"{ns}.gwr."
        self.gateway_ack_prefix = f"{ns}.gwack."
        """What each kind of per-sender or per-queue topic name starts with."""

    def client_queues(self, kafka_principal: str | None = None) -> str:
        """The shared, partitioned subscription-queue topic of the clients of one Kafka
        principal: ``{ns}.queues.<principal>``, or ``{ns}.queues`` for clients that name
        none (an unsecured Kafka: one principal for all). A client reads the partition its
        id hashes to (`client_partition`) and takes the records keyed by its id.

        Raises:
            ConfigurationError: the principal is not legal in a topic name.
        """
        if kafka_principal is None:
            return self.client_queues_topic
        return f"{self.client_queues_topic}.{check_name('Kafka principal', kafka_principal)}"

    def client_replies(self, kafka_principal: str | None = None) -> str:
        """The shared, partitioned reply topic of the clients of one Kafka principal
        (``{ns}.replies.<principal>``, or ``{ns}.replies``); addressed as `client_queues`.

        Raises:
            ConfigurationError: the principal is not legal in a topic name.
        """
        if kafka_principal is None:
            return self.client_replies_topic
        return f"{self.client_replies_topic}.{check_name('Kafka principal', kafka_principal)}"

    def client_topic(self, topic: str) -> ClientTopic | None:
        """What a shared client topic name says (the inverse of `client_queues` and
        `client_replies`): its kind and Kafka principal; None for any other topic."""
        for kind, base in (
            ("queues", self.client_queues_topic),
            ("replies", self.client_replies_topic),
        ):
            if topic == base:
                return ClientTopic(kind, None)
            if topic.startswith(base + ".") and _TOPIC_PART.fullmatch(topic[len(base) + 1 :]):
                return ClientTopic(kind, topic[len(base) + 1 :])
        return None

    def gateway(self, sender_id: str) -> str:
        """The queue topic of a gateway sender."""
        return self.gateway_prefix + check_name("gateway sender id", sender_id)

    def async_event_queue(self, queue_id: str) -> str:
        """The topic of an async event queue."""
        return self.async_event_queue_prefix + check_name("async event queue id", queue_id)

    def gateway_inbound(self, receiver_id: str) -> str:
        """The topic remote gateway senders send batches to, read by this site's gateway
        receiver (1 partition)."""
        return self.gateway_inbound_prefix + check_name("gateway receiver id", receiver_id)

    def gateway_ack(self, sender_site_id: int, sender_id: str) -> str:
        """The topic of this site where its receiver acks one remote sender's batches (named
        by the sender's site and id; 1 partition)."""
        sender = check_name("gateway sender id", sender_id)
        return f"{self.gateway_ack_prefix}{sender_site_id}.{sender}"

    def client_group(self, client_id: str) -> str:
        """The consumer group whose committed offset is a client's ack of its queue."""
        return f"{self.namespace}.client.{check_name('client id', client_id)}"

    def client_reply_group(self, client_id: str) -> str:
        """The consumer group of a client's reply reader (it commits nothing, so Kafka
        never holds such a group, but librdkafka wants one).

        Not ``client_group(id) + ".reply"``: that is the queue group of client
        ``<id>.reply``, and a client's Kafka ACLs name its groups one by one
        (`regionbus.broker.kafka_acls.client_acls`), so no two clients' names may meet.
        """
        return f"{self.namespace}.client-reply.{check_name('client id', client_id)}"

    def client_of_group(self, group: str) -> str | None:
        """The client id whose acks a consumer group holds (the inverse of
        `client_group`), or None for any other group."""
        prefix = f"{self.namespace}.client."
        rest = group[len(prefix) :] if group.startswith(prefix) else ""
        return rest if rest and _TOPIC_PART.fullmatch(rest) else None

    @property
    def server_group(self) -> str:
        """The consumer group holding the servers' committed offsets on ``{ns}.ops``."""
        return f"{self.namespace}.server"

    @property
    def status_group(self) -> str:
        """The consumer group ``regionbus status`` reads offsets with (it commits nothing)."""
        return f"{self.namespace}.status"

    def sender_group(self, sender_id: str) -> str:
        """The consumer group whose committed offsets are the head of a sender's queue."""
        return f"{self.namespace}.gw-sender.{sender_id}"

    def sender_ack_group(self, sender_id: str) -> str:
        """The consumer group of a sender's ack reader, on the remote site's Kafka (named
        by the sender's own namespace)."""
        return f"{self.sender_group(sender_id)}.ack"

    def dispatcher_group(self, queue_id: str) -> str:
        """The consumer group whose committed offsets are the head of an async event queue."""
        return f"{self.namespace}.aeq-dispatcher.{queue_id}"

    def receiver_group(self, receiver_id: str) -> str:
        """The consumer group of a gateway receiver's inbound topic."""
        return f"{self.namespace}.gw-receiver.{receiver_id}"

    def parse_queue(self, topic: str) -> QueueTopic | None:
        """Take a gateway or async event queue topic of this namespace apart: the inverse of
        :meth:`gateway` and :meth:`async_event_queue`, with the group each is acked in.
        (A client's subscription queue is its records in a shared topic, acked in
        :meth:`client_group`; :meth:`client_topic` parses those topics.)

        Args:
            topic: Any topic name.

        Returns:
            Its kind, owner id and ack group; None for any other topic (a client, reply or
            inbound topic, another namespace's) or an owner id `check_name` refuses.
        """
        shapes: tuple[tuple[QueueKind, str, Callable[[str], str]], ...] = (
            ("gateway", self.gateway_prefix, self.sender_group),
            ("async-event-queue", self.async_event_queue_prefix, self.dispatcher_group),
        )
        for kind, prefix, ack_group_of in shapes:
            if topic.startswith(prefix):
                owner_id = topic[len(prefix) :]
                try:
                    check_name(f"{kind} id", owner_id)
                except ConfigurationError:
                    return None
                return QueueTopic(kind, owner_id, ack_group_of(owner_id))
        return None


def bucket_of_role(role: str) -> int | None:
    """The bucket of a bucket primary's role (:func:`bucket_role`), None for any other role."""
    kind, _, number = role.partition(":")
    return int(number) if kind == "bucket" and number.isdigit() else None


VERSION_COUNTER_DIGITS: Final = 12
"""Decimal digits of the per-generation part of an entry version (see :class:`RedisKeys`):
a bucket of a region takes 10**12 changes between two region operations, and a region
9.2 million region operations (clear, destroy, invalidate) before a version passes an Avro
``long``."""


def entry_version(generation: int, counter: int) -> int:
    """An entry version from its parts: ``generation * 10**12 + counter``.

    The Lua scripts build the same number as text (the generation's digits, then the
    counter's on 12 digits), as Redis' Lua numbers are doubles, exact only below 2**53.

    Args:
        generation: The region operation a bucket saw last (0 before any).
        counter: Changes of the bucket since that region operation.
    """
    return generation * 10**VERSION_COUNTER_DIGITS + counter


class RedisKeys:
    """Redis key names of one namespace, each in a deliberately chosen hash slot.

    Every key starts ``rb:`` and carries a Redis Cluster hash tag, so the keys that one
    Lua script or transaction touches share one slot (the layout and why:
    ``docs/redis-cluster.md``):

    - ``rb:{<ns>:<bucket>}:...``: everything of one bucket: its copy of the region names,
      the entries of every region in it, their version counters, expiry schedules, the
      bucket's EventID tracking and stored results, and its primary's lease, fencing epoch,
      secondaries and handoff note;
    - ``rb:{<ns>}:...``: the namespace's control state: members, client records, interest
      lists, the leases and epochs of the singleton roles (reaper, gateway senders, async
      event queue dispatchers) and the security principals.

    A single Redis ignores the tags: the same names serve both.

    Args:
        namespace: The site namespace.
    """

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.prefix = f"rb:{{{namespace}}}:"
        """Prefix of the namespace slot's keys (``rb:{<ns>}:``)."""

    def bucket_prefix(self, bucket: int) -> str:
        """Prefix of every key of one bucket: ``rb:{<ns>:<bucket>}:``."""
        return f"rb:{{{self.namespace}:{bucket}}}:"

    def regions(self, bucket: int) -> str:
        """Set of the defined region names, one copy per bucket (the scripts of a bucket
        check a region exists in its own slot)."""
        return f"{self.bucket_prefix(bucket)}regions"

    def region_values(self, region: str, bucket: int) -> str:
        """Hash key -> value bytes of one bucket of a region (absent field = invalid entry)."""
        return f"{self.bucket_prefix(bucket)}r:{region}:val"

    def region_meta(self, region: str, bucket: int) -> str:
        """Hash key -> ``"<version>|<serializer>"`` of one bucket; a field = the entry exists."""
        return f"{self.bucket_prefix(bucket)}r:{region}:meta"

    def region_gateway_versions(self, region: str, bucket: int) -> str:
        """Hash key -> ``"<timestamp_ms>|<site id>"`` of the last change of each entry of one
        bucket, kept on multi-site members for gateway conflict resolution (docs/behaviour.md
        §6)."""
        return f"{self.bucket_prefix(bucket)}r:{region}:gwv"

    def region_expiry(self, region: str, bucket: int) -> str:
        """Sorted set key -> time it expires (ms since the Unix epoch) of the entries of one
        bucket of a region with entry expiration: what the bucket's primary reads with
        ``ZRANGEBYSCORE`` instead of scanning the region."""
        return f"{self.bucket_prefix(bucket)}r:{region}:exp"

    def region_entry_times(self, region: str, bucket: int) -> str:
        """Hash key -> ``"<last modified ms>|<last accessed ms>"`` of the entries of one
        bucket of a region with entry expiration (Geode ``RegionEntry`` statistics)."""
        return f"{self.bucket_prefix(bucket)}r:{region}:times"

    def region_expiry_claims(self, region: str, bucket: int) -> str:
        """Hash key -> ``"<sequence id>|<expiry ms>|<member id>"``: the expirations of one
        bucket of a region that its primary produced to ``{ns}.ops`` and that are not
        applied yet, so a primary that takes over produces the same EventID again."""
        return f"{self.bucket_prefix(bucket)}r:{region}:expc"

    def expiry_sequence(self, bucket: int) -> str:
        """Counter of the sequence ids of a bucket's expirations (one EventID thread per
        bucket, whichever server is its primary)."""
        return f"{self.bucket_prefix(bucket)}expseq"

    def region_version(self, region: str, bucket: int) -> str:
        """Hash of one bucket's version counter of a region: ``gen`` (the last region
        operation applied to the bucket), ``n`` (changes since; an entry's version is
        :func:`entry_version` of both) and, in the region's own bucket
        (:func:`region_bucket`), ``ops`` (region operations begun) and ``op:<EventID>`` (the
        generation of one begun and not finished)."""
        return f"{self.bucket_prefix(bucket)}rv:{region}"

    def tracking(self, bucket: int) -> str:
        """Hash ``member:thread`` -> highest applied sequence id in a bucket."""
        return f"{self.bucket_prefix(bucket)}track"

    def results(self, bucket: int) -> str:
        """Hash EventID -> stored apply result, for re-emitting the event of a duplicate."""
        return f"{self.bucket_prefix(bucket)}res"

    def results_index(self, bucket: int) -> str:
        """Sorted set EventID scored by ``{ns}.ops`` offset, to prune :meth:`results`."""
        return f"{self.bucket_prefix(bucket)}resx"

    def interest(self, client_id: str) -> str:
        """Hash of a client's interest registrations (field = registration id)."""
        return f"{self.prefix}interest:{client_id}"

    def cqs(self, client_id: str) -> str:
        """Hash of a client's continuous queries (field = CQ name, value = JSON of its
        region, query, durable flag and state)."""
        return f"{self.prefix}cqs:{client_id}"

    @property
    def clients(self) -> str:
        """Hash client id -> JSON of the client's registry record (durable, connection, last
        seen, its Kafka principal)."""
        return f"{self.prefix}clients"

    @property
    def members(self) -> str:
        """Hash member id -> start time (ms since the Unix epoch) of every joined server."""
        return f"{self.prefix}members"

    def member_alive(self, member_id: str) -> str:
        """Key that exists (with a TTL) while the member heartbeats."""
        return f"{self.prefix}alive:{member_id}"

    def lease(self, role: str) -> str:
        """Key ``"<member>|<epoch>"`` of the current holder of a role (bucket, reaper...):
        a bucket's in the bucket's slot, any other in the namespace slot."""
        bucket = bucket_of_role(role)
        if bucket is not None:
            return f"{self.bucket_prefix(bucket)}lease"
        return f"{self.prefix}lease:{role}"

    def lease_prefix(self) -> str:
        """What the lease keys of the singleton roles (not buckets) begin with."""
        return f"{self.prefix}lease:"

    def epoch(self, role: str) -> str:
        """Counter of a role's fencing epoch; the current value is the only valid one. In
        the slot of the role's lease (acquiring takes both in one script)."""
        bucket = bucket_of_role(role)
        if bucket is not None:
            return f"{self.bucket_prefix(bucket)}epoch"
        return f"{self.prefix}epoch:{role}"

    def secondaries(self, bucket: int) -> str:
        """Set of the member ids that are secondaries of a bucket."""
        return f"{self.bucket_prefix(bucket)}secondaries"

    def handoff(self, bucket: int) -> str:
        """Member id a released bucket is handed over to (short TTL)."""
        return f"{self.bucket_prefix(bucket)}handoff"
