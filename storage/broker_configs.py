"""Broker configs through Kiln, whose node stands in for the brokers of the Kafka cluster
behind it (clients see Kiln as the cluster's only broker: Metadata, DescribeCluster).

Clients ask for a broker's configs to learn how the cluster behaves (Debezium, for one, reads
`default.replication.factor` of a node DescribeCluster named). Kiln answers for its node
with the configs of the Kafka broker with the lowest id — the cluster Kiln hardens into —
except those Kiln decides itself, which are Kiln's own settings (source STATIC_BROKER_CONFIG,
read-only): `node.id` and `broker.id` (Kiln's node id), `auto.create.topics.enable` (Kiln
auto-creates topics, not Kafka) and, when Kiln is configured with a count of its own,
`num.partitions`. The cluster-wide defaults (the empty resource name) are Kafka's, relayed.

Changes are relayed to Kafka: the cluster-wide defaults as they are, those of Kiln's node to
every Kafka broker it stands for (each checked with validate_only first, so that they change
together or not at all), so that what is described afterwards is what was set. Kafka refuses
the keys Kiln decides itself (they are not dynamic configs). Any other broker id is refused
with INVALID_REQUEST, as a Kafka broker refuses an id not its own.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence

from storage.catalog import KAFKA_DEFAULT, CatalogSettings
from storage.errors import HardenedStoreUnavailable
from storage.kafka.client import ConfigSynonym, DescribedResource, KafkaClient
from storage.topic_configs import (
    ALTERED,
    Altered,
    ConfigChange,
    KafkaRefused,
    raise_refusal,
)
from wire.configs import ConfigSource, ResourceType
from wire.errors import ErrorCode, KafkaError

log = logging.getLogger(__name__)

# Sends a change of one broker's configs to Kafka: (resource name, node to ask or None for
# any, validate_only) -> Kafka's (error code, message).
BrokerChange = Callable[[str, int | None, bool], Awaitable[tuple[int, str | None]]]


def kiln_broker_configs(node_id: int, catalog: CatalogSettings) -> dict[str, str]:
    """The broker configs Kiln decides itself, as their values read."""
    own = {"node.id": str(node_id), "broker.id": str(node_id),
           "auto.create.topics.enable": str(catalog.auto_create_topics).lower()}
    if catalog.default_partitions != KAFKA_DEFAULT:
        own["num.partitions"] = str(catalog.default_partitions)
    return own


class BrokerConfigs:
    def __init__(self, kafka: KafkaClient, node_id: int, own: Mapping[str, str]) -> None:
        self._kafka = kafka
        self._node_id = node_id
        self._own = dict(own)

    async def describe(self, name: str, keys: Sequence[str] | None, *, include_synonyms: bool,
                       include_documentation: bool) -> DescribedResource:
        try:
            stand_in = None if self._node_named(name) is None else \
                (await self._kafka_brokers())[0]
            [answer] = await self._kafka.describe_configs(
                [(ResourceType.BROKER, "" if stand_in is None else str(stand_in), keys)],
                include_synonyms=include_synonyms,
                include_documentation=include_documentation, node_id=stand_in)
        except HardenedStoreUnavailable as exc:
            return DescribedResource(ErrorCode.REQUEST_TIMED_OUT,
                                     f"Kafka cannot be reached: {exc.message}")
        except KafkaError as exc:
            return DescribedResource(exc.error_code, exc.message)
        if stand_in is None or answer.error_code != ErrorCode.NONE:
            return answer
        return dataclasses.replace(answer, configs=tuple(
            c if c.name not in self._own else dataclasses.replace(
                c, value=self._own[c.name], read_only=True,
                config_source=ConfigSource.STATIC_BROKER_CONFIG,
                synonyms=(ConfigSynonym(c.name, self._own[c.name],
                                        ConfigSource.STATIC_BROKER_CONFIG),)
                if include_synonyms else ())
            for c in answer.configs))

    async def replace(self, name: str, values: Sequence[tuple[str, str | None]], *,
                      validate_only: bool) -> Altered:
        """AlterConfigs of the broker resource `name` (see `_alter`)."""
        async def send(resource_name: str, node_id: int | None, check_only: bool
                       ) -> tuple[int, str | None]:
            return await self._kafka.alter_configs(ResourceType.BROKER, resource_name,
                                                   dict(values), validate_only=check_only,
                                                   node_id=node_id)

        return await self._alter(name, send, validate_only=validate_only)

    async def alter_incrementally(self, name: str, changes: Sequence[ConfigChange], *,
                                  validate_only: bool) -> Altered:
        """IncrementalAlterConfigs of the broker resource `name` (see `_alter`)."""
        async def send(resource_name: str, node_id: int | None, check_only: bool
                       ) -> tuple[int, str | None]:
            return await self._kafka.incremental_alter_configs(
                ResourceType.BROKER, resource_name,
                [(c.name, c.operation, c.value) for c in changes],
                validate_only=check_only, node_id=node_id)

        return await self._alter(name, send, validate_only=validate_only)

    async def _alter(self, name: str, send: BrokerChange, *, validate_only: bool) -> Altered:
        """Change the cluster-wide defaults (`name` empty) or the configs of every Kafka
        broker Kiln's node stands for (`name` Kiln's node id)."""
        try:
            if self._node_named(name) is None:
                raise_refusal(await send("", None, validate_only))
                return ALTERED
            brokers = await self._kafka_brokers()
            if len(brokers) > 1 and not validate_only:
                for broker in brokers:  # all of them, or none
                    raise_refusal(await send(str(broker), broker, True))
            for broker in brokers:
                raise_refusal(await send(str(broker), broker, validate_only))
            if not validate_only:
                log.info("broker configs changed on Kafka brokers %s", brokers)
        except HardenedStoreUnavailable as exc:
            return Altered(ErrorCode.REQUEST_TIMED_OUT, f"Kafka cannot be reached: {exc.message}")
        except (KafkaError, KafkaRefused) as exc:
            return Altered(exc.error_code, exc.message)
        return ALTERED

    async def _kafka_brokers(self) -> list[int]:
        brokers = await self._kafka.broker_ids()
        if not brokers:
            raise HardenedStoreUnavailable("the Kafka cluster lists no brokers")
        return brokers

    def _node_named(self, name: str) -> int | None:
        """Kiln's node id for its own name, None for the cluster-wide defaults (""); a name
        that is neither is refused as a Kafka broker refuses it."""
        if name == "":
            return None
        try:
            node = int(name)
        except ValueError:
            raise KafkaError(ErrorCode.INVALID_REQUEST,
                             f"Broker id must be an integer, but it is: {name}") from None
        if node != self._node_id:
            raise KafkaError(ErrorCode.INVALID_REQUEST,
                             f"Unexpected broker id, expected {self._node_id} or empty string, "
                             f"but received {name}")
        return node
