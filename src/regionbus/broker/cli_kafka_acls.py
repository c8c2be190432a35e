"""``regionbus kafka-acls <kind>``: print, or grant on Kafka, the ACLs of one Kafka user.

The sets are `regionbus.broker.kafka_acls`'s. Granting needs a Kafka user that may alter ACLs (a
super user), given as for every command: ``REGIONBUS_KAFKA_*`` (``SASL``, TLS) or
``REGIONBUS_KAFKA_CONFIG``. The SCRAM user itself is created with Kafka's own tools
(``kafka-configs.sh --alter --entity-type users``, see ``scripts/kafka-acls.sh``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from regionbus.broker.config import ServerSettings
from regionbus.broker.kafka_acls import (
    KafkaAcl,
    bulk_load_acls,
    client_acls,
    gateway_receiver_acls,
    gateway_sender_acls,
    gateway_sender_remote_acls,
    grant,
    server_acls,
)
from regionbus.runtime.cli_options import setting_option
from regionbus.schemas.kafka_clients import kafka_admin
from regionbus.schemas.naming import BULK_LOAD_ID_PREFIX


@click.group("kafka-acls")
def kafka_acls() -> None:
    """Print or grant the Kafka ACLs of a server, client, gateway or bulk-load user."""


_COMMON_OPTIONS = [
    click.option("--user", required=True, help="The Kafka user (principal User:<user>)."),
    setting_option(ServerSettings, "namespace", "--namespace"),
    setting_option(ServerSettings, "kafka_bootstrap_servers", "--kafka"),
    click.option("--dry-run", is_flag=True, help="Print the ACLs, grant nothing."),
]


def _acl_command(name: str, help_text: str) -> Callable[[Callable[..., list[KafkaAcl]]], Any]:
    """Make ``regionbus kafka-acls <name>`` from a function of the namespace, the user and
    its own click options that returns the ACLs: the command prints them and, unless
    ``--dry-run``, grants them."""

    def decorate(make: Callable[..., list[KafkaAcl]]) -> Any:
        def run(
            user: str,
            namespace: str | None,
            kafka_bootstrap_servers: str | None,
            dry_run: bool,
            **options: Any,
        ) -> None:
            given = {"namespace": namespace, "kafka_bootstrap_servers": kafka_bootstrap_servers}
            settings = ServerSettings.load(**given)
            acls = sorted(set(make(settings.namespace, user=user, **options)))
            for acl in acls:
                click.echo(f"User:{user} {acl}")
            if dry_run:
                return
            grant(kafka_admin(settings.librdkafka()), user, acls)
            click.echo(f"granted {len(acls)} ACLs to User:{user}", err=True)

        # The kind's own options (declared on ``make``) come after the common ones.
        run.__click_params__ = list(getattr(make, "__click_params__", []))  # type: ignore[attr-defined]
        command: Any = run
        for option in reversed(_COMMON_OPTIONS):
            command = option(command)
        return kafka_acls.command(name, help=help_text)(command)

    return decorate


@_acl_command("server", "Cache servers: every topic and group of the namespace.")
def _server(namespace: str, user: str) -> list[KafkaAcl]:
    return server_acls(namespace)


@_acl_command("client", "A client application: its own topics and groups per client id.")
@click.option(
    "--client-id",
    "client_ids",
    multiple=True,
    required=True,
    help="A client id (or durable client id) it connects with (repeatable).",
)
def _client(namespace: str, user: str, client_ids: tuple[str, ...]) -> list[KafkaAcl]:
    return [acl for client_id in client_ids for acl in client_acls(namespace, client_id, user)]


@_acl_command("gateway-sender", "A gateway sender, on its own site's Kafka.")
@click.option("--sender-id", required=True, help="The sender's id.")
def _gateway_sender(namespace: str, user: str, sender_id: str) -> list[KafkaAcl]:
    return gateway_sender_acls(namespace, sender_id)


@_acl_command(
    "gateway-sender-remote",
    "A gateway sender, on the remote site's Kafka (--namespace is the sender's own).",
)
@click.option("--sender-id", required=True, help="The sender's id.")
@click.option("--site-id", type=click.IntRange(1, 255), required=True, help="The sender's site id.")
@click.option("--remote-namespace", required=True, help="The remote site's namespace.")
@click.option(
    "--remote-receiver-id", default="receiver", show_default=True, help="The remote receiver."
)
def _gateway_sender_remote(
    namespace: str,
    user: str,
    sender_id: str,
    site_id: int,
    remote_namespace: str,
    remote_receiver_id: str,
) -> list[KafkaAcl]:
    return gateway_sender_remote_acls(
        namespace,
        sender_id,
        site_id=site_id,
        remote_namespace=remote_namespace,
        remote_receiver_id=remote_receiver_id,
    )


@_acl_command("gateway-receiver", "A gateway receiver, on its own site's Kafka.")
@click.option("--receiver-id", default="receiver", show_default=True, help="The receiver's id.")
def _gateway_receiver(namespace: str, user: str, receiver_id: str) -> list[KafkaAcl]:
    return gateway_receiver_acls(namespace, receiver_id, user)


@_acl_command("bulk-load", "Spark bulk loads whose load ids start with a prefix.")
@click.option(
    "--load-id-prefix", default=BULK_LOAD_ID_PREFIX, show_default=True, help="Load id prefix."
)
def _bulk_load(namespace: str, user: str, load_id_prefix: str) -> list[KafkaAcl]:
    return bulk_load_acls(namespace, user, load_id_prefix)


__all__ = ["kafka_acls"]
