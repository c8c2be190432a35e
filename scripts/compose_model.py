"""The compose files as ``docker compose`` reads them, without a Docker engine: variable
interpolation, the merge of an override file into the file before it, and the sets of
files the repository runs together (:data:`COMPOSE_SETS`).

Used by ``scripts/check_compose.py`` and ``scripts/check_compose_safety.py``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

COMPOSE_SETS: dict[str, tuple[str, ...]] = {
    "default": ("docker-compose.yml",),
    "two-sites": ("docker-compose.yml", "docker-compose.two-sites.yml"),
    "secured": ("docker-compose.secured.yml",),
}
"""The compose files of each way the repository runs a stack, in ``-f`` order (an override
file after the file it changes)."""

VARIABLE = re.compile(
    r"\$(?:(?P<escaped>\$)"
    r"|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}"
    r"|(?P<plain>[A-Za-z_][A-Za-z0-9_]*))"
)
"""A Compose variable reference: ``$$``, ``$VAR``, ``${VAR}`` or ``${VAR<op><arg>}``."""


def interpolate(text: str, environ: Mapping[str, str]) -> tuple[str, list[str]]:
    """Substitute Compose variables in one string as ``docker compose`` does.

    Supports ``$$`` (a literal ``$``), ``$VAR``, ``${VAR}``, ``${VAR:-default}``,
    ``${VAR-default}``, ``${VAR:?error}``, ``${VAR?error}``, ``${VAR:+other}`` and
    ``${VAR+other}`` (no nesting).

    Args:
        text: The string from the compose file.
        environ: The variables that are set (the check uses none, like a fresh shell).

    Returns:
        The interpolated string, and a message for each variable that is unset with no
        default (Compose substitutes an empty string and warns) or required (``?``).
    """
    complaints: list[str] = []

    def substitute(match: re.Match[str]) -> str:
        if match.group("escaped"):
            return "$"
        name = match.group("braced") or match.group("plain")
        op, arg = match.group("op"), match.group("arg") or ""
        value = environ.get(name)
        empty = not value
        if op in (":-", "-"):
            return arg if (empty if op == ":-" else value is None) else value or ""
        if op in (":+", "+"):
            return arg if not (empty if op == ":+" else value is None) else ""
        if op in (":?", "?"):
            if empty if op == ":?" else value is None:
                complaints.append(f"variable {name} is required: {arg or 'unset'}")
            return value or ""
        if value is None:
            complaints.append(f"variable {name} is unset and has no default")
        return value or ""

    return VARIABLE.sub(substitute, text), complaints


def interpolated(
    node: Any, environ: Mapping[str, str], where: Sequence[str] = ()
) -> tuple[Any, list[tuple[Sequence[str], str]]]:
    """A loaded compose document with every string interpolated.

    Returns:
        The document, and ``(path, complaint)`` for each variable :func:`interpolate`
        complained about (the path: the keys down to the string).
    """
    complaints: list[tuple[Sequence[str], str]] = []

    def walk(value: Any, path: Sequence[str]) -> Any:
        if isinstance(value, str):
            text, found = interpolate(value, environ)
            complaints.extend((path, complaint) for complaint in found)
            return text
        if isinstance(value, Mapping):
            return {k: walk(v, [*path, str(k)]) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v, [*path, str(i)]) for i, v in enumerate(value)]
        return value

    return walk(node, list(where)), complaints


_MERGED_SEQUENCES = frozenset({"ports", "volumes", "expose", "dns", "env_file", "profiles"})
"""Sequences an override appends to (Compose merges them by entry); any other sequence
(``command``, ``entrypoint``, a healthcheck's ``test``) is replaced."""


def merge(base: Any, override: Any, key: str = "") -> Any:
    """``override`` merged into ``base`` as ``docker compose -f base -f override`` does,
    for what these files hold: mappings merge key by key, the sequences of
    :data:`_MERGED_SEQUENCES` are appended without repeats, anything else is replaced."""
    if isinstance(base, Mapping) and isinstance(override, Mapping):
        merged = dict(base)
        for name, value in override.items():
            merged[name] = merge(base[name], value, str(name)) if name in base else value
        return merged
    if isinstance(base, list) and isinstance(override, list) and key in _MERGED_SEQUENCES:
        return [*base, *(item for item in override if item not in base)]
    return override


def load(files: Sequence[Path]) -> dict[str, Any]:
    """The compose files loaded (anchors resolved) and merged in order, not interpolated.

    Raises:
        OSError: a file cannot be read.
        yaml.YAMLError: a file is not YAML.
    """
    merged: dict[str, Any] = {}
    for path in files:
        merged = merge(merged, yaml.safe_load(path.read_text()) or {})
    return merged


def variables(text: str) -> dict[str, set[str]]:
    """``{variable: the operators it is used with}`` in a compose file's text (``""`` for a
    plain ``${VAR}`` or ``$VAR``; ``$$`` escapes are not variables)."""
    found: dict[str, set[str]] = {}
    for match in VARIABLE.finditer(text):
        if match.group("escaped"):
            continue
        name = match.group("braced") or match.group("plain")
        found.setdefault(name, set()).add(match.group("op") or "")
    return found


def published_ports(service: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """``(host address, host port, container port)`` of each port a service publishes
    (short syntax ``[ADDRESS:]HOST:CONTAINER[/PROTOCOL]`` or the long form); an address
    left out is ``""``: every interface."""
    result: list[tuple[str, str, str]] = []
    for entry in service.get("ports", []):
        if isinstance(entry, Mapping):
            result.append(
                (
                    str(entry.get("host_ip", "")),
                    str(entry.get("published", "")),
                    str(entry.get("target", "")),
                )
            )
            continue
        parts = str(entry).split("/")[0].rsplit(":", 2)
        if len(parts) == 3:
            result.append((parts[0], parts[1], parts[2]))
        elif len(parts) == 2:
            result.append(("", parts[0], parts[1]))
        else:
            result.append(("", "", parts[0]))
    return result


__all__ = [
    "COMPOSE_SETS",
    "VARIABLE",
    "interpolate",
    "interpolated",
    "load",
    "merge",
    "published_ports",
    "variables",
]
