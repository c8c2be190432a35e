"""The compose files' safety rules (scripts/check_compose_safety.py): they hold for the
repository's files, and each rule catches a copy that breaks it: a port on every
interface, a gateway in the one-site stack, an unbounded gateway queue or one whose
comment says otherwise, a password with a default, a floating image tag, a variable
missing from .env.example, and a Kafka the quickstart's defaults do not reach."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
_FILES = (
    "docker-compose.yml",
    "docker-compose.two-sites.yml",
    "docker-compose.secured.yml",
    "Dockerfile",
    ".env.example",
)


def _load(name: str) -> ModuleType:
    sys.path.insert(0, str(ROOT / "scripts"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


safety = _load("check_compose_safety")


def test_the_repository_files_keep_every_rule() -> None:
    assert safety.check_safety(ROOT) == []


def _edit(file_name: str, old: str, new: str, count: int = 1) -> Callable[[Path], None]:
    """A change of the copy: ``old`` replaced by ``new`` (``count`` times; -1: all)."""

    def change(root: Path) -> None:
        path = root / file_name
        text = path.read_text()
        assert old in text, f"{old!r} not in {file_name}"
        path.write_text(text.replace(old, new, count))

    return change


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        pytest.param(
            _edit("docker-compose.yml", '"${PUBLISH_ADDRESS:-127.0.0.1}:6379:6379"', '"6379:6379"'),
            "[default] redis: port '6379:6379' is not published on ${PUBLISH_ADDRESS",
            id="port-on-every-interface",
        ),
        pytest.param(
            _edit(
                "docker-compose.two-sites.yml",
                '"${PUBLISH_ADDRESS:-127.0.0.1}:9467:9464"',
                '"0.0.0.0:9467:9464"',
            ),
            "[two-sites] gateway-sender-a-to-b: port 9467 binds to 0.0.0.0",
            id="port-on-all-addresses",
        ),
        pytest.param(
            _edit(
                "docker-compose.yml",
                '  REGIONBUS_DISTRIBUTED_SYSTEM_ID: "1"\n',
                '  REGIONBUS_DISTRIBUTED_SYSTEM_ID: "1"\n'
                "  REGIONBUS_GATEWAY_SENDERS: "
                '\'{"to-siteb": {"remote_distributed_system_id": 2}}\'\n'
                '  REGIONBUS_REGION_GATEWAY_SENDERS: \'{"flights": ["to-siteb"]}\'\n',
            ),
            "[default] cache-server-1: sets REGIONBUS_GATEWAY_SENDERS",
            id="gateway-in-the-default-stack",
        ),
        pytest.param(
            _edit(
                "docker-compose.two-sites.yml",
                '"remote_distributed_system_id": 2, "queue_retention_ms": 604800000',
                '"remote_distributed_system_id": 2',
            ),
            "gateway sender to-siteb keeps its queue until acknowledged",
            id="unbounded-gateway-queue",
        ),
        pytest.param(
            _edit("docker-compose.two-sites.yml", "7 days", "a week", count=-1),
            "keeps its queue 604800000 ms, which the file's comment does not state in days",
            id="comment-says-otherwise",
        ),
        pytest.param(
            _edit(
                "docker-compose.secured.yml",
                "REDIS_PASSWORD: ${REDIS_PASSWORD:?set REDIS_PASSWORD in .env (see .env.example)}",
                "REDIS_PASSWORD: ${REDIS_PASSWORD:-change-me}",
            ),
            "password REDIS_PASSWORD is used as [':-', ':?']",
            id="password-with-a-default",
        ),
        pytest.param(
            _edit("docker-compose.yml", "image: redis:7.4.2", "image: redis:7"),
            "[default] redis: image redis:7 is not pinned",
            id="floating-tag",
        ),
        pytest.param(
            _edit(
                "docker-compose.yml", "image: prom/prometheus:v2.42.0", "image: prom/prometheus:v2"
            ),
            "[default] prometheus: image prom/prometheus:v2 is not pinned",
            id="floating-v-tag",
        ),
        pytest.param(
            _edit("Dockerfile", "FROM python:3.11.11-slim-bookworm\n", "FROM python:3.11-slim\n"),
            "Dockerfile: image python:3.11-slim is not pinned",
            id="floating-base-image",
        ),
        pytest.param(
            _edit(".env.example", "ADVERTISED_HOST=127.0.0.1\n", ""),
            ".env.example: does not name ADVERTISED_HOST",
            id="variable-missing-from-env-example",
        ),
        pytest.param(
            _edit(".env.example", "PUBLISH_ADDRESS=127.0.0.1\n", "PUBLISH_ADRESS=127.0.0.1\n"),
            ".env.example: names PUBLISH_ADRESS, which no compose file reads",
            id="unknown-variable-in-env-example",
        ),
        pytest.param(
            _edit(
                "docker-compose.yml",
                '"${PUBLISH_ADDRESS:-127.0.0.1}:9092:29092"',
                '"${PUBLISH_ADDRESS:-127.0.0.1}:29092:29092"',
            ),
            "[default] kafka: 127.0.0.1:9092 is not published to its EXTERNAL listener",
            id="kafka-where-clients-do-not-look",
        ),
    ],
)
def test_a_copy_breaking_a_rule_is_reported(
    tmp_path: Path, change: Callable[[Path], None], fragment: str
) -> None:
    for name in _FILES:
        shutil.copy(ROOT / name, tmp_path / name)
    change(tmp_path)
    problems = safety.check_safety(tmp_path)
    assert any(fragment in p for p in problems), problems
