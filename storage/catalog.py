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

Administration changes Kafka first, then Kiln, so that a Kafka that refuses or cannot be
reached leaves Kiln as it was: creating (Kafka validates its own configs, Kiln its `kiln.*`
ones, before anything is created), adding partitions, deleting. A deleted topic leaves a note
in the registry: while it is there no process adopts the topic again from a listing of Kafka
taken before the deletion finished, and the hardener does not create it again in Kafka.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from storage.appender import PartitionStarts
from storage.clock import wall_clock_ms
from storage.errors import HardenedStoreUnavailable, StorageError
from storage.kafka.client import DescribedConfig, KafkaClient, TopicCreation
from storage.log_queue import LogQueue
from storage.model import TopicPartition
from storage.operator_requests import clear_flush
from storage.topics import (
    Deletion,
    TopicConfig,
    TopicGone,
    TopicRegistry,
    new_topic,
    split_configs,
    validate_topic_name,
    with_kiln_configs,
)
from wire.errors import ErrorCode, KafkaError

log = logging.getLogger(__name__)

# A topic adopted from Kafka gets an id made from its name, so it is the same id before it
# is adopted (listed) and after.
_ADOPTED_TOPIC_IDS = uuid.UUID("6b696c6e-6164-6f70-7465-642d746f7069")

# `default_partitions` that means: as many as the Kafka cluster gives a topic created without
# a count (its brokers' num.partitions).
KAFKA_DEFAULT = 0
_NUM_PARTITIONS = "num.partitions"
# A listing of Kafka proves a deleted topic is back only if taken this long after the deletion
# finished (the two times come from the clocks of two processes, maybe of two hosts).
_CLOCK_SKEW_MS = 1_000
# A deletion noted as started this long ago and never finished was interrupted (its process
# died): it no longer stops the name from being created anew.
_DELETION_ABANDONED_MS = 120_000

# Told of a topic's deletion: (name, the most partitions it had).
DeletionListener = Callable[[str, int], Awaitable[object]]


@dataclass(frozen=True, slots=True)
class CatalogSettings:
    auto_create_topics: bool = True
    # Partitions of a topic created without a count (auto-created, or CreateTopics asking for
    # the default); KAFKA_DEFAULT: Kafka's num.partitions, read once per kafka_defaults_ttl_s.
    default_partitions: int = KAFKA_DEFAULT
    kafka_defaults_ttl_s: float = 300.0
    # How long a listing of Kafka's topics is trusted before it is asked again.
    kafka_listing_ttl_s: float = 5.0
    # Lookups of names Kiln does not know list Kafka again at most this often.
    missing_refresh_interval_s: float = 1.0
    # How many names found missing are remembered (for `kafka_listing_ttl_s` each).
    max_missing_names: int = 10_000


@dataclass(frozen=True, slots=True)
class CreatedTopic:
    """A topic as created (or, validate_only, as it would be), with what Kafka said of it."""

    topic: TopicConfig
    replication_factor: int  # -1 where Kafka did not say (created in Kiln only)
    kafka_configs: tuple[DescribedConfig, ...]  # as Kafka reports them; () where it did not


@dataclass(frozen=True, slots=True)
class DeletedTopic:
    name: str
    partitions: int  # the most it had, in Kiln or in Kafka
    in_kiln: bool  # registered in Kiln (else only Kafka had it)
    in_kafka: bool  # Kafka had it (else only Kiln had it: created while Kafka was away)


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
        self._listed_wall_ms = 0  # when the last listing that succeeded was asked for
        self._kafka_default: tuple[int, float] | None = None  # (num.partitions, read at)
        self._deleting: list[DeletionListener] = []
        self._deleted: list[DeletionListener] = []
        self._being_deleted: set[str] = set()  # by this process, now

    def on_deleting(self, listener: DeletionListener) -> None:
        """Have `listener` told before a topic's state is removed (to stop working on it)."""
        self._deleting.append(listener)

    def on_deleted(self, listener: DeletionListener) -> None:
        """Have `listener` told after a topic was deleted (to forget what it kept of it)."""
        self._deleted.append(listener)

    def being_deleted(self, name: str) -> bool:
        """Whether this process is deleting the topic now (work on it must not start)."""
        return name in self._being_deleted

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
            adopted = await self._adopt(name, kafka[name])
            if adopted is not None:
                return adopted
        if not (allow_create and self._settings.auto_create_topics):
            return None
        validate_topic_name(name)
        # A topic created in Kafka since the last listing must be adopted (its Kiln offsets
        # continue after Kafka's), not created afresh from offset 0.
        kafka = await self._kafka_listing(refresh=True)
        if name in kafka:
            # Not adopted: Kiln is deleting it (the client retries, and finds it gone).
            return await self._adopt(name, kafka[name])
        try:
            return await self.create(name, None, require_kafka=False)
        except KafkaError as exc:
            if exc.error_code is not ErrorCode.TOPIC_ALREADY_EXISTS:
                raise
            # Another Kiln process (or request) created it meanwhile: that is the topic;
            # none when it is being deleted.
            return await self._registry.get(name)

    async def has_partition(self, tp: TopicPartition) -> bool:
        config = await self.lookup(tp.topic, allow_create=False)
        return config is not None and 0 <= tp.partition < config.partitions

    async def was_deleted(self, name: str) -> bool:
        """Whether a deletion of the topic is remembered (False when Redis cannot say)."""
        try:
            return await self._registry.deletion(name) is not None
        except StorageError:
            return False

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

    async def _adopt(self, name: str, partitions: int) -> TopicConfig | None:
        """Adopt once, however many callers ask at the same time; None when Kiln deleted the
        topic and Kafka has not been seen to have it since."""
        async with self._adopting.setdefault(name, asyncio.Lock()):
            adopted = await self._registry.get(name)
            if adopted is not None:
                return adopted
            if not await self._may_adopt(name):
                return None
            return await self._adopt_now(name, partitions)

    async def _may_adopt(self, name: str) -> bool:
        """A topic that Kiln deleted is not adopted while its deletion is under way, nor on
        the word of a listing of Kafka taken before it finished (Kafka is asked again)."""
        note = await self._registry.deletion(name)
        if note is None:
            return True
        finished = _finished_ms(note)
        if finished is None:
            return False
        if self._listed_wall_ms <= finished + _CLOCK_SKEW_MS:
            await self._kafka_listing(refresh=True)
        return self._listed_wall_ms > finished + _CLOCK_SKEW_MS and name in self._kafka_topics

    async def _adopt_now(self, name: str, partitions: int) -> TopicConfig:
        """Register a topic that Kafka has and Kiln does not (new to Kiln, or Redis lost its
        data): each partition's Kiln offsets continue after the last one Kafka holds, or,
        when Kafka holds none, after Kafka's own offsets. A record in Kafka without a Kiln
        offset is read through Kiln at its Kafka offset, so offsets stay one increasing
        sequence."""
        for partition in range(partitions):
            await self._starts.start(TopicPartition(name, partition))
        log.info("adopted Kafka topic %s (%d partitions)", name, partitions)
        await self._registry.forget_deletion(name)
        return await self._registry.create(_as_adopted(name, partitions))

    async def default_partitions(self) -> int:
        """Partitions of a topic created without a count: Kiln's configured default, else
        Kafka's num.partitions (1 while Kafka cannot be asked and never was)."""
        if self._settings.default_partitions != KAFKA_DEFAULT:
            return self._settings.default_partitions
        now = self._clock()
        known = self._kafka_default
        if known is not None and now - known[1] < self._settings.kafka_defaults_ttl_s:
            return known[0]
        fallback = 1 if known is None else known[0]
        if self._kafka_asked_at > self._kafka_listed_at:
            # The last listing failed: Kafka would keep this caller waiting to no avail.
            log.warning("Kafka unreachable: %d partition(s) for a topic created without a "
                        "count", fallback)
            return fallback
        try:
            raw = (await self._kafka.broker_configs([_NUM_PARTITIONS])).get(_NUM_PARTITIONS)
            value = int(raw or "")
        except (StorageError, ValueError) as exc:
            log.warning("cannot read Kafka's %s (%s): %d partition(s) for a topic created "
                        "without a count", _NUM_PARTITIONS, exc, fallback)
            return fallback
        self._kafka_default = (value, now)
        return value

    def validate_new(self, name: str, partitions: int,
                     configs: Mapping[str, str | None] | None = None) -> TopicConfig:
        """The topic as it would be registered, checking what Kiln checks itself (the name,
        the partition count, its `kiln.*` configs) before anything asks Kafka."""
        kiln, _ = split_configs(configs or {})
        return with_kiln_configs(new_topic(name, partitions), kiln)

    async def create(self, name: str, partitions: int | None, *, require_kafka: bool,
                     validate_only: bool = False,
                     configs: Mapping[str, str | None] | None = None) -> TopicConfig:
        """`create_and_describe`'s topic."""
        return (await self.create_and_describe(name, partitions, require_kafka=require_kafka,
                                               validate_only=validate_only,
                                               configs=configs)).topic

    async def create_and_describe(
            self, name: str, partitions: int | None, *, require_kafka: bool,
            validate_only: bool = False, configs: Mapping[str, str | None] | None = None,
            replication_factor: int = -1,
            assignments: Mapping[int, Sequence[int]] | None = None) -> CreatedTopic:
        """Create in Kafka, then in Kiln. `partitions` None: the default
        (`default_partitions`); with `assignments` (partition -> brokers) the count is
        theirs and both `partitions` and `replication_factor` must be -1, as in Kafka.
        `configs`: `kiln.*` ones set Kiln's policy for the topic, the rest go to Kafka, which
        validates them. Kafka's refusals come back with Kafka's code and message;
        REQUEST_TIMED_OUT when Kafka cannot be reached, unless `require_kafka` is False:
        then the topic is created in Kiln only, and the hardener creates the Kafka topic
        before it first writes to it."""
        if partitions is None:
            partitions = await self.default_partitions()
        config = self.validate_new(name, len(assignments) if assignments else partitions,
                                   configs)
        if await self._registry.get(name) is not None:
            raise KafkaError(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists")
        await self._refuse_while_deleting(name)
        _, kafka_configs = split_configs(configs or {})
        answer: TopicCreation | None = None
        try:
            answer = await self._kafka.create_topic_as_requested(
                name, partitions, replication_factor, assignments=assignments,
                configs=kafka_configs, validate_only=validate_only)
        except HardenedStoreUnavailable as exc:
            if require_kafka:
                raise _unreachable(exc) from exc
            if not validate_only:
                log.warning("Kafka unreachable; topic %s created in Kiln only for now", name)
        if answer is not None and answer.error_code == ErrorCode.TOPIC_ALREADY_EXISTS:
            return await self._exists_in_kafka(name, adopt=not validate_only)
        if answer is not None and answer.error_code != ErrorCode.NONE:
            raise KafkaError(ErrorCode.of(answer.error_code),
                             answer.error_message or f"Kafka refused to create {name!r}")
        if answer is not None and answer.num_partitions > 0:
            config = dataclasses.replace(config, partitions=answer.num_partitions)
        described = CreatedTopic(config, -1 if answer is None else answer.replication_factor,
                                 () if answer is None else answer.configs)
        if validate_only:
            return described
        # The partitions of a topic deleted under this name are started clean.
        deleted = await self._registry.forget_deletion(name)
        if deleted is not None:
            await self._queue.remove_partitions(_partitions(
                name, max(deleted.partitions, config.partitions)))
        created = await self._registry.create(config)
        for partition in range(created.partitions):
            # Kafka holds none of a new topic's records: its offsets start at 0.
            await self._queue.initialize(TopicPartition(name, partition), 0)
        log.info("topic %s created with %d partitions", name, created.partitions)
        return dataclasses.replace(described, topic=created)

    async def _exists_in_kafka(self, name: str, *, adopt: bool) -> CreatedTopic:
        """Kafka has the topic Kiln was about to create: adopt it (registering it afresh
        would restart its Kiln offsets below those Kafka holds), and refuse."""
        in_kafka = (await self._kafka_listing(refresh=True)).get(name)
        if adopt and in_kafka is not None and await self._adopt(name, in_kafka) is not None:
            raise KafkaError(ErrorCode.TOPIC_ALREADY_EXISTS,
                             f"topic {name!r} already exists in Kafka ({in_kafka} partitions); "
                             "Kiln has adopted it")
        raise KafkaError(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists")

    async def _refuse_while_deleting(self, name: str) -> None:
        note = await self._registry.deletion(name)
        if note is not None and _finished_ms(note) is None:
            raise KafkaError(ErrorCode.TOPIC_ALREADY_EXISTS,
                             f"topic {name!r} is being deleted")

    async def ensure_in_kafka(self, name: str, partitions: int, *, fresh: bool = False,
                              topic_id: str | None = None) -> int:
        """Make sure Kafka has the topic; returns Kafka's partition count for it. With
        `fresh`, Kafka is asked again rather than trusting the cached listing (a broker that
        came back empty must not be written to as if it had the topic). With `topic_id`
        (the hardener's), a topic that is no longer registered under that id, or is being
        deleted, is not created but TopicGone: a hardening pass under way when the topic was
        deleted must not bring it back to Kafka."""
        existing = (await self._kafka_listing(refresh=fresh)).get(name)
        if existing is not None:
            return existing
        if topic_id is not None:
            await self._check_current(name, topic_id)
        created = await self._kafka.create_topic(name, partitions)  # False: it exists
        if created and topic_id is not None:
            try:
                await self._check_current(name, topic_id)
            except TopicGone:
                # Deleted while this was creating it: take it away again.
                await self._kafka.delete_topic(name)
                raise
        kafka = await self._kafka_listing(refresh=True)
        return kafka.get(name, partitions)

    async def _check_current(self, name: str, topic_id: str) -> None:
        config = await self._registry.get(name, fresh=True)
        if config is None or config.topic_id != topic_id \
                or await self._registry.deletion(name) is not None:
            raise TopicGone(f"topic {name!r} (id {topic_id}) was deleted")

    # --- partitions and deletion ---------------------------------------------------------

    async def add_partitions(self, name: str, count: int, *,
                             assignments: Sequence[Sequence[int]] | None = None,
                             validate_only: bool = False, timeout_ms: int = 30_000) -> None:
        """Grow the topic to `count` partitions: in Kafka (with `assignments`, the brokers of
        each new partition), then in Kiln, whose new partitions start empty at offset 0 as
        Kafka's do. Refused as Kafka refuses: INVALID_PARTITIONS for a count that is not an
        increase, UNKNOWN_TOPIC_OR_PARTITION for a topic neither has. A topic only Kafka has
        grows there (Kiln adopts it with its new count when a client first uses it)."""
        config = await self._registry.get(name, fresh=True)
        in_kafka = await self._kafka_partitions(name)
        if config is None and in_kafka is None:
            raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, _NO_SUCH_TOPIC)
        current = in_kafka if config is None else config.partitions
        assert current is not None
        if count == current:
            raise KafkaError(ErrorCode.INVALID_PARTITIONS,
                             f"Topic already has {current} partition(s).")
        if count < current:
            raise KafkaError(ErrorCode.INVALID_PARTITIONS,
                             f"The topic {name} currently has {current} partition(s); {count} "
                             "would not be an increase.")
        if assignments is not None and len(assignments) != count - current:
            raise KafkaError(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                             f"Attempted to add {count - current} additional partition(s), "
                             f"but only {len(assignments)} assignment(s) were specified.")
        try:
            if in_kafka is None and config is not None and not validate_only:
                # Created in Kiln only while Kafka was unreachable: Kafka gets it first.
                in_kafka = await self.ensure_in_kafka(name, current, topic_id=config.topic_id)
            if in_kafka is not None and in_kafka < count:
                code, message = await self._kafka.create_partitions(
                    name, count, assignments=assignments, validate_only=validate_only,
                    timeout_ms=timeout_ms)
                if code != ErrorCode.NONE:
                    raise KafkaError(ErrorCode.of(code),
                                     message or f"Kafka refused partitions for {name!r}")
        except HardenedStoreUnavailable as exc:
            raise _unreachable(exc) from exc
        if validate_only or config is None:
            return
        new = _partitions(name, count)[config.partitions:]
        await self._queue.remove_partitions(new)  # anything left of a topic deleted earlier
        for tp in new:
            await self._queue.initialize(tp, 0)
        await self._registry.grow(config, count)
        log.info("topic %s grown from %d to %d partitions", name, config.partitions, count)

    async def delete(self, name: str, *, timeout_ms: int = 30_000) -> DeletedTopic:
        """Delete the topic in Kafka, then in Kiln: its registration, every partition's
        records (buffered ones are dropped; producers waiting for them learn the topic is
        gone) and state, and, through the deletion listeners, its durable subscriptions and
        committed offsets. UNKNOWN_TOPIC_OR_PARTITION when neither has it; when Kafka cannot
        be reached (REQUEST_TIMED_OUT) or refuses, nothing is deleted."""
        config = await self._registry.get(name, fresh=True)
        in_kafka = await self._kafka_partitions(name)
        if config is None and in_kafka is None:
            return await self._finish_interrupted(name)
        partitions = max(0 if config is None else config.partitions, in_kafka or 0)
        started = wall_clock_ms()
        self._being_deleted.add(name)
        try:
            await self._registry.deletion_started(name, partitions, started)
            try:
                for listener in self._deleting:
                    await listener(name, partitions)
                in_kafka_deleted = await self._delete_in_kafka(name, timeout_ms,
                                                               in_kiln=config is not None)
            except KafkaError:
                await self._registry.forget_deletion(name)  # nothing was deleted
                raise
            await self._forget_in_kiln(name, Deletion(partitions, started, None))
        finally:
            self._being_deleted.discard(name)
        log.info("topic %s deleted (%d partitions) in Kafka and Kiln", name, partitions)
        return DeletedTopic(name, partitions, in_kiln=config is not None,
                            in_kafka=in_kafka_deleted)

    async def _finish_interrupted(self, name: str) -> DeletedTopic:
        """A deletion whose process died after Kafka's topic and the registration were gone
        left the partitions' keys, the durable subscriptions and the committed offsets (and a
        note that keeps the name from being created again): asking again removes them, as
        the operator's retry is meant to. UNKNOWN_TOPIC_OR_PARTITION when there was no such
        deletion."""
        note = await self._registry.deletion(name)
        if note is None or note.finished_ms is not None:
            raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, _NO_SUCH_TOPIC)
        self._being_deleted.add(name)
        try:
            await self._forget_in_kiln(name, note)
        finally:
            self._being_deleted.discard(name)
        log.info("interrupted deletion of topic %s (%d partitions) finished in Kiln", name,
                 note.partitions)
        return DeletedTopic(name, note.partitions, in_kiln=True, in_kafka=False)

    async def _forget_in_kiln(self, name: str, note: Deletion) -> None:
        """Kiln's side of a deletion, after Kafka's: each step is safe to repeat."""
        await self._registry.remove(name)
        self._kafka_topics.pop(name, None)
        tps = _partitions(name, note.partitions)
        await self._queue.remove_partitions(tps)
        await clear_flush(self._queue.redis, tps)
        for listener in self._deleted:
            await listener(name, note.partitions)
        await self._registry.deletion_finished(name, note, wall_clock_ms())

    async def _delete_in_kafka(self, name: str, timeout_ms: int, *, in_kiln: bool) -> bool:
        """Delete the topic in Kafka: True when Kafka had it, False when only Kiln has it;
        Kafka's refusal, or REQUEST_TIMED_OUT when Kafka cannot be reached, raised."""
        try:
            code, message = await self._kafka.delete_topic(name, timeout_ms)
        except HardenedStoreUnavailable as exc:
            raise _unreachable(exc) from exc
        if code == ErrorCode.REQUEST_TIMED_OUT and await self._kafka_partitions(name) is None:
            return True  # the controller finished it after the broker stopped waiting
        if code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION and in_kiln:
            return False  # created in Kiln while Kafka was away, never in Kafka
        if code != ErrorCode.NONE:
            raise KafkaError(ErrorCode.of(code), message or f"Kafka refused to delete {name!r}")
        return True

    async def _kafka_partitions(self, name: str) -> int | None:
        """Kafka's partition count of the topic, asked now (None: Kafka has no such topic);
        REQUEST_TIMED_OUT when Kafka cannot be reached."""
        try:
            kafka = await self._kafka.list_topics()
        except HardenedStoreUnavailable as exc:
            raise _unreachable(exc) from exc
        return kafka.get(name)

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
            asked_wall_ms = wall_clock_ms()
            try:
                self._kafka_topics = await self._kafka.list_topics()
                self._kafka_listed_at = asked_at
                self._listed_wall_ms = asked_wall_ms
            except HardenedStoreUnavailable as exc:
                log.debug("cannot list Kafka topics: %s", exc)
        return self._kafka_topics


def _as_adopted(name: str, partitions: int) -> TopicConfig:
    return new_topic(name, partitions, topic_id=uuid.uuid5(_ADOPTED_TOPIC_IDS, name))


class TopicSubscriptions(Protocol):
    async def forget_topic(self, topic: str) -> int: ...


class CommittedOffsets(Protocol):
    async def forget_partitions(self, tps: Sequence[TopicPartition]) -> int: ...


def forget_topic_state(catalog: Catalog, subscriptions: TopicSubscriptions,
                       offsets: CommittedOffsets) -> None:
    """Have a topic's deletion also remove its durable subscriptions and every group's
    committed offsets of it (Kafka's group coordinator forgets those of a deleted topic)."""
    async def forget(topic: str, partitions: int) -> None:
        dropped = await subscriptions.forget_topic(topic)
        removed = await offsets.forget_partitions(_partitions(topic, partitions))
        log.info("deleted topic %s: %d durable subscription(s) and %d committed offset(s) "
                 "forgotten", topic, dropped, removed)

    catalog.on_deleted(forget)


# What Kafka says of a topic it does not have.
_NO_SUCH_TOPIC = "This server does not host this topic-partition."


def _partitions(name: str, count: int) -> list[TopicPartition]:
    return [TopicPartition(name, partition) for partition in range(count)]


def _finished_ms(note: Deletion) -> int | None:
    """When the deletion finished; one abandoned half way counts as finished then."""
    if note.finished_ms is None and wall_clock_ms() - note.started_ms > _DELETION_ABANDONED_MS:
        return note.started_ms + _DELETION_ABANDONED_MS
    return note.finished_ms


def _unreachable(exc: HardenedStoreUnavailable) -> KafkaError:
    """What a Kafka broker answers an admin request when it cannot reach its controller."""
    return KafkaError(ErrorCode.REQUEST_TIMED_OUT, f"Kafka cannot be reached: {exc.message}")
