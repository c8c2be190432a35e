"""``bench.fleet``'s abuse phase: a hostile or careless client's attacks at full size, each
beside a bystander (another client, in a process of its own, putting to another region).

The attacks (each has its test in the suite, at a size that fits it):

- **a LIKE pattern that compiles to a huge program**: a CQ ``x.s LIKE '%a_%a_...'`` of
  4,088 characters, within the query's length limit. Measured: how long the refusal takes
  (it once was accepted, and one put of a 100 KB value then held the server's loop 6.7 s).
- **200 long LIKE CQs, then large values**: 200 distinct CQs near the program bound, then
  puts of 1 KB, 100 KB and 400 KB values on their region (before: 3 s of the loop per 1 KB
  put, 19 s per 400 KB put). Measured: the bystander's put p99 and worst during each,
  beside its p99 alone.
- **a durable-client timeout of 68 years**: ``durable_client_timeout_s = 2**31 - 1`` (before:
  accepted, and the shared queue topic's retention raised to 68 years for everyone).
  Measured: refused, and the shared queue topic's ``retention.ms`` unchanged.
- **keys over many calls**: three registrations of 100,000 distinct keys by one client
  (before: all accepted, +160 MB of server memory). Measured: the keys the servers hold for
  it (at most ``MAX_KEYS_PER_CLIENT``) and the server's RSS growth.

The wall clock's steps (a server's clock moved by an hour) are measured inside one
server's process only (``tests/integration/test_clock_steps.py``): a benchmark cannot move
the clock of a process it does not own.
"""

from __future__ import annotations

import logging
import time
from functools import partial
from typing import Any

from confluent_kafka.admin import ConfigResource, ResourceType

from bench import progress
from bench.fleet_load_phases import (
    add_bystander_figures,
    latencies_in,
    server_and_bystander,
    timed_window,
)
from bench.fleet_run import (
    Figure,
    FleetOptions,
    Run,
    client_settings,
    load_now,
    rss_mb,
)
from bench.report import percentile
from bench.services import REGION, RESULT_TIMEOUT_S, Services
from regionbus import CqAttributes, CqEvent, CqListener, RegionShortcut
from regionbus.clients import ClientCache, ClientSettings, Region
from regionbus.schemas.cq.parser import MAX_CQ_QUERY_CHARS
from regionbus.schemas.errors import ConfigurationError, CqInvalidError, RequestLimitError
from regionbus.schemas.kafka_clients import kafka_admin
from regionbus.schemas.limits import MAX_KEYS_PER_CLIENT
from regionbus.schemas.naming import Topics

log = logging.getLogger("regionbus.bench")

ABUSE_REGION = "abuse"
"""The attackers' region (the bystander puts to ``bench.services.REGION``)."""
LONG_LIKE_CQS = 200
KEYS_PER_CALL = 100_000
REGISTRATION_CALLS = 3


class _Heard(CqListener):
    def __init__(self) -> None:
        self.events = 0
        self.errors = 0

    def on_event(self, event: CqEvent) -> None:
        self.events += 1

    def on_error(self, event: CqEvent) -> None:
        self.errors += 1


def abuse_phase(run: Run, options: FleetOptions) -> None:
    """The attacks of this module's description, in turn, beside one bystander."""
    regions = (REGION, ABUSE_REGION)
    with server_and_bystander(run, options, "abuse", regions) as (services, server, bystander):
        load = load_now()
        alone = timed_window(lambda: time.sleep(5))
        windows: dict[str, tuple[float, float]] = {}
        attacker = _cache(services, options)
        try:
            _refused_like(run, attacker, load)
            windows.update(_long_likes_and_large_values(run, services, options, attacker))
            _durable_timeout(run, services, options, load)
            _keys_over_calls(run, attacker, server.pid, load)
        finally:
            attacker.close()
        puts: list[tuple[float, float]] = bystander.result(RESULT_TIMEOUT_S)["puts"]
    base = percentile(latencies_in(puts, alone), 0.99)
    for name, window in windows.items():
        add_bystander_figures(
            run,
            "abuse",
            latencies_in(puts, window),
            base,
            load,
            f"bystander put p99 during {name} (ms)",
            f"bystander worst put during {name} (ms)",
        )


def _cache(services: Services, options: FleetOptions, **more: Any) -> ClientCache:
    return ClientCache(
        ClientSettings(**client_settings(services, options, read_timeout_ms=60_000, **more))
    )


def _refused_like(run: Run, attacker: ClientCache, load: str) -> None:
    progress.phase(run.console, f"abuse: a LIKE CQ of {MAX_CQ_QUERY_CHARS:,} characters ...")
    attacker.create_region(ABUSE_REGION, RegionShortcut.PROXY)
    monster = ("%a_" * MAX_CQ_QUERY_CHARS)[: MAX_CQ_QUERY_CHARS - 40]
    began = time.perf_counter()
    try:
        attacker.query_service().new_cq(
            "monster", f"SELECT * FROM /{ABUSE_REGION} x WHERE x.s LIKE '{monster}'"
        ).execute()
        refused = False
    except CqInvalidError:
        refused = True
    refused_ms = (time.perf_counter() - began) * 1000
    run.add(
        Figure(
            "abuse",
            f"a LIKE CQ of {MAX_CQ_QUERY_CHARS:,} characters refused in (ms)",
            refused_ms,
            "refused",
            refused,
            load=load,
        )
    )


def _long_likes_and_large_values(
    run: Run, services: Services, options: FleetOptions, attacker: ClientCache
) -> dict[str, tuple[float, float]]:
    """Hold :data:`LONG_LIKE_CQS` long LIKE CQs, then put values of 1 KB, 100 KB and 400 KB
    on their region; the window of each size's puts."""
    progress.phase(run.console, f"abuse: {LONG_LIKE_CQS} long LIKE CQs (load {load_now()}) ...")
    heard = _Heard()
    service = attacker.query_service()
    for i in range(LONG_LIKE_CQS):
        pattern = f"%{i}_" + "%a_" * 30
        service.new_cq(
            f"q{i}",
            f"SELECT * FROM /{ABUSE_REGION} x WHERE x.s LIKE '{pattern}'",
            CqAttributes([heard]),
        ).execute()
    writer_cache = _cache(services, options, subscription_enabled=False)
    try:
        writer = writer_cache.create_region(ABUSE_REGION, RegionShortcut.PROXY)
        windows = {}
        for label, value, count in (
            ("puts of 1 KB values", "ab" * 500, 20),
            ("puts of 100 KB values", "a" * 100_000, 3),
            ("puts of 400 KB values", "a" * 400_000, 3),
        ):
            progress.phase(run.console, f"abuse: {count} {label} (load {load_now()}) ...")
            windows[f"{LONG_LIKE_CQS} LIKE CQs' {label}"] = timed_window(
                partial(_put_each, writer, label, value, count)
            )
    finally:
        writer_cache.close()
    return windows


def _put_each(region: Region, prefix: str, text: str, count: int) -> None:
    for i in range(count):
        region.put(f"{prefix}-{i}", {"s": text})


def _durable_timeout(run: Run, services: Services, options: FleetOptions, load: str) -> None:
    progress.phase(run.console, "abuse: a durable-client timeout of 68 years ...")
    queues = Topics(services.namespace).client_queues(None)
    before = _retention_ms(services, queues)
    try:
        _cache(
            services, options, durable_client_id="forever", durable_client_timeout_s=2**31 - 1
        ).close()
        refused = False
    except ConfigurationError:
        refused = True
    after = _retention_ms(services, queues)
    run.add(
        Figure(
            "abuse",
            "shared queue topic retention.ms after a 68-year durable timeout was asked",
            after,
            "refused, unchanged",
            refused and after == before,
            before,
            "retention.ms before",
            load,
        )
    )


def _retention_ms(services: Services, topic: str) -> float:
    admin = kafka_admin(services.kafka_config)
    resource = ConfigResource(ResourceType.TOPIC, topic)
    configs = admin.describe_configs([resource])[resource].result(15)
    return float(configs["retention.ms"].value)


def _keys_over_calls(run: Run, attacker: ClientCache, server_pid: int | None, load: str) -> None:
    progress.phase(
        run.console,
        f"abuse: {REGISTRATION_CALLS} registrations of {KEYS_PER_CALL:,} keys (load {load_now()})",
    )
    region = attacker.create_region(REGION, RegionShortcut.PROXY)
    rss_before, _ = rss_mb(server_pid)
    held = 0
    refused = 0
    for call in range(REGISTRATION_CALLS):
        keys = [f"greedy-{call}-{i}" for i in range(KEYS_PER_CALL)]
        try:
            region.register_interest(keys)
            held += len(keys)
        except RequestLimitError:
            refused += 1
    rss_after, _ = rss_mb(server_pid)
    run.add(
        Figure(
            "abuse",
            f"keys held after {REGISTRATION_CALLS} x {KEYS_PER_CALL:,} "
            f"(limit {MAX_KEYS_PER_CLIENT:,})",
            held,
            f"<= {MAX_KEYS_PER_CLIENT:,}",
            held <= MAX_KEYS_PER_CLIENT and refused > 0,
            REGISTRATION_CALLS * KEYS_PER_CALL,
            "keys asked",
            load,
        )
    )
    run.add(
        Figure(
            "abuse",
            "server RSS growth from those registrations (MiB)",
            rss_after - rss_before,
            "-",
            None,
            rss_before,
            "server RSS before (MiB)",
            load,
        )
    )


__all__ = ["ABUSE_REGION", "abuse_phase"]
