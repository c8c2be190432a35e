"""Check the regionbus image's ``Dockerfile`` without a Docker engine (for
``scripts/check_compose.py``, which checks the compose services that run the image).

The final stage must run one of the package's entry points, in exec (JSON array) form,
as a non-root user; every file the build copies must exist and not be excluded by
``.dockerignore``, and every package ``pyproject.toml`` names must be copied.
"""

from __future__ import annotations

import json
import shlex
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pathspec
from dockerfile_parse import DockerfileParser


@dataclass(frozen=True)
class Image:
    entrypoint: list[str]
    cmd: list[str]


def _exec_form(value: str) -> list[str] | None:
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError:
        return None
    if isinstance(parsed, list) and all(isinstance(v, str) for v in parsed):
        return parsed
    return None


def check_dockerfile(
    dockerfile: Path, project_dir: Path, pyproject_file: Path, scripts: Mapping[str, str]
) -> tuple[Image, list[str]]:
    """Check a Dockerfile: its final stage runs an entry point of the package in exec form
    as a non-root user, and its build copies files that exist, that ``.dockerignore`` does
    not exclude, and every package ``pyproject.toml`` names.

    Args:
        dockerfile: The Dockerfile.
        project_dir: The build context (with its ``.dockerignore``).
        pyproject_file: ``pyproject.toml``, with the package list.
        scripts: The package's entry points, by name.

    Returns:
        The final stage's ENTRYPOINT and CMD, and one message per problem.

    Raises:
        OSError: a file cannot be read.
    """
    problems: list[str] = []
    where = f"Dockerfile {dockerfile.name}"
    parser = DockerfileParser(path=str(dockerfile))
    final: list[dict[str, Any]] = []
    copies: list[str] = []
    for instruction in parser.structure:
        if instruction["instruction"] == "FROM":
            final = []
        final.append(instruction)
        if instruction["instruction"] in ("COPY", "ADD"):
            words = shlex.split(instruction["value"])
            if not any(w.startswith("--from") for w in words):
                copies += [w for w in words[:-1] if not w.startswith("--")]
    image = Image([], [])
    user = None
    for instruction in final:
        kind, value = instruction["instruction"], instruction["value"]
        if kind in ("ENTRYPOINT", "CMD"):
            argv = _exec_form(value)
            if argv is None:
                problems.append(f"{where}: {kind} {value} is not in exec (JSON array) form")
                argv = []
            image = (
                Image(argv, image.cmd) if kind == "ENTRYPOINT" else Image(image.entrypoint, argv)
            )
        elif kind == "USER":
            user = value.split(":")[0]
    if not image.entrypoint or image.entrypoint[0] not in scripts:
        problems.append(
            f"{where}: ENTRYPOINT {image.entrypoint} is not one of the package's entry points "
            f"{sorted(scripts)}"
        )
    if user in (None, "root", "0"):
        problems.append(f"{where}: the final stage runs as root (add a USER)")
    ignore_file = project_dir / ".dockerignore"
    ignored = pathspec.GitIgnoreSpec.from_lines(
        ignore_file.read_text().splitlines() if ignore_file.is_file() else []
    )
    for source in copies:
        path = project_dir / source
        if not path.exists():
            problems.append(f"{where}: COPY source {source} does not exist")
        elif ignored.match_file(source) or ignored.match_file(f"{source}/"):
            problems.append(f"{where}: COPY source {source} is excluded by .dockerignore")
    copied = {Path(s).parts[0] for s in copies if Path(s).parts}
    for package, folder in _package_folders(project_dir, pyproject_file).items():
        if folder.parts[0] not in copied:
            problems.append(f"{where}: package {package} (folder {folder}) is not copied")
    return image, problems


def _package_folders(project_dir: Path, pyproject_file: Path) -> dict[str, Path]:
    """``{package: folder}`` of the top-level packages the wheel is built from: those in
    each folder package discovery starts at (pyproject.toml
    ``[tool.setuptools.packages.find] where``)."""
    pyproject = tomllib.loads(pyproject_file.read_text())
    find = pyproject.get("tool", {}).get("setuptools", {}).get("packages", {}).get("find", {})
    folders: dict[str, Path] = {}
    for where in find.get("where", ["."]):
        root = project_dir / where
        for top in sorted(root.iterdir()) if root.is_dir() else []:
            if (top / "__init__.py").is_file():
                folders[top.name] = Path(where) / top.name
    return folders


__all__ = ["Image", "check_dockerfile"]
