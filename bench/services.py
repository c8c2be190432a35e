"""What every benchmark phase is given: where the run's Kafka and Redis are, and the load.

``Services`` names the namespace, the bootstrap servers and Redis URL, and the pids of the
services the run started (for the CPU figures); ``BenchOptions`` is the load every phase
shares (``python -m bench.core --help``), which ``bench.failover`` derives from its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

REGION: Final = "bench"
"""The region every benchmark writes and subscribes to."""

ACK_TIMEOUT_S: Final = 120.0
"""How long a phase waits for the answers of its puts or produces."""

RESULT_TIMEOUT_S: Final = 180.0
"""How long a phase waits for its readers' results once the writer is done."""

# Brokers close idle connections and librdkafka reports each at level 6. Errors still show.
_QUIET = {"log_level": 3}


@dataclass(frozen=True, slots=True)
class BenchOptions:
    """The options of one run (see ``python -m bench.core --help``)."""

    ops: int
    subscribers: int
    rate: int
    latency_seconds: float
    value_bytes: int
    fetch_wait_max_ms: int
    linger_ms: int
    writer: str
    window: int
    chunk: int
    key_space: int
    warmup_seconds: float
    idle_timeout_s: float


@dataclass(frozen=True, slots=True)
class Services:
    """Where the run's Kafka and Redis are, its namespace, and the pids of its services
    (``server``, and ``kafka`` / ``redis`` when this run started them; a list for a
    service of several processes, such as a Redis Cluster)."""

    namespace: str
    kafka_bootstrap_servers: str
    redis_url: str
    pids: dict[str, int | list[int] | None]

    @property
    def kafka_config(self) -> dict[str, Any]:
        """librdkafka settings every raw client starts from."""
        return {"bootstrap.servers": self.kafka_bootstrap_servers, **_QUIET}

    def client_settings(self, options: BenchOptions, **overrides: Any) -> dict[str, Any]:
        """``ClientSettings`` fields for the regionbus clients of the run."""
        return {
            "namespace": self.namespace,
            "kafka_bootstrap_servers": self.kafka_bootstrap_servers,
            "fetch_wait_max_ms": options.fetch_wait_max_ms,
            "linger_ms": options.linger_ms,
            "kafka_config": dict(_QUIET),
            **overrides,
        }


__all__ = ["ACK_TIMEOUT_S", "REGION", "RESULT_TIMEOUT_S", "BenchOptions", "Services"]
