"""Write ``docker/image-constraints.txt``: the exact version of every package the regionbus
image installs (the base dependencies and the ``demo`` extra's, with theirs), taken from
the Python environment this runs in, where the package is installed with that extra
(``scripts/bootstrap.sh``'s ``.venv`` has it).

The Dockerfile installs the wheel with ``pip install -c`` this file, so an image built
today and one built next month hold the same dependencies; ``tests/unit/test_packaging.py``
fails when a dependency pyproject.toml names is missing here or pinned outside its range.
Run it after changing the dependencies, and commit the file:

    .venv/bin/python scripts/pin_image_dependencies.py
"""

from __future__ import annotations

import importlib.metadata
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
CONSTRAINTS = ROOT / "docker" / "image-constraints.txt"
IMAGE_EXTRAS = ("demo",)
"""The extras an image is built with (docker-compose.yml's ``EXTRAS`` build argument)."""


def image_requirements(pyproject: Path = ROOT / "pyproject.toml") -> list[Requirement]:
    """The requirements pyproject.toml gives the image: the base and :data:`IMAGE_EXTRAS`."""
    project = tomllib.loads(pyproject.read_text())["project"]
    named = list(project["dependencies"])
    for extra in IMAGE_EXTRAS:
        named += project["optional-dependencies"][extra]
    return [Requirement(text) for text in named]


def installed_closure(requirements: list[Requirement]) -> dict[str, str]:
    """``{canonical name: installed version}`` of ``requirements`` and everything they
    require in turn, as installed in this environment (markers evaluated here).

    Raises:
        importlib.metadata.PackageNotFoundError: a required package is not installed.
    """
    found: dict[str, str] = {}
    pending = [(r, tuple(r.extras)) for r in requirements]
    while pending:
        requirement, extras = pending.pop()
        name = canonicalize_name(requirement.name)
        if name in found:
            continue
        distribution = importlib.metadata.distribution(requirement.name)
        found[name] = distribution.version
        for text in distribution.requires or []:
            needed = Requirement(text)
            marker = needed.marker
            if marker is None or any(marker.evaluate({"extra": e}) for e in ("", *extras)):
                pending.append((needed, tuple(needed.extras)))
    return found


def main() -> int:
    closure = installed_closure(image_requirements())
    lines = [
        "# The exact versions the regionbus image installs (Dockerfile: pip install -c).",
        "# Written by scripts/pin_image_dependencies.py from an environment with the package",
        "# and its demo extra installed; run it again after changing pyproject.toml.",
        *(f"{name}=={version}" for name, version in sorted(closure.items())),
    ]
    CONSTRAINTS.write_text("\n".join(lines) + "\n")
    print(f"{CONSTRAINTS.relative_to(ROOT)}: {len(closure)} packages pinned")
    return 0


if __name__ == "__main__":
    sys.exit(main())
