"""A writer client in its own OS process for the high-availability tests.

Usage: ``python ha_writer_process.py '<json config>'``. Puts ``{"i": i, "sent_ms": t}`` to
keys ``<writer>-<i mod keys>`` of region ``r`` with ``put_async`` (at most ``window`` in
flight, about ``rate`` per second) until the file ``stop`` exists, then waits for every
answer. Each answer is appended to ``out`` as a JSON line ``{"key", "i", "ok"}``.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from regionbus.clients import ClientCache, ClientSettings, RegionShortcut


def main(config: dict[str, Any]) -> None:
    cache = ClientCache(
        ClientSettings(
            namespace=config["namespace"],
            kafka_bootstrap_servers=config["bootstrap"],
            subscription_enabled=False,
            fetch_wait_max_ms=100,
            read_timeout_ms=30_000,
        )
    )
    region = cache.create_region("r", RegionShortcut.PROXY)
    out = open(config["out"], "a", encoding="utf-8")  # noqa: SIM115
    lock = threading.Lock()
    window = threading.Semaphore(config.get("window", 50))
    stop = Path(config["stop"])
    pause_s = 1.0 / config.get("rate", 200)
    writer = config["writer"]

    def answered(future: Future[None], key: str, i: int) -> None:
        error = future.exception()
        with lock:
            out.write(json.dumps({"key": key, "i": i, "ok": error is None}) + "\n")
            out.flush()
        window.release()

    i = 0
    while not stop.exists():
        key = f"{writer}-{i % config.get('keys', 64)}"
        window.acquire()
        future = region.put_async(key, {"i": i, "sent_ms": time.time() * 1000})
        future.add_done_callback(lambda f, key=key, i=i: answered(f, key, i))
        i += 1
        time.sleep(pause_s)
    for _ in range(config.get("window", 50)):
        window.acquire(timeout=60)
    cache.close()
    out.close()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
