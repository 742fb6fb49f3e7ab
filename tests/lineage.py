"""The Kiln offset of a record read back from a hardened topic (DESIGN §5), written out here
independently of the product code: Kiln's `kiln.offset` header (8 bytes, big-endian, after
the client's own headers), or, for a record without one, its Kafka offset. Kiln forwards
records without the header while a partition's Kafka offsets equal its Kiln offsets."""

from __future__ import annotations

import struct
from collections.abc import Iterable

KILN_OFFSET = "kiln.offset"

Header = tuple[str, bytes | None]


def split_lineage(kafka_offset: int, headers: Iterable[Header] | None
                  ) -> tuple[int, tuple[Header, ...]]:
    """(Kiln offset, the client's own headers) of a hardened record."""
    found = tuple(headers or ())
    if found:
        key, value = found[-1]
        if key == KILN_OFFSET and isinstance(value, bytes) and len(value) == 8:
            return int(struct.unpack(">q", value)[0]), found[:-1]
    return kafka_offset, found


def kiln_offset(kafka_offset: int, headers: Iterable[Header] | None) -> int:
    return split_lineage(kafka_offset, headers)[0]
