"""Storage failures seen by the group APIs become COORDINATOR_NOT_AVAILABLE.

The log queue's own code for an unreachable Redis (NOT_ENOUGH_REPLICAS) means nothing to a
group client; COORDINATOR_NOT_AVAILABLE makes every client look the coordinator up again and
retry, which is what a Redis outage calls for.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from proxy.protocol.errors import ErrorCode, KafkaError
from storage.errors import StorageError


@contextlib.contextmanager
def coordinator_errors() -> Iterator[None]:
    try:
        yield
    except StorageError as exc:
        raise KafkaError(ErrorCode.COORDINATOR_NOT_AVAILABLE, exc.message) from exc
