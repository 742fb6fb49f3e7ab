"""Storage failures seen by the group APIs become COORDINATOR_NOT_AVAILABLE, or
COORDINATOR_LOAD_IN_PROGRESS for OffsetFetch.

The log queue's own code for an unreachable Redis (NOT_ENOUGH_REPLICAS) means nothing to a
group client; COORDINATOR_NOT_AVAILABLE makes every client look the coordinator up again and
retry, which is what a Redis outage calls for. OffsetFetch is the exception: librdkafka
(2.16, and its main branch in 2026) only looks the coordinator up again after a request-level
COORDINATOR_NOT_AVAILABLE there and never asks for the offsets again, so a consumer whose
assignment was being started stays assigned and reads nothing, for good. A Kafka coordinator
that cannot read a group's state yet answers COORDINATOR_LOAD_IN_PROGRESS, which every client
retries (librdkafka until it succeeds), and that is what a Redis outage is to Kiln's groups:
their state is there, not readable yet.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from storage.errors import StorageError
from wire.errors import ErrorCode, KafkaError


@contextlib.contextmanager
def coordinator_errors(code: ErrorCode = ErrorCode.COORDINATOR_NOT_AVAILABLE
                       ) -> Iterator[None]:
    try:
        yield
    except StorageError as exc:
        raise KafkaError(code, exc.message) from exc


def offset_fetch_errors() -> contextlib.AbstractContextManager[None]:
    """For OffsetFetch: retried by every client, where COORDINATOR_NOT_AVAILABLE is not."""
    return coordinator_errors(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS)
