"""``regionbus user add/remove/list``: principals, their secrets and permissions.

The commands change Redis directly, so in the secured profile the Redis ACL user is what
lets an operator in. On top of that, once a principal with ``CLUSTER:MANAGE`` exists, these
commands (and ``regionbus status``) ask for such a principal's credentials
(``REGIONBUS_SECURITY_PRINCIPAL`` / ``REGIONBUS_SECURITY_SECRET``), checked against its
derived key: Geode's ``CLUSTER:MANAGE`` for user management. The check is the caller's own
principal and secret, whatever the caller's settings say: ``REGIONBUS_SECURITY_ENABLED``
is the servers' switch, and a caller who leaves it off must not skip the check. The first
administrator is added with Redis access alone.
"""

from __future__ import annotations

import hmac
import logging
import os
import secrets
from typing import Any

import click

from regionbus.broker.config import ServerSettings
from regionbus.broker.permissions import CLUSTER_MANAGE, ResourcePermission, is_granted
from regionbus.broker.principals import PrincipalStore
from regionbus.runtime.redis_connect import connect_redis
from regionbus.schemas.errors import RegionBusError
from regionbus.schemas.signing import derive_key

audit = logging.getLogger("regionbus.audit")

PRINCIPAL_ENV = "REGIONBUS_SECURITY_PRINCIPAL"
SECRET_ENV = "REGIONBUS_SECURITY_SECRET"


def principal_store(settings: ServerSettings) -> PrincipalStore:
    """The principal store of the settings' namespace, over a secured Redis connection.

    Raises:
        ConfigurationError: the Redis TLS settings are inconsistent.
    """
    return PrincipalStore(connect_redis(settings), settings.namespace, cache_ttl_ms=0)


def require_cluster_manage(settings: ServerSettings, store: PrincipalStore) -> str | None:
    """Check the caller's credentials for ``CLUSTER:MANAGE`` once an administrator exists.

    Args:
        settings: The CLI's settings (``namespace``; ``security_enabled`` is not looked at).
        store: The principal store.

    Returns:
        The caller's principal, or None when no check applies (no principal holds
        ``CLUSTER:MANAGE`` yet: the first administrator is being added).

    Raises:
        click.ClickException: credentials missing or wrong, or the principal lacks
            ``CLUSTER:MANAGE``.
        TransportError: Redis failed.
    """
    admins = [p for p in map(store.get, store.names()) if p is not None]
    if not any(is_granted(p.permissions, CLUSTER_MANAGE) for p in admins):
        return None
    name, secret = os.environ.get(PRINCIPAL_ENV), os.environ.get(SECRET_ENV)
    if not name or not secret:
        raise click.ClickException(
            f"CLUSTER:MANAGE needed: set {PRINCIPAL_ENV} and {SECRET_ENV} of an administrator"
        )
    principal = store.get(name)
    if principal is None or not hmac.compare_digest(
        principal.key, derive_key(secret, settings.namespace, name)
    ):
        audit.warning("REFUSED principal=%s operation=cli reason=bad credentials", name)
        raise click.ClickException(f"bad credentials for principal {name!r}")
    if not is_granted(principal.permissions, CLUSTER_MANAGE):
        audit.warning("REFUSED principal=%s operation=cli reason=lacks CLUSTER:MANAGE", name)
        raise click.ClickException(f"principal {name!r} lacks CLUSTER:MANAGE")
    return name


def _settings(options: dict[str, Any]) -> ServerSettings:
    given = {k: v for k, v in options.items() if v is not None}
    try:
        return ServerSettings.load(**given)
    except RegionBusError as exc:
        raise click.UsageError(str(exc)) from exc


_common = [
    click.option("--namespace", help="Site namespace [env REGIONBUS_NAMESPACE]."),
    click.option("--redis", "redis_url", help="Redis URL [env REGIONBUS_REDIS_URL]."),
]


def _options(func: Any) -> Any:
    for option in reversed(_common):
        func = option(func)
    return func


@click.group("user")
def user() -> None:
    """Principals that may sign requests, and their permissions (CLUSTER:MANAGE)."""


@user.command("add")
@_options
@click.argument("name")
@click.option(
    "--permission",
    "permissions",
    multiple=True,
    help="RESOURCE:OPERATION[:REGION[:KEY]], e.g. DATA:WRITE:flights (repeatable).",
)
@click.option(
    "--secret-env",
    help="Take the secret from this environment variable; else generate one and print it.",
)
def user_add(
    name: str, permissions: tuple[str, ...], secret_env: str | None, **options: Any
) -> None:
    """Add principal NAME (or replace its secret and permissions)."""
    settings = _settings(options)
    try:
        granted = [ResourcePermission.parse(p) for p in permissions]
        store = principal_store(settings)
        caller = require_cluster_manage(settings, store)
        if secret_env:
            secret = os.environ.get(secret_env, "")
            if not secret:
                raise click.UsageError(f"environment variable {secret_env} is empty or unset")
        else:
            secret = secrets.token_urlsafe(32)
        store.add(name, secret, granted)
    except RegionBusError as exc:
        raise click.ClickException(str(exc)) from exc
    audit.info(
        "USER ADD principal=%s permissions=%s by=%s",
        name,
        ",".join(map(str, granted)),
        caller or "-",
    )
    click.echo(f"principal {name}: {', '.join(map(str, granted)) or 'no permissions'}")
    if not secret_env:
        click.echo(f"secret (shown once; give it to the client as {SECRET_ENV}): {secret}")


@user.command("remove")
@_options
@click.argument("name")
def user_remove(name: str, **options: Any) -> None:
    """Remove principal NAME; servers refuse it within principal_cache_ttl_ms."""
    settings = _settings(options)
    try:
        store = principal_store(settings)
        caller = require_cluster_manage(settings, store)
        removed = store.remove(name)
    except RegionBusError as exc:
        raise click.ClickException(str(exc)) from exc
    if not removed:
        raise click.ClickException(f"no principal {name!r}")
    audit.info("USER REMOVE principal=%s by=%s", name, caller or "-")
    click.echo(f"principal {name} removed")


@user.command("list")
@_options
def user_list(**options: Any) -> None:
    """List principals and their permissions (never secrets or keys)."""
    settings = _settings(options)
    try:
        store = principal_store(settings)
        require_cluster_manage(settings, store)
        for name in store.names():
            principal = store.get(name)
            if principal is not None:
                click.echo(f"{name}\t{' '.join(map(str, principal.permissions)) or '-'}")
    except RegionBusError as exc:
        raise click.ClickException(str(exc)) from exc


__all__ = ["principal_store", "require_cluster_manage", "user"]
