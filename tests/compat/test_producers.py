"""Real third-party producers through Kiln; what they sent is read back from the hardened
Kafka topic, directly from the broker.

For every case: each acknowledged record is there exactly once, in send order, in the
partition the client was told, with key, value, headers and timestamp intact, and a Kiln
offset (its `kiln.offset` header, or its Kafka offset: wire/lineage.py) equal to
the offset the client was given (acks=0: the client is given none, so the Kiln offsets must
run 0..n-1). The codec cases also check, with a raw Fetch, that the hardened batches carry
the codec the client was configured with.

Matrix: every codec a client supports x every client at acks=1; acks 0 / all x idempotence
off / on for each client (one codec; every client refuses idempotence unless acks=all); a
3-partition topic created through Kiln with each client's admin API, records spread by key.
kafka-python is left out for snappy: it needs python-snappy, which is not installed (it
refuses to build the producer).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import pytest

from tests.compat.clients import (
    CREATE_TOPIC,
    PRODUCERS,
    Delivered,
    Hardened,
    ProducerCase,
    Record,
    as_read,
    as_sent,
    assert_hardened_with_codec,
    expected_by_partition,
    kafka_partition_count,
    make_records,
    read_hardened,
)
from tests.kiln_harness import RunningKiln

N_RECORDS = 200

CODECS = {
    "kafka-python": ["none", "gzip", "lz4", "zstd"],
    "aiokafka": ["none", "gzip", "snappy", "lz4", "zstd"],
    "confluent-kafka": ["none", "gzip", "snappy", "lz4", "zstd"],
}


def _client_param(client: str, *values: object) -> object:
    return pytest.param(client, *values, id="-".join(map(str, (client, *values))))


def harden_and_read(kiln: RunningKiln, kafka_bootstrap: str, topic: str, partitions: int,
                    expected_total: int, timeout_s: float = 15) -> dict[int, list[Hardened]]:
    """Harden everything now and read the topic back. Tried again while records are missing,
    because an acks=0 producer's last requests may reach Kiln after its flush() returned."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert kiln.flush(), "Kiln could not harden everything"
        hardened = read_hardened(kafka_bootstrap, topic, partitions)
        total = sum(len(v) for v in hardened.values())
        if total >= expected_total or time.monotonic() > deadline:
            return hardened
        time.sleep(0.2)


def assert_hardened_as_sent(records: Sequence[Record], delivered: Sequence[Delivered],
                            hardened: dict[int, list[Hardened]], partitions: int,
                            acks_zero: bool) -> None:
    expected = expected_by_partition(records, delivered, partitions)
    for partition in range(partitions):
        sent = expected[partition]
        reported = [offset for _, offset in sent]
        # A fresh topic: Kiln offsets run from 0, one per record. With acks=0 the client is
        # told none, so the hardened ones must simply be contiguous from 0.
        offsets = list(range(len(sent)))
        if acks_zero:
            assert reported == [None] * len(sent)
        else:
            assert reported == offsets, f"partition {partition}"
        want = [as_sent(record, offset) for (record, _), offset in zip(sent, offsets,
                                                                       strict=True)]
        got = [as_read(h) for h in hardened[partition]]
        assert len(got) == len(want), f"partition {partition}: {len(got)} != {len(want)}"
        assert got == want, f"partition {partition}"
        assert [h.kiln_offset for h in hardened[partition]] == offsets


@pytest.mark.parametrize(("client", "compression"), [
    _client_param(client, codec) for client, codecs in CODECS.items() for codec in codecs
])
def test_every_codec_is_hardened_intact(kiln: RunningKiln, kafka_bootstrap: str,
                                        unique_topic: str, client: str,
                                        compression: str) -> None:
    # Given
    records = make_records(N_RECORDS)
    case = ProducerCase(compression=compression, acks=1, idempotence=False)
    # When
    delivered = PRODUCERS[client](kiln.bootstrap, unique_topic, records, case, 0)
    # Then
    hardened = harden_and_read(kiln, kafka_bootstrap, unique_topic, 1, N_RECORDS)
    assert_hardened_as_sent(records, delivered, hardened, 1, acks_zero=False)
    assert_hardened_with_codec(kafka_bootstrap, unique_topic, compression)


@pytest.mark.parametrize(("client", "acks", "idempotence"), [
    _client_param(client, acks, idempotence)
    for client in PRODUCERS
    for acks, idempotence in [(0, False), ("all", False), ("all", True)]
])
def test_acks_and_idempotence(kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str,
                              client: str, acks: int | str, idempotence: bool) -> None:
    # acks=1 without idempotence is covered by the codec matrix; acks=1 with idempotence is
    # refused by all three clients themselves.
    records = make_records(N_RECORDS)
    case = ProducerCase(compression="lz4", acks=acks, idempotence=idempotence)

    delivered = PRODUCERS[client](kiln.bootstrap, unique_topic, records, case, 0)

    hardened = harden_and_read(kiln, kafka_bootstrap, unique_topic, 1, N_RECORDS)
    assert_hardened_as_sent(records, delivered, hardened, 1, acks_zero=acks == 0)


@pytest.mark.parametrize("client", [_client_param(client) for client in PRODUCERS])
def test_topic_created_through_kiln_spreads_records_by_key(
        kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str, client: str) -> None:
    # Given a 3-partition topic created with the client's admin API through Kiln
    CREATE_TOPIC[client](kiln.bootstrap, unique_topic, 3)
    records = make_records(N_RECORDS)
    case = ProducerCase(compression="gzip", acks=1, idempotence=False)
    # When records are sent without a partition, to be placed by the client's partitioner
    delivered = PRODUCERS[client](kiln.bootstrap, unique_topic, records, case, None)
    # Then Kafka has the topic with 3 partitions, and each holds its records in order
    assert kafka_partition_count(kafka_bootstrap, unique_topic) == 3
    hardened = harden_and_read(kiln, kafka_bootstrap, unique_topic, 3, N_RECORDS)
    assert_hardened_as_sent(records, delivered, hardened, 3, acks_zero=False)
    used = {d.partition for d in delivered}
    assert len(used) >= 2, f"all records went to partitions {used}"
    by_key: dict[bytes, set[int]] = {}
    for record, where in zip(records, delivered, strict=True):
        if record.key is not None:
            by_key.setdefault(record.key, set()).add(where.partition)
    assert all(len(p) == 1 for p in by_key.values()), by_key
