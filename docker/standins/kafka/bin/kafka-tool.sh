#!/usr/bin/env bash
# Every /opt/kafka/bin/kafka-*.sh of the stand-in links here; the name it is called by picks
# the main class, as each script of Kafka's distribution names its own.
set -euo pipefail
bin="$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")"
name="$(basename "$0" .sh)"
case "$name" in
  kafka-server-start)
    # the broker: the distribution's heap and its own log configuration
    export KAFKA_HEAP_OPTS="${KAFKA_HEAP_OPTS:--Xmx1G -Xms1G}"
    export KAFKA_LOG4J_OPTS="${KAFKA_LOG4J_OPTS:--Dlog4j2.configurationFile=$bin/../config/log4j2.yaml}"
    if [ $# -lt 1 ]; then
      echo "USAGE: $0 server.properties [--override property=value]*" >&2
      exit 1
    fi
    exec "$bin/kafka-run-class.sh" kafka.Kafka "$@" ;;
  kafka-storage) main=kafka.tools.StorageTool ;;
  kafka-broker-api-versions) main=org.apache.kafka.tools.BrokerApiVersionsCommand ;;
  kafka-configs) main=kafka.admin.ConfigCommand ;;
  kafka-acls) main=org.apache.kafka.tools.AclCommand ;;
  kafka-topics) main=org.apache.kafka.tools.TopicCommand ;;
  kafka-console-producer) main=org.apache.kafka.tools.ConsoleProducer ;;
  kafka-console-consumer) main=org.apache.kafka.tools.consumer.ConsoleConsumer ;;
  kafka-consumer-groups) main=org.apache.kafka.tools.consumer.group.ConsumerGroupCommand ;;
  kafka-metadata-quorum) main=org.apache.kafka.tools.MetadataQuorumCommand ;;
  *)
    echo "kafka stand-in: no tool named $name" >&2
    exit 2 ;;
esac
exec "$bin/kafka-run-class.sh" "$main" "$@"
