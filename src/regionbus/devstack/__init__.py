"""The local stack: Apache Kafka (KRaft) and Redis as child processes, for tests, the demo
and ``regionbus stack``. A developer tool, not part of the cache server."""

from regionbus.devstack.kafka_broker import EmbeddedKafka, KafkaCluster, KafkaNode, ScramSecurity
from regionbus.devstack.local import KAFKA_ENV_VAR, REDIS_ENV_VAR, LocalStack, docker_engine_answers
from regionbus.devstack.process import LOOPBACK_HOST, ChildService, free_port
from regionbus.devstack.redis_cluster import EmbeddedRedisCluster
from regionbus.devstack.redis_secured import SecuredEmbeddedRedis
from regionbus.devstack.redis_server import EmbeddedRedis
from regionbus.devstack.spark_cluster import EmbeddedSparkCluster
from regionbus.devstack.tls import TlsFiles

__all__ = [
    "KAFKA_ENV_VAR",
    "LOOPBACK_HOST",
    "REDIS_ENV_VAR",
    "ChildService",
    "EmbeddedKafka",
    "EmbeddedRedis",
    "EmbeddedRedisCluster",
    "EmbeddedSparkCluster",
    "KafkaCluster",
    "KafkaNode",
    "LocalStack",
    "ScramSecurity",
    "SecuredEmbeddedRedis",
    "TlsFiles",
    "docker_engine_answers",
    "free_port",
]
