"""Which configuration values are secrets, and how they are shown: masked, everywhere.

A secret is recognised three ways, so that no single oversight prints one:

1. by type: a pydantic :class:`SecretStr` field is always masked;
2. by name: a setting or librdkafka key in :data:`SECRET_LIBRDKAFKA_KEYS`, or whose name
   says it holds a secret (``password``, ``secret``, ``passphrase``, ``private key``...);
   names compare with ``_`` and ``.`` alike, so ``ssl_key_pem`` is ``ssl.key.pem``;
3. by content: a PEM private key block, and the password of a URL's user-info or of a
   ``password=`` query parameter (``redis://:pw@host``, ``redis://host?password=pw``).

Settings views (``config show``, ``serve``'s effective-configuration line) and validation
errors go through :func:`mask_value` / :func:`mask_text`.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from pydantic import SecretStr

MASK: Final = "********"
"""What is shown instead of a secret."""

SECRET_LIBRDKAFKA_KEYS: Final = frozenset(
    {
        "sasl.password",
        "sasl.oauthbearer.config",
        "sasl.oauthbearer.client.secret",
        "sasl.oauthbearer.assertion.private.key.pem",
        "sasl.oauthbearer.assertion.private.key.passphrase",
        "ssl.key.password",
        "ssl.key.pem",
        "ssl_key",
        "ssl.keystore.password",
        # Java client keys, which Spark's Kafka source passes through (``kafka.`` options).
        "sasl.jaas.config",
        "ssl.truststore.password",
        "ssl.keystore.key",
    }
)
"""librdkafka properties that carry a secret (librdkafka CONFIGURATION.md: passwords, the
PEM private key, OAUTHBEARER client secret and config), plus the Java client's."""

_SECRET_NAME = re.compile(
    r"password|passwd|secret|passphrase|jaas|token|credential|private.?key|api.?key",
    re.IGNORECASE,
)
_PEM_PRIVATE_KEY = re.compile(
    r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(-----END [A-Z ]*PRIVATE KEY-----|\Z)", re.DOTALL
)
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")
_SECRET_QUERY = re.compile(r"pass|secret|token", re.IGNORECASE)
_USERINFO_PASSWORD = re.compile(r"(//[^/\s:@'\"]*:)[^@\s/'\"]+@")
"""``//user:password@`` in text that is not a well-formed URL (``redis//u:pw@host``)."""


def _normal(name: str) -> str:
    return name.strip().lower().replace("_", ".")


_SECRET_KEYS_NORMAL: Final = frozenset(_normal(k) for k in SECRET_LIBRDKAFKA_KEYS)


def is_secret_name(name: str) -> bool:
    """Whether a setting or librdkafka key holds a secret, by its name.

    Args:
        name: A field name (``kafka_sasl_password``), a librdkafka key (``ssl.key.pem``) or
            an environment variable name.

    Returns:
        True for the keys of :data:`SECRET_LIBRDKAFKA_KEYS` (any of ``_`` / ``.``, any case,
        also as the tail of a longer name such as ``kafka_ssl_key_pem``) and for names
        that say password, secret, passphrase, token, credential or private key.
    """
    normal = _normal(name)
    if _SECRET_NAME.search(normal):
        return True
    return any(normal == key or normal.endswith("." + key) for key in _SECRET_KEYS_NORMAL)


def mask_url(url: str) -> str:
    """``url`` with the password of its user-info part and any password-like query
    parameter replaced by :data:`MASK`; anything that does not parse is returned as is."""
    try:
        parts = urlsplit(url)
        password = parts.password
        hostname, port = parts.hostname, parts.port
    except ValueError:
        return url
    if password is not None:
        host = hostname or ""
        if port is not None:
            host = f"{host}:{port}"
        parts = parts._replace(netloc=f"{parts.username or ''}:{MASK}@{host}")
    if parts.query and _SECRET_QUERY.search(parts.query):
        pairs = parse_qsl(parts.query, keep_blank_values=True)
        query = urlencode([(k, MASK if _SECRET_QUERY.search(k) else v) for k, v in pairs])
        parts = parts._replace(query=query.replace("%2A", "*"))
    return urlunsplit(parts)


def mask_text(text: str) -> str:
    """Free text (an error message, a log line) with every URL password and PEM private key
    in it masked."""
    text = _PEM_PRIVATE_KEY.sub(MASK, text)
    text = _URL.sub(lambda m: mask_url(m.group(0)), text)
    return _USERINFO_PASSWORD.sub(lambda m: m.group(1) + MASK + "@", text)


def mask_value(name: str, value: Any) -> Any:
    """A settings value as JSON-able data with its secrets masked.

    Args:
        name: The field or key it is the value of (decides secrecy by name).
        value: Any settings value: str, number, Path, SecretStr, enum, list, dict, pydantic
            model.

    Returns:
        :data:`MASK` for a secret (by type or name, when set); otherwise the value with
        secrets inside it (dict entries, URLs, PEM keys) masked. None stays None.
    """
    if value is None:
        return None
    if isinstance(value, SecretStr) or (is_secret_name(name) and not isinstance(value, bool)):
        return MASK
    if isinstance(value, Mapping):
        return {str(k): mask_value(str(k), v) for k, v in value.items()}
    if isinstance(value, str):
        return mask_text(value)
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, list | tuple | set | frozenset):
        return [mask_value(name, v) for v in value]
    if hasattr(value, "model_dump"):
        return mask_value(name, value.model_dump(mode="python"))
    if isinstance(value, enum.Enum):
        # e.g. an ExpirationAction inside region_expiration: JSON takes its value only.
        return mask_value(name, value.value)
    return value


__all__ = [
    "MASK",
    "SECRET_LIBRDKAFKA_KEYS",
    "is_secret_name",
    "mask_text",
    "mask_url",
    "mask_value",
]
