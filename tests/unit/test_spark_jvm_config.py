"""librdkafka settings translated for the Java Kafka client of Spark's connector."""

from __future__ import annotations

from pathlib import Path

import pytest

from regionbus.schemas.errors import ConfigurationError
from regionbus.spark.format import JVM_FORMAT, JVM_READ_DEFAULTS, kafka_options
from regionbus.spark.jvm_config import jvm_kafka_config
from regionbus.spark.source import SOURCE_NAME


def test_a_scram_login_becomes_a_jaas_config_and_shared_keys_pass_through() -> None:
    config = jvm_kafka_config(
        {
            "bootstrap.servers": "127.0.0.1:9093",
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanisms": "SCRAM-SHA-512",
            "sasl.username": "loader",
            "sasl.password": 'p"a\\ss',
            "linger.ms": "5",
        }
    )

    assert config == {
        "bootstrap.servers": "127.0.0.1:9093",
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule required "
        'username="loader" password="p\\"a\\\\ss";',
        "linger.ms": "5",
    }


def test_a_plain_login_uses_the_plain_module_and_a_given_jaas_config_wins() -> None:
    plain = jvm_kafka_config(
        {"sasl.mechanism": "PLAIN", "sasl.username": "u", "sasl.password": "p"}
    )
    given = jvm_kafka_config(
        {"sasl.username": "u", "sasl.password": "p", "sasl.jaas.config": "mine;"}
    )

    assert plain["sasl.jaas.config"].startswith(
        "org.apache.kafka.common.security.plain.PlainLoginModule required"
    )
    assert given["sasl.jaas.config"] == "mine;"


def test_pem_files_become_pem_stores_and_no_hostname_check_is_the_empty_value(
    tmp_path: Path,
) -> None:
    (tmp_path / "ca.pem").write_text("CA")
    (tmp_path / "cert.pem").write_text("CERT")
    (tmp_path / "key.pem").write_text("KEY")

    config = jvm_kafka_config(
        {
            "security.protocol": "SSL",
            "ssl.ca.location": str(tmp_path / "ca.pem"),
            "ssl.certificate.location": str(tmp_path / "cert.pem"),
            "ssl.key.location": str(tmp_path / "key.pem"),
            "ssl.key.password": "secret",
            "ssl.endpoint.identification.algorithm": "none",
        }
    )

    assert config == {
        "security.protocol": "SSL",
        "ssl.truststore.type": "PEM",
        "ssl.truststore.certificates": "CA",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.certificate.chain": "CERT",
        "ssl.keystore.key": "KEY",
        "ssl.key.password": "secret",
        "ssl.endpoint.identification.algorithm": "",
    }


def test_settings_spark_refuses_and_librdkafka_only_settings_are_dropped() -> None:
    config = jvm_kafka_config(
        {
            "bootstrap.servers": "b:9092",
            "group.id": "g",
            "enable.auto.commit": "false",
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": "100",
            "enable.partition.eof": "true",
        }
    )

    assert config == {"bootstrap.servers": "b:9092"}


@pytest.mark.parametrize(
    ("settings", "match"),
    [
        ({"sasl.mechanism": "GSSAPI", "sasl.username": "u", "sasl.password": "p"}, "GSSAPI"),
        ({"sasl.username": "u"}, "go together"),
        ({"ssl.ca.location": "/no/such/ca.pem"}, "ssl.ca.location=/no/such/ca.pem"),
    ],
)
def test_what_cannot_be_translated_is_a_configuration_error(
    settings: dict[str, str], match: str
) -> None:
    with pytest.raises(ConfigurationError, match=match):
        jvm_kafka_config(settings)


def test_connector_options_carry_the_kafka_prefix_and_the_python_source_keeps_librdkafka() -> None:
    settings = {"sasl.username": "u", "sasl.password": "p", "fetch.wait.max.ms": "100"}

    jvm = kafka_options(JVM_FORMAT, "b:9092", settings)
    python = kafka_options(SOURCE_NAME, "b:9092", settings)

    assert jvm["kafka.bootstrap.servers"] == "b:9092"
    assert "kafka.sasl.jaas.config" in jvm and "kafka.sasl.username" not in jvm
    assert python == {
        "kafka.bootstrap.servers": "b:9092",
        "kafka.sasl.username": "u",
        "kafka.sasl.password": "p",
        "kafka.fetch.wait.max.ms": "100",
    }
    assert all(key.startswith("kafka.") for key in JVM_READ_DEFAULTS)
