"""The Kafka ACLs each kind of regionbus process needs: the one statement of them.

On a Kafka that enforces ACLs (``StandardAuthorizer`` with
``allow.everyone.if.no.acl.found=false``, the ``secured`` compose profile) each process
logs in as its own Kafka user, which holds exactly one of these sets:

- :func:`server_acls`: cache servers, everything of the namespace (its topics and groups
  by prefix) and the cluster's ``Describe`` and ``IdempotentWrite`` (the servers'
  idempotent producer).
- :func:`client_acls`: one client application (a Kafka user) per client id: write
  ``{ns}.ops`` and ``{ns}.control``, create/read/describe its user's shared
  ``{ns}.queues.<user>`` and ``{ns}.replies.<user>``, and its consumer groups
  ``{ns}.client.<id>`` and ``{ns}.client-reply.<id>``, each granted by its literal name.
  So a client can read the queue records and replies of the clients of its own Kafka user
  only (its partition holds theirs too), write into no queue or reply topic, and read,
  commit or delete no other client's groups; what it may do to regions is then checked by
  the servers (signed requests and permissions, docs/security.md).
- :func:`gateway_sender_acls` (on the sender's own Kafka) and
  :func:`gateway_sender_remote_acls` (on the remote site's Kafka): read its queue
  ``{ns}.gw.<sender>``; create and write the remote receiver's inbound topic and create and
  read its own ack topic there.
- :func:`gateway_receiver_acls`: read its inbound topic, write acks to this site's
  ``{ns}.gwack.*`` topics, and a client's set for the client id it applies batches as.
- :func:`bulk_load_acls`: a Spark bulk load writes ``{ns}.ops`` and reads its replies in
  its user's ``{ns}.replies.<user>``, for load ids with one prefix.

Gateway senders and receivers also write ``{ns}.dead-letter``. (Async event queue workers
have no set here yet.)

``scripts/kafka-acls.sh`` (the compose profile's one-shot, which has only Kafka's own CLI)
grants the server and client sets written out in shell;
``tests/unit/test_kafka_acls_script.py`` checks it against these functions, and an
integration test runs it with Kafka's own tools. ``regionbus kafka-acls`` prints or grants
any set.

A client's topics and groups are granted by literal name, never by prefix: client ids may
hold dots, so a prefix ``{ns}.client.desk.`` would also name the groups of client
``desk.2``. The names are built so that no client's name is another's
(`regionbus.schemas.naming.Topics.client_reply_group`). Servers and gateways get prefixes of
what is theirs alone; a namespace's prefix ends with its dot, so namespace ``a`` does not
reach ``ab.*`` (namespaces nested by dots, ``geode`` and ``geode.site1``, do overlap: avoid
them). A Spark bulk load's prefix covers the load ids of one principal by design.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from confluent_kafka import KafkaException
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)
from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_exponential

from regionbus.schemas.errors import TransportError
from regionbus.schemas.naming import BULK_LOAD_ID_PREFIX, Topics, check_name, receiver_client_id
from regionbus.schemas.transport import kafka_error

ResourceKind = Literal["topic", "group", "cluster"]
PatternKind = Literal["literal", "prefixed"]
Operation = Literal["All", "Read", "Write", "Create", "Delete", "Describe", "IdempotentWrite"]

CLUSTER_RESOURCE: Final = "kafka-cluster"
"""The name of Kafka's one cluster resource."""

_RESOURCE_TYPES: Final[dict[ResourceKind, ResourceType]] = {
    "topic": ResourceType.TOPIC,
    "group": ResourceType.GROUP,
    "cluster": ResourceType.BROKER,
}
_PATTERN_TYPES: Final[dict[PatternKind, ResourcePatternType]] = {
    "literal": ResourcePatternType.LITERAL,
    "prefixed": ResourcePatternType.PREFIXED,
}
_OPERATIONS: Final[dict[Operation, AclOperation]] = {
    "All": AclOperation.ALL,
    "Read": AclOperation.READ,
    "Write": AclOperation.WRITE,
    "Create": AclOperation.CREATE,
    "Delete": AclOperation.DELETE,
    "Describe": AclOperation.DESCRIBE,
    "IdempotentWrite": AclOperation.IDEMPOTENT_WRITE,
}
_VISIBLE_TIMEOUT_S: Final = 30.0


@dataclass(frozen=True, order=True)
class KafkaAcl:
    """One ALLOW ACL of a user, from any host.

    Attributes:
        resource_type: ``"topic"``, ``"group"`` or ``"cluster"``.
        resource_name: The topic or group name, or the prefix of names; for the cluster
            :data:`CLUSTER_RESOURCE`.
        pattern_type: ``"literal"`` (that one name) or ``"prefixed"`` (every name starting
            with it).
        operation: Kafka's operation name, as ``kafka-acls.sh --operation`` takes it.
    """

    resource_type: ResourceKind
    resource_name: str
    pattern_type: PatternKind
    operation: Operation

    def __str__(self) -> str:
        where = "" if self.resource_type == "cluster" else f" {self.resource_name}"
        prefix = "*" if self.pattern_type == "prefixed" else ""
        return f"{self.operation} on {self.resource_type}{where}{prefix}"

    def binding(self, user: str) -> AclBinding:
        """This ACL for Kafka user ``user`` (principal ``User:<user>``), as the admin API
        takes it."""
        return AclBinding(
            _RESOURCE_TYPES[self.resource_type],
            self.resource_name,
            _PATTERN_TYPES[self.pattern_type],
            f"User:{user}",
            "*",
            _OPERATIONS[self.operation],
            AclPermissionType.ALLOW,
        )


def _acls(
    resource_type: ResourceKind,
    names: Iterable[str],
    operations: Sequence[Operation],
    pattern_type: PatternKind = "literal",
) -> list[KafkaAcl]:
    return [
        KafkaAcl(resource_type, name, pattern_type, operation)
        for name in names
        for operation in operations
    ]


def server_acls(namespace: str) -> list[KafkaAcl]:
    """The cache servers' ACLs: every topic and group of the namespace, and the cluster's
    ``Describe`` and ``IdempotentWrite``.

    Args:
        namespace: The site namespace.
    """
    prefix = f"{Topics(namespace).namespace}."
    return [
        *_acls("topic", [prefix], ["All"], "prefixed"),
        *_acls("group", [prefix], ["All"], "prefixed"),
        *_acls("cluster", [CLUSTER_RESOURCE], ["Describe", "IdempotentWrite"]),
    ]


def client_acls(namespace: str, client_id: str, user: str) -> list[KafkaAcl]:
    """A client application's ACLs for one client id (a durable client's id is its
    client id), logged in as Kafka user ``user``.

    Args:
        namespace: The site namespace.
        client_id: The client id the application connects with (``ClientSettings``
            ``client_id`` or ``durable_client_id``); a generated one has no ACLs.
        user: Its Kafka user, which names the shared queue and reply topics it reads
            (``ClientSettings.kafka_principal``, by default the SASL user name).

    Raises:
        ConfigurationError: ``client_id`` or ``user`` is not legal in a topic name.
    """
    topics = Topics(namespace)
    check_name("client id", client_id)
    return [
        *_acls("topic", [topics.ops, topics.control], ["Write", "Describe"]),
        *_acls(
            "topic",
            [topics.client_queues(user), topics.client_replies(user)],
            ["Create", "Read", "Describe"],
        ),
        *_acls(
            "group",
            [topics.client_group(client_id), topics.client_reply_group(client_id)],
            ["Read", "Describe", "Delete"],
        ),
    ]


def gateway_sender_acls(namespace: str, sender_id: str) -> list[KafkaAcl]:
    """A gateway sender's ACLs on its own site's Kafka: read its queue topic from its
    group, delete the records the remote site acknowledged (Kafka's DeleteRecords needs
    the topic's Delete), and dead-letter what it cannot decode.

    Args:
        namespace: The sender's site namespace.
        sender_id: The sender's id (its queue is ``{ns}.gw.<sender_id>``).
    """
    topics = Topics(namespace)
    return [
        *_acls("topic", [topics.gateway(sender_id)], ["Read", "Describe", "Delete"]),
        *_acls("group", [Topics(namespace).sender_group(sender_id)], ["Read", "Describe"]),
        *_acls("topic", [topics.dead_letter], ["Write", "Describe"]),
    ]


def gateway_sender_remote_acls(
    namespace: str,
    sender_id: str,
    *,
    site_id: int,
    remote_namespace: str,
    remote_receiver_id: str,
) -> list[KafkaAcl]:
    """A gateway sender's ACLs on the remote site's Kafka: create and write the remote
    receiver's inbound topic, create and read its own ack topic there from its ack group.

    Args:
        namespace: The sender's own site namespace (its ack group is named by it).
        sender_id: The sender's id.
        site_id: The sender's ``distributed_system_id`` (its ack topic is named by it).
        remote_namespace: The remote site's namespace.
        remote_receiver_id: The remote receiver's id.
    """
    return [
        *_acls(
            "topic",
            [Topics(remote_namespace).gateway_inbound(remote_receiver_id)],
            ["Create", "Write", "Describe"],
        ),
        *_acls(
            "topic",
            [Topics(remote_namespace).gateway_ack(site_id, sender_id)],
            ["Create", "Read", "Describe"],
        ),
        *_acls("group", [Topics(namespace).sender_ack_group(sender_id)], ["Read", "Describe"]),
    ]


def gateway_receiver_acls(namespace: str, receiver_id: str, user: str) -> list[KafkaAcl]:
    """A gateway receiver's ACLs: create and read its inbound topic from its group, write
    acks to the site's ack topics (one per remote sender, which creates it), dead-letter
    undecodable batches, and apply batches as the client ``gw-receiver-<id>``.

    Args:
        namespace: The receiver's site namespace.
        receiver_id: The receiver's id.
        user: Its Kafka user (its replies are in ``{ns}.replies.<user>``).
    """
    topics = Topics(namespace)
    return [
        *_acls(
            "topic",
            [Topics(namespace).gateway_inbound(receiver_id)],
            ["Create", "Read", "Describe"],
        ),
        *_acls("group", [Topics(namespace).receiver_group(receiver_id)], ["Read", "Describe"]),
        *_acls("topic", [topics.gateway_ack_prefix], ["Write", "Describe"], "prefixed"),
        *_acls("topic", [topics.dead_letter], ["Write", "Describe"]),
        *client_acls(namespace, receiver_client_id(receiver_id), user),
    ]


def bulk_load_acls(
    namespace: str, user: str, load_id_prefix: str = BULK_LOAD_ID_PREFIX
) -> list[KafkaAcl]:
    """A Spark bulk load's ACLs: write ``{ns}.ops``; create and read its user's shared
    reply topic (each load reads the replies keyed by its load id), with the reply
    groups of load ids starting with ``load_id_prefix``.

    Args:
        namespace: The site namespace.
        user: The load's Kafka user (its replies are in ``{ns}.replies.<user>``).
        load_id_prefix: How the load ids begin (`regionbus.spark.bulkload.bulk_load` ``load_id``;
            default `regionbus.schemas.naming.BULK_LOAD_ID_PREFIX`, what a load without one gets).
    """
    topics = Topics(namespace)
    groups = topics.client_reply_group(check_name("load id prefix", load_id_prefix))
    return [
        *_acls("topic", [topics.ops], ["Write", "Describe"]),
        *_acls("topic", [topics.client_replies(user)], ["Create", "Read", "Describe"]),
        *_acls("group", [groups], ["Read", "Describe"], "prefixed"),
    ]


def _user_filter(user: str) -> AclBindingFilter:
    # None matches any name and host (confluent-kafka's stubs say str).
    return AclBindingFilter(
        ResourceType.ANY,
        None,  # type: ignore[arg-type]
        ResourcePatternType.ANY,
        f"User:{user}",
        None,  # type: ignore[arg-type]
        AclOperation.ANY,
        AclPermissionType.ANY,
    )


def granted(admin: AdminClient, user: str, timeout_s: float = _VISIBLE_TIMEOUT_S) -> set[KafkaAcl]:
    """The ALLOW ACLs Kafka holds for a user (as the broker answering sees them).

    Args:
        admin: An admin client logged in as a user who may describe ACLs (a super user,
            or one with ``Describe`` on the cluster).
        user: The Kafka user.
        timeout_s: Longest wait for the answer, in seconds.

    Raises:
        KafkaAuthorizationError: the admin's user may not describe ACLs.
        TransportError: Kafka did not answer, or does not enforce ACLs.
    """
    kinds = {v: k for k, v in _RESOURCE_TYPES.items()}
    patterns = {v: k for k, v in _PATTERN_TYPES.items()}
    operations = {v: k for k, v in _OPERATIONS.items()}
    try:
        bindings = admin.describe_acls(_user_filter(user), request_timeout=timeout_s).result(
            timeout=timeout_s
        )
    except KafkaException as exc:
        raise kafka_error(exc, f"describing the ACLs of {user}", "cluster") from exc
    return {
        KafkaAcl(
            kinds[b.restype],
            b.name,
            patterns[b.resource_pattern_type],
            operations[b.operation],
        )
        for b in bindings
        if b.permission_type == AclPermissionType.ALLOW
        and b.restype in kinds
        and b.resource_pattern_type in patterns
        and b.operation in operations
    }


def grant(
    admin: AdminClient, user: str, acls: Iterable[KafkaAcl], timeout_s: float = _VISIBLE_TIMEOUT_S
) -> None:
    """Create ACLs for a user, and wait until the broker enforces them.

    Kafka applies ACLs from its metadata log a moment after it acknowledged them; this
    returns once `granted` lists every one, so a client started next is allowed.

    Args:
        admin: An admin client of a user who may alter ACLs (a super user).
        user: The Kafka user (principal ``User:<user>``).
        acls: What to grant (e.g. :func:`client_acls`); granting an ACL again is harmless.
        timeout_s: Longest wait, in seconds, for the creation and for the broker to list
            them.

    Raises:
        KafkaAuthorizationError: the admin's user may not alter ACLs.
        TransportError: Kafka did not answer, or the ACLs were not listed in time.
    """
    wanted = set(acls)
    if not wanted:
        return
    futures = admin.create_acls(
        [acl.binding(user) for acl in sorted(wanted)], request_timeout=timeout_s
    )
    for future in futures.values():
        try:
            future.result(timeout=timeout_s)
        except KafkaException as exc:
            raise kafka_error(exc, f"granting ACLs to {user}", "cluster") from exc
    _wait_until(admin, user, lambda held: wanted <= held, timeout_s, f"ACLs of {user} granted")


def revoke(
    admin: AdminClient, user: str, acls: Iterable[KafkaAcl], timeout_s: float = _VISIBLE_TIMEOUT_S
) -> None:
    """Delete ACLs of a user, and wait until the broker no longer lists them.

    Args:
        admin: An admin client of a user who may alter ACLs.
        user: The Kafka user.
        acls: What to remove; ACLs the user does not hold are ignored.
        timeout_s: Longest wait, in seconds.

    Raises:
        KafkaAuthorizationError: the admin's user may not alter ACLs.
        TransportError: Kafka did not answer, or the ACLs were still listed in time.
    """
    unwanted = set(acls)
    if not unwanted:
        return
    filters = [
        AclBindingFilter(
            binding.restype,
            binding.name,
            binding.resource_pattern_type,
            binding.principal,
            binding.host,
            binding.operation,
            binding.permission_type,
        )
        for binding in (acl.binding(user) for acl in sorted(unwanted))
    ]
    for future in admin.delete_acls(filters, request_timeout=timeout_s).values():
        try:
            future.result(timeout=timeout_s)
        except KafkaException as exc:
            raise kafka_error(exc, f"revoking ACLs of {user}", "cluster") from exc
    _wait_until(
        admin, user, lambda held: not (unwanted & held), timeout_s, f"ACLs of {user} revoked"
    )


class _NotYetError(Exception):
    pass


def _wait_until(
    admin: AdminClient,
    user: str,
    done: Callable[[set[KafkaAcl]], bool],
    timeout_s: float,
    what: str,
) -> None:
    try:
        for attempt in Retrying(
            stop=stop_after_delay(timeout_s),
            wait=wait_exponential(multiplier=0.02, max=0.5),
            retry=retry_if_exception_type(_NotYetError),
            reraise=True,
        ):
            with attempt:
                if not done(granted(admin, user, timeout_s)):
                    raise _NotYetError
    except _NotYetError:
        raise TransportError(f"{what}: not seen by the broker within {timeout_s} s") from None


__all__ = [
    "CLUSTER_RESOURCE",
    "KafkaAcl",
    "bulk_load_acls",
    "client_acls",
    "gateway_receiver_acls",
    "gateway_sender_acls",
    "gateway_sender_remote_acls",
    "grant",
    "granted",
    "revoke",
    "server_acls",
]
