"""A topic's configs as clients see them through Kiln (DescribeConfigs, AlterConfigs,
IncrementalAlterConfigs): the Kafka topic's own configs, relayed from Kafka, plus Kiln's
policies for the topic (storage.topics) as `kiln.*` configs.

This is the one place that splits a request's configs into Kiln's (`kiln.*`, kept in the
topic registry) and Kafka's (every other name, relayed to Kafka unchanged). A change is
checked in full before anything changes — Kiln's keys here, Kafka's by Kafka with
validate_only — so a request that mixes good and bad keys changes nothing; then Kafka is
changed first and Kiln second, as the catalog does for topics, so that a Kafka that refuses or
cannot be reached leaves Kiln as it was.

Kiln's keys are described as Kafka describes a topic's configs: source DYNAMIC_TOPIC_CONFIG
where the topic's value is not Kiln's default, DEFAULT_CONFIG where it is (Kiln keeps values,
not which were set: a value set to the default reads as the default), never read-only or
sensitive. They change as Kafka's do: SET (validated as at creation), DELETE (back to the
default), APPEND/SUBTRACT refused with INVALID_CONFIG as for any config that is not a list;
AlterConfigs replaces the whole set, so `kiln.*` keys it leaves out go back to their
defaults.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass

from storage.catalog import Catalog
from storage.errors import HardenedStoreUnavailable
from storage.kafka.client import (
    ConfigSynonym,
    DescribedConfig,
    DescribedResource,
    KafkaClient,
)
from storage.topics import (
    KILN_CONFIG_PREFIX,
    TopicConfig,
    kiln_configs,
    validate_topic_name,
    with_kiln_configs,
    with_kiln_defaults,
)
from wire.configs import AlterConfigOp, ConfigSource, ConfigType, ResourceType
from wire.errors import ErrorCode, KafkaError

log = logging.getLogger(__name__)

# What a topic gets when nothing is said of a policy: TopicConfig's own defaults.
_DEFAULT_TOPIC = TopicConfig(name="kiln-defaults", partitions=1, topic_id=str(uuid.UUID(int=0)))
DEFAULTS: Mapping[str, str] = kiln_configs(_DEFAULT_TOPIC)

# Type and documentation of each `kiln.*` config, as DescribeConfigs v3+ reports them.
_KILN_CONFIG_INFO: Mapping[str, tuple[ConfigType, str]] = {
    "kiln.reliability": (
        ConfigType.STRING,
        "The reliability level of a record whose producer asks for none: best_effort, "
        "express, reliable_nonpersistent, reliable_persistent or assured_persistent (see "
        "Kiln's reliability levels). Must not be above kiln.max.reliability."),
    "kiln.max.reliability": (
        ConfigType.STRING,
        "The strongest reliability level a producer may ask for (with acks=all, or a "
        "kiln.reliability record header); stronger requests are capped at it."),
    "kiln.producer.override": (
        ConfigType.BOOLEAN,
        "Whether producers may choose a record's reliability level (acks=all, or a "
        "kiln.reliability record header); when false every record gets kiln.reliability."),
    "kiln.harden": (
        ConfigType.STRING,
        "Which persistent records Kiln writes to this Kafka topic: survivors (those not "
        "delivered to every durable subscription before their delay expires), all (every "
        "one, delivered or not) or never (then no level above reliable_nonpersistent)."),
    "kiln.auto.subscribe": (
        ConfigType.BOOLEAN,
        "Whether a consumer group's first offset commit through Kiln makes it a durable "
        "subscription of the topic, whose progress decides which records are delivered."),
}


def is_kiln_config(name: str) -> bool:
    return name.startswith(KILN_CONFIG_PREFIX)


@dataclass(frozen=True, slots=True)
class ConfigChange:
    """One entry of an IncrementalAlterConfigs resource; `operation` as sent (an
    AlterConfigOp, or a number Kafka does not know)."""

    name: str
    operation: int
    value: str | None


@dataclass(frozen=True, slots=True)
class Altered:
    """The answer for one resource of an alter request: NONE, or why nothing changed."""

    error_code: int
    error_message: str | None


ALTERED = Altered(ErrorCode.NONE, None)

# Sends Kafka's part of a change; with True, to be checked only (validate_only).
KafkaChange = Callable[[bool], Awaitable[None]]


class KafkaRefused(Exception):
    """Kafka refused its part of a change: its code and message go to the client as they
    are (codes Kiln has no name for included)."""

    def __init__(self, error_code: int, message: str | None) -> None:
        super().__init__(f"Kafka refused: {error_code} {message}")
        self.error_code = error_code
        self.message = message


# --- Kiln's keys: describing them and changing them (no I/O) --------------------------------


def describe_kiln(config: TopicConfig | None, keys: Collection[str] | None, *,
                  include_synonyms: bool, include_documentation: bool
                  ) -> tuple[DescribedConfig, ...]:
    """The topic's `kiln.*` configs (Kiln's defaults for a topic Kiln has not adopted yet),
    those of `keys` only unless it is None or empty (as Kafka reads an empty key list)."""
    described = []
    for name, value in kiln_configs(config or _DEFAULT_TOPIC).items():
        if keys and name not in keys:
            continue
        default = DEFAULTS[name]
        source = ConfigSource.DEFAULT_CONFIG if value == default else ConfigSource.TOPIC_CONFIG
        # Where the value comes from first, as Kafka lists a topic's synonyms.
        synonyms: tuple[ConfigSynonym, ...] = (
            ConfigSynonym(name, default, ConfigSource.DEFAULT_CONFIG),)
        if source is ConfigSource.TOPIC_CONFIG:
            synonyms = (ConfigSynonym(name, value, ConfigSource.TOPIC_CONFIG), *synonyms)
        config_type, documentation = _KILN_CONFIG_INFO[name]
        described.append(DescribedConfig(
            name, value, read_only=False, config_source=source, is_sensitive=False,
            synonyms=synonyms if include_synonyms else (), config_type=config_type,
            documentation=documentation if include_documentation else None))
    return tuple(described)


def changed_incrementally(config: TopicConfig, changes: Sequence[ConfigChange]) -> TopicConfig:
    """`config` with IncrementalAlterConfigs' `kiln.*` changes applied; KafkaError (with the
    code Kafka gives for the same mistake on one of its own configs) when one is refused."""
    values: dict[str, str] = {}
    deleted: list[str] = []
    for change in changes:
        if change.operation == AlterConfigOp.SET:
            if change.value is None:
                raise KafkaError(ErrorCode.INVALID_REQUEST,
                                 f"Null value not supported for : {change.name}")
            values[change.name] = change.value
        elif change.operation == AlterConfigOp.DELETE:
            deleted.append(change.name)  # an unknown name is no change, as in Kafka
        elif change.operation in (AlterConfigOp.APPEND, AlterConfigOp.SUBTRACT):
            raise KafkaError(ErrorCode.INVALID_CONFIG,
                             f"Can't {AlterConfigOp(change.operation).name} to key "
                             f"{change.name} because its type is not LIST.")
        else:
            raise KafkaError(ErrorCode.INVALID_REQUEST,
                             f"Unknown operations type {change.operation}")
    return with_kiln_configs(with_kiln_defaults(config, deleted), values)


def replaced(config: TopicConfig, values: Mapping[str, str]) -> TopicConfig:
    """`config` whose `kiln.*` configs are `values` and, for those left out, the defaults
    (AlterConfigs replaces the whole set)."""
    return with_kiln_configs(with_kiln_defaults(config, DEFAULTS), values)


def refuse_duplicates(names: Sequence[str]) -> None:
    if len(set(names)) != len(names):
        raise KafkaError(ErrorCode.INVALID_REQUEST, "Error due to duplicate config keys")


_KNOWN_OPERATIONS = frozenset(int(op) for op in AlterConfigOp)


def refuse_unknown_operations(changes: Sequence[ConfigChange]) -> None:
    """Kafka's broker refuses an operation it does not know on a broker's configs, but its
    controller fails on one for a topic's (UNKNOWN_SERVER_ERROR, Kafka 4.4): Kiln refuses
    it for topics too, with the broker's code and message, before anything is changed."""
    for change in changes:
        if change.operation not in _KNOWN_OPERATIONS:
            raise KafkaError(ErrorCode.INVALID_REQUEST,
                             f"Unknown operations type {change.operation}")


# --- both: Kafka's keys relayed, Kiln's kept in the registry --------------------------------


class TopicConfigs:
    """Describes and changes topic configs in Kafka and in Kiln (see the module's
    docstring)."""

    def __init__(self, catalog: Catalog, kafka: KafkaClient) -> None:
        self._catalog = catalog
        self._kafka = kafka

    async def describe(self, resources: Sequence[tuple[str, Sequence[str] | None]], *,
                       include_synonyms: bool, include_documentation: bool
                       ) -> list[DescribedResource]:
        """(topic, keys or None) each: Kafka's configs of the topic, then Kiln's. A topic
        Kafka does not have (yet) but Kiln does has Kiln's only; one neither has is
        UNKNOWN_TOPIC_OR_PARTITION, as Kafka answers it. An illegal name is refused here
        (INVALID_TOPIC_EXCEPTION, as Kafka refuses it): Kafka 4.4 fails on one too long to
        quote in its refusal (UNKNOWN_SERVER_ERROR)."""
        illegal: dict[int, DescribedResource] = {}
        for i, (name, _) in enumerate(resources):
            try:
                validate_topic_name(name)
            except KafkaError as exc:
                illegal[i] = DescribedResource(exc.error_code, exc.message)
        legal = [(name, keys) for i, (name, keys) in enumerate(resources) if i not in illegal]
        from_kafka: Iterator[DescribedResource] = iter(())
        try:
            if legal:
                from_kafka = iter(await self._kafka.describe_configs(
                    [(ResourceType.TOPIC, name, keys) for name, keys in legal],
                    include_synonyms=include_synonyms,
                    include_documentation=include_documentation))
        except HardenedStoreUnavailable as exc:
            unreachable = _unreachable(exc)
            return [illegal.get(i, DescribedResource(unreachable.error_code, unreachable.message))
                    for i in range(len(resources))]
        described = []
        for i, (name, keys) in enumerate(resources):
            if i in illegal:
                described.append(illegal[i])
                continue
            kafka = next(from_kafka)
            in_kafka = kafka.error_code == ErrorCode.NONE
            if not in_kafka and kafka.error_code != ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                described.append(kafka)
                continue
            try:
                # Fresh: an admin reads back what it just altered (the cache may lag).
                config = await self._catalog.registry.get(name, fresh=True)
            except KafkaError as exc:
                described.append(DescribedResource(exc.error_code, exc.message))
                continue
            if not in_kafka and config is None:
                described.append(kafka)
                continue
            own = describe_kiln(config, keys, include_synonyms=include_synonyms,
                                include_documentation=include_documentation)
            described.append(DescribedResource(ErrorCode.NONE, "", kafka.configs + own))
        return described

    async def alter_incrementally(self, name: str, changes: Sequence[ConfigChange], *,
                                  validate_only: bool) -> Altered:
        try:
            validate_topic_name(name)
            refuse_duplicates([change.name for change in changes])
            refuse_unknown_operations(changes)
            kiln = [change for change in changes if is_kiln_config(change.name)]
            kafka = [(change.name, change.operation, change.value) for change in changes
                     if not is_kiln_config(change.name)]
            current = updated = None
            if kiln:
                current = await self._topic_to_change(name)
                updated = changed_incrementally(current, kiln)

            async def to_kafka(check_only: bool) -> None:
                if kafka:
                    raise_refusal(await self._kafka.incremental_alter_configs(
                        ResourceType.TOPIC, name, kafka, validate_only=check_only))

            await self._change(name, current, updated, to_kafka, validate_only=validate_only)
        except (KafkaError, KafkaRefused) as exc:
            return Altered(exc.error_code, exc.message)
        return ALTERED

    async def replace(self, name: str, values: Sequence[tuple[str, str | None]], *,
                      validate_only: bool) -> Altered:
        """AlterConfigs: the topic's configs become `values`, in Kafka (its own keys) and in
        Kiln (`kiln.*`: those left out go back to Kiln's defaults)."""
        try:
            validate_topic_name(name)
            refuse_duplicates([key for key, _ in values])
            kiln: dict[str, str] = {}
            kafka: dict[str, str | None] = {}
            for key, value in values:
                if value is None:
                    raise KafkaError(ErrorCode.INVALID_REQUEST,
                                     f"Null value not supported for : {key}")
                if is_kiln_config(key):
                    kiln[key] = value
                else:
                    kafka[key] = value
            # A topic Kiln has not adopted keeps Kiln's defaults: nothing to change there
            # unless it is given `kiln.*` configs.
            current = (await self._topic_to_change(name) if kiln
                       else await self._catalog.registry.get(name, fresh=True))
            updated = None if current is None else replaced(current, kiln)

            async def to_kafka(check_only: bool) -> None:
                raise_refusal(await self._kafka.alter_configs(
                    ResourceType.TOPIC, name, kafka, validate_only=check_only))

            await self._change(name, current, updated, to_kafka, validate_only=validate_only)
        except (KafkaError, KafkaRefused) as exc:
            return Altered(exc.error_code, exc.message)
        return ALTERED

    async def _change(self, name: str, current: TopicConfig | None,
                      updated: TopicConfig | None, to_kafka: KafkaChange, *,
                      validate_only: bool) -> None:
        """Kafka's part, then Kiln's; when Kiln's part changes something Kafka checks its
        part first, so that either both change or neither does."""
        kiln_changes = updated is not None and updated != current
        try:
            if kiln_changes and not validate_only:
                await to_kafka(True)
            await to_kafka(validate_only)
        except HardenedStoreUnavailable as exc:
            raise _unreachable(exc) from exc
        if validate_only or not kiln_changes:
            return
        assert updated is not None
        await self._catalog.registry.update_policies(updated)
        log.info("topic %s: Kiln's configs now %s", name, kiln_configs(updated))

    async def _topic_to_change(self, name: str) -> TopicConfig:
        """The topic as Redis holds it now; one that only Kafka has is adopted first (its
        policies must be kept somewhere), even to validate a change."""
        config = await self._catalog.registry.get(name, fresh=True)
        if config is None:
            config = await self._catalog.lookup(name, allow_create=False)
        if config is None:
            raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                             f"The topic '{name}' does not exist.")
        return config


def raise_refusal(answer: tuple[int, str | None]) -> None:
    """Kafka's (error code, message) for a change: KafkaRefused unless it is NONE."""
    code, message = answer
    if code != ErrorCode.NONE:
        raise KafkaRefused(code, message)


def _unreachable(exc: HardenedStoreUnavailable) -> KafkaError:
    """What a Kafka broker answers an admin request when it cannot reach its controller."""
    return KafkaError(ErrorCode.REQUEST_TIMED_OUT, f"Kafka cannot be reached: {exc.message}")
