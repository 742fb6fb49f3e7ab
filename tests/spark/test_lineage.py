"""Kiln's lineage, decoded without Spark: a record's `kiln.offset` header, or else its Kafka
offset."""

from __future__ import annotations

import struct

from wire.lineage import (
    decode_kiln_offset,
    encode_kiln_offset,
    kiln_offset_of,
    lineage_offset,
)


def test_a_header_value_is_eight_bytes_big_endian() -> None:
    assert encode_kiln_offset(258) == b"\x00\x00\x00\x00\x00\x00\x01\x02"
    assert decode_kiln_offset(b"\x00\x00\x00\x00\x00\x00\x01\x02") == 258
    assert decode_kiln_offset(encode_kiln_offset(2**63 - 1)) == 2**63 - 1


def test_malformed_values_carry_no_offset() -> None:
    assert decode_kiln_offset(None) is None
    assert decode_kiln_offset(b"\x01" * 7) is None
    assert decode_kiln_offset(b"\x00" * 9) is None
    assert decode_kiln_offset(struct.pack(">q", -1)) is None  # Kiln never writes one


def test_the_last_wellformed_kiln_header_wins() -> None:
    # Given a client's own kiln.offset header, then Kiln's, then a malformed one
    headers = [("kiln.offset", encode_kiln_offset(5)), ("trace", b"x"),
               ("kiln.offset", encode_kiln_offset(17)), ("kiln.offset", b"bad")]
    # Then Kiln's (the last well-formed) is the record's Kiln offset
    assert kiln_offset_of(headers) == 17


def test_a_record_without_a_kiln_header_has_its_kafka_offset_as_kiln_offset() -> None:
    assert kiln_offset_of(None) is None
    assert kiln_offset_of([("other", b"\x00" * 8)]) is None
    assert lineage_offset([("other", b"x")], kafka_offset=41) == 41
    assert lineage_offset([("kiln.offset", encode_kiln_offset(9))], kafka_offset=41) == 9
