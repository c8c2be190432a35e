"""One client cache alone in an OS process, reporting the librdkafka clients it runs.

Usage: ``python client_footprint_process.py <namespace> <bootstrap>``. Connects a client
cache with interest in every key of region ``r``, then prints one JSON line: the number of
librdkafka clients of the process once connected (each runs exactly one thread named
``rdk:main``), and after ``close``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from regionbus.clients import ALL_KEYS, ClientCache, ClientSettings


def librdkafka_clients() -> int:
    """The ``rdk:main`` threads of this process: one per live librdkafka client."""
    count = 0
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as comm:
                count += comm.read().strip() == "rdk:main"
        except OSError:
            continue  # the thread ended while listed
    return count


def settled(deadline_s: float, wanted: int) -> int:
    """The count once it is ``wanted``, or the last one seen by ``deadline_s`` (a
    destroyed client's threads end just after its last reference goes)."""
    deadline = time.monotonic() + deadline_s
    while True:
        count = librdkafka_clients()
        if count == wanted or time.monotonic() >= deadline:
            return count
        time.sleep(0.05)


def main(namespace: str, bootstrap: str) -> None:
    cache = ClientCache(
        ClientSettings(
            namespace=namespace, kafka_bootstrap_servers=bootstrap, fetch_wait_max_ms=100
        )
    )
    cache.create_region("r").register_interest(ALL_KEYS)
    connected = settled(10, 3)
    cache.close()
    closed = settled(10, 0)
    print(json.dumps({"connected": connected, "closed": closed}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
