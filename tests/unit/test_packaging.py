"""What the package declares about itself: the Apache-2.0 licence text and a NOTICE, the
version and its changelog entry, classifiers and authors, and SQLAlchemy as the ``sql``
extra that only the write-behind listener and the SQL cache loader need.

Without SQLAlchemy, importing regionbus works, and the two modules that need it raise a
typed error naming the extra; a server or an async event queue configured with them
refuses to start with a ConfigurationError saying the same. That runs in a fresh
interpreter in which ``import sqlalchemy`` fails, as it does when the extra is not
installed (``tests/integration/test_wheel.py`` installs the wheel without extras)."""

from __future__ import annotations

import hashlib
import importlib.util
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
_APACHE_2_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"
"""sha256 of https://www.apache.org/licenses/LICENSE-2.0.txt."""


@pytest.fixture(scope="module")
def project() -> dict[str, Any]:
    loaded: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return loaded


def test_the_licence_is_the_apache_2_text_and_the_notice_names_the_project(
    project: dict[str, Any],
) -> None:
    assert project["license"] == "Apache-2.0"
    assert set(project["license-files"]) == {"LICENSE", "NOTICE"}
    licence = (ROOT / "LICENSE").read_bytes()
    assert hashlib.sha256(licence).hexdigest() == _APACHE_2_SHA256
    notice = (ROOT / "NOTICE").read_text()
    assert notice.startswith("regionbus\n")
    assert "Apache License, Version 2.0" in notice
    # the one third-party file of the repository, and its licence beside it
    assert "tests/data/compose-spec.json" in notice
    assert (ROOT / "tests" / "data" / "LICENSE.compose-spec").is_file()


def test_the_version_has_a_changelog_entry_with_the_incompatible_changes(
    project: dict[str, Any],
) -> None:
    changelog = (ROOT / "CHANGELOG.md").read_text()
    versions = re.findall(r"^## (\d+\.\d+\.\d+)", changelog, re.MULTILINE)
    assert versions[0] == project["version"] == "0.2.0"
    latest = changelog.split("\n## ")[1]
    incompatible = latest.split("### Incompatible")[1].split("\n### ")[0]
    for change in ("Redis key layout", "Shared client topics", "Literal Kafka ACLs"):
        assert f"**{change}" in incompatible, change


def test_classifiers_and_authors(project: dict[str, Any]) -> None:
    assert project["authors"]
    classifiers = project["classifiers"]
    assert "Typing :: Typed" in classifiers
    assert any(c.startswith("Development Status ::") for c in classifiers)
    python = re.fullmatch(r">=(\d+)\.(\d+)", project["requires-python"])
    assert python is not None
    assert f"Programming Language :: Python :: {python[1]}.{python[2]}" in classifiers
    # a licence expression and a License classifier together are refused (PEP 639)
    assert not any(c.startswith("License ::") for c in classifiers)


def test_sqlalchemy_is_the_sql_extra_and_the_test_install_has_it(
    project: dict[str, Any],
) -> None:
    assert not any(r.startswith("sqlalchemy") for r in project["dependencies"])
    extras = project["optional-dependencies"]
    assert [r for r in extras["sql"] if r.startswith("sqlalchemy")]
    (self_reference,) = [r for r in extras["dev"] if r.startswith("regionbus[")]
    assert {"sql", "spark", "demo"} <= set(self_reference[len("regionbus[") : -1].split(","))
    # what the tests run with: scripts/test.sh runs scripts/bootstrap.sh, which installs dev
    assert "bash scripts/bootstrap.sh" in (ROOT / "scripts" / "test.sh").read_text()
    assert "pip install -q -e '.[dev]'" in (ROOT / "scripts" / "bootstrap.sh").read_text()


_WITHOUT_SQLALCHEMY = textwrap.dedent(
    """
    import json, sys
    sys.modules["sqlalchemy"] = None  # what a missing package does to `import sqlalchemy`

    import regionbus, regionbus.broker.server, regionbus.gateways.async_event_queue
    from regionbus import ConfigurationError, ExtraNotInstalledError
    from regionbus.broker.plugins import ServerPlugins
    from regionbus.gateways.async_event_queue import AsyncEventQueue, AsyncEventQueueSettings

    found = {}
    for module in ("regionbus.gateways.write_behind", "regionbus.broker.sql_loader"):
        try:
            __import__(module)
        except ExtraNotInstalledError as exc:
            found[module] = [exc.extra, list(exc.missing), str(exc), isinstance(exc, ImportError)]
    try:
        ServerPlugins.load({"prices": ["regionbus.broker.sql_loader:SqlLoader"]})
    except ConfigurationError as exc:
        found["plugins"] = str(exc)
    settings = AsyncEventQueueSettings(
        queue_id="db", listener="regionbus.gateways.write_behind:SqlWriteBehindListener"
    )
    try:
        AsyncEventQueue(settings)
    except ConfigurationError as exc:
        found["queue"] = str(exc)
    print(json.dumps(found))
    """
)


def test_without_sqlalchemy_regionbus_imports_and_the_sql_parts_name_the_extra() -> None:
    ran = subprocess.run(
        [sys.executable, "-c", _WITHOUT_SQLALCHEMY],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    found = __import__("json").loads(ran.stdout)
    hint = "pip install 'regionbus[sql]'"
    for module in ("regionbus.gateways.write_behind", "regionbus.broker.sql_loader"):
        extra, missing, message, is_import_error = found[module]
        assert (extra, missing, is_import_error) == ("sql", ["sqlalchemy"], True)
        assert hint in message
    assert hint in found["plugins"]
    assert hint in found["queue"]


def _pinning_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "pin_image_dependencies", ROOT / "scripts" / "pin_image_dependencies.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_image_installs_every_dependency_at_a_pinned_version() -> None:
    """docker/image-constraints.txt pins each package the image installs, each within the
    range pyproject.toml asks, and the Dockerfile installs with it."""
    pin = _pinning_script()
    pinned = {}
    for line in pin.CONSTRAINTS.read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"not an exact pin: {line}"
            pinned[canonicalize_name(name)] = version
    requirements = pin.image_requirements()
    for requirement in requirements:
        name = canonicalize_name(requirement.name)
        assert name in pinned, f"{name} is not pinned in {pin.CONSTRAINTS.name}"
        assert requirement.specifier.contains(pinned[name], prereleases=True), requirement
    # what they require in turn, as installed here
    assert set(pin.installed_closure(requirements)) <= set(pinned)
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "COPY docker/image-constraints.txt" in dockerfile
    assert "pip install --constraint" in dockerfile
