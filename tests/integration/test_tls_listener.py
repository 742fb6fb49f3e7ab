"""An SSL listener (`listeners = "SSL://HOST:PORT"`): real clients produce and consume over
TLS 1.2+, client certificates are asked for when configured, and what is not TLS, not TLS
1.2+, or never finishes its handshake is dropped without harming anyone else."""

from __future__ import annotations

import socket
import ssl
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KafkaPythonPartition

from cli.app import StartupError
from tests.certs import TlsMaterial, make_tls_material
from tests.kiln_harness import RunningKiln, eventually, fresh_kiln, start_kiln

pytestmark = [pytest.mark.integration,
              # The test clients name TLS 1.0 and 1.1 on purpose.
              pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1:DeprecationWarning")]

RECORDS = 50


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsMaterial:
    return make_tls_material(tmp_path_factory.mktemp("tls"))


def ssl_settings(tls: TlsMaterial, **overrides: Any) -> dict[str, Any]:
    return {"listeners": "SSL://127.0.0.1:0",
            "ssl_certificate_file": str(tls.server_certificate_file),
            "ssl_key_file": str(tls.server_key_file), **overrides}


@pytest.fixture
def ssl_kiln(redis_url: str, kafka_bootstrap: str, tls: TlsMaterial) -> Iterator[RunningKiln]:
    with fresh_kiln(redis_url, kafka_bootstrap, **ssl_settings(tls)) as kiln:
        yield kiln


def librdkafka_tls(kiln: RunningKiln, ca: Path, **extra: str) -> dict[str, str]:
    return {"bootstrap.servers": kiln.bootstrap, "security.protocol": "SSL",
            "ssl.ca.location": str(ca), **extra}


def produce_and_consume_with_librdkafka(config: dict[str, str], topic: str) -> list[bytes]:
    producer = Producer(config)
    for i in range(RECORDS):
        producer.produce(topic, f"r{i}".encode(), partition=0)
    assert producer.flush(30) == 0
    return consume_with_librdkafka(config, topic, f"g-{topic}")


def consume_with_librdkafka(config: dict[str, str], topic: str, group: str,
                            polls: int = 200) -> list[bytes]:
    """The values of RECORDS records of `topic`, read from the start by a new group (giving
    up after `polls` half-second polls)."""
    consumer = Consumer({**config, "group.id": group, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    consumer.subscribe([topic])
    values: list[bytes] = []
    try:
        for _ in range(polls):
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                values.append(message.value())
            if len(values) >= RECORDS:
                break
    finally:
        consumer.close()
    return values


def expected() -> list[bytes]:
    return [f"r{i}".encode() for i in range(RECORDS)]


def test_librdkafka_produces_and_consumes_over_tls(ssl_kiln: RunningKiln, tls: TlsMaterial,
                                                   unique_topic: str) -> None:
    config = librdkafka_tls(ssl_kiln, tls.ca_file)
    assert produce_and_consume_with_librdkafka(config, unique_topic) == expected()


def test_kafka_python_produces_and_consumes_over_tls(ssl_kiln: RunningKiln, tls: TlsMaterial,
                                                     unique_topic: str) -> None:
    common = {"bootstrap_servers": ssl_kiln.bootstrap, "security_protocol": "SSL",
              "ssl_cafile": str(tls.ca_file)}
    assert produce_and_consume_with_kafka_python(common, unique_topic) == expected()


def produce_and_consume_with_kafka_python(common: dict[str, Any], topic: str) -> list[bytes]:
    """RECORDS records produced to partition 0 of `topic` by kafka-python with the client
    settings `common`, then the values read back from offset 0."""
    producer = KafkaProducer(**common)
    for i in range(RECORDS):
        producer.send(topic, f"r{i}".encode(), partition=0)
    producer.flush(30)
    producer.close()
    consumer = KafkaConsumer(**common, auto_offset_reset="earliest", enable_auto_commit=False,
                             consumer_timeout_ms=15_000)
    consumer.assign([KafkaPythonPartition(topic, 0)])
    values = [record.value for _, record in zip(range(RECORDS), consumer, strict=False)]
    consumer.close()
    return values


def test_a_client_that_does_not_trust_the_certificate_gets_nothing_and_others_go_on(
        ssl_kiln: RunningKiln, tls: TlsMaterial, unique_topic: str) -> None:
    # When a client checks Kiln's certificate against a CA that did not sign it
    stranger = AdminClient(librdkafka_tls(ssl_kiln, tls.other_ca_file))
    with pytest.raises(KafkaException):
        stranger.list_topics(timeout=3)
    # Then it gets nothing, and a client that trusts Kiln is served as before
    trusting = AdminClient(librdkafka_tls(ssl_kiln, tls.ca_file))
    assert trusting.list_topics(timeout=10).brokers


def tls_client_context(tls: TlsMaterial, highest: ssl.TLSVersion) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(cafile=str(tls.ca_file))
    # This client would speak anything from TLS 1.0 up to `highest`.
    context.set_ciphers("DEFAULT:@SECLEVEL=0")
    context.minimum_version = ssl.TLSVersion.TLSv1
    context.maximum_version = highest
    return context


def handshake(kiln: RunningKiln, context: ssl.SSLContext) -> str:
    with socket.create_connection(("127.0.0.1", kiln.app.port), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname="127.0.0.1") as wrapped:
        return str(wrapped.version())


def test_tls_below_1_2_is_refused(ssl_kiln: RunningKiln, tls: TlsMaterial) -> None:
    # Given a client that can speak TLS 1.0 to 1.2 (a server that allows 1.1 gets 1.1 from
    # it): it gets 1.2 when it offers it
    assert handshake(ssl_kiln, tls_client_context(tls, ssl.TLSVersion.TLSv1_2)) == "TLSv1.2"
    # When it offers at most TLS 1.1, then Kiln ends the handshake (asyncio closes the
    # connection where OpenSSL alone would send a protocol_version alert)
    with pytest.raises(ssl.SSLError):
        handshake(ssl_kiln, tls_client_context(tls, ssl.TLSVersion.TLSv1_1))


def api_versions_frame() -> bytes:
    client_id = b"plain"
    body = struct.pack(">hhih", 18, 0, 1, len(client_id)) + client_id
    return struct.pack(">i", len(body)) + body


def test_a_plaintext_client_on_the_tls_listener_is_dropped_and_others_go_on(
        ssl_kiln: RunningKiln, tls: TlsMaterial) -> None:
    # When a client speaks plain Kafka to the SSL listener
    with socket.create_connection(("127.0.0.1", ssl_kiln.app.port), timeout=10) as raw:
        raw.sendall(api_versions_frame())
        answer = b""
        while chunk := raw.recv(4096):
            answer += chunk
    # Then it gets no Kafka answer (a TLS alert record at most), and the connection closes
    assert answer[:1] in (b"", b"\x15"), answer[:16]
    # ... and TLS clients are served as before
    assert handshake(ssl_kiln, tls_client_context(tls, ssl.TLSVersion.TLSv1_3)) == "TLSv1.3"


def test_a_client_that_never_finishes_its_handshake_is_disconnected(
        redis_url: str, kafka_bootstrap: str, tls: TlsMaterial) -> None:
    with fresh_kiln(redis_url, kafka_bootstrap,
                    **ssl_settings(tls, tls_handshake_timeout_ms=300)) as kiln, \
            socket.create_connection(("127.0.0.1", kiln.app.port), timeout=20) as raw:
        # When a client connects and sends nothing, then Kiln closes the connection
        assert raw.recv(1) == b""


def test_client_certificates_when_required(redis_url: str, kafka_bootstrap: str,
                                           tls: TlsMaterial, unique_topic: str) -> None:
    with fresh_kiln(redis_url, kafka_bootstrap, **ssl_settings(
            tls, ssl_client_auth="required", ssl_ca_file=str(tls.ca_file))) as kiln:
        # A client without a certificate is refused
        anonymous = AdminClient(librdkafka_tls(kiln, tls.ca_file))
        with pytest.raises(KafkaException):
            anonymous.list_topics(timeout=3)
        # ... one with a certificate the CA signed is served
        config = librdkafka_tls(kiln, tls.ca_file,
                                **{"ssl.certificate.location": str(tls.client_certificate_file),
                                   "ssl.key.location": str(tls.client_key_file)})
        assert produce_and_consume_with_librdkafka(config, unique_topic) == expected()


def test_an_encrypted_key_opens_with_its_password_file(
        redis_url: str, kafka_bootstrap: str, tls: TlsMaterial, tmp_path: Path) -> None:
    encrypted = ssl_settings(tls, ssl_key_file=str(tls.server_encrypted_key_file),
                             ssl_key_password_file=str(tls.server_key_password_file))
    with fresh_kiln(redis_url, kafka_bootstrap, **encrypted) as kiln:
        assert handshake(kiln, tls_client_context(tls, ssl.TLSVersion.TLSv1_3)) == "TLSv1.3"
    wrong = tmp_path / "wrong-password"
    wrong.write_text("not the password\n")
    with pytest.raises(StartupError,
                       match=r"SSL listener: certificate .*server-encrypted\.key: .*password"):
        fresh_kiln(redis_url, kafka_bootstrap,
                   **{**encrypted, "ssl_key_password_file": str(wrong)})


def two_listeners(tls: TlsMaterial) -> dict[str, Any]:
    return ssl_settings(tls, listeners="INSIDE://127.0.0.1:0,OUTSIDE://127.0.0.1:0",
                        listener_security_protocol_map="INSIDE:PLAINTEXT,OUTSIDE:SSL",
                        advertised_listeners="OUTSIDE://localhost:0")


def brokers_seen(config: dict[str, str]) -> dict[int, tuple[str, int]]:
    metadata = AdminClient(config).list_topics(timeout=10)
    return {b.id: (b.host, b.port) for b in metadata.brokers.values()}


def test_each_listener_gives_clients_the_brokers_on_that_listener(
        redis_url: str, kafka_bootstrap: str, tls: TlsMaterial, unique_topic: str) -> None:
    # Given two nodes, each with a plaintext listener inside and an SSL one outside,
    # advertised outside as localhost
    with fresh_kiln(redis_url, kafka_bootstrap, **two_listeners(tls)) as first, \
            start_kiln(redis_url, kafka_bootstrap, **two_listeners(tls)) as second:
        nodes = (first, second)
        inside = {kiln.app.node_id: ("127.0.0.1", kiln.app.listener_port("INSIDE"))
                  for kiln in nodes}
        outside = {kiln.app.node_id: ("localhost", kiln.app.listener_port("OUTSIDE"))
                   for kiln in nodes}
        outside_config = {"bootstrap.servers": f"localhost:{outside[first.app.node_id][1]}",
                          "security.protocol": "SSL", "ssl.ca.location": str(tls.ca_file)}
        inside_config = {"bootstrap.servers": f"127.0.0.1:{inside[first.app.node_id][1]}"}
        # When clients ask each listener for the brokers (both nodes must be known first)
        assert eventually(lambda: len(brokers_seen(inside_config)) == 2)
        # Then each is given every node at its address on that listener
        assert brokers_seen(inside_config) == inside
        assert brokers_seen(outside_config) == outside
        # ... and a producer outside and a consumer inside share the records
        assert produce_and_consume_with_librdkafka(outside_config, unique_topic) == expected()
        assert consume_with_librdkafka(inside_config, unique_topic,
                                       f"inside-{unique_topic}") == expected()
