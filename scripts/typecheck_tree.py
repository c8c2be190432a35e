"""Lay out ``.regionbus/typecheck/regionbus/`` as links to the repository's folders.

The repository keeps ``broker/``, ``clients/``, ... at its top; pyproject.toml's
``[tool.setuptools] package-dir`` installs them as ``regionbus.broker``, ``regionbus.clients``.
An editable install reaches them through an import hook, which mypy does not follow
(mypy reads files, not hooks), so mypy reads this tree instead (``mypy_path`` in
pyproject.toml). The links point at the folders, so new modules need no new run.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREE = ROOT / ".regionbus" / "typecheck"


def main() -> int:
    """Create or refresh the tree; returns the process exit code."""
    package_dir: dict[str, str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"][
        "setuptools"
    ]["package-dir"]
    top = TREE / "regionbus"
    top.mkdir(parents=True, exist_ok=True)
    links: dict[Path, Path] = {}
    for child in (ROOT / package_dir["regionbus"]).iterdir():
        if child.name != "__pycache__":
            links[top / child.name] = child
    for package, folder in package_dir.items():
        if package != "regionbus":
            links[TREE.joinpath(*package.split("."))] = ROOT / folder
    for link, target in links.items():
        if link.is_symlink() and link.resolve() == target.resolve():
            continue
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(target)
    for stale in top.iterdir():
        if stale not in links:
            stale.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
