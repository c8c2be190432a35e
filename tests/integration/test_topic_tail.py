"""``regionbus topic tail`` on real topics (docs/wire-format.md): ``{ns}.events`` and
``{ns}.ops`` as decoded JSON lines, and one client's view of its shared queue partition,
each event once though every record was written twice."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from click.testing import CliRunner
from support import Recorder, wait_until
from test_wire_java import _write_every_record_again

from regionbus.broker.cli import main
from regionbus.broker.server import CacheServer
from regionbus.clients import ALL_KEYS, ClientCache
from regionbus.schemas.naming import Topics, client_partition
from regionbus.schemas.topics import DEFAULT_CLIENT_PARTITIONS

ClientFactory = Callable[..., ClientCache]


def _tail(bootstrap: str, namespace: str, *options: str) -> list[dict[str, Any]]:
    result = CliRunner().invoke(
        main,
        ["topic", "tail", "--namespace", namespace, "--kafka", bootstrap, *options],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.output.splitlines()]


def _sorted(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Rows in one order whatever partitions they came from (values of mixed types)."""
    return sorted(rows, key=json.dumps)


def test_topic_tail_prints_the_events_the_operations_and_a_clients_view_once(
    cache_server: CacheServer,
    client_factory: ClientFactory,
    kafka_bootstrap_servers: str,
    namespace: str,
) -> None:
    recorder = Recorder()
    subscriber = client_factory(client_id="tail-sub")
    subscriber.create_region("r", listeners=[recorder]).register_interest(ALL_KEYS)
    writer = client_factory(client_id="tail-writer", subscription_enabled=False)
    region = writer.create_region("r")
    region.put("p1", {"n": 1})
    region.put("p2", "two")
    region.destroy("p1")
    wait_until(lambda: len(recorder.snapshot()) == 3, what="the subscriber's events")
    topic = Topics(namespace).client_queues(None)
    partition = client_partition("tail-sub", DEFAULT_CLIENT_PARTITIONS)
    assert _write_every_record_again(kafka_bootstrap_servers, topic, {partition}) > 0

    expected = [("CREATE", "p1", {"n": 1}), ("CREATE", "p2", "two"), ("DESTROY", "p1", None)]
    view = _tail(
        kafka_bootstrap_servers,
        namespace,
        *("--client-id", "tail-sub", "--from-beginning", "--no-follow"),
    )
    assert [(e["type"], e["kind"], e["key"], e["value"]) for e in view] == [
        ("Event", *e) for e in expected
    ]
    assert {(e["topic"], e["partition"], e["originator"]) for e in view} == {
        (topic, partition, "tail-writer")
    }

    events = _tail(kafka_bootstrap_servers, namespace, "--from-beginning", "--no-follow")
    assert _sorted([(e["kind"], e["key"], e["value"]) for e in events]) == _sorted(expected)
    operations = _tail(
        kafka_bootstrap_servers, namespace, "--topic", "ops", "--from-beginning", "--no-follow"
    )
    changes = [
        (o["kind"], o["key"], o["value"], o["event_id"]["sequence"])
        for o in operations
        if o["type"] == "Operation" and o["client_id"] == "tail-writer"
    ]
    assert _sorted(changes) == _sorted(
        [("PUT", "p1", {"n": 1}, 0), ("PUT", "p2", "two", 1), ("DESTROY", "p1", None, 2)]
    )

    # Following, it stops after --max-records.
    one = _tail(kafka_bootstrap_servers, namespace, "--from-beginning", "--max-records", "1")
    assert len(one) == 1 and one[0]["type"] == "Event"
