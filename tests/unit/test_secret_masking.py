"""Secrets never reach a log line, ``config show`` or a validation error: every secret-bearing
setting (by type and by name) and every secret-bearing librdkafka key is masked
(``regionbus.schemas.masking``)."""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import pytest
from click.testing import CliRunner
from pydantic import SecretStr

from regionbus.broker import cli as broker_cli
from regionbus.broker.cli import main
from regionbus.broker.config import ServerSettings
from regionbus.schemas.errors import ConfigurationError
from regionbus.schemas.masking import MASK, SECRET_LIBRDKAFKA_KEYS, is_secret_name, mask_text
from regionbus.schemas.settings import SECTIONS, all_settings_classes

SECRET = "s3cr3t-Value-9f2c"
PEM = (
    "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC"
    + SECRET
    + "\n-----END PRIVATE KEY-----"
)

LIBRDKAFKA_SECRET_KEYS = [*sorted(SECRET_LIBRDKAFKA_KEYS), "ssl_key_pem", "SASL_PASSWORD"]
"""Each librdkafka secret key, plus spellings with underscores and capitals."""


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("REGIONBUS_"):
            monkeypatch.delenv(name)


def _secret_fields() -> list[tuple[str, str]]:
    """(section, field) of every field that holds a secret, by type or by name."""
    found = []
    for section, cls in zip(SECTIONS, all_settings_classes(), strict=True):
        for name, info in cls.model_fields.items():
            if "SecretStr" in repr(info.annotation) or is_secret_name(name):
                found.append((section, name))
    return found


SECRET_FIELDS = _secret_fields()


def test_the_secret_fields_are_found() -> None:
    names = {name for _, name in SECRET_FIELDS}
    assert {"kafka_sasl_password", "kafka_ssl_key_password", "redis_password"} <= names
    assert "security_secret" in names


@pytest.mark.parametrize(("section", "field"), SECRET_FIELDS)
def test_every_secret_field_is_masked_in_config_show(
    section: str, field: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cls = dict(zip(SECTIONS, all_settings_classes(), strict=True))[section]
    monkeypatch.setenv(cls.env_name(field), SECRET)
    for name, info in cls.model_fields.items():
        if info.is_required() and name != field:
            value = {int: "2", list[str]: '["x1"]'}.get(info.annotation, "x1")
            monkeypatch.setenv(cls.env_name(name), value)
    _set_consistent_companions(cls, field, monkeypatch)
    result = CliRunner().invoke(main, ["config", "show", "--for", section, "--json"])
    assert result.exit_code == 0, result.output
    assert SECRET not in result.output
    shown = json.loads(result.output)["settings"][field]["value"]
    assert shown == MASK


def _set_consistent_companions(cls: Any, field: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings a secret needs to validate (a SASL password needs its mechanism)."""
    if field == "kafka_sasl_password":
        monkeypatch.setenv(cls.env_name("kafka_security_protocol"), "SASL_SSL")
        monkeypatch.setenv(cls.env_name("kafka_sasl_mechanism"), "PLAIN")
        monkeypatch.setenv(cls.env_name("kafka_sasl_username"), "app")
    if field == "security_secret" and "security_principal" in cls.model_fields:
        monkeypatch.setenv(cls.env_name("security_principal"), "app")


@pytest.mark.parametrize("key", LIBRDKAFKA_SECRET_KEYS)
def test_every_librdkafka_secret_key_is_masked_in_masked_and_config_show(
    key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    value = PEM if "pem" in key.lower() else SECRET
    settings = ServerSettings(kafka_config={key: value})
    assert SECRET not in json.dumps(settings.masked())
    assert settings.masked()["kafka_config"][key] == MASK
    monkeypatch.setenv("REGIONBUS_KAFKA_CONFIG", json.dumps({key: value}))
    result = CliRunner().invoke(main, ["config", "show"])
    assert result.exit_code == 0, result.output
    assert SECRET not in result.output


def test_a_pem_private_key_is_masked_under_any_key() -> None:
    settings = ServerSettings(kafka_config={"some.future.key": PEM})
    assert SECRET not in json.dumps(settings.masked())


class _StopAfterLoggingError(Exception):
    pass


@pytest.mark.parametrize("key", ["ssl.key.pem", "sasl.password", "ssl.keystore.password"])
def test_serve_effective_configuration_line_masks_kafka_config_secrets(
    key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_server(_settings: Any) -> Any:
        raise _StopAfterLoggingError

    # The line is written before the server starts; stop there, Kafka is not needed.
    monkeypatch.setattr(broker_cli, "CacheServer", no_server)
    monkeypatch.setenv("REGIONBUS_KAFKA_CONFIG", json.dumps({key: PEM}))
    monkeypatch.setenv("REGIONBUS_REDIS_URL", f"redis://admin:{SECRET}@127.0.0.1:6379/0")
    result = CliRunner().invoke(main, ["serve"])
    assert isinstance(result.exception, _StopAfterLoggingError)
    # serve's own log handler writes to the (captured) standard error.
    logged = result.output + (result.stderr if result.stderr_bytes is not None else "")
    assert "effective configuration" in logged
    assert SECRET not in logged
    logging.getLogger().handlers.clear()


@pytest.mark.parametrize(
    "url",
    [
        f"http://admin:{SECRET}@127.0.0.1:6379/0",
        f"redis://:{SECRET}@127.0.0.1:6379/0",
        f"redis://127.0.0.1:6379/0?password={SECRET}",
        f"redis//admin:{SECRET}@127.0.0.1",
    ],
)
def test_a_redis_url_password_is_not_echoed_in_a_validation_error(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConfigurationError) as raised:
        ServerSettings.load(redis_url=url, redis_ssl_ca_certs="/ca.pem")
    assert SECRET not in str(raised.value)
    assert "redis_url" in str(raised.value)
    monkeypatch.setenv("REGIONBUS_REDIS_URL", url)
    monkeypatch.setenv("REGIONBUS_REDIS_SSL_CA_CERTS", "/ca.pem")
    result = CliRunner().invoke(main, ["config", "show"])
    assert result.exit_code == 2
    assert SECRET not in result.output


def test_a_secret_field_given_a_bad_type_is_not_echoed() -> None:
    with pytest.raises(ConfigurationError) as raised:
        ServerSettings.load(redis_password=[SECRET])
    assert SECRET not in str(raised.value)


def test_mask_text_masks_urls_and_private_keys_in_free_text() -> None:
    text = f"cannot reach rediss://u:{SECRET}@h:1/0 with key {PEM}"
    masked = mask_text(text)
    assert SECRET not in masked
    assert "rediss://u:" + MASK + "@h:1/0" in masked


def test_secret_str_values_are_masked_even_under_an_innocent_name() -> None:
    from regionbus.schemas.masking import mask_value

    assert mask_value("color", SecretStr(SECRET)) == MASK


def test_region_expiration_attributes_are_plain_json_in_the_masked_configuration() -> None:
    # `regionbus serve` logs json.dumps(settings.masked()): an enum inside must not stop it.
    settings = ServerSettings(
        region_expiration={"r": {"entry_time_to_live": {"timeout_s": 5, "action": "destroy"}}}
    )
    masked = json.loads(json.dumps(settings.masked()))
    assert masked["region_expiration"]["r"]["entry_time_to_live"] == {
        "timeout_s": 5,
        "action": "destroy",
    }
