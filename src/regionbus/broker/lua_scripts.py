"""The Lua scripts of ``broker/lua/``, read with their includes.

A script's text may take another file's with a line ``--@include <name>@--``: the entry
scripts share one definition of an entry version (``version.lua``), and
``apply_entries.lua`` runs ``apply_entry.lua`` once per change of a batch. They are run
with :mod:`regionbus.runtime.redis_scripts`.
"""

from __future__ import annotations

import re
from importlib import resources

_INCLUDE = re.compile(r"^--@include ([A-Za-z0-9_.-]+\.lua)@--$", re.MULTILINE)


def load_lua(name: str) -> str:
    """The text of ``broker/lua/<name>``, with its ``--@include <name>@--`` lines replaced
    by the named files' texts (``apply_entries.lua`` takes ``apply_entry.lua`` as its
    per-operation function, the scripts that version entries ``version.lua``)."""
    text = resources.files("regionbus.broker").joinpath("lua", name).read_text()
    return _INCLUDE.sub(lambda match: load_lua(match.group(1)), text)


__all__ = ["load_lua"]
