"""The safety rules of the compose files, checked without a Docker engine (a part of
``scripts/check_compose.py``; ``scripts/compose-check.sh`` checks the same on a running
stack).

- **Loopback.** Every published port binds to ``${PUBLISH_ADDRESS:-127.0.0.1}``: this
  machine only, unless the variable says otherwise.
- **One site, no gateway, by default.** ``docker-compose.yml`` queues nothing for a
  gateway; the gateway senders come with ``docker-compose.two-sites.yml``, whose queues
  have a finite retention, the one its comment states.
- **Passwords required.** Every password variable of ``docker-compose.secured.yml`` is
  ``${VAR:?...}``, so Compose refuses to start the stack without it; no other file
  takes a password.
- **Pinned images.** Every third-party image of the compose files and the Dockerfile
  names an exact version (``redis:7.4.2``, not ``redis:7`` or ``latest``).
- **``.env.example``** names every variable the compose files read, and nothing else.
- **The quickstart's defaults.** A client with no address (``127.0.0.1:9092``,
  ``redis://127.0.0.1:6379/0``, namespace ``regionbus``) reaches the default stack, whose
  servers define region ``flights``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from compose_model import (
    COMPOSE_SETS,
    interpolated,
    load,
    published_ports,
    variables,
)
from dotenv import dotenv_values

from regionbus.clients.settings import ClientSettings
from regionbus.runtime.settings import RedisConnectionSettings
from regionbus.schemas.settings import KafkaConnectionSettings

PUBLISH_VARIABLE = "${PUBLISH_ADDRESS:-127.0.0.1}"
"""What every published port's host address must be."""

_PINNED = re.compile(r"^[\w./-]+:v?\d+\.\d+\.\d+(?:[-.][\w.-]+)?$")
"""An image reference with an exact version tag: ``name:X.Y.Z`` (a suffix such as
``-slim-bookworm`` allowed; ``vX.Y.Z`` as Prometheus tags its images)."""

_DAY_MS = 24 * 3_600_000
_GATEWAY_VARIABLES = ("REGIONBUS_GATEWAY_SENDERS", "REGIONBUS_REGION_GATEWAY_SENDERS")


def _services(compose: Mapping[str, Any]) -> Mapping[str, Mapping[str, Any]]:
    services = compose.get("services") or {}
    return services if isinstance(services, Mapping) else {}


def _environment(service: Mapping[str, Any]) -> dict[str, str]:
    environment = service.get("environment") or {}
    if isinstance(environment, list):
        return dict(str(item).partition("=")[::2] for item in environment)
    return {str(k): "" if v is None else str(v) for k, v in environment.items()}


def _built_images(services: Mapping[str, Mapping[str, Any]]) -> set[str]:
    return {str(s["image"]) for s in services.values() if "build" in s and "image" in s}


def _check_loopback(name: str, raw: Mapping[str, Any], compose: Mapping[str, Any]) -> Iterator[str]:
    for service_name, service in _services(raw).items():
        for entry in service.get("ports", []):
            if not str(entry).startswith(f"{PUBLISH_VARIABLE}:"):
                yield (
                    f"[{name}] {service_name}: port {entry!r} is not published on "
                    f"{PUBLISH_VARIABLE} (this machine only, unless the variable says otherwise)"
                )
    for service_name, service in _services(compose).items():
        for address, host_port, _ in published_ports(service):
            if address != "127.0.0.1":
                bound = address or "every interface"
                yield f"[{name}] {service_name}: port {host_port} binds to {bound}"


def _check_no_gateway(compose: Mapping[str, Any]) -> Iterator[str]:
    for service_name, service in _services(compose).items():
        environment = _environment(service)
        for variable in _GATEWAY_VARIABLES:
            if json.loads(environment.get(variable) or "{}"):
                yield (
                    f"[default] {service_name}: sets {variable}: the one-site stack queues "
                    "for no gateway"
                )
        if list(service.get("command") or [])[:1] == ["gateway"]:
            yield f"[default] {service_name}: runs a gateway worker"


def _check_bounded_gateways(compose: Mapping[str, Any], comment_text: str) -> Iterator[str]:
    senders = 0
    for service_name, service in _services(compose).items():
        specs = json.loads(_environment(service).get("REGIONBUS_GATEWAY_SENDERS") or "{}")
        for sender_id, spec in specs.items():
            senders += 1
            retention = spec.get("queue_retention_ms")
            if not isinstance(retention, int):
                yield (
                    f"[two-sites] {service_name}: gateway sender {sender_id} keeps its queue "
                    "until acknowledged: give it a queue_retention_ms"
                )
            elif retention % _DAY_MS or f"{retention // _DAY_MS} days" not in comment_text:
                yield (
                    f"[two-sites] {service_name}: gateway sender {sender_id} keeps its queue "
                    f"{retention} ms, which the file's comment does not state in days"
                )
    if not senders:
        yield "[two-sites] no cache server queues for a gateway sender"


def _check_required_passwords(root: Path) -> Iterator[str]:
    for name, files in COMPOSE_SETS.items():
        for file_name in files:
            for variable, ops in variables((root / file_name).read_text()).items():
                if "PASSWORD" not in variable:
                    continue
                if name != "secured":
                    yield f"{file_name}: takes password {variable}; only the secured stack does"
                elif ops != {":?"}:
                    yield (
                        f"{file_name}: password {variable} is used as {sorted(ops)}: it must be "
                        "${"
                        + variable
                        + ":?...} everywhere, so the stack refuses to start without it"
                    )
    secured = load([root / f for f in COMPOSE_SETS["secured"]])
    _, complaints = interpolated(secured, {})
    refused = {c.split()[1] for _, c in complaints if " is required" in c}
    if not any("PASSWORD" in v for v in refused):
        yield "docker-compose.secured.yml: interpolates without any password set"


def _image_references(root: Path) -> Iterator[tuple[str, str]]:
    for name, files in COMPOSE_SETS.items():
        services = _services(load([root / f for f in files]))
        ours = _built_images(services)
        for service_name, service in services.items():
            image = service.get("image")
            if image and image not in ours:
                yield f"[{name}] {service_name}", str(image)
    stages: set[str] = set()
    for line in (root / "Dockerfile").read_text().splitlines():
        found = re.match(r"\s*FROM\s+(?:--\S+\s+)*(\S+)(?:\s+AS\s+(\S+))?", line, re.IGNORECASE)
        if found:
            if found.group(1) not in stages:
                yield "Dockerfile", found.group(1)
            if found.group(2):
                stages.add(found.group(2))


def _check_pinned_images(root: Path) -> Iterator[str]:
    for where, image in _image_references(root):
        if not _PINNED.match(image):
            yield f"{where}: image {image} is not pinned to an exact version (name:X.Y.Z)"


def _check_env_example(root: Path) -> Iterator[str]:
    listed = set(dotenv_values(root / ".env.example"))
    used = {
        variable
        for files in COMPOSE_SETS.values()
        for file_name in files
        for variable in variables((root / file_name).read_text())
    }
    for variable in sorted(used - listed):
        yield f".env.example: does not name {variable}, which the compose files read"
    for variable in sorted(listed - used):
        yield f".env.example: names {variable}, which no compose file reads"


def _check_quickstart_defaults(compose: Mapping[str, Any]) -> Iterator[str]:
    services = _services(compose)
    kafka = KafkaConnectionSettings.model_fields["kafka_bootstrap_servers"].default
    redis_url = urlsplit(RedisConnectionSettings.model_fields["redis_url"].default)
    namespace = ClientSettings.model_fields["namespace"].default
    kafka_env = _environment(services.get("kafka", {}))
    listeners = dict(
        item.split("://") for item in kafka_env.get("KAFKA_LISTENERS", "").split(",") if item
    )
    advertised = dict(
        item.split("://")
        for item in kafka_env.get("KAFKA_ADVERTISED_LISTENERS", "").split(",")
        if item
    )
    external = [n for n, address in advertised.items() if address == kafka]
    if not external:
        yield f"[default] kafka advertises no listener at {kafka}, where clients look by default"
    else:
        container_port = listeners.get(external[0], ":").rsplit(":", 1)[1]
        published = {(h, c) for _, h, c in published_ports(services["kafka"])}
        if (kafka.rsplit(":", 1)[1], container_port) not in published:
            yield f"[default] kafka: {kafka} is not published to its {external[0]} listener"
    redis_ports = {h for _, h, _ in published_ports(services.get("redis", {}))}
    if str(redis_url.port) not in redis_ports:
        yield f"[default] redis is not published on port {redis_url.port}, where servers look"
    servers = [s for s in services.values() if list(s.get("command") or [])[:1] == ["serve"]]
    if not servers:
        yield "[default] no cache server"
    for server in servers:
        if _environment(server).get("REGIONBUS_NAMESPACE", namespace) != namespace:
            yield f"[default] a cache server's namespace is not the clients' default {namespace}"
        if "flights" not in list(server.get("command") or []):
            yield "[default] a cache server does not define region flights (the quickstart's)"


def check_safety(root: Path) -> list[str]:
    """Every safety rule of the module docstring, on the files under ``root``.

    Returns:
        One message per problem; empty when every rule holds.
    """
    problems: list[str] = []
    for name, files in COMPOSE_SETS.items():
        paths = [root / f for f in files]
        raw = load(paths)
        required = {
            variable: "stand-in"
            for path in paths
            for variable, ops in variables(path.read_text()).items()
            if ":?" in ops
        }
        compose, _ = interpolated(raw, required)
        problems.extend(_check_loopback(name, raw, compose))
        if name == "default":
            problems.extend(_check_no_gateway(compose))
            problems.extend(_check_quickstart_defaults(compose))
        if name == "two-sites":
            problems.extend(_check_bounded_gateways(compose, paths[-1].read_text()))
    problems.extend(_check_required_passwords(root))
    problems.extend(_check_pinned_images(root))
    problems.extend(_check_env_example(root))
    return problems


__all__ = ["PUBLISH_VARIABLE", "check_safety"]
