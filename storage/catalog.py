"""Topics as Kiln and Kafka both see them: one place that keeps the two in step.

A topic exists in Kiln's registry (what clients see through Kiln) and in Kafka (where its
survivors are hardened), with the same name and partition count. Topics that already exist
in Kafka are adopted with their partition count.

A name Kiln does not know is looked for in Kafka's topic listing, but clients can ask for
any number of names that exist nowhere: Kafka is listed again for such a lookup at most once
per `missing_refresh_interval_s`, shared by all lookups (concurrent ones wait for the same
listing), and a name found missing is not asked about again for `kafka_listing_ttl_s` (at
most `max_missing_names` are remembered). A topic created in Kafka behind Kiln's back is
therefore seen within seconds rather than at once; a client told UNKNOWN_TOPIC_OR_PARTITION
meanwhile retries. Auto-creation always lists Kafka afresh first, so it adopts a topic
Kafka has rather than starting one anew.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from proxy.protocol.errors import ErrorCode, KafkaError
from storage.appender import PartitionStarts
from storage.errors import HardenedStoreUnavailable
from storage.kafka.client import KafkaClient
from storage.log_queue import LogQueue
from storage.model import TopicPartition
from storage.topics import (
    TopicConfig,
    TopicRegistry,
    new_topic,
    split_configs,
    validate_topic_name,
    with_kiln_configs,
)

log = logging.getLogger(__name__)

# A topic adopted from Kafka gets an id made from its name, so it is the same id before it
# is adopted (listed) and after.
_ADOPTED_TOPIC_IDS = uuid.UUID("6b696c6e-6164-6f70-7465-642d746f7069")


@dataclass(frozen=True, slots=True)
class CatalogSettings:
    auto_create_topics: bool = True
    default_partitions: int = 1
    # How long a listing of Kafka's topics is trusted before it is asked again.
    kafka_listing_ttl_s: float = 5.0
    # Lookups of names Kiln does not know list Kafka again at most this often.
    missing_refresh_interval_s: float = 1.0
    # How many names found missing are remembered (for `kafka_listing_ttl_s` each).
    max_missing_names: int = 10_000


class Catalog:
    def __init__(self, registry: TopicRegistry, queue: LogQueue, kafka: KafkaClient,
                 settings: CatalogSettings, starts: PartitionStarts | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._registry = registry
        self._adopting: dict[str, asyncio.Lock] = {}
        self._queue = queue
        self._kafka = kafka
        self._starts = PartitionStarts(queue, kafka) if starts is None else starts
        self._settings = settings
        self._kafka_topics: dict[str, int] = {}
        self._kafka_listed_at = float("-inf")  # the last listing that succeeded
        self._kafka_asked_at = float("-inf")  # the last attempt, successful or not
        self._listing = asyncio.Lock()
        self._listings_started = 0
        self._missing: OrderedDict[str, float] = OrderedDict()  # name -> when found missing

    @property
    def starts(self) -> PartitionStarts:
        """Starting partitions Redis does not know (shared with the appender)."""
        return self._starts

    @property
    def registry(self) -> TopicRegistry:
        return self._registry

    @property
    def settings(self) -> CatalogSettings:
        return self._settings

    async def lookup(self, name: str, *, allow_create: bool) -> TopicConfig | None:
        """The topic, adopting it from Kafka or auto-creating it where allowed."""
        found = await self._registry.get(name)
        if found is not None:
            return found
        kafka = await self._listing_for_unknown(name)
        if name in kafka:
            return await self._adopt(name, kafka[name])
        if not (allow_create and self._settings.auto_create_topics):
            return None
        validate_topic_name(name)
        # A topic created in Kafka since the last listing must be adopted (its Kiln offsets
        # continue after Kafka's), not created afresh from offset 0.
        kafka = await self._kafka_listing(refresh=True)
        if name in kafka:
            return await self._adopt(name, kafka[name])
        try:
            return await self.create(name, self._settings.default_partitions,
                                     require_kafka=False)
        except KafkaError as exc:
            # Another Kiln process (or request) created it meanwhile: that is the topic.
            created = await self._registry.get(name)
            if exc.error_code is not ErrorCode.TOPIC_ALREADY_EXISTS or created is None:
                raise
            return created

    async def _listing_for_unknown(self, name: str) -> dict[str, int]:
        """Kafka's listing as fresh as a lookup of a name Kiln does not know deserves."""
        now = self._clock()
        missing_since = self._missing.get(name)
        recently_missing = (missing_since is not None
                            and now - missing_since < self._settings.kafka_listing_ttl_s)
        due = now - self._kafka_asked_at >= self._settings.missing_refresh_interval_s
        kafka = (await self._kafka_listing(refresh=True) if due and not recently_missing
                 else self._kafka_topics)
        if name in kafka:
            self._missing.pop(name, None)
        elif not recently_missing:
            # Missing since the listing that lacked it, however old that listing was.
            self._missing[name] = self._kafka_asked_at
            self._missing.move_to_end(name)
            while len(self._missing) > self._settings.max_missing_names:
                self._missing.popitem(last=False)
        return kafka

    async def all(self) -> dict[str, TopicConfig]:
        """Kiln's topics, plus the topics Kafka has that Kiln has not adopted, as they would
        be adopted. Those are not adopted now: a topic is adopted when a client first uses
        it, so listing every topic starts nothing in Redis and writes nothing to Kafka."""
        topics = await self._registry.all()
        for name, partitions in (await self._kafka_listing(refresh=False)).items():
            if name not in topics:
                topics[name] = _as_adopted(name, partitions)
        return topics

    async def _adopt(self, name: str, partitions: int) -> TopicConfig:
        """Adopt once, however many callers ask at the same time."""
        async with self._adopting.setdefault(name, asyncio.Lock()):
            adopted = await self._registry.get(name)
            if adopted is not None:
                return adopted
            return await self._adopt_now(name, partitions)

    async def _adopt_now(self, name: str, partitions: int) -> TopicConfig:
        """Register a topic that Kafka has and Kiln does not (new to Kiln, or Redis lost its
        data): each partition's Kiln offsets continue after the last one Kafka holds, or,
        when Kafka holds none, after Kafka's own offsets. A record in Kafka without a Kiln
        offset is read through Kiln at its Kafka offset, so offsets stay one increasing
        sequence."""
        for partition in range(partitions):
            await self._starts.start(TopicPartition(name, partition))
        log.info("adopted Kafka topic %s (%d partitions)", name, partitions)
        return await self._registry.create(_as_adopted(name, partitions))

    async def create(self, name: str, partitions: int, *, require_kafka: bool,
                     validate_only: bool = False,
                     configs: Mapping[str, str | None] | None = None) -> TopicConfig:
        """Create in Kafka, then in Kiln. With require_kafka=False an unreachable Kafka is
        tolerated: the hardener creates the Kafka topic before it first writes to it.
        `configs`: `kiln.*` ones set Kiln's policy for the topic, the rest go to Kafka."""
        kiln, kafka_configs = split_configs(configs or {})
        config = with_kiln_configs(new_topic(name, partitions), kiln)
        if await self._registry.get(name) is not None:
            raise KafkaError(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists")
        in_kafka = (await self._kafka_listing(refresh=True)).get(name) if require_kafka else None
        if in_kafka is not None:
            # Registering it afresh would restart its Kiln offsets below those Kafka holds.
            await self._adopt(name, in_kafka)
            raise KafkaError(ErrorCode.TOPIC_ALREADY_EXISTS,
                             f"topic {name!r} already exists in Kafka ({in_kafka} partitions); "
                             "Kiln has adopted it")
        if validate_only:
            return config
        try:
            partitions = await self.ensure_in_kafka(name, partitions, configs=kafka_configs)
        except HardenedStoreUnavailable:
            if require_kafka:
                raise
            log.warning("Kafka unreachable; topic %s created in Kiln only for now", name)
        created = await self._registry.create(dataclasses.replace(config, partitions=partitions))
        for partition in range(created.partitions):
            # Kafka holds none of a new topic's records: its offsets start at 0.
            await self._queue.initialize(TopicPartition(name, partition), 0)
        log.info("topic %s created with %d partitions", name, created.partitions)
        return created

    async def ensure_in_kafka(self, name: str, partitions: int, *, fresh: bool = False,
                              configs: Mapping[str, str] | None = None) -> int:
        """Make sure Kafka has the topic; returns Kafka's partition count for it. With
        `fresh`, Kafka is asked again rather than trusting the cached listing (a broker that
        came back empty must not be written to as if it had the topic)."""
        existing = (await self._kafka_listing(refresh=fresh)).get(name)
        if existing is not None:
            return existing
        # False when it already exists
        await self._kafka.create_topic(name, partitions, configs=dict(configs or {}))
        kafka = await self._kafka_listing(refresh=True)
        return kafka.get(name, partitions)

    async def _kafka_listing(self, *, refresh: bool) -> dict[str, int]:
        if not refresh and (self._clock() - self._kafka_listed_at
                            <= self._settings.kafka_listing_ttl_s):
            return self._kafka_topics
        started_before = self._listings_started
        async with self._listing:
            # A listing that started while this caller waited is as fresh as it asked for.
            if self._listings_started > started_before:
                return self._kafka_topics
            self._listings_started += 1
            asked_at = self._kafka_asked_at = self._clock()
            try:
                self._kafka_topics = await self._kafka.list_topics()
                self._kafka_listed_at = asked_at
            except HardenedStoreUnavailable as exc:
                log.debug("cannot list Kafka topics: %s", exc)
        return self._kafka_topics


def _as_adopted(name: str, partitions: int) -> TopicConfig:
    return new_topic(name, partitions, topic_id=uuid.uuid5(_ADOPTED_TOPIC_IDS, name))
