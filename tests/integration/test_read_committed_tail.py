"""Kiln reads its hardened records back as a read_committed consumer does, against a real
broker. The hardening lane writes in Kafka transactions: when one is aborted (its writer
crashed and the next one took over, or it gave up), its records stay in the log, and the
same Kiln offsets are written again, committed, later. The writer's resume point
(tail_position) and the read-through (ColdReader) must see only the committed copies, and
nothing of a transaction still open.

Apache Kafka only: tansu 0.6 lists no aborted transactions in a read_committed Fetch answer,
so their records read as committed there."""

from __future__ import annotations

import asyncio
import time

import pytest

from storage.hardened_batches import LocatedRecord
from storage.hardened_store import HardenedPartitionWriter, tail_position
from storage.kafka.client import KafkaClient, PartitionEnds
from storage.model import TopicPartition
from storage.read_through import ColdRead, ColdReader
from tests.integration.test_hardened_store import run
from wire.lineage import kiln_offset_header
from wire.records import BatchBuilder, decode_records

pytestmark = pytest.mark.integration

BASE_TS = 1_700_000_000_000
TXN_TIMEOUT_MS = 60_000
COMMITTED, ABORTED, AGAIN = b"committed", b"aborted", b"again"


class Lane:
    """A transactional writer of Kiln records into partition 0, as the hardening lane is:
    each record carries its `kiln.offset` header and a value naming its pass."""

    def __init__(self, client: KafkaClient, topic: str) -> None:
        self.client = client
        self.topic = topic
        self.transactional_id = f"kiln-test-lane.{topic}"
        self.producer_id = self.producer_epoch = -1

    async def start(self) -> None:
        """InitProducerId: a new epoch, which has Kafka abort a transaction the previous
        holder of the id left open (a lane taking over from a crashed one)."""
        self.producer_id, self.producer_epoch = await self.client.init_producer_id(
            self.transactional_id, TXN_TIMEOUT_MS)

    async def write(self, kiln_offsets: range, label: bytes, *, batches: int = 1) -> None:
        """One transaction's records, in `batches` Produce requests; left open."""
        await self.client.add_partitions_to_txn(self.transactional_id, self.producer_id,
                                                self.producer_epoch, [(self.topic, 0)])
        sender = await self.client.partition_sender(self.topic, 0)
        per_batch = -(-len(kiln_offsets) // batches)
        for sequence in range(0, len(kiln_offsets), per_batch):
            chunk = kiln_offsets[sequence:sequence + per_batch]
            builder = BatchBuilder(1 << 20, producer_id=self.producer_id,
                                   producer_epoch=self.producer_epoch, base_sequence=sequence,
                                   transactional=True)
            for delta, kiln in enumerate(chunk):
                builder.append(delta, BASE_TS + kiln, None, b"%s-%d" % (label, kiln),
                               [kiln_offset_header(kiln)])
            answer = sender.send(bytes(builder.build()), transactional_id=self.transactional_id)
            await sender.drain()
            await sender.result(answer)

    async def end(self, *, commit: bool) -> PartitionEnds:
        """EndTxn, then the partition's ends once Kafka has written the marker (EndTxn is
        answered before)."""
        await self.client.end_txn(self.transactional_id, self.producer_id,
                                  self.producer_epoch, commit=commit)
        return await settled(self.client, self.topic)

    async def write_pass(self, kiln_offsets: range, label: bytes, *, commit: bool,
                         batches: int = 1) -> PartitionEnds:
        await self.start()
        await self.write(kiln_offsets, label, batches=batches)
        return await self.end(commit=commit)


async def settled(client: KafkaClient, topic: str) -> PartitionEnds:
    """The partition's ends once no transaction is open in it."""
    deadline = time.monotonic() + 30
    while True:
        ends = await client.partition_ends(topic, 0)
        if ends.last_stable_offset == ends.high_watermark or time.monotonic() > deadline:
            return ends
        await asyncio.sleep(0.05)


async def committed_then_aborted(client: KafkaClient, topic: str, *, takeover: bool
                                 ) -> tuple[Lane, PartitionEnds]:
    """Kiln 0..9 committed (Kafka 0..9, marker 10), then a pass of Kiln 10..19 aborted
    (Kafka 11..20, marker 21): by EndTxn, or by the next lane's InitProducerId."""
    await client.create_topic(topic, 1)
    lane = Lane(client, topic)
    await lane.write_pass(range(0, 10), COMMITTED, commit=True)
    await lane.start()
    await lane.write(range(10, 20), ABORTED)
    if takeover:
        await Lane(client, topic).start()
        ends = await settled(client, topic)
    else:
        ends = await lane.end(commit=False)
    return lane, ends


async def read_all(reader: ColdReader, topic: str, kiln_offset: int
                   ) -> tuple[list[tuple[int | None, bytes | None]], ColdRead]:
    """(Kiln offset and value of every record served from `kiln_offset` on, a few at a time;
    the last answer, which served none)."""
    tp = TopicPartition(topic, 0)
    served: list[tuple[int | None, bytes | None]] = []
    while True:
        read = await reader.read(tp, kiln_offset, 200, at_least_one=True)
        if not read.records:
            return served, read
        served += [(r.offset, r.value) for r in decode_records(read.records)]
        assert read.next_offset is not None
        kiln_offset = read.next_offset


def values(label: bytes, kiln_offsets: range) -> list[tuple[int | None, bytes | None]]:
    return [(k, b"%s-%d" % (label, k)) for k in kiln_offsets]


@pytest.mark.parametrize("takeover", [False, True], ids=["end-txn-abort", "takeover-abort"])
def test_the_tail_ends_before_an_aborted_pass(kafka_bootstrap: str, unique_topic: str,
                                              takeover: bool) -> None:
    # Given Kiln 0..9 committed, then a pass of Kiln 10..19 aborted
    async def body(client: KafkaClient) -> tuple[tuple[int | None, int], PartitionEnds]:
        _, ends = await committed_then_aborted(client, unique_topic, takeover=takeover)
        return await tail_position(client, unique_topic, 0), ends  # When

    tail, ends = run(kafka_bootstrap, body)

    # Then hardening resumes at Kiln 10; the next write lands after the abort marker
    assert ends == PartitionEnds(22, 22)
    assert tail == (10, 22)


def test_a_writer_recovering_after_an_aborted_pass_resumes_after_the_committed_records(
        kafka_bootstrap: str, unique_topic: str) -> None:
    # Given Kiln 0..9 committed, then a pass of Kiln 10..19 aborted
    async def body(client: KafkaClient) -> tuple[int | None, int]:
        await committed_then_aborted(client, unique_topic, takeover=False)
        writer = HardenedPartitionWriter(client, unique_topic, 0)
        resume = await writer.recover()  # When
        return resume, writer.next_kiln_offset

    # Then
    assert run(kafka_bootstrap, body) == (10, 10)


def test_the_read_through_serves_the_committed_records_and_nothing_of_the_aborted_pass(
        kafka_bootstrap: str, unique_topic: str) -> None:
    # Given Kiln 0..9 committed, then a pass of Kiln 10..19 aborted
    async def body(client: KafkaClient) -> tuple[list[tuple[int | None, bytes | None]],
                                                 ColdRead, ColdRead]:
        await committed_then_aborted(client, unique_topic, takeover=True)
        reader = ColdReader(client)
        served, last = await read_all(reader, unique_topic, 0)  # When read from the start
        past = await reader.read(TopicPartition(unique_topic, 0), 15, 1 << 20)
        return served, last, past

    served, last, past = run(kafka_bootstrap, body)

    # Then Kiln 0..9 once each, and Kafka holds nothing from Kiln 10 on
    assert served == values(COMMITTED, range(0, 10))
    assert (last.next_offset, last.earliest) == (None, 0)
    assert past == ColdRead(b"", None, 0)


def test_records_written_again_after_an_aborted_pass_are_read_once(
        kafka_bootstrap: str, unique_topic: str) -> None:
    # Given Kiln 0..9 committed, a pass of Kiln 10..19 aborted, then 10..19 committed again
    async def body(client: KafkaClient) -> tuple[tuple[int | None, int], PartitionEnds,
                                                 list[tuple[int | None, bytes | None]],
                                                 list[tuple[int | None, bytes | None]]]:
        lane, _ = await committed_then_aborted(client, unique_topic, takeover=False)
        ends = await lane.write_pass(range(10, 20), AGAIN, commit=True)
        tail = await tail_position(client, unique_topic, 0)
        # When the read-through reads from the start, and (a new reader) from Kiln 12
        from_start, _ = await read_all(ColdReader(client), unique_topic, 0)
        from_12, _ = await read_all(ColdReader(client), unique_topic, 12)
        return tail, ends, from_start, from_12

    tail, ends, from_start, from_12 = run(kafka_bootstrap, body)

    # Then the tail is after Kiln 19, and every Kiln offset is served once, committed
    assert ends == PartitionEnds(33, 33)  # 22..31 the records again, 32 their marker
    assert tail == (20, 33)
    assert from_start == values(COMMITTED, range(0, 10)) + values(AGAIN, range(10, 20))
    assert from_12 == values(AGAIN, range(12, 20))


def test_timestamp_look_ups_find_the_committed_copies(kafka_bootstrap: str,
                                                      unique_topic: str) -> None:
    # Given Kiln 0..9 committed, a pass of Kiln 10..19 aborted, then 10..19 committed again
    # (each record's timestamp is BASE_TS + its Kiln offset, in both copies)
    async def body(client: KafkaClient) -> tuple[LocatedRecord | None, LocatedRecord | None]:
        lane, _ = await committed_then_aborted(client, unique_topic, takeover=False)
        await lane.write_pass(range(10, 20), AGAIN, commit=True)
        reader = ColdReader(client)
        tp = TopicPartition(unique_topic, 0)
        # When
        return (await reader.offset_for_timestamp(tp, BASE_TS + 15),
                await reader.max_timestamp_record(tp))

    at_15, newest = run(kafka_bootstrap, body)

    # Then both name the committed copy (Kafka 22..31), not the aborted one (Kafka 11..20)
    assert at_15 == LocatedRecord(27, 15, BASE_TS + 15)
    assert newest == LocatedRecord(31, 19, BASE_TS + 19)


def test_an_aborted_pass_of_many_batches_at_the_start_is_read_past(
        kafka_bootstrap: str, unique_topic: str) -> None:
    # Given a first pass of Kiln 0..39 in 40 batches, aborted, then 0..39 committed again
    async def body(client: KafkaClient) -> tuple[int | None,
                                                 list[tuple[int | None, bytes | None]]]:
        await client.create_topic(unique_topic, 1)
        lane = Lane(client, unique_topic)
        await lane.write_pass(range(0, 40), ABORTED, commit=False, batches=40)
        await lane.write_pass(range(0, 40), AGAIN, commit=True)
        reader = ColdReader(client)
        earliest = await reader.earliest(TopicPartition(unique_topic, 0))  # When
        served, _ = await read_all(reader, unique_topic, 0)
        return earliest, served

    earliest, served = run(kafka_bootstrap, body)

    # Then
    assert earliest == 0
    assert served == values(AGAIN, range(0, 40))


def test_a_pass_still_open_is_not_there_yet(kafka_bootstrap: str, unique_topic: str) -> None:
    # Given Kiln 0..9 committed, then a pass of Kiln 10..19 written and not yet committed
    async def body(client: KafkaClient) -> tuple[PartitionEnds, tuple[int | None, int],
                                                 list[tuple[int | None, bytes | None]],
                                                 ColdRead]:
        await client.create_topic(unique_topic, 1)
        lane = Lane(client, unique_topic)
        await lane.write_pass(range(0, 10), COMMITTED, commit=True)
        await lane.start()
        await lane.write(range(10, 20), AGAIN)
        try:
            ends = await client.partition_ends(unique_topic, 0)
            tail = await tail_position(client, unique_topic, 0)  # When
            served, last = await read_all(ColdReader(client), unique_topic, 0)
        finally:
            await lane.end(commit=False)
        return ends, tail, served, last

    ends, tail, served, last = run(kafka_bootstrap, body)

    # Then the open pass is past the last stable offset: not hardened yet, and a read at
    # Kiln 10 is asked again (it may commit), not answered "Kafka holds nothing"
    assert ends == PartitionEnds(21, 11)
    assert tail == (10, 21)
    assert served == values(COMMITTED, range(0, 10))
    assert last == ColdRead(b"", 10, 0)

