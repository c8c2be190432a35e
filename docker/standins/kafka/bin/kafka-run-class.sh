#!/usr/bin/env bash
# Runs a main class of the jars in /opt/kafka/libs with the variables Kafka's own
# kafka-run-class.sh reads: KAFKA_HEAP_OPTS, KAFKA_JVM_PERFORMANCE_OPTS, KAFKA_LOG4J_OPTS,
# KAFKA_OPTS (JAVA_HOME is not needed: Debian's java is on PATH). The defaults are the
# distribution's, so tools and broker behave as in the upstream image.
set -euo pipefail
home="$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)"
heap="${KAFKA_HEAP_OPTS:--Xmx256M}"
performance="${KAFKA_JVM_PERFORMANCE_OPTS:--server -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35 -XX:+ExplicitGCInvokesConcurrent -XX:MaxInlineLevel=15 -Djava.awt.headless=true}"
log4j="${KAFKA_LOG4J_OPTS:--Dlog4j2.configurationFile=$home/config/tools-log4j2.yaml}"
# The variables hold several options each: split them as the upstream script does.
# shellcheck disable=SC2086
exec java $heap $performance $log4j ${KAFKA_OPTS:-} -Dkafka.logs.dir="$home/logs" \
  -cp "$home/libs/*" "$@"
