"""InitProducerId as Kafka answers a non-transactional one: a fresh producer id at epoch 0,
whatever id and epoch the client names, so no client can bump (and so fence) another
producer's id; an id without an epoch, or an epoch without an id, is INVALID_REQUEST."""

from __future__ import annotations

import pytest
from kafka.protocol.producer import InitProducerIdRequest, InitProducerIdResponse

from tests.kiln_harness import RunningKiln
from tests.raw_client import RawClient, record_batch
from wire.errors import ErrorCode


def init_producer_id(client: RawClient, producer_id: int = -1, epoch: int = -1) -> tuple[
        int, int, int]:
    answer = client.request(InitProducerIdRequest[4](
        transactional_id=None, transaction_timeout_ms=60_000, producer_id=producer_id,
        producer_epoch=epoch), 4, InitProducerIdResponse)
    return int(answer.error_code), int(answer.producer_id), int(answer.producer_epoch)


def test_naming_another_producers_id_gets_a_fresh_id_and_fences_nobody(
        slow_kiln: RunningKiln, unique_topic: str) -> None:
    victim, stranger = RawClient(slow_kiln.bootstrap), RawClient(slow_kiln.bootstrap)
    try:
        # Given an idempotent producer that wrote its first batch
        code, pid, epoch = init_producer_id(victim)
        first = victim.produce(unique_topic, 0, record_batch([b"a"], (pid, epoch, 0)))

        # When another client asks for an epoch bump of that producer's id
        bumped = init_producer_id(stranger, pid, epoch)
        theirs = stranger.produce(unique_topic, 0, record_batch([b"b"], (bumped[1], 0, 0)))

        # Then it gets an id of its own, and the producer carries on with its sequence
        second = victim.produce(unique_topic, 0, record_batch([b"c"], (pid, epoch, 1)))
    finally:
        victim.close()
        stranger.close()

    assert (code, epoch) == (0, 0)
    assert bumped[0] == 0 and bumped[1] != pid and bumped[2] == 0
    assert [first.error_code, theirs.error_code, second.error_code] == [0, 0, 0]
    assert [first.base_offset, theirs.base_offset, second.base_offset] == [0, 1, 2]


def test_a_producer_that_lost_its_sequence_asks_again_and_gets_a_usable_id(
        slow_kiln: RunningKiln, unique_topic: str) -> None:
    with RawClient(slow_kiln.bootstrap) as client:
        # Given a producer that wrote two batches under its id (as librdkafka and
        # kafka-python ask again, naming it, after OUT_OF_ORDER_SEQUENCE_NUMBER)
        _, pid, epoch = init_producer_id(client)
        for sequence in range(2):
            client.produce(unique_topic, 0, record_batch([b"x"], (pid, epoch, sequence)))

        # When it asks for a new epoch of its id
        code, new_pid, new_epoch = init_producer_id(client, pid, epoch)
        written = client.produce(unique_topic, 0, record_batch([b"y"], (new_pid, new_epoch, 0)))

    # Then it starts afresh under the id it was given, at sequence 0
    assert (code, new_epoch) == (0, 0)
    assert new_pid != pid
    assert (written.error_code, written.base_offset) == (0, 2)


@pytest.mark.parametrize(("producer_id", "epoch"), [(-1, 3), (42, -1)])
def test_an_id_without_an_epoch_or_an_epoch_without_an_id_is_invalid(
        slow_kiln: RunningKiln, producer_id: int, epoch: int) -> None:
    with RawClient(slow_kiln.bootstrap) as client:
        code, _, _ = init_producer_id(client, producer_id, epoch)

    assert code == ErrorCode.INVALID_REQUEST
