"""Keeps a cache server's own topics in existence while it runs.

A cache server creates ``{ns}.ops``, ``{ns}.events``, ``{ns}.control``, ``{ns}.dead-letter``
and its gateway sender and async event queue topics at start (`regionbus.schemas.topics`). One can
disappear while it runs: an operator deletes it, or a broker comes back without its data.
Its producer then fails every message to it, and its consumer waits, silently, at an
offset the new topic may not reach for a long time. So the keeper looks at the topics
every ``check_interval_s`` seconds (sooner after a client error named one) by their
**topic ids**, without blocking the server's loop (the answer is looked at on a later
call):

- a missing topic is created again, with its partitions and configs, and logged as a
  WARNING naming it;
- a topic whose id changed was created again by someone else (another server of the
  namespace got there first).

Either way :meth:`TopicKeeper.keep` returns its name, so the server refreshes its
producer's view of it and reads its partitions from the start again (Kafka deleted the
committed offsets with the old topic).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any, Final

from confluent_kafka import KafkaError, KafkaException, TopicCollection

from regionbus.schemas.errors import ConfigurationError, TransportError
from regionbus.schemas.kafka_clients import KafkaAdmin
from regionbus.schemas.topics import TopicSpec, ensure_topic_configs, ensure_topics

log = logging.getLogger("regionbus.server.topics")

MIN_CHECK_GAP_S: Final = 0.2
"""Least time between two checks, however many errors ask for one, in seconds."""

_MISSING = frozenset({KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC})


class TopicKeeper:
    """Creates a server's topics, then recreates any that disappear.

    Args:
        admin: An AdminClient of the cluster (the server's security settings).
        specs: The topics the server needs, with partitions and configs.
        check_interval_s: How often to look when nothing went wrong, in seconds (the
            server passes its ``message_sync_interval_s``).
        timeout_s: Longest wait for one metadata answer or creation, in seconds.
        clock: Monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        admin: KafkaAdmin,
        specs: Sequence[TopicSpec],
        *,
        check_interval_s: float,
        timeout_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._admin = admin
        self._specs = {spec.name: spec for spec in specs}
        self._check_interval_s = check_interval_s
        self._timeout_s = timeout_s
        self._clock = clock
        self._ids: dict[str, str] = {}
        self._last_check = clock()
        self._next_check = self._last_check + check_interval_s
        self._asked: Mapping[str, Future[Any]] | None = None
        self.recreated_total = 0
        """Topics this keeper created again since the server started."""

    @property
    def names(self) -> frozenset[str]:
        """The topics kept."""
        return frozenset(self._specs)

    def ensure(self, timeout_s: float = 30.0) -> list[str]:
        """Create the topics that do not exist yet (server start), set back the configs of
        existing ones that would lose or refuse records (`config_repairs`), and note their
        ids.

        Returns:
            The names created.

        Raises:
            ConfigurationError: an existing topic has another partition count, or needed
                a config repair the cluster refused.
            TransportError: the cluster did not answer or refused, within ``timeout_s``.
        """
        created = ensure_topics(self._admin, self._specs.values(), timeout_s=timeout_s)
        existing = [spec for name, spec in self._specs.items() if name not in created]
        for name, configs in ensure_topic_configs(self._admin, existing).items():
            log.warning("topic %s would lose or refuse records: set %s", name, configs)
        try:
            described = self._describe(self._specs)
        except (KafkaException, TimeoutError) as exc:
            raise TransportError(f"Kafka metadata of the server topics: {exc}") from exc
        self._ids = {name: topic_id for name, topic_id in described.items() if topic_id}
        return created

    def suspect(self, topic: str | None) -> bool:
        """A producer or consumer error named ``topic``: look soon if it is one of ours.

        Returns:
            True when ``topic`` is kept here.
        """
        if topic not in self._specs:
            return False
        self._next_check = min(self._next_check, self._last_check + MIN_CHECK_GAP_S)
        return True

    def keep(self) -> list[str]:
        """When a check is due, ask Kafka about the topics; when its answer is in (a later
        call), recreate the missing topics and find those recreated elsewhere. Only a
        recreation waits for Kafka. Never raises: a cluster that does not answer is asked
        again next time.

        Returns:
            The topics that are new since the last check (created here or elsewhere), to
            be read from their start; empty when none, or no answer is in yet.
        """
        now = self._clock()
        if self._asked is None:
            if now >= self._next_check:
                self._ask(now)
            return []
        if not all(future.done() for future in self._asked.values()):
            if now - self._last_check > self._timeout_s:
                log.warning(
                    "no answer about the server topics in %.0f s (will retry)", self._timeout_s
                )
                self._asked = None
            return []
        asked, self._asked = self._asked, None
        try:
            return self._check(self._answers(asked, wait_s=0))
        except (TransportError, KafkaException, TimeoutError) as exc:
            log.warning("cannot check or recreate the server topics (will retry): %s", exc)
        except ConfigurationError as exc:
            log.error("a server topic is not as this server needs it: %s", exc)
        return []

    def _ask(self, now: float) -> None:
        self._last_check = now
        self._next_check = now + self._check_interval_s
        try:
            self._asked = self._admin.describe_topics(
                TopicCollection(sorted(self._specs)), request_timeout=self._timeout_s
            )
        except KafkaException as exc:
            log.warning("cannot check the server topics (will retry): %s", exc)

    def _check(self, ids: dict[str, str | None]) -> list[str]:
        missing = sorted(name for name, topic_id in ids.items() if topic_id is None)
        created: list[str] = []
        if missing:
            created = ensure_topics(
                self._admin, [self._specs[name] for name in missing], timeout_s=self._timeout_s
            )
            for name in created:
                spec = self._specs[name]
                configs = ", ".join(f"{k}={v}" for k, v in sorted(spec.config.items()))
                log.warning(
                    "recreated topic %s (%d partitions, %s): it had disappeared; reading it "
                    "from its start",
                    name,
                    spec.partitions,
                    configs or "broker defaults",
                )
            self.recreated_total += len(created)
            ids.update(self._describe(missing))
        renewed = []
        for name, topic_id in ids.items():
            if topic_id is None:
                continue
            if self._ids.get(name, topic_id) != topic_id:
                renewed.append(name)
                if name not in created:
                    log.warning(
                        "topic %s was created again elsewhere (new topic id); reading it from "
                        "its start",
                        name,
                    )
            self._ids[name] = topic_id
        return sorted(renewed)

    def _describe(self, names: Iterable[str]) -> dict[str, str | None]:
        """``{topic: topic id}``, None for a topic the cluster does not have; waits.

        Raises:
            KafkaException, TimeoutError: the cluster did not answer about a topic.
        """
        futures = self._admin.describe_topics(
            TopicCollection(sorted(names)), request_timeout=self._timeout_s
        )
        return self._answers(futures, wait_s=self._timeout_s)

    @staticmethod
    def _answers(futures: Mapping[str, Future[Any]], wait_s: float) -> dict[str, str | None]:
        """The topic ids of a describe_topics answer (None: no such topic).

        Raises:
            KafkaException, TimeoutError: the cluster did not answer about a topic.
        """
        found: dict[str, str | None] = {}
        for name, future in futures.items():
            try:
                found[name] = str(future.result(timeout=wait_s).topic_id)
            except KafkaException as exc:
                if exc.args[0].code() not in _MISSING:
                    raise
                found[name] = None
        return found


__all__ = ["MIN_CHECK_GAP_S", "TopicKeeper"]
