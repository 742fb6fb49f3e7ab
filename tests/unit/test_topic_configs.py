"""Kiln's `kiln.*` topic configs as DescribeConfigs shows them and as the alter APIs change
them (storage/topic_configs.py), and the broker configs Kiln's node reports as its own
(storage/broker_configs.py), without I/O."""

from __future__ import annotations

import dataclasses

import pytest

from storage.broker_configs import kiln_broker_configs
from storage.catalog import CatalogSettings
from storage.kafka.client import ConfigSynonym
from storage.model import Reliability
from storage.topic_configs import (
    DEFAULTS,
    ConfigChange,
    changed_incrementally,
    describe_kiln,
    refuse_duplicates,
    replaced,
)
from storage.topics import HardenPolicy, kiln_configs, new_topic
from wire.configs import AlterConfigOp, ConfigSource, ConfigType
from wire.errors import ErrorCode, KafkaError

TOPIC = new_topic("orders", 3)


def test_every_kiln_config_is_described_with_its_default_when_none_is_set() -> None:
    # When a topic with Kiln's defaults is described, every key asked for (none: all)
    described = describe_kiln(TOPIC, None, include_synonyms=True, include_documentation=True)
    # Then each of Kiln's configs is there once, at its default, from DEFAULT_CONFIG, with
    # its type, its documentation and the default as its only synonym
    assert [c.name for c in described] == list(kiln_configs(TOPIC))
    assert {c.name: c.value for c in described} == dict(DEFAULTS)
    for config in described:
        assert config.config_source == ConfigSource.DEFAULT_CONFIG
        assert (config.read_only, config.is_sensitive) == (False, False)
        assert config.synonyms == (ConfigSynonym(config.name, config.value,
                                                 ConfigSource.DEFAULT_CONFIG),)
        assert config.documentation
    assert {c.name: c.config_type for c in described} == {
        "kiln.reliability": ConfigType.STRING, "kiln.max.reliability": ConfigType.STRING,
        "kiln.producer.override": ConfigType.BOOLEAN, "kiln.harden": ConfigType.STRING,
        "kiln.auto.subscribe": ConfigType.BOOLEAN}


def test_a_value_other_than_the_default_is_described_as_set_on_the_topic() -> None:
    # Given a topic hardening every record
    topic = dataclasses.replace(TOPIC, harden=HardenPolicy.ALL)
    # When its kiln.harden and an unknown name are asked for, without synonyms or docs
    [described] = describe_kiln(topic, ["kiln.harden", "retention.ms"],
                                include_synonyms=False, include_documentation=False)
    # Then kiln.harden alone is there, from DYNAMIC_TOPIC_CONFIG, with no extras
    assert (described.name, described.value, described.config_source) == (
        "kiln.harden", "all", ConfigSource.TOPIC_CONFIG)
    assert (described.synonyms, described.documentation) == ((), None)


def test_set_and_delete_change_kilns_configs() -> None:
    # Given a topic that hardens every record and whose producers cannot choose levels
    topic = dataclasses.replace(TOPIC, harden=HardenPolicy.ALL, producer_override=False)
    # When kiln.reliability is set and kiln.harden deleted
    changed = changed_incrementally(topic, [
        ConfigChange("kiln.reliability", AlterConfigOp.SET, "express"),
        ConfigChange("kiln.harden", AlterConfigOp.DELETE, None)])
    # Then the level is set, kiln.harden is back at its default, the rest as it was
    assert (changed.reliability, changed.harden, changed.producer_override) == (
        Reliability.EXPRESS, HardenPolicy.SURVIVORS, False)


def test_a_level_deleted_under_harden_never_comes_back_capped() -> None:
    # Given a topic that never hardens (its levels capped at reliable_nonpersistent)
    never = changed_incrementally(TOPIC, [ConfigChange("kiln.harden", AlterConfigOp.SET,
                                                       "never")])
    assert never.max_reliability is Reliability.RELIABLE_NONPERSISTENT
    # When kiln.max.reliability is deleted
    changed = changed_incrementally(never, [ConfigChange("kiln.max.reliability",
                                                         AlterConfigOp.DELETE, None)])
    # Then it is back at the default as far as kiln.harden=never allows
    assert changed.max_reliability is Reliability.RELIABLE_NONPERSISTENT


@pytest.mark.parametrize("change,code", [
    (ConfigChange("kiln.harden", AlterConfigOp.APPEND, "all"), ErrorCode.INVALID_CONFIG),
    (ConfigChange("kiln.harden", AlterConfigOp.SUBTRACT, "all"), ErrorCode.INVALID_CONFIG),
    (ConfigChange("kiln.harden", AlterConfigOp.SET, None), ErrorCode.INVALID_REQUEST),
    (ConfigChange("kiln.harden", 9, "all"), ErrorCode.INVALID_REQUEST),
    (ConfigChange("kiln.harden", AlterConfigOp.SET, "sometimes"), ErrorCode.INVALID_CONFIG),
    (ConfigChange("kiln.unknown", AlterConfigOp.SET, "1"), ErrorCode.INVALID_CONFIG),
])
def test_changes_kafka_would_refuse_are_refused_with_kafkas_code(
        change: ConfigChange, code: ErrorCode) -> None:
    # When a change that is not valid is applied
    with pytest.raises(KafkaError) as refused:
        changed_incrementally(TOPIC, [change])
    # Then it is refused with the code Kafka gives for the same mistake
    assert refused.value.error_code is code


def test_replacing_puts_the_configs_left_out_back_to_their_defaults() -> None:
    # Given a topic with three of Kiln's configs set
    topic = dataclasses.replace(TOPIC, harden=HardenPolicy.ALL, auto_subscribe=False,
                                reliability=Reliability.EXPRESS)
    # When its configs are replaced by kiln.auto.subscribe alone
    changed = replaced(topic, {"kiln.auto.subscribe": "false"})
    # Then that one is kept and the other two are back at their defaults
    assert kiln_configs(changed) == {**DEFAULTS, "kiln.auto.subscribe": "false"}


def test_a_config_named_twice_is_invalid_request() -> None:
    with pytest.raises(KafkaError) as refused:
        refuse_duplicates(["retention.ms", "kiln.harden", "kiln.harden"])
    assert refused.value.error_code is ErrorCode.INVALID_REQUEST


def test_kilns_node_reports_its_own_settings_where_kiln_decides() -> None:
    # When Kiln's node 5 auto-creates no topics and gives new ones 3 partitions
    own = kiln_broker_configs(5, CatalogSettings(auto_create_topics=False,
                                                 default_partitions=3))
    # Then those are the broker configs it reports as its own, with its node id
    assert own == {"node.id": "5", "broker.id": "5", "auto.create.topics.enable": "false",
                   "num.partitions": "3"}
    # And with Kafka's partition count (the default) num.partitions is Kafka's to report
    assert "num.partitions" not in kiln_broker_configs(5, CatalogSettings())
