#!/usr/bin/env bash
# Set up (first run only) and replay the 2013 New York flights through regionbus on the
# embedded stack (Apache Kafka + redis-server + a cache server). Arguments go to
# `regionbus demo flights` (e.g. --days 7, --speed 3600, --carrier DL).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/bootstrap.sh
exec .venv/bin/regionbus demo flights "$@"
