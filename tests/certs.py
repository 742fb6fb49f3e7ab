"""Certificates for the TLS tests, made with `cryptography`: one CA, a server certificate for
127.0.0.1 and localhost, a client certificate, each key written as PEM (the server's also
encrypted, with its password in a file, as operators keep it)."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

KEY_PASSWORD = "kiln-test-key-password"


@dataclass(frozen=True, slots=True)
class TlsMaterial:
    ca_file: Path
    server_certificate_file: Path
    server_key_file: Path
    server_encrypted_key_file: Path
    server_key_password_file: Path
    client_certificate_file: Path
    client_key_file: Path
    other_ca_file: Path  # a CA that signed none of these


def make_tls_material(directory: Path) -> TlsMaterial:
    ca_key, ca = _ca("Kiln test CA")
    other_key, other = _ca("Some other CA")
    del other_key
    server_key, server = _leaf(ca_key, ca, "kiln-test-server", server=True)
    client_key, client = _leaf(ca_key, ca, "kiln-test-client", server=False)
    paths = TlsMaterial(*(directory / name for name in (
        "ca.pem", "server.pem", "server.key", "server-encrypted.key", "server-key-password",
        "client.pem", "client.key", "other-ca.pem")))
    paths.ca_file.write_bytes(_pem(ca))
    paths.other_ca_file.write_bytes(_pem(other))
    paths.server_certificate_file.write_bytes(_pem(server) + _pem(ca))
    paths.server_key_file.write_bytes(_key(server_key, None))
    paths.server_encrypted_key_file.write_bytes(_key(server_key, KEY_PASSWORD))
    paths.server_key_password_file.write_text(KEY_PASSWORD + "\n")
    paths.client_certificate_file.write_bytes(_pem(client))
    paths.client_key_file.write_bytes(_key(client_key, None))
    return paths


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Kiln tests"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _validity(builder: x509.CertificateBuilder) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return builder.not_valid_before(now - datetime.timedelta(hours=1)).not_valid_after(
        now + datetime.timedelta(days=2))


def _ca(common_name: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    builder = _validity(x509.CertificateBuilder()
                        .subject_name(_name(common_name)).issuer_name(_name(common_name))
                        .public_key(key.public_key()).serial_number(x509.random_serial_number())
                        .add_extension(x509.BasicConstraints(ca=True, path_length=0),
                                       critical=True)
                        .add_extension(x509.KeyUsage(
                            digital_signature=True, key_cert_sign=True, crl_sign=True,
                            content_commitment=False, key_encipherment=False,
                            data_encipherment=False, key_agreement=False, encipher_only=False,
                            decipher_only=False), critical=True))
    return key, builder.sign(key, hashes.SHA256())


def _leaf(ca_key: ec.EllipticCurvePrivateKey, ca: x509.Certificate, common_name: str, *,
          server: bool) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = _validity(x509.CertificateBuilder()
                        .subject_name(_name(common_name)).issuer_name(ca.subject)
                        .public_key(key.public_key()).serial_number(x509.random_serial_number())
                        .add_extension(x509.BasicConstraints(ca=False, path_length=None),
                                       critical=True)
                        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False))
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName([
            x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False)
    return key, builder.sign(ca_key, hashes.SHA256())


def _pem(certificate: x509.Certificate) -> bytes:
    return certificate.public_bytes(serialization.Encoding.PEM)


def _key(key: ec.EllipticCurvePrivateKey, password: str | None) -> bytes:
    encryption: serialization.KeySerializationEncryption = (
        serialization.NoEncryption() if password is None
        else serialization.BestAvailableEncryption(password.encode()))
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             encryption)
