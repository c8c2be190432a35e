"""``regionbus gateway sender`` and ``regionbus gateway receiver`` as processes carry a put
from one site to another and stop cleanly on SIGTERM; bad settings are usage errors."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest
from click.testing import CliRunner
from gateway_sites import Site, running_sites

from regionbus.broker.cli import main


@pytest.fixture
def sites(namespace: str, kafka_bootstrap_servers: str, redis_url: str) -> Iterator[list[Site]]:
    with running_sites(namespace, kafka_bootstrap_servers, redis_url, 2) as started:
        yield started


def _spawn(args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "regionbus", "gateway", *args],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def test_sender_and_receiver_processes_carry_a_put_to_the_remote_site(sites: list[Site]) -> None:
    a, b = sites
    b.start_server()
    a.start_server(senders={"to-b": 2})
    receiver = _spawn(
        ["receiver", "--namespace", b.namespace, "--kafka", b.kafka, "--site-id", "2"],
        {"REGIONBUS_GATEWAY_RECEIVER_REDIS_URL": b.redis_url},
    )
    sender = _spawn(
        [
            "sender",
            "--namespace",
            a.namespace,
            "--kafka",
            a.kafka,
            "--redis",
            a.redis_url,
            "--sender-id",
            "to-b",
            "--site-id",
            "1",
            "--remote-site-id",
            "2",
            "--remote-namespace",
            b.namespace,
            "--remote-kafka",
            b.kafka,
            "--batch-time-interval-ms",
            "100",
        ],
        {},
    )
    try:
        a.client().create_region("r").put("k", "by process")
        b.wait_for("k", b'"by process"', timeout_s=90)
    finally:
        for process in (sender, receiver):
            process.send_signal(signal.SIGTERM)
        outputs = [p.communicate(timeout=60)[0].decode() for p in (sender, receiver)]
    assert sender.returncode == 0, outputs[0]
    assert receiver.returncode == 0, outputs[1]
    assert "gateway sender to-b running" in outputs[0]


def test_missing_settings_are_usage_errors() -> None:
    result = CliRunner().invoke(main, ["gateway", "receiver", "--namespace", "x"])
    assert result.exit_code == 2
    assert "distributed_system_id" in result.output
