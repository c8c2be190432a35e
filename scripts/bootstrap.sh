#!/usr/bin/env bash
# Idempotent set-up of a fresh Debian machine: redis-server, .venv, the package with [dev],
# and the JVM jars pinned in jvm/pom.xml (Apache Kafka, Spark's Kafka connector), resolved
# by Maven from Maven Central into jvm/lib/. Needs Java 17 and Maven 3.8 on PATH.
# Run as root, or as a user with sudo; from any directory.
# --peers also builds the Apache Geode peer of the benchmarks (bench/peers/geode/pom.xml ->
# jvm/lib/geode/), which only people who benchmark need; bench/peers/geode.py asks for it.
set -euo pipefail

peers=false
for argument in "$@"; do
  case "$argument" in
    --peers) peers=true ;;
    *) echo "bootstrap: unknown argument $argument (known: --peers)" >&2; exit 2 ;;
  esac
done

cd "$(dirname "${BASH_SOURCE[0]}")/.."

if ! command -v redis-server >/dev/null 2>&1; then
  if [ "$(id -u)" -eq 0 ]; then
    as_root=()
  elif command -v sudo >/dev/null 2>&1; then
    as_root=(sudo)
  else
    echo "bootstrap: redis-server is missing and installing it needs root (or sudo)" >&2
    exit 1
  fi
  echo "bootstrap: installing redis-server"
  "${as_root[@]}" apt-get update -qq
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server
fi

if [ ! -x .venv/bin/python ]; then
  python=""
  for candidate in "${PYTHON:-}" python3.13 python3.12 python3.11 python3; do
    if [ -n "$candidate" ] && command -v "$candidate" >/dev/null 2>&1 &&
      "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
      python="$candidate"
      break
    fi
  done
  if [ -z "$python" ]; then
    echo "bootstrap: no python3 >= 3.11 found (set PYTHON=/path/to/python3.11)" >&2
    exit 1
  fi
  echo "bootstrap: creating .venv with $python"
  "$python" -m venv .venv
fi

# Reinstall only when pyproject.toml changed since the last successful install.
stamp=.venv/.regionbus-installed
wanted="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$wanted" ]; then
  echo "bootstrap: pip install -e '.[dev]'"
  .venv/bin/python -m pip install -q -e '.[dev]'
  echo "$wanted" >"$stamp"
fi
# Resolve the JVM jars only when a pom changed since the last successful resolution.
if ! command -v java >/dev/null 2>&1 || ! command -v mvn >/dev/null 2>&1; then
  echo "bootstrap: java and mvn are needed (Java 17, Maven 3.8): apt-get install openjdk-17-jre-headless maven" >&2
  exit 1
fi
jvm_stamp=jvm/lib/.resolved
# The modules of jvm/pom.xml, by name: jvm/wire-client is built on its own, below.
jvm_wanted="$(cat jvm/pom.xml jvm/kafka/pom.xml jvm/spark/pom.xml | sha256sum | cut -d' ' -f1)"
if [ ! -f "$jvm_stamp" ] || [ "$(cat "$jvm_stamp")" != "$jvm_wanted" ]; then
  echo "bootstrap: mvn package (jvm/pom.xml -> jvm/lib/)"
  rm -rf jvm/lib
  mvn -q -B -f jvm/pom.xml package
  echo "$jvm_wanted" >"$jvm_stamp"
fi
# The Java wire client (jvm/wire-client -> jvm/lib/wire-client/), which the tests run to
# prove the wire format from outside Python; rebuilt when its sources or the schemas it
# packages change. Offline first: what it needs is in ~/.m2 after one resolution, so a
# machine without Maven Central builds it again; online only when something is missing.
wire_stamp=jvm/lib/wire-client/.built
wire_wanted="$(find jvm/pom.xml jvm/wire-client/pom.xml jvm/wire-client/src \
  src/regionbus/schemas -type f \( -name '*.xml' -o -name '*.java' -o -name '*.avsc' \) |
  sort | xargs cat | sha256sum | cut -d' ' -f1)"
if [ ! -f "$wire_stamp" ] || [ "$(cat "$wire_stamp")" != "$wire_wanted" ]; then
  echo "bootstrap: mvn package (jvm/wire-client/pom.xml -> jvm/lib/wire-client/)"
  rm -rf jvm/lib/wire-client
  mvn -q -B -o -f jvm/wire-client/pom.xml package >/dev/null 2>&1 ||
    mvn -q -B -f jvm/wire-client/pom.xml package
  echo "$wire_wanted" >"$wire_stamp"
fi
if [ "$peers" = true ]; then
  geode_stamp=jvm/lib/geode/.resolved
  geode_wanted="$(find bench/peers/geode/pom.xml bench/peers/geode/src -type f | sort |
    xargs cat | sha256sum | cut -d' ' -f1)"
  if [ ! -f "$geode_stamp" ] || [ "$(cat "$geode_stamp")" != "$geode_wanted" ]; then
    echo "bootstrap: mvn package (bench/peers/geode/pom.xml -> jvm/lib/geode/)"
    rm -rf jvm/lib/geode
    mvn -q -B -f bench/peers/geode/pom.xml package
    echo "$geode_wanted" >"$geode_stamp"
  fi
fi
echo "bootstrap: ready"
