"""The storage layer's own errors: adapters translate Redis and Kafka failures into these."""

from __future__ import annotations

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
