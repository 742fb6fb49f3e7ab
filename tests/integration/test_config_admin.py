"""Configs and the cluster through Kiln, with the admin clients users have (confluent-kafka's
AdminClient, kafka-python's KafkaAdminClient) and, for exact error codes, raw requests sent
both to Kiln and to the Kafka broker behind it.

A topic's configs through Kiln are Kafka's configs of the hardened topic, as Kafka itself
reports them, plus Kiln's policies for the topic as `kiln.*` configs; altering them changes
Kafka's topic or Kiln's policy (the registry in Redis), all of a resource or none of it."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import confluent_kafka
import pytest
import redis
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewTopic,
)
from kafka.admin import ConfigResource as KafkaPythonResource
from kafka.admin import ConfigResourceType, KafkaAdminClient
from kafka.protocol.admin import (
    AlterConfigsRequest,
    AlterConfigsResponse,
    DescribeClusterRequest,
    DescribeClusterResponse,
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse,
)
from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from storage.topics import new_topic
from tests.conftest import KafkaRelay
from tests.integration.test_cli import run_kiln
from tests.kiln_harness import RunningKiln, eventually, fresh_kiln, sync_redis
from tests.raw_client import RawClient

INVALID_CONFIG = 40
INVALID_REQUEST = 42
UNKNOWN_TOPIC_OR_PARTITION = 3
TOPIC, BROKER = 2, 4
SET, DELETE, APPEND = 0, 1, 2
KILN_DEFAULTS = {"kiln.reliability": "reliable_persistent",
                 "kiln.max.reliability": "assured_persistent",
                 "kiln.producer.override": "true", "kiln.harden": "survivors",
                 "kiln.auto.subscribe": "true"}
TIMEOUT_S = 15


@pytest.fixture
def store(kiln: RunningKiln, redis_url: str) -> Iterator[redis.Redis]:
    """Kiln's Redis, as Kiln left it (the `kiln` fixture emptied it before Kiln started)."""
    client = sync_redis(redis_url)
    yield client
    client.close()


@pytest.fixture
def admin(kiln: RunningKiln) -> AdminClient:
    return AdminClient({"bootstrap.servers": kiln.bootstrap})


@pytest.fixture
def kafka_python_admin(kiln: RunningKiln) -> Iterator[KafkaAdminClient]:
    client = KafkaAdminClient(bootstrap_servers=kiln.bootstrap)
    yield client
    client.close()


def create_topic(bootstrap: str, topic: str, configs: dict[str, str] | None = None) -> None:
    client = AdminClient({"bootstrap.servers": bootstrap})  # kept until the answer is in
    futures = client.create_topics([NewTopic(topic, 2, config=configs or {})])
    futures[topic].result(TIMEOUT_S)


def described(bootstrap: str, topic: str) -> dict[str, tuple[Any, ...]]:
    """Every config of the topic: (value, source, read-only, sensitive, default)."""
    resource = ConfigResource("topic", topic)
    client = AdminClient({"bootstrap.servers": bootstrap})
    entries = client.describe_configs([resource])[resource].result(TIMEOUT_S)
    return {name: (e.value, ConfigSource(e.source), e.is_read_only, e.is_sensitive,
                   e.is_default) for name, e in entries.items()}


def kafka_value(kafka_bootstrap: str, topic: str, name: str) -> str | None:
    return described(kafka_bootstrap, topic)[name][0]


def kafka_shows(kafka_bootstrap: str, topic: str, name: str, value: str) -> bool:
    """Kafka's broker learns an altered config from its controller a moment after the
    change is acknowledged."""
    return eventually(lambda: kafka_value(kafka_bootstrap, topic, name) == value)


def policies(store: redis.Redis, topic: str) -> dict[str, Any]:
    """Kiln's policies for the topic as its registry in Redis holds them."""
    raw = json.loads(store.hget("kiln:topics", topic))  # type: ignore[arg-type]
    return {key: raw[key] for key in ("reliability", "max_reliability", "producer_override",
                                      "harden", "auto_subscribe")}


DEFAULT_POLICIES = {"reliability": "reliable_persistent",
                    "max_reliability": "assured_persistent", "producer_override": True,
                    "harden": "survivors", "auto_subscribe": True}


def incremental(admin: AdminClient, topic: str, *changes: tuple[str, AlterConfigOpType, str | None],
                validate_only: bool = False) -> None:
    resource = ConfigResource("topic", topic, incremental_configs=[
        ConfigEntry(name, value, incremental_operation=op) for name, op, value in changes])
    admin.incremental_alter_configs([resource], validate_only=validate_only)[resource].result(
        TIMEOUT_S)


def error_code(failure: pytest.ExceptionInfo[confluent_kafka.KafkaException]) -> int:
    return int(failure.value.args[0].code())


# --- DescribeConfigs -------------------------------------------------------------------------


def test_describe_configs_gives_kafkas_configs_of_the_topic_and_kilns_policies(
        kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given a topic created through Kiln with a Kafka config and two of Kiln's
    create_topic(kiln.bootstrap, unique_topic, {"retention.ms": "86400000",
                                                "kiln.harden": "all",
                                                "kiln.reliability": "express"})
    # When confluent-kafka's admin client describes its configs through Kiln
    through_kiln = described(kiln.bootstrap, unique_topic)
    # Then every config Kafka reports for the topic, asked directly, is there as Kafka
    # reports it, and the rest are Kiln's five: the two set on the topic, three defaults
    from_kafka = described(kafka_bootstrap, unique_topic)
    assert len(from_kafka) > 30
    assert {n: v for n, v in through_kiln.items() if not n.startswith("kiln.")} == from_kafka
    assert from_kafka["retention.ms"][:2] == ("86400000", ConfigSource.DYNAMIC_TOPIC_CONFIG)
    dynamic, default = ConfigSource.DYNAMIC_TOPIC_CONFIG, ConfigSource.DEFAULT_CONFIG
    assert {n: v for n, v in through_kiln.items() if n.startswith("kiln.")} == {
        "kiln.harden": ("all", dynamic, False, False, False),
        "kiln.reliability": ("express", dynamic, False, False, False),
        "kiln.max.reliability": ("assured_persistent", default, False, False, True),
        "kiln.producer.override": ("true", default, False, False, True),
        "kiln.auto.subscribe": ("true", default, False, False, True)}


def test_kafka_python_describe_configs_with_synonyms_and_a_key_list(
        kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str,
        kafka_python_admin: KafkaAdminClient) -> None:
    # Given a topic created through Kiln with retention.ms and kiln.harden set
    create_topic(kiln.bootstrap, unique_topic, {"retention.ms": "86400000",
                                                "kiln.harden": "never"})
    keys = {"retention.ms": None, "cleanup.policy": None, "kiln.harden": None,
            "kiln.reliability": None, "no.such.config": None}
    # When kafka-python describes some of its configs through Kiln, with their synonyms
    [answer] = kafka_python_admin.describe_configs(
        [KafkaPythonResource(ConfigResourceType.TOPIC, unique_topic, configs=keys)],
        include_synonyms=True, config_filter="all")["topic"].values()
    # Then it gets the Kafka configs asked for as Kafka reports them (synonyms and types
    # included) and Kiln's, each with its default as a synonym; a name nobody knows is left
    # out, as Kafka leaves it out
    with KafkaAdminClient(bootstrap_servers=kafka_bootstrap) as direct:
        [from_kafka] = direct.describe_configs(
            [KafkaPythonResource(ConfigResourceType.TOPIC, unique_topic, configs=keys)],
            include_synonyms=True, config_filter="all")["topic"].values()
    assert set(answer) == {"retention.ms", "cleanup.policy", "kiln.harden", "kiln.reliability"}
    assert {n: answer[n] for n in ("retention.ms", "cleanup.policy")} == from_kafka
    assert answer["kiln.harden"] == {
        "value": "never", "read_only": False, "config_source": "DYNAMIC_TOPIC_CONFIG",
        "is_sensitive": False, "config_type": "STRING", "documentation": None,
        "synonyms": [{"name": "kiln.harden", "value": "never", "source": "DYNAMIC_TOPIC_CONFIG"},
                     {"name": "kiln.harden", "value": "survivors", "source": "DEFAULT_CONFIG"}]}
    # (under kiln.harden=never the default level is capped: a value of the topic's own)
    assert answer["kiln.reliability"]["value"] == "reliable_nonpersistent"
    assert answer["kiln.reliability"]["config_source"] == "DYNAMIC_TOPIC_CONFIG"


def describe_raw(bootstrap: str, resources: list[tuple[int, str, list[str] | None]],
                 version: int = 4, documentation: bool = False) -> list[Any]:
    resource = DescribeConfigsRequest.DescribeConfigsResource
    fields: dict[str, Any] = {"include_synonyms": False}
    if version >= 3:
        fields["include_documentation"] = documentation
    with RawClient(bootstrap) as client:
        return list(client.request(DescribeConfigsRequest[version](
            resources=[resource(resource_type=kind, resource_name=name, configuration_keys=keys)
                       for kind, name, keys in resources], **fields),
            version, DescribeConfigsResponse).results)


def test_describe_configs_documents_kilns_configs_when_asked(
        kiln: RunningKiln, unique_topic: str) -> None:
    # Given a topic created through Kiln
    create_topic(kiln.bootstrap, unique_topic)
    # When DescribeConfigs v3+ asks for the documentation of two of Kiln's configs
    [result] = describe_raw(kiln.bootstrap, [(TOPIC, unique_topic,
                                              ["kiln.harden", "kiln.auto.subscribe"])],
                            documentation=True)
    # Then both come with their type and a text that says what they decide
    assert result.error_code == 0
    assert [(c.name, c.value, c.config_type) for c in result.configs] == [
        ("kiln.harden", "survivors", 2), ("kiln.auto.subscribe", "true", 1)]
    assert "survivors" in result.configs[0].documentation
    assert "durable subscription" in result.configs[1].documentation


def test_describe_configs_of_a_topic_neither_has_is_unknown_topic_as_in_kafka(
        kiln: RunningKiln, kafka_bootstrap: str) -> None:
    # When Kiln and Kafka are asked for the configs of a topic neither has, and of an
    # illegal topic name
    asked: list[tuple[int, str, list[str] | None]] = [
        (TOPIC, f"missing-{uuid.uuid4().hex[:8]}", None), (TOPIC, "bad name!", None)]
    through_kiln = describe_raw(kiln.bootstrap, asked)
    from_kafka = describe_raw(kafka_bootstrap, asked)
    # Then both answer UNKNOWN_TOPIC_OR_PARTITION and INVALID_TOPIC_EXCEPTION, no configs
    assert [(r.error_code, r.configs) for r in through_kiln] == [
        (r.error_code, r.configs) for r in from_kafka] == [
        (UNKNOWN_TOPIC_OR_PARTITION, []), (17, [])]


def test_a_topic_only_kiln_has_is_described_with_kilns_configs(
        kiln: RunningKiln, store: redis.Redis, unique_topic: str) -> None:
    # Given a topic registered in Kiln only (as when it was created while Kafka was away)
    store.hset("kiln:topics", unique_topic, new_topic(unique_topic, 1).to_json())
    # When its configs are described through Kiln
    [result] = describe_raw(kiln.bootstrap, [(TOPIC, unique_topic, None)])
    # Then they are Kiln's five, at their defaults
    assert result.error_code == 0
    assert {c.name: c.value for c in result.configs} == KILN_DEFAULTS


def test_describe_configs_refuses_a_resource_type_it_does_not_serve_as_kafka_does(
        kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given a topic created through Kiln
    create_topic(kiln.bootstrap, unique_topic)
    # When a request names the topic and a resource type Kafka does not know (0)
    asked: list[tuple[int, str, list[str] | None]] = [(TOPIC, unique_topic, None),
                                                      (0, "x", None)]
    through_kiln = describe_raw(kiln.bootstrap, asked)
    from_kafka = describe_raw(kafka_bootstrap, asked)
    # Then Kiln refuses the whole request with INVALID_REQUEST, as Kafka does
    assert [r.error_code for r in through_kiln] == [r.error_code for r in from_kafka] == [
        INVALID_REQUEST, INVALID_REQUEST]
    # And when it asks for Kiln's broker loggers (Kiln has none) it gets INVALID_REQUEST
    [loggers] = describe_raw(kiln.bootstrap, [(8, str(kiln.settings.node_id), None)])
    assert (loggers.error_code, loggers.configs) == (INVALID_REQUEST, [])


# --- IncrementalAlterConfigs -----------------------------------------------------------------


def test_altering_retention_through_kiln_changes_it_in_kafka(
        kiln: RunningKiln, kafka_bootstrap: str, store: redis.Redis,
        unique_topic: str, admin: AdminClient) -> None:
    # Given a topic created through Kiln
    create_topic(kiln.bootstrap, unique_topic)
    # When confluent-kafka sets its retention.ms through Kiln
    incremental(admin, unique_topic, ("retention.ms", AlterConfigOpType.SET, "3600000"))
    # Then Kafka's topic has it, set on the topic, and Kiln's policies are as they were
    assert kafka_shows(kafka_bootstrap, unique_topic, "retention.ms", "3600000")
    assert described(kafka_bootstrap, unique_topic)["retention.ms"][1] is \
        ConfigSource.DYNAMIC_TOPIC_CONFIG
    assert policies(store, unique_topic) == DEFAULT_POLICIES


def test_altering_kiln_configs_changes_kilns_policy_for_the_topic(
        kiln: RunningKiln, kafka_bootstrap: str, redis_url: str, unique_topic: str,
        admin: AdminClient) -> None:
    # Given a topic created through Kiln
    create_topic(kiln.bootstrap, unique_topic)
    # When confluent-kafka sets three of Kiln's configs through Kiln
    incremental(admin, unique_topic, ("kiln.harden", AlterConfigOpType.SET, "all"),
                ("kiln.reliability", AlterConfigOpType.SET, "express"),
                ("kiln.auto.subscribe", AlterConfigOpType.SET, "false"))
    # Then `kiln topics describe` shows Kiln's new policy, and describing the configs
    # through Kiln shows them set on the topic
    shown = run_kiln("topics", "describe", unique_topic, "--json", "--redis-url", redis_url,
                     "--kafka-bootstrap", kafka_bootstrap)
    assert shown.returncode == 0, shown.stderr
    row = json.loads(shown.stdout)
    assert {k: row[k] for k in DEFAULT_POLICIES} == {
        **DEFAULT_POLICIES, "reliability": "express", "harden": "all", "auto_subscribe": False}
    now = described(kiln.bootstrap, unique_topic)
    assert {n: now[n][:2] for n in ("kiln.harden", "kiln.reliability", "kiln.auto.subscribe")} \
        == {"kiln.harden": ("all", ConfigSource.DYNAMIC_TOPIC_CONFIG),
            "kiln.reliability": ("express", ConfigSource.DYNAMIC_TOPIC_CONFIG),
            "kiln.auto.subscribe": ("false", ConfigSource.DYNAMIC_TOPIC_CONFIG)}


def test_deleting_kiln_configs_puts_them_back_to_kilns_defaults(
        kiln: RunningKiln, store: redis.Redis, unique_topic: str,
        admin: AdminClient) -> None:
    # Given a topic created through Kiln that never hardens (its levels capped for it)
    create_topic(kiln.bootstrap, unique_topic, {"kiln.harden": "never",
                                                "kiln.producer.override": "false"})
    assert policies(store, unique_topic)["max_reliability"] == "reliable_nonpersistent"
    # When confluent-kafka deletes kiln.harden and kiln.max.reliability
    incremental(admin, unique_topic, ("kiln.harden", AlterConfigOpType.DELETE, None),
                ("kiln.max.reliability", AlterConfigOpType.DELETE, None))
    # Then both are back to Kiln's defaults; the others are as they were
    assert policies(store, unique_topic) == {
        **DEFAULT_POLICIES, "reliability": "reliable_nonpersistent", "producer_override": False}
    assert described(kiln.bootstrap, unique_topic)["kiln.harden"][:2] == (
        "survivors", ConfigSource.DEFAULT_CONFIG)


@pytest.mark.parametrize("name,value", [
    ("kiln.harden", "sometimes"),
    ("kiln.reliability", "bogus"),
    ("kiln.producer.override", "maybe"),
    ("kiln.no.such.policy", "1"),
    # kiln.harden=never: no level that needs hardening
    ("kiln.max.reliability", "assured_persistent"),
])
def test_a_bad_kiln_value_changes_nothing_and_is_invalid_config(
        kiln: RunningKiln, kafka_bootstrap: str, store: redis.Redis, unique_topic: str,
        admin: AdminClient, name: str, value: str) -> None:
    # Given a topic created through Kiln that never hardens
    create_topic(kiln.bootstrap, unique_topic, {"kiln.harden": "never"})
    before = policies(store, unique_topic)
    # When a bad value of one of Kiln's configs is set through Kiln
    with pytest.raises(confluent_kafka.KafkaException) as failure:
        incremental(admin, unique_topic, (name, AlterConfigOpType.SET, value))
    # Then it is refused with INVALID_CONFIG, naming the config, and nothing changed
    assert error_code(failure) == INVALID_CONFIG
    assert name in failure.value.args[0].str()
    assert policies(store, unique_topic) == before


@pytest.mark.parametrize("changes", [
    # a valid Kafka config with an invalid Kiln one
    (("retention.ms", "3600000"), ("kiln.harden", "sometimes")),
    # a valid Kiln config with an invalid Kafka one
    (("kiln.harden", "all"), ("retention.ms", "not-a-number")),
], ids=["kiln-invalid", "kafka-invalid"])
def test_a_request_mixing_valid_and_invalid_keys_changes_nothing(
        kiln: RunningKiln, kafka_bootstrap: str, store: redis.Redis, unique_topic: str,
        admin: AdminClient, changes: tuple[tuple[str, str], ...]) -> None:
    # Given a topic created through Kiln
    create_topic(kiln.bootstrap, unique_topic)
    retention = kafka_value(kafka_bootstrap, unique_topic, "retention.ms")
    # When one request sets a valid and an invalid config
    with pytest.raises(confluent_kafka.KafkaException) as failure:
        incremental(admin, unique_topic,
                    *((name, AlterConfigOpType.SET, value) for name, value in changes))
    # Then it is refused with INVALID_CONFIG, and neither Kafka nor Kiln changed
    assert error_code(failure) == INVALID_CONFIG
    assert kafka_value(kafka_bootstrap, unique_topic, "retention.ms") == retention
    assert policies(store, unique_topic) == DEFAULT_POLICIES


def test_validate_only_changes_nothing(
        kiln: RunningKiln, kafka_bootstrap: str, store: redis.Redis, unique_topic: str,
        admin: AdminClient) -> None:
    # Given a topic created through Kiln
    create_topic(kiln.bootstrap, unique_topic)
    retention = kafka_value(kafka_bootstrap, unique_topic, "retention.ms")
    # When a valid change of both kinds is only validated
    incremental(admin, unique_topic, ("retention.ms", AlterConfigOpType.SET, "3600000"),
                ("kiln.harden", AlterConfigOpType.SET, "all"), validate_only=True)
    # Then it is accepted, and nothing changed
    assert kafka_value(kafka_bootstrap, unique_topic, "retention.ms") == retention
    assert policies(store, unique_topic) == DEFAULT_POLICIES
    # And an invalid one is refused as it would be refused for real
    with pytest.raises(confluent_kafka.KafkaException) as failure:
        incremental(admin, unique_topic, ("kiln.harden", AlterConfigOpType.SET, "x"),
                    validate_only=True)
    assert error_code(failure) == INVALID_CONFIG


def test_kafka_python_alter_configs_changes_kafka_and_kiln(
        kiln: RunningKiln, kafka_bootstrap: str, store: redis.Redis, unique_topic: str,
        kafka_python_admin: KafkaAdminClient) -> None:
    # Given a topic created through Kiln
    create_topic(kiln.bootstrap, unique_topic)
    # When kafka-python alters a Kafka config and one of Kiln's (it checks first that both
    # are alterable configs of the topic, then sends IncrementalAlterConfigs)
    answer = kafka_python_admin.alter_configs([KafkaPythonResource(
        ConfigResourceType.TOPIC, unique_topic,
        configs={"retention.ms": "7200000", "kiln.reliability": "best_effort"})])
    # Then both changed
    assert answer == {"topic": {unique_topic: "OK"}}
    assert kafka_shows(kafka_bootstrap, unique_topic, "retention.ms", "7200000")
    assert policies(store, unique_topic)["reliability"] == "best_effort"


# --- AlterConfigs (replaces a resource's whole set) -----------------------------------------


def test_alter_configs_replaces_kafkas_and_kilns_configs_of_the_topic(
        kiln: RunningKiln, kafka_bootstrap: str, store: redis.Redis, unique_topic: str,
        admin: AdminClient) -> None:
    # Given a topic with retention.ms, kiln.harden and kiln.reliability set
    create_topic(kiln.bootstrap, unique_topic, {"retention.ms": "86400000",
                                                "kiln.harden": "all",
                                                "kiln.reliability": "express"})
    # When confluent-kafka's (deprecated) alter_configs gives it segment.ms and
    # kiln.reliability only
    resource = ConfigResource("topic", unique_topic, set_config={
        "segment.ms": "3600000", "kiln.reliability": "best_effort"})
    admin.alter_configs([resource])[resource].result(TIMEOUT_S)  # type: ignore[no-untyped-call]
    # Then Kafka has segment.ms and retention.ms back at its default; Kiln has the new
    # reliability and kiln.harden back at its default
    assert kafka_shows(kafka_bootstrap, unique_topic, "segment.ms", "3600000")
    assert described(kafka_bootstrap, unique_topic)["retention.ms"][1] is not \
        ConfigSource.DYNAMIC_TOPIC_CONFIG
    assert policies(store, unique_topic) == {**DEFAULT_POLICIES,
                                                    "reliability": "best_effort"}


def test_kafka_python_alter_configs_non_incremental_keeps_the_configs_it_resends(
        kiln: RunningKiln, kafka_bootstrap: str, store: redis.Redis, unique_topic: str,
        kafka_python_admin: KafkaAdminClient) -> None:
    # Given a topic with retention.ms and kiln.harden set
    create_topic(kiln.bootstrap, unique_topic, {"retention.ms": "86400000",
                                                "kiln.harden": "all"})
    # When kafka-python alters kiln.reliability with AlterConfigs (it describes the modified
    # configs first and sends them along, so they are kept)
    answer = kafka_python_admin.alter_configs([KafkaPythonResource(
        ConfigResourceType.TOPIC, unique_topic, configs={"kiln.reliability": "express"})],
        incremental=False)
    # Then the new one is set, and those it sent along are as they were
    assert answer == {"topic": {unique_topic: "OK"}}
    assert policies(store, unique_topic) == {**DEFAULT_POLICIES, "harden": "all",
                                                    "reliability": "express"}
    assert kafka_value(kafka_bootstrap, unique_topic, "retention.ms") == "86400000"


# --- while Kafka cannot be reached ------------------------------------------------------------


def test_without_kafka_kiln_configs_still_change_and_kafkas_time_out(
        redis_url: str, kafka_relay: KafkaRelay, unique_topic: str) -> None:
    # Given a Kiln whose Kafka is behind a relay, and a topic created through it
    with fresh_kiln(redis_url, kafka_relay.bootstrap) as running:
        create_topic(running.bootstrap, unique_topic)
        store = sync_redis(redis_url)
        # When Kafka cannot be reached, and a Kiln config, a Kafka config and the topic's
        # configs are asked for through Kiln
        kafka_relay.relay.stop()
        kiln_only = incremental_raw(running.bootstrap, unique_topic,
                                    [("kiln.harden", SET, "all")])
        with_kafka = incremental_raw(running.bootstrap, unique_topic,
                                     [("kiln.reliability", SET, "express"),
                                      ("retention.ms", SET, "1000")])
        [described_now] = describe_raw(running.bootstrap, [(TOPIC, unique_topic, None)])
        kafka_relay.relay.start()
    # Then Kiln's config changed (Kafka has no part in it); the change with a Kafka config
    # did not change anything, and neither it nor the description pretends to have
    # succeeded: both are REQUEST_TIMED_OUT, as a broker that cannot reach its controller
    assert kiln_only == (0, None)
    assert with_kafka[0] == described_now.error_code == 7
    assert policies(store, unique_topic) == {**DEFAULT_POLICIES, "harden": "all"}


# --- error codes, against Kafka's for the same mistake ----------------------------------------


def incremental_raw(bootstrap: str, topic: str, changes: list[tuple[str, int, str | None]],
                    kind: int = TOPIC) -> tuple[int, str | None]:
    resource = IncrementalAlterConfigsRequest.AlterConfigsResource
    with RawClient(bootstrap) as client:
        [answer] = client.request(IncrementalAlterConfigsRequest[1](
            resources=[resource(resource_type=kind, resource_name=topic, configs=[
                resource.AlterableConfig(name=name, config_operation=op, value=value)
                for name, op, value in changes])], validate_only=False),
            1, IncrementalAlterConfigsResponse).responses
    return int(answer.error_code), answer.error_message


def alter_raw(bootstrap: str, topic: str, values: list[tuple[str, str | None]]) -> int:
    resource = AlterConfigsRequest.AlterConfigsResource
    with RawClient(bootstrap) as client:
        [answer] = client.request(AlterConfigsRequest[2](
            resources=[resource(resource_type=TOPIC, resource_name=topic, configs=[
                resource.AlterableConfig(name=name, value=value) for name, value in values])],
            validate_only=False), 2, AlterConfigsResponse).responses
    return int(answer.error_code)


# Each mistake made on one of Kiln's configs (through Kiln) and on a Kafka config of the same
# kind (at Kafka): a name, and the request's changes with NAME standing for it.
MISTAKES = {
    "append-to-a-non-list": ([("NAME", APPEND, "x")], INVALID_CONFIG),
    "set-null": ([("NAME", SET, None)], INVALID_REQUEST),
    "duplicate-keys": ([("NAME", SET, "a"), ("NAME", SET, "b")], INVALID_REQUEST),
}


@pytest.mark.parametrize("mistake", list(MISTAKES))
def test_incremental_alter_mistakes_get_kafkas_error_codes(
        kiln: RunningKiln, kafka_bootstrap: str, store: redis.Redis, unique_topic: str,
        mistake: str) -> None:
    # Given a topic created through Kiln
    create_topic(kiln.bootstrap, unique_topic)
    changes, expected = MISTAKES[mistake]
    # When the mistake is made on kiln.harden through Kiln, and on retention.ms (not a
    # list either) at Kafka
    through_kiln = incremental_raw(kiln.bootstrap, unique_topic,
                                   [(n.replace("NAME", "kiln.harden"), op, v)
                                    for n, op, v in changes])
    at_kafka = incremental_raw(kafka_bootstrap, unique_topic,
                               [(n.replace("NAME", "retention.ms"), op, v)
                                for n, op, v in changes])
    # Then both answer with the same code, and Kiln's policy is as it was
    assert (through_kiln[0], at_kafka[0]) == (expected, expected), (through_kiln, at_kafka)
    assert policies(store, unique_topic) == DEFAULT_POLICIES


def test_alter_configs_with_a_null_value_is_invalid_request_as_in_kafka(
        kiln: RunningKiln, kafka_bootstrap: str, store: redis.Redis,
        unique_topic: str) -> None:
    # Given a topic created through Kiln
    create_topic(kiln.bootstrap, unique_topic)
    # When AlterConfigs gives kiln.harden (through Kiln) and retention.ms (at Kafka) no value
    through_kiln = alter_raw(kiln.bootstrap, unique_topic,
                             [("kiln.harden", None), ("kiln.reliability", "express")])
    at_kafka = alter_raw(kafka_bootstrap, unique_topic, [("retention.ms", None)])
    # Then both answer INVALID_REQUEST, and Kiln changed nothing
    assert through_kiln == at_kafka == INVALID_REQUEST
    assert policies(store, unique_topic) == DEFAULT_POLICIES


def test_altering_kiln_configs_of_a_topic_neither_has_is_unknown_topic(
        kiln: RunningKiln, kafka_bootstrap: str) -> None:
    # When a Kiln config (through Kiln) and a Kafka config (at Kafka) of a topic neither has
    # are set
    topic = f"missing-{uuid.uuid4().hex[:8]}"
    through_kiln = incremental_raw(kiln.bootstrap, topic, [("kiln.harden", SET, "all")])
    at_kafka = incremental_raw(kafka_bootstrap, topic, [("retention.ms", SET, "1000")])
    # Then both answer UNKNOWN_TOPIC_OR_PARTITION, with Kafka's message
    assert through_kiln == at_kafka == (UNKNOWN_TOPIC_OR_PARTITION,
                                        f"The topic '{topic}' does not exist.")


# --- broker configs: Kiln's node stands for Kafka's brokers ----------------------------------


def kafka_broker_id(kafka_bootstrap: str) -> int:
    client = AdminClient({"bootstrap.servers": kafka_bootstrap})
    [node] = client.describe_cluster(request_timeout=TIMEOUT_S).result(TIMEOUT_S).nodes
    return int(node.id)


def broker_configs(bootstrap: str, broker: int | str) -> dict[str, tuple[Any, ...]]:
    resource = ConfigResource("broker", str(broker))
    client = AdminClient({"bootstrap.servers": bootstrap})
    entries = client.describe_configs([resource])[resource].result(TIMEOUT_S)
    return {name: (e.value, ConfigSource(e.source), e.is_read_only)
            for name, e in entries.items()}


def test_kilns_node_is_described_with_the_configs_of_the_kafka_broker_behind_it(
        kiln: RunningKiln, kafka_bootstrap: str) -> None:
    # When confluent-kafka describes the configs of Kiln's node (as DescribeCluster names
    # it), and the Kafka broker's own are asked for at Kafka
    node = kiln.settings.node_id
    through_kiln = broker_configs(kiln.bootstrap, node)
    from_kafka = broker_configs(kafka_bootstrap, kafka_broker_id(kafka_bootstrap))
    # Then they are the Kafka broker's, except those Kiln decides itself, which are Kiln's
    # settings (read-only, from its static configuration)
    own = {"node.id": str(node), "broker.id": str(node), "auto.create.topics.enable": "true"}
    assert set(through_kiln) == set(from_kafka)
    assert {n: v for n, v in through_kiln.items() if n not in own} == {
        n: v for n, v in from_kafka.items() if n not in own}
    assert {n: through_kiln[n] for n in own} == {
        n: (v, ConfigSource.STATIC_BROKER_CONFIG, True) for n, v in own.items()}
    assert through_kiln["default.replication.factor"] == from_kafka["default.replication.factor"]


def test_a_broker_id_other_than_kilns_node_is_refused_as_kafka_refuses_one_not_its_own(
        kiln: RunningKiln, kafka_bootstrap: str) -> None:
    # When Kiln and Kafka are asked for the configs of a broker id neither has
    other = 1000 + kafka_broker_id(kafka_bootstrap)
    [through_kiln] = describe_raw(kiln.bootstrap, [(BROKER, str(other), None)])
    [from_kafka] = describe_raw(kafka_bootstrap, [(BROKER, str(other), None)])
    # Then both answer INVALID_REQUEST
    assert (through_kiln.error_code, through_kiln.configs) == (INVALID_REQUEST, [])
    assert from_kafka.error_code == INVALID_REQUEST


def test_altering_kilns_node_configs_alters_the_kafka_broker_behind_it(
        kiln: RunningKiln, kafka_bootstrap: str) -> None:
    # Given the Kafka broker's log.cleaner.threads, as Kafka describes it
    broker = kafka_broker_id(kafka_bootstrap)
    before = broker_configs(kafka_bootstrap, broker)["log.cleaner.threads"]
    wanted = str(int(before[0]) + 1)
    node = str(kiln.settings.node_id)
    try:
        # When it is set on Kiln's node through Kiln
        code = incremental_raw(kiln.bootstrap, node, [("log.cleaner.threads", SET, wanted)],
                               kind=BROKER)
        # Then Kafka's broker has it, set on the broker, and Kiln's node shows it
        assert code == (0, None)
        assert eventually(lambda: broker_configs(kafka_bootstrap, broker)[
            "log.cleaner.threads"] == (wanted, ConfigSource.DYNAMIC_BROKER_CONFIG, False))
        assert broker_configs(kiln.bootstrap, node)["log.cleaner.threads"][0] == wanted
    finally:
        incremental_raw(kafka_bootstrap, str(broker), [("log.cleaner.threads", DELETE, None)],
                        kind=BROKER)


# --- DescribeCluster ---------------------------------------------------------------------------


def metadata_cluster_id(bootstrap: str) -> str:
    with RawClient(bootstrap) as client:
        return str(client.request(MetadataRequest[12](
            topics=[], allow_auto_topic_creation=False,
            include_topic_authorized_operations=False), 12, MetadataResponse).cluster_id)


def test_describe_cluster_shows_kilns_node_as_metadata_does(
        kiln: RunningKiln, admin: AdminClient, kafka_python_admin: KafkaAdminClient) -> None:
    # When confluent-kafka and kafka-python describe the cluster through Kiln
    through_confluent = admin.describe_cluster(request_timeout=TIMEOUT_S).result(TIMEOUT_S)
    through_kafka_python = kafka_python_admin.describe_cluster()
    # Then both see one broker, Kiln's node at Kiln's address, which is also the
    # controller, under the cluster id Metadata reports; no authorized operations computed
    node, port = kiln.settings.node_id, kiln.app.port
    cluster_id = metadata_cluster_id(kiln.bootstrap)
    assert [(n.id, n.host, n.port, n.rack) for n in through_confluent.nodes] == [
        (node, "127.0.0.1", port, None)]
    assert through_confluent.controller.id == node
    assert through_confluent.cluster_id == cluster_id
    assert through_kafka_python == {
        "cluster_id": cluster_id, "controller_id": node, "authorized_operations": None,
        "brokers": [{"broker_id": node, "host": "127.0.0.1", "port": port, "rack": None,
                     "is_fenced": False}]}


@pytest.mark.parametrize("endpoint_type", [2, 3])
def test_describe_cluster_for_other_endpoints_answers_as_a_kafka_broker(
        kiln: RunningKiln, kafka_bootstrap: str, endpoint_type: int) -> None:
    # When Kiln and a Kafka broker are asked for the controllers (2), or a type no one
    # knows (3)
    def ask(bootstrap: str) -> Any:
        with RawClient(bootstrap) as client:
            return client.request(DescribeClusterRequest[1](
                include_cluster_authorized_operations=False, endpoint_type=endpoint_type),
                1, DescribeClusterResponse)

    through_kiln, at_kafka = ask(kiln.bootstrap), ask(kafka_bootstrap)
    # Then both answer with the same error (MISMATCHED_ENDPOINT_TYPE for controllers,
    # UNSUPPORTED_ENDPOINT_TYPE otherwise) and name no broker
    assert through_kiln.error_code == at_kafka.error_code == {2: 114, 3: 115}[endpoint_type]
    assert (through_kiln.brokers, through_kiln.controller_id) == ([], -1)
