"""Whether Redis may drop Kiln's keys on its own.

Under a `maxmemory` limit with any `maxmemory-policy` but `noeviction`, Redis evicts keys to
make room: buffered batches, partition state, group offsets, acknowledged records, without a
word to Kiln. Kiln refuses to start on such a Redis, and stops accepting records while one
is configured so at run time (CONFIG SET); `noeviction` makes a full Redis refuse writes
instead, which producers see as back-pressure.
"""

from __future__ import annotations

import logging

from redis.exceptions import ResponseError

from storage.errors import BufferUnavailable
from storage.redis_pool import REDIS_FAILURES, RedisClient

log = logging.getLogger(__name__)

SAFE_POLICY = "noeviction"


async def eviction_risk(redis: RedisClient) -> str | None:
    """Why Redis may evict Kiln's keys, or None when it will not (or cannot be asked)."""
    try:
        config = await redis.config_get("maxmemory*")
    except ResponseError as exc:
        # Managed Redis services may rename or forbid CONFIG; the operator must vouch.
        log.warning("cannot read Redis's maxmemory-policy (%s): make sure it is %s",
                    exc, SAFE_POLICY)
        return None
    except REDIS_FAILURES as exc:
        raise BufferUnavailable(str(exc)) from exc
    values = {_text(k): _text(v) for k, v in config.items()}
    policy = values.get("maxmemory-policy", SAFE_POLICY)
    if policy == SAFE_POLICY or int(values.get("maxmemory", "0") or 0) == 0:
        return None
    return (f"Redis evicts keys under memory pressure (maxmemory {values['maxmemory']}, "
            f"maxmemory-policy {policy}), which would lose acknowledged records without a "
            f"word: set maxmemory-policy {SAFE_POLICY}")


def _text(value: bytes | str | None) -> str:
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else value
