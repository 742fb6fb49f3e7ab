"""Which Kafka error a client sees, in one place.

Storage's own errors carry the code a client sees for them by default: adapters translate
Redis and Kafka failures into these. Some APIs answer the same cause with another code
that their clients handle better; those translations are below, beside the errors.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import kafka.errors

from wire.errors import ErrorCode, KafkaError


class StorageError(KafkaError):
    """A storage failure with the Kafka error code a client should see for it."""


class BufferUnavailable(StorageError):
    """Redis (the log queue) cannot be reached or answered with an error; retriable."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.NOT_ENOUGH_REPLICAS, f"log queue unavailable: {message}")


class PartitionLost(StorageError):
    """Redis lost a partition's state (restarted empty, flushed or evicted): records it held
    that were not hardened are gone, and its offsets were started again from Kafka."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.KAFKA_STORAGE_ERROR, message)


class BufferFull(StorageError):
    """The buffer budget is used up; producers should back off and retry."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.NOT_ENOUGH_REPLICAS, f"buffer full: {message}")


class HardenedStoreUnavailable(StorageError):
    """Kafka (the hardened store) cannot be reached or refused a write in a retriable way."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.KAFKA_STORAGE_ERROR, f"hardened store unavailable: {message}")


class HardenedTopicMissing(HardenedStoreUnavailable):
    """Kafka does not have the topic (not yet created, or the broker lost it): it holds none
    of its records. Retriable for writers, who create it first."""


class HardenedStoreRejected(StorageError):
    """Kafka refused a request for a reason retrying will not fix."""


class Fenced(StorageError):
    """Another Kiln process took over hardening of this partition; stop writing to it."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.PRODUCER_FENCED, message)


class NotCoordinator(KafkaError):
    """Another Kiln node coordinates the group (storage/leadership.py): the client looks the
    coordinator up again. Not a StorageError: the group APIs pass it on as it is."""

    def __init__(self, group_id: str) -> None:
        super().__init__(ErrorCode.NOT_COORDINATOR,
                         f"this node is not the coordinator of group {group_id}")


# --- Kafka's answers to Kiln ---------------------------------------------------------------
# PRODUCER_FENCED and INVALID_PRODUCER_EPOCH raise Fenced, retriable codes
# HardenedStoreUnavailable, anything else HardenedStoreRejected.

_FENCED_CODES = frozenset({ErrorCode.PRODUCER_FENCED, ErrorCode.INVALID_PRODUCER_EPOCH})


def error_for(code: int, context: str) -> StorageError:
    """The storage error for a Kafka error code in an answer Kiln got from Kafka."""
    known: Any = kafka.errors.for_code(code)
    what = f"{context}: {known.message} ({code})"
    if code in _FENCED_CODES:
        return Fenced(what)
    if known.retriable:
        return HardenedStoreUnavailable(what)
    return HardenedStoreRejected(ErrorCode.of(code), what)


def stale_metadata(code: int) -> bool:
    """Whether the code says a partition's leader moved, so it must be looked up again."""
    return bool(kafka.errors.for_code(code).invalid_metadata)


# --- answers to Kiln's clients ---------------------------------------------------------------

# What a consumer gets for a partition whose records are in Kafka while Kafka cannot be
# reached. kafka-python, aiokafka and librdkafka all refresh metadata (Kiln is still the
# leader) and retry it without a word; KAFKA_STORAGE_ERROR, the closer meaning, makes aiokafka
# log a warning on every failed fetch.
COLD_TIER_UNAVAILABLE = ErrorCode.NOT_LEADER_OR_FOLLOWER


@contextlib.contextmanager
def cold_tier_errors() -> Iterator[None]:
    """For answers about a partition's records: an unreachable Kafka is
    COLD_TIER_UNAVAILABLE."""
    try:
        yield
    except HardenedStoreUnavailable as exc:
        raise KafkaError(COLD_TIER_UNAVAILABLE, exc.message) from exc


# The group APIs: the log queue's own code for an unreachable Redis (NOT_ENOUGH_REPLICAS)
# means nothing to a group client; COORDINATOR_NOT_AVAILABLE makes every client look the
# coordinator up again and retry, which is what a Redis outage calls for. OffsetFetch is the
# exception: librdkafka (2.16, and its main branch in 2026) only looks the coordinator up
# again after a request-level COORDINATOR_NOT_AVAILABLE there and never asks for the offsets
# again, so a consumer whose assignment was being started stays assigned and reads nothing,
# for good. A Kafka coordinator that cannot read a group's state yet answers
# COORDINATOR_LOAD_IN_PROGRESS, which every client retries (librdkafka until it succeeds),
# and that is what a Redis outage is to Kiln's groups: their state is there, not readable yet.

@contextlib.contextmanager
def coordinator_errors(code: ErrorCode = ErrorCode.COORDINATOR_NOT_AVAILABLE
                       ) -> Iterator[None]:
    """For the group APIs: any storage failure is `code`."""
    try:
        yield
    except StorageError as exc:
        raise KafkaError(code, exc.message) from exc


def offset_fetch_errors() -> contextlib.AbstractContextManager[None]:
    """For OffsetFetch: retried by every client, where COORDINATOR_NOT_AVAILABLE is not."""
    return coordinator_errors(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
