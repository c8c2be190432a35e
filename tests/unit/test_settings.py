"""Configuration: sources and their priority, start-up validation with readable errors,
Kafka security mapped to librdkafka, secrets masked (``regionbus.schemas.settings``, ``regionbus
config show``)."""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner
from confluent_kafka import KafkaException
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from regionbus.broker.cli import main
from regionbus.broker.config import ServerSettings
from regionbus.clients.settings import ClientSettings
from regionbus.gateways.receiver import GatewayReceiverSettings
from regionbus.gateways.sender_settings import GatewaySenderSettings
from regionbus.schemas.errors import ConfigurationError
from regionbus.schemas.kafka_clients import kafka_producer
from regionbus.schemas.settings import (
    CONFIG_FILE_ENV,
    MASK,
    SECTIONS,
    all_settings_classes,
    settings_class,
    unknown_environment,
)
from regionbus.schemas.settings_docs import setting_descriptions


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("REGIONBUS_"):
            monkeypatch.delenv(name)


def _use_file(monkeypatch: pytest.MonkeyPatch, path: Path, text: str) -> Path:
    path.write_text(text)
    monkeypatch.setenv(CONFIG_FILE_ENV, str(path))
    return path


def test_code_beats_environment_beats_file_beats_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _use_file(
        monkeypatch,
        tmp_path / "site.toml",
        '[server]\nnamespace = "from-file"\nlease_ttl_ms = 7000\nlinger_ms = 9\n'
        "[client]\nread_timeout_ms = 1234\n",
    )
    monkeypatch.setenv("REGIONBUS_LEASE_TTL_MS", "8000")
    settings = ServerSettings.load(linger_ms=3)
    assert settings.namespace == "from-file"
    assert settings.lease_ttl_ms == 8000
    assert settings.linger_ms == 3
    assert settings.poll_batch_size == 1000  # default
    assert settings.sources()["namespace"] == "file"
    assert settings.sources()["lease_ttl_ms"] == "env"
    assert settings.sources()["poll_batch_size"] == "default"
    # the same file's [client] table configures clients
    assert ClientSettings.load().read_timeout_ms == 1234


def test_yaml_and_dotenv_files_are_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _use_file(
        monkeypatch,
        tmp_path / "site.yaml",
        "server:\n  namespace: yaml-site\n  kafka_config:\n    client.id: x\n",
    )
    settings = ServerSettings.load()
    assert (settings.namespace, settings.kafka_config) == ("yaml-site", {"client.id": "x"})
    _use_file(
        monkeypatch,
        tmp_path / "site.env",
        'REGIONBUS_NAMESPACE=env-site\nREGIONBUS_KAFKA_CONFIG={"client.id": "y"}\n'
        "REGIONBUS_GATEWAY_RECEIVER_DISTRIBUTED_SYSTEM_ID=2\n",
    )
    settings = ServerSettings.load()
    assert (settings.namespace, settings.kafka_config) == ("env-site", {"client.id": "y"})
    # one dotenv file can hold every process kind's variables
    assert GatewayReceiverSettings.load().distributed_system_id == 2


def test_a_typo_in_the_file_is_an_error_naming_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _use_file(monkeypatch, tmp_path / "bad.toml", '[server]\nnamespce = "a"\n')
    with pytest.raises(ConfigurationError, match="'namespce' \\(did you mean 'namespace'\\?\\)"):
        ServerSettings.load()
    _use_file(monkeypatch, tmp_path / "bad.toml", '[servre]\nnamespace = "a"\n')
    with pytest.raises(ConfigurationError, match="unknown tables \\['servre'\\]"):
        ServerSettings.load()
    _use_file(monkeypatch, tmp_path / "bad.env", "REGIONBUS_NAMSPACE=a\n")
    with pytest.raises(ConfigurationError, match="REGIONBUS_NAMSPACE"):
        ServerSettings.load()
    monkeypatch.setenv(CONFIG_FILE_ENV, str(tmp_path / "missing.toml"))
    with pytest.raises(ConfigurationError, match="no such file"):
        ServerSettings.load()


def test_a_bad_value_names_its_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REGIONBUS_LEASE_TTL_MS", "10")
    monkeypatch.setenv("REGIONBUS_TOTAL_BUCKETS", "many")
    with pytest.raises(ConfigurationError) as caught:
        ServerSettings.load()
    message = str(caught.value)
    assert "lease_ttl_ms (env REGIONBUS_LEASE_TTL_MS)" in message
    assert "greater than or equal to 200 [got '10']" in message
    assert "total_buckets (env REGIONBUS_TOTAL_BUCKETS)" in message
    with pytest.raises(ConfigurationError, match="unknown setting; did you mean 'namespace'"):
        ServerSettings.load(namespce="x")


def test_unknown_environment_variables_are_reported_with_a_hint() -> None:
    environ = {
        "REGIONBUS_NAMSPACE": "x",
        "REGIONBUS_NAMESPACE": "ok",
        "REGIONBUS_GATEWAY_SENDER_BATCH_SIZE": "5",
        "PATH": "/bin",
    }
    assert unknown_environment(environ) == [
        "REGIONBUS_NAMSPACE (did you mean REGIONBUS_NAMESPACE?)"
    ]


def test_every_process_kind_has_its_file_table() -> None:
    assert [cls.config_section for cls in all_settings_classes()] == list(SECTIONS)


def _self_signed_ca(path: Path) -> Path:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "regionbus test CA")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    return path


def test_typed_kafka_security_maps_to_librdkafka_keys_librdkafka_accepts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ca = _self_signed_ca(tmp_path / "ca.pem")
    monkeypatch.setenv("REGIONBUS_KAFKA_SECURITY_PROTOCOL", "SASL_SSL")
    monkeypatch.setenv("REGIONBUS_KAFKA_SASL_MECHANISM", "SCRAM-SHA-512")
    monkeypatch.setenv("REGIONBUS_KAFKA_SASL_USERNAME", "app")
    monkeypatch.setenv("REGIONBUS_KAFKA_SASL_PASSWORD", "s3cret")
    monkeypatch.setenv("REGIONBUS_KAFKA_SSL_CA_LOCATION", str(ca))
    settings = ClientSettings.load(kafka_bootstrap_servers="127.0.0.1:1")
    config = settings.librdkafka()
    assert config == {
        "allow.auto.create.topics": False,
        "bootstrap.servers": "127.0.0.1:1",
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "app",
        "sasl.password": "s3cret",
        "ssl.ca.location": str(ca),
    }
    # librdkafka itself validates the keys and loads the CA file
    kafka_producer(config).flush(0)
    with pytest.raises(KafkaException):
        kafka_producer({**config, "ssl.ca.location": str(tmp_path / "garbage.pem")})


def test_inconsistent_kafka_security_is_refused_at_start(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="needs kafka_security_protocol SASL_"):
        ServerSettings.load(kafka_sasl_mechanism="PLAIN")
    with pytest.raises(ConfigurationError, match="needs kafka_sasl_username and"):
        ServerSettings.load(kafka_security_protocol="SASL_SSL", kafka_sasl_mechanism="PLAIN")
    with pytest.raises(ConfigurationError, match="no such file"):
        ServerSettings.load(kafka_ssl_ca_location=str(tmp_path / "nope.pem"))
    with pytest.raises(ConfigurationError, match="typed kafka_\\* fields also set"):
        ServerSettings.load(
            kafka_security_protocol="SSL", kafka_config={"security.protocol": "PLAINTEXT"}
        )
    # a SASL mechanism given through kafka_config's protocol is consistent
    ServerSettings.load(
        kafka_sasl_mechanism="OAUTHBEARER", kafka_config={"security.protocol": "SASL_SSL"}
    )


def test_kafka_config_asking_for_topic_auto_creation_is_refused_at_start() -> None:
    with pytest.raises(ConfigurationError, match=r"allow\.auto\.create\.topics"):
        ClientSettings.load(kafka_config={"allow.auto.create.topics": "true"})
    with pytest.raises(ConfigurationError, match=r"allow\.auto\.create\.topics"):
        ServerSettings.load().librdkafka(**{"allow.auto.create.topics": True})


def test_redis_tls_needs_a_rediss_url() -> None:
    with pytest.raises(ConfigurationError, match="is not rediss://"):
        ServerSettings.load(redis_ssl_ca_certs="/tmp/ca.pem")
    with pytest.raises(ConfigurationError, match="is not a redis://"):
        GatewaySenderSettings.load(
            sender_id="s",
            distributed_system_id=1,
            remote_distributed_system_id=2,
            remote_namespace="b",
            remote_kafka_bootstrap_servers="b:9092",
            redis_url="http://redis:6379",
        )


def test_a_replica_wait_must_end_before_the_redis_socket_times_out() -> None:
    settings = ServerSettings.load(redis_wait_replicas=1, redis_wait_timeout_ms=2000)
    assert settings.redis_wait_replicas == 1 and settings.redis_cluster is None
    with pytest.raises(ConfigurationError, match="must be shorter than redis_socket_timeout_s"):
        ServerSettings.load(
            redis_wait_replicas=1, redis_wait_timeout_ms=5000, redis_socket_timeout_s=5.0
        )
    with pytest.raises(ConfigurationError, match="reached over TCP"):
        ServerSettings.load(redis_cluster=True, redis_url="unix:///tmp/redis.sock")


def test_the_gateway_receiver_applies_with_its_own_kafka_security(tmp_path: Path) -> None:
    receiver = GatewayReceiverSettings.load(
        distributed_system_id=2,
        kafka_security_protocol="SASL_PLAINTEXT",
        kafka_sasl_mechanism="SCRAM-SHA-256",
        kafka_sasl_username="gw",
        kafka_sasl_password="pw",
    )
    client = ClientSettings.load(namespace=receiver.namespace, **receiver.kafka_connection())
    assert client.librdkafka()["sasl.password"] == "pw"
    assert client.librdkafka()["security.protocol"] == "SASL_PLAINTEXT"


def test_config_show_masks_every_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _use_file(
        monkeypatch,
        tmp_path / "site.toml",
        '[server]\nredis_url = "redis://:url-pw@redis:6379/0"\n'
        'kafka_config = { "sasl.jaas.config" = "jaas-pw", "client.id" = "visible" }\n',
    )
    monkeypatch.setenv("REGIONBUS_REDIS_PASSWORD", "redis-pw")
    monkeypatch.setenv("REGIONBUS_KAFKA_SECURITY_PROTOCOL", "SASL_PLAINTEXT")
    monkeypatch.setenv("REGIONBUS_KAFKA_SASL_MECHANISM", "PLAIN")
    monkeypatch.setenv("REGIONBUS_KAFKA_SASL_USERNAME", "app")
    monkeypatch.setenv("REGIONBUS_KAFKA_SASL_PASSWORD", "sasl-pw")
    runner = CliRunner()
    for args in (["config", "show", "--json"], ["config", "show"]):
        result = runner.invoke(main, args, terminal_width=400)
        assert result.exit_code == 0, result.output
        for secret in ("url-pw", "redis-pw", "sasl-pw", "jaas-pw"):
            assert secret not in result.output
        assert "visible" in result.output
    document = json.loads(runner.invoke(main, ["config", "show", "--json"]).output)
    settings = document["settings"]
    assert settings["redis_password"] == {
        "value": MASK,
        "source": "env",
        "env": "REGIONBUS_REDIS_PASSWORD",
        "description": "Optional Redis password (overrides the URL's), kept secret.",
    }
    assert settings["redis_url"]["value"] == f"redis://:{MASK}@redis:6379/0"
    assert settings["kafka_config"]["value"]["sasl.jaas.config"] == MASK
    assert settings["kafka_sasl_username"]["value"] == "app"


@pytest.mark.parametrize("kind", sorted(SECTIONS))
def test_config_show_describes_every_setting_and_wraps_at_80_columns(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    required = {
        "sender_id": "x",
        "receiver_id": "x",
        "queue_id": "x",
        "remote_kafka_bootstrap_servers": "x:1",
        "remote_namespace": "x",
        "distributed_system_id": "1",
        "remote_distributed_system_id": "2",
        "remote_redis_url": "redis://x:1/0",
        "regions": '["r"]',
    }
    for section in ("gateway_sender", "gateway_receiver", "async_event_queue", "gateway_repair"):
        gateway_settings = settings_class(section)
        for name, value in required.items():
            if name in gateway_settings.model_fields:
                monkeypatch.setenv(gateway_settings.env_name(name), value)
    monkeypatch.setenv("REGIONBUS_ASYNC_EVENT_QUEUE_LISTENER", "json:loads")
    cls = settings_class(kind)
    result = CliRunner().invoke(main, ["config", "show", "--for", kind], terminal_width=80)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "…" not in result.output, "a cell was cut"
    cells = "\n".join(line.split("│")[1].strip() for line in lines if line.count("│") == 4)
    descriptions = setting_descriptions(cls)
    for name in cls.model_fields:
        assert f"\n{name}\n" in f"\n{cells}\n", f"{name} not shown whole"
        first_words = " ".join(descriptions[name].replace("``", "").split()[:2])
        assert first_words in " ".join(cells.split()), f"{name}: no description"


def test_regionbus_version() -> None:
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0
    assert result.output == f"regionbus {importlib.metadata.version('regionbus')}\n"


def test_config_show_exits_2_with_the_problem(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REGIONBUS_GATEWAY_SENDER_BATCH_SIZE", "0")
    result = CliRunner().invoke(main, ["config", "show", "--for", "gateway_sender"])
    assert result.exit_code == 2
    assert "batch_size (env REGIONBUS_GATEWAY_SENDER_BATCH_SIZE)" in result.output
    assert "sender_id (env REGIONBUS_GATEWAY_SENDER_ID): Field required" in result.output
