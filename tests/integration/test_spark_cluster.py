"""The Spark jobs on a Spark standalone cluster (a master and a worker from the installed
pyspark, on loopback): bulk load, queue analytics and flights delays run with
``--master spark://...``, each as the command line a user types, in its own process (one
Spark application each), with the connector jars and the Python workers on the executors."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from support import settle

from regionbus.broker.server import CacheServer
from regionbus.demo.flights import run_replay
from regionbus.devstack.spark_cluster import EmbeddedSparkCluster
from regionbus.schemas.naming import RedisKeys

_JOB_TIMEOUT_S = 600


@pytest.fixture(scope="module")
def spark_master() -> Iterator[str]:
    """The ``spark://`` URL of this module's standalone cluster (2 cores, 1.5 GiB)."""
    with EmbeddedSparkCluster(cores=2, memory_mb=1536) as cluster:
        yield cluster.url


def _regionbus(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(Path(sys.executable).parent / "regionbus"), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=_JOB_TIMEOUT_S,
        check=False,
    )


def test_the_jobs_run_on_a_standalone_cluster(
    spark_master: str,
    cache_server: CacheServer,
    client_factory: Any,
    kafka_bootstrap_servers: str,
    redis_url: str,
    redis_client: Any,
    namespace: str,
    tmp_path: Path,
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REGIONBUS_")}
    env.update(REGIONBUS_KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap_servers, COLUMNS="300")
    path = tmp_path / "entries.parquet"
    pd.DataFrame({"id": [f"id-{i}" for i in range(300)], "n": range(300)}).to_parquet(path)
    lagging = client_factory(subscription_ack_interval_ms=3_600_000)
    lagging.create_region("r").register_interest_regex("id-.*")

    loaded = _regionbus(
        [
            *("spark", "bulk-load", "--master", spark_master, "--namespace", namespace),
            *("--region", "r", "--input", str(path), "--key-column", "id"),
        ],
        env,
    )

    assert loaded.returncode == 0, loaded.stderr[-3000:]
    assert "300 entries, 300 applied, 0 duplicates, 0 refused" in loaded.stdout
    keys = RedisKeys(namespace)
    assert sum(int(redis_client.hlen(keys.region_meta("r", b))) for b in range(16)) == 300
    settle(lagging)

    analysed = _regionbus(
        ["spark", "analytics", "--master", spark_master, "--namespace", namespace], env
    )

    assert analysed.returncode == 0, analysed.stderr[-3000:]
    assert lagging.client_id in analysed.stdout

    report = run_replay(kafka_bootstrap_servers, redis_url, namespace, 1, verify_state=False)
    assert report.operations_failed == 0
    output = tmp_path / "delays"
    delays = _regionbus(
        [
            *("spark", "delays", "--master", spark_master, "--namespace", namespace),
            *("--output", str(output), "--checkpoint", str(tmp_path / "checkpoint")),
        ],
        env,
    )

    assert delays.returncode == 0, delays.stderr[-3000:]
    assert "rows in" in delays.stdout
    assert len(pd.read_parquet(output)) > 0
