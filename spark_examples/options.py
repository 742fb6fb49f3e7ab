"""The options of Spark's Kafka source, read and checked the way Spark reads them, for Kiln's
compatible reader. No Spark, no I/O: a mapping of strings in, a `SourceOptions` out.

Option names are case-insensitive, as in Spark. Supported: `kafka.bootstrap.servers`, one of
`subscribe` / `subscribePattern` / `assign`, `startingOffsets` and (batch) `endingOffsets`
as `earliest` / `latest` / JSON, `failOnDataLoss`, `maxOffsetsPerTrigger`, `minPartitions`,
`includeHeaders`, `kafka.isolation.level`, `kafka.max.partition.fetch.bytes`,
`kafkaConsumer.pollTimeoutMs`, `fetchOffset.numRetries`, `fetchOffset.retryIntervalMs`.
Options of the real source that this reader does not implement (timestamps as starting
points, `minOffsetsPerTrigger`, TLS/SASL, ...) are refused with a clear error rather than
silently ignored. Other `kafka.*` consumer settings (group ids, client tuning) are accepted
and have no effect: this reader assigns partitions itself, as Spark's source does.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

EARLIEST = -2  # in offset JSON, as in Spark's Kafka source
LATEST = -1

OffsetBound = Literal["earliest", "latest"]


class OptionError(ValueError):
    """An option is missing, malformed, or not supported by the compatible reader."""


@dataclass(frozen=True, slots=True, order=True)
class TopicPartition:
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


@dataclass(frozen=True, slots=True)
class Subscription:
    """Which partitions to read: named topics, a topic name pattern, or fixed partitions."""

    kind: Literal["subscribe", "subscribePattern", "assign"]
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    partitions: tuple[TopicPartition, ...] = ()

    def wants(self, topic: str) -> bool:
        """Whether a topic that exists belongs to the subscription."""
        if self.kind == "subscribePattern":
            assert self.pattern is not None
            return re.fullmatch(self.pattern, topic) is not None
        if self.kind == "assign":
            return any(tp.topic == topic for tp in self.partitions)
        return topic in self.topics


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """Everything the compatible reader needs to know, checked."""

    bootstrap_servers: str
    subscription: Subscription
    starting_offsets: OffsetBound | dict[TopicPartition, int]
    ending_offsets: OffsetBound | dict[TopicPartition, int]
    fail_on_data_loss: bool = True
    max_offsets_per_trigger: int | None = None
    min_partitions: int | None = None
    include_headers: bool = False
    read_committed: bool = False
    max_partition_fetch_bytes: int = 1_048_576
    poll_timeout_ms: int = 120_000
    offset_fetch_attempts: int = 3
    offset_retry_interval_ms: int = 1_000
    client_id: str = "kiln-spark-reader"
    ignored: tuple[str, ...] = field(default=(), compare=False)


# Options of Spark's Kafka source this reader does not implement; refusing them beats
# reading something other than what the user asked for.
_UNSUPPORTED = {
    "startingtimestamp": "startingTimestamp",
    "startingoffsetsbytimestamp": "startingOffsetsByTimestamp",
    "startingoffsetsbytimestampstrategy": "startingOffsetsByTimestampStrategy",
    "endingtimestamp": "endingTimestamp",
    "endingoffsetsbytimestamp": "endingOffsetsByTimestamp",
    "minoffsetspertrigger": "minOffsetsPerTrigger",
    "maxtriggerdelay": "maxTriggerDelay",
    "maxrecordsperpartition": "maxRecordsPerPartition",
}
_KNOWN = {
    "kafka.bootstrap.servers", "subscribe", "subscribepattern", "assign", "startingoffsets",
    "endingoffsets", "failondataloss", "maxoffsetspertrigger", "minpartitions",
    "includeheaders", "kafka.isolation.level", "kafka.max.partition.fetch.bytes",
    "kafkaconsumer.polltimeoutms", "fetchoffset.numretries", "fetchoffset.retryintervalms",
    "kafka.client.id", "kafka.security.protocol", "path",
}
# Accepted without effect: consumer settings the real source passes to its consumers.
_WITHOUT_EFFECT_PREFIXES = ("kafka.",)
_WITHOUT_EFFECT = {"groupidprefix"}


def parse_options(raw: Mapping[str, str], *, streaming: bool) -> SourceOptions:
    """Check a source's options; `streaming` selects the defaults and rules of
    `readStream` (starting at latest, no ending offsets) or `read` (earliest to latest)."""
    opts = {key.lower(): str(value) for key, value in raw.items()}
    for key, name in _UNSUPPORTED.items():
        if key in opts:
            raise OptionError(f"option '{name}' is not supported by Kiln's compatible Kafka "
                              "reader; run with the spark-sql-kafka connector to use it")
    security = opts.get("kafka.security.protocol", "PLAINTEXT").upper()
    if security != "PLAINTEXT":
        raise OptionError(f"kafka.security.protocol={security}: Kiln's compatible Kafka reader "
                          "speaks PLAINTEXT only; use the spark-sql-kafka connector")
    bootstrap = opts.get("kafka.bootstrap.servers", "").strip()
    if not bootstrap:
        raise OptionError("option 'kafka.bootstrap.servers' must be specified")
    ignored = tuple(sorted(
        key for key in opts
        if key not in _KNOWN and (key.startswith(_WITHOUT_EFFECT_PREFIXES)
                                  or key in _WITHOUT_EFFECT)
    ))

    starting = _offset_bound(opts.get("startingoffsets"), "startingOffsets",
                             "latest" if streaming else "earliest")
    if not streaming and starting == "latest":
        raise OptionError("startingOffsets=latest is not valid for batch queries")
    if streaming:
        if "endingoffsets" in opts:
            raise OptionError("endingOffsets is not valid for streaming queries")
        ending: OffsetBound | dict[TopicPartition, int] = "latest"
    else:
        ending = _offset_bound(opts.get("endingoffsets"), "endingOffsets", "latest")
        if ending == "earliest" or (isinstance(ending, dict) and EARLIEST in ending.values()):
            raise OptionError("endingOffsets cannot be earliest for batch queries")
    max_offsets = _positive_int(opts, "maxoffsetspertrigger", "maxOffsetsPerTrigger")
    if max_offsets is not None and not streaming:
        max_offsets = None  # Spark ignores it in batch queries too
    isolation = opts.get("kafka.isolation.level", "read_uncommitted").lower()
    if isolation not in ("read_committed", "read_uncommitted"):
        raise OptionError(f"kafka.isolation.level must be read_committed or read_uncommitted, "
                          f"not {isolation!r}")
    return SourceOptions(
        bootstrap_servers=bootstrap,
        subscription=_subscription(opts),
        starting_offsets=starting,
        ending_offsets=ending,
        fail_on_data_loss=_boolean(opts, "failondataloss", "failOnDataLoss", True),
        max_offsets_per_trigger=max_offsets,
        min_partitions=_positive_int(opts, "minpartitions", "minPartitions"),
        include_headers=_boolean(opts, "includeheaders", "includeHeaders", False),
        read_committed=isolation == "read_committed",
        max_partition_fetch_bytes=_positive_int(
            opts, "kafka.max.partition.fetch.bytes", "kafka.max.partition.fetch.bytes"
        ) or 1_048_576,
        poll_timeout_ms=_positive_int(opts, "kafkaconsumer.polltimeoutms",
                                      "kafkaConsumer.pollTimeoutMs") or 120_000,
        offset_fetch_attempts=_positive_int(opts, "fetchoffset.numretries",
                                            "fetchOffset.numRetries") or 3,
        offset_retry_interval_ms=_positive_int(opts, "fetchoffset.retryintervalms",
                                               "fetchOffset.retryIntervalMs") or 1_000,
        client_id=opts.get("kafka.client.id", "kiln-spark-reader"),
        ignored=ignored,
    )


def parse_offsets_json(text: str, name: str) -> dict[TopicPartition, int]:
    """`{"topic": {"0": 23, "1": -2}}` (-2 earliest, -1 latest), as Spark writes it."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise OptionError(f"{name} is neither earliest, latest nor JSON: {exc}") from None
    if not isinstance(doc, dict) or not doc:
        raise OptionError(f'{name} JSON must look like {{"topic": {{"0": 23}}}}, got {text}')
    out: dict[TopicPartition, int] = {}
    for topic, partitions in doc.items():
        if not isinstance(partitions, dict):
            raise OptionError(f"{name}: topic {topic!r} must map partitions to offsets")
        for partition, offset in partitions.items():
            if not (isinstance(partition, str) and partition.lstrip("-").isdigit()
                    and int(partition) >= 0):
                raise OptionError(f"{name}: {topic!r} has a bad partition {partition!r}")
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < EARLIEST:
                raise OptionError(f"{name}: {topic}-{partition} has a bad offset {offset!r}")
            out[TopicPartition(topic, int(partition))] = offset
    return out


def _offset_bound(value: str | None, name: str, default: OffsetBound
                  ) -> OffsetBound | dict[TopicPartition, int]:
    if value is None:
        return default
    text = value.strip()
    if text.lower() == "earliest":
        return "earliest"
    if text.lower() == "latest":
        return "latest"
    return parse_offsets_json(text, name)


def _subscription(opts: Mapping[str, str]) -> Subscription:
    given = [key for key in ("subscribe", "subscribepattern", "assign") if key in opts]
    if len(given) != 1:
        raise OptionError("exactly one of the options 'subscribe', 'subscribePattern' or "
                          f"'assign' must be specified, got {len(given)}")
    key = given[0]
    value = opts[key].strip()
    if key == "subscribe":
        topics = tuple(t.strip() for t in value.split(",") if t.strip())
        if not topics:
            raise OptionError("no topics to subscribe to")
        return Subscription("subscribe", topics=topics)
    if key == "subscribepattern":
        if not value:
            raise OptionError("pattern to subscribe is empty")
        try:
            re.compile(value)
        except re.error as exc:
            raise OptionError(f"subscribePattern {value!r}: {exc}") from None
        return Subscription("subscribePattern", pattern=value)
    try:
        doc = json.loads(value)
    except json.JSONDecodeError as exc:
        raise OptionError(f"assign must be JSON like {{\"topic\": [0, 1]}}: {exc}") from None
    if not isinstance(doc, dict) or not all(
            isinstance(v, list) and all(isinstance(p, int) and not isinstance(p, bool)
                                        and p >= 0 for p in v) for v in doc.values()):
        raise OptionError(f'assign must be JSON like {{"topic": [0, 1]}}, got {value}')
    partitions = tuple(sorted(TopicPartition(t, p) for t, ps in doc.items() for p in ps))
    if not partitions:
        raise OptionError("assign names no partitions")
    return Subscription("assign", partitions=partitions)


def _boolean(opts: Mapping[str, str], key: str, name: str, default: bool) -> bool:
    value = opts.get(key)
    if value is None:
        return default
    if value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise OptionError(f"option '{name}' must be true or false, not {value!r}")


def _positive_int(opts: Mapping[str, str], key: str, name: str) -> int | None:
    value = opts.get(key)
    if value is None:
        return None
    try:
        number = int(value.strip())
    except ValueError:
        raise OptionError(f"option '{name}' must be a positive integer, not {value!r}") from None
    if number <= 0:
        raise OptionError(f"option '{name}' must be a positive integer, not {value!r}")
    return number
