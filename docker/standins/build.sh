#!/usr/bin/env bash
# Build local stand-ins for the third-party images docker-compose.yml and the Dockerfile
# use, under the same names, for a Docker engine that reaches no image registry:
#
#   docker/standins/build.sh [--rebuild] IMAGE...
#
# IMAGE is one of apache/kafka:<version>, redis:<tag>, prom/prometheus:v<version>,
# python:3.11<.patch>-slim<-suite>. Each is built from the recipe in
# docker/standins/<kafka|redis|prometheus|python>/ on a Debian bookworm base made with
# `debootstrap --variant=minbase` and `docker import` (regionbus-standin/debian:bookworm).
# Builds use the host's network (an engine started without IP masquerading gives a build
# no route out) and reach only Debian's packages; the Kafka stand-in takes the jars
# scripts/bootstrap.sh resolved into jvm/lib/kafka/, which must be of the tag's version.
#
# Every stand-in carries the label org.regionbus.standin with a hash of its recipe, so a
# later run reuses it while the recipe is unchanged and rebuilds it otherwise. An image of
# the same name without that label is a real one (pulled earlier): it is left alone.
# --rebuild rebuilds the base and the stand-ins even when they are current.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
standins="$repo/docker/standins"
stage_root="$repo/.regionbus/standins"
base_image="regionbus-standin/debian:bookworm"
mirror="${REGIONBUS_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
label="org.regionbus.standin"
rebuild=false
images=()
for argument in "$@"; do
  case "$argument" in
    --rebuild) rebuild=true ;;
    -*) echo "standins: unknown option $argument" >&2; exit 2 ;;
    *) images+=("$argument") ;;
  esac
done
if [ "${#images[@]}" -eq 0 ]; then
  echo "usage: $0 [--rebuild] apache/kafka:<version> redis:<tag> prom/prometheus:v<version> python:3.11.<patch>-slim-bookworm" >&2
  exit 2
fi

log() { printf 'standins: %s\n' "$*"; }

# debootstrap, apt-get and reading the root file system it makes need root
as_root=()
if [ "$(id -u)" -ne 0 ]; then
  as_root=(sudo)
fi

image_label() {
  docker image inspect --format "{{ index .Config.Labels \"$label\" }}" "$1" 2>/dev/null || true
}

image_exists() { docker image inspect "$1" >/dev/null 2>&1; }

# The base: Debian bookworm minbase, with the same suites as the host's apt sources, so a
# stand-in's packages are the security-updated ones.
build_base() {
  local recipe="debootstrap --variant=minbase bookworm $mirror; suites bookworm bookworm-updates bookworm-security"
  local wanted
  wanted="$(printf '%s' "$recipe" | sha256sum | cut -c1-16)"
  if [ "$rebuild" = false ] && [ "$(image_label "$base_image")" = "$wanted" ]; then
    log "base $base_image is current"
    return
  fi
  if ! command -v debootstrap >/dev/null 2>&1; then
    log "installing debootstrap"
    local apt_log
    apt_log="$(mktemp)"
    if ! { "${as_root[@]}" apt-get update -qq &&
      "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap; } \
      >"$apt_log" 2>&1; then
      cat "$apt_log" >&2
      rm -f "$apt_log"
      return 1
    fi
    rm -f "$apt_log"
  fi
  local rootfs
  rootfs="$(mktemp -d /var/tmp/regionbus-standin-rootfs.XXXXXX)"
  log "debootstrap --variant=minbase bookworm into $rootfs"
  if ! "${as_root[@]}" debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >"$rootfs.log" 2>&1; then
    tail -20 "$rootfs.log" >&2
    "${as_root[@]}" rm -rf "$rootfs" "$rootfs.log"
    return 1
  fi
  rm -f "$rootfs.log"
  printf 'deb %s %s main\n' "$mirror" bookworm "$mirror" bookworm-updates \
    "${mirror%/debian}/debian-security" bookworm-security |
    "${as_root[@]}" tee "$rootfs/etc/apt/sources.list" >/dev/null
  "${as_root[@]}" sh -c "rm -rf '$rootfs'/var/cache/apt/archives/*.deb '$rootfs'/var/lib/apt/lists/*"
  log "docker import -> $base_image"
  "${as_root[@]}" tar -C "$rootfs" --numeric-owner -c . |
    docker import --change "LABEL $label=$wanted" --change 'ENV LANG=C.UTF-8' \
      --change 'CMD ["bash"]' - "$base_image" >/dev/null
  "${as_root[@]}" rm -rf "$rootfs"
}

# Hash of a recipe folder plus whatever else the stand-in is built from.
recipe_hash() {
  local folder="$1"
  shift
  {
    (cd "$folder" && find . -type f -print0 | sort -z | xargs -0 sha256sum)
    docker image inspect --format '{{.Id}}' "$base_image"
    printf '%s\n' "$@"
  } | sha256sum | cut -c1-16
}

build_standin() {
  # $5...: further docker build arguments (--build-arg ...)
  local image="$1" recipe="$2" context="$3" wanted="$4"
  shift 4
  log "building $image (stand-in) from docker/standins/$recipe"
  # The legacy builder: the engine this runs on may predate BuildKit by default, and
  # nothing here needs BuildKit.
  DOCKER_BUILDKIT=0 docker build --quiet --network host --label "$label=$wanted" \
    --build-arg "BASE=$base_image" "$@" -t "$image" "$context" >/dev/null
}

wanted_standin() {
  # prints the recipe hash when $1 must be (re)built, nothing when it is current or real
  # (its messages go to stderr: the caller captures stdout)
  local image="$1" wanted="$2" have
  if image_exists "$image"; then
    have="$(image_label "$image")"
    if [ -z "$have" ]; then
      log "$image is a real image (no $label label): used as it is" >&2
      return
    fi
    if [ "$rebuild" = false ] && [ "$have" = "$wanted" ]; then
      log "$image (stand-in) is current" >&2
      return
    fi
  fi
  echo "$wanted"
}

stage() {
  # a fresh build context: the recipe folder, plus what the caller adds
  local name="$1"
  rm -rf "${stage_root:?}/$name"
  mkdir -p "$stage_root"
  cp -r "$standins/$name" "$stage_root/$name"
  echo "$stage_root/$name"
}

kafka_standin() {
  local image="$1" version="${1##*:}" libs="$repo/jvm/lib/kafka"
  if [ ! -f "$libs/kafka_2.13-$version.jar" ]; then
    echo "standins: $image needs Apache Kafka $version's jars in jvm/lib/kafka/ (found:" \
      "$(cd "$libs" 2>/dev/null && ls kafka_2.13-*.jar 2>/dev/null || echo none));" \
      "run scripts/bootstrap.sh, and keep docker-compose.yml's tag and jvm/pom.xml's" \
      "kafka.version equal" >&2
    return 1
  fi
  local jars wanted
  jars="$(cd "$libs" && printf '%s\n' ./*.jar | sort)"
  wanted="$(wanted_standin "$image" "$(recipe_hash "$standins/kafka" "$jars")")"
  [ -n "$wanted" ] || return 0
  local context
  context="$(stage kafka)"
  mkdir "$context/libs"
  cp -l "$libs"/*.jar "$context/libs/" 2>/dev/null || cp "$libs"/*.jar "$context/libs/"
  build_standin "$image" kafka "$context" "$wanted"
  rm -rf "$context"
}

redis_standin() {
  local image="$1" wanted
  wanted="$(wanted_standin "$image" "$(recipe_hash "$standins/redis")")"
  [ -n "$wanted" ] || return 0
  local context
  context="$(stage redis)"
  build_standin "$image" redis "$context" "$wanted"
  rm -rf "$context"
}

prometheus_standin() {
  local image="$1" version="${1##*:v}" wanted
  wanted="$(wanted_standin "$image" "$(recipe_hash "$standins/prometheus" "$version")")"
  [ -n "$wanted" ] || return 0
  local context
  context="$(stage prometheus)"
  build_standin "$image" prometheus "$context" "$wanted" --build-arg "VERSION=$version"
  rm -rf "$context"
}

python_standin() {
  local image="$1" bundle=""
  for candidate in "${REGIONBUS_CA_BUNDLE:-}" /etc/ssl/certs/ca-certificates.crt \
    /etc/pki/tls/certs/ca-bundle.crt; do
    if [ -n "$candidate" ] && [ -f "$candidate" ]; then
      bundle="$candidate"
      break
    fi
  done
  if [ -z "$bundle" ]; then
    echo "standins: no CA bundle found for $image (set REGIONBUS_CA_BUNDLE)" >&2
    return 1
  fi
  local wanted
  wanted="$(wanted_standin "$image" "$(recipe_hash "$standins/python" "$(sha256sum <"$bundle")")")"
  [ -n "$wanted" ] || return 0
  local context
  context="$(stage python)"
  cp "$bundle" "$context/host-ca-bundle.crt"
  build_standin "$image" python "$context" "$wanted"
  rm -rf "$context"
}

build_base
for image in "${images[@]}"; do
  case "$image" in
    apache/kafka:*) kafka_standin "$image" ;;
    redis:*) redis_standin "$image" ;;
    prom/prometheus:v*) prometheus_standin "$image" ;;
    python:3.11*-slim*) python_standin "$image" ;;
    *) echo "standins: no stand-in recipe for $image" >&2; exit 2 ;;
  esac
done
