"""Lookups of topic names that exist nowhere cost Kafka at most one listing per interval,
however many names are asked for; a name found missing is not asked about again for a
while; a topic that appears in Kafka is still found."""

from __future__ import annotations

import asyncio
from typing import Any

from storage.catalog import Catalog, CatalogSettings
from storage.errors import HardenedTopicMissing
from storage.kafka.client import KafkaClient
from storage.log_queue import LogQueue
from storage.model import TopicPartition
from storage.topics import Deletion, TopicConfig, TopicRegistry

SETTINGS = CatalogSettings(auto_create_topics=False, kafka_listing_ttl_s=5.0,
                           missing_refresh_interval_s=1.0, max_missing_names=100)


class MemoryTopics(TopicRegistry):
    def __init__(self) -> None:  # no Redis
        self.topics: dict[str, TopicConfig] = {}

    async def get(self, name: str) -> TopicConfig | None:
        return self.topics.get(name)

    async def all(self) -> dict[str, TopicConfig]:
        return dict(self.topics)

    async def create(self, config: TopicConfig) -> TopicConfig:
        self.topics[config.name] = config
        return config

    async def deletion(self, name: str) -> Deletion | None:
        return None  # no topic was ever deleted here

    async def forget_deletion(self, name: str) -> Deletion | None:
        return None


class MemoryQueue(LogQueue):
    def __init__(self) -> None:  # no Redis
        self.next_offsets: dict[TopicPartition, int] = {}

    async def started(self, tp: TopicPartition) -> bool:
        return tp in self.next_offsets

    async def initialize(self, tp: TopicPartition, next_offset: int) -> bool:
        self.next_offsets[tp] = next_offset
        return True


class CountingKafka(KafkaClient):
    """Kafka's topic listing, counted; `topics` is what Kafka has."""

    def __init__(self) -> None:  # no connection
        self.topics: dict[str, int] = {}
        self.listings = 0

    async def list_topics(self) -> dict[str, int]:
        self.listings += 1
        await asyncio.sleep(0)  # let concurrent lookups pile up behind the listing
        return dict(self.topics)

    async def init_producer_id(self, transactional_id: str | None, *args: Any,
                               **kwargs: Any) -> tuple[int, int]:
        # Adopting a topic reads where Kafka's copy ends; this Kafka holds no records.
        raise HardenedTopicMissing(f"{transactional_id}: no records in this fake Kafka")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def catalog(kafka: CountingKafka, clock: Clock) -> Catalog:
    return Catalog(MemoryTopics(), MemoryQueue(), kafka, SETTINGS, clock=clock)


def test_a_thousand_lookups_of_missing_names_list_kafka_once() -> None:
    async def scenario() -> tuple[list[TopicConfig | None], int]:
        kafka, clock = CountingKafka(), Clock()
        topics = catalog(kafka, clock)
        found = list(await asyncio.gather(*(
            topics.lookup(f"missing-{i}", allow_create=False) for i in range(500))))
        for i in range(500, 1000):
            clock.now += 0.001  # 0.5 s more in all
            found.append(await topics.lookup(f"missing-{i}", allow_create=False))
        return found, kafka.listings

    found, listings = asyncio.run(scenario())

    assert found == [None] * 1000
    assert listings == 1


def test_names_found_missing_are_not_asked_about_until_their_time_is_up() -> None:
    async def scenario() -> list[int]:
        kafka, clock = CountingKafka(), Clock()
        topics = catalog(kafka, clock)
        counts = []
        for _ in range(3):  # the same missing names, 2 s apart: remembered as missing
            for i in range(50):
                await topics.lookup(f"missing-{i}", allow_create=False)
            counts.append(kafka.listings)
            clock.now += 2.0
        await topics.lookup("never-asked", allow_create=False)  # a new name: listed again
        counts.append(kafka.listings)
        clock.now += 5.0
        await topics.lookup("missing-0", allow_create=False)  # forgotten: listed again
        counts.append(kafka.listings)
        return counts

    assert asyncio.run(scenario()) == [1, 1, 1, 2, 3]


def test_a_topic_that_appears_in_kafka_is_adopted_once_the_listing_is_too_old() -> None:
    async def scenario() -> tuple[TopicConfig | None, TopicConfig | None, int]:
        kafka, clock = CountingKafka(), Clock()
        topics = catalog(kafka, clock)
        await topics.lookup("orders", allow_create=False)
        # Created in Kafka behind Kiln's back, right after Kiln listed Kafka
        kafka.topics["payments"] = 3
        too_soon = await topics.lookup("payments", allow_create=False)
        clock.now += 5.0  # the listing that lacked it is now too old to trust
        adopted = await topics.lookup("payments", allow_create=False)
        return too_soon, adopted, kafka.listings

    too_soon, adopted, listings = asyncio.run(scenario())

    assert too_soon is None
    assert adopted is not None and (adopted.name, adopted.partitions) == ("payments", 3)
    assert listings == 2
