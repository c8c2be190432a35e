"""``regionbus serve`` freezes what start-up made, once the server is ready, so Python's
full collections walk only what the loop allocates afterwards."""

from __future__ import annotations

import gc
import logging
import os
import signal
from typing import Any

import pytest
from click.testing import CliRunner

from regionbus.broker import cli as broker_cli
from regionbus.broker.cli import main
from regionbus.broker.stats import ServerStats
from regionbus.gateways import cli as gateway_cli
from regionbus.runtime.cli_options import CommandError


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("REGIONBUS_"):
            monkeypatch.delenv(name)
    # The commands install SIGTERM/SIGINT handlers: keep the test process's own.
    monkeypatch.setattr(signal, "signal", lambda *_: None)


class _RecordingServer:
    """Stands in for CacheServer: records the calls serve makes, in order."""

    calls: list[str]

    def __init__(self, _settings: Any) -> None:
        self.metrics_url = None
        self.stats = ServerStats()
        self.failure = None

    def start(self) -> None:
        self.calls.append("start")

    def wait_while_alive(self, _stop: Any) -> bool:
        self.calls.append("serving")
        return True

    def stop(self) -> None:
        self.calls.append("stop")


def test_serve_freezes_the_start_up_objects_after_the_server_started(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []
    _RecordingServer.calls = calls
    monkeypatch.setattr(broker_cli, "CacheServer", _RecordingServer)
    monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze"))
    monkeypatch.setattr(gc, "collect", lambda *_: calls.append("collect"))
    result = CliRunner().invoke(main, ["serve"])
    logging.getLogger().handlers.clear()
    assert result.exit_code == 0, result.output
    # Start-up's garbage is collected first, so only what lives on is frozen.
    assert calls == ["start", "collect", "freeze", "serving", "stop"]


def test_a_server_that_fails_to_start_freezes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    class _FailingServer(_RecordingServer):
        def start(self) -> None:
            raise RuntimeError("no Kafka")

    _FailingServer.calls = calls
    monkeypatch.setattr(broker_cli, "CacheServer", _FailingServer)
    monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze"))
    result = CliRunner().invoke(main, ["serve"])
    logging.getLogger().handlers.clear()
    assert isinstance(result.exception, RuntimeError)
    assert "freeze" not in calls


def test_a_gateway_worker_command_freezes_after_its_worker_started(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []

    class _Worker:
        metrics_url = None
        alive = False  # the loop sees it dead at its first check and stops the command
        failure = "gone"

        def start(self) -> None:
            calls.append("start")

    monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze"))
    monkeypatch.setattr(gc, "collect", lambda *_: calls.append("collect"))
    with pytest.raises(CommandError, match="gone"):
        gateway_cli._run(_Worker(), "gateway receiver")  # type: ignore[arg-type]
    assert calls == ["start", "collect", "freeze"]
