"""Each setting's description, read from the ``Attributes:`` section of the docstrings of
its settings class and the classes it inherits from (the one place settings are
documented), for ``regionbus config show``."""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Mapping
from typing import Any, Final

from rich.markup import escape
from rich.table import Table

_MIN_VALUE_WIDTH: Final = 12
_MAX_VALUE_WIDTH: Final = 30
_ATTRIBUTE: Final = re.compile(r"^(?P<name>[a-z_][a-z0-9_]*)(?: \([^)]*\))?: (?P<text>.*)$")


def _attributes(docstring: str) -> dict[str, str]:
    lines = inspect.cleandoc(docstring).splitlines()
    try:
        start = lines.index("Attributes:") + 1
    except ValueError:
        return {}
    found: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in lines[start:]:
        if line and not line.startswith(" "):
            break  # the next section
        if line.startswith("    ") and not line.startswith("     "):
            match = _ATTRIBUTE.match(line.strip())
            if match:
                current = found.setdefault(match["name"], [match["text"]])
                continue
        if current is not None and line.strip():
            current.append(line.strip())
    return {name: " ".join(parts) for name, parts in found.items()}


def setting_descriptions(settings_class: type) -> dict[str, str]:
    """``{field name: description}`` from the ``Attributes:`` sections of
    ``settings_class``'s docstring and its bases' (the nearest class wins).

    Args:
        settings_class: A settings class (e.g. ``ServerSettings``).

    Returns:
        Descriptions of the documented fields; undocumented ones are missing.
    """
    result: dict[str, str] = {}
    for cls in settings_class.__mro__:
        for name, text in _attributes(cls.__doc__ or "").items():
            result.setdefault(name, text)
    return result


def settings_table(
    kind: str,
    settings_class: Any,
    values: Mapping[str, Any],
    sources: Mapping[str, str],
    width: int,
) -> Table:
    """The table of ``regionbus config show``: per setting its name, environment variable
    and description in one cell, then its value and source.

    The first column is at least as wide as the longest setting name, so no name is ever
    cut; descriptions, long values and, on a narrow console, environment variables wrap
    (fold) within ``width``.

    Args:
        kind: The process kind, for the title.
        settings_class: Its settings class (``env_name`` and the docstrings).
        values: ``{field: masked value}``.
        sources: ``{field: "env" | "file" | "code" | "default"}``.
        width: The console's width in columns (80 when the output is not a terminal).
    """
    descriptions = setting_descriptions(settings_class)
    widest = max((len(name) for name in values), default=10)
    source_width = len("default")
    # Borders and padding: four vertical rules and two spaces of padding per column.
    room = width - 4 - 3 * 2 - source_width
    value_width = max(_MIN_VALUE_WIDTH, min(_MAX_VALUE_WIDTH, room - widest))
    table = Table(title=f"{kind} configuration", show_lines=True)
    table.add_column(
        "setting, environment variable, description",
        width=max(widest, room - value_width),
        overflow="fold",
    )
    table.add_column("value", width=value_width, overflow="fold")
    table.add_column("source", width=source_width, no_wrap=True)
    for name, value in values.items():
        shown = value if isinstance(value, str) else json.dumps(value, default=str)
        described = descriptions.get(name, "").replace("``", "")
        cell = f"[bold]{name}[/bold]\n{settings_class.env_name(name)}"
        if described:
            cell += f"\n[dim]{escape(described)}[/dim]"
        table.add_row(cell, escape(shown), sources[name])
    return table


__all__ = ["setting_descriptions", "settings_table"]
