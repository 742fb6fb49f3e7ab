"""Record batch header validation, on batches built by aiokafka's client-side builder."""

from __future__ import annotations

import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from wire.batch import (
    as_served,
    read_header,
    split_batches,
    with_base_offset,
    with_leader_epoch,
)
from wire.errors import ErrorCode, KafkaError


def client_batch(count: int = 3, codec: int = 0, producer: tuple[int, int, int] = (-1, -1, -1)
                 ) -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=codec, is_transactional=0,
                                        producer_id=producer[0], producer_epoch=producer[1],
                                        base_sequence=producer[2], batch_size=1 << 20)
    for i in range(count):
        builder.append(i, timestamp=1_700_000_000_000 + i, key=b"k%d" % i, value=b"v%d" % i,
                       headers=[("h", b"x")])
    return bytes(builder.build())


def test_split_reads_every_batch_of_a_record_set() -> None:
    records = client_batch(3) + client_batch(5, codec=1, producer=(12, 0, 40))

    batches = list(split_batches(records))

    assert [h.record_count for h, _ in batches] == [3, 5]
    assert batches[1][0].producer_id == 12
    assert batches[1][0].base_sequence == 40
    assert batches[1][0].last_sequence == 44
    assert batches[1][0].compression == 1
    assert b"".join(bytes(v) for _, v in batches) == records


def test_flipped_byte_fails_the_crc() -> None:
    records = bytearray(client_batch(3))
    records[-1] ^= 0xFF

    with pytest.raises(KafkaError) as raised:
        list(split_batches(bytes(records)))

    assert raised.value.error_code is ErrorCode.CORRUPT_MESSAGE


def test_truncated_batch_is_corrupt() -> None:
    with pytest.raises(KafkaError) as raised:
        list(split_batches(client_batch(3)[:-5]))

    assert raised.value.error_code is ErrorCode.CORRUPT_MESSAGE


def test_old_magic_is_refused() -> None:
    records = bytearray(client_batch(1))
    records[16] = 1

    with pytest.raises(KafkaError) as raised:
        list(split_batches(bytes(records)))

    assert raised.value.error_code is ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT


def test_empty_record_set_is_corrupt() -> None:
    with pytest.raises(KafkaError):
        list(split_batches(b""))


def test_base_offset_rewrite_keeps_crc_valid() -> None:
    patched = with_base_offset(client_batch(2), 1234)

    header = read_header(patched)
    assert header.base_offset == 1234
    assert next(iter(split_batches(patched)))[0].record_count == 2


def test_a_served_batch_carries_its_offset_and_leader_epoch_under_the_same_crc() -> None:
    # Given a client's batch, compressed, with leader epoch -1 as producers send it
    batch = client_batch(3, codec=1)

    # When it is served at offset 1234 in leader epoch 0
    served = as_served(batch, 1234, 0)

    # Then only those fields changed, and the CRC (attributes onward) still holds
    header = read_header(served)
    assert (header.base_offset, header.partition_leader_epoch) == (1234, 0)
    assert served[16:] == batch[16:]
    assert next(iter(split_batches(served)))[0].record_count == 3


def test_every_batch_of_a_record_set_gets_the_leader_epoch() -> None:
    # Given a record set of two batches, the second compressed, and the start of a third
    # cut short as a fetch limit cuts it
    records = client_batch(2) + client_batch(4, codec=1)
    cut = client_batch(1)[:40]

    # When they are stamped with leader epoch 7
    stamped = with_leader_epoch(records + cut, 7)

    # Then both whole batches carry it with valid CRCs, and nothing else changed
    batches = list(split_batches(stamped[:len(records)]))
    assert [h.partition_leader_epoch for h, _ in batches] == [7, 7]
    assert [h.record_count for h, _ in batches] == [2, 4]
    assert len(stamped) == len(records + cut)
    assert stamped[len(records) + 16:] == cut[16:]
