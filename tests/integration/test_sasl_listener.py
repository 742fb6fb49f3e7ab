"""SASL listeners (`SASL_PLAINTEXT`, `SASL_SSL`): real clients log in with SCRAM-SHA-256,
SCRAM-SHA-512 and PLAIN as users `kiln users` made, and produce and consume; a wrong
password, an unknown user or a disabled mechanism gets Kafka's error and nothing; a client
that skips authentication, sends too much before it, or never finishes it is closed with
nothing stored."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from storage.security.credentials import CredentialStore
from tests.certs import TlsMaterial, make_tls_material
from tests.integration.test_tls_listener import (
    consume_with_librdkafka,
    expected,
    produce_and_consume_with_kafka_python,
    produce_and_consume_with_librdkafka,
)
from tests.kiln_harness import RunningKiln, fresh_kiln
from tests.raw_client import record_batch
from wire.sasl.scram import SCRAM_MECHANISMS, derive_credential

pytestmark = pytest.mark.integration

USER, PASSWORD = "alice", "alice-secret"


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsMaterial:
    return make_tls_material(tmp_path_factory.mktemp("tls"))


def add_user(kiln: RunningKiln, user: str, password: str,
             mechanisms: tuple[str, ...] = tuple(SCRAM_MECHANISMS)) -> None:
    store = CredentialStore(kiln.app.queue.redis)

    async def add() -> None:
        for name in mechanisms:
            await store.put(user, name, derive_credential(SCRAM_MECHANISMS[name], password))
    kiln.call(add())


@pytest.fixture
def sasl_kiln(redis_url: str, kafka_bootstrap: str, tls: TlsMaterial) -> Iterator[RunningKiln]:
    with fresh_kiln(redis_url, kafka_bootstrap,
                    listeners="SASL_PLAINTEXT://127.0.0.1:0,SASL_SSL://127.0.0.1:0",
                    sasl_enabled_mechanisms="SCRAM-SHA-256,SCRAM-SHA-512,PLAIN",
                    ssl_certificate_file=str(tls.server_certificate_file),
                    ssl_key_file=str(tls.server_key_file),
                    authentication_timeout_ms=1_000) as kiln:
        add_user(kiln, USER, PASSWORD)
        yield kiln


def librdkafka_sasl(kiln: RunningKiln, mechanism: str, password: str = PASSWORD,
                    user: str = USER, listener: str = "SASL_PLAINTEXT",
                    **extra: str) -> dict[str, str]:
    return {"bootstrap.servers": f"127.0.0.1:{kiln.app.listener_port(listener)}",
            "security.protocol": listener, "sasl.mechanism": mechanism,
            "sasl.username": user, "sasl.password": password, **extra}


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"])
def test_librdkafka_logs_in_produces_and_consumes(sasl_kiln: RunningKiln, unique_topic: str,
                                                  mechanism: str) -> None:
    config = librdkafka_sasl(sasl_kiln, mechanism)
    assert produce_and_consume_with_librdkafka(config, unique_topic) == expected()


def test_scram_over_tls(sasl_kiln: RunningKiln, tls: TlsMaterial, unique_topic: str) -> None:
    config = librdkafka_sasl(sasl_kiln, "SCRAM-SHA-512", listener="SASL_SSL",
                             **{"ssl.ca.location": str(tls.ca_file)})
    assert produce_and_consume_with_librdkafka(config, unique_topic) == expected()


def test_kafka_python_logs_in_with_scram(sasl_kiln: RunningKiln, unique_topic: str) -> None:
    common: dict[str, Any] = {
        "bootstrap_servers": f"127.0.0.1:{sasl_kiln.app.listener_port('SASL_PLAINTEXT')}",
        "security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-256",
        "sasl_plain_username": USER, "sasl_plain_password": PASSWORD}
    assert produce_and_consume_with_kafka_python(common, unique_topic) == expected()


def login_fails(config: dict[str, str]) -> str:
    """The error a producer's first request meets, as librdkafka reports it."""
    errors: list[str] = []
    producer = Producer({**config, "error_cb": lambda err: errors.append(str(err)),
                         "reconnect.backoff.max.ms": 1000})
    deadline = time.monotonic() + 15
    while not any("Authentication failed" in e or "Unsupported SASL mechanism" in e
                  for e in errors) and time.monotonic() < deadline:
        producer.poll(0.2)
    return "\n".join(errors)


@pytest.mark.parametrize(("change", "mechanism"), [
    ({"password": "wrong"}, "SCRAM-SHA-256"),
    ({"user": "mallory"}, "SCRAM-SHA-512"),
    ({"password": "wrong"}, "PLAIN"),
    ({"user": "mallory"}, "PLAIN"),
])
def test_a_wrong_password_or_unknown_user_is_refused_alike(
        sasl_kiln: RunningKiln, change: dict[str, str], mechanism: str) -> None:
    errors = login_fails(librdkafka_sasl(sasl_kiln, mechanism, **change))
    # Kafka's words (PlainSaslServer's own for PLAIN), the same whether the user exists or not
    assert ("Authentication failed: Invalid username or password" if mechanism == "PLAIN"
            else "Authentication failed during authentication due to invalid credentials "
                 f"with SASL mechanism {mechanism}") in errors


def test_a_disabled_mechanism_is_refused_naming_the_enabled_ones(
        redis_url: str, kafka_bootstrap: str) -> None:
    with fresh_kiln(redis_url, kafka_bootstrap, listeners="SASL_PLAINTEXT://127.0.0.1:0",
                    sasl_enabled_mechanisms="SCRAM-SHA-512") as kiln:
        add_user(kiln, USER, PASSWORD)
        errors = login_fails(librdkafka_sasl(kiln, "PLAIN"))
    assert "Unsupported SASL mechanism: broker's supported mechanisms: SCRAM-SHA-512" in errors


def raw_connection(kiln: RunningKiln) -> socket.socket:
    return socket.create_connection(("127.0.0.1", kiln.app.listener_port("SASL_PLAINTEXT")),
                                    timeout=10)


def request_frame(api_key: int, version: int, body: bytes) -> bytes:
    client_id = b"raw"
    header = struct.pack(">hhih", api_key, version, 7, len(client_id)) + client_id
    return struct.pack(">i", len(header) + len(body)) + header + body


def produce_v3_body(topic: str, records: bytes) -> bytes:
    name = topic.encode()
    return (struct.pack(">h", -1) + struct.pack(">hi", -1, 30_000) + struct.pack(">i", 1)
            + struct.pack(">h", len(name)) + name + struct.pack(">i", 1)
            + struct.pack(">ii", 0, len(records)) + records)


def closed_without_answer(raw: socket.socket) -> bool:
    received = b""
    while chunk := raw.recv(4096):
        received += chunk
    return received == b""


def topics_of(kiln: RunningKiln) -> set[str]:
    config = librdkafka_sasl(kiln, "SCRAM-SHA-256")
    return set(AdminClient(config).list_topics(timeout=10).topics)


def test_a_produce_before_authentication_is_closed_unanswered_and_stores_nothing(
        sasl_kiln: RunningKiln, unique_topic: str) -> None:
    with raw_connection(sasl_kiln) as raw:
        raw.sendall(request_frame(0, 3, produce_v3_body(unique_topic, record_batch([b"x"]))))
        assert closed_without_answer(raw)
    assert unique_topic not in topics_of(sasl_kiln)


def test_a_large_frame_before_authentication_is_refused_from_its_size(
        sasl_kiln: RunningKiln) -> None:
    with raw_connection(sasl_kiln) as raw:
        # A size prefix of 1 MB (the pre-authentication limit is 512 KiB): nothing more sent
        raw.sendall(struct.pack(">i", 1 << 20))
        assert closed_without_answer(raw)


def test_a_client_that_does_not_authenticate_in_time_is_closed(sasl_kiln: RunningKiln) -> None:
    with raw_connection(sasl_kiln) as raw:
        # (authentication_timeout_ms is 1 s here; ApiVersions alone does not authenticate)
        raw.sendall(request_frame(18, 0, b""))
        answer = raw.recv(4)
        assert len(answer) == 4
        raw.settimeout(20)
        while raw.recv(4096):
            pass  # the rest of the ApiVersions answer, then the close


def test_consuming_needs_a_login_too(sasl_kiln: RunningKiln, unique_topic: str) -> None:
    # Given records produced by a logged-in client
    config = librdkafka_sasl(sasl_kiln, "SCRAM-SHA-256")
    assert produce_and_consume_with_librdkafka(config, unique_topic) == expected()
    # When a client with a wrong password tries to read them for 5 s, it gets none
    wrong = librdkafka_sasl(sasl_kiln, "SCRAM-SHA-256", password="wrong")
    assert consume_with_librdkafka(wrong, unique_topic, f"thief-{unique_topic}",
                                   polls=10) == []

