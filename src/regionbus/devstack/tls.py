"""PEM files of a TLS server (and optionally a client), shared by the secured Redis and
Kafka of the local stack."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple


class TlsFiles(NamedTuple):
    """PEM files of a TLS server.

    Attributes:
        ca_cert: CA certificate that signed the server's (and clients') certificates.
        server_cert: The server certificate (for ``127.0.0.1``).
        server_key: Its private key (unencrypted PKCS#8, as Kafka's PEM key store reads).
        client_cert: A client certificate for mutual TLS, or None to not require one.
        client_key: Its private key.
    """

    ca_cert: Path
    server_cert: Path
    server_key: Path
    client_cert: Path | None = None
    client_key: Path | None = None


__all__ = ["TlsFiles"]
