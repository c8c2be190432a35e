"""Async event queues: batches of region events to an ``AsyncEventListener`` (docs/behaviour.md §7).

Geode ``AsyncEventQueueImpl`` with ``GatewaySenderEventCallbackDispatcher``: the cache
servers queue the region's create, update and distributed destroy events into
``{ns}.aeq.<queue id>`` after each change; the primary dispatcher (elected, one per queue)
reads batches of ``batch_size`` events or what came within ``batch_time_interval_ms`` and
calls ``process_events``. False or an exception → the same batch is delivered again,
every event flagged ``possible_duplicate``, after ``retry_interval_ms``; nothing leaves the
queue until the listener returns True. A queue can be created paused
(``pause_event_dispatching``) and resumed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any, ClassVar, NamedTuple

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from regionbus.gateways.processor import QueueProcessor, conflate
from regionbus.runtime.observability import Metric, MetricFamilies
from regionbus.runtime.redis_connect import connect_redis
from regionbus.runtime.settings import ObservabilitySettings, RedisConnectionSettings
from regionbus.schemas.errors import ConfigurationError
from regionbus.schemas.eventid import EventID
from regionbus.schemas.hooks import load_hook
from regionbus.schemas.messages import Event, EventKind
from regionbus.schemas.naming import Topics, check_name, dispatcher_role, generated_member_id
from regionbus.schemas.serializers import serializer_named
from regionbus.schemas.settings import KafkaConnectionSettings

log = logging.getLogger("regionbus.gateways.aeq")


class AsyncEvent(NamedTuple):
    """One region event as an ``AsyncEventListener`` sees it (Geode ``AsyncEvent``).

    Attributes:
        region: Region name.
        key: Entry key.
        kind: CREATE, UPDATE or DESTROY.
        value_bytes: The new value's bytes (None for a destroy).
        serializer: Serializer name of the value.
        event_id: The change's EventID.
        version: Region version of the change on the server.
        timestamp_ms: The change's timestamp, ms since the Unix epoch.
        possible_duplicate: The event may have been delivered before.
        callback_argument: Opaque bytes the originator attached.
        is_expiration: A destroy made by entry expiration (Geode
            ``Operation.isExpiration()``); queued only with ``forward_expiration_destroy``.
    """

    region: str
    key: str
    kind: EventKind
    value_bytes: bytes | None
    serializer: str | None
    event_id: EventID
    version: int
    timestamp_ms: int
    possible_duplicate: bool = False
    callback_argument: bytes | None = None
    is_expiration: bool = False

    @property
    def value(self) -> Any:
        """The new value, decoded by its serializer (None for a destroy)."""
        if self.value_bytes is None:
            return None
        return serializer_named(self.serializer).loads(self.value_bytes)

    @classmethod
    def from_event(cls, event: Event) -> AsyncEvent:
        """Build from a queued :class:`regionbus.schemas.messages.Event`."""
        assert event.key is not None
        return cls(
            event.region,
            event.key,
            event.kind,
            event.value,
            event.serializer,
            event.event_id,
            event.version,
            event.timestamp_ms,
            event.possible_duplicate,
            event.callback_argument,
            event.expiration,
        )


class AsyncEventListener:
    """Receives batches of events (Geode ``AsyncEventListener``). Override
    :meth:`process_events`."""

    def process_events(self, events: list[AsyncEvent]) -> bool:
        """Handle one batch, in queue order.

        Returns:
            True when the batch is done and may leave the queue; False (or raising) has
            the same batch delivered again, flagged ``possible_duplicate``.
        """
        raise NotImplementedError

    def close(self) -> None:
        """Called once when the queue stops."""


class AsyncEventQueueSettings(
    KafkaConnectionSettings, RedisConnectionSettings, ObservabilitySettings
):
    """Configuration of an async event queue dispatcher
    (env prefix ``REGIONBUS_ASYNC_EVENT_QUEUE_``, file table ``[async_event_queue]``).

    The cache servers queue the events (``ServerSettings.async_event_queues``); this worker
    dispatches them. ``kafka_*`` are documented on
    :class:`regionbus.schemas.settings.KafkaConnectionSettings`; ``redis_*`` (the dispatcher's
    lease)
    on :class:`regionbus.runtime.settings.RedisConnectionSettings`; ``metrics_port`` and
    ``log_format`` on :class:`regionbus.runtime.settings.ObservabilitySettings`.

    Attributes:
        queue_id: The queue's id; its topic is ``{namespace}.aeq.<queue_id>``.
        namespace: Site namespace.
        listener: ``"module:Class"`` of the ``AsyncEventListener`` (for the CLI).
        batch_size: Events per batch (Geode ``batch-size``, default 100).
        batch_time_interval_ms: Longest wait for a batch to fill after its first event
            (Geode ``batch-time-interval``, default 5 ms for async event queues).
        batch_conflation_enabled: Geode ``enable-batch-conflation`` (default False).
        dispatching_paused: Create the queue paused (Geode ``pause-event-processing``).
        retry_interval_ms: Wait before delivering a refused batch again.
        fetch_wait_max_ms: librdkafka ``fetch.wait.max.ms`` of the queue consumer (100 ms,
            as the servers': a queue taken over as primary waits at most that long).
        member_id: This worker's member id (the lease holder).
        lease_ttl_ms: Dispatcher lease time to live (renewed every third of it).
    """

    model_config = SettingsConfigDict(env_prefix="REGIONBUS_ASYNC_EVENT_QUEUE_")
    config_section: ClassVar[str] = "async_event_queue"
    env_renamed: ClassVar[Mapping[str, str]] = {"queue_id": "REGIONBUS_ASYNC_EVENT_QUEUE_ID"}

    queue_id: str
    namespace: str = "regionbus"
    listener: str | None = None
    batch_size: int = Field(default=100, ge=1)
    batch_time_interval_ms: int = Field(default=5, ge=1)
    batch_conflation_enabled: bool = False
    dispatching_paused: bool = False
    retry_interval_ms: int = Field(default=100, ge=1)
    fetch_wait_max_ms: int = Field(default=100, ge=1)
    member_id: str = Field(default_factory=lambda: generated_member_id("aeq"))
    lease_ttl_ms: int = Field(default=10_000, ge=300)

    @field_validator("queue_id", "namespace")
    @classmethod
    def _topic_legal(cls, value: str) -> str:
        return check_name("name", value, max_len=120)


class AsyncEventQueue(QueueProcessor):
    """The dispatcher of one async event queue: runs on threads until :meth:`stop`.

    Args:
        settings: The queue's settings.
        listener: The listener (overrides ``settings.listener``).

    Raises:
        ConfigurationError: no listener given, or it cannot be loaded.
    """

    def __init__(
        self, settings: AsyncEventQueueSettings, listener: AsyncEventListener | None = None
    ) -> None:
        # The listener first: a queue that cannot load it refuses to start before it
        # connects anywhere.
        if listener is None:
            if not settings.listener:
                raise ConfigurationError("an async event queue needs a listener")
            listener = load_hook(settings.listener, AsyncEventListener)
        super().__init__(
            role=dispatcher_role(settings.queue_id),
            namespace=settings.namespace,
            kafka_config=settings.librdkafka(),
            fetch_wait_max_ms=settings.fetch_wait_max_ms,
            redis_client=connect_redis(settings),
            member_id=settings.member_id,
            topic=Topics(settings.namespace).async_event_queue(settings.queue_id),
            group_id=Topics(settings.namespace).dispatcher_group(settings.queue_id),
            batch_size=settings.batch_size,
            batch_time_interval_ms=settings.batch_time_interval_ms,
            lease_ttl_ms=settings.lease_ttl_ms,
            metrics_port=settings.metrics_port,
            metrics_host=settings.metrics_host,
            liveness_timeout_s=settings.liveness_timeout_s,
        )
        self.settings = settings
        self.listener = listener
        self._resumed = threading.Event()
        if not settings.dispatching_paused:
            self._resumed.set()

    def pause_event_dispatching(self) -> None:
        """Stop dispatching after the batch in hand; events keep being queued."""
        self._resumed.clear()

    def resume_event_dispatching(self) -> None:
        """Dispatch again (also: start a queue created paused)."""
        self._resumed.set()

    @property
    def is_dispatching_paused(self) -> bool:
        """True while dispatching is paused."""
        return not self._resumed.is_set()

    def _can_peek(self) -> bool:
        return self._resumed.is_set()

    def _metric_families(self) -> list[Metric]:
        return async_event_queue_metric_families(self)

    def _close(self) -> None:
        try:
            self.listener.close()
        except Exception:
            log.exception("async event listener close failed")

    def _dispatch(self, events: list[Event]) -> bool:
        if self.settings.batch_conflation_enabled:
            events = conflate(events)
        batch = [AsyncEvent.from_event(e) for e in events]
        while not self.stopping.is_set() and self._primary.is_set():
            self.turned()
            try:
                done = self.listener.process_events(batch)
            except Exception:
                log.exception("async event queue %s: listener failed", self.settings.queue_id)
                done = False
            if done:
                self.stats.dispatched(len(batch))
                return True
            self.stats.batches_redispatched += 1
            batch = [e._replace(possible_duplicate=True) for e in batch]
            self.stopping.wait(self.settings.retry_interval_ms / 1000)
        return False


def async_event_queue_metric_families(queue: AsyncEventQueue) -> list[Metric]:
    """The metric families of one scrape of an async event queue dispatcher, read from its
    stats. Every sample carries ``namespace``, ``member`` (the worker's) and ``queue``;
    counters end in ``_total``:

    - ``regionbus_async_event_queue_batches_dispatched_total``: batches the listener
      accepted; ``..._events_dispatched_total``: events in them.
    - ``regionbus_async_event_queue_retries_total``: deliveries repeated (flagged possible
      duplicate) after the listener returned False or raised.
    - ``regionbus_async_event_queue_backlog_events`` (gauge): queued events not yet accepted
      (only while primary).
    - ``regionbus_async_event_queue_primary``, ``regionbus_async_event_queue_paused``
      (gauges).

    Args:
        queue: The dispatcher; only read.
    """
    s = queue.settings
    stats = queue.stats
    families = MetricFamilies(
        {"namespace": s.namespace, "member": s.member_id, "queue": s.queue_id}
    )
    prefix = "async_event_queue_"
    metrics: list[Metric] = [
        families.counter(
            prefix + "batches_dispatched",
            "Batches the AsyncEventListener accepted (returned True).",
            stats.batches_dispatched,
        ),
        families.counter(
            prefix + "events_dispatched",
            "Events in accepted batches.",
            stats.events_dispatched,
        ),
        families.counter(
            prefix + "retries",
            "Batches delivered again, flagged possible duplicate, after the listener "
            "returned False or raised.",
            stats.batches_redispatched,
        ),
        families.gauge(
            prefix + "primary", "1 while this worker is the queue's dispatcher.", queue.is_primary
        ),
        families.gauge(
            prefix + "paused", "1 while dispatching is paused.", queue.is_dispatching_paused
        ),
    ]
    backlog = stats.backlog_events
    if backlog is not None:
        metrics.append(
            families.gauge(
                prefix + "backlog_events",
                "Queued events the listener has not accepted yet (primary only).",
                backlog,
            )
        )
    return metrics


__all__ = [
    "AsyncEvent",
    "AsyncEventListener",
    "AsyncEventQueue",
    "AsyncEventQueueSettings",
    "async_event_queue_metric_families",
]
