"""A storm of clients in one OS process, apart from the server's (as real clients are).

Usage: ``python storm_process.py '<json config>'``. Connects ``count`` client caches to
``namespace`` at ``bootstrap``, writes ``connected`` to ``out``, waits for the file
``go``, then has every client register interest in every key of region ``region`` with
``KEYS_VALUES`` at once; writes to ``out`` one JSON line ``{"entries": [...],
"seconds": [...], "errors": [...]}``: each client's local entry count and registration
time, and the error of each that failed. Then closes them and exits.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from regionbus.clients import ALL_KEYS, ClientCache, ClientSettings


def main(config: dict[str, Any]) -> None:
    out, go = Path(config["out"]), Path(config["go"])

    def connect(n: int) -> ClientCache:
        return ClientCache(
            ClientSettings(
                namespace=config["namespace"],
                kafka_bootstrap_servers=config["bootstrap"],
                client_id=f"storm-{n}",
                fetch_wait_max_ms=100,
                # Queued behind the storm's loads, a client waits longer than the default.
                read_timeout_ms=config["read_timeout_ms"],
            )
        )

    with ThreadPoolExecutor(8) as pool:
        caches = list(pool.map(connect, range(config["count"])))
    regions = [cache.create_region(config["region"]) for cache in caches]
    out.write_text("connected\n")
    while not go.exists():
        time.sleep(0.02)
    seconds: list[float] = []
    errors: list[str] = []

    def register(region: Any) -> None:
        started = time.monotonic()
        try:
            region.register_interest(ALL_KEYS)
        except Exception as exc:  # reported to the test, which fails on it
            errors.append(repr(exc))
            return
        seconds.append(time.monotonic() - started)

    threads = [threading.Thread(target=register, args=(r,)) for r in regions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    result = {"entries": [len(r) for r in regions], "seconds": seconds, "errors": errors}
    out.write_text(json.dumps(result) + "\n")
    for cache in caches:
        cache.close()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
