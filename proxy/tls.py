"""TLS for the Kafka listener: the server context an SSL listener serves with.

TLS 1.2 or later only (as Kafka's `ssl.enabled.protocols` default since 3.x leaves 1.0 and 1.1
out), no TLS compression, the certificate chain and key from PEM files. With client
authentication "requested" or "required" (Kafka's `ssl.client.auth`) clients are asked for
a certificate, checked against the given CAs; "required" refuses a client that sends none.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass

CLIENT_AUTH = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL,
               "required": ssl.CERT_REQUIRED}


@dataclass(frozen=True, slots=True)
class TlsFiles:
    certificate_file: str  # PEM: the server certificate, then its chain
    key_file: str  # PEM private key
    key_password: str | None = None  # for an encrypted key
    ca_file: str = ""  # PEM CAs that sign client certificates
    client_auth: str = "none"  # none, requested or required


class TlsConfigError(ValueError):
    """The files do not make a usable server context; the message names which and why."""


def server_context(files: TlsFiles) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.options |= ssl.OP_NO_COMPRESSION
    try:
        context.load_cert_chain(files.certificate_file, files.key_file, files.key_password)
    except (OSError, ssl.SSLError) as exc:
        # OpenSSL says no more than "PEM lib" for an encrypted key it cannot open.
        hint = " (the key's password?)" if isinstance(exc, ssl.SSLError) else ""
        raise TlsConfigError(f"certificate {files.certificate_file} with key "
                             f"{files.key_file}: {exc}{hint}") from exc
    if files.client_auth not in CLIENT_AUTH:
        raise TlsConfigError(f"client authentication: one of {', '.join(CLIENT_AUTH)}, got "
                             f"{files.client_auth!r}")
    context.verify_mode = CLIENT_AUTH[files.client_auth]
    if files.ca_file:
        try:
            context.load_verify_locations(cafile=files.ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise TlsConfigError(f"CA file {files.ca_file}: {exc}") from exc
    elif context.verify_mode != ssl.CERT_NONE:
        raise TlsConfigError("client authentication needs the CAs that sign client "
                             "certificates")
    return context
