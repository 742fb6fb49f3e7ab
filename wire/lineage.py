"""Kiln's lineage on a hardened record: which Kiln offset it carries. The one definition,
used by Kiln (hardening, recovery, read-through), the Spark jobs and the tests.

Every hardened record names its Kiln offset one of two ways:

- its Kafka offset *is* its Kiln offset. A new partition starts both at 0 and they stay
  equal while Kiln hardens every record, so Kiln forwards client batches whole, without a
  header. (Records written before Kiln adopted a topic are read the same way: Kiln's
  offsets start after them.)
- a `kiln.offset` header: the Kiln offset as 8 bytes, big-endian. Once Kiln has dropped
  records (delivered before they were hardened, or never to be hardened), or its fence's
  abort marker took a Kafka offset, the partition's Kafka and Kiln offsets differ for good,
  and every later record gets one. Kiln appends it after any the producer sent, so when
  several are present the last well-formed one (8 bytes holding a non-negative number:
  Kiln never writes another) is Kiln's.

So a record's Kiln offset is its last well-formed `kiln.offset` header, or else its Kafka
offset. Both are Kiln's lineage: a record without the header is not missing anything.
`spark_examples.pipeline.kiln_offset_column` is the same rule as a Spark expression; the
Spark tests check the two agree.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

KILN_OFFSET_HEADER = "kiln.offset"
KILN_OFFSET_BYTES = 8

_INT64 = struct.Struct(">q")

Header = tuple[str, bytes | None]


def encode_kiln_offset(offset: int) -> bytes:
    """A `kiln.offset` header value, as Kiln writes it."""
    return _INT64.pack(offset)


def kiln_offset_header(offset: int) -> tuple[str, bytes]:
    """The `kiln.offset` header Kiln gives a record at this Kiln offset."""
    return KILN_OFFSET_HEADER, _INT64.pack(offset)


def decode_kiln_offset(value: bytes | None) -> int | None:
    """The Kiln offset in one `kiln.offset` header value; None unless it is 8 bytes holding
    a non-negative number."""
    if value is None or len(value) != KILN_OFFSET_BYTES:
        return None
    offset = int(_INT64.unpack(value)[0])
    return offset if offset >= 0 else None


def _kiln_header_at(headers: Sequence[Header]) -> tuple[int, int] | None:
    """(index, offset) of Kiln's header: the last well-formed `kiln.offset`."""
    for i in range(len(headers) - 1, -1, -1):
        key, value = headers[i]
        if key == KILN_OFFSET_HEADER:
            offset = decode_kiln_offset(value)
            if offset is not None:
                return i, offset
    return None


def kiln_offset_of(headers: Sequence[Header] | None) -> int | None:
    """The Kiln offset a record's headers carry (None: they carry none)."""
    found = _kiln_header_at(headers or ())
    return None if found is None else found[1]


def lineage_offset(headers: Sequence[Header] | None, kafka_offset: int) -> int:
    """The Kiln offset of a record: its `kiln.offset` header, or its Kafka offset when it has
    none."""
    offset = kiln_offset_of(headers)
    return kafka_offset if offset is None else offset


def take_kiln_offset(headers: list[Header]) -> int | None:
    """Remove Kiln's header from `headers` and return its offset; the client's own headers
    (one of that name included) stay, as the hot tier serves them."""
    found = _kiln_header_at(headers)
    if found is None:
        return None
    del headers[found[0]]
    return found[1]


def split_lineage(kafka_offset: int, headers: Sequence[Header] | None
                  ) -> tuple[int, tuple[Header, ...]]:
    """(Kiln offset, the client's own headers) of a hardened record."""
    client = list(headers or ())
    offset = take_kiln_offset(client)
    return (kafka_offset if offset is None else offset), tuple(client)
