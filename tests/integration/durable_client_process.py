"""A durable client in its own OS process, driven by the durable-client tests.

Usage: ``python durable_client_process.py '<json config>'``. The config names the namespace,
bootstrap servers, durable id, regions, interest and an output file. The process connects,
creates its regions with a recording listener, registers the interest it is told to, calls
``ready_for_events`` and then obeys commands read from stdin, one per line:
``close_keep_alive``, ``close``, ``dump``. Everything it sees is appended to the output file
as JSON lines (flushed at once, so a kill -9 loses nothing already written):

- ``{"ev": "connected", "state": ..., "pending": n}``
- ``{"ev": "<create|update|destroy|invalidate>", "region", "key", "value", "cached",
  "event_id": [member, thread, sequence, bucket]}`` where ``cached`` is the key's value in
  the local cache when the listener ran (the cache is applied before listeners), so a
  replayed event shows the cache unchanged by it;
- ``{"ev": "live", "region", "cache": {...}}`` at ``after_region_live``;
- ``{"ev": "ready"}``, ``{"ev": "dump", "cache": {...}}``, ``{"ev": "closed"}``.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from regionbus.clients import ClientCache, ClientSettings
from regionbus.clients.region import Region
from regionbus.schemas.callbacks import CacheListener, EntryEvent, RegionEvent


class _Out:
    def __init__(self, path: str) -> None:
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115
        self._lock = threading.Lock()

    def write(self, record: dict[str, Any]) -> None:
        with self._lock:
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()


class _Listener(CacheListener):
    def __init__(self, out: _Out) -> None:
        self.out = out
        self.region: Region | None = None

    def _entry(self, kind: str, event: EntryEvent) -> None:
        assert self.region is not None
        eid = event.event_id
        self.out.write(
            {
                "ev": kind,
                "region": event.region,
                "key": event.key,
                "value": event.new_value,
                "cached": self.region.local_entries().get(event.key),
                "event_id": list(eid[:4]) if eid is not None else None,
            }
        )

    def after_create(self, event: EntryEvent) -> None:
        self._entry("create", event)

    def after_update(self, event: EntryEvent) -> None:
        self._entry("update", event)

    def after_destroy(self, event: EntryEvent) -> None:
        self._entry("destroy", event)

    def after_invalidate(self, event: EntryEvent) -> None:
        self._entry("invalidate", event)

    def after_region_live(self, event: RegionEvent) -> None:
        assert self.region is not None
        self.out.write({"ev": "live", "region": event.region, "cache": self.region.local_entries()})


def main(config: dict[str, Any]) -> None:
    out = _Out(config["out"])
    cache = ClientCache(
        ClientSettings(
            namespace=config["namespace"],
            kafka_bootstrap_servers=config["bootstrap"],
            durable_client_id=config["durable_id"],
            durable_client_timeout_s=config.get("timeout_s", 300),
            ping_interval_ms=config.get("ping_interval_ms", 300),
            fetch_wait_max_ms=100,
            read_timeout_ms=15_000,
        )
    )
    out.write(
        {"ev": "connected", "state": cache.client_state, "pending": cache.pending_event_count}
    )
    regions: dict[str, Region] = {}
    for name in config["regions"]:
        listener = _Listener(out)
        region = cache.create_region(name, listeners=[listener])
        listener.region = region
        regions[name] = region
    for name, keys in config.get("durable_keys", {}).items():
        regions[name].register_interest(keys, durable=True)
    for name, keys in config.get("keys", {}).items():
        regions[name].register_interest(keys)
    cache.ready_for_events()
    out.write({"ev": "ready"})
    for line in sys.stdin:
        command = line.strip()
        if command == "dump":
            out.write({"ev": "dump", "cache": {n: r.local_entries() for n, r in regions.items()}})
        elif command in ("close_keep_alive", "close"):
            cache.close(keep_alive=command == "close_keep_alive")
            out.write({"ev": "closed"})
            return


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
