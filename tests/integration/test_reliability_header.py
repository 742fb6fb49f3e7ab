"""A producer chooses the reliability of a batch with a `kiln.reliability` record header,
capped by the topic's maximum, and only where the topic lets producers override."""

from __future__ import annotations

from aiokafka.record.default_records import DefaultRecordBatchBuilder
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from storage.model import Reliability, TopicPartition
from tests.kiln_harness import RunningKiln
from tests.raw_client import RawClient
from wire.errors import ErrorCode

NOW_MS = 1_750_000_000_000




def batch_asking(*levels: bytes | None) -> bytes:
    """One record per entry, with a kiln.reliability header of that value (None: none)."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=0,
                                        producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                        batch_size=1 << 20)
    for i, level in enumerate(levels):
        headers = [] if level is None else [("kiln.reliability", level)]
        builder.append(i, timestamp=NOW_MS, key=None, value=b"v%d" % i, headers=headers)
    return bytes(builder.build())


def create(bootstrap: str, topic: str, config: dict[str, str]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, 1, 1, config=config)]).values():
        future.result(30)


def stored_levels(kiln: RunningKiln, topic: str) -> list[Reliability]:
    read = kiln.call(kiln.app.queue.read(TopicPartition(topic, 0), 1 << 20))
    return [batch.reliability for batch in read.batches]


def test_the_header_sets_the_batch_level_within_the_topic_maximum(
        slow_kiln: RunningKiln, unique_topic: str) -> None:
    # Given a topic whose default is reliable_persistent and maximum reliable_persistent
    create(slow_kiln.bootstrap, unique_topic, {"kiln.max.reliability": "reliable_persistent"})
    with RawClient(slow_kiln.bootstrap) as client:
        # When batches ask for express, for nothing, for more than the maximum, for two
        # levels at once, and for a level that does not exist
        codes = [client.produce(unique_topic, 0, batch_asking(*levels)).error_code
                 for levels in ([b"express"], [None], [b"assured_persistent"],
                                [b"best_effort", None, b"reliable_nonpersistent"])]
        unknown = client.produce(unique_topic, 0, batch_asking(b"platinum"))

    # Then each is stored at the level asked for, capped, the strongest named in a batch;
    # the unknown one is refused and stores nothing
    assert codes == [0, 0, 0, 0]
    assert stored_levels(slow_kiln, unique_topic) == [
        Reliability.EXPRESS, Reliability.RELIABLE_PERSISTENT, Reliability.RELIABLE_PERSISTENT,
        Reliability.RELIABLE_NONPERSISTENT]
    assert unknown.error_code == ErrorCode.INVALID_RECORD
    assert "platinum" in unknown.error_message


def test_the_header_is_ignored_where_producers_may_not_override(
        slow_kiln: RunningKiln, unique_topic: str) -> None:
    create(slow_kiln.bootstrap, unique_topic, {"kiln.producer.override": "false",
                                               "kiln.reliability": "express"})
    with RawClient(slow_kiln.bootstrap) as client:
        code = client.produce(unique_topic, 0, batch_asking(b"best_effort")).error_code

    assert code == 0
    assert stored_levels(slow_kiln, unique_topic) == [Reliability.EXPRESS]
