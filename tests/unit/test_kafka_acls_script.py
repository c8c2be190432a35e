"""``scripts/kafka-acls.sh`` grants what `regionbus.broker.kafka_acls` says servers and clients
need:
the script runs with stand-ins for Kafka's CLI tools that record their arguments.

(``tests/integration/test_kafka_acls.py`` runs it with Kafka's real tools against a broker.)
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path
from typing import Any, cast

import pytest

from regionbus.broker.kafka_acls import CLUSTER_RESOURCE, KafkaAcl, client_acls, server_acls
from regionbus.schemas.naming import Topics

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "kafka-acls.sh"
NAMESPACE = "geode.site1"

_RECORDER = """#!/usr/bin/env bash
printf '%s\\n' "$(basename "$0") $(printf '%q ' "$@")" >> "$RECORD"
"""


def _run_script(tmp_path: Path, clients: str) -> list[list[str]]:
    """Run the script with recording stand-ins; the argument lists of each tool call."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("kafka-acls.sh", "kafka-configs.sh"):
        (bin_dir / tool).write_text(_RECORDER)
        (bin_dir / tool).chmod(0o755)
    record = tmp_path / "calls"
    env = {
        "PATH": os.environ["PATH"],
        "RECORD": str(record),
        "KAFKA_BIN": str(bin_dir),
        "KAFKA_BOOTSTRAP": "kafka:9092",
        "KAFKA_ADMIN_PASSWORD": "admin-pw",
        "REGIONBUS_NAMESPACE": NAMESPACE,
        "KAFKA_SERVER_USER": "regionbus-server",
        "KAFKA_SERVER_PASSWORD": "server-pw",
        "KAFKA_CLIENTS": clients,
    }
    subprocess.run(["bash", str(SCRIPT)], env=env, check=True, capture_output=True, timeout=60)
    return [shlex.split(line) for line in record.read_text().splitlines()]


def _granted(calls: list[list[str]]) -> set[tuple[str, KafkaAcl]]:
    """The ``(user, ACL)`` pairs the ``kafka-acls.sh --add`` calls grant."""
    granted: set[tuple[str, KafkaAcl]] = set()
    for tool, *args in calls:
        if tool != "kafka-acls.sh":
            continue
        assert "--add" in args
        principal = args[args.index("--allow-principal") + 1]
        assert principal.startswith("User:")
        operations = [args[i + 1] for i, a in enumerate(args) if a == "--operation"]
        resources: list[tuple[str, str]] = [
            (a[2:], args[i + 1]) for i, a in enumerate(args) if a in ("--topic", "--group")
        ]
        if "--cluster" in args:
            resources.append(("cluster", CLUSTER_RESOURCE))
        pattern = "literal"
        if "--resource-pattern-type" in args:
            pattern = args[args.index("--resource-pattern-type") + 1]
        for kind, name in resources:
            for operation in operations:
                acl = KafkaAcl(cast(Any, kind), name, cast(Any, pattern), cast(Any, operation))
                granted.add((principal.removeprefix("User:"), acl))
    return granted


def test_the_script_grants_the_servers_and_each_clients_acls_of_broker_kafka_acls(
    tmp_path: Path,
) -> None:
    calls = _run_script(tmp_path, "desk:desk-pw:desk-1 loader:loader-pw:load-1")
    expected = {("regionbus-server", acl) for acl in server_acls(NAMESPACE)}
    expected |= {("desk", acl) for acl in client_acls(NAMESPACE, "desk-1")}
    expected |= {("loader", acl) for acl in client_acls(NAMESPACE, "load-1")}
    assert _granted(calls) == expected


def test_the_script_creates_each_scram_user_with_its_password(tmp_path: Path) -> None:
    calls = _run_script(tmp_path, "desk:desk-pw:desk-1")
    users = {
        args[args.index("--entity-name") + 1]: args[args.index("--add-config") + 1]
        for tool, *args in calls
        if tool == "kafka-configs.sh"
    }
    assert users == {
        "regionbus-server": "SCRAM-SHA-512=[iterations=8192,password=server-pw]",
        "desk": "SCRAM-SHA-512=[iterations=8192,password=desk-pw]",
    }


@pytest.mark.parametrize("client_id", ["desk", "desk-1.eu"])
@pytest.mark.parametrize("other", ["{}x", "{}.2", "{}.reply", "{}.count"])
def test_a_clients_acls_reach_no_topic_or_group_of_a_client_whose_id_extends_it(
    client_id: str, other: str
) -> None:
    """Client ids may hold dots: ``desk``'s ACLs must not name anything of ``desk.2``
    (a prefixed group ACL ``{ns}.client.desk.`` did, so ``desk`` could delete the group
    whose committed offset is ``desk.2``'s place in its queue)."""
    topics = Topics(NAMESPACE)
    other_id = other.format(client_id)
    acls = client_acls(NAMESPACE, client_id)
    theirs = {
        ("group", topics.client_group(other_id)),
        ("group", topics.client_reply_group(other_id)),
        ("topic", topics.queue(other_id)),
        ("topic", topics.reply(other_id)),
    }
    reached = [
        (a, name)
        for a in acls
        for kind, name in theirs
        if a.resource_type == kind and _matches(a, name)
    ]
    assert reached == []
    own_groups = {topics.client_group(client_id), topics.client_reply_group(client_id)}
    assert {a.resource_name for a in acls if a.resource_type == "group"} == own_groups
    assert all(a.pattern_type == "literal" for a in acls)


def _matches(acl: KafkaAcl, name: str) -> bool:
    if acl.pattern_type == "prefixed":
        return name.startswith(acl.resource_name)
    return name == acl.resource_name
