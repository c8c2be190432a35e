#!/usr/bin/env bash
# Set up, lint, type-check and test; arguments go to pytest. Stops at the first failure.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

echo "==> bootstrap"
bash scripts/bootstrap.sh

echo "==> ruff check"
.venv/bin/ruff check .

echo "==> mypy"
.venv/bin/mypy

echo "==> pytest $*"
.venv/bin/pytest "$@"
