"""WAN exactly once through faults: a stream of updates from site A to site B while, three
times each, the gateway sender's primary, one of site B's cache servers, and site B's
Kafka broker are killed with SIGKILL and started again.

Every part runs as a process of its own, as in a deployment: site A's cache server and two
gateway senders (a primary and a standby, on one lease), site B's two cache servers
(subscription redundancy 1) and its gateway receiver; site B has a Kafka node of its own
(so it can be killed), site A the session's. A writer process puts ``{"i": n, ...}`` to
``KEYS`` keys at A throughout.

At the end:
- both sites hold the same entries;
- site B applied each of A's EventIDs exactly once: in B's ``{ns}.events`` every EventID
  of A's events appears, and all its records carry one and the same version of B's entry
  (a second apply would have made a second version; a record sent again after a failover
  repeats the first, flagged ``possible_duplicate``);
- each key's versions at B, and the writer's counter ``i`` they carry, rise in the order
  B applied them.

Exactly once here is the apply, by EventID (docs/behaviour.md §6): a resent batch, or an
operation read again by a new bucket primary, is recognised in the bucket's Lua script and
changes nothing; the event it gives again is flagged. ``REGIONBUS_WAN_FAULT_ROUNDS`` and
``REGIONBUS_WAN_FAULT_KEYS`` run it larger (the issue's full size: 10,000 keys).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import redis
from confluent_kafka import TopicPartition
from support import wait_until
from test_high_availability import ServerProcess, WriterProcess

from regionbus.broker.store import RegionStore
from regionbus.devstack import KafkaNode
from regionbus.schemas.codec import decode, split_batch
from regionbus.schemas.kafka_clients import kafka_consumer
from regionbus.schemas.messages import Event
from regionbus.schemas.naming import RedisKeys, Topics, bucket_role, sender_role
from regionbus.schemas.transport import watermarks

TOTAL_BUCKETS = 16
ROUNDS = int(os.environ.get("REGIONBUS_WAN_FAULT_ROUNDS", "3"))
KEYS = int(os.environ.get("REGIONBUS_WAN_FAULT_KEYS", "500"))
SENDER_ID = "to-b"
LEASE_TTL_MS = 2_000
# Each step waits for this many more of A's updates applied at B: the stream is moving again
# after the fault (an update reaches B only once a sender is primary, B's Kafka answers and
# B's servers and receiver work).
PROGRESS_UPDATES = 100
STEP_TIMEOUT_S = 240.0
_HERE = Path(__file__).parent


class WorkerProcess:
    """``python -m regionbus gateway <kind> ...`` as a child process, logging to a file."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.args, self.env, self.log = args, env, log
        self.proc: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        with self.log.open("a") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "regionbus", "gateway", *self.args],
                env={**os.environ, **self.env},
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=_HERE.parents[1],
            )

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


class Sites:
    """The two sites of the test and every process they run."""

    def __init__(
        self,
        stack: ExitStack,
        tmp_path: Path,
        namespace: str,
        kafka_a: str,
        redis_url: str,
        kafka_b: KafkaNode,
    ) -> None:
        self.tmp_path = tmp_path
        self.ns_a, self.ns_b = f"{namespace}.a", f"{namespace}.b"
        self.kafka_a, self.kafka_b, self.redis_url = kafka_a, kafka_b, redis_url
        self.redis = redis.Redis.from_url(redis_url)
        stack.callback(self.redis.close)
        self.b_servers = {m: self._b_server(m) for m in ("b-server-1", "b-server-2")}
        # the servers running at the end: a killed one is replaced by a new process
        stack.callback(lambda: [server.stop() for server in self.b_servers.values()])
        self.receiver = WorkerProcess(
            [
                "receiver",
                "--namespace",
                self.ns_b,
                "--kafka",
                kafka_b.bootstrap_servers,
                "--site-id",
                "2",
            ],
            {
                "REGIONBUS_GATEWAY_RECEIVER_REDIS_URL": redis_url,
                "REGIONBUS_GATEWAY_RECEIVER_FETCH_WAIT_MAX_MS": "100",
            },
            tmp_path / "receiver.log",
        )
        stack.callback(self.receiver.stop)
        self.a_server = ServerProcess(
            "a-server-1",
            {
                **self._server_env(self.ns_a, kafka_a, site_id=1),
                "REGIONBUS_GATEWAY_SENDERS": json.dumps(
                    {SENDER_ID: {"remote_distributed_system_id": 2}}
                ),
                "REGIONBUS_REGION_GATEWAY_SENDERS": json.dumps({"r": [SENDER_ID]}),
            },
            tmp_path / "a-server-1.log",
        )
        stack.callback(self.a_server.stop)
        self.senders = {m: self._sender(m) for m in ("gw-1", "gw-2")}
        for sender in self.senders.values():
            stack.callback(sender.stop)

    def _server_env(self, namespace: str, kafka: str, site_id: int) -> dict[str, str]:
        return {
            "REGIONBUS_NAMESPACE": namespace,
            "REGIONBUS_KAFKA_BOOTSTRAP_SERVERS": kafka,
            "REGIONBUS_REDIS_URL": self.redis_url,
            "REGIONBUS_DISTRIBUTED_SYSTEM_ID": str(site_id),
            "REGIONBUS_LEASE_TTL_MS": str(LEASE_TTL_MS),
            "REGIONBUS_FETCH_WAIT_MAX_MS": "100",
            "REGIONBUS_POLL_TIMEOUT_MS": "20",
            "REGIONBUS_MESSAGE_SYNC_INTERVAL_S": "0.5",
        }

    def _b_server(self, member_id: str) -> ServerProcess:
        env = {
            **self._server_env(self.ns_b, self.kafka_b.bootstrap_servers, site_id=2),
            "REGIONBUS_SUBSCRIPTION_REDUNDANCY": "1",
        }
        return ServerProcess(member_id, env, self.tmp_path / f"{member_id}.log")

    def _sender(self, member_id: str) -> WorkerProcess:
        return WorkerProcess(
            [
                "sender",
                "--namespace",
                self.ns_a,
                "--kafka",
                self.kafka_a,
                "--redis",
                self.redis_url,
                "--sender-id",
                SENDER_ID,
                "--site-id",
                "1",
                "--remote-site-id",
                "2",
                "--remote-namespace",
                self.ns_b,
                "--remote-kafka",
                self.kafka_b.bootstrap_servers,
                "--batch-time-interval-ms",
                "100",
            ],
            {
                "REGIONBUS_GATEWAY_SENDER_MEMBER_ID": member_id,
                "REGIONBUS_GATEWAY_SENDER_LEASE_TTL_MS": str(LEASE_TTL_MS),
                "REGIONBUS_GATEWAY_SENDER_ACK_TIMEOUT_MS": "10000",
                "REGIONBUS_GATEWAY_SENDER_RETRY_INTERVAL_MS": "500",
            },
            self.tmp_path / f"{member_id}.log",
        )

    def sender_primary(self) -> str | None:
        """The member id holding the sender's lease, if any."""
        raw = self.redis.get(RedisKeys(self.ns_a).lease(sender_role(SENDER_ID)))
        return None if raw is None else raw.decode().split("|")[0]

    def entries(self, namespace: str) -> dict[str, bytes | None]:
        store = RegionStore(self.redis, namespace, TOTAL_BUCKETS)
        return {key: entry.value for key, entry in store.entries("r").items()}

    def applied_at_b(self) -> int:
        """The sum of the writer's counters ``i`` over B's entries: each update B applies
        adds ``KEYS`` to it (the writer goes round the keys), with no event log to read."""
        return sum(json.loads(v)["i"] for v in self.entries(self.ns_b).values() if v)

    def b_primaries(self) -> dict[str, int]:
        """Buckets each of B's servers is primary of (from the bucket leases)."""
        keys = RedisKeys(self.ns_b)
        holders = [
            (self.redis.get(keys.lease(bucket_role(b))) or b"").decode().split("|")[0]
            for b in range(TOTAL_BUCKETS)
        ]
        return {m: holders.count(m) for m in self.b_servers}


def _events(bootstrap: str, namespace: str) -> list[list[Event]]:
    """Every event in ``{ns}.events``, per partition in offset order (batches split)."""
    consumer = kafka_consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"wan-fault-check-{os.getpid()}",
            "enable.auto.commit": False,
        }
    )
    topic = Topics(namespace).events
    per_partition: list[list[Event]] = []
    try:
        for partition in range(TOTAL_BUCKETS):
            tp = TopicPartition(topic, partition, 0)
            low, high = watermarks(consumer, tp, 60)
            found: list[Event] = []
            if high > low:
                consumer.assign([TopicPartition(topic, partition, low)])
                position = low
                while position < high:
                    message = consumer.poll(5.0)
                    assert message is not None, f"{topic}[{partition}] stopped at {position}"
                    assert message.error() is None, message.error()
                    offset = message.offset()
                    assert offset is not None
                    position = offset + 1
                    for framed in split_batch(message.value()):
                        event = decode(framed)
                        if isinstance(event, Event) and event.region == "r":
                            found.append(event)
            per_partition.append(found)
    finally:
        consumer.close()
    return per_partition


def _change(event: Event) -> tuple[str, int, int]:
    """The change an event is of: its EventID's member, thread and sequence. A serial
    gateway queue widens the thread with its dispatcher's index in bits 32 and up (Geode's
    ``ThreadIdentifier.createFakeThreadIDForParallelGateway``), which B's events keep."""
    eid = event.event_id
    return (eid.member, eid.thread & 0xFFFF_FFFF, eid.sequence)


@pytest.fixture
def sites(
    tmp_path: Path, namespace: str, kafka_bootstrap_servers: str, redis_url: str
) -> Iterator[Sites]:
    # a KRaft node killed with SIGKILL recovers its log first: minutes on a loaded machine
    node = KafkaNode(work_dir=tmp_path / "kafka-b", heap_max_mb=512, start_timeout_s=240)
    node.start()
    with ExitStack() as stack:
        stack.callback(node.kill)
        yield Sites(stack, tmp_path, namespace, kafka_bootstrap_servers, redis_url, node)


def _moving(sites: Sites, what: str) -> None:
    """Wait until B has applied ``PROGRESS_UPDATES`` more of the stream's updates."""
    start = sites.applied_at_b()
    wait_until(
        lambda: sites.applied_at_b() >= start + PROGRESS_UPDATES * KEYS,
        STEP_TIMEOUT_S,
        f"the stream moving again after {what}",
    )


# nine faults, each waited out: about 3 minutes on a quiet machine, 10 on a loaded one
@pytest.mark.timeout(1800)
def test_every_update_reaches_the_other_site_once_through_killed_senders_servers_and_brokers(
    sites: Sites, tmp_path: Path
) -> None:
    wait_until(lambda: sites.sender_primary() is not None, 120, "a sender primary")
    writer = WriterProcess(
        tmp_path,
        "w",
        {"namespace": sites.ns_a, "bootstrap": sites.kafka_a, "keys": KEYS, "rate": 300},
    )

    def kill_sender_primary() -> str:
        primary = sites.sender_primary()
        assert primary in sites.senders, primary
        sites.senders[primary].kill()
        wait_until(
            lambda: sites.sender_primary() not in (None, primary),
            STEP_TIMEOUT_S,
            "the standby sender taking over",
        )
        sites.senders[primary].start()  # the standby of the next round
        return f"sender primary {primary}"

    def kill_b_server() -> str:
        counts = sites.b_primaries()
        victim = max(counts, key=lambda m: counts[m])
        sites.b_servers[victim].kill()
        wait_until(
            lambda: (
                sites.b_primaries()[victim] == 0
                and sum(sites.b_primaries().values()) == TOTAL_BUCKETS
            ),
            STEP_TIMEOUT_S,
            f"the other server of B taking {victim}'s buckets over",
        )
        sites.b_servers[victim] = sites._b_server(victim)
        # Started again, it takes its share of primaries back (another move of each); the
        # next fault waits for that, as a server does not start while Kafka is down
        # (Geode's default locator-wait-time is 0 too).
        wait_until(
            lambda: sites.b_primaries()[victim] > 0,
            STEP_TIMEOUT_S,
            f"{victim} started again and primary of some buckets",
        )
        return f"site B's {victim} (primary of {counts[victim]} buckets)"

    def kill_b_kafka() -> str:
        sites.kafka_b.kill()
        sites.kafka_b.start()
        return "site B's Kafka broker"

    faults: list[Callable[[], str]] = [kill_sender_primary, kill_b_server, kill_b_kafka]
    killed: list[str] = []
    try:
        _moving(sites, "the start")
        for _ in range(ROUNDS):
            for fault in faults:
                killed.append(fault())
                _moving(sites, killed[-1])
    finally:
        answers = writer.finish()
    assert len(killed) == 3 * ROUNDS
    assert answers and all(a["ok"] for a in answers), "a put at site A failed"

    wait_until(
        lambda: sites.entries(sites.ns_b) == sites.entries(sites.ns_a),
        STEP_TIMEOUT_S,
        "site B equal to site A",
    )
    a_events = [e for part in _events(sites.kafka_a, sites.ns_a) for e in part]
    b_partitions = _events(sites.kafka_b.bootstrap_servers, sites.ns_b)

    a_ids = {_change(e) for e in a_events}
    versions: dict[Any, set[int]] = defaultdict(set)
    for event in (e for part in b_partitions for e in part):
        versions[_change(event)].add(event.version)
    missing, extra = a_ids - set(versions), set(versions) - a_ids
    by_id = {_change(e): e for part in b_partitions for e in part}
    assert not missing and not extra, (
        f"{len(a_ids)} EventIDs at A, {len(versions)} at B: {len(missing)} missing at B "
        f"{sorted(missing)[:3]}, {len(extra)} others at B "
        f"{[by_id[e] for e in sorted(extra)[:3]]}"
    )
    twice = {eid: v for eid, v in versions.items() if len(v) > 1}
    assert not twice, f"applied more than once at B: {list(twice.items())[:5]}"

    for part in b_partitions:
        last: dict[str, tuple[int, int]] = {}
        seen: set[Any] = set()
        for event in part:
            if _change(event) in seen or event.key is None:
                continue  # a record given again after a failover: the first one counts
            seen.add(_change(event))
            # a record given again carries no value but with a create: compare versions then
            i = json.loads(event.value)["i"] if event.value else -1
            if event.key in last:
                assert event.version > last[event.key][0] and i != last[event.key][1], (
                    f"{event.key}: version {event.version} (i {i}) after {last[event.key]}"
                )
            last[event.key] = (event.version, i)
    print(f"faults: {killed}; {len(a_ids)} updates, each applied once at B")
