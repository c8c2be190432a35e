"""The gateway repair benchmark: two sites that diverged during a partition, made equal by
``regionbus gateway repair``, beside a raw copy of the whole region in the same run.

``python -m bench.gateway_repair`` starts the local stack (embedded Kafka and
``redis-server``), and a cache server per site (namespaces ``...a`` with site id 1 and
``...b`` with 2, in child processes). Then:

1. ``--keys`` entries (``--value-bytes`` each) are put at A, and copied to B as they are in
   Redis (``DUMP`` / ``RESTORE`` of each bucket's hashes): the sites start equal, version
   for version, as WAN delivery would have left them. That copy's time and bytes are the
   baseline: what repairing by copying the whole region costs.
2. The partition: ``--changes`` updates at each site (every tenth key changed at both, the
   later change winning), and ``--changes`` / 10 destroys at A.
3. ``GatewayRepair.run``: its time, the bytes that crossed between the sites, the keys it
   repaired; then a second run, which must find nothing, and the changed keys read at both
   sites, which must agree.

The issue's goal: 1,000,000 keys converge within 60 s of the repair, moving under 1 % of
the data.
"""

from __future__ import annotations

import logging
import os
import random
import secrets
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import click
import redis
from rich.console import Console

from bench import progress
from bench.summary import SummaryRow, emit
from regionbus.clients import ClientCache, ClientSettings, RegionShortcut
from regionbus.devstack import LocalStack
from regionbus.gateways.repair import GatewayRepair, RepairSite
from regionbus.schemas.naming import RedisKeys

REGION = "bench"
TOTAL_BUCKETS = 16
PUT_ALL_ENTRIES = 1000


def _server(
    name: str, namespace: str, site_id: int, kafka: str, redis_url: str, log_dir: Path
) -> Any:
    """A cache server of one site in a child process, once its log says it serves."""
    log_path = log_dir / f"{name}.log"
    args = ["serve", "--namespace", namespace, "--kafka", kafka, "--redis", redis_url]
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "regionbus", *args, "--region", REGION],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "REGIONBUS_DISTRIBUTED_SYSTEM_ID": str(site_id)},
            start_new_session=True,
        )
    deadline = time.monotonic() + 180
    while "serving namespace" not in log_path.read_text(errors="replace"):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise click.ClickException(f"{name} did not start: {log_path.read_text()[-2000:]}")
        time.sleep(0.2)
    return process


def _client(namespace: str, kafka: str) -> ClientCache:
    return ClientCache(
        ClientSettings(
            namespace=namespace,
            kafka_bootstrap_servers=kafka,
            subscription_enabled=False,
            read_timeout_ms=120_000,
        )
    )


def _copy_region(client: redis.Redis, ns_a: str, ns_b: str) -> int:
    """Copy A's region to B as it is in Redis (every bucket's entry hashes); returns the
    bytes copied (the dumps)."""
    a, b = RedisKeys(ns_a), RedisKeys(ns_b)
    copied = 0
    for bucket in range(TOTAL_BUCKETS):
        for name in ("region_values", "region_meta", "region_gateway_versions", "region_version"):
            dump = client.dump(getattr(a, name)(REGION, bucket))
            if dump is None:
                continue
            copied += len(dump)
            client.restore(getattr(b, name)(REGION, bucket), 0, dump, replace=True)
    return copied


@click.command()
@click.option("--keys", default=1_000_000, show_default=True, help="Entries of the region.")
@click.option("--changes", default=2000, show_default=True, help="Updates at each site.")
@click.option("--value-bytes", default=64, show_default=True)
@click.option(
    "--leaf-bits",
    type=click.IntRange(1, 24),
    help="Leaves per bucket as bits (default: sized to each bucket, as the repair's).",
)
@click.option("-v", "--verbose", is_flag=True)
def main(keys: int, changes: int, value_bytes: int, leaf_bits: int | None, verbose: bool) -> None:
    """Benchmark a repair of two diverged sites against a raw copy of the region."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING)
    console = Console()
    log_dir = progress.log_dir("gateway_repair", console)
    tag = secrets.token_hex(3)
    ns_a, ns_b = f"bench.repair.{tag}.a", f"bench.repair.{tag}.b"
    rng = random.Random(7)
    with progress.heartbeat(console), LocalStack() as stack, ExitStack() as stop:
        kafka = stack.kafka_bootstrap_servers
        servers = [
            _server("server-a", ns_a, 1, kafka, stack.redis_url, log_dir),
            _server("server-b", ns_b, 2, kafka, stack.redis_url, log_dir),
        ]
        for server in servers:
            stop.callback(server.wait, 20)
            stop.callback(server.terminate)
        at_a, at_b = _client(ns_a, kafka), _client(ns_b, kafka)
        stop.callback(at_a.close)
        stop.callback(at_b.close)
        region_a = at_a.create_region(REGION, RegionShortcut.PROXY)
        region_b = at_b.create_region(REGION, RegionShortcut.PROXY)
        value = "v" * (value_bytes - 2)  # JSON adds the quotes
        progress.phase(console, f"{keys:,} entries at site A ...")
        for start in range(0, keys, PUT_ALL_ENTRIES):
            end = min(keys, start + PUT_ALL_ENTRIES)
            region_a.put_all({f"k{i:07d}": value for i in range(start, end)})
        client = redis.Redis.from_url(stack.redis_url)
        began = time.monotonic()
        copied = _copy_region(client, ns_a, ns_b)
        copy_s = time.monotonic() - began
        data_bytes = keys * (8 + value_bytes)  # keys and values, versions not counted

        progress.phase(console, f"the partition: {changes:,} updates at each site ...")
        changed_a = rng.sample(range(keys), changes)
        changed_b = changed_a[: changes // 10] + rng.sample(range(keys), changes - changes // 10)
        for i in changed_b:
            region_b.put(f"k{i:07d}", "B" * (value_bytes - 2))
        for i in changed_a:
            region_a.put(f"k{i:07d}", "A" * (value_bytes - 2))  # later: A wins the shared ones
        for i in changed_a[-(changes // 10) :]:
            region_a.destroy(f"k{i:07d}")

        progress.phase(console, "repair ...")
        sites = [
            RepairSite(
                1, ns_a, client, ClientSettings(namespace=ns_a, kafka_bootstrap_servers=kafka)
            ),
            RepairSite(
                2, ns_b, client, ClientSettings(namespace=ns_b, kafka_bootstrap_servers=kafka)
            ),
        ]
        repair = GatewayRepair(sites[0], sites[1], TOTAL_BUCKETS, leaf_bits=leaf_bits)
        load = " ".join(f"{x:.1f}" for x in os.getloadavg())
        report = repair.run([REGION])
        again = repair.run([REGION])
        probe = [f"k{i:07d}" for i in (changed_a + changed_b)[:500]]
        equal = region_a.get_all(probe) == region_b.get_all(probe)
    console.print(
        f"repair: {report.keys_differing:,} keys differed, {report.applied:,} repaired, "
        f"{report.refused} refused, {report.failed} failed, in {report.seconds:.1f} s; "
        f"{report.bytes_moved:,} bytes moved = {100 * report.bytes_moved / data_bytes:.2f} % "
        f"of the region's {data_bytes:,} bytes of keys and values (load {load})"
    )
    per_key = max(report.keys_differing, 1)
    console.print(
        "  by step: "
        + ", ".join(
            f"{step} {moved:,} B ({moved / per_key:.0f} B a differing key)"
            for step, moved in report.bytes_by_step.items()
        )
        + "; "
        + ", ".join(f"{step} {spent:.1f} s" for step, spent in report.seconds_by_step.items())
        + f"; {report.leaves_differing:,} leaves differed, {report.entries_read:,} entries read"
    )
    console.print(
        f"raw copy of the whole region (DUMP/RESTORE, one Redis): {copied:,} bytes in "
        f"{copy_s:.1f} s; changed keys equal at both sites: {equal}"
    )
    console.print(
        f"second repair (what each anti-entropy run costs when the sites are equal): "
        f"{again.keys_differing} keys differed, {again.seconds:.1f} s "
        f"({', '.join(f'{k} {v:.1f} s' for k, v in again.seconds_by_step.items())}), "
        f"{again.bytes_moved:,} bytes moved"
    )
    emit(
        [
            SummaryRow(
                "gateway_repair",
                f"seconds to repair {keys:,} keys after {2 * changes:,} changes",
                report.seconds,
                copy_s,
                "raw DUMP/RESTORE copy of the region",
                higher_is_better=False,
            ),
            SummaryRow(
                "gateway_repair",
                "seconds of an anti-entropy run over equal sites",
                again.seconds,
                copy_s,
                "raw DUMP/RESTORE copy of the region",
                higher_is_better=False,
            ),
            SummaryRow(
                "gateway_repair",
                "bytes moved between the sites",
                report.bytes_moved,
                copied,
                "raw DUMP/RESTORE copy of the region",
                higher_is_better=False,
            ),
        ]
    )
    if again.keys_differing or not equal:
        raise SystemExit("the sites did not converge")


if __name__ == "__main__":
    main()
