"""Kiln's topic registry in Redis: partition counts, stable topic ids and reliability policy.

Kept in one hash (`kiln:topics`, name -> JSON) so every Kiln process sees the same topics;
HSETNX makes creation race-free between processes. A policy changed by another process
(`kiln topics alter`) is seen here within CACHE_TTL_S.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from proxy.protocol.errors import ErrorCode, KafkaError
from storage.errors import BufferUnavailable
from storage.model import Reliability

_TOPICS_KEY = "kiln:topics"
_LEGAL_NAME = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")


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


# How old a cached topic may be: a policy changed in Redis applies within this time.
CACHE_TTL_S = 1.0


class TopicRegistry:
    """Reads are served from a local cache, each entry at most `ttl_s` old: a miss or an
    older entry is read again (a stale one still answers while Redis does not)."""

    def __init__(self, redis: aioredis.Redis, ttl_s: float = CACHE_TTL_S) -> None:
        self._redis = redis
        self._ttl_s = ttl_s
        self._cache: dict[str, tuple[TopicConfig, float]] = {}  # name -> (config, read at)

    async def get(self, name: str) -> TopicConfig | None:
        found = self._cache.get(name)
        if found is not None and time.monotonic() - found[1] <= self._ttl_s:
            return found[0]
        try:
            raw = await self._redis.hget(_TOPICS_KEY, name)
        except (RedisError, OSError) as exc:
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
        except (RedisError, OSError) as exc:
            raise BufferUnavailable(str(exc)) from exc
        topics = {_text(k): TopicConfig.from_json(v) for k, v in raw.items()}
        now = time.monotonic()
        self._cache = {name: (config, now) for name, config in topics.items()}
        return topics

    async def create(self, config: TopicConfig) -> TopicConfig:
        """Register a topic; if another process registered it first, return theirs."""
        try:
            created = await self._redis.hsetnx(_TOPICS_KEY, config.name, config.to_json())
        except (RedisError, OSError) as exc:
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
        except (RedisError, OSError) as exc:
            raise BufferUnavailable(str(exc)) from exc
        self._cache[config.name] = (config, time.monotonic())


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
