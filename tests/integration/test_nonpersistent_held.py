"""reliable_nonpersistent records are kept in the log queue until delivered to every durable
subscription (never written to Kafka), while the persistent records behind them are
hardened on time; without durable subscriptions they are dropped at the delay."""

from __future__ import annotations

from kafka import KafkaProducer

from storage.log_queue import PartitionState
from storage.model import TopicPartition
from tests.integration.test_delivery import commit
from tests.integration.test_produce_harden import kiln_offset, read_hardened
from tests.kiln_harness import RunningKiln, eventually, fresh_kiln, start_kiln, sync_redis

LEVELS = ("reliable_persistent", "reliable_nonpersistent", "reliable_persistent")




def produce_three_batches(kiln: RunningKiln, topic: str) -> None:
    """Offsets 0-9 persistent, 10-19 reliable_nonpersistent, 20-29 persistent: one batch
    each, the level named in each record's kiln.reliability header."""
    producer = KafkaProducer(bootstrap_servers=kiln.bootstrap, acks=1, linger_ms=0)
    for i, level in enumerate(LEVELS):
        futures = [producer.send(topic, value=b"r%d" % (10 * i + j), partition=0,
                                 headers=[("kiln.reliability", level.encode())])
                   for j in range(10)]
        producer.flush()
        assert [f.get(timeout=10).offset for f in futures] == list(range(10 * i, 10 * i + 10))
    producer.close()


def state(kiln: RunningKiln, topic: str) -> PartitionState:
    return kiln.call(kiln.app.queue.state(TopicPartition(topic, 0)))


def hardened_offsets(bootstrap: str, topic: str, expected: int) -> list[int]:
    return [kiln_offset(r) for r in read_hardened(bootstrap, topic, 0, expected, timeout_s=5)]


def test_a_nonpersistent_batch_is_held_until_delivered_and_never_written(
        kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given a topic with a durable subscription that has read nothing yet
    kiln.call(kiln.app.delivery.subscribe(unique_topic, "readers"))
    produce_three_batches(kiln, unique_topic)

    # When the delay has long passed
    held = eventually(lambda: state(kiln, unique_topic).hardened_offset == 30)
    in_kafka = hardened_offsets(kafka_bootstrap, unique_topic, 20)
    while_held = state(kiln, unique_topic)

    # Then both persistent batches are in Kafka, the nonpersistent one (and the batch behind
    # it) still in Redis
    assert held
    assert in_kafka == [*range(10), *range(20, 30)]
    assert (while_held.start_offset, while_held.buffered_records) == (10, 20)
    assert while_held.hardened_records == 20

    # When the subscription commits past it
    commit(kiln, "readers", unique_topic, 20)

    # Then it leaves (counted as delivered) and Kafka never got it
    assert eventually(lambda: state(kiln, unique_topic).buffered_records == 0)
    final = state(kiln, unique_topic)
    assert (final.hardened_records, final.delivered_records, final.expired_records) == (20, 10, 0)
    assert hardened_offsets(kafka_bootstrap, unique_topic, 20) == [*range(10), *range(20, 30)]


def test_without_durable_subscriptions_nonpersistent_records_expire_at_the_delay(
        kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given a topic nobody subscribed to
    produce_three_batches(kiln, unique_topic)

    # When the delay passes
    emptied = eventually(lambda: state(kiln, unique_topic).buffered_records == 0)

    # Then the nonpersistent records were dropped, the persistent ones hardened
    final = state(kiln, unique_topic)
    assert emptied
    assert (final.hardened_records, final.delivered_records, final.expired_records) == (20, 0, 10)
    assert hardened_offsets(kafka_bootstrap, unique_topic, 20) == [*range(10), *range(20, 30)]


def test_a_flush_completes_while_records_are_held_and_a_restart_keeps_holding_them(
        redis_url: str, kafka_bootstrap: str, unique_topic: str) -> None:
    kiln = fresh_kiln(redis_url, kafka_bootstrap)
    # Given a held nonpersistent batch with a hardened one behind it, and a Kiln that died
    # after writing that batch to Kafka and before its pass was recorded in Redis
    kiln.call(kiln.app.delivery.subscribe(unique_topic, "readers"))
    produce_three_batches(kiln, unique_topic)
    assert eventually(lambda: state(kiln, unique_topic).hardened_offset == 30)
    flushed = kiln.flush(timeout_s=5)
    kiln.stop()
    meta = f"kiln:{{{unique_topic}/0}}:meta"
    sync_redis(redis_url).hset(meta, "hardened", 10)

    # When another Kiln takes over
    with start_kiln(redis_url, kafka_bootstrap) as successor:
        recovered = eventually(lambda: state(successor, unique_topic).hardened_offset == 30)
        still_held = state(successor, unique_topic)
        commit(successor, "readers", unique_topic, 20)
        released = eventually(lambda: state(successor, unique_topic).buffered_records == 0)

    # Then the flush did not wait for the held batch, the successor kept it until it was
    # delivered, and Kafka holds every persistent record once
    assert flushed
    assert recovered
    assert (still_held.start_offset, still_held.buffered_records) == (10, 20)
    assert released
    assert hardened_offsets(kafka_bootstrap, unique_topic, 20) == [*range(10), *range(20, 30)]
