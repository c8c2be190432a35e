"""The client side of request signing: a :class:`regionbus.schemas.signing.Signer` from settings."""

from __future__ import annotations

from regionbus.clients.settings import ClientSettings
from regionbus.schemas.errors import ConfigurationError
from regionbus.schemas.signing import Signer


def signer_for(settings: ClientSettings) -> Signer | None:
    """The signer of a client's requests, or None when no principal is configured.

    Args:
        settings: The client's settings (``security_principal``, ``security_secret``).

    Returns:
        A signer whose key is derived from the secret (PBKDF2, once), or None.

    Raises:
        ConfigurationError: a principal without a secret, or a secret without a principal.
    """
    principal, secret = settings.security_principal, settings.security_secret
    if principal is None and secret is None:
        return None
    if principal is None or secret is None or not secret.get_secret_value():
        raise ConfigurationError("security_principal and security_secret go together")
    return Signer.from_secret(settings.namespace, principal, secret.get_secret_value())


__all__ = ["signer_for"]
