"""Every command line of the README's and the user documents' shell blocks, as written.

Each fenced ``bash`` block of README.md and docs/*.md is read line by line. Every command
line must be known here: run for real (against the session's Kafka and Redis, configured
the way the README says users configure it, by ``REGIONBUS_*`` variables), or, when it runs
for minutes or needs what a test cannot start (the whole suite, a year of flights, a Docker
engine), checked as far as a test can and named with what runs it in full. A command line
added to a document that this file does not know fails the first test.

The ``regionbus stack`` command line and the Python snippets run in
``test_readme_snippet.py``; the install lines' wheel in ``test_wheel.py``; every block's
kind, the TOML blocks and every link in ``tests/unit/test_documents.py``.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import string
import subprocess
import tomllib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from readme_commands import (
    QUICKSTART,
    README,
    REPOSITORY,
    USER_DOCUMENTS,
    blocks,
    regionbus_program,
)
from support import wait_until

from regionbus.broker.cli import main as regionbus_cli
from regionbus.broker.config import ServerSettings

_PROGRAM_TIMEOUT_S = 120.0


def _document_lines(documents: tuple[Path, ...] = USER_DOCUMENTS) -> list[tuple[Path, str]]:
    """Every command line of the documents' ``bash`` blocks, comments and continuations
    removed, in order, with the document it is in."""
    return [
        (block.document, line)
        for document in documents
        for block in blocks(document)
        if block.language == "bash"
        for line in _command_lines(block.text)
    ]


def _readme_command_lines() -> list[str]:
    return [line for _, line in _document_lines()]


def _command_lines(block: str) -> list[str]:
    lines: list[str] = []
    pending = ""
    for raw in block.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        lines.append(_without_comment(pending + line))
        pending = ""
    return lines


def _without_comment(line: str) -> str:
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|><")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    joined = shlex.join(list(lexer))
    for punctuation in ("&", ";", ">", ">>", "&&"):
        joined = joined.replace(f"'{punctuation}'", punctuation)
    return joined


def _argv(line: str) -> list[str]:
    return [word for word in shlex.split(line, comments=True) if word != "&"]


def _env_prefix(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    env: dict[str, str] = {}
    while argv and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", argv[0]):
        name, _, value = argv[0].partition("=")
        env[name] = value
        argv = argv[1:]
    return env, argv


def _regionbus_args(line: str) -> list[str] | None:
    """The arguments after ``regionbus`` of a line that runs the CLI, else None."""
    _, argv = _env_prefix(_argv(line))
    if argv[:1] == ["taskset"]:
        argv = argv[3:]
    if argv and argv[0] in ("regionbus", ".venv/bin/regionbus") and ">" not in argv:
        return argv[1:]
    return None


# What runs each kind of line in full, when this file only checks it.
_ELSEWHERE: dict[str, Callable[[str], bool]] = {
    # CI (.ci/run) runs ./scripts/test.sh, which runs ./scripts/bootstrap.sh; the demo's
    # checks run in test_flights_demo.py and test_demo_progress.py (a year of flights takes
    # 8 minutes).
    "scripts": lambda line: (
        _argv(line)[0] in ("./scripts/demo.sh", "./scripts/test.sh", "./scripts/bootstrap.sh")
    ),
    # scripts/compose-check.sh brings every compose file up on a Docker engine (the README's
    # quickstart included: it runs examples/quickstart.py with the clients' defaults), and CI
    # runs it; here: test_the_compose_lines_name_files_and_profiles_that_exist and
    # test_the_compose_check_explains_itself_and_ci_runs_it.
    "compose": lambda line: (
        _argv(line)[:2] == ["docker", "compose"]
        or _argv(line)[0] == "scripts/compose-check.sh"
        or _env_prefix(_argv(line))[1][:2] == ["docker", "compose"]
        or _argv(line)[:3] == ["cp", ".env.example", ".env"]
    ),
    # the quickstart's virtualenv: test_wheel.py installs the package into a fresh one;
    # examples/quickstart.py runs in test_readme_snippet.py and scripts/compose-check.sh
    "quickstart": lambda line: (
        _argv(line)
        in (
            ["python3", "-m", "venv", ".venv"],
            [".venv/bin/pip", "install", "."],
            [".venv/bin/python", "examples/quickstart.py"],
        )
    ),
    # test_wheel.py builds the wheel and installs it without extras.
    "pip": lambda line: _argv(line)[:2] == ["pip", "install"],
    # set-up of a Debian machine (docs/development.md): root's apt-get, the shell's source
    "machine set-up": lambda line: (
        _argv(line)[:2] in (["apt-get", "install"], ["source", ".venv/bin/activate"])
    ),
    # shell completion: tests/unit/test_cli_consistency.py runs each script's generation
    "completion": lambda line: (
        line.startswith("_REGIONBUS_COMPLETE=")
        or _argv(line)[:2] == ["echo", ". ~/.regionbus-complete.bash"]
    ),
    # the loaded-machine recipe around the demo (busy loops, then kill them)
    "busy loops": lambda line: line.startswith(("for i in", "kill %")),
    # settings given as variables: test_the_variable_lines_are_settings_a_server_reads
    "variables": lambda line: _env_prefix(_argv(line))[1] == [],
    # variables for the lines after it (test_the_user_lines_run_as_written)
    "export": lambda line: _argv(line)[0] == "export",
}


def test_every_command_line_is_run_or_checked_here() -> None:
    lines = _document_lines()
    assert len(lines) >= 50, lines
    unknown = [
        f"{document.name}: {line}"
        for document, line in lines
        if _regionbus_args(line) is None and not any(f(line) for f in _ELSEWHERE.values())
    ]
    assert unknown == [], "command lines no test knows"


def test_the_variable_lines_are_settings_a_server_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """A block of ``REGIONBUS_*=...`` lines configures a cache server as it says."""
    assigned: dict[str, str] = {}
    for line in _readme_command_lines():
        env, rest = _env_prefix(_argv(line))
        if not rest and not line.startswith("export "):
            assigned.update(env)
    assert "REGIONBUS_GATEWAY_SENDERS" in assigned
    for name, value in assigned.items():
        monkeypatch.setenv(name, value)
    settings = ServerSettings()
    assert settings.distributed_system_id == 1
    assert set(settings.gateway_senders) == {"to-ny"}
    assert settings.region_gateway_senders == {"flights": ["to-ny"]}
    assert set(settings.async_event_queues) == {"db"}


def _placeholder_files(args: list[str], folder: Path) -> None:
    """Create the files a command line names as inputs, so parsing checks what it can."""
    for option in ("--config", "--input"):
        if option in args:
            (folder / args[args.index(option) + 1]).touch()


def test_every_regionbus_command_line_parses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each ``regionbus`` line names commands and options the CLI has."""
    monkeypatch.chdir(tmp_path)
    checked = 0
    for document, line in _document_lines():
        args = _regionbus_args(line)
        if args is None:
            continue
        _placeholder_files(args, tmp_path)
        # --help is eager: it answers once every command and option before it is found,
        # and an unknown command or option fails first.
        ran = CliRunner().invoke(
            regionbus_cli, [*args, "--help"], prog_name="regionbus", catch_exceptions=False
        )
        assert ran.exit_code == 0, f"{document.name}: {line}: {ran.output}"
        assert "Usage: regionbus" in ran.output
        checked += 1
    assert checked >= 25


def test_the_scripts_exist_and_the_test_script_is_what_ci_runs() -> None:
    for line in _readme_command_lines():
        program = _argv(line)[0]
        if program.startswith(("./scripts/", "scripts/")):
            path = REPOSITORY / program
            assert path.is_file() and os.access(path, os.X_OK), program
    readme = [
        line
        for block in blocks(README)
        if block.language == "bash"
        for line in _command_lines(block.text)
    ]
    assert "./scripts/test.sh" in readme
    assert "bash scripts/test.sh" in (REPOSITORY / ".ci" / "run").read_text()


def test_the_quickstart_runs_the_example_the_readme_shows() -> None:
    lines = _command_lines(next(b for b in blocks(README) if b.language == "bash").text)
    assert lines[0].startswith("docker compose up")
    assert _argv(lines[-1]) == [".venv/bin/python", "examples/quickstart.py"]
    assert QUICKSTART.is_file()


def test_the_compose_lines_name_files_and_profiles_that_exist() -> None:
    import yaml

    checked = 0
    for document, line in _document_lines():
        _, argv = _env_prefix(_argv(line))
        if argv[:2] != ["docker", "compose"]:
            if argv[:1] == ["cp"]:
                assert (REPOSITORY / argv[1]).is_file(), line
            continue
        files = [argv[i + 1] for i, word in enumerate(argv) if word == "-f"] or [
            "docker-compose.yml"
        ]
        services: dict[str, dict[str, object]] = {}
        for name in files:
            path = REPOSITORY / name
            assert path.is_file(), f"{document.name}: {line}"
            services.update(yaml.safe_load(path.read_text())["services"])
        profiles = {p for s in services.values() for p in s.get("profiles", [])}  # type: ignore[attr-defined]
        for i, word in enumerate(argv):
            if word == "--profile":
                assert argv[i + 1] in profiles, f"{document.name}: {line}"
        assert (
            argv[-1] in services
            or argv[-1].startswith("-")
            or argv[-1]
            in (
                "up",
                "down",
            )
        ), f"{document.name}: {line}"
        checked += 1
    assert checked >= 6


def test_the_compose_check_explains_itself_and_ci_runs_it() -> None:
    lines = [line for line in _readme_command_lines() if line.startswith("scripts/compose-check")]
    assert "scripts/compose-check.sh" in lines
    for line in lines:
        if "--help" in line:
            ran = subprocess.run(
                _argv(line), cwd=REPOSITORY, capture_output=True, text=True, timeout=60
            )
            assert ran.returncode == 0, ran.stderr
            for phase in ("default", "two-sites", "secured", "demo"):
                assert phase in ran.stdout
    assert "scripts/compose-check.sh" in (REPOSITORY / ".ci" / "run").read_text()


def test_the_install_lines_name_extras_pyproject_defines() -> None:
    extras = set(
        tomllib.loads((REPOSITORY / "pyproject.toml").read_text())["project"][
            "optional-dependencies"
        ]
    )
    named = set()
    for line in _readme_command_lines():
        argv = _argv(line)
        if argv[:2] == ["pip", "install"]:
            found = re.fullmatch(r"\.(?:\[(\w+)\])?", argv[2])
            assert found is not None, line
            assert found[1] is None or found[1] in extras, line
            named.add(found[1])
    assert extras <= named, "an extra the README does not name"


def _block_with(fragment: str, document: Path = README) -> list[str]:
    """The command lines of the document's ``bash`` block that holds ``fragment``."""
    found = [b for b in blocks(document) if b.language == "bash" and fragment in b.text]
    assert len(found) == 1, f"{len(found)} bash blocks of {document.name} hold {fragment!r}"
    return _command_lines(found[0].text)


@pytest.fixture
def readme_env(namespace: str, kafka_bootstrap_servers: str, redis_url: str) -> dict[str, str]:
    """The environment a user exports after ``regionbus stack``: the session's stack, this
    test's namespace."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("REGIONBUS_")}
    env.update(
        COLUMNS="200",  # a terminal wide enough for config show's table
        REGIONBUS_NAMESPACE=namespace,
        REGIONBUS_KAFKA_BOOTSTRAP_SERVERS=kafka_bootstrap_servers,
        REGIONBUS_REDIS_URL=redis_url,
    )
    return env


def _run(line: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    prefix, argv = _env_prefix(_argv(line))
    assert argv[0] in ("regionbus", ".venv/bin/regionbus"), line
    return subprocess.run(
        [regionbus_program(), *argv[1:]],
        capture_output=True,
        text=True,
        env={**env, **prefix},
        cwd=cwd,
        timeout=_PROGRAM_TIMEOUT_S,
        check=False,
    )


def test_the_configuration_lines_run_as_written(readme_env: dict[str, str], tmp_path: Path) -> None:
    """``config show`` with the README's own ``site.toml`` and ``--for gateway_sender``."""
    (toml,) = [b for b in blocks(README) if b.language == "toml"]
    (tmp_path / "site.toml").write_text(toml.text)
    lines = _block_with("regionbus --config site.toml config show")
    assert len(lines) == 2
    # the file's namespace shows only where the environment does not set one
    env = {k: v for k, v in readme_env.items() if k != "REGIONBUS_NAMESPACE"}
    shown = _run(lines[0], env, tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert re.search(r"namespace\s+│\s+site-a\s+│\s+file", shown.stdout), shown.stdout
    as_json = _run(lines[1], env, tmp_path)
    assert as_json.returncode == 0, as_json.stderr
    assert as_json.stdout.lstrip().startswith("{")


def test_the_user_lines_run_as_written(readme_env: dict[str, str], tmp_path: Path) -> None:
    lines = _block_with("regionbus user add admin", REPOSITORY / "docs" / "security.md")
    assert _argv(lines[0])[:3] == ["regionbus", "user", "add"]
    env = {
        **readme_env,
        "ADMIN_SECRET": "an-admin-secret-of-some-length",
        "DESK_SECRET": "a-desk-secret-of-some-length",
    }
    outputs = []
    for line in lines:
        if line.startswith("export "):
            # the shell expands "$ADMIN_SECRET" before export sees it
            assigned, _ = _env_prefix(_argv(line)[1:])
            env.update({k: string.Template(v).substitute(env) for k, v in assigned.items()})
            continue
        ran = _run(line, env, tmp_path)
        assert ran.returncode == 0, f"{line}: {ran.stderr}"
        outputs.append(ran.stdout)
    assert env["REGIONBUS_SECURITY_SECRET"] == env["ADMIN_SECRET"]
    listed = outputs[3]
    assert "admin\tCLUSTER:MANAGE" in listed and "loader\t" in listed
    assert (
        "loader"
        not in subprocess.run(
            [regionbus_program(), "user", "list"],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        ).stdout
    )


@pytest.fixture
def started_servers(readme_env: dict[str, str], tmp_path: Path) -> Iterator[list[str]]:
    """The two ``serve`` lines of "High availability", started as written (in the
    background); yields the status lines, then stops the servers."""
    lines = _block_with("regionbus status --json", REPOSITORY / "docs" / "operations.md")
    serving = [line for line in lines if line.rstrip().endswith("&")]
    assert len(serving) == 2
    servers = []
    for line in serving:
        prefix, argv = _env_prefix(_argv(line))
        servers.append(
            subprocess.Popen(
                [regionbus_program(), *argv[1:]],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env={**readme_env, **prefix},
                cwd=tmp_path,
            )
        )
    try:
        yield [line for line in lines if line not in serving]
    finally:
        for server in servers:
            server.send_signal(signal.SIGTERM)
        for server in servers:
            server.wait(timeout=60)


def test_the_high_availability_lines_run_as_written(
    started_servers: list[str], readme_env: dict[str, str], tmp_path: Path
) -> None:
    status, as_json = started_servers

    def two_members_with_secondaries() -> bool:
        ran = _run(as_json, readme_env, tmp_path)
        return ran.returncode == 0 and ran.stdout.count('"member_id"') >= 2

    wait_until(two_members_with_secondaries, 120, "two members in regionbus status --json")
    shown = _run(status, readme_env, tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "primary" in shown.stdout.lower(), shown.stdout
