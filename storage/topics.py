"""Kiln's topic registry in Redis: partition counts, stable topic ids and reliability policy.

Kept in one hash (`kiln:topics`, name -> JSON) so every Kiln process sees the same topics;
HSETNX makes creation race-free between processes. A policy changed by another process
(`kiln topics alter`) is seen here within CACHE_TTL_S.

Deleted topics leave a note in `kiln:topics:deleted` (name -> JSON: the partitions the topic
had, when its deletion started and when it finished) so that no Kiln process brings the
topic back from a listing of Kafka taken before it was deleted, and so that a topic created
anew under the name starts from clean partitions.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from storage.errors import BufferUnavailable, StorageError
from storage.model import Reliability
from storage.redis_pool import REDIS_FAILURES, RedisClient
from wire.errors import ErrorCode, KafkaError

_TOPICS_KEY = "kiln:topics"
_DELETED_KEY = "kiln:topics:deleted"
# How long the note of a finished deletion is kept.
_DELETION_KEPT_MS = 3_600_000
_LEGAL_NAME = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")


class TopicGone(StorageError):
    """The topic was deleted (or deleted and created anew) while it was being worked on."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, message)


@dataclass(frozen=True, slots=True)
class Deletion:
    """The note a deleted topic leaves (see the module's docstring)."""

    partitions: int  # the most partitions the topic had, in Kiln or in Kafka
    started_ms: int
    finished_ms: int | None  # None while the deletion is under way (or was interrupted)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> Deletion:
        raw = json.loads(text)
        finished = raw.get("finished_ms")
        return cls(int(raw["partitions"]), int(raw["started_ms"]),
                   None if finished is None else int(finished))


# Grows a registered topic (KEYS[1], field ARGV[1]) of id ARGV[2] to ARGV[3] partitions;
# returns the stored JSON after the change, or nil when the topic is not (or no longer) that.
_GROW = """
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then return nil end
local config = cjson.decode(raw)
if config['topic_id'] ~= ARGV[2] then return nil end
if tonumber(config['partitions']) < tonumber(ARGV[3]) then
  config['partitions'] = tonumber(ARGV[3])
  raw = cjson.encode(config)
  redis.call('HSET', KEYS[1], ARGV[1], raw)
end
return raw
"""


# Writes the policies of ARGV[2] (a topic's JSON) over the registered topic (KEYS[1], field
# ARGV[1]) of the same id, keeping its partition count; returns the stored JSON after the
# change, or nil when the topic is not (or no longer) registered under that id.
_SET_POLICIES = """
local raw = redis.call('HGET', KEYS[1], ARGV[1])
if not raw then return nil end
local current = cjson.decode(raw)
local wanted = cjson.decode(ARGV[2])
if current['topic_id'] ~= wanted['topic_id'] then return nil end
wanted['partitions'] = current['partitions']
raw = cjson.encode(wanted)
redis.call('HSET', KEYS[1], ARGV[1], raw)
return raw
"""


class HardenPolicy(enum.Enum):
    SURVIVORS = "survivors"
    ALL = "all"
    NEVER = "never"


@dataclass(frozen=True, slots=True)
class TopicConfig:
    name: str
    partitions: int
    topic_id: str  # UUID text; stable for the life of the topic
    reliability: Reliability = Reliability.RELIABLE_PERSISTENT
    max_reliability: Reliability = Reliability.ASSURED_PERSISTENT
    producer_override: bool = True
    harden: HardenPolicy = HardenPolicy.SURVIVORS
    # A group's first commit makes it a durable subscription (DESIGN §1).
    auto_subscribe: bool = True

    @property
    def uuid(self) -> uuid.UUID:
        return uuid.UUID(self.topic_id)

    def to_json(self) -> str:
        raw = asdict(self)
        raw["reliability"] = self.reliability.name.lower()
        raw["max_reliability"] = self.max_reliability.name.lower()
        raw["harden"] = self.harden.value
        return json.dumps(raw, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> TopicConfig:
        raw = json.loads(text)
        return cls(
            name=raw["name"],
            partitions=int(raw["partitions"]),
            topic_id=raw["topic_id"],
            reliability=Reliability.parse(raw["reliability"]),
            max_reliability=Reliability.parse(raw["max_reliability"]),
            producer_override=bool(raw["producer_override"]),
            harden=HardenPolicy(raw["harden"]),
            auto_subscribe=bool(raw.get("auto_subscribe", True)),
        )


def validate_topic_name(name: str) -> None:
    if not _LEGAL_NAME.match(name) or name in (".", ".."):
        raise KafkaError(
            ErrorCode.INVALID_TOPIC_EXCEPTION,
            f"illegal topic name {name!r}: 1-249 characters of [a-zA-Z0-9._-]",
        )


def new_topic(name: str, partitions: int, topic_id: uuid.UUID | None = None) -> TopicConfig:
    validate_topic_name(name)
    if partitions < 1:
        raise KafkaError(ErrorCode.INVALID_PARTITIONS,
                         f"{partitions} partitions: a topic needs at least one")
    return TopicConfig(name=name, partitions=partitions, topic_id=str(topic_id or uuid.uuid4()))


# Kiln's own topic settings, given as topic configs (CreateTopics, `--config kiln.harden=all`);
# every other config is Kafka's and goes to the hardened topic.
KILN_CONFIG_PREFIX = "kiln."
_BOOLEANS = {"true": True, "false": False}


def _parse_bool(value: str) -> bool:
    if value.lower() not in _BOOLEANS:
        raise ValueError(f"expected true or false, got {value!r}")
    return _BOOLEANS[value.lower()]


def _parse_harden(value: str) -> HardenPolicy:
    try:
        return HardenPolicy(value.lower())
    except ValueError:
        known = ", ".join(p.value for p in HardenPolicy)
        raise ValueError(f"unknown harden policy {value!r} (one of {known})") from None


_KILN_CONFIGS: dict[str, tuple[str, Any]] = {
    "kiln.reliability": ("reliability", Reliability.parse),
    "kiln.max.reliability": ("max_reliability", Reliability.parse),
    "kiln.producer.override": ("producer_override", _parse_bool),
    "kiln.harden": ("harden", _parse_harden),
    "kiln.auto.subscribe": ("auto_subscribe", _parse_bool),
}


def split_configs(configs: Mapping[str, str | None]) -> tuple[dict[str, str], dict[str, str]]:
    """(Kiln's `kiln.*` configs, Kafka's) from a topic's configs; None values are left out."""
    kiln: dict[str, str] = {}
    kafka: dict[str, str] = {}
    for name, value in configs.items():
        if value is not None:
            (kiln if name.startswith(KILN_CONFIG_PREFIX) else kafka)[name] = value
    return kiln, kafka


def with_kiln_configs(config: TopicConfig, configs: Mapping[str, str]) -> TopicConfig:
    """`config` with `kiln.*` topic configs applied; INVALID_CONFIG names a bad one."""
    changes: dict[str, Any] = {}
    for name, value in configs.items():
        if name not in _KILN_CONFIGS:
            known = ", ".join(sorted(_KILN_CONFIGS))
            raise KafkaError(ErrorCode.INVALID_CONFIG,
                             f"unknown topic config {name!r} (Kiln's are {known})")
        field_name, parse = _KILN_CONFIGS[name]
        try:
            changes[field_name] = parse(value)
        except ValueError as exc:
            raise KafkaError(ErrorCode.INVALID_CONFIG, f"{name}: {exc}") from None
    updated = _capped_for_harden_never(dataclasses.replace(config, **changes), configs)
    if updated.reliability > updated.max_reliability:
        raise KafkaError(ErrorCode.INVALID_CONFIG,
                         f"kiln.reliability {updated.reliability.name.lower()} is above "
                         f"kiln.max.reliability {updated.max_reliability.name.lower()}")
    return updated


# Under kiln.harden=never nothing reaches Kafka, so no level that promises to survive a Redis
# loss may be asked for: an acks=all producer must not be told its records are safe.
NEVER_HARDENED_MAX = Reliability.RELIABLE_NONPERSISTENT


def _capped_for_harden_never(config: TopicConfig, given: Mapping[str, str]) -> TopicConfig:
    """Under harden=never, levels left as they were come down to NEVER_HARDENED_MAX; a
    persistent level given in the same change is refused (INVALID_CONFIG)."""
    if config.harden is not HardenPolicy.NEVER:
        return config
    for name, field_name in (("kiln.max.reliability", "max_reliability"),
                             ("kiln.reliability", "reliability")):
        level = getattr(config, field_name)
        if level <= NEVER_HARDENED_MAX:
            continue
        if name in given:
            raise KafkaError(ErrorCode.INVALID_CONFIG,
                             f"{name} {level.name.lower()} needs hardening, and kiln.harden is "
                             f"never: use {NEVER_HARDENED_MAX.name.lower()} or lower")
        changes: dict[str, Any] = {field_name: NEVER_HARDENED_MAX}
        config = dataclasses.replace(config, **changes)
    return config


def kiln_configs(config: TopicConfig) -> dict[str, str]:
    """The topic's Kiln settings as `kiln.*` topic configs."""
    return {
        "kiln.reliability": config.reliability.name.lower(),
        "kiln.max.reliability": config.max_reliability.name.lower(),
        "kiln.producer.override": str(config.producer_override).lower(),
        "kiln.harden": config.harden.value,
        "kiln.auto.subscribe": str(config.auto_subscribe).lower(),
    }


def with_kiln_defaults(config: TopicConfig, names: Iterable[str]) -> TopicConfig:
    """`config` with the named `kiln.*` settings back at Kiln's defaults (a config being
    deleted, or left out of a config set that replaces them all); unknown names are left
    alone. Run the result through with_kiln_configs: under kiln.harden=never a level back at
    its default is capped."""
    defaults = {f.name: f.default for f in dataclasses.fields(TopicConfig)}
    changes: dict[str, Any] = {_KILN_CONFIGS[name][0]: defaults[_KILN_CONFIGS[name][0]]
                               for name in names if name in _KILN_CONFIGS}
    return dataclasses.replace(config, **changes)


# How old a cached topic may be: a policy changed in Redis applies within this time.
CACHE_TTL_S = 1.0


class TopicRegistry:
    """Reads are served from a local cache, each entry at most `ttl_s` old: a miss or an
    older entry is read again (a stale one still answers while Redis does not)."""

    def __init__(self, redis: RedisClient, ttl_s: float = CACHE_TTL_S) -> None:
        self._redis = redis
        self._ttl_s = ttl_s
        self._cache: dict[str, tuple[TopicConfig, float]] = {}  # name -> (config, read at)
        self._grow = redis.register_script(_GROW)
        self._set_policies = redis.register_script(_SET_POLICIES)

    async def get(self, name: str, *, fresh: bool = False) -> TopicConfig | None:
        """The topic; with `fresh`, as Redis holds it now (not from the cache)."""
        found = self._cache.get(name)
        if not fresh and found is not None and time.monotonic() - found[1] <= self._ttl_s:
            return found[0]
        try:
            raw = await self._redis.hget(_TOPICS_KEY, name)
        except REDIS_FAILURES as exc:
            if found is not None:
                return found[0]
            raise BufferUnavailable(str(exc)) from exc
        if raw is None:
            self._cache.pop(name, None)
            return None
        config = TopicConfig.from_json(raw)
        self._cache[name] = (config, time.monotonic())
        return config

    async def all(self) -> dict[str, TopicConfig]:
        try:
            raw = await self._redis.hgetall(_TOPICS_KEY)
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc
        topics = {_text(k): TopicConfig.from_json(v) for k, v in raw.items()}
        now = time.monotonic()
        self._cache = {name: (config, now) for name, config in topics.items()}
        return topics

    async def create(self, config: TopicConfig) -> TopicConfig:
        """Register a topic; if another process registered it first, return theirs."""
        try:
            created = await self._redis.hsetnx(_TOPICS_KEY, config.name, config.to_json())
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc
        if created:
            self._cache[config.name] = (config, time.monotonic())
            return config
        self._cache.pop(config.name, None)
        existing = await self.get(config.name)
        assert existing is not None
        return existing

    async def update(self, config: TopicConfig) -> None:
        try:
            await self._redis.hset(_TOPICS_KEY, config.name, config.to_json())
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc
        self._cache[config.name] = (config, time.monotonic())

    async def update_policies(self, config: TopicConfig) -> TopicConfig:
        """Write `config`'s policies (its `kiln.*` settings) and nothing else: the partition
        count stays as Redis has it, so a topic grown meanwhile by another request is not
        shrunk back. TopicGone when the topic is no longer registered under its id."""
        try:
            raw = await self._set_policies(keys=[_TOPICS_KEY],
                                           args=[config.name, config.to_json()])
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc
        if raw is None:
            self._cache.pop(config.name, None)
            raise TopicGone(f"topic {config.name!r} was deleted")
        updated = TopicConfig.from_json(raw)
        self._cache[config.name] = (updated, time.monotonic())
        return updated

    async def grow(self, config: TopicConfig, partitions: int) -> TopicConfig:
        """The topic with (at least) `partitions` partitions, its policies as they are now
        (another process may have altered them); TopicGone when it is no longer registered
        under its id."""
        try:
            raw = await self._grow(keys=[_TOPICS_KEY],
                                   args=[config.name, config.topic_id, partitions])
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc
        if raw is None:
            self._cache.pop(config.name, None)
            raise TopicGone(f"topic {config.name!r} was deleted")
        grown = TopicConfig.from_json(raw)
        self._cache[config.name] = (grown, time.monotonic())
        return grown

    async def remove(self, name: str) -> bool:
        """Unregister the topic; False when it was not registered."""
        self._cache.pop(name, None)
        try:
            return bool(await self._redis.hdel(_TOPICS_KEY, name))
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc

    # --- notes of deleted topics -----------------------------------------------------------

    async def deletion_started(self, name: str, partitions: int, now_ms: int) -> None:
        """Note that the topic's deletion begins (forgetting notes kept long enough)."""
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.hset(_DELETED_KEY, name, Deletion(partitions, now_ms, None).to_json())
                pipe.hgetall(_DELETED_KEY)
                _, notes = await pipe.execute()
            expired = [field for field, raw in notes.items()
                       if _expired(Deletion.from_json(raw), now_ms)]
            if expired:
                await self._redis.hdel(_DELETED_KEY, *expired)
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc

    async def deletion_finished(self, name: str, note: Deletion, now_ms: int) -> None:
        await self._write_note(name, dataclasses.replace(note, finished_ms=now_ms))

    async def deletion(self, name: str) -> Deletion | None:
        try:
            raw = await self._redis.hget(_DELETED_KEY, name)
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc
        return None if raw is None else Deletion.from_json(raw)

    async def forget_deletion(self, name: str) -> Deletion | None:
        """Take the note away (a topic is created anew under the name, or its deletion
        did not happen); returns it to the one caller that took it."""
        try:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.hget(_DELETED_KEY, name)
                pipe.hdel(_DELETED_KEY, name)
                raw, removed = await pipe.execute()
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc
        return Deletion.from_json(raw) if raw is not None and removed else None

    async def _write_note(self, name: str, note: Deletion) -> None:
        try:
            await self._redis.hset(_DELETED_KEY, name, note.to_json())
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc


def _expired(note: Deletion, now_ms: int) -> bool:
    return note.finished_ms is not None and now_ms - note.finished_ms > _DELETION_KEPT_MS


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
