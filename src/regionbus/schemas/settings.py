"""How every regionbus process is configured: one typed settings object, from code,
environment and an optional file, validated at start with errors that name the variable.

Each process kind (cache server, client, gateway sender, gateway receiver, async event
queue) has one :class:`RegionBusSettings` subclass. Values come, highest priority first,
from:

1. keyword arguments in code (and CLI options, which are passed that way);
2. environment variables: the class's prefix plus the field name in upper case
   (``REGIONBUS_LEASE_TTL_MS``), except where the field name repeats the prefix
   (:attr:`RegionBusSettings.env_renamed`: ``REGIONBUS_GATEWAY_SENDER_ID``, whose older
   name ``REGIONBUS_GATEWAY_SENDER_SENDER_ID`` is still read, with a warning); dicts and
   lists as JSON;
3. the file named by ``REGIONBUS_CONFIG_FILE`` (or ``regionbus --config FILE``):
   - ``*.toml`` / ``*.yaml`` / ``*.yml``: one table per process kind (``[server]``,
     ``[client]``, ``[gateway_sender]``, ``[gateway_receiver]``, ``[async_event_queue]``)
     with field names as keys, so one file can configure every process of a site;
   - anything else: a dotenv file of ``NAME=value`` lines with the environment names;
4. the defaults (Geode's where the field has a Geode counterpart).

Unknown keys in a file, and unknown ``REGIONBUS_*`` names in a dotenv file, are errors
(a typo must not silently leave a default in force). Secrets are :class:`SecretStr` and
:meth:`RegionBusSettings.masked` shows them as ``********``.

:class:`KafkaConnectionSettings` adds the Kafka connection, with typed SASL and TLS fields
and their explicit mapping to librdkafka keys (:data:`LIBRDKAFKA_KEYS`).
"""

from __future__ import annotations

import difflib
import logging
import os
import re
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal, Self

import yaml
from dotenv import dotenv_values
from pydantic import Field, SecretStr, ValidationError, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    DotEnvSettingsSource,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from regionbus.schemas.errors import ConfigurationError
from regionbus.schemas.kafka_clients import client_config
from regionbus.schemas.masking import MASK, is_secret_name, mask_text, mask_url, mask_value

_log = logging.getLogger("regionbus.config")

CONFIG_FILE_ENV = "REGIONBUS_CONFIG_FILE"
"""Environment variable naming the configuration file (TOML, YAML or dotenv)."""

LIBRDKAFKA_KEYS: dict[str, str] = {
    "kafka_bootstrap_servers": "bootstrap.servers",
    "kafka_security_protocol": "security.protocol",
    "kafka_sasl_mechanism": "sasl.mechanism",
    "kafka_sasl_username": "sasl.username",
    "kafka_sasl_password": "sasl.password",
    "kafka_ssl_ca_location": "ssl.ca.location",
    "kafka_ssl_certificate_location": "ssl.certificate.location",
    "kafka_ssl_key_location": "ssl.key.location",
    "kafka_ssl_key_password": "ssl.key.password",
    "kafka_ssl_endpoint_identification_algorithm": "ssl.endpoint.identification.algorithm",
}
"""Each typed Kafka field and the librdkafka key it sets (librdkafka CONFIGURATION.md)."""


def config_file() -> Path | None:
    """The configuration file named by ``REGIONBUS_CONFIG_FILE``, or None when unset."""
    value = os.environ.get(CONFIG_FILE_ENV, "").strip()
    return Path(value) if value else None


class RegionBusSettings(BaseSettings):
    """Base of every process's settings: sources, start-up validation, masked view.

    Subclasses set ``model_config`` (at least ``env_prefix``) and :attr:`config_section`.
    Construct them with :meth:`load` to get a :class:`ConfigurationError` naming the
    environment variable and file key of each bad value, instead of pydantic's error.
    """

    model_config = SettingsConfigDict(env_prefix="REGIONBUS_", extra="forbid")

    config_section: ClassVar[str] = ""
    """The table of this process kind in a TOML or YAML configuration file."""

    env_renamed: ClassVar[Mapping[str, str]] = {}
    """``{field: environment variable}`` of the fields whose variable is not the prefix
    plus the field name, because the name repeats the prefix (``sender_id`` of
    ``REGIONBUS_GATEWAY_SENDER_`` is ``REGIONBUS_GATEWAY_SENDER_ID``). The repeating name
    (``REGIONBUS_GATEWAY_SENDER_SENDER_ID``) is still read when the new one is unset, with
    a warning."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Code, then environment, then the ``REGIONBUS_CONFIG_FILE`` file, then defaults."""
        path = config_file()
        if issubclass(settings_cls, RegionBusSettings) and settings_cls.env_renamed:
            env_settings = _RenamedEnvSource(settings_cls)
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if path is not None and issubclass(settings_cls, RegionBusSettings):
            sources.append(_FileSource(settings_cls, path))
        return tuple(sources)

    @classmethod
    def env_name(cls, field: str) -> str:
        """The environment variable that sets ``field``, e.g. ``REGIONBUS_LEASE_TTL_MS``."""
        return cls.env_renamed.get(field) or cls._prefixed_env_name(field)

    @classmethod
    def _prefixed_env_name(cls, field: str) -> str:
        return f"{cls.model_config.get('env_prefix', '')}{field}".upper()

    @classmethod
    def env_names(cls) -> dict[str, str]:
        """``{environment variable: field name}`` of every field of this class (the names
        :meth:`deprecated_env_names` lists are not included)."""
        return {cls.env_name(name): name for name in cls.model_fields}

    @classmethod
    def deprecated_env_names(cls) -> dict[str, str]:
        """``{older environment variable: the one to set instead}`` (see
        :attr:`env_renamed`); the older ones are still read, with a warning."""
        return {cls._prefixed_env_name(field): env for field, env in cls.env_renamed.items()}

    @classmethod
    def load(cls, **overrides: Any) -> Self:
        """Build and validate the settings of this process from every source.

        Args:
            **overrides: Field values given in code or by CLI options; None values are
                ignored (the option was not given).

        Returns:
            The validated settings.

        Raises:
            ConfigurationError: a value is missing, malformed or inconsistent, or the
                configuration file is unreadable or has unknown keys. The message names
                the field, its environment variable and what is wrong, one line each.
        """
        given = {k: v for k, v in overrides.items() if v is not None}
        try:
            return cls(**given)
        except ValidationError as exc:
            raise ConfigurationError(describe_validation_error(cls, exc)) from None
        except SettingsError as exc:
            # A source could not parse a value, e.g. a list or dict variable that is not
            # JSON (REGIONBUS_REGIONS=r1,r2): pydantic-settings raises before validating.
            raise ConfigurationError(describe_settings_error(cls, exc)) from None

    def masked(self) -> dict[str, Any]:
        """The effective configuration as plain JSON-able values, secrets masked.

        ``SecretStr`` fields, fields and dict keys that name a secret (e.g.
        ``sasl.password`` or ``ssl.key.pem`` in ``kafka_config``), PEM private keys and
        passwords inside URLs become :data:`MASK` (`regionbus.schemas.masking`); an unset secret
        stays None.
        """
        return {name: mask_value(name, getattr(self, name)) for name in type(self).model_fields}

    def sources(self) -> dict[str, str]:
        """Where each field's value came from: ``"env"``, ``"file"``, ``"code"`` or
        ``"default"`` (best effort: code wins over env, env over file)."""
        file_keys = _FileSource.keys_in(type(self), config_file())
        result: dict[str, str] = {}
        old_names = {field: old for old, field in _old_env_fields(type(self)).items()}
        for name in type(self).model_fields:
            if type(self).env_name(name) in os.environ or old_names.get(name, "") in os.environ:
                result[name] = "env"
            elif name in file_keys:
                result[name] = "file"
            elif name in self.model_fields_set:
                result[name] = "code"
            else:
                result[name] = "default"
        return result


def describe_validation_error(settings_class: type[RegionBusSettings], exc: ValidationError) -> str:
    """A readable, one-line-per-problem account of a settings validation failure.

    Args:
        settings_class: The class that failed to validate.
        exc: pydantic's error.

    Returns:
        ``"invalid <section> configuration:"`` then, per problem, the field, its
        environment variable and pydantic's message with the offending input.
    """
    lines = [f"invalid {settings_class.config_section or settings_class.__name__} configuration:"]
    for error in exc.errors():
        location = [str(part) for part in error.get("loc", ())]
        field = location[0] if location else ""
        where = ".".join(location) or "(settings)"
        # Messages of model-level checks may quote values (a Redis URL with its password).
        message = mask_text(str(error.get("msg", "invalid")))
        if field in settings_class.model_fields:
            source = f"{where} (env {settings_class.env_name(field)})"
        elif error.get("type") == "extra_forbidden":
            known = list(settings_class.model_fields)
            close = difflib.get_close_matches(field, known, n=1)
            source = where
            message = "unknown setting" + (f"; did you mean {close[0]!r}?" if close else "")
        else:
            source = where
        detail = ""
        # A model-level error's input is every value given, secrets included: not shown.
        if (
            "input" in error
            and field in settings_class.model_fields
            and error.get("type") not in ("missing", "extra_forbidden")
        ):
            shown = error["input"]
            shown = MASK if _secret_field(settings_class, field) else mask_value(field, shown)
            detail = f" [got {shown!r}]"
        lines.append(f"  {source}: {message}{detail}")
    return "\n".join(lines)


def _secret_field(settings_class: type[RegionBusSettings], field: str) -> bool:
    """Whether a field holds a secret by its type (``SecretStr``) or its name."""
    info = settings_class.model_fields.get(field)
    return is_secret_name(field) or (info is not None and "SecretStr" in repr(info.annotation))


_SETTINGS_ERROR_FIELD = re.compile(r'field "([^"]+)"')


def describe_settings_error(settings_class: type[RegionBusSettings], exc: SettingsError) -> str:
    """A readable account of a value a settings source could not parse.

    Args:
        settings_class: The class being loaded.
        exc: pydantic-settings' error (its message names the field).

    Returns:
        ``"invalid <section> configuration:"`` then the field, its environment variable and
        what the value must be.
    """
    section = settings_class.config_section or settings_class.__name__
    found = _SETTINGS_ERROR_FIELD.search(str(exc))
    field = found.group(1) if found else ""
    if field in settings_class.model_fields:
        where = f"{field} (env {settings_class.env_name(field)})"
        message = 'not valid JSON; list and dict settings are JSON, e.g. ["r1", "r2"]'
    else:
        where, message = "(settings)", mask_text(str(exc))
    return f"invalid {section} configuration:\n  {where}: {message}"


def _old_env_fields(settings_cls: type[RegionBusSettings]) -> dict[str, str]:
    return {settings_cls._prefixed_env_name(field): field for field in settings_cls.env_renamed}


class _RenamedEnvSource(EnvSettingsSource):
    """The environment, where a renamed field (:attr:`RegionBusSettings.env_renamed`) is
    read from its new variable, else from its older one with a warning."""

    def __init__(self, settings_cls: type[RegionBusSettings]) -> None:
        super().__init__(settings_cls)
        self._renamed = settings_cls.env_renamed
        self._prefixed = settings_cls._prefixed_env_name

    def _env(self, name: str) -> str | None:
        return self.env_vars.get(name if self.case_sensitive else name.lower())

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        new = self._renamed.get(field_name)
        if new is None:
            return super().get_field_value(field, field_name)
        is_complex = self.field_is_complex(field)
        value = self._env(new)
        if value is None:
            old = self._prefixed(field_name)
            value = self._env(old)
            if value is not None:
                _log.warning("environment variable %s is deprecated: set %s instead", old, new)
        return value, field_name, is_complex


class _FileSource(PydanticBaseSettingsSource):
    """The ``REGIONBUS_CONFIG_FILE`` file's values for one settings class."""

    def __init__(self, settings_cls: type[RegionBusSettings], path: Path) -> None:
        super().__init__(settings_cls)
        self._values = self.read(settings_cls, path)

    @staticmethod
    def read(settings_cls: type[RegionBusSettings], path: Path) -> dict[str, Any]:
        """The file's values for ``settings_cls`` (its table, or its env names).

        Raises:
            ConfigurationError: the file is missing or malformed, or has unknown keys.
        """
        if not path.is_file():
            raise ConfigurationError(f"{CONFIG_FILE_ENV}={path}: no such file")
        suffix = path.suffix.lower()
        section = settings_cls.config_section
        if suffix not in (".toml", ".yaml", ".yml"):
            return _dotenv_values(settings_cls, path)
        try:
            text = path.read_text(encoding="utf-8")
            whole = tomllib.loads(text) if suffix == ".toml" else yaml.safe_load(text) or {}
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
            raise ConfigurationError(f"{CONFIG_FILE_ENV}={path}: unreadable: {exc}") from exc
        if not isinstance(whole, dict):
            raise ConfigurationError(f"{path}: expected tables of settings")
        unknown_tables = sorted(set(whole) - set(SECTIONS))
        if unknown_tables:
            raise ConfigurationError(
                f"{path}: unknown tables {unknown_tables}; expected some of {sorted(SECTIONS)}"
            )
        values = whole.get(section) or {}
        if not isinstance(values, dict):
            raise ConfigurationError(f"{path}: [{section}] must be a table")
        unknown = sorted(set(values) - set(settings_cls.model_fields))
        if unknown:
            hints = []
            for key in unknown:
                close = difflib.get_close_matches(key, list(settings_cls.model_fields), n=1)
                hints.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
            raise ConfigurationError(f"{path}: unknown keys in [{section}]: {', '.join(hints)}")
        return dict(values)

    @classmethod
    def keys_in(cls, settings_cls: type[RegionBusSettings], path: Path | None) -> set[str]:
        """Field names the file sets for ``settings_cls`` (empty without a file)."""
        if path is None:
            return set()
        return set(cls.read(settings_cls, path))

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return self._values.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self._values)


def _dotenv_values(settings_cls: type[RegionBusSettings], path: Path) -> dict[str, Any]:
    """Values of a dotenv file for ``settings_cls``; unknown ``REGIONBUS_*`` names raise."""
    try:
        read = DotEnvSettingsSource(settings_cls, env_file=path)()
    except (ValueError, OSError) as exc:
        raise ConfigurationError(f"{CONFIG_FILE_ENV}={path}: unreadable: {exc}") from exc
    known = {env.lower() for env in known_env_names()}
    fields = set(settings_cls.model_fields)
    unknown = sorted(
        key.upper()
        for key in read
        if key not in fields and key.startswith("regionbus_") and key not in known
    )
    if unknown:
        raise ConfigurationError(f"{path}: unknown variables {unknown}")
    values = {key: value for key, value in read.items() if key in fields}
    if settings_cls.env_renamed:
        # pydantic-settings reads a renamed field's older name only: read its new one too
        named = {k.lower(): v for k, v in dotenv_values(path).items() if v is not None}
        for field, env in settings_cls.env_renamed.items():
            if env.lower() in named:
                values[field] = named[env.lower()]
            elif field in values:
                old = settings_cls._prefixed_env_name(field)
                _log.warning("%s: variable %s is deprecated: set %s instead", path, old, env)
    return values


SECTIONS: dict[str, str] = {
    "server": "regionbus.broker.config:ServerSettings",
    "client": "regionbus.clients.settings:ClientSettings",
    "gateway_sender": "regionbus.gateways.sender_settings:GatewaySenderSettings",
    "gateway_receiver": "regionbus.gateways.receiver:GatewayReceiverSettings",
    "async_event_queue": "regionbus.gateways.async_event_queue:AsyncEventQueueSettings",
    "gateway_repair": "regionbus.gateways.repair_settings:GatewayRepairSettings",
}
"""Every process kind: its file table and its settings class (imported when needed)."""


def settings_class(section: str) -> type[RegionBusSettings]:
    """The settings class of a process kind (a key of :data:`SECTIONS`).

    Raises:
        ConfigurationError: ``section`` is not a process kind.
    """
    import importlib

    try:
        target = SECTIONS[section]
    except KeyError:
        raise ConfigurationError(
            f"unknown process kind {section!r}; expected one of {sorted(SECTIONS)}"
        ) from None
    module_name, _, attribute = target.partition(":")
    cls: type[RegionBusSettings] = getattr(importlib.import_module(module_name), attribute)
    return cls


def all_settings_classes() -> Iterator[type[RegionBusSettings]]:
    """Every process kind's settings class, in :data:`SECTIONS` order."""
    for section in SECTIONS:
        yield settings_class(section)


def known_env_names() -> set[str]:
    """Every ``REGIONBUS_*`` variable some process kind reads: each settings field's, the
    older names of renamed ones (:meth:`RegionBusSettings.deprecated_env_names`), and
    ``REGIONBUS_CONFIG_FILE``."""
    known = {CONFIG_FILE_ENV}
    for cls in all_settings_classes():
        known |= set(cls.env_names()) | set(cls.deprecated_env_names())
    return known


def unknown_environment(environ: Mapping[str, str] | None = None) -> list[str]:
    """``REGIONBUS_*`` environment variables no process kind reads, each with a hint.

    Unknown variables are not errors in the environment (other tools may share the
    prefix), so processes log these at start and ``regionbus config show`` prints them.

    Args:
        environ: The environment to check; None checks ``os.environ``.

    Returns:
        One line per unknown variable, e.g.
        ``"REGIONBUS_NAMSPACE (did you mean REGIONBUS_NAMESPACE?)"``, sorted.
    """
    environ = os.environ if environ is None else environ
    known = known_env_names()
    lines = []
    for name in sorted(environ):
        if name.upper().startswith("REGIONBUS_") and name.upper() not in known:
            close = difflib.get_close_matches(name.upper(), sorted(known), n=1)
            lines.append(name + (f" (did you mean {close[0]}?)" if close else ""))
    return lines


class KafkaConnectionSettings(RegionBusSettings):
    """The Kafka connection of a process, with typed security settings.

    Attributes:
        kafka_bootstrap_servers: Kafka ``bootstrap.servers``, e.g. ``"127.0.0.1:9092"``.
        kafka_security_protocol: librdkafka ``security.protocol``; None leaves librdkafka's
            default (``plaintext``).
        kafka_sasl_mechanism: ``sasl.mechanism``; needs a ``SASL_*`` protocol.
        kafka_sasl_username: ``sasl.username`` (PLAIN and SCRAM).
        kafka_sasl_password: ``sasl.password``, kept secret.
        kafka_ssl_ca_location: ``ssl.ca.location``: CA bundle (PEM path) to verify brokers.
        kafka_ssl_certificate_location: ``ssl.certificate.location``: client certificate
            (PEM path) for mutual TLS.
        kafka_ssl_key_location: ``ssl.key.location``: its private key (PEM path).
        kafka_ssl_key_password: ``ssl.key.password``, kept secret.
        kafka_ssl_endpoint_identification_algorithm: ``https`` (verify the broker's host
            name, librdkafka's default) or ``none``.
        kafka_config: Any further librdkafka settings, passed through unchanged. A key that
            a typed field above also sets is an error, and so is
            ``allow.auto.create.topics=true`` (`regionbus.schemas.kafka_clients`).
    """

    kafka_bootstrap_servers: str = "127.0.0.1:9092"
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] | None = None
    kafka_sasl_mechanism: (
        Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER", "GSSAPI"] | None
    ) = None
    kafka_sasl_username: str | None = None
    kafka_sasl_password: SecretStr | None = None
    kafka_ssl_ca_location: Path | None = None
    kafka_ssl_certificate_location: Path | None = None
    kafka_ssl_key_location: Path | None = None
    kafka_ssl_key_password: SecretStr | None = None
    kafka_ssl_endpoint_identification_algorithm: Literal["https", "none"] | None = None
    kafka_config: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _kafka_security_consistent(self) -> Self:
        protocol = (
            self.kafka_security_protocol
            or str(self.kafka_config.get("security.protocol", "PLAINTEXT")).upper()
        )
        if self.kafka_sasl_mechanism and not protocol.startswith("SASL_"):
            raise ValueError(
                f"kafka_sasl_mechanism {self.kafka_sasl_mechanism} needs "
                f"kafka_security_protocol SASL_PLAINTEXT or SASL_SSL, not {protocol}"
            )
        if self.kafka_sasl_mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512") and not (
            self.kafka_sasl_username and self.kafka_sasl_password
        ):
            raise ValueError(
                f"SASL {self.kafka_sasl_mechanism} needs kafka_sasl_username and "
                "kafka_sasl_password"
            )
        for name in (
            "kafka_ssl_ca_location",
            "kafka_ssl_certificate_location",
            "kafka_ssl_key_location",
        ):
            path = getattr(self, name)
            if path is not None and not path.is_file():
                raise ValueError(f"{name}: no such file {path}")
        if (self.kafka_ssl_certificate_location is None) != (self.kafka_ssl_key_location is None):
            raise ValueError(
                "kafka_ssl_certificate_location and kafka_ssl_key_location go together"
            )
        typed = {LIBRDKAFKA_KEYS[name] for name in self.model_fields_set if name in LIBRDKAFKA_KEYS}
        clash = sorted(typed & set(self.kafka_config))
        if clash:
            raise ValueError(f"kafka_config sets {clash}, which typed kafka_* fields also set")
        try:
            client_config(self.kafka_config)
        except ConfigurationError as exc:
            raise ValueError(str(exc)) from None
        return self

    def kafka_connection(self) -> dict[str, Any]:
        """The ``kafka_*`` field values, to configure another process kind's settings (e.g.
        the :class:`clients.ClientSettings` a gateway receiver applies batches with) for the
        same Kafka."""
        return {name: getattr(self, name) for name in KafkaConnectionSettings.model_fields}

    def librdkafka(self, **overrides: Any) -> dict[str, Any]:
        """The librdkafka configuration every Kafka client of this process starts from.

        Args:
            **overrides: librdkafka keys to set on top (pass dotted keys via ``**{...}``).

        Returns:
            ``bootstrap.servers``, the typed security settings that are set (mapped by
            :data:`LIBRDKAFKA_KEYS`), :attr:`kafka_config`, then the overrides, with
            ``allow.auto.create.topics=false`` (`regionbus.schemas.kafka_clients.client_config`:
            regionbus creates every topic itself, with its partition count and retention).

        Raises:
            ConfigurationError: an override asks for topic auto-creation.
        """
        config: dict[str, Any] = {}
        for name, key in LIBRDKAFKA_KEYS.items():
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, SecretStr):
                value = value.get_secret_value()
            config[key] = str(value)
        config.update(self.kafka_config)
        config.update(overrides)
        return client_config(config)


__all__ = [
    "CONFIG_FILE_ENV",
    "LIBRDKAFKA_KEYS",
    "MASK",
    "SECTIONS",
    "KafkaConnectionSettings",
    "RegionBusSettings",
    "all_settings_classes",
    "config_file",
    "describe_validation_error",
    "known_env_names",
    "mask_url",
    "settings_class",
    "unknown_environment",
]
