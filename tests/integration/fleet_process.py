"""Many client caches in one OS process, to be killed with SIGKILL by a test.

Usage: ``python fleet_process.py '<json config>'``. Connects ``count`` clients to
``namespace`` at ``bootstrap`` with client ids ``<prefix>-<n>`` (durable ones when
``durable_client_timeout_s`` is set: durable interest, ready for events), each with
interest in every key of region ``r``, pinging every ``ping_interval_ms``; then writes
``ready`` to ``out`` and waits to be killed.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from regionbus.clients import ALL_KEYS, ClientCache, ClientSettings


def main(config: dict[str, Any]) -> None:
    timeout_s = config.get("durable_client_timeout_s")
    caches = []
    for n in range(config["count"]):
        client_id = f"{config['prefix']}-{n}"
        settings = ClientSettings(
            namespace=config["namespace"],
            kafka_bootstrap_servers=config["bootstrap"],
            fetch_wait_max_ms=100,
            read_timeout_ms=60_000,
            ping_interval_ms=config["ping_interval_ms"],
            **(
                {"durable_client_id": client_id, "durable_client_timeout_s": timeout_s}
                if timeout_s is not None
                else {"client_id": client_id}
            ),
        )
        cache = ClientCache(settings)
        cache.create_region("r").register_interest(ALL_KEYS, durable=timeout_s is not None)
        if timeout_s is not None:
            cache.ready_for_events()
        caches.append(cache)
    Path(config["out"]).write_text("ready\n")
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
