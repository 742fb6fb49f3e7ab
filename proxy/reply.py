"""A response that is not ready when its request has been processed.

Requests on a connection are processed one after another, as Kafka does, so appends keep
the order producers sent them in. A handler whose answer must wait (an assured produce
waiting for hardening) returns a Deferred: the connection goes on to the next request and
sends this response, still in request order, once it resolves.
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Deferred:
    # Resolves to the response body, or None when no response is to be sent.
    answer: Awaitable[Any]
