"""docker-compose.secured.yml, checked without a Docker engine: a project of its own, it
refuses to interpolate (so to start) without its passwords while docker-compose.yml needs
none, its files exist, and the cache server's environment is valid ``ServerSettings``
with authentication on and secured Kafka and Redis."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from regionbus.broker.config import ServerSettings

ROOT = Path(__file__).resolve().parents[2]
_PASSWORDS = {"KAFKA_ADMIN_PASSWORD", "KAFKA_SERVER_PASSWORD", "REDIS_PASSWORD"}


def _compose_model() -> Any:
    spec = importlib.util.spec_from_file_location(
        "compose_model", ROOT / "scripts" / "compose_model.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


cm = _compose_model()


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.secured.yml").read_text())
    return loaded


def _interpolate(text: str) -> str:
    """The file's text as Compose reads it with a password in every required variable."""
    value, complaints = cm.interpolate(text, {name: f"pw-{name}" for name in _PASSWORDS})
    assert complaints == []
    return str(value)


def test_the_secured_stack_is_a_project_of_its_own_beside_the_plain_one(
    compose: dict[str, Any],
) -> None:
    assert compose["name"] == "regionbus-secured"
    assert set(compose["services"]) == {
        "kafka-secured",
        "kafka-acls",
        "redis-secured",
        "cache-server-secured",
    }
    plain = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert not set(plain["services"]) & set(compose["services"])


def test_without_its_passwords_it_is_refused_and_the_plain_stack_needs_none(
    compose: dict[str, Any],
) -> None:
    _, complaints = cm.interpolated(compose, {})
    missing = {c.split()[1] for _, c in complaints if " is required" in c}
    assert missing == _PASSWORDS
    # a password that is set but empty is refused too (":?", not "?")
    _, empty = cm.interpolated(compose, dict.fromkeys(_PASSWORDS, ""))
    assert {c.split()[1] for _, c in empty} == _PASSWORDS
    for name in ("docker-compose.yml", "docker-compose.two-sites.yml"):
        _, plain = cm.interpolated(yaml.safe_load((ROOT / name).read_text()), {})
        assert plain == [], name


def test_referenced_files_exist_and_the_acl_script_is_executable(
    compose: dict[str, Any],
) -> None:
    for service in compose["services"].values():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).is_file(), source
    script = ROOT / "scripts" / "kafka-acls.sh"
    assert os.access(script, os.X_OK)
    assert "kafka-acls.sh" in compose["services"]["kafka-acls"]["entrypoint"][-1]
    body = script.read_text()
    for variable in ("KAFKA_ADMIN_PASSWORD", "KAFKA_SERVER_USER", "KAFKA_SERVER_PASSWORD"):
        assert variable in compose["services"]["kafka-acls"]["environment"]
        assert variable in body


def test_secured_kafka_enforces_scram_and_acls() -> None:
    properties = dict(
        line.split("=", 1)
        for line in (ROOT / "docker" / "kafka-secured.properties").read_text().splitlines()
        if line and not line.startswith("#")
    )
    assert properties["sasl.enabled.mechanisms"] == "SCRAM-SHA-512"
    assert properties["allow.everyone.if.no.acl.found"] == "false"
    assert "StandardAuthorizer" in properties["authorizer.class.name"]
    assert "PLAINTEXT://" not in properties["listeners"].replace("SASL_PLAINTEXT", "")


def test_secured_cache_server_environment_is_valid_settings_with_security_on(
    compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    environment = compose["services"]["cache-server-secured"]["environment"]
    for name, value in environment.items():
        monkeypatch.setenv(name, _interpolate(str(value)))
    settings = ServerSettings()
    assert settings.security_enabled
    assert settings.kafka_security_protocol == "SASL_PLAINTEXT"
    assert settings.kafka_sasl_mechanism == "SCRAM-SHA-512"
    assert settings.kafka_sasl_password is not None
    assert settings.kafka_sasl_password.get_secret_value() == "pw-KAFKA_SERVER_PASSWORD"
    assert settings.redis_username == "regionbus"
    assert settings.redis_password is not None
    redis_command = compose["services"]["redis-secured"]["command"]
    assert redis_command[redis_command.index("--user") + 1 : redis_command.index("--user") + 3] == [
        "default",
        "off",
    ]
