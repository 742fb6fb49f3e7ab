"""Kiln's SSL listener (`listeners = "SSL://..."`, docs/operations.md "TLS") with the other
real clients: aiokafka, Kafka's Java client (its console tools, 4.4) and kafkajs 2.2.4
(tests/compat/node/kafkajs_tls.js). librdkafka and kafka-python are in
tests/integration/test_tls_listener.py; franz-go is not here, as its program
(tests/compat/franz_go) has no TLS settings.

Each client, checking Kiln's certificate against the test CA (tests/certs.py):

- produces RECORDS records to a fresh one-partition topic and reads them back in a group:
  all of them, in order, intact, at offsets 0..RECORDS-1, and Kafka holds them once hardened;
- does the same with a client certificate, against a listener that requires one (mTLS);
- trusting another CA instead, is refused for Kiln's certificate, while the same client
  trusting the right CA is served.

How each client is told (what an operator's client configuration needs):

- aiokafka: `security_protocol="SSL"`, `ssl_context=create_ssl_context(cafile=CA,
  certfile=CERT, keyfile=KEY)`.
- Java: `security.protocol=SSL`, `ssl.truststore.type=PEM`, `ssl.truststore.location=CA`;
  for a client certificate `ssl.keystore.type=PEM` and `ssl.keystore.location` naming one
  file holding the unencrypted PKCS#8 key ("BEGIN PRIVATE KEY") and then the certificate,
  without `ssl.keystore.password` (Kafka refuses one for PEM). An encrypted key needs
  `ssl.key.password` and a PBES1 cipher: Java 17 cannot open PBES2 (OpenSSL's and
  `cryptography`'s default), "PBES2 SecretKeyFactory not available".
- kafkajs: `ssl: {ca: [CA bytes], cert: CERT bytes, key: KEY bytes}`.

Every Kiln here also closes no connection and fails no request (`answering_all`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaConnectionError
from aiokafka.helpers import create_ssl_context
from kafka.admin import KafkaAdminClient
from kafka.admin import NewTopic as KafkaPythonNewTopic

from tests.certs import TlsMaterial, make_tls_material
from tests.compat.clients import read_hardened
from tests.compat.conftest import GROUP_SETTINGS, HARDEN_DELAY_MS, answering_all
from tests.compat.java import (
    CONSOLE_CONSUMER,
    CONSOLE_PRODUCER,
    TOPICS,
    run_tool,
    write_properties,
)
from tests.compat.test_kafkajs import DriverRun, require_kafkajs, run_kafkajs
from tests.kiln_harness import RunningKiln, fresh_kiln

RECORDS = 200
# Long enough that a Fetch answer of them all spans several TLS records (16 KiB each).
FILLER = "abcdefghijklmnopqrstuvwxyz" * 8
KAFKAJS_TLS_DRIVER = Path(__file__).resolve().parent / "node" / "kafkajs_tls.js"


def values() -> list[str]:
    return [f"tls-{i:03d}-{FILLER}" for i in range(RECORDS)]


def expected() -> list[Read]:
    return [Read(0, offset, value) for offset, value in enumerate(values())]


@dataclass(frozen=True, slots=True)
class ClientTls:
    """What a client is given: the CA it checks Kiln's certificate against and, for a
    listener that requires one, its own certificate and key (PEM)."""

    ca_file: Path
    certificate_file: Path | None = None
    key_file: Path | None = None


@dataclass(frozen=True, slots=True)
class Read:
    partition: int
    offset: int
    value: str


@dataclass(frozen=True, slots=True)
class Listed:
    """A client's topic list, or (`topics` None) why it got none."""

    topics: list[str] | None
    failure: str = ""


# --- the Kilns -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsMaterial:
    return make_tls_material(tmp_path_factory.mktemp("tls"))


def ssl_listener_kiln(redis_url: str, kafka_bootstrap: str, tls: TlsMaterial,
                      caplog: pytest.LogCaptureFixture, **overrides: str) -> Iterator[RunningKiln]:
    with fresh_kiln(redis_url, kafka_bootstrap, harden_delay_ms=HARDEN_DELAY_MS,
                    listeners="SSL://127.0.0.1:0",
                    ssl_certificate_file=str(tls.server_certificate_file),
                    ssl_key_file=str(tls.server_key_file),
                    **GROUP_SETTINGS, **overrides) as kiln, answering_all(kiln, caplog):
        yield kiln


@pytest.fixture
def tls_kiln(redis_url: str, kafka_bootstrap: str, tls: TlsMaterial,
             caplog: pytest.LogCaptureFixture) -> Iterator[RunningKiln]:
    """A Kiln whose only listener is SSL, asking clients for no certificate."""
    yield from ssl_listener_kiln(redis_url, kafka_bootstrap, tls, caplog)


@pytest.fixture
def mtls_kiln(redis_url: str, kafka_bootstrap: str, tls: TlsMaterial,
              caplog: pytest.LogCaptureFixture) -> Iterator[RunningKiln]:
    """A Kiln whose SSL listener requires a client certificate the test CA signed."""
    yield from ssl_listener_kiln(redis_url, kafka_bootstrap, tls, caplog,
                                 ssl_client_auth="required", ssl_ca_file=str(tls.ca_file))


def trusting(tls: TlsMaterial) -> ClientTls:
    return ClientTls(tls.ca_file)


def with_certificate(tls: TlsMaterial) -> ClientTls:
    return ClientTls(tls.ca_file, tls.client_certificate_file, tls.client_key_file)


def create_topic(kiln: RunningKiln, topic: str, client_tls: ClientTls) -> None:
    """A one-partition topic, so that the records' order is the partition's (created with
    kafka-python, over TLS too)."""
    with KafkaAdminClient(bootstrap_servers=kiln.bootstrap, security_protocol="SSL",
                          ssl_cafile=str(client_tls.ca_file),
                          ssl_certfile=optional(client_tls.certificate_file),
                          ssl_keyfile=optional(client_tls.key_file)) as admin:
        admin.create_topics([KafkaPythonNewTopic(topic, num_partitions=1,
                                                 replication_factor=1)])


def optional(path: Path | None) -> str | None:
    return None if path is None else str(path)


def new_group() -> str:
    return f"g-{uuid.uuid4().hex[:8]}"


# --- aiokafka --------------------------------------------------------------------------------


def aiokafka_ssl(client_tls: ClientTls) -> dict[str, Any]:
    return {"security_protocol": "SSL", "ssl_context": create_ssl_context(
        cafile=str(client_tls.ca_file), certfile=optional(client_tls.certificate_file),
        keyfile=optional(client_tls.key_file))}


def aiokafka_round_trip(bootstrap: str, topic: str, client_tls: ClientTls,
                        _workdir: Path) -> list[Read]:
    async def run() -> list[Read]:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all",
                                    **aiokafka_ssl(client_tls))
        await producer.start()
        try:
            sent = [await producer.send(topic, value.encode(), partition=0)
                    for value in values()]
            await asyncio.gather(*sent)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=new_group(),
                                    auto_offset_reset="earliest", **aiokafka_ssl(client_tls))
        await consumer.start()
        read: list[Read] = []
        try:
            async with asyncio.timeout(30):
                while len(read) < RECORDS:
                    batches = await consumer.getmany(timeout_ms=500)
                    read += [Read(r.partition, r.offset, (r.value or b"").decode())
                             for records in batches.values() for r in records]
        finally:
            await consumer.stop()
        return read

    return asyncio.run(run())


class LogMessages(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.logged: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.logged.append(record.getMessage())


def aiokafka_topics(bootstrap: str, client_tls: ClientTls, _workdir: Path) -> Listed:
    async def run() -> Listed:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000,
                                    **aiokafka_ssl(client_tls))
        try:
            await admin.start()
            return Listed(await admin.list_topics())
        except KafkaConnectionError as exc:
            return Listed(None, "\n".join([str(exc), *messages.logged]))
        finally:
            await admin.close()

    # aiokafka logs why it could not connect; its exception says only that it could not.
    messages = LogMessages()
    aiokafka_log = logging.getLogger("aiokafka")
    aiokafka_log.addHandler(messages)
    try:
        return asyncio.run(run())
    finally:
        aiokafka_log.removeHandler(messages)


# --- Kafka's Java client ---------------------------------------------------------------------


def java_config(client_tls: ClientTls, workdir: Path) -> str:
    """The --command-config file of Kafka's tools: PEM trust and key stores."""
    settings: dict[str, str | int] = {"security.protocol": "SSL", "ssl.truststore.type": "PEM",
                                      "ssl.truststore.location": str(client_tls.ca_file)}
    if client_tls.certificate_file is not None and client_tls.key_file is not None:
        keystore = workdir / "java-keystore.pem"
        keystore.write_bytes(client_tls.key_file.read_bytes()
                             + client_tls.certificate_file.read_bytes())
        settings |= {"ssl.keystore.type": "PEM", "ssl.keystore.location": str(keystore)}
    name = f"java-{uuid.uuid4().hex[:8]}.properties"
    return str(write_properties(workdir / name, settings))


def java_round_trip(bootstrap: str, topic: str, client_tls: ClientTls,
                    workdir: Path) -> list[Read]:
    config = java_config(client_tls, workdir)
    produced = run_tool(CONSOLE_PRODUCER, "--bootstrap-server", bootstrap, "--topic", topic,
                        "--command-config", config, "--command-property", "acks=all",
                        stdin="".join(f"{value}\n" for value in values()))
    assert produced.returncode == 0, produced
    consumed = run_tool(CONSOLE_CONSUMER, "--bootstrap-server", bootstrap, "--topic", topic,
                        "--command-config", config, "--group", new_group(),
                        "--from-beginning", "--max-messages", str(RECORDS),
                        "--timeout-ms", "20000",
                        "--formatter-property", "print.partition=true",
                        "--formatter-property", "print.offset=true")
    assert consumed.returncode == 0, consumed
    assert f"Processed a total of {RECORDS} messages" in consumed.stderr, consumed
    fields = [line.split("\t") for line in consumed.lines]
    return [Read(int(partition.removeprefix("Partition:")),
                 int(offset.removeprefix("Offset:")), value)
            for partition, offset, value in fields]


def java_topics(bootstrap: str, client_tls: ClientTls, workdir: Path) -> Listed:
    run = run_tool(TOPICS, "--bootstrap-server", bootstrap, "--list",
                   "--command-config", java_config(client_tls, workdir))
    return Listed(run.lines) if run.returncode == 0 else Listed(None, run.output)


# --- kafkajs ---------------------------------------------------------------------------------


def kafkajs_spec(bootstrap: str, client_tls: ClientTls, **spec: Any) -> dict[str, Any]:
    return {"brokers": [bootstrap], "tls": {
        "ca": str(client_tls.ca_file), "cert": optional(client_tls.certificate_file),
        "key": optional(client_tls.key_file)}, **spec}


def run_kafkajs_tls(command: str, spec: dict[str, Any]) -> DriverRun:
    return run_kafkajs(command, spec, driver=KAFKAJS_TLS_DRIVER)


def kafkajs_round_trip(bootstrap: str, topic: str, client_tls: ClientTls,
                       _workdir: Path) -> list[Read]:
    produced = run_kafkajs_tls("produce", kafkajs_spec(bootstrap, client_tls, topic=topic,
                                                       values=values()))
    assert produced.returncode == 0, produced
    assert [(a["partition"], a["offset"]) for a in produced.of("ack")] == [
        (0, offset) for offset in range(RECORDS)], produced
    consumed = run_kafkajs_tls("consume", kafkajs_spec(
        bootstrap, client_tls, topic=topic, groupId=new_group(), count=RECORDS,
        timeoutMs=30_000))
    assert consumed.returncode == 0, consumed
    assert consumed.of("end")[0]["reason"] == "count", consumed
    return [Read(r["partition"], r["offset"], r["value"]) for r in consumed.of("record")]


def kafkajs_topics(bootstrap: str, client_tls: ClientTls, _workdir: Path) -> Listed:
    run = run_kafkajs_tls("topics", kafkajs_spec(bootstrap, client_tls,
                                                 retry={"retries": 0}))
    if run.returncode == 0:
        return Listed(run.of("topics")[0]["topics"])
    return Listed(None, json.dumps(run.of("error")) + run.stderr)


@pytest.fixture(scope="session")
def kafkajs_tls_installed() -> None:
    require_kafkajs()


# --- the clients -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Client:
    round_trip: Callable[[str, str, ClientTls, Path], list[Read]]
    list_topics: Callable[[str, ClientTls, Path], Listed]
    requires: str | None  # the fixture that finds the client, or fails for its absence
    untrusted: str  # what its failure says of a certificate signed by a CA it does not trust


CLIENTS = {
    "aiokafka": Client(aiokafka_round_trip, aiokafka_topics, None,
                       "CERTIFICATE_VERIFY_FAILED"),
    "java": Client(java_round_trip, java_topics, "kafka_tools",
                   "PKIX path building failed"),
    "kafkajs": Client(kafkajs_round_trip, kafkajs_topics, "kafkajs_tls_installed",
                      "SELF_SIGNED_CERT_IN_CHAIN"),
}


@pytest.fixture(params=list(CLIENTS))
def client(request: pytest.FixtureRequest) -> Client:
    chosen = CLIENTS[request.param]
    if chosen.requires is not None:
        request.getfixturevalue(chosen.requires)
    return chosen


def hardened_values(kiln: RunningKiln, kafka_bootstrap: str, topic: str) -> list[str]:
    assert kiln.flush()
    return [(r.value or b"").decode() for r in read_hardened(kafka_bootstrap, topic, 1)[0]]


# --- the tests -------------------------------------------------------------------------------


def test_a_client_produces_and_reads_back_over_tls(
        client: Client, tls_kiln: RunningKiln, tls: TlsMaterial, kafka_bootstrap: str,
        unique_topic: str, tmp_path: Path) -> None:
    # Given a one-partition topic
    create_topic(tls_kiln, unique_topic, trusting(tls))
    # When the client, trusting the test CA, produces RECORDS records and reads them back
    read = client.round_trip(tls_kiln.bootstrap, unique_topic, trusting(tls), tmp_path)
    # Then it read every one, in order, intact, and Kafka holds them once hardened
    assert read == expected()
    assert hardened_values(tls_kiln, kafka_bootstrap, unique_topic) == values()


def test_a_client_with_a_certificate_produces_and_reads_back_over_mtls(
        client: Client, mtls_kiln: RunningKiln, tls: TlsMaterial, kafka_bootstrap: str,
        unique_topic: str, tmp_path: Path) -> None:
    # Given a one-partition topic behind a listener that requires client certificates
    create_topic(mtls_kiln, unique_topic, with_certificate(tls))
    # When the client, with a certificate the CA signed, produces and reads back
    read = client.round_trip(mtls_kiln.bootstrap, unique_topic, with_certificate(tls),
                             tmp_path)
    # Then it read every record, in order, intact, and Kafka holds them once hardened
    assert read == expected()
    assert hardened_values(mtls_kiln, kafka_bootstrap, unique_topic) == values()


def test_a_client_trusting_another_ca_is_refused_and_kiln_goes_on(
        client: Client, tls_kiln: RunningKiln, tls: TlsMaterial, unique_topic: str,
        tmp_path: Path) -> None:
    # Given a topic in Kiln
    create_topic(tls_kiln, unique_topic, trusting(tls))
    # When the client, trusting a CA that did not sign Kiln's certificate, asks for topics
    refused = client.list_topics(tls_kiln.bootstrap, ClientTls(tls.other_ca_file), tmp_path)
    # Then it gets none, for Kiln's certificate, and the same client trusting the test CA
    # is served as before
    assert refused.topics is None, refused
    assert client.untrusted in refused.failure, refused.failure
    served = client.list_topics(tls_kiln.bootstrap, trusting(tls), tmp_path)
    assert served.topics is not None, served.failure
    assert unique_topic in served.topics

