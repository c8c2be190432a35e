"""What a connected client cache costs Kafka: a fleet of thousands pays it per client."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from regionbus.broker.server import CacheServer

_HERE = Path(__file__).parent


def test_a_connected_client_cache_runs_three_librdkafka_clients_and_none_once_closed(
    cache_server: CacheServer, namespace: str, kafka_bootstrap_servers: str
) -> None:
    # Its producer and its queue and reply consumers: the admin client that found its
    # topics at connect is gone once it is connected (each costs a broker connection and
    # a handful of threads, idle or not).
    done = subprocess.run(
        [
            sys.executable,
            str(_HERE / "client_footprint_process.py"),
            namespace,
            kafka_bootstrap_servers,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    counts = json.loads(done.stdout.strip().splitlines()[-1])
    assert counts == {"connected": 3, "closed": 0}
