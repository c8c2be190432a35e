"""librdkafka settings as the JVM Kafka client of Spark's connector takes them.

regionbus configures every Kafka client with librdkafka settings (``REGIONBUS_KAFKA_CONFIG``,
the typed ``REGIONBUS_KAFKA_SASL_*`` / ``..._SSL_*`` settings, devstack's ``client_config``).
Most keys mean the same to the Java client (``bootstrap.servers``, ``security.protocol``,
``linger.ms``, ...); the login and the TLS material do not:

- ``sasl.username`` / ``sasl.password`` become ``sasl.jaas.config`` with the login module of
  ``sasl.mechanism`` (``sasl.mechanisms`` is librdkafka's other spelling): SCRAM or PLAIN;
- ``ssl.ca.location`` becomes a PEM trust store, ``ssl.certificate.location`` and
  ``ssl.key.location`` a PEM key store (the files are read here, so executors need not
  share the driver's paths), ``ssl.key.password`` stays;
- ``ssl.endpoint.identification.algorithm=none`` is the Java client's empty value.

Settings Spark's source and sink set themselves and refuse (group, deserializers, offset
reset, auto commit) are dropped, as are librdkafka-only tuning keys that name nothing in
the Java client.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from regionbus.schemas.errors import ConfigurationError
from regionbus.spark.options import SPARK_OWNED_KAFKA_KEYS

_LOGIN_MODULES: Final = {
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
}
_DROPPED: Final = SPARK_OWNED_KAFKA_KEYS | frozenset(
    {
        # librdkafka-only: the Java client would warn that they are unknown.
        "enable.partition.eof",
        "enable.auto.offset.store",
        "fetch.wait.max.ms",
        "queue.buffering.max.ms",
        "queue.buffering.max.messages",
        "queue.buffering.max.kbytes",
        "socket.keepalive.enable",
        "api.version.request",
        "log_level",
        "debug",
        "statistics.interval.ms",
    }
)
_TRANSLATED: Final = frozenset(
    {
        "sasl.mechanism",
        "sasl.mechanisms",
        "sasl.username",
        "sasl.password",
        "ssl.ca.location",
        "ssl.certificate.location",
        "ssl.key.location",
        "ssl.endpoint.identification.algorithm",
    }
)


def _jaas_quoted(text: str) -> str:
    # JAAS option values are double-quoted strings; JSON's escaping of \ and " matches.
    return json.dumps(text)


def _read_pem(setting: str, path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise ConfigurationError(f"{setting}={path}: {exc}") from exc


def jvm_kafka_config(librdkafka: Mapping[str, str]) -> dict[str, str]:
    """The Java client settings equivalent to librdkafka settings.

    Args:
        librdkafka: librdkafka settings (no ``kafka.`` prefix), e.g. from
            ``KafkaNode.client_config()`` or ``REGIONBUS_KAFKA_CONFIG``.

    Returns:
        Java client settings (no ``kafka.`` prefix).

    Raises:
        ConfigurationError: a SASL login with a mechanism other than SCRAM or PLAIN (the
            Java client needs its own ``sasl.jaas.config`` then: pass that instead), a
            username without a password, or an unreadable PEM file.
    """
    config = {k: str(v) for k, v in librdkafka.items() if k not in _DROPPED | _TRANSLATED}
    mechanism = librdkafka.get("sasl.mechanism") or librdkafka.get("sasl.mechanisms")
    if mechanism:
        config["sasl.mechanism"] = mechanism
    username, password = librdkafka.get("sasl.username"), librdkafka.get("sasl.password")
    if (username is None) != (password is None):
        raise ConfigurationError("sasl.username and sasl.password go together")
    if username is not None and password is not None and "sasl.jaas.config" not in config:
        module = _LOGIN_MODULES.get((mechanism or "PLAIN").upper())
        if module is None:
            raise ConfigurationError(
                f"sasl.mechanism={mechanism}: give the Java client's sasl.jaas.config "
                f"(only {', '.join(sorted(_LOGIN_MODULES))} logins are translated)"
            )
        config["sasl.jaas.config"] = (
            f"{module} required username={_jaas_quoted(username)} "
            f"password={_jaas_quoted(password)};"
        )
    if "ssl.ca.location" in librdkafka:
        config["ssl.truststore.type"] = "PEM"
        config["ssl.truststore.certificates"] = _read_pem(
            "ssl.ca.location", librdkafka["ssl.ca.location"]
        )
    if "ssl.certificate.location" in librdkafka and "ssl.key.location" in librdkafka:
        config["ssl.keystore.type"] = "PEM"
        config["ssl.keystore.certificate.chain"] = _read_pem(
            "ssl.certificate.location", librdkafka["ssl.certificate.location"]
        )
        config["ssl.keystore.key"] = _read_pem("ssl.key.location", librdkafka["ssl.key.location"])
    algorithm = librdkafka.get("ssl.endpoint.identification.algorithm")
    if algorithm is not None:
        config["ssl.endpoint.identification.algorithm"] = "" if algorithm == "none" else algorithm
    return config


__all__ = ["jvm_kafka_config"]
