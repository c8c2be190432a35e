"""The docker-compose ``secured`` profile, checked without a Docker engine: it parses, its
services and files exist, its variables have defaults, and the cache server's environment
is valid ``ServerSettings`` with authentication on and secured Kafka and Redis."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from regionbus.broker.config import ServerSettings

ROOT = Path(__file__).resolve().parents[2]
_VARIABLE = re.compile(r"\$\{([A-Z_]+)(:-([^}]*))?\}")


def _interpolate(text: str) -> str:
    """Compose's ``${VAR:-default}`` with every variable unset; ``$$`` stays ``$``."""
    return _VARIABLE.sub(lambda m: m.group(3) or "", text).replace("$$", "$")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return loaded


def test_secured_profile_adds_services_and_leaves_the_default_ones_alone(
    compose: dict[str, Any],
) -> None:
    services = compose["services"]
    secured = {name for name, s in services.items() if "secured" in s.get("profiles", [])}
    assert secured == {"kafka-secured", "kafka-acls", "redis-secured", "cache-server-secured"}
    default = ("kafka", "redis", "cache-server-1", "cache-server-2")
    assert all("profiles" not in services[n] for n in default)


def test_every_variable_has_a_default_so_plain_compose_up_still_interpolates() -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    used = _VARIABLE.findall(text)
    assert used, "the secured profile takes its passwords from variables"
    assert all(default for _, default, _ in used)


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
    assert settings.kafka_config["security.protocol"].startswith("SASL")
    assert settings.kafka_config["sasl.mechanism"] == "SCRAM-SHA-512"
    assert settings.redis_username == "regionbus"
    assert settings.redis_password is not None
    assert json.loads(_interpolate(environment["REGIONBUS_KAFKA_CONFIG"]))["sasl.password"]
    redis_command = compose["services"]["redis-secured"]["command"]
    assert redis_command[redis_command.index("--user") + 1 : redis_command.index("--user") + 3] == [
        "default",
        "off",
    ]
