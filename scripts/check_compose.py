"""Check the compose files and the ``Dockerfile`` without a Docker engine.

What it checks, for each set of compose files the repository runs (``docker-compose.yml``
alone, with ``docker-compose.two-sites.yml``, and ``docker-compose.secured.yml``;
``compose_model.COMPOSE_SETS``), merged as ``docker compose -f ... -f ...`` merges them:

- the files, interpolated the way ``docker compose`` does with every variable unset but
  the required ones (which a user's ``.env`` sets), are valid against the Compose
  Specification JSON schema (``tests/data/compose-spec.json``);
- every service that runs the regionbus image runs a command that exists: the image's
  ENTRYPOINT (or the service's ``entrypoint``) is a ``[project.scripts]`` entry point, and
  its arguments resolve through that entry point's click group to a command whose options
  all exist (the same for ``regionbus ...`` in a shell healthcheck);
- every environment variable such a service sets is one the configuration of its command
  reads: names derived from the pydantic-settings classes (``env_prefix`` + field name,
  or the field's alias) and constants listed in :data:`SETTINGS_OF_COMMAND`; the values,
  with the command's options, must also be valid settings;
- the files the compose file mounts or reads and the Dockerfile copies exist; the
  Dockerfile's final stage runs as a non-root user with an exec-form ENTRYPOINT, and its
  build copies every package ``pyproject.toml`` names.

- the safety rules of ``scripts/check_compose_safety.py``: ports published on loopback
  unless ``PUBLISH_ADDRESS`` says otherwise, no gateway in the default stack, bounded
  gateway queues, required passwords in the secured stack, pinned images, every variable
  in ``.env.example``, and the quickstart's client defaults reaching the default stack.

The Dockerfile part is ``scripts/check_dockerfile.py``. Run by hand:
``.venv/bin/python scripts/check_compose.py [COMPOSE_FILE] [--accept-field NAME]``
(every set when no file is named; exit status 1 and one line per problem when something
is wrong).
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import json
import os
import shlex
import sys
import tomllib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import click
import jsonschema
import yaml
from dotenv import dotenv_values
from pydantic import AliasChoices, ValidationError
from pydantic_settings import BaseSettings

from regionbus.schemas.settings import RegionBusSettings

# Run by its path (by hand, or loaded from its file by the tests): its sibling module is
# found next to it, not in an installed package.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_compose_safety import check_safety
from check_dockerfile import Image, check_dockerfile
from compose_model import COMPOSE_SETS, interpolated, load, variables
from compose_model import interpolate as interpolate  # the tests' name for it

ROOT = Path(__file__).resolve().parents[1]

_CONFIG_FILE = "regionbus.schemas.settings:CONFIG_FILE_ENV"

SETTINGS_OF_COMMAND: dict[tuple[str, ...], tuple[str, ...]] = {
    ("serve",): ("regionbus.broker.config:ServerSettings", _CONFIG_FILE),
    ("status",): (
        "regionbus.broker.config:ServerSettings",
        _CONFIG_FILE,
        "regionbus.broker.cli_users:PRINCIPAL_ENV",
        "regionbus.broker.cli_users:SECRET_ENV",
    ),
    ("region", "create"): ("regionbus.broker.config:ServerSettings", _CONFIG_FILE),
    ("region", "list"): ("regionbus.broker.config:ServerSettings", _CONFIG_FILE),
    ("gateway", "sender"): ("regionbus.gateways.sender:GatewaySenderSettings", _CONFIG_FILE),
    ("gateway", "receiver"): ("regionbus.gateways.receiver:GatewayReceiverSettings", _CONFIG_FILE),
    ("gateway", "async-event-queue"): (
        "regionbus.gateways.async_event_queue:AsyncEventQueueSettings",
        _CONFIG_FILE,
    ),
    ("demo", "flights"): (
        "regionbus.devstack.local:KAFKA_ENV_VAR",
        "regionbus.devstack.local:REDIS_ENV_VAR",
    ),
}
"""What configuration each CLI command reads, keyed by its path below the entry point:
``"module:Class"`` of a pydantic-settings class, or ``"module:NAME"`` of a string constant
holding an environment variable's name. A compose service may set only these variables.
A command used in the compose file but missing here is reported, so a new command gets an
entry rather than an unchecked environment."""

_SHELL_SEPARATORS = frozenset({"|", "||", "&&", ";", "&"})


@dataclass(frozen=True)
class Problem:
    """One thing wrong, with the compose service it was found in (None: file level)."""

    service: str | None
    message: str

    def __str__(self) -> str:
        return f"{self.service}: {self.message}" if self.service else self.message


@dataclass(frozen=True)
class Project:
    """The files a check reads.

    Attributes:
        compose_file: The compose file to check.
        project_dir: Where its relative paths start (``docker compose``'s project
            directory), and the regionbus image's build context (with its
            ``.dockerignore``).
        dockerfile: The regionbus image's Dockerfile.
        pyproject: ``pyproject.toml`` with ``[project.scripts]`` and the package list.
        schema: The Compose Specification JSON schema.
    """

    compose_file: Path
    project_dir: Path
    dockerfile: Path
    pyproject: Path
    schema: Path
    overrides: tuple[Path, ...] = ()

    @classmethod
    def at(
        cls, root: Path, compose_file: Path | None = None, overrides: Sequence[Path] = ()
    ) -> Project:
        """The project's files under ``root``, optionally with another compose file (a
        broken copy whose relative paths still resolve against ``root``) and override
        files merged into it (``docker compose -f FILE -f OVERRIDE``)."""
        return cls(
            compose_file=compose_file or root / "docker-compose.yml",
            project_dir=root,
            dockerfile=root / "Dockerfile",
            pyproject=root / "pyproject.toml",
            schema=root / "tests" / "data" / "compose-spec.json",
            overrides=tuple(overrides),
        )

    @property
    def compose_files(self) -> tuple[Path, ...]:
        """The compose file and its overrides, in ``-f`` order."""
        return (self.compose_file, *self.overrides)


@dataclass
class _Found:
    problems: list[Problem] = field(default_factory=list)

    def add(self, service: str | None, message: str) -> None:
        self.problems.append(Problem(service, message))


class _CommandError(Exception):
    """The arguments do not name a command of the CLI, or its options are wrong."""


# --- the package: entry points, CLI, settings ------------------------------------------


def entry_points(pyproject: Path) -> dict[str, str]:
    """``[project.scripts]`` of ``pyproject``: ``{script name: "module:attribute"}``.

    Raises:
        OSError: the file cannot be read.
        tomllib.TOMLDecodeError: it is not TOML.
    """
    data = tomllib.loads(pyproject.read_text())
    scripts: dict[str, str] = data.get("project", {}).get("scripts", {})
    return scripts


def _load(target: str) -> Any:
    module_name, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module_name), attribute)


def resolve_command(
    root: click.Command, name: str, args: Sequence[str]
) -> tuple[tuple[str, ...], click.Context]:
    """Parse ``args`` as the command line ``name args...`` would be, without running it.

    Groups are walked with ``get_command`` (so lazily imported subcommands are loaded) and
    the final command's ``make_context`` parses its options and arguments.

    Args:
        root: The entry point's click command or group.
        name: The entry point's name (``info_name``).
        args: The arguments after it.

    Returns:
        The command's path below the entry point (e.g. ``("gateway", "sender")``) and its
        parsed context (``params`` holds the options' values).

    Raises:
        _CommandError: a subcommand does not exist, an option is unknown, a value is
            invalid, a required argument is missing, or the arguments ask for ``--help``.
    """
    command, parent, path, rest = root, None, [name], list(args)
    try:
        while isinstance(command, click.Group):
            ctx = command.context_class(command, info_name=path[-1], parent=parent)
            with ctx.scope(cleanup=False):
                # click.Command's parser leaves the subcommand and its arguments in `rest`
                rest = click.Command.parse_args(command, ctx, rest)
            if not rest:
                raise _CommandError(f"'{' '.join(path)}' needs a subcommand")
            sub = command.get_command(ctx, rest[0])
            if sub is None:
                known = ", ".join(command.list_commands(ctx))
                raise _CommandError(
                    f"'{' '.join(path)}' has no command {rest[0]!r} (it has: {known})"
                )
            command, parent = sub, ctx
            path.append(rest.pop(0))
        leaf = command.make_context(path[-1], rest, parent=parent)
    except click.exceptions.Exit as exc:
        raise _CommandError(f"'{' '.join(path)}' exits while parsing its arguments") from exc
    except click.UsageError as exc:
        raise _CommandError(f"'{' '.join(path)}': {exc.format_message()}") from exc
    return tuple(path[1:]), leaf


def settings_env_names(
    settings_class: type[BaseSettings], extra_fields: Iterable[str] = ()
) -> set[str]:
    """The environment variable names a pydantic-settings class reads, upper-cased.

    Args:
        settings_class: The class.
        extra_fields: Field names to accept as if the class had them (fields another
            branch adds, until it is merged).

    Returns:
        ``env_prefix + field name`` for each field, or the field's alias (or each of its
        alias choices) when it has one; ``prefix + field + delimiter`` prefixes are not
        included (none of the project's classes sets ``env_nested_delimiter``).
    """
    prefix = settings_class.model_config.get("env_prefix", "")
    names = {f"{prefix}{extra}" for extra in extra_fields}
    if issubclass(settings_class, RegionBusSettings):
        # regionbus's own: the names it reads (renamed fields too, and their older names)
        names |= set(settings_class.env_names()) | set(settings_class.deprecated_env_names())
        return {name.upper() for name in names}
    for field_name, info in settings_class.model_fields.items():
        alias = info.validation_alias or info.alias
        if alias is None:
            names.add(f"{prefix}{field_name}")
        else:
            # an AliasPath's first element is the variable (the rest index into its JSON)
            for choice in alias.choices if isinstance(alias, AliasChoices) else [alias]:
                names.add(choice if isinstance(choice, str) else str(choice.path[0]))
    return {name.upper() for name in names}


def _accepted(
    targets: Sequence[str], extra_fields: Iterable[str]
) -> tuple[set[str], list[type[BaseSettings]]]:
    names: set[str] = set()
    classes: list[type[BaseSettings]] = []
    for target in targets:
        found = _load(target)
        if isinstance(found, type) and issubclass(found, BaseSettings):
            names |= settings_env_names(found, extra_fields)
            classes.append(found)
        elif isinstance(found, str):
            names.add(found.upper())
        else:
            raise TypeError(f"{target} is neither a pydantic-settings class nor a string")
    return names, classes


@contextmanager
def _only_environment(environment: Mapping[str, str]) -> Iterator[None]:
    """The process environment replaced by ``environment`` (a container's) for a while."""
    with mock.patch.dict(os.environ, environment, clear=True):
        yield


def _validate_settings(
    settings_class: type[BaseSettings], environment: Mapping[str, str], params: Mapping[str, Any]
) -> str | None:
    # The CLI passes its non-empty options as keyword arguments (broker.cli._settings).
    given: dict[str, Any] = {
        k: list(v) if isinstance(v, tuple) else v
        for k, v in params.items()
        if k in settings_class.model_fields and v not in (None, ())
    }
    try:
        with _only_environment(environment):
            settings_class(**given)
    except ValidationError as exc:
        details = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'settings'}: {e['msg']}" for e in exc.errors()
        )
        return f"environment is not valid {settings_class.__name__}: {details}"
    except Exception as exc:
        return f"environment is not valid {settings_class.__name__}: {exc}"
    return None


# --- the compose file and the Dockerfile ----------------------------------------------


def _argv(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return shlex.split(value)
    return [str(v) for v in value]


def _environment(
    service: Mapping[str, Any], project_dir: Path, found: _Found, name: str
) -> dict[str, str]:
    """A service's environment: its env files, then ``environment`` (which wins)."""
    result: dict[str, str] = {}
    env_files = service.get("env_file", [])
    for entry in [env_files] if isinstance(env_files, str | dict) else env_files:
        path = entry if isinstance(entry, str) else entry.get("path", "")
        required = entry.get("required", True) if isinstance(entry, dict) else True
        source = project_dir / path
        if source.is_file():
            result.update({k: v or "" for k, v in dotenv_values(source).items()})
        elif required:
            found.add(name, f"env_file {path} does not exist")
    environment = service.get("environment", {})
    if isinstance(environment, list):
        for item in environment:
            key, _, value = str(item).partition("=")
            result[key] = value
    else:
        result.update({str(k): "" if v is None else str(v) for k, v in environment.items()})
    return result


def _regionbus_services(services: Mapping[str, Any], project_dir: Path) -> set[str]:
    """Services built from the project directory, or running an image such a service
    builds."""
    built: set[str] = set()
    images: set[str] = set()
    for name, service in services.items():
        build = service.get("build")
        context = build if isinstance(build, str) else (build or {}).get("context")
        if context is not None and (project_dir / context).resolve() == project_dir.resolve():
            built.add(name)
            if "image" in service:
                images.add(service["image"])
    return built | {n for n, s in services.items() if s.get("image") in images}


def _shell_commands(text: str) -> list[list[str]]:
    """The simple commands of a shell command line (split at ``|``, ``&&``, ``;``...)."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    commands: list[list[str]] = [[]]
    for token in lexer:
        if token in _SHELL_SEPARATORS:
            commands.append([])
        else:
            commands[-1].append(token)
    return [c for c in commands if c]


def _close_match(name: str, accepted: set[str]) -> str | None:
    """The accepted name ``name`` is probably a misspelling of, compared after the prefix
    they share (``REGIONBUS_``), which would otherwise make every name look alike."""
    first, last = min(accepted, default=""), max(accepted, default="")
    shared = next(
        (i for i, (a, b) in enumerate(zip(first, last, strict=False)) if a != b), len(first)
    )
    prefix = first[: first.rfind("_", 0, shared) + 1]
    if not name.startswith(prefix):
        prefix = ""
    tails = {n[len(prefix) :]: n for n in accepted}
    close = difflib.get_close_matches(name[len(prefix) :], list(tails), n=1, cutoff=0.8)
    return tails[close[0]] if close else None


def _check_service(
    name: str,
    service: Mapping[str, Any],
    image: Image,
    scripts: Mapping[str, str],
    project: Project,
    extra_fields: Iterable[str],
    found: _Found,
) -> None:
    if "entrypoint" in service:
        argv = _argv(service["entrypoint"]) + _argv(service.get("command"))
    else:
        command = service.get("command", image.cmd)
        argv = image.entrypoint + _argv(command)
    environment = _environment(service, project.project_dir, found, name)
    if not argv or argv[0] not in scripts:
        found.add(name, f"runs {argv[:1]}, not one of the entry points {sorted(scripts)}")
        return
    try:
        path, ctx = resolve_command(_load(scripts[argv[0]]), argv[0], argv[1:])
    except _CommandError as exc:
        found.add(name, f"command {' '.join(argv)!r}: {exc}")
        return
    targets = SETTINGS_OF_COMMAND.get(path)
    if targets is None:
        found.add(
            name,
            f"command {' '.join(path)!r} has no entry in SETTINGS_OF_COMMAND "
            "(scripts/check_compose.py): say which configuration it reads",
        )
        return
    accepted, classes = _accepted(targets, extra_fields)
    for variable in sorted(environment):
        if variable.upper() not in accepted:
            close = _close_match(variable.upper(), accepted)
            hint = f"did you mean {close}?" if close else f"see {', '.join(targets)}"
            found.add(
                name,
                f"environment variable {variable} is not read by "
                f"'{argv[0]} {' '.join(path)}' ({hint})",
            )
    for settings_class in classes:
        complaint = _validate_settings(settings_class, environment, ctx.params)
        if complaint:
            found.add(name, complaint)
    test = (service.get("healthcheck") or {}).get("test")
    if isinstance(test, list) and test[:1] == ["CMD-SHELL"]:
        shell_commands = _shell_commands(" ".join(test[1:]))
    elif isinstance(test, list) and test[:1] == ["CMD"]:
        shell_commands = [test[1:]]
    elif isinstance(test, str):
        shell_commands = _shell_commands(test)
    else:
        shell_commands = []
    for words in shell_commands:
        if words[0] in scripts:
            try:
                resolve_command(_load(scripts[words[0]]), words[0], words[1:])
            except _CommandError as exc:
                found.add(name, f"healthcheck {' '.join(words)!r}: {exc}")


def _check_mounts(name: str, service: Mapping[str, Any], project_dir: Path, found: _Found) -> None:
    for volume in service.get("volumes", []):
        if isinstance(volume, str):
            source = volume.split(":", 1)[0]
        else:
            source = volume.get("source", "") if volume.get("type") == "bind" else ""
        if source.startswith((".", "/")) and not (project_dir / source).exists():
            found.add(name, f"mounts {source}, which does not exist")


def check(
    project: Project,
    *,
    extra_fields: Iterable[str] = (),
    environ: Mapping[str, str] | None = None,
) -> list[Problem]:
    """Check the compose file (with its overrides) and the Dockerfile of ``project``.

    Args:
        project: The files.
        extra_fields: Settings field names accepted for every settings class as if it had
            them (see :func:`settings_env_names`).
        environ: The variables set while interpolating (default: none, a fresh shell).

    Returns:
        Every problem found; empty when all is well. Problems in a service name it.

    Raises:
        OSError: a file cannot be read.
        ImportError: an entry point or a :data:`SETTINGS_OF_COMMAND` target cannot be
            imported (the package is not installed, or was renamed).
    """
    found = _Found()
    extra_fields = tuple(extra_fields)
    try:
        raw = load(project.compose_files)
    except yaml.YAMLError as exc:
        return [Problem(None, f"{project.compose_file.name} is not YAML: {exc}")]
    compose, complaints = interpolated(raw, environ or {})
    for where, complaint in complaints:
        service = where[1] if len(where) > 1 and where[0] == "services" else None
        found.add(service, f"{complaint} (at {'/'.join(where)})")
    schema = json.loads(project.schema.read_text())
    validator = jsonschema.Draft202012Validator(schema)
    for error in sorted(validator.iter_errors(compose), key=lambda e: list(e.absolute_path)):
        where = [str(p) for p in error.absolute_path]
        service = where[1] if len(where) > 1 and where[0] == "services" else None
        found.add(service, f"schema: {error.message} (at {'/'.join(where) or '/'})")
    services = compose.get("services") if isinstance(compose, dict) else None
    if not isinstance(services, dict):
        return found.problems
    scripts = entry_points(project.pyproject)
    image, dockerfile_problems = check_dockerfile(
        project.dockerfile, project.project_dir, project.pyproject, scripts
    )
    for message in dockerfile_problems:
        found.add(None, message)
    ours = _regionbus_services(services, project.project_dir)
    for name, service in services.items():
        if not isinstance(service, dict):
            continue
        _check_mounts(name, service, project.project_dir, found)
        if name in ours:
            _check_service(name, service, image, scripts, project, extra_fields, found)
    return found.problems


def required_variables(files: Iterable[Path]) -> dict[str, str]:
    """A stand-in value for each variable the files require (``${VAR:?...}``): what a
    user's ``.env`` gives them, so the rest of the file can be checked."""
    return {
        name: f"stand-in-{name.lower()}"
        for path in files
        for name, ops in variables(path.read_text()).items()
        if ":?" in ops or "?" in ops
    }


def check_sets(root: Path = ROOT, *, extra_fields: Iterable[str] = ()) -> list[Problem]:
    """Check every set of compose files the repository runs (:data:`COMPOSE_SETS`), each as
    ``docker compose`` merges it, and the safety rules of ``check_compose_safety``.

    Returns:
        Every problem, each prefixed by the set it was found in.
    """
    problems: list[Problem] = []
    for name, names in COMPOSE_SETS.items():
        files = [root / n for n in names]
        project = Project.at(root, files[0], files[1:])
        for problem in check(project, extra_fields=extra_fields, environ=required_variables(files)):
            problems.append(Problem(problem.service, f"[{name}] {problem.message}"))
    problems.extend(Problem(None, message) for message in check_safety(root))
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    """Check a compose file (default: the repository's) and the Dockerfile; print each
    problem.

    Args:
        argv: Command-line arguments (default ``sys.argv[1:]``): an optional compose file,
            and ``--accept-field NAME`` (repeatable) for settings fields not merged yet.

    Returns:
        0 when nothing is wrong, else 1.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("compose_file", nargs="?", type=Path)
    parser.add_argument("--accept-field", action="append", default=[], metavar="NAME")
    args = parser.parse_args(argv)
    if args.compose_file:
        problems = check(
            Project.at(ROOT, args.compose_file.resolve()), extra_fields=args.accept_field
        )
    else:
        problems = check_sets(ROOT, extra_fields=args.accept_field)
    for problem in problems:
        print(problem)
    print(f"{len(problems)} problem(s)" if problems else "compose files and Dockerfile: OK")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
