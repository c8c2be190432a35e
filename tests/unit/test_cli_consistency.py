"""The ``regionbus`` command line is consistent: every option has help, an option that sets
a setting reads that setting's variable and shows it, every long-running command takes
``-v`` and ``--log-format``, the gateway variables do not repeat their prefix (the older
names still work, with a warning), a regionbus error is one line and exit status 1 (2 for
a configuration refused), and shell completion works as docs/cli.md says."""

from __future__ import annotations

import logging
import re
import shlex
import socket
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from regionbus.broker.cli import main
from regionbus.broker.config import ServerSettings
from regionbus.clients.settings import ClientSettings
from regionbus.gateways.async_event_queue import AsyncEventQueueSettings
from regionbus.gateways.receiver_settings import GatewayReceiverSettings
from regionbus.gateways.repair_settings import GatewayRepairSettings
from regionbus.gateways.sender_settings import GatewaySenderSettings
from regionbus.runtime.cli_options import command_error
from regionbus.schemas.errors import ConfigurationError, TransportError
from regionbus.schemas.settings import RegionBusSettings, unknown_environment

ROOT = Path(__file__).resolve().parents[2]

_SETTINGS_OF: dict[tuple[str, ...], type[RegionBusSettings]] = {
    ("gateway", "sender"): GatewaySenderSettings,
    ("gateway", "receiver"): GatewayReceiverSettings,
    ("gateway", "async-event-queue"): AsyncEventQueueSettings,
    ("gateway", "repair"): GatewayRepairSettings,
    ("spark", "analytics"): ClientSettings,
    ("spark", "delays"): ClientSettings,
    ("spark", "bulk-load"): ClientSettings,
    ("topic", "tail"): ClientSettings,
}
"""Which settings a command's options set (the others set ``ServerSettings``)."""

_LONG_RUNNING = {
    ("serve",),
    ("stack",),
    ("gateway", "sender"),
    ("gateway", "receiver"),
    ("gateway", "async-event-queue"),
    ("demo", "flights"),
    ("spark", "analytics"),
    ("spark", "delays"),
    ("spark", "bulk-load"),
    ("spark", "cluster"),
    ("topic", "tail"),
}


def _commands() -> Iterator[tuple[tuple[str, ...], click.Command]]:
    def walk(
        command: click.Command, path: tuple[str, ...], ctx: click.Context
    ) -> Iterator[tuple[tuple[str, ...], click.Command]]:
        if isinstance(command, click.Group):
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                assert sub is not None
                yield from walk(sub, (*path, name), click.Context(sub, ctx, info_name=name))
        else:
            yield path, command

    yield from walk(main, (), click.Context(main, info_name="regionbus"))


def _options(command: click.Command) -> list[click.Option]:
    return [p for p in command.params if isinstance(p, click.Option)]


def test_every_option_of_every_command_has_help() -> None:
    missing = [
        f"{' '.join(path)} {option.opts[0]}"
        for path, command in _commands()
        for option in _options(command)
        if not (option.help or "").strip()
    ]
    assert missing == []


def test_an_option_that_sets_a_setting_reads_its_variable_and_shows_it() -> None:
    checked = 0
    for path, command in _commands():
        settings = _SETTINGS_OF.get(path, ServerSettings)
        for option in _options(command):
            field = {"kafka": "kafka_bootstrap_servers"}.get(option.name or "", option.name)
            if field not in settings.model_fields or option.opts == ["--redis-cluster"]:
                # --redis-cluster of stack and demo runs a cluster; the setting says the
                # URL names one
                continue
            if path == ("demo", "flights") and field == "namespace":
                # the replay clears its region: never a namespace exported for a site
                assert option.envvar is None
                continue
            assert option.envvar == settings.env_name(field), (path, option.opts)
            assert option.show_envvar, (path, option.opts)
            checked += 1
    assert checked >= 40


def test_no_help_text_names_a_variable_by_hand() -> None:
    for path, command in _commands():
        for option in _options(command):
            assert "REGIONBUS_" not in (option.help or ""), (path, option.opts)


def test_every_long_running_command_takes_verbose_and_log_format() -> None:
    found = dict(_commands())
    assert set(found) >= _LONG_RUNNING
    for path in _LONG_RUNNING:
        names = {opt for option in _options(found[path]) for opt in option.opts}
        assert {"-v", "--verbose", "--log-format"} <= names, path


def test_stack_namespace_reads_regionbus_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    stack = dict(_commands())[("stack",)]
    assert stack.make_context("stack", []).params["namespace"] == "regionbus"
    monkeypatch.setenv("REGIONBUS_NAMESPACE", "site-b")
    assert stack.make_context("stack", []).params["namespace"] == "site-b"
    monkeypatch.setenv("REGIONBUS_REGIONS", '["flights", "airports"]')
    assert stack.make_context("stack", []).params["regions"] == ("flights", "airports")


@pytest.mark.parametrize(
    ("settings", "field", "new", "old"),
    [
        (
            GatewaySenderSettings,
            "sender_id",
            "REGIONBUS_GATEWAY_SENDER_ID",
            "REGIONBUS_GATEWAY_SENDER_SENDER_ID",
        ),
        (
            GatewayReceiverSettings,
            "receiver_id",
            "REGIONBUS_GATEWAY_RECEIVER_ID",
            "REGIONBUS_GATEWAY_RECEIVER_RECEIVER_ID",
        ),
        (
            AsyncEventQueueSettings,
            "queue_id",
            "REGIONBUS_ASYNC_EVENT_QUEUE_ID",
            "REGIONBUS_ASYNC_EVENT_QUEUE_QUEUE_ID",
        ),
    ],
)
def test_gateway_ids_read_a_variable_without_the_stutter_and_the_old_one_with_a_warning(
    settings: type[RegionBusSettings],
    field: str,
    new: str,
    old: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert settings.env_name(field) == new
    required = {
        "distributed_system_id": "1",
        "remote_distributed_system_id": "2",
        "remote_namespace": "b",
        "remote_kafka_bootstrap_servers": "b:9092",
    }
    for name, value in required.items():
        if name in settings.model_fields:
            monkeypatch.setenv(settings.env_name(name), value)
    monkeypatch.setenv(old, "from-old")
    with caplog.at_level(logging.WARNING, logger="regionbus.config"):
        assert getattr(settings.load(), field) == "from-old"
    assert f"{old} is deprecated: set {new} instead" in caplog.text
    assert unknown_environment() == []  # the old name is known, not a typo
    caplog.clear()
    monkeypatch.setenv(new, "from-new")
    with caplog.at_level(logging.WARNING, logger="regionbus.config"):
        loaded = settings.load()
    assert getattr(loaded, field) == "from-new"
    assert loaded.sources()[field] == "env"
    assert "deprecated" not in caplog.text


def test_a_renamed_variable_is_read_from_a_dotenv_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dotenv = tmp_path / "site.env"
    dotenv.write_text(
        "REGIONBUS_GATEWAY_RECEIVER_ID=from-file\nREGIONBUS_GATEWAY_RECEIVER_DISTRIBUTED_SYSTEM_ID=3\n"
    )
    monkeypatch.setenv("REGIONBUS_CONFIG_FILE", str(dotenv))
    loaded = GatewayReceiverSettings.load()
    assert (loaded.receiver_id, loaded.distributed_system_id) == ("from-file", 3)


def test_gateway_help_shows_the_new_variables() -> None:
    shown = CliRunner().invoke(main, ["gateway", "sender", "--help"], terminal_width=200)
    assert shown.exit_code == 0, shown.output
    assert "REGIONBUS_GATEWAY_SENDER_ID]" in shown.output
    assert "SENDER_SENDER" not in shown.output


@pytest.fixture
def closed_redis_url() -> Iterator[str]:
    """A Redis URL at a port bound and not listening: every connection is refused."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield f"redis://127.0.0.1:{held.getsockname()[1]}/0"


@pytest.mark.parametrize(
    "args",
    [["region", "create", "flights"], ["region", "list"], ["status"], ["user", "list"]],
    ids=" ".join,
)
def test_redis_down_is_one_line_and_exit_1(args: list[str], closed_redis_url: str) -> None:
    ran = CliRunner().invoke(main, [*args, "--redis", closed_redis_url])
    assert ran.exit_code == 1, ran.output
    assert ran.stdout == ""
    assert ran.stderr.count("\n") == 1, ran.stderr
    assert ran.stderr.startswith(f"Error: Redis at {closed_redis_url}"), ran.stderr
    assert "Connection refused" in ran.stderr
    assert ran.exception is None or isinstance(ran.exception, SystemExit)


def test_a_regionbus_error_is_one_line_and_a_configuration_error_exits_2() -> None:
    transport = command_error(TransportError("Kafka at x:1\ndid not answer"))
    assert (transport.exit_code, transport.format_message()) == (1, "Kafka at x:1 did not answer")
    refused = command_error(ConfigurationError("invalid server configuration:\n  a: b"))
    assert refused.exit_code == 2
    assert refused.format_message() == "invalid server configuration:\n  a: b"


def test_a_configuration_refused_exits_2_without_a_usage_block(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("REGIONBUS_LEASE_TTL_MS", "10")
    ran = CliRunner().invoke(main, ["region", "list"])
    assert ran.exit_code == 2, ran.output
    assert ran.stderr.startswith("Error: invalid server configuration:"), ran.stderr
    assert "REGIONBUS_LEASE_TTL_MS" in ran.stderr
    assert "Usage:" not in ran.stderr


def test_shell_completion_works_as_docs_cli_md_says() -> None:
    text = (ROOT / "docs" / "cli.md").read_text()
    lines = re.findall(r"^(_REGIONBUS_COMPLETE=\S+ regionbus)\b", text, re.MULTILINE)
    assert {line.split("=")[1].split()[0] for line in lines} == {
        "bash_source",
        "zsh_source",
        "fish_source",
    }
    for line in lines:
        variable, _ = shlex.split(line)
        name, value = variable.split("=")
        ran = CliRunner().invoke(main, [], prog_name="regionbus", env={name: value})
        assert ran.exit_code == 0, ran.output
        assert "_REGIONBUS_COMPLETE" in ran.output
    # bash: completing "regionbus ga" offers the gateway group
    ran = CliRunner().invoke(
        main,
        [],
        prog_name="regionbus",
        env={
            "_REGIONBUS_COMPLETE": "bash_complete",
            "COMP_WORDS": "regionbus ga",
            "COMP_CWORD": "1",
        },
    )
    assert "plain,gateway" in ran.output
