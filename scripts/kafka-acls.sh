#!/usr/bin/env bash
# Create the SCRAM users and per-client topic ACLs of a regionbus namespace on a Kafka that
# enforces ACLs (the `secured` compose profile, or any SASL/SCRAM cluster).
#
#   scripts/kafka-acls.sh            # values from the environment, see below
#
# Environment:
#   KAFKA_BOOTSTRAP          broker address (default kafka-secured:9092)
#   KAFKA_BIN                folder of the Kafka CLI tools (default /opt/kafka/bin)
#   KAFKA_ADMIN_PASSWORD     SCRAM password of the super user `admin`
#   REGIONBUS_NAMESPACE      namespace (default regionbus)
#   KAFKA_SERVER_USER / KAFKA_SERVER_PASSWORD   the cache servers' Kafka user
#   KAFKA_CLIENTS            space-separated `user:password:client_id` triples, one per
#                            client application
#
# Servers get every topic and group of the namespace. A client gets only what it needs:
# write {ns}.ops and {ns}.control, create/read/describe/delete its own {ns}.queue.<id> and
# {ns}.reply.<id>, and its consumer groups {ns}.client.<id> and {ns}.client-reply.<id>, each
# by its literal name (client ids may hold dots: a prefix {ns}.client.desk. would reach the
# groups of client desk.2). So one client can neither read another's queue or replies nor
# write into them, nor read, commit or delete another's groups, at the Kafka level; what it
# may do to regions is then checked by the servers (signed requests and permissions,
# README "Security").
#
# These are the sets of broker/kafka_acls.py (server_acls, client_acls) written out for a
# container that has only Kafka's CLI; tests/unit/test_kafka_acls_script.py checks that the
# two agree. `regionbus kafka-acls` prints or grants those and the other sets (gateway
# senders and receivers, Spark bulk loads).
set -euo pipefail

bootstrap="${KAFKA_BOOTSTRAP:-kafka-secured:9092}"
bin="${KAFKA_BIN:-/opt/kafka/bin}"
ns="${REGIONBUS_NAMESPACE:-regionbus}"
: "${KAFKA_ADMIN_PASSWORD:?set KAFKA_ADMIN_PASSWORD}"
: "${KAFKA_SERVER_USER:?set KAFKA_SERVER_USER}"
: "${KAFKA_SERVER_PASSWORD:?set KAFKA_SERVER_PASSWORD}"

admin_config="$(mktemp)"
trap 'rm -f "$admin_config"' EXIT
cat >"$admin_config" <<PROPS
security.protocol=SASL_PLAINTEXT
sasl.mechanism=SCRAM-SHA-512
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" password="${KAFKA_ADMIN_PASSWORD}";
PROPS

configs() { "$bin/kafka-configs.sh" --bootstrap-server "$bootstrap" --command-config "$admin_config" "$@"; }
acls() { "$bin/kafka-acls.sh" --bootstrap-server "$bootstrap" --command-config "$admin_config" "$@"; }

scram_user() {
  configs --alter --entity-type users --entity-name "$1" \
    --add-config "SCRAM-SHA-512=[iterations=8192,password=$2]"
}

echo "kafka-acls: server user $KAFKA_SERVER_USER"
scram_user "$KAFKA_SERVER_USER" "$KAFKA_SERVER_PASSWORD"
acls --add --allow-principal "User:$KAFKA_SERVER_USER" --operation All \
  --topic "$ns." --resource-pattern-type prefixed
acls --add --allow-principal "User:$KAFKA_SERVER_USER" --operation All \
  --group "$ns." --resource-pattern-type prefixed
acls --add --allow-principal "User:$KAFKA_SERVER_USER" --operation Describe --cluster
acls --add --allow-principal "User:$KAFKA_SERVER_USER" --operation IdempotentWrite --cluster

for triple in ${KAFKA_CLIENTS:-}; do
  IFS=: read -r user password client_id <<<"$triple"
  echo "kafka-acls: client user $user (client id $client_id)"
  scram_user "$user" "$password"
  acls --add --allow-principal "User:$user" --operation Write --operation Describe \
    --topic "$ns.ops" --topic "$ns.control"
  for own in "$ns.queue.$client_id" "$ns.reply.$client_id"; do
    acls --add --allow-principal "User:$user" --operation Create --operation Read \
      --operation Describe --operation Delete --topic "$own"
  done
  acls --add --allow-principal "User:$user" --operation Read --operation Describe \
    --operation Delete --group "$ns.client.$client_id" --group "$ns.client-reply.$client_id"
done
echo "kafka-acls: done"
