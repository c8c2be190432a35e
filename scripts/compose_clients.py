"""Host-side checks of a running docker compose stack, as a user's application sees it:
clients on the host talking to the published ports. Called by scripts/compose-check.sh
with the repository's .venv; each check prints what it verified, and the first failure
ends the run with status 1 and a message saying what did not happen.

    .venv/bin/python scripts/compose_clients.py default
    .venv/bin/python scripts/compose_clients.py two-sites
    .venv/bin/python scripts/compose_clients.py secured   # needs the variables below

Every wait is on a condition (an event delivered, a port answering) with a deadline; no
fixed sleeps. The secured check reads REDIS_PASSWORD and COMPOSE_CHECK_CLIENTS (the
`user:password:client_id` triples compose-check.sh gave the stack as KAFKA_CLIENTS).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from regionbus import (
    AuthenticationError,
    CacheListener,
    ClientCache,
    EntryEvent,
    RegionBusError,
    RegionShortcut,
    TransportError,
)

ROOT = Path(__file__).resolve().parents[1]
REGIONBUS = ROOT / ".venv" / "bin" / "regionbus"

SITE_A = {"namespace": "regionbus", "kafka_bootstrap_servers": "127.0.0.1:9092"}
SITE_B = {"namespace": "siteb", "kafka_bootstrap_servers": "127.0.0.1:29094"}
SECURED_KAFKA = "127.0.0.1:29093"
SECURED_REDIS = "redis://127.0.0.1:6380/0"
QUICKSTART = ROOT / "examples" / "quickstart.py"
README = ROOT / "README.md"
REGION = "flights"
# Clients wait this long for a server reply; connecting includes the first one.
READ_TIMEOUT_MS = 30_000
EVENT_TIMEOUT_S = 60.0
# A gateway's first batch waits for the sender to find its queue and the remote site.
GATEWAY_TIMEOUT_S = 180.0


class CheckError(Exception):
    """A check did not see what it waited for."""


def say(message: str) -> None:
    print(f"compose-clients: {message}", flush=True)


class Recorder(CacheListener):
    """Keeps the creates and updates a client's listener gets, and wakes waiters."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, Any]] = []
        self._changed = threading.Condition()

    def _record(self, kind: str, event: EntryEvent) -> None:
        with self._changed:
            self.events.append((kind, event.key, event.new_value))
            self._changed.notify_all()

    def after_create(self, event: EntryEvent) -> None:
        self._record("create", event)

    def after_update(self, event: EntryEvent) -> None:
        self._record("update", event)

    def wait_for(self, key: str, value: Any, timeout_s: float, what: str) -> float:
        """Wait until the listener got ``key`` with ``value``; returns the seconds waited."""
        start = time.monotonic()
        deadline = start + timeout_s
        with self._changed:
            while not any(k == key and v == value for _, k, v in self.events):
                left = deadline - time.monotonic()
                if left <= 0:
                    seen = [k for _, k, _ in self.events]
                    raise CheckError(
                        f"{what}: no event for {key} = {value!r} within {timeout_s:.0f} s "
                        f"(the listener got {len(seen)} event(s): {seen[:5]})"
                    )
                self._changed.wait(left)
        return time.monotonic() - start


@contextmanager
def client(what: str, **settings: Any) -> Iterator[ClientCache]:
    try:
        cache = ClientCache(read_timeout_ms=READ_TIMEOUT_MS, **settings)
    except RegionBusError as exc:
        raise CheckError(f"{what}: could not connect: {exc}") from exc
    try:
        yield cache
    finally:
        cache.close()


def unique_key(prefix: str) -> str:
    return f"compose-check-{prefix}-{uuid.uuid4().hex[:8]}"


def put_reaches_interested_client(
    writer_settings: dict[str, Any],
    reader_settings: dict[str, Any],
    what: str,
    timeout_s: float,
) -> None:
    """A client registers interest in a key, another puts it: the first gets the event."""
    key = unique_key(what.split()[0])
    value = {"check": what, "at": time.time()}
    recorder = Recorder()
    with client(f"{what} (interested client)", **reader_settings) as reader:
        region = reader.create_region(REGION, listeners=[recorder])
        region.register_interest([key])
        with client(f"{what} (writer)", **writer_settings) as writer:
            started = time.monotonic()
            writer.create_region(REGION).put(key, value)
            applied = time.monotonic() - started
            waited = recorder.wait_for(key, value, timeout_s, what)
        if region.get(key) != value:
            raise CheckError(f"{what}: the interested client's cache does not hold {key}")
    say(f"OK {what}: put {key} applied in {applied:.2f} s, event after {waited:.2f} s more")


def wait_for_http(url: str, timeout_s: float, expect: str) -> None:
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                body = response.read().decode()
            if expect in body:
                return
            last = CheckError(f"{url} answered without {expect!r}")
        except OSError as exc:
            last = exc
        time.sleep(0.5)  # poll interval of a condition with a deadline
    raise CheckError(f"{url} did not answer with {expect!r} within {timeout_s:.0f} s: {last}")


def regionbus_cli(
    *args: str, env: dict[str, str] | None = None, env_base: dict[str, str] | None = None
) -> str:
    result = subprocess.run(
        [str(REGIONBUS), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**(os.environ if env_base is None else env_base), **(env or {})},
        check=False,
    )
    if result.returncode != 0:
        raise CheckError(
            f"regionbus {' '.join(args)} failed (status {result.returncode}): "
            f"{(result.stdout + result.stderr).strip()[-1500:]}"
        )
    return result.stdout


def _without_regionbus_variables() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("REGIONBUS_")}


def readme_quickstart_output() -> list[str]:
    """The lines README.md's quickstart says examples/quickstart.py prints: the ``text``
    block after the sentence naming the file."""
    text = README.read_text()
    start = text.index("examples/quickstart.py")
    block = text[text.index("```text\n", start) + len("```text\n") :]
    return block[: block.index("```")].splitlines()


def check_quickstart() -> None:
    """examples/quickstart.py, the README's snippet, as a user runs it after `docker
    compose up`: no address, no namespace, no REGIONBUS_* variable."""
    ran = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "python"), str(QUICKSTART)],
        capture_output=True,
        text=True,
        timeout=180,
        env=_without_regionbus_variables(),
        cwd=ROOT,
        check=False,
    )
    expected = readme_quickstart_output()
    if ran.returncode != 0 or ran.stdout.splitlines() != expected:
        raise CheckError(
            f"examples/quickstart.py exited {ran.returncode} printing {ran.stdout!r}, not "
            f"README's {expected!r}: {ran.stderr.strip()[-1500:]}"
        )
    say(f"OK the README's quickstart ran as written with the clients' defaults: {expected}")


def check_default() -> None:
    check_quickstart()
    # `regionbus status` with no address: the defaults reach the stack
    members = json.loads(regionbus_cli("status", "--json", env_base=_without_regionbus_variables()))
    text = json.dumps(members)
    for member in ("cache-server-1", "cache-server-2"):
        if f'"{member}"' not in text:
            raise CheckError(f"regionbus status from the host does not list {member}: {text}")
    say("OK regionbus status from the host lists cache-server-1 and cache-server-2")
    if members["gateway_senders"] or members["async_event_queues"]:
        raise CheckError(f"the one-site stack queues for a gateway: {text}")
    say("OK no gateway sender or async event queue in the one-site stack")
    for port in (9464, 9465):
        wait_for_http(f"http://127.0.0.1:{port}/metrics", 30, "regionbus_")
    say("OK both cache servers' metrics answer on 127.0.0.1:9464 and :9465")
    put_reaches_interested_client(
        SITE_A, SITE_A, "site-A put seen by a second client", EVENT_TIMEOUT_S
    )


def gateway_queue_retention() -> None:
    """Each site's gateway queue topic keeps what docker-compose.two-sites.yml says."""
    from confluent_kafka.admin import ConfigResource, ResourceType

    from regionbus.schemas.kafka_clients import kafka_admin

    sys.path.insert(0, str(ROOT / "scripts"))
    from compose_model import COMPOSE_SETS, load

    services = load([ROOT / f for f in COMPOSE_SETS["two-sites"]])["services"]
    for server, site in (("cache-server-1", SITE_A), ("site-b-cache-server", SITE_B)):
        environment = services[server]["environment"]
        for sender_id, spec in json.loads(environment["REGIONBUS_GATEWAY_SENDERS"]).items():
            topic = f"{site['namespace']}.gw.{sender_id}"
            admin = kafka_admin({"bootstrap.servers": site["kafka_bootstrap_servers"]})
            resource = ConfigResource(ResourceType.TOPIC, topic)
            described = admin.describe_configs([resource], request_timeout=30)[resource]
            retention = described.result(timeout=30)["retention.ms"].value
            if retention != str(spec["queue_retention_ms"]):
                raise CheckError(
                    f"{topic} keeps records {retention} ms, not {spec['queue_retention_ms']}"
                )
            say(f"OK gateway queue {topic} keeps unacknowledged events {retention} ms")


SITE_A_REDIS = "redis://127.0.0.1:6379/0"
SITE_B_REDIS = "redis://127.0.0.1:6381/0"


def repair_after_a_lost_event() -> None:
    """`regionbus gateway repair` from the host: an entry replicated to B is then lost at B
    (its Redis fields removed, as a lost queue would have left B without it); a dry run
    finds it (A's change wins) and changes nothing, the repair brings it back with every
    other difference, and a second run finds nothing."""
    import redis

    from regionbus.schemas.naming import RedisKeys, bucket_of

    key = unique_key("repair")
    with client("repair check (writer at A)", **SITE_A) as writer:
        writer.create_region(REGION).put(key, {"check": "repair"})
    with client("repair check (reader at B)", **SITE_B) as reader:
        at_b = reader.create_region(REGION, RegionShortcut.PROXY)
        deadline = time.monotonic() + GATEWAY_TIMEOUT_S
        while at_b.get(key) is None:
            if time.monotonic() > deadline:
                raise CheckError(f"repair check: {key} never reached site B")
            time.sleep(0.5)  # poll interval of a condition with a deadline
        keys, bucket = RedisKeys(SITE_B["namespace"]), bucket_of(REGION, key, 16)
        site_b = redis.Redis.from_url(SITE_B_REDIS)
        for hash_key in (
            keys.region_values(REGION, bucket),
            keys.region_meta(REGION, bucket),
            keys.region_gateway_versions(REGION, bucket),
        ):
            site_b.hdel(hash_key, key)
        args = [
            "gateway", "repair", "--namespace", SITE_A["namespace"], "--kafka",
            SITE_A["kafka_bootstrap_servers"], "--redis", SITE_A_REDIS, "--site-id", "1",
            "--remote-namespace", SITE_B["namespace"], "--remote-kafka",
            SITE_B["kafka_bootstrap_servers"], "--remote-redis", SITE_B_REDIS,
            "--remote-site-id", "2", "--region", REGION,
        ]  # fmt: skip
        # The default phase's puts were made before site B existed: they differ too.
        dry = json.loads(regionbus_cli(*args, "--dry-run", "--json"))
        found = {d["key"]: d for d in dry["decisions"]}
        if key not in found or found[key]["winner_site_id"] != 1 or at_b.get(key) is not None:
            raise CheckError(f"repair check: the dry run did not find {key}: {dry}")
        done = json.loads(regionbus_cli(*args, "--json"))
        if done["applied"] != dry["keys_differing"] or at_b.get(key) != {"check": "repair"}:
            raise CheckError(f"repair check: {key} not back at site B: {done}")
        again = json.loads(regionbus_cli(*args, "--json"))
        if again["keys_differing"] != 0:
            raise CheckError(f"repair check: a second run found {again['keys_differing']} keys")
    say(
        f"OK gateway repair: the entry lost at site B found by a dry run among "
        f"{dry['keys_differing']} differences, all repaired ({done['bytes_moved']} bytes "
        f"moved), and a second run found nothing"
    )


def check_two_sites() -> None:
    for port in (9466, 9467, 9468, 9469, 9470):
        wait_for_http(f"http://127.0.0.1:{port}/metrics", 60, "regionbus_")
    say("OK site B's cache server and the four gateway workers' metrics answer")
    gateway_queue_retention()
    put_reaches_interested_client(
        SITE_A, SITE_B, "A-to-B put on site A seen by a site-B client", GATEWAY_TIMEOUT_S
    )
    put_reaches_interested_client(
        SITE_B, SITE_A, "B-to-A put on site B seen by a site-A client", GATEWAY_TIMEOUT_S
    )
    repair_after_a_lost_event()


def _clients_from_env() -> dict[str, tuple[str, str]]:
    """client id -> (Kafka user, password), from COMPOSE_CHECK_CLIENTS."""
    triples = os.environ.get("COMPOSE_CHECK_CLIENTS", "").split()
    clients: dict[str, tuple[str, str]] = {}
    for triple in triples:
        user, password, client_id = triple.split(":")
        clients[client_id] = (user, password)
    if len(clients) < 3:
        raise CheckError("COMPOSE_CHECK_CLIENTS must name 3 client ids (writer, reader, intruder)")
    return clients


def _expect_refusal(what: str, attempt: Callable[[], None], refused: tuple[type, ...]) -> str:
    try:
        attempt()
    except refused as exc:
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    raise CheckError(f"{what}: was let in")


def check_secured() -> None:
    import redis

    redis_password = os.environ["REDIS_PASSWORD"]
    clients = _clients_from_env()
    writer_id, reader_id, intruder_id = list(clients)[:3]

    # Redis: the default user is off, so a connection without credentials gets nothing.
    def anonymous_redis() -> None:
        redis.Redis.from_url(SECURED_REDIS, socket_timeout=10).get("rb:anything")

    reason = _expect_refusal(
        "an unauthenticated Redis connection", anonymous_redis, (redis.exceptions.RedisError,)
    )
    say(f"OK an unauthenticated Redis connection to 127.0.0.1:6380 is refused ({reason})")

    # Kafka: the listener speaks SASL/SCRAM only, so a client without a login never gets a
    # server's answer.
    def anonymous_kafka() -> None:
        with client_raw(
            namespace="regionbus",
            kafka_bootstrap_servers=SECURED_KAFKA,
            client_id=intruder_id,
            read_timeout_ms=15_000,
            metadata_timeout_s=15,
        ):
            pass

    # (TransportError: no answer at all, not a server's refusal; the SCRAM principal's
    # check below proves the same port answers a client that logs in)
    reason = _expect_refusal("a client without a Kafka login", anonymous_kafka, (TransportError,))
    say(f"OK a client without a Kafka login is refused on 127.0.0.1:29093 ({reason})")

    secret = f"compose-check-{uuid.uuid4().hex}"
    regionbus_cli(
        "user", "add", "compose-check",
        "--permission", f"DATA:READ:{REGION}", "--permission", f"DATA:WRITE:{REGION}",
        "--secret-env", "COMPOSE_CHECK_SECRET",
        "--redis", SECURED_REDIS, "--namespace", "regionbus",
        env={
            "COMPOSE_CHECK_SECRET": secret,
            "REGIONBUS_REDIS_USERNAME": "regionbus",
            "REGIONBUS_REDIS_PASSWORD": redis_password,
        },
    )  # fmt: skip
    say("OK principal compose-check added with `regionbus user add` through Redis 127.0.0.1:6380")

    def kafka_login(client_id: str) -> dict[str, Any]:
        user, password = clients[client_id]
        return {
            "namespace": "regionbus",
            "kafka_bootstrap_servers": SECURED_KAFKA,
            "kafka_security_protocol": "SASL_PLAINTEXT",
            "kafka_sasl_mechanism": "SCRAM-SHA-512",
            "kafka_sasl_username": user,
            "kafka_sasl_password": password,
            "client_id": client_id,
        }

    # Logged in to Kafka, but signing as the principal with a wrong secret: the secured
    # server refuses the connection.
    def wrong_secret() -> None:
        with client_raw(
            **kafka_login(intruder_id),
            security_principal="compose-check",
            security_secret="not-the-secret",
        ):
            pass

    reason = _expect_refusal("a client with a wrong secret", wrong_secret, (AuthenticationError,))
    say(f"OK a client signing with a wrong secret is refused by the secured server ({reason})")

    principal = {"security_principal": "compose-check", "security_secret": secret}
    put_reaches_interested_client(
        {**kafka_login(writer_id), **principal},
        {**kafka_login(reader_id), **principal},
        "secured put by the SCRAM principal seen by a second client",
        EVENT_TIMEOUT_S,
    )


@contextmanager
def client_raw(**settings: Any) -> Iterator[ClientCache]:
    """A client whose connection errors propagate unchanged (for the refusal checks)."""
    cache = ClientCache(**settings)
    try:
        yield cache
    finally:
        cache.close()


CHECKS: dict[str, Callable[[], None]] = {
    "default": check_default,
    "two-sites": check_two_sites,
    "secured": check_secured,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile", choices=sorted(CHECKS))
    args = parser.parse_args(argv)
    started = time.monotonic()
    try:
        CHECKS[args.profile]()
    except CheckError as exc:
        say(f"FAILED {args.profile}: {exc}")
        return 1
    say(f"{args.profile}: every check OK ({time.monotonic() - started:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
