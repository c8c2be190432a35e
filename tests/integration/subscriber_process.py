"""A subscribed client in its own OS process, to be stalled with SIGSTOP by a test.

Usage: ``python subscriber_process.py '<json config>'``. Connects to ``namespace`` at
``bootstrap``, registers interest in every key of region ``r`` and appends JSON lines to
``out`` (flushed at once): ``{"ev": "ready", "client_id": ...}`` once registered, then one
``{"ev": "create" | "update", "key": ..., "value": ...}`` per event. It runs until its
stdin closes.
A SIGSTOP freezes all of it: its subscription queue is neither read nor acked, and it
sends no pings.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from regionbus.clients import ALL_KEYS, CacheListener, ClientCache, ClientSettings, EntryEvent


class _Out(CacheListener):
    def __init__(self, path: str) -> None:
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115
        self._lock = threading.Lock()

    def write(self, record: dict[str, Any]) -> None:
        with self._lock:
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()

    def after_create(self, event: EntryEvent) -> None:
        self.write({"ev": "create", "key": event.key, "value": event.new_value})

    def after_update(self, event: EntryEvent) -> None:
        self.write({"ev": "update", "key": event.key, "value": event.new_value})


def main(config: dict[str, Any]) -> None:
    out = _Out(config["out"])
    cache = ClientCache(
        ClientSettings(
            namespace=config["namespace"],
            kafka_bootstrap_servers=config["bootstrap"],
            fetch_wait_max_ms=100,
            read_timeout_ms=30_000,
        )
    )
    cache.create_region("r", listeners=[out]).register_interest(ALL_KEYS)
    out.write({"ev": "ready", "client_id": cache.client_id})
    sys.stdin.read()
    cache.close()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
