"""Kiln's lineage on a hardened record, without Spark: which Kiln offset a record carries.

Every hardened record names its Kiln offset one of two ways (`proxy/protocol/records.py`):

- its Kafka offset *is* its Kiln offset. A new partition starts both at 0 and they stay
  equal while Kiln hardens every record, so Kiln forwards client batches whole, without a
  header. (Records written before Kiln adopted a topic are read the same way: Kiln's
  offsets start after them.)
- a `kiln.offset` header: the Kiln offset as 8 bytes, big-endian. Once Kiln has dropped
  records (delivered before they were hardened, or never to be hardened), or its fence's
  abort marker took a Kafka offset, the partition's Kafka and Kiln offsets differ for good,
  and every later record gets one. Kiln
  appends it after any the producer sent, so when several are present the last
  well-formed one is Kiln's.

So a record's Kiln offset is its last well-formed `kiln.offset` header, or else its Kafka
offset; recovery and read-through in Kiln read it the same way. Both are Kiln's lineage:
a record without the header is not missing anything. `pipeline.kiln_offset_column` is the
same rule as a Spark expression; the tests check the two agree.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

KILN_OFFSET_HEADER = "kiln.offset"
KILN_OFFSET_BYTES = 8

_INT64 = struct.Struct(">q")

Header = tuple[str, bytes | None]


def decode_kiln_offset(value: bytes | None) -> int | None:
    """The Kiln offset in one `kiln.offset` header value; None unless it is 8 bytes holding
    a non-negative number (Kiln never writes a negative offset)."""
    if value is None or len(value) != KILN_OFFSET_BYTES:
        return None
    offset = int(_INT64.unpack(value)[0])
    return offset if offset >= 0 else None


def encode_kiln_offset(offset: int) -> bytes:
    """A `kiln.offset` header value, as Kiln writes it."""
    return _INT64.pack(offset)


def kiln_offset_of(headers: Sequence[Header] | None) -> int | None:
    """The Kiln offset a record's headers carry: the last well-formed `kiln.offset`."""
    for key, value in reversed(headers or ()):
        if key == KILN_OFFSET_HEADER:
            offset = decode_kiln_offset(value)
            if offset is not None:
                return offset
    return None


def lineage_offset(headers: Sequence[Header] | None, kafka_offset: int) -> int:
    """The Kiln offset of a record: its `kiln.offset` header, or its Kafka offset when it has
    none."""
    offset = kiln_offset_of(headers)
    return kafka_offset if offset is None else offset
