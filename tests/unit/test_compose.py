"""The compose files and the Dockerfile, checked without a Docker engine: each set of
compose files the repository runs (docker-compose.yml alone, with
docker-compose.two-sites.yml, and docker-compose.secured.yml) is valid against the Compose
Specification schema, every regionbus service runs a command and options the CLI has and
sets only environment variables its settings read, and a deliberately broken copy of a
file is caught, naming the service."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

ROOT = Path(__file__).resolve().parents[2]


def _load_checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "check_compose", ROOT / "scripts" / "check_compose.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while being built
    spec.loader.exec_module(module)
    return module


cc = _load_checker()
import compose_model  # noqa: E402 (found next to the checker, which put its folder on the path)


def _model(name: str) -> dict[str, Any]:
    return compose_model.load([ROOT / f for f in compose_model.COMPOSE_SETS[name]])


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    """Both sites and the demo: docker-compose.yml with docker-compose.two-sites.yml."""
    return _model("two-sites")


@pytest.fixture(scope="module")
def secured() -> dict[str, Any]:
    return _model("secured")


def _problems(tmp_path: Path, compose: dict[str, Any], **files: str) -> list[Any]:
    """Check a copy of a merged compose model (and optionally a replacement Dockerfile),
    with relative paths still resolving against the repository and the required variables
    set, as a user's .env sets them."""
    copy = tmp_path / "docker-compose.yml"
    copy.write_text(yaml.safe_dump(compose, sort_keys=False))
    project = cc.Project.at(ROOT, copy)
    if "dockerfile" in files:
        dockerfile = tmp_path / "Dockerfile"
        dockerfile.write_text(files["dockerfile"])
        project = cc.Project(copy, ROOT, dockerfile, project.pyproject, project.schema)
    secured_files = [ROOT / f for f in compose_model.COMPOSE_SETS["secured"]]
    problems: list[Any] = cc.check(project, environ=cc.required_variables(secured_files))
    return problems


def _broken(compose: dict[str, Any], change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    # through JSON: YAML anchors load as shared objects, and a change must hit one service
    copy: dict[str, Any] = json.loads(json.dumps(compose))
    change(copy["services"])
    return copy


def test_the_repository_compose_files_and_dockerfile_have_no_problem() -> None:
    problems = cc.check_sets(ROOT)
    assert [str(p) for p in problems] == []
    assert cc.main([]) == 0


def test_site_a_runs_two_redundant_cache_servers_with_distinct_members_by_default(
    compose: dict[str, Any],
) -> None:
    services = compose["services"]
    default = {name for name, s in _model("default")["services"].items() if "profiles" not in s}
    assert default == {"kafka", "redis", "cache-server-1", "cache-server-2"}
    servers = [services["cache-server-1"], services["cache-server-2"]]
    assert {s["environment"]["REGIONBUS_MEMBER_ID"] for s in servers} == {
        "cache-server-1",
        "cache-server-2",
    }
    for server in servers:
        assert server["environment"]["REGIONBUS_SUBSCRIPTION_REDUNDANCY"] == "1"
        assert server["environment"]["REGIONBUS_METRICS_PORT"] == "9464"
        assert server["restart"] == "unless-stopped"
        assert server["depends_on"]["kafka"]["condition"] == "service_healthy"
    assert "--appendonly" in services["redis"]["command"]
    assert any(v.endswith(":/data") for v in services["redis"]["volumes"])
    assert services["kafka"]["environment"]["KAFKA_PROCESS_ROLES"] == "broker,controller"


def test_the_two_sites_file_adds_site_b_and_gateways_both_ways(compose: dict[str, Any]) -> None:
    services = compose["services"]
    two_sites = set(services) - set(_model("default")["services"])
    assert two_sites == {
        "site-b-kafka",
        "site-b-redis",
        "site-b-cache-server",
        "gateway-sender-a-to-b",
        "gateway-receiver-b",
        "gateway-sender-b-to-a",
        "gateway-receiver-a",
    }
    site_a = services["cache-server-1"]["environment"]
    site_b = services["site-b-cache-server"]["environment"]
    for sender, local, remote in (
        ("gateway-sender-a-to-b", site_a, site_b),
        ("gateway-sender-b-to-a", site_b, site_a),
    ):
        env = services[sender]["environment"]
        prefix = "REGIONBUS_GATEWAY_SENDER_"
        # the sender drains the queue its own site's servers fill, toward the other site
        assert env[f"{prefix}ID"] in local["REGIONBUS_GATEWAY_SENDERS"]
        assert env[f"{prefix}NAMESPACE"] == local["REGIONBUS_NAMESPACE"]
        assert env[f"{prefix}DISTRIBUTED_SYSTEM_ID"] == local["REGIONBUS_DISTRIBUTED_SYSTEM_ID"]
        assert env[f"{prefix}REMOTE_NAMESPACE"] == remote["REGIONBUS_NAMESPACE"]
        assert (
            env[f"{prefix}REMOTE_KAFKA_BOOTSTRAP_SERVERS"]
            == (remote["REGIONBUS_KAFKA_BOOTSTRAP_SERVERS"])
        )
    assert site_a["REGIONBUS_NAMESPACE"] != site_b["REGIONBUS_NAMESPACE"]


@pytest.mark.parametrize(
    ("change", "service", "fragment"),
    [
        pytest.param(
            lambda s: s["cache-server-1"].update(command=["serv", "--region", "flights"]),
            "cache-server-1",
            "no command 'serv'",
            id="wrong-command",
        ),
        pytest.param(
            lambda s: s["gateway-receiver-b"].update(
                command=["gateway", "receiver", "--receiver", "x"]
            ),
            "gateway-receiver-b",
            "No such option '--receiver'",
            id="unknown-option",
        ),
        pytest.param(
            lambda s: s["cache-server-2"]["environment"].update(REGIONBUS_NAMSPACE="regionbus"),
            "cache-server-2",
            "REGIONBUS_NAMSPACE is not read by 'regionbus serve' (did you mean "
            "REGIONBUS_NAMESPACE?)",
            id="unknown-variable",
        ),
        pytest.param(
            lambda s: s["cache-server-1"].update(comand=["serve"]),
            "cache-server-1",
            "schema: Unevaluated properties are not allowed ('comand' was unexpected)",
            id="schema-violation",
        ),
        pytest.param(
            # the demo reads devstack.local's variables, not the server's
            lambda s: s["flights-demo"]["environment"].update(REGIONBUS_LEASE_TTL_MS="8000"),
            "flights-demo",
            "REGIONBUS_LEASE_TTL_MS is not read by 'regionbus demo flights'",
            id="variable-of-another-command",
        ),
        pytest.param(
            lambda s: s["site-b-cache-server"]["environment"].update(
                REGIONBUS_REGION_GATEWAY_SENDERS='{"flights": ["to-nowhere"]}'
            ),
            "site-b-cache-server",
            "names undefined gateway senders ['to-nowhere']",
            id="invalid-settings-value",
        ),
        pytest.param(
            lambda s: s["kafka-acls"]["volumes"].append("./scripts/missing.sh:/x.sh:ro"),
            "kafka-acls",
            "mounts ./scripts/missing.sh, which does not exist",
            id="missing-mount",
        ),
        pytest.param(
            lambda s: s["cache-server-2"]["healthcheck"].update(
                test=["CMD-SHELL", "regionbus stauts --json | grep -q x"]
            ),
            "cache-server-2",
            "healthcheck 'regionbus stauts --json': 'regionbus' has no command 'stauts'",
            id="wrong-healthcheck-command",
        ),
        pytest.param(
            lambda s: s["redis-secured"]["environment"].update(REDIS_PASSWORD="${NO_DEFAULT}"),
            "redis-secured",
            "variable NO_DEFAULT is unset and has no default",
            id="variable-without-default",
        ),
    ],
)
def test_a_broken_copy_is_reported_with_the_service_it_breaks(
    tmp_path: Path,
    compose: dict[str, Any],
    secured: dict[str, Any],
    change: Callable[[dict[str, Any]], None],
    service: str,
    fragment: str,
) -> None:
    model = secured if service in secured["services"] else compose
    problems = _problems(tmp_path, _broken(model, change))
    assert problems, "the broken copy passed"
    assert {p.service for p in problems} == {service}, [str(p) for p in problems]
    assert any(fragment in p.message for p in problems), [str(p) for p in problems]


@pytest.mark.parametrize(
    ("old", "new", "fragment"),
    [
        ('ENTRYPOINT ["regionbus"]', 'ENTRYPOINT ["regionbuss"]', "ENTRYPOINT ['regionbuss']"),
        ('ENTRYPOINT ["regionbus"]', "ENTRYPOINT regionbus", "not in exec (JSON array) form"),
        ("USER regionbus\n", "", "runs as root"),
        ("COPY src ./src\n", "", "(folder src/regionbus) is not copied"),
        ("COPY src ./src", "COPY srcs ./src", "COPY source srcs does not exist"),
        ("COPY src ./src", "COPY tests ./tests", "tests is excluded by .dockerignore"),
    ],
)
def test_a_broken_dockerfile_is_reported(
    tmp_path: Path, compose: dict[str, Any], old: str, new: str, fragment: str
) -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert old in dockerfile
    problems = _problems(tmp_path, compose, dockerfile=dockerfile.replace(old, new))
    assert any(p.service is None and fragment in p.message for p in problems), [
        str(p) for p in problems
    ]


def test_a_service_overriding_the_entrypoint_is_checked_with_its_own(
    tmp_path: Path, compose: dict[str, Any]
) -> None:
    def change(services: dict[str, Any]) -> None:
        services["cache-server-1"]["entrypoint"] = ["python", "-m", "regionbus"]

    problems = _problems(tmp_path, _broken(compose, change))
    assert [p.service for p in problems] == ["cache-server-1"]
    assert "runs ['python'], not one of the entry points ['regionbus']" in problems[0].message


def test_the_demo_accepts_the_variable_names_devstack_defines(
    tmp_path: Path, compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The accepted names come from regionbus.devstack.local, not from a list in the checker:
    renaming the variable there makes the compose file's old name a problem."""
    from regionbus.devstack import local as devstack_local

    monkeypatch.setattr(devstack_local, "KAFKA_ENV_VAR", "RENAMED_KAFKA_BOOTSTRAP_SERVERS")
    problems = _problems(tmp_path, compose)
    assert [(p.service, p.message.split(" (")[0]) for p in problems] == [
        (
            "flights-demo",
            "environment variable REGIONBUS_KAFKA_BOOTSTRAP_SERVERS is not read by "
            "'regionbus demo flights'",
        )
    ]


def test_settings_env_names_follow_prefix_aliases_and_extra_fields() -> None:
    class Example(BaseSettings):
        model_config = SettingsConfigDict(env_prefix="EX_")

        plain: int = 0
        aliased: int = Field(default=0, validation_alias="OTHER_NAME")
        choices: int = Field(default=0, validation_alias=AliasChoices("FIRST", "second"))

    assert cc.settings_env_names(Example, ["later"]) == {
        "EX_PLAIN",
        "OTHER_NAME",
        "FIRST",
        "SECOND",
        "EX_LATER",
    }


@pytest.mark.parametrize(
    ("text", "expected", "complaint"),
    [
        ("${A:-x}", "x", None),
        ("${A-x}", "x", None),
        ("$$A and $${A}", "$A and ${A}", None),
        ("a${EMPTY:-d}b", "adb", None),
        ("a${EMPTY-d}b", "ab", None),
        ("${A:+x}", "", None),
        ("${SET:+x}", "x", None),
        ("${SET}", "v", None),
        ("$A", "", "variable A is unset and has no default"),
        ("${A:?give it}", "", "variable A is required: give it"),
    ],
)
def test_interpolation_follows_compose(text: str, expected: str, complaint: str | None) -> None:
    value, complaints = cc.interpolate(text, {"SET": "v", "EMPTY": ""})
    assert value == expected
    assert complaints == ([complaint] if complaint else [])
