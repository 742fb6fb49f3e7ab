"""Values shared by the log queue, the hardener and the hardened store."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Reliability(enum.IntEnum):
    """The five levels of DESIGN.md section 3, weakest first (the order is used to cap)."""

    BEST_EFFORT = 0
    EXPRESS = 1
    RELIABLE_NONPERSISTENT = 2
    RELIABLE_PERSISTENT = 3
    ASSURED_PERSISTENT = 4

    @property
    def persistent(self) -> bool:
        return self >= Reliability.RELIABLE_PERSISTENT

    @classmethod
    def parse(cls, name: str) -> Reliability:
        try:
            return cls[name.strip().upper()]
        except KeyError:
            known = ", ".join(level.name.lower() for level in cls)
            raise ValueError(f"unknown reliability {name!r} (one of {known})") from None


@dataclass(frozen=True, slots=True)
class TopicPartition:
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class StoredBatch:
    """One client record batch as kept in the log queue.

    `data` is the batch exactly as the client encoded it (its base_offset field is whatever
    the client sent); `base_offset` is the Kiln offset of its first record.
    """

    base_offset: int
    record_count: int
    append_time_ms: int
    reliability: Reliability
    data: bytes
    # A record of it carries a `kiln.offset` header the client sent: the batch may not be
    # forwarded as it is, or that header would pass for Kiln's lineage.
    carries_kiln_header: bool = False

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.record_count
