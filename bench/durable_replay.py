"""Durable replay benchmark: a durable client reconnecting to a full subscription queue.

``python -m bench.durable_replay`` measures, on one Kafka and Redis (the local stack unless
``KAFKA_BOOTSTRAP_SERVERS`` / ``REDIS_URL`` name others) and one cache server in a child
process:

1. set-up (not timed): a durable client (docs/behaviour.md §5) registers durable ``ALL_KEYS``
   interest in region ``bench``, calls ``ready_for_events`` and closes with ``keep_alive``; a
   writer then puts ``--events`` distinct keys (``put_all`` chunks), so its subscription
   queue (its partition of ``{ns}.queues``) holds that many events;
2. **durable replay** (timed): a new ``ClientCache`` with the same durable id connects
   (which counts the pending events), calls ``ready_for_events``, and the events are
   replayed to its listener before the marker, until the listener has every event and
   ``after_region_live``: events/s = events ÷ seconds from the start of the connection
   to the later of the last event and ``after_region_live``;
3. **raw baseline** (timed, same run, same partition): a confluent-kafka consumer with
   ``assign()`` reads the client's partition of the queue topic from offset 0 until it has
   counted as many events;
   it splits every Kafka message (a batch) with :func:`regionbus.schemas.codec.split_batch` and
   counts the frames whose type byte is an event, decoding no Avro body.

It prints both rates and the ratio regionbus ÷ raw, and each phase's CPU per event (this
process's CPU time over the phase, every thread, librdkafka's included), which a busy
machine's scheduling bends less than the wall clock: on a shared machine the raw phase
lasts a fraction of a second. Machines are noisy: compare the ratios, not the absolute
figures (``bench/README.md``).
"""

from __future__ import annotations

import json
import logging
import re
import secrets
import sys
import threading
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from typing import Any

import click
from confluent_kafka import KafkaException, TopicPartition
from rich.console import Console
from rich.table import Table

from bench import progress
from bench.core import run_or_exit
from bench.options import fetch_wait_option, json_option, linger_option
from bench.server import BenchError, ServerProcess
from bench.summary import SummaryRow, emit
from regionbus.clients import (
    ALL_KEYS,
    BytesSerializer,
    CacheListener,
    ClientCache,
    ClientSettings,
    EntryEvent,
    RegionEvent,
)
from regionbus.schemas.codec import TYPE_BYTES, split_batch
from regionbus.schemas.errors import BulkOperationError, MessageDecodeError
from regionbus.schemas.kafka_clients import kafka_consumer
from regionbus.schemas.messages import Event
from regionbus.schemas.record_guard import UnreadableRecords
from regionbus.schemas.transport import assign_from, poll_batch

log = logging.getLogger("regionbus.bench")

REGION = "bench"
DURABLE_ID = "bench-durable"
_QUIET = {"log_level": 3}
_REPLAY_TIMEOUT_S = 600.0
_RAW_TIMEOUT_S = 300.0
_READ_TIMEOUT_MS = 60_000
_RAW_BATCH_MESSAGES = 500
_AWAY_S = 86_400
"""The durable client's ``durable_client_timeout_s``: the servers keep its queue while the
writer fills it (a million puts take longer than the default 300 s)."""
_SERVER_QUEUE_CAPACITY = 230_000
"""The servers' default ``maximum_message_count`` (Geode's 230000), raised to ``--events``
for a larger backlog so that no put waits on a full queue."""
_TABLE_WIDTH = 120
_POSITIVE = click.IntRange(min=1)


class _EventCount(click.ParamType):
    """A count of at least 1, with or without thousands separators: ``1000000``,
    ``1,000,000`` or ``1_000_000`` (as the tables print it)."""

    name = "count"
    _GROUPED = re.compile(r"\d{1,3}(,\d{3})+")

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        """The count, or a usage error for anything else."""
        if isinstance(value, int):
            count = value
        else:
            text = str(value).strip()
            if "," in text and not self._GROUPED.fullmatch(text):
                self.fail(f"{value!r} is not a count (thousands go in groups of 3)", param, ctx)
            try:
                count = int(text.replace(",", ""))
            except ValueError:
                self.fail(f"{value!r} is not a count", param, ctx)
        if count < 1:
            self.fail(f"{value!r} is below 1", param, ctx)
        return count


@dataclass(frozen=True, slots=True)
class ReplayOptions:
    """The options of one run (see ``python -m bench.durable_replay --help``)."""

    events: int
    value_bytes: int
    chunk: int
    fetch_wait_max_ms: int
    linger_ms: int


@dataclass(frozen=True, slots=True)
class ReplayFigures:
    """What one run measured.

    Attributes:
        events: Events queued for the durable client (one per distinct key put).
        pending_at_connect: ``pending_event_count`` of the reconnecting client.
        replayed: Events its listener got before the marker (``subscription_stats``).
        delivered: Events its listener got in all.
        connect_s: Seconds to construct the reconnecting ``ClientCache`` (CONNECT and
            counting the pending events).
        replay_s: Seconds from the start of the connection until the listener had every
            event and ``after_region_live``.
        replay_events_per_s: ``delivered`` / ``replay_s``.
        raw_messages: Kafka messages (batches) the raw consumer read.
        raw_events: Events counted in them (frames with the event type byte).
        raw_s: Seconds from the raw consumer's ``assign()`` to its last needed message.
        raw_events_per_s: ``raw_events`` / ``raw_s``.
        fill_s: Seconds the writer took to put every entry (set-up, not compared).
        distinct_keys: Keys the listener heard of (``delivered`` when each came once).
        out_of_order: Events whose version was not above the last one heard from their
            bucket (0: per-bucket order kept).
        after_marker: Events heard after ``after_region_live`` (0: all replayed first).
        replay_cpu_s: CPU seconds of this process (every thread, librdkafka's included)
            over ``replay_s``: a figure a busy machine's scheduling bends far less than
            the wall clock.
        raw_cpu_s: CPU seconds of this process over ``raw_s``.
    """

    events: int
    pending_at_connect: int
    replayed: int
    delivered: int
    connect_s: float
    replay_s: float
    replay_events_per_s: float
    raw_messages: int
    raw_events: int
    raw_s: float
    raw_events_per_s: float
    fill_s: float
    distinct_keys: int
    out_of_order: int
    after_marker: int
    replay_cpu_s: float
    raw_cpu_s: float

    @property
    def ratio(self) -> float:
        """Durable replay events/s ÷ raw consume events/s."""
        return self.replay_events_per_s / self.raw_events_per_s if self.raw_events_per_s else 0.0

    @property
    def cpu_ratio(self) -> float:
        """Raw consume CPU per event ÷ durable replay CPU per event (as :attr:`ratio`:
        higher is better, 1 is raw's cost)."""
        return self.raw_cpu_s / self.replay_cpu_s if self.replay_cpu_s else 0.0


class _ReplayCounter(CacheListener):
    """Counts events (replayed or not) and notes when the last one and the marker came; and
    checks the replay: each key heard once, each bucket's versions rising, all before the
    marker."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.count = 0
        self.last_event_s = 0.0
        self.live_s = 0.0
        self.done = threading.Event()
        self.keys: set[str] = set()
        self.out_of_order = 0
        self.after_marker = 0
        self._last_version: dict[int, int] = {}

    def _event(self, event: EntryEvent) -> None:
        self.count += 1
        self.last_event_s = time.monotonic()
        self.keys.add(event.key)
        bucket = event.event_id.bucket if event.event_id is not None else -1
        if event.version <= self._last_version.get(bucket, -1):
            self.out_of_order += 1
        self._last_version[bucket] = event.version
        if self.live_s:
            self.after_marker += 1
        self._check()

    def _check(self) -> None:
        if self.count >= self.expected and self.live_s:
            self.done.set()

    def after_create(self, event: EntryEvent) -> None:
        """Count a create."""
        self._event(event)

    def after_update(self, event: EntryEvent) -> None:
        """Count an update."""
        self._event(event)

    def after_region_live(self, event: RegionEvent) -> None:
        """The marker: replay is over."""
        self.live_s = time.monotonic()
        self._check()


def _settings(
    options: ReplayOptions, namespace: str, kafka: str, **overrides: Any
) -> ClientSettings:
    return ClientSettings(
        namespace=namespace,
        kafka_bootstrap_servers=kafka,
        fetch_wait_max_ms=options.fetch_wait_max_ms,
        linger_ms=options.linger_ms,
        read_timeout_ms=_READ_TIMEOUT_MS,
        kafka_config=dict(_QUIET),
        **overrides,
    )


def _durable_settings(options: ReplayOptions, namespace: str, kafka: str) -> ClientSettings:
    """The durable client's settings, on both of its connections."""
    return _settings(
        options, namespace, kafka, durable_client_id=DURABLE_ID, durable_client_timeout_s=_AWAY_S
    )


def _prepare_queue(options: ReplayOptions, namespace: str, kafka: str) -> float:
    """Register the durable client, close it with keep-alive, fill its queue.

    Returns:
        Seconds the writer took.

    Raises:
        BenchError: a put failed or the first connection got no marker.
    """
    durable = ClientCache(_durable_settings(options, namespace, kafka))
    try:
        marker = _ReplayCounter(0)
        region = durable.create_region(REGION, serializer=BytesSerializer(), listeners=[marker])
        region.register_interest(ALL_KEYS, durable=True)
        durable.ready_for_events()
        if not marker.done.wait(_READ_TIMEOUT_MS / 1000):
            raise BenchError("the durable client's first connection got no marker")
    finally:
        durable.close(keep_alive=True)
    writer = ClientCache(_settings(options, namespace, kafka, subscription_enabled=False))
    value = b"v" * options.value_bytes
    started = time.monotonic()
    try:
        region = writer.create_region(REGION, serializer=BytesSerializer())
        first = 0
        progress.counts(lambda: f"{first:,} of {options.events:,} puts sent")
        for first in range(0, options.events, options.chunk):
            last = min(first + options.chunk, options.events)
            try:
                region.put_all({f"d-{i}": value for i in range(first, last)})
            except BulkOperationError as exc:
                raise BenchError(f"{len(exc.failures)} puts failed: {exc}") from exc
    finally:
        writer.close()
    return time.monotonic() - started


def _replay(
    options: ReplayOptions, namespace: str, kafka: str
) -> tuple[ClientCache, dict[str, Any]]:
    """Reconnect the durable client and time its replay (the cache is left open, so the
    queue is still there for the raw consumer).

    Raises:
        BenchError: the listener did not get every event and the marker in time.
    """
    counter = _ReplayCounter(options.events)
    progress.counts(lambda: f"{counter.count:,} of {options.events:,} events delivered")
    started, started_cpu = time.monotonic(), time.process_time()
    cache = ClientCache(_durable_settings(options, namespace, kafka))
    connected = time.monotonic()
    try:
        cache.create_region(REGION, serializer=BytesSerializer(), listeners=[counter])
        cache.ready_for_events()
        if not counter.done.wait(_REPLAY_TIMEOUT_S):
            raise BenchError(
                f"replay incomplete after {_REPLAY_TIMEOUT_S} s: {counter.count:,} of "
                f"{options.events:,} events, marker {'seen' if counter.live_s else 'not seen'}"
            )
    except BaseException:
        cache.close()
        raise
    finished = max(counter.last_event_s, counter.live_s)
    replay_cpu_s = time.process_time() - started_cpu
    return cache, {
        "replay_cpu_s": replay_cpu_s,
        "pending_at_connect": cache.pending_event_count,
        "replayed": cache.subscription_stats.replayed,
        "delivered": counter.count,
        "distinct_keys": len(counter.keys),
        "out_of_order": counter.out_of_order,
        "after_marker": counter.after_marker,
        "connect_s": connected - started,
        "replay_s": finished - started,
    }


def _raw_consume(
    kafka: str, queue: tuple[str, int], expected_events: int
) -> tuple[int, int, float, float]:
    """Read one partition (``(topic, partition)``: the durable client's, which no other
    client of the run shares) from offset 0 with ``assign()`` until ``expected_events``
    events.

    Returns:
        ``(messages, events, seconds, CPU seconds of this process meanwhile)``.

    Raises:
        BenchError: fewer events within the time limit.
    """
    event_type = TYPE_BYTES[Event]
    consumer = kafka_consumer(
        {
            "bootstrap.servers": kafka,
            "group.id": f"bench-raw-{secrets.token_hex(3)}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            **_QUIET,
        }
    )
    messages = events = 0
    try:
        started, started_cpu = time.monotonic(), time.process_time()
        assign_from(consumer, [TopicPartition(*queue, 0)], 10)
        deadline = started + _RAW_TIMEOUT_S
        while events < expected_events:
            if time.monotonic() > deadline:
                raise BenchError(f"raw consumer: {events:,} of {expected_events:,} events")
            # poll_batch, not consume(n, timeout) alone: that waits for n messages or the
            # whole timeout, which added 0.5 s to a queue of fewer than n messages.
            for message in poll_batch(consumer, _RAW_BATCH_MESSAGES, 0.5):
                if isinstance(message, UnreadableRecords) or message.error() is not None:
                    continue
                messages += 1
                try:
                    frames = split_batch(message.value())
                except MessageDecodeError:
                    continue
                events += sum(1 for raw in frames if len(raw) > 1 and raw[1] == event_type)
        elapsed, cpu_s = time.monotonic() - started, time.process_time() - started_cpu
    except KafkaException as exc:
        raise BenchError(f"raw consumer: {exc}") from exc
    finally:
        consumer.close()
    return messages, events, elapsed, cpu_s


def run(options: ReplayOptions, console: Console) -> ReplayFigures:
    """Start the stack (unless given by env) and one cache server; run both phases.

    Raises:
        BenchError: a put failed, the server did not start, or a phase did not finish.
        StackError: Kafka or Redis could not be started.
    """
    namespace = f"bench.{secrets.token_hex(3)}"
    with ExitStack() as stack:
        local, work_dir = progress.embedded_stack(stack, "durable_replay", console, announce=False)
        server = stack.enter_context(
            ServerProcess(
                namespace=namespace,
                kafka_bootstrap_servers=local.kafka_bootstrap_servers,
                redis_url=local.redis_url,
                regions=(REGION,),
                fetch_wait_max_ms=options.fetch_wait_max_ms,
                linger_ms=options.linger_ms,
                log_path=work_dir / "server.log",
                env={
                    "REGIONBUS_MAXIMUM_MESSAGE_COUNT": str(
                        max(options.events, _SERVER_QUEUE_CAPACITY)
                    )
                },
            )
        )
        kafka = local.kafka_bootstrap_servers
        console.print(
            f"kafka {kafka} ({local.kafka_source}), redis {local.redis_url} "
            f"({local.redis_source}), namespace {namespace}, server pid {server.pid}, "
            f"logs in {work_dir}",
            style="dim",
        )
        progress.phase(console, f"set-up: durable client away, {options.events:,} puts ...")
        fill_s = _prepare_queue(options, namespace, kafka)
        progress.phase(console, "durable replay: reconnect, ready_for_events, every event ...")
        cache, replay = _replay(options, namespace, kafka)
        try:
            progress.phase(console, "raw: assign() consumer over the same queue topic ...")
            queue = cache.pool.address.queue_topic, cache.pool.address.queue_partition
            raw_messages, raw_events, raw_s, raw_cpu_s = _raw_consume(kafka, queue, options.events)
        finally:
            cache.close()
    return ReplayFigures(
        events=options.events,
        replay_events_per_s=replay["delivered"] / replay["replay_s"],
        raw_messages=raw_messages,
        raw_events=raw_events,
        raw_s=raw_s,
        raw_events_per_s=raw_events / raw_s if raw_s > 0 else 0.0,
        fill_s=fill_s,
        raw_cpu_s=raw_cpu_s,
        **replay,
    )


def print_table(figures: ReplayFigures, options: ReplayOptions, console: Console) -> None:
    """Print the durable replay rate beside the raw consume rate, and the ratio."""
    table = Table(
        title=(
            f"durable replay of {figures.events:,} queued events: "
            f"fetch.wait.max.ms={options.fetch_wait_max_ms}, {options.value_bytes} B values"
        )
    )
    for column in ("figure", "regionbus", "raw Kafka baseline", "ratio"):
        table.add_column(column, justify="left" if column == "figure" else "right")
    table.add_row(
        "events/s to listeners (reconnect → last event and after_region_live)",
        f"{figures.replay_events_per_s:,.0f}",
        f"{figures.raw_events_per_s:,.0f} assign() consume",
        f"{figures.ratio:.2f}x",
    )
    table.add_row(
        "CPU µs per event (this process, all threads)",
        f"{figures.replay_cpu_s / figures.delivered * 1e6:,.1f}",
        f"{figures.raw_cpu_s / figures.raw_events * 1e6:,.1f}",
        f"{figures.cpu_ratio:.2f}x",
    )
    table.add_row(
        "seconds",
        f"{figures.replay_s:,.2f} (connect {figures.connect_s:,.2f})",
        f"{figures.raw_s:,.2f}",
        "",
    )
    table.add_row(
        "events",
        f"{figures.delivered:,} ({figures.replayed:,} replayed, "
        f"{figures.pending_at_connect:,} pending at connect; {figures.distinct_keys:,} keys, "
        f"{figures.out_of_order:,} out of bucket order, {figures.after_marker:,} after "
        "the marker)",
        f"{figures.raw_events:,} in {figures.raw_messages:,} messages",
        "",
    )
    console.print(table)
    console.print(f"set-up: {figures.events:,} puts in {figures.fill_s:,.1f} s", style="dim")


@click.command()
@click.option(
    "--events",
    default=100_000,
    type=_EventCount(),
    show_default=True,
    help=(
        "Events queued for the durable client while it is away (one put per key), e.g. "
        "20,000 (bench.all's quick profile) or 1,000,000 (a backlog of a million: the "
        "set-up's puts take most of the run)."
    ),
)
@click.option(
    "--value-bytes",
    default=200,
    type=_POSITIVE,
    show_default=True,
    help="Bytes of every value.",
)
@click.option(
    "--chunk",
    default=1_000,
    type=_POSITIVE,
    show_default=True,
    help="Entries per put_all call.",
)
@fetch_wait_option(
    help_text="fetch.wait.max.ms of the clients and the server (the clients' default)."
)
@linger_option()
@json_option
def main(as_json: bool, **values: Any) -> None:
    """Measure a durable client's replay of queued events against a raw Kafka consume."""
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    options = ReplayOptions(**values)
    console = Console(width=None if sys.stdout.isatty() else _TABLE_WIDTH)
    figures = run_or_exit(lambda: run(options, console), console)
    print_table(figures, options, console)
    emit(
        [
            SummaryRow(
                "durable_replay",
                f"replay of {figures.events:,} queued events, events/s",
                figures.replay_events_per_s,
                figures.raw_events_per_s,
                "raw consume of the queue topic events/s",
            )
        ]
    )
    if as_json:
        print(
            json.dumps(
                {
                    **asdict(options),
                    **asdict(figures),
                    "ratio": figures.ratio,
                    "cpu_ratio": figures.cpu_ratio,
                }
            )
        )


if __name__ == "__main__":
    main()
