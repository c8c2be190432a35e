"""Telling a Kafka outage apart from a broker failover, and logging it once.

librdkafka reconnects by itself, so a process rides out a Kafka outage by waiting; what it
must not do is flood its log. Left alone, every librdkafka client of a process prints one
"Connect to ... failed: Connection refused" line per broker per reconnect attempt. Here:

- every librdkafka client of a process logs through the Python logger
  ``regionbus.kafka.librdkafka`` (:data:`LIBRDKAFKA_LOGGER`), where the lines of what
  librdkafka retries by itself (a broker connection failing, a producer id not granted
  yet while a restarted broker loads) are demoted to DEBUG, on
  ``regionbus.kafka.connections``;
- the first failed connection to a broker address is one WARNING naming the address
  (:class:`UnreachableBrokers`), the next ones stay at DEBUG until the failures pause;
- the clients a process polls report to one :class:`KafkaOutage` of that process: its
  ``error_cb`` hears librdkafka's ``_ALL_BROKERS_DOWN`` and its ``stats_cb`` the state of
  each broker connection every second. librdkafka says "all brokers are down" as soon as
  every broker the client was connected to is down, which a failover does too (one broker
  of a cluster dies, the client connects to another within a second), so an outage is
  declared only when a statistics report a full period later still shows no broker
  ``UP``, and it ends at the first report that shows one. One WARNING marks its start and
  one INFO its end with its duration, whatever the number of clients, as
  :mod:`regionbus.runtime.redis_outage` does for Redis.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable
from typing import Any, Final

from confluent_kafka import KafkaError

log = logging.getLogger("regionbus.kafka")

LIBRDKAFKA_LOGGER: Final = logging.getLogger("regionbus.kafka.librdkafka")
"""Where librdkafka's own log lines go (config key ``logger``)."""

_CONNECTIONS_LOGGER: Final = logging.getLogger("regionbus.kafka.connections")

STATISTICS_INTERVAL_MS: Final = 1_000
"""How often a watched client reports its brokers' states, so how soon the end of an
outage is noticed (librdkafka ``statistics.interval.ms``)."""

_RETRIED_FACILITIES: Final = frozenset({"FAIL", "GETPID"})
"""librdkafka's log facilities of a broker connection that failed or closed, and of an
idempotent producer's id request that failed: both are retried by librdkafka, and an
outage is reported by :class:`KafkaOutage` instead."""

_QUIET_ERRORS: Final = frozenset({KafkaError._TRANSPORT, KafkaError._RESOLVE})
"""``error_cb`` codes raised once per connection attempt: a failover or part of an outage
that ``_ALL_BROKERS_DOWN`` reports once."""

_NOT_BROKERS: Final = frozenset({"logical", "internal"})
"""``source`` of the statistics' pseudo-brokers (e.g. ``GroupCoordinator``), whose state
is not a connection of their own."""


UNREACHABLE_QUIET_S: Final = 60.0
"""A broker whose connection attempts have failed without a pause this long is still the
same outage: its next failure stays at DEBUG. librdkafka retries at most
``reconnect.backoff.max.ms`` (10 s by default) apart, so a longer silence means the broker
was reached meanwhile, or no client tried it."""

_CONNECT_FAILED: Final = re.compile(
    r"(?:\w+://)?(?P<address>[^\s/\]]+:\d+)/(?:bootstrap|\d+): "
    r"(?P<what>(?:Connect to|Failed to resolve)[^\n]*)"
)
"""A librdkafka FAIL line of a connection attempt: ``127.0.0.1:9092/bootstrap: Connect to
ipv4#127.0.0.1:9092 failed: Connection refused (after 0ms in state CONNECT)``."""


class UnreachableBrokers:
    """One WARNING per unreachable broker address in a process, then quiet.

    Every librdkafka client of the process logs one line per failed connection attempt
    (about 20 a second for a few clients); the first failure of an address is logged as a
    WARNING naming it, later ones only at DEBUG, until the address has gone
    :data:`UNREACHABLE_QUIET_S` without a failure or :meth:`clear` says Kafka is back.

    Args:
        clock: Monotonic seconds (tests pass their own).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._last_failure: dict[str, float] = {}
        self._lock = threading.Lock()

    def failed(self, address: str, what: str) -> bool:
        """Note a failed connection attempt; returns True (and logs the WARNING) when it
        starts a new stretch of failures of ``address``."""
        now = self._clock()
        with self._lock:
            last = self._last_failure.get(address)
            self._last_failure[address] = now
        if last is not None and now - last < UNREACHABLE_QUIET_S:
            return False
        log.warning(
            "Kafka broker %s unreachable (%s); its clients keep retrying quietly (each "
            "attempt at DEBUG on %s). Is Kafka running there? Check "
            "REGIONBUS_KAFKA_BOOTSTRAP_SERVERS, or start one with `regionbus stack`",
            address,
            what,
            _CONNECTIONS_LOGGER.name,
        )
        return True

    def clear(self) -> None:
        """Forget every failure: a broker reached again warns anew when it fails."""
        with self._lock:
            self._last_failure.clear()


UNREACHABLE_BROKERS: Final = UnreachableBrokers()
"""The process's record of unreachable brokers, fed by every client's librdkafka log."""


class _RetriedLines(logging.Filter):
    """Moves librdkafka's lines of what it retries to DEBUG on another logger, after one
    WARNING per unreachable broker (:class:`UnreachableBrokers`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and args and args[0] in _RETRIED_FACILITIES:
            found = _CONNECT_FAILED.search(str(args[-1]))
            if found is not None:
                UNREACHABLE_BROKERS.failed(found["address"], found["what"])
            _CONNECTIONS_LOGGER.debug(record.msg, *args)
            return False
        return True


LIBRDKAFKA_LOGGER.addFilter(_RetriedLines())


def quiet_config() -> dict[str, Any]:
    """librdkafka keys of a client that is not watched (an admin client, a short-lived
    consumer): its log goes to :data:`LIBRDKAFKA_LOGGER`, connection failures at DEBUG.

    A client configured so serves its log lines on ``poll()``; one never polled keeps
    them unread, which is how an admin client stays silent during an outage.
    """
    return {"logger": LIBRDKAFKA_LOGGER}


def brokers_up(statistics_json: str) -> bool:
    """Whether librdkafka statistics show a broker connection in state ``UP``.

    Args:
        statistics_json: The JSON document librdkafka hands to ``stats_cb``.

    Returns:
        True when a real broker (a bootstrap or learned one, not a logical one such as the
        group coordinator) is ``UP``; False otherwise, or when the document is malformed.
    """
    try:
        brokers = json.loads(statistics_json).get("brokers", {})
    except (ValueError, AttributeError):
        return False
    return any(
        isinstance(b, dict) and b.get("state") == "UP" and b.get("source") not in _NOT_BROKERS
        for b in brokers.values()
    )


class KafkaOutage:
    """One process's view of Kafka outages, fed by the librdkafka clients it polls.

    An outage starts when a watched client reported that all its brokers are down and its
    next statistics a full period later show no broker ``UP``; it ends once every client
    in the outage sees a broker ``UP`` again. Thread-safe: the callbacks run on whichever
    thread polls each client.

    Args:
        who: The process's name for the log lines (e.g. ``"cache server s1"``).
        statistics_interval_ms: librdkafka ``statistics.interval.ms`` of watched clients.
    """

    def __init__(self, who: str, *, statistics_interval_ms: int = STATISTICS_INTERVAL_MS) -> None:
        self.who = who
        self.statistics_interval_ms = statistics_interval_ms
        self.outages = 0
        """Outages that started since this tracker was made."""
        self._suspects: dict[str, tuple[float, str]] = {}
        """client -> (monotonic time, reason) of its "all brokers are down", not yet confirmed."""
        self._down: set[str] = set()
        self._began: float | None = None
        self._lock = threading.Lock()

    @property
    def ongoing(self) -> bool:
        """True from the start of an outage until its end."""
        with self._lock:
            return self._began is not None

    def client_config(self, client: str, *, watched: bool = True) -> dict[str, Any]:
        """librdkafka keys that make a client report to this tracker (and log quietly).

        Args:
            client: A name for the client, unique in this tracker (e.g. ``"producer"``);
                pass it to :meth:`forget` when the client is closed.
            watched: False for a client whose process has other watched clients of the
                same brokers: it reports errors but no statistics (which librdkafka builds
                every ``statistics_interval_ms``, a cost per client of a fleet), and its
                "all brokers are down" is left to those others to confirm.

        Returns:
            ``error_cb`` and ``logger``, and when watched ``stats_cb`` and
            ``statistics.interval.ms``. The client must be polled for them to be served.
        """
        if not watched:
            return {**quiet_config(), "error_cb": self._error_callback(client, suspects=False)}
        return {
            **quiet_config(),
            "error_cb": self._error_callback(client),
            "stats_cb": self._stats_callback(client),
            "statistics.interval.ms": self.statistics_interval_ms,
        }

    def forget(self, client: str) -> None:
        """Stop counting a closed client: it will never report a broker up again. An outage
        that only closed clients saw is over for this process, without an INFO (nothing
        came back)."""
        with self._lock:
            self._suspects.pop(client, None)
            self._down.discard(client)
            if not self._down:
                self._began = None

    def _error_callback(
        self, client: str, *, suspects: bool = True
    ) -> Callable[[KafkaError], None]:
        def on_error(error: KafkaError) -> None:
            code = error.code()
            if code == KafkaError._ALL_BROKERS_DOWN and not suspects:
                log.debug("%s: %s: %s", self.who, client, error.str())
            elif code == KafkaError._ALL_BROKERS_DOWN:
                with self._lock:
                    if client not in self._down:
                        self._suspects.setdefault(client, (time.monotonic(), error.str()))
            elif code in _QUIET_ERRORS:
                log.debug("%s: %s: %s", self.who, client, error.str())
            elif error.fatal():
                log.error("%s: %s: fatal Kafka error: %s", self.who, client, error.str())
            else:
                log.warning("%s: %s: Kafka error: %s", self.who, client, error.str())

        return on_error

    def _stats_callback(self, client: str) -> Callable[[str], None]:
        confirm_s = self.statistics_interval_ms / 1000

        def on_stats(statistics_json: str) -> None:
            # Parsed only while this client is or may be down: the statistics of a busy
            # client are large, and otherwise nothing in them matters here.
            with self._lock:
                suspect = self._suspects.get(client)
                down = client in self._down
            if suspect is None and not down:
                return
            if brokers_up(statistics_json):
                with self._lock:
                    self._suspects.pop(client, None)
                if down:
                    self._back(client)
            elif suspect is not None and time.monotonic() - suspect[0] >= confirm_s:
                self._lost(client, *suspect)

        return on_stats

    def _lost(self, client: str, since: float, reason: str) -> None:
        """Confirm an outage that ``client`` saw begin at ``since`` (monotonic seconds)."""
        with self._lock:
            self._suspects.pop(client, None)
            self._down.add(client)
            if self._began is not None:
                return
            self._began = since
            self.outages += 1
        log.warning(
            "Kafka unavailable for %s (%s): waiting for a broker; operations time out "
            "meanwhile and resume once it is back",
            self.who,
            reason,
        )

    def _back(self, client: str) -> None:
        with self._lock:
            self._down.discard(client)
            if self._down or self._began is None:
                return
            down_s = time.monotonic() - self._began
            self._began = None
        UNREACHABLE_BROKERS.clear()
        log.info("Kafka available again for %s after %.1f s", self.who, down_s)


__all__ = [
    "LIBRDKAFKA_LOGGER",
    "STATISTICS_INTERVAL_MS",
    "UNREACHABLE_BROKERS",
    "UNREACHABLE_QUIET_S",
    "KafkaOutage",
    "UnreachableBrokers",
    "brokers_up",
    "quiet_config",
]
