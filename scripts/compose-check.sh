#!/usr/bin/env bash
# Run the compose files for real, every stack and profile, and check each as a user would:
#
#   scripts/compose-check.sh [--demo-days N] [--keep-engine] [--purge] [--rebuild-standins]
#
# 1. engine   a Docker engine: the running one, else Debian's docker.io (installed with
#             apt-get when missing) started as `dockerd --iptables=false --ip-forward=false
#             --ip-masq=false` in the background, logging to .regionbus/compose-check/
#             dockerd.log; stopped again at the end (--keep-engine leaves it running)
# 2. compose  `docker compose` (v2): the installed plugin, else one built from its Go module
#             with the Go toolchain, cached in ~/.cache/regionbus/ and installed as
#             ~/.docker/cli-plugins/docker-compose
# 3. venv     scripts/bootstrap.sh: the .venv the host-side clients run in, and the Kafka
#             jars the Kafka stand-in is built from
# 4. images   the third-party images the compose files and the Dockerfile name: pulled when
#             a registry answers, else local stand-ins under the same names
#             (docker/standins/build.sh), said so loudly
# 5. build    the regionbus images (`docker compose build`)
# 6. default  `docker compose up -d --wait` (docker-compose.yml alone): every service
#             healthy; every published port bound to 127.0.0.1 only; from the host, the
#             README's quickstart snippet run as written with no REGIONBUS_* variable (the
#             clients' defaults), `regionbus status` (both cache servers, no gateway), the
#             metrics ports, and a put by one client reaching another client's listener
#             (scripts/compose_clients.py)
# 7. two-sites  `-f docker-compose.yml -f docker-compose.two-sites.yml up -d --wait`: puts
#             cross the gateways both ways; each gateway queue topic has the retention the
#             file states
# 8. observability  `--profile observability up` beside the two sites: Prometheus scrapes
#             every worker, its alert rules evaluate without error, and each main panel of
#             the Grafana dashboard returns data after traffic (scripts/compose_observability.py);
#             a worker stopped makes its alert active; Grafana too when its image is there
#             (it has no stand-in, see step 4)
# 9. demo     `--profile demo up`: the flights replay of REGIONBUS_DEMO_DAYS days (--demo-days,
#             default 7) ends with exit status 0 and every check OK
# 10. secured docker-compose.secured.yml: refused without its passwords (Compose names
#             each); with them, `up -d --wait`, then unauthenticated Redis and Kafka clients
#             are refused, a wrong principal secret is refused, the SCRAM principal works
# 11. down    `docker compose down --volumes` of everything it started
#
# The stacks run as compose projects `regionbus-compose-check` and
# `regionbus-compose-check-secured`, so their containers and volumes never mix with a
# `regionbus` project of your own. Images and the compose plugin stay for the next run;
# --purge removes the images this run built or pulled (regionbus, the stand-ins and their
# base) and the compose plugin it installed. Needs root (or sudo) only to install and
# start an engine. Exit status 0 when every check passed.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

demo_days=7
keep_engine=false
purge=false
rebuild_standins=()
while [ $# -gt 0 ]; do
  case "$1" in
    --demo-days) demo_days="$2"; shift ;;
    --keep-engine) keep_engine=true ;;
    --purge) purge=true ;;
    --rebuild-standins) rebuild_standins=(--rebuild) ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "compose-check: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

compose_version="v2.40.3"
project="regionbus-compose-check"
state="$repo/.regionbus/compose-check"
mkdir -p "$state"
run_log="$state/logs"
rm -rf "$run_log"
mkdir -p "$run_log"

# --- output and timing -------------------------------------------------------------------
run_started=$(date +%s.%N)
phase_names=()
phase_seconds=()
phase_name=""
phase_started=""

say() { printf 'compose-check: %s\n' "$*"; }
fail() { printf 'compose-check: FAILED: %s\n' "$*" >&2; exit 1; }
elapsed() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

phase() {
  end_phase
  phase_name="$1"
  phase_started=$(date +%s.%N)
  printf '\n== %s\n' "$phase_name"
}

end_phase() {
  if [ -n "$phase_name" ]; then
    local took
    took="$(elapsed "$phase_started")"
    phase_names+=("$phase_name")
    phase_seconds+=("$took")
    printf -- '-- %s: %s s\n' "$phase_name" "$took"
    phase_name=""
  fi
}

summary() {
  local status="$1" i
  printf '\ncompose-check: time per phase\n'
  for i in "${!phase_names[@]}"; do
    printf '  %-12s %8s s\n' "${phase_names[$i]}" "${phase_seconds[$i]}"
  done
  printf '  %-12s %8s s\n' "total" "$(elapsed "$run_started")"
  if [ "$status" -eq 0 ]; then
    printf 'compose-check: every profile passed (%s)\n' "$image_source"
  else
    printf 'compose-check: FAILED (exit status %s); logs in %s\n' "$status" "$run_log"
  fi
}

as_root=()
if [ "$(id -u)" -ne 0 ]; then
  as_root=(sudo)
fi

# --- cleanup -----------------------------------------------------------------------------
engine_pid=""
compose_ready=false
image_source="images not reached"
built_images=()
installed_plugin=""

# docker-compose.yml alone; with the two-sites override; the secured stack (its own project)
compose() { docker compose -p "$project" -f docker-compose.yml "$@"; }
compose_two_sites() {
  docker compose -p "$project" -f docker-compose.yml -f docker-compose.two-sites.yml "$@"
}
compose_secured() { docker compose -p "$project-secured" -f docker-compose.secured.yml "$@"; }

save_logs() {
  # every container's log, before anything is removed
  if [ "$compose_ready" = true ]; then
    compose_two_sites --profile '*' logs --no-color --timestamps >"$run_log/services.log" 2>&1 || true
    compose_two_sites --profile '*' ps --all >"$run_log/ps.txt" 2>&1 || true
    compose_secured logs --no-color --timestamps >"$run_log/services-secured.log" 2>&1 || true
    compose_secured ps --all >>"$run_log/ps.txt" 2>&1 || true
  fi
}

cleanup() {
  local status=$?
  trap - EXIT INT TERM
  end_phase
  if [ "$compose_ready" = true ]; then
    phase "down"
    save_logs
    # A container whose processes are still being torn down can refuse the first stop:
    # try again while anything of the project is left.
    local attempt
    for attempt in 1 2 3; do
      if compose_two_sites --profile '*' down --volumes --remove-orphans --timeout 20 \
        >"$run_log/down-$attempt.log" 2>&1 &&
        compose_secured down --volumes --remove-orphans --timeout 20 \
          >>"$run_log/down-$attempt.log" 2>&1; then
        break
      fi
      if [ "$attempt" -eq 3 ]; then
        say "docker compose down failed three times:"
        cat "$run_log/down-$attempt.log" >&2
        status=1
      fi
    done
    if [ "$purge" = true ]; then
      say "removing the images this run used: ${built_images[*]}"
      docker image rm "${built_images[@]}" >/dev/null 2>&1 || true
      docker image prune --force >/dev/null 2>&1 || true
      if [ -n "$installed_plugin" ]; then
        rm -f "$installed_plugin"
      fi
    fi
  fi
  if [ -n "$engine_pid" ]; then
    if [ "$keep_engine" = true ]; then
      say "dockerd (pid $engine_pid) left running (--keep-engine); log $state/dockerd.log"
    else
      phase "engine stop"
      "${as_root[@]}" kill "$engine_pid" 2>/dev/null || true
      # dockerd stops its containers and containerd before it exits: wait for that
      local stop_deadline=$((SECONDS + 120))
      while "${as_root[@]}" kill -0 "$engine_pid" 2>/dev/null; do
        if [ $SECONDS -ge $stop_deadline ]; then
          say "dockerd (pid $engine_pid) has not exited 120 s after SIGTERM; log $state/dockerd.log"
          status=1
          break
        fi
        sleep 0.2
      done
      if ! "${as_root[@]}" kill -0 "$engine_pid" 2>/dev/null; then
        say "dockerd stopped"
      fi
    fi
  fi
  end_phase
  summary "$status"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- 1. engine ---------------------------------------------------------------------------
phase "engine"
if docker info >/dev/null 2>&1; then
  say "a Docker engine answers: $(docker version --format 'engine {{.Server.Version}}, API {{.Server.APIVersion}}')"
else
  if ! command -v dockerd >/dev/null 2>&1; then
    say "no dockerd: installing Debian's docker.io"
    "${as_root[@]}" apt-get update -qq
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io \
      >"$run_log/apt-docker.log" 2>&1 || { cat "$run_log/apt-docker.log" >&2; fail "apt-get install docker.io"; }
  fi
  # Leave the host's firewall and forwarding alone: containers reach each other on their
  # compose networks and the host reaches published ports; nothing is routed out.
  say "starting dockerd --iptables=false --ip-forward=false --ip-masq=false (log $state/dockerd.log)"
  "${as_root[@]}" nohup dockerd --iptables=false --ip-forward=false --ip-masq=false \
    >"$state/dockerd.log" 2>&1 </dev/null &
  engine_pid=$!
  deadline=$((SECONDS + 120))
  until docker info >/dev/null 2>&1; do
    if ! "${as_root[@]}" kill -0 "$engine_pid" 2>/dev/null; then
      engine_pid=""
      tail -20 "$state/dockerd.log" >&2
      fail "dockerd exited while starting (log above, $state/dockerd.log)"
    fi
    if [ $SECONDS -ge $deadline ]; then
      tail -20 "$state/dockerd.log" >&2
      fail "dockerd did not answer on its socket within 120 s"
    fi
    sleep 0.2
  done
  say "dockerd answers: $(docker version --format 'engine {{.Server.Version}}, API {{.Server.APIVersion}}')"
fi

# --- 2. compose v2 -----------------------------------------------------------------------
phase "compose"
if docker compose version >/dev/null 2>&1; then
  say "using $(docker compose version)"
else
  cache="${XDG_CACHE_HOME:-$HOME/.cache}/regionbus/compose/$compose_version"
  if [ ! -x "$cache/docker-compose" ]; then
    command -v go >/dev/null 2>&1 || fail "docker compose is missing and so is Go to build it"
    say "building Compose $compose_version from its Go module (a few minutes, once)"
    # `go install module@version` refuses a module whose go.mod has exclude directives, as
    # Compose's has: build inside the module instead, with its own go.sum.
    module_dir="$(go mod download -json "github.com/docker/compose/v2@$compose_version" |
      sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
    [ -d "$module_dir" ] || fail "go mod download github.com/docker/compose/v2@$compose_version"
    work="$(mktemp -d)"
    cp -r "$module_dir/." "$work/"
    chmod -R u+w "$work"
    mkdir -p "$cache"
    # two packages at a time: the machine is shared
    (cd "$work" && nice -n 10 go build -p 2 -trimpath \
      -ldflags "-s -w -X github.com/docker/compose/v2/internal.Version=$compose_version" \
      -o "$cache/docker-compose.new" ./cmd) >"$run_log/compose-build.log" 2>&1 ||
      { tail -20 "$run_log/compose-build.log" >&2; rm -rf "$work"; fail "building Compose"; }
    rm -rf "$work"
    mv "$cache/docker-compose.new" "$cache/docker-compose"
  fi
  mkdir -p "$HOME/.docker/cli-plugins"
  installed_plugin="$HOME/.docker/cli-plugins/docker-compose"
  cp "$cache/docker-compose" "$installed_plugin"
  chmod 0755 "$installed_plugin"
  docker compose version >/dev/null 2>&1 || fail "the built compose plugin does not run"
  say "installed $(docker compose version) as $installed_plugin"
fi

# --- 3. the host's Python environment ----------------------------------------------------
phase "venv"
bash scripts/bootstrap.sh >"$run_log/bootstrap.log" 2>&1 ||
  { tail -30 "$run_log/bootstrap.log" >&2; fail "scripts/bootstrap.sh"; }
say "$(.venv/bin/python --version), regionbus $(.venv/bin/python -c \
  'import importlib.metadata as m; print(m.version("regionbus"))') in .venv"

# --- 4. third-party images -----------------------------------------------------------
phase "images"
mapfile -t third_party < <(.venv/bin/python - <<'PY'
import re, sys, yaml
sys.path.insert(0, "scripts")
from compose_model import COMPOSE_SETS, load
names = set()
for files in COMPOSE_SETS.values():
    compose = load([__import__("pathlib").Path(f) for f in files])
    names |= {s["image"] for s in compose["services"].values() if "image" in s and "build" not in s}
stages = set()
for line in open("Dockerfile"):
    match = re.match(r"\s*FROM\s+(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?", line, re.I)
    if match:
        if match.group(1) not in stages:
            names.add(match.group(1))
        if match.group(2):
            stages.add(match.group(2))
print("\n".join(sorted(names)))
PY
)
kafka_image="$(printf '%s\n' "${third_party[@]}" | grep '^apache/kafka:' | sort -u)"
pinned="$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' jvm/pom.xml)"
[ "$kafka_image" = "apache/kafka:$pinned" ] ||
  fail "the compose files run ${kafka_image:-no apache/kafka image}, the tests Apache Kafka $pinned (jvm/pom.xml): make them equal"
say "third-party images: ${third_party[*]}"
grafana_runs=true
# One pull with a short deadline tells whether a registry answers at all.
if timeout 30 docker pull --quiet "${third_party[0]}" >"$run_log/pull-probe.log" 2>&1; then
  for image in "${third_party[@]:1}"; do
    docker pull --quiet "$image" >/dev/null || fail "docker pull $image"
  done
  image_source="real images: ${third_party[*]}"
  built_images+=("${third_party[@]}")
  say "a registry answered: the real images are used"
else
  say "no image registry answered ($(tail -1 "$run_log/pull-probe.log" | cut -c1-150))"
  # Grafana has no stand-in: Debian does not package it, and this project builds nothing
  # from its AGPL source. A Grafana image found locally runs; else the observability
  # phase runs Prometheus alone and checks the dashboard's queries against it.
  standin_images=()
  for image in "${third_party[@]}"; do
    if [[ "$image" == grafana/grafana:* ]]; then
      if docker image inspect "$image" >/dev/null 2>&1; then
        printf '  *** %-22s is the real image (found locally)\n' "$image"
      else
        grafana_runs=false
        printf '  *** %-22s is NOT AVAILABLE (no registry, no stand-in): the observability phase runs without Grafana\n' "$image"
      fi
    else
      standin_images+=("$image")
    fi
  done
  third_party=("${standin_images[@]}")
  docker/standins/build.sh "${rebuild_standins[@]}" "${third_party[@]}" 2>&1 |
    grep -v -e '^DEPRECATED' -e '^ \+' -e '^$' || true
  [ "${PIPESTATUS[0]}" -eq 0 ] || fail "building the stand-ins"
  for image in "${third_party[@]}"; do
    label="$(docker image inspect --format '{{ index .Config.Labels "org.regionbus.standin" }}' "$image")"
    if [ -n "$label" ]; then
      printf '  *** %-22s is a LOCAL STAND-IN (docker/standins/), not the upstream image\n' "$image"
      built_images+=("$image")
    else
      printf '  *** %-22s is the real image (found locally)\n' "$image"
    fi
  done
  built_images+=("regionbus-standin/debian:bookworm")
  image_source="stand-ins for ${third_party[*]}"
fi

# --- 5. the regionbus images -----------------------------------------------------------
phase "build"
# Variables the compose file interpolates; one set for the whole run, so that no later
# `up` sees a changed configuration and recreates what runs.
export REGIONBUS_DEMO_DAYS="$demo_days"
random() { .venv/bin/python -c 'import secrets; print(secrets.token_hex(12))'; }
KAFKA_ADMIN_PASSWORD="admin-$(random)"
KAFKA_SERVER_PASSWORD="server-$(random)"
REDIS_PASSWORD="redis-$(random)"
export KAFKA_ADMIN_PASSWORD KAFKA_SERVER_PASSWORD REDIS_PASSWORD
client_password="client-$(random)"
export KAFKA_CLIENTS="cc-writer:$client_password:cc-writer cc-reader:$client_password:cc-reader cc-intruder:$client_password:cc-intruder"
export COMPOSE_CHECK_CLIENTS="$KAFKA_CLIENTS"
compose_ready=true
compose_two_sites --profile demo build >"$run_log/build.log" 2>&1 ||
  { tail -40 "$run_log/build.log" >&2; fail "docker compose build"; }
built_images+=("regionbus:latest" "regionbus:demo")
say "built regionbus:latest and regionbus:demo ($(docker image inspect --format '{{.Size}}' regionbus:latest |
  awk '{ printf "%.0f MB", $1 / 1e6 }'), with the demo extra $(docker image inspect --format '{{.Size}}' regionbus:demo |
  awk '{ printf "%.0f MB", $1 / 1e6 }'))"

# Published ports must be free, or `up` fails half-way: say which and who holds it.
for port in 9092 6379 9464 9465 29094 6381 9466 9467 9468 9469 9470 9090 3000 29093 6380; do
  if ss -Hltn "sport = :$port" | grep -q .; then
    fail "port $port, which a compose file publishes, is in use: $(ss -Hltnp "sport = :$port" | head -1)"
  fi
done

up() {
  # up -d --wait: returns once every started service is healthy (or running, without a
  # healthcheck), fails when one is not within the timeout. $2 is the compose function.
  local what="$1" with="$2"
  shift 2
  if ! "$with" "$@" up -d --wait --wait-timeout 600 >"$run_log/up-$what.log" 2>&1; then
    cat "$run_log/up-$what.log" >&2
    taken="$(grep -o 'listen tcp4 [0-9.]*:[0-9]*: bind: address already in use' "$run_log/up-$what.log" |
      head -1 | sed 's/.*:\([0-9]*\): bind.*/\1/' || true)"
    if [ -n "$taken" ]; then
      fail "$what: host port $taken was taken by another process while the stack started (free before it: a process of someone else's on this machine?); run again when it is free"
    fi
    "$with" --profile '*' ps --all >&2 || true
    for service in $("$with" --profile '*' ps --all --format '{{.Service}} {{.State}} {{.Health}}' |
      awk '$2 != "running" || ($3 != "" && $3 != "healthy") { print $1 }'); do
      printf '\n--- last lines of %s\n' "$service" >&2
      "$with" --profile '*' logs --no-color --tail 30 "$service" >&2 || true
    done
    fail "$what ($with $* up): not every service became healthy"
  fi
  "$with" "$@" ps --format '  {{.Service}}: {{.Status}}'
}

published_on_loopback_only() {
  # every port a running container of the project publishes is bound to 127.0.0.1
  local ports wide
  ports="$(docker ps --filter "label=com.docker.compose.project=$1" --format '{{.Names}} {{.Ports}}')"
  wide="$(printf '%s\n' "$ports" | grep -E '(0\.0\.0\.0|\[::\]|::):[0-9]+->' || true)"
  [ -z "$wide" ] || fail "ports published beyond this machine: $wide"
  [ -n "$(printf '%s\n' "$ports" | grep -F '127.0.0.1:' || true)" ] || fail "$1 publishes no port"
  say "every published port of $1 is bound to 127.0.0.1"
}

clients() {
  .venv/bin/python scripts/compose_clients.py "$1" 2>&1 | tee "$run_log/clients-$1.log"
  [ "${PIPESTATUS[0]}" -eq 0 ] || fail "the host-side clients' $1 checks (above)"
}

# --- 6. default ----------------------------------------------------------------------
phase "default"
up default compose
published_on_loopback_only "$project"
clients default

# --- 7. two-sites ----------------------------------------------------------------------
phase "two-sites"
up two-sites compose_two_sites
published_on_loopback_only "$project"
clients two-sites

# --- 8. observability -------------------------------------------------------------------
phase "observability"
observability_services=(prometheus)
observability_options=()
if [ "$grafana_runs" = true ]; then
  observability_services+=(grafana)
  observability_options+=(--grafana)
fi
compose_two_sites --profile observability up -d --wait --wait-timeout 600 \
  "${observability_services[@]}" >"$run_log/up-observability.log" 2>&1 ||
  { cat "$run_log/up-observability.log" >&2; fail "docker compose --profile observability up ${observability_services[*]}"; }
compose_two_sites --profile observability ps --format '  {{.Service}}: {{.Status}}' "${observability_services[@]}"
published_on_loopback_only "$project"
.venv/bin/python scripts/compose_observability.py "${observability_options[@]}" 2>&1 |
  tee "$run_log/observability.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || fail "the observability checks (above)"
# An alert rule on a real failure: one worker stopped makes RegionbusWorkerDown active.
# Site A's receiver: no later phase uses it, and it is started again before they run.
compose_two_sites stop gateway-receiver-a >"$run_log/stop-receiver.log" 2>&1 ||
  { cat "$run_log/stop-receiver.log" >&2; fail "docker compose stop gateway-receiver-a"; }
.venv/bin/python scripts/compose_observability.py --stopped gateway-receiver-a 2>&1 |
  tee -a "$run_log/observability.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || fail "the alert on a stopped worker (above)"
compose_two_sites up -d --wait --wait-timeout 600 gateway-receiver-a >"$run_log/restart-receiver.log" 2>&1 ||
  { cat "$run_log/restart-receiver.log" >&2; fail "gateway-receiver-a did not come back"; }

# --- 9. demo -------------------------------------------------------------------------------
phase "demo"
# the replay runs beside the two sites, as `docker compose --profile demo up` would
compose_two_sites --profile demo up -d flights-demo >"$run_log/up-demo.log" 2>&1 ||
  { cat "$run_log/up-demo.log" >&2; fail "docker compose --profile demo up"; }
demo_container="$(compose_two_sites --profile demo ps --all --quiet flights-demo)"
[ -n "$demo_container" ] || fail "no flights-demo container"
say "flights replay of $demo_days day(s) running in ${demo_container:0:12}; waiting for it to end"
# A week replays in well under a minute on a quiet machine; the deadline allows a loaded
# one, and the year, many times that.
demo_deadline=$((900 + 60 * demo_days))
demo_status="$(timeout "$demo_deadline" docker wait "$demo_container")" ||
  fail "the flights demo did not end within $demo_deadline s (log: docker compose -p $project logs flights-demo)"
compose_two_sites --profile demo logs --no-color flights-demo >"$run_log/demo.log" 2>&1
grep -E '^(flights-demo-[0-9]+ +\| )?(OK|MISMATCH|refused) ' "$run_log/demo.log" |
  sed -E 's/^flights-demo-[0-9]+ +\| /  /' || true
if [ "$demo_status" != "0" ]; then
  tail -40 "$run_log/demo.log" >&2
  fail "the flights demo exited with status $demo_status (log $run_log/demo.log)"
fi
checks="$(grep -cE '\| OK ' "$run_log/demo.log" || true)"
if [ "$checks" -eq 0 ] || grep -qE '\| (MISMATCH|refused) ' "$run_log/demo.log"; then
  fail "the flights demo exited 0 but its checks are not all OK ($checks OK; log $run_log/demo.log)"
fi
say "flights demo: exit status 0, $checks checks OK"

# --- 10. secured ----------------------------------------------------------------------
phase "secured"
# Without its passwords (none in the environment, no .env read) Compose refuses the file
# before anything starts, naming each variable it misses.
refusal="$(env -u KAFKA_ADMIN_PASSWORD -u KAFKA_SERVER_PASSWORD -u REDIS_PASSWORD \
  docker compose --env-file /dev/null -p "$project-secured" -f docker-compose.secured.yml \
  up -d 2>&1)" && fail "docker-compose.secured.yml started without its passwords"
printf '%s\n' "$refusal" | grep -q "required variable .*PASSWORD is missing a value" ||
  fail "docker-compose.secured.yml without passwords failed, but not for them: $refusal"
say "without its passwords the secured stack is refused: $(printf '%s' "$refusal" | tail -1)"
[ -z "$(compose_secured ps --all --quiet)" ] || fail "a secured container was created anyway"
up secured compose_secured
published_on_loopback_only "$project-secured"
acls_status="$(docker inspect --format '{{.State.ExitCode}}' "$(compose_secured ps --all --quiet kafka-acls)")"
[ "$acls_status" = "0" ] || fail "kafka-acls exited with status $acls_status"
say "kafka-acls created the server's and 3 clients' SCRAM users and ACLs, and exited 0"
clients secured

end_phase
