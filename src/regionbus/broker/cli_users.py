"""``regionbus user add/remove/list``: principals, their secrets and permissions.

The commands change Redis directly, so in the secured compose stack the Redis ACL user is what
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
import redis

from regionbus.broker.config import ServerSettings
from regionbus.broker.permissions import CLUSTER_MANAGE, ResourcePermission, is_granted
from regionbus.broker.principals import PrincipalStore
from regionbus.runtime.cli_options import setting_option
from regionbus.runtime.redis_connect import connect_redis, redis_errors, redis_options
from regionbus.schemas.masking import mask_url
from regionbus.schemas.signing import derive_key

audit = logging.getLogger("regionbus.audit")

PRINCIPAL_ENV = "REGIONBUS_SECURITY_PRINCIPAL"
SECRET_ENV = "REGIONBUS_SECURITY_SECRET"


def cli_redis(settings: ServerSettings) -> Any:
    """Redis for a command that reads or changes it once: ``connect_redis``, after a
    ``PING`` has answered, so that a Redis that is down or refuses the login fails the
    command with one line naming it instead of a traceback from the first command.

    Raises:
        TransportError: Redis did not answer the ``PING`` or refused it.
        ConfigurationError: the Redis TLS settings are inconsistent.
    """
    where = f"Redis at {mask_url(settings.redis_url)} (--redis, REGIONBUS_REDIS_URL)"
    with redis_errors(where):
        probe = redis.Redis.from_url(settings.redis_url, **redis_options(settings))
        try:
            probe.ping()
        finally:
            probe.close()
        return connect_redis(settings)


def principal_store(settings: ServerSettings) -> PrincipalStore:
    """The principal store of the settings' namespace, over a secured Redis connection.

    Raises:
        ConfigurationError: the Redis TLS settings are inconsistent.
        TransportError: Redis did not answer (:func:`cli_redis`).
    """
    return PrincipalStore(cli_redis(settings), settings.namespace, cache_ttl_ms=0)


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
    return ServerSettings.load(**given)


server_options = [
    setting_option(ServerSettings, "namespace", "--namespace"),
    setting_option(ServerSettings, "redis_url", "--redis"),
]
"""``--namespace`` and ``--redis``, which every command that reads a site's Redis takes."""


def _options(func: Any) -> Any:
    for option in reversed(server_options):
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
    granted = [ResourcePermission.parse(p) for p in permissions]
    store = principal_store(settings)
    caller = require_cluster_manage(settings, store)
    if secret_env:
        secret = os.environ.get(secret_env, "")
        if not secret:
            raise click.UsageError(f"environment variable {secret_env} is empty or unset")
    else:
        secret = secrets.token_urlsafe(32)
    with redis_errors(f"adding principal {name}"):
        store.add(name, secret, granted)
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
    store = principal_store(settings)
    caller = require_cluster_manage(settings, store)
    with redis_errors(f"removing principal {name}"):
        removed = store.remove(name)
    if not removed:
        raise click.ClickException(f"no principal {name!r}")
    audit.info("USER REMOVE principal=%s by=%s", name, caller or "-")
    click.echo(f"principal {name} removed")


@user.command("list")
@_options
def user_list(**options: Any) -> None:
    """List principals and their permissions (never secrets or keys)."""
    settings = _settings(options)
    store = principal_store(settings)
    require_cluster_manage(settings, store)
    with redis_errors("listing principals"):
        principals = [(name, store.get(name)) for name in store.names()]
    for name, principal in principals:
        if principal is not None:
            click.echo(f"{name}\t{' '.join(map(str, principal.permissions)) or '-'}")


__all__ = ["cli_redis", "principal_store", "require_cluster_manage", "server_options", "user"]
