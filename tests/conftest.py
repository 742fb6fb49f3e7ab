"""Session-wide real services for the test suite: a Redis and a Kafka broker.

Where each service comes from, first match wins:

1. ``KILN_TEST_REDIS_URL`` / ``KILN_TEST_KAFKA_BOOTSTRAP``: an already running service.
2. testcontainers, when a Docker engine answers.
3. Local child processes, started once per session (``cli/local_services.py``,
   ``cli/local_kafka.py``): ``redis-server`` from PATH, and **Apache Kafka** (KRaft, from the
   jars scripts/setup.sh resolves from Maven Central), or tansu with
   ``KILN_TEST_BROKER=tansu``.

The session's Apache Kafka has relayed listeners: ``kafka_relay`` puts a relay the test can
cut or hold between Kiln and Kafka, without restarting the broker.

When no service can be had, the tests that need it are skipped, unless
``KILN_REQUIRE_SERVICES=1`` or ``CI`` is set: then they fail loudly (``scripts/test.sh`` sets
``KILN_REQUIRE_SERVICES=1``).
"""

from __future__ import annotations

import functools
import logging
import os
import time
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NoReturn

import pytest
import redis
from kafka.admin import KafkaAdminClient
from kafka.errors import KafkaError

from cli.local_kafka import LocalKafka
from cli.local_services import (
    ChildService,
    LocalRedis,
    LocalTansu,
    free_port,
    kafka_broker_answers,
)
from storage.kafka.client import parse_bootstrap
from tests.kiln_harness import sync_redis
from tests.tcp_relay import RelayedTansu, TcpRelay

log = logging.getLogger(__name__)


def _services_required() -> bool:
    if os.environ.get("KILN_REQUIRE_SERVICES", "") not in ("", "0"):
        return True
    return os.environ.get("CI", "").lower() not in ("", "0", "false")


def _unavailable(what: str, reason: str) -> NoReturn:
    message = f"{what} unavailable: {reason}"
    if _services_required():
        pytest.fail(
            f"{message}\n(KILN_REQUIRE_SERVICES=1 or CI is set, so this is a failure, "
            "not a skip; run scripts/setup.sh to install the local services)",
            pytrace=False,
        )
    pytest.skip(message)


def _start_local(service: ChildService, what: str) -> None:
    try:
        service.start()
    except Exception as exc:
        reason = str(exc)
    else:
        return
    service.stop()
    _unavailable(what, reason)


@functools.cache
def _docker_available() -> bool:
    try:
        import docker  # type: ignore[import-untyped]

        client = docker.from_env(timeout=3)
        try:
            client.ping()
        finally:
            client.close()
    except Exception as exc:
        log.info("no Docker engine (%s): using local service processes", exc)
        return False
    return True


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """URL of a real Redis for the whole session."""
    url = os.environ.get("KILN_TEST_REDIS_URL")
    if url:
        try:
            with sync_redis(url) as client:
                client.ping()
        except (redis.exceptions.RedisError, OSError) as exc:
            # An explicitly configured service that does not answer is always an error.
            pytest.fail(f"KILN_TEST_REDIS_URL={url} does not answer PING: {exc}", pytrace=False)
        yield url
        return

    if _docker_available():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            from testcontainers.redis import RedisContainer

        try:
            container = RedisContainer().start()
        except Exception as exc:
            _unavailable("Redis (testcontainers)", repr(exc))
        try:
            host = container.get_container_host_ip()
            port = container.get_exposed_port(6379)
            yield f"redis://{host}:{port}/0"
        finally:
            container.stop()
        return

    local = LocalRedis()
    _start_local(local, "Redis (local redis-server)")
    try:
        yield local.url
    finally:
        local.stop()


@dataclass(frozen=True)
class SessionBroker:
    bootstrap: str
    kind: str  # "kafka" (Apache Kafka started here), "tansu" or "external"
    local: LocalKafka | None = None


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[SessionBroker]:
    """The session's broker (see the module's docstring)."""
    bootstrap = os.environ.get("KILN_TEST_KAFKA_BOOTSTRAP")
    if bootstrap:
        if not kafka_broker_answers(*parse_bootstrap(bootstrap)[0], 5.0):
            pytest.fail(
                f"KILN_TEST_KAFKA_BOOTSTRAP={bootstrap} does not answer ApiVersions/Metadata",
                pytrace=False,
            )
        yield SessionBroker(bootstrap, "external")
        return

    if _docker_available():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            from testcontainers.kafka import KafkaContainer

        try:
            container = KafkaContainer().start()
        except Exception as exc:
            _unavailable("Kafka (testcontainers)", repr(exc))
        try:
            yield SessionBroker(str(container.get_bootstrap_server()), "external")
        finally:
            container.stop()
        return

    if os.environ.get("KILN_TEST_BROKER", "kafka") == "tansu":
        tansu = LocalTansu()
        _start_local(tansu, "Kafka-compatible broker (local tansu)")
        try:
            yield SessionBroker(tansu.bootstrap, "tansu")
        finally:
            tansu.stop()
        return

    kafka = LocalKafka(relays=1)
    _start_local(kafka, "Apache Kafka (local, from .jvm/kafka)")
    try:
        yield SessionBroker(kafka.bootstrap, "kafka", kafka)
    finally:
        kafka.stop()


@pytest.fixture(scope="session")
def kafka_bootstrap(kafka_broker: SessionBroker) -> str:
    """``host:port`` bootstrap address of the session's broker, once its group coordinator
    answers: Apache Kafka creates its offsets topic when a coordinator is first asked for and
    answers NOT_COORDINATOR until it is loaded, which tests that compare Kiln's group
    answers with Kafka's would otherwise meet, depending on which test ran first."""
    if kafka_broker.kind == "kafka":
        _await_group_coordinator(kafka_broker.bootstrap)
    return kafka_broker.bootstrap


def _await_group_coordinator(bootstrap: str, timeout_s: float = 60) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            try:
                admin.list_group_offsets("kiln-test-coordinator-probe")
                return
            except KafkaError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    finally:
        admin.close()


@dataclass(frozen=True)
class KafkaRelay:
    """Kafka reached through `relay`: clients given `bootstrap` are told to come back
    through it, so `relay.stop()` / `start()` (or `hold()` / `release()`) takes Kafka away
    from them and gives it back, data kept."""

    bootstrap: str
    relay: TcpRelay


@pytest.fixture
def kafka_relay(kafka_broker: SessionBroker) -> Iterator[KafkaRelay]:
    """A relay in front of the session's broker, started; stopped after the test."""
    if kafka_broker.local is not None:
        listen, told = kafka_broker.local.relayed(0)
        relay = TcpRelay(listen, told).start()
        try:
            yield KafkaRelay(f"127.0.0.1:{told}", relay)
        finally:
            relay.release()
            relay.stop()
        return
    if kafka_broker.kind != "tansu":
        pytest.skip(f"a relay needs a broker this session started ({kafka_broker.kind})")
    # tansu advertises one address: a broker of its own behind the relay (memory storage).
    broker_port, relay_port = free_port(), free_port()
    relay = TcpRelay(broker_port, relay_port).start()
    broker = RelayedTansu(broker_port, relay_port).start()
    try:
        yield KafkaRelay(f"127.0.0.1:{relay_port}", relay)
    finally:
        relay.release()
        relay.stop()
        broker.stop()


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis | redis.RedisCluster]:
    """A synchronous client on the session Redis, whose database is flushed before the test."""
    client = sync_redis(redis_url)
    client.flushdb()
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def unique_topic() -> str:
    """A topic name no other test uses."""
    return f"t-{uuid.uuid4().hex[:8]}"
