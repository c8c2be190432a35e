"""``regionbus topic tail``: the records of a topic as decoded JSON lines, one per event,
operation or marker (the frames of docs/wire-format.md).

Three views: ``{ns}.events`` (every applied change, all buckets), ``{ns}.ops`` (every
operation), or one client's: the records of its partition of its Kafka principal's shared
queue topic that are addressed to it (`regionbus.schemas.addressing`), as its client cache
takes them: batches split, its own changes left out of records for several clients, and
duplicates dropped by EventID (`regionbus.clients.tracking.MessageTracker`). The reader
assigns partitions and commits nothing: a client's ack group is never touched.
"""

from __future__ import annotations

import base64
import enum
import json
import logging
from collections.abc import Callable, Iterable
from contextlib import closing, suppress
from typing import Any, Final

import click
from confluent_kafka import KafkaException, TopicPartition

from regionbus.clients.settings import ClientSettings
from regionbus.clients.tracking import MessageTracker
from regionbus.runtime.cli_options import setting_option, with_logging
from regionbus.schemas.addressing import addressed_to, is_shared, own_marker
from regionbus.schemas.codec import decode, split_batch
from regionbus.schemas.errors import ConfigurationError, MessageDecodeError
from regionbus.schemas.kafka_clients import kafka_consumer
from regionbus.schemas.messages import CqEvent, Event, Message
from regionbus.schemas.naming import Topics, client_partition
from regionbus.schemas.record_guard import UnreadableRecords
from regionbus.schemas.transport import kafka_error, poll_batch, topic_partitions, watermarks

METADATA_TIMEOUT_S: Final = 10.0
"""Longest wait for a topic's metadata or a partition's offsets, in seconds."""
_POLL_TIMEOUT_S: Final = 0.5
_POLL_MAX_MESSAGES: Final = 500
_TEXT_SERIALIZERS: Final = ("json", "str")


def _plain(value: Any) -> Any:
    """A decoded field as JSON: records as objects, enums by name, bytes in base64."""
    if isinstance(value, tuple) and hasattr(value, "_asdict"):
        return {name: _plain(field) for name, field in value._asdict().items()}
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, tuple | list):
        return [_plain(item) for item in value]
    return value


def _readable_value(fields: dict[str, Any], raw: bytes | None) -> None:
    """Put the value as its serializer wrote it: a JSON value for ``json``, text for
    ``str``; anything else stays base64 (``value_encoding`` says so)."""
    if raw is None:
        return
    serializer = fields.get("serializer")
    if serializer in _TEXT_SERIALIZERS:
        try:
            text = raw.decode()
            fields["value"] = json.loads(text) if serializer == "json" else text
            return
        except (UnicodeDecodeError, ValueError):
            pass  # not what its serializer says: shown as bytes
    fields["value_encoding"] = "base64"


def record_json(item: Message) -> dict[str, Any]:
    """One decoded record as a JSON object: ``type`` (the record's name), then its fields
    (docs/wire-format.md): enums by name, the EventID as an object, the value decoded by
    its serializer, other bytes in base64."""
    fields: dict[str, Any] = {"type": type(item).__name__, **_plain(item)}
    if isinstance(item, CqEvent):
        _readable_value(fields["event"], item.event.value)
    elif "value" in fields:
        _readable_value(fields, getattr(item, "value", None))
    return fields


class ClientView:
    """What one client takes from the records of its queue partition.

    Args:
        client_id: The client (or durable client) id.
        tracking_timeout_s: Idle time after which message tracking forgets a thread, in
            seconds (the clients' ``subscription_message_tracking_timeout_s``).
    """

    def __init__(self, client_id: str, tracking_timeout_s: float = 900.0) -> None:
        self.client_id = client_id
        self._key = client_id.encode()
        self._marker = own_marker(client_id)
        self._events = MessageTracker(tracking_timeout_s)
        self._cq_events = MessageTracker(tracking_timeout_s)
        self.duplicates = 0
        """Events dropped as seen before."""

    def take(self, key: bytes | None, headers: Any, items: Iterable[Message]) -> list[Message]:
        """The decoded items of one record that are this client's, in order: none when the
        record is addressed to others; the client's own changes left out of a record for
        several clients (the servers never send a client its own change); events already
        seen dropped."""
        if not addressed_to(key, headers, self._key, self._marker):
            return []
        shared = is_shared(key)
        kept: list[Message] = []
        for item in items:
            if type(item) is Event:
                if shared and item.originator == self.client_id:
                    continue
                if not self._events.is_new(item.event_id):
                    self.duplicates += 1
                    continue
            elif type(item) is CqEvent and not self._cq_events.is_new(item.event.event_id):
                self.duplicates += 1
                continue
            kept.append(item)
        return kept


def _decoded(value: bytes | None, on_bad: Callable[[str], None]) -> list[Message]:
    """Every item of a value that decodes; ``on_bad`` hears why each other one did not."""
    try:
        frames = split_batch(value)
    except MessageDecodeError as exc:
        on_bad(str(exc))
        return []
    decoded: list[Message] = []
    for frame in frames:
        try:
            decoded.append(decode(frame))
        except MessageDecodeError as exc:
            on_bad(str(exc))
    return decoded


def tail(
    settings: ClientSettings,
    topic: str,
    partitions: list[int],
    emit: Callable[[dict[str, Any]], None],
    *,
    view: ClientView | None = None,
    from_beginning: bool = False,
    follow: bool = True,
    max_records: int | None = None,
) -> int:
    """Print the records of some partitions of a topic, decoded, one JSON object each.

    Args:
        settings: Kafka connection settings (namespace, bootstrap servers, security).
        topic: The topic.
        partitions: Its partitions to read.
        emit: Takes each JSON object (``topic``, ``partition``, ``offset``, then
            :func:`record_json`'s fields).
        view: One client's view of a shared queue topic; None: every record.
        from_beginning: Start at the first offset kept, not at the end.
        follow: Go on waiting for new records; else stop at the ends the partitions had
            when this began.
        max_records: Stop after this many JSON objects.

    Returns:
        How many JSON objects were emitted.

    Raises:
        TransportError: Kafka failed or did not answer.
        KafkaAuthorizationError: the principal may not read the topic.
    """
    consumer = kafka_consumer(
        settings.librdkafka(
            **{
                # librdkafka wants a group even to assign(); nothing is ever committed.
                "group.id": f"{settings.namespace}.topic-tail",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
            }
        )
    )
    emitted = 0
    try:
        ends: dict[int, int] = {}
        starts: list[TopicPartition] = []
        for partition in partitions:
            low, high = watermarks(consumer, TopicPartition(topic, partition), METADATA_TIMEOUT_S)
            start = low if from_beginning else high
            if start < high:
                ends[partition] = high
            starts.append(TopicPartition(topic, partition, start))
        consumer.assign(starts)
        while follow or ends:
            if max_records is not None and emitted >= max_records:
                break
            for message in poll_batch(consumer, _POLL_MAX_MESSAGES, _POLL_TIMEOUT_S):
                if isinstance(message, UnreadableRecords):
                    _passed(ends, message.partition, message.next_offset)
                    continue
                if message.error() is not None:
                    continue
                partition, offset = message.partition() or 0, message.offset() or 0
                _passed(ends, partition, offset + 1)
                where = {"topic": topic, "partition": partition, "offset": offset}

                def bad(reason: str, where: dict[str, Any] = where) -> None:
                    emit({**where, "type": "undecodable", "reason": reason})

                items = _decoded(message.value(), bad)
                if view is not None:
                    items = view.take(message.key(), message.headers(), items)
                for item in items:
                    if max_records is not None and emitted >= max_records:
                        break
                    emit({**where, **record_json(item)})
                    emitted += 1
    except KafkaException as exc:
        raise kafka_error(exc, f"reading {topic}", f"topic {topic}") from exc
    finally:
        consumer.close()
    return emitted


def _passed(ends: dict[int, int], partition: int, next_offset: int) -> None:
    """Note that a partition was read up to ``next_offset``: forgotten once at its end."""
    if partition in ends and next_offset >= ends[partition]:
        del ends[partition]


@click.group("topic")
def topic() -> None:
    """Read regionbus topics as decoded JSON lines (docs/wire-format.md)."""


@topic.command("tail")
@setting_option(ClientSettings, "namespace", "--namespace")
@setting_option(ClientSettings, "kafka_bootstrap_servers", "--kafka")
@click.option(
    "--client-id",
    "view_client_id",
    help="Show one client's view: the records of its shared queue partition addressed to "
    "it, each event once (else the topic given by --topic).",
)
@setting_option(ClientSettings, "kafka_principal", "--kafka-principal")
@click.option(
    "--topic",
    "kind",
    type=click.Choice(["events", "ops"]),
    default="events",
    show_default=True,
    help="Without --client-id: {ns}.events (applied changes) or {ns}.ops (operations).",
)
@click.option(
    "--from-beginning", is_flag=True, help="Start at the first record kept, not at the end."
)
@click.option(
    "--follow/--no-follow",
    default=True,
    show_default=True,
    help="Wait for new records; --no-follow stops at the end the topic had at start.",
)
@click.option("--max-records", type=click.IntRange(min=1), help="Stop after this many JSON lines.")
@with_logging(logging.WARNING)  # standard output is the JSON lines; logs go to stderr
def topic_tail(
    namespace: str | None,
    kafka_bootstrap_servers: str | None,
    view_client_id: str | None,
    kafka_principal: str | None,
    kind: str,
    from_beginning: bool,
    follow: bool,
    max_records: int | None,
) -> None:
    """Print the records of a topic, one JSON object a line: topic, partition, offset,
    type (Event, Operation, CqEvent, Marker) and the record's fields, values decoded by
    their serializer. Server signatures are not checked."""
    given = {
        "namespace": namespace,
        "kafka_bootstrap_servers": kafka_bootstrap_servers,
        "kafka_principal": kafka_principal,
        "client_id": view_client_id,
    }
    settings = ClientSettings.load(**{k: v for k, v in given.items() if v is not None})
    topics = Topics(settings.namespace)
    view = None
    if view_client_id is not None:
        name = topics.client_queues(settings.topic_principal)
    else:
        name = topics.events if kind == "events" else topics.ops
    metadata_reader = kafka_consumer(
        settings.librdkafka(**{"group.id": f"{settings.namespace}.topic-tail"})
    )
    with closing(metadata_reader) as metadata:
        count = topic_partitions(metadata, name, METADATA_TIMEOUT_S)
    if count == 0:
        raise ConfigurationError(f"topic {name} does not exist: no server of this namespace ran")
    if view_client_id is not None:
        view = ClientView(view_client_id, settings.subscription_message_tracking_timeout_s)
        partitions = [client_partition(view_client_id, count)]
    else:
        partitions = list(range(count))

    def emit(line: dict[str, Any]) -> None:
        click.echo(json.dumps(line, separators=(",", ":"), ensure_ascii=False))

    with suppress(KeyboardInterrupt):
        tail(
            settings,
            name,
            partitions,
            emit,
            view=view,
            from_beginning=from_beginning,
            follow=follow,
            max_records=max_records,
        )


__all__ = ["ClientView", "record_json", "tail", "topic"]
