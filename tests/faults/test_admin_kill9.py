"""Deletes through Kiln's admin API broken on purpose: Kiln is killed with SIGKILL (or stopped
with SIGSTOP) while it deletes a topic or a partition's records, restarted on the same port,
and the operator asks again. Each step of a deletion is meant to be safe to repeat
(storage.catalog's `delete`, storage.record_deletion); these tests count what is left of the
deleted state afterwards in Kiln's Metadata, Kafka, Redis and the group coordinator, and what
a consumer reads.

The kill moments come from a seeded random generator whose seed the test prints
(KILN_TEST_FAULT_SEED replays a run). Where each kill landed is read back from the state it
left (before the deletion, half way, done) and printed, so a run shows which points it hit.

A killed process holds its partitions' hardening leases for 10 s, so the hardened tier is
checked once per test, after one flush at the end, instead of once per kill.
"""

from __future__ import annotations

import random
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from kafka.admin import KafkaAdminClient
from kafka.protocol.admin import (
    DeleteRecordsRequest,
    DeleteRecordsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
)
from kafka.protocol.consumer import ListOffsetsRequest, ListOffsetsResponse

from tests.compat.clients import read_hardened
from tests.compat.java import commit_offsets, committed_offsets
from tests.faults.kiln_process import KilnProcess, fresh_kiln_process, kiln_cli
from tests.integration.consumers import BEGINNING, consume_kafka_python
from tests.raw_client import RawClient, record_batch
from wire.errors import ErrorCode

# Nothing is hardened unless a flush asks: records produced after a flush stay buffered.
HARDEN_NEVER_BY_ITSELF_MS = 3_600_000
# About as long as each deletion through Kiln takes against a local Kafka.
TOPIC_KILL_WINDOW_S = 0.15
RECORDS_KILL_WINDOW_S = 0.15
DELETE_TOPICS_KILLS = 5
DELETE_RECORDS_KILLS = 5
PAUSES = 2
PARTITIONS = 2
EARLIEST = -2


@pytest.fixture
def kiln(redis_url: str, kafka_bootstrap: str, tmp_path: Path) -> Iterator[KilnProcess]:
    with fresh_kiln_process(redis_url, kafka_bootstrap, tmp_path / "kiln.log",
                            HARDEN_NEVER_BY_ITSELF_MS) as process:
        process.start()
        yield process


def create_topic(bootstrap: str, topic: str, partitions: int = PARTITIONS) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result(30)


def kill_delays(rng: random.Random, count: int, window_s: float) -> list[float]:
    """One delay in each of `count` equal slices of the window, in random order: a few
    kills still cover the whole deletion."""
    delays = [rng.uniform(i, i + 1) * window_s / count for i in range(count)]
    rng.shuffle(delays)
    return delays


def produce(bootstrap: str, topic: str, partition: int, values: list[bytes]) -> None:
    with RawClient(bootstrap, timeout_s=30) as client:
        answer = client.produce(topic, partition, record_batch(values))
        assert answer.error_code == ErrorCode.NONE, answer


def delete_topics_request(topic: str) -> Any:
    return DeleteTopicsRequest[4](topic_names=[topic], timeout_ms=30_000)


def delete_records_request(topic: str, offset: int) -> Any:
    wanted = DeleteRecordsRequest.DeleteRecordsTopic
    return DeleteRecordsRequest[2](timeout_ms=30_000, topics=[wanted(
        name=topic, partitions=[wanted.DeleteRecordsPartition(partition_index=0,
                                                              offset=offset)])])


def delete_topic(bootstrap: str, topic: str) -> int:
    with RawClient(bootstrap, timeout_s=60) as client:
        answer = client.request(delete_topics_request(topic), 4, DeleteTopicsResponse)
    return int(answer.responses[0].error_code)


def delete_records(bootstrap: str, topic: str, offset: int) -> tuple[int, int]:
    with RawClient(bootstrap, timeout_s=60) as client:
        answer = client.request(delete_records_request(topic, offset), 2,
                                DeleteRecordsResponse)
    part = answer.topics[0].partitions[0]
    return int(part.error_code), int(part.low_watermark)


def earliest(bootstrap: str, topic: str) -> int:
    wanted = ListOffsetsRequest.ListOffsetsTopic
    with RawClient(bootstrap, timeout_s=30) as client:
        answer = client.request(ListOffsetsRequest[8](
            replica_id=-1, isolation_level=0, topics=[wanted(name=topic, partitions=[
                wanted.ListOffsetsPartition(partition_index=0, current_leader_epoch=-1,
                                            timestamp=EARLIEST)])]), 8, ListOffsetsResponse)
    part = answer.topics[0].partitions[0]
    assert part.error_code == ErrorCode.NONE, part
    return int(part.offset)


def send_then_kill(kiln: KilnProcess, request: Any, version: int, response: Any,
                   delay_s: float) -> int | None:
    """Send `request`, SIGKILL Kiln `delay_s` later; the answer's first error code if it
    came before the kill, else None."""
    with RawClient(kiln.bootstrap, timeout_s=30) as client:
        correlation_id = client.send(request, version)
        time.sleep(delay_s)
        kiln.kill()
        client.sock.settimeout(2)
        try:
            answer = client.receive(correlation_id, version, response)
        except OSError:  # the kill closed the connection before the answer
            return None
    first = answer.responses[0] if hasattr(answer, "responses") else \
        answer.topics[0].partitions[0]
    return int(first.error_code)


def kafka_topics(kafka_bootstrap: str) -> set[str]:
    return set(AdminClient({"bootstrap.servers": kafka_bootstrap}).list_topics(timeout=10)
               .topics)


def kiln_topics(bootstrap: str) -> set[str]:
    with KafkaAdminClient(bootstrap_servers=bootstrap) as admin:
        return set(admin.list_topics())


# Not the topic's state: the note a deletion leaves on purpose (storage.catalog), and each
# process's delay-controller report (observability, rewritten every second, gone 30 s after
# its process).
_NOT_TOPIC_STATE = (b"kiln:topics:deleted", b"kiln:delay:")


def leftovers(client: redis.Redis, topic: str) -> list[str]:
    """Every Redis key, and every field of a hash, that names `topic`."""
    name = topic.encode()
    found: list[str] = []
    for key in client.scan_iter(count=1000):
        if key.startswith(_NOT_TOPIC_STATE):
            continue
        if name in key:
            found.append(key.decode())
        elif client.type(key) == b"hash":
            found += [f"{key.decode()}[{f.decode()}]" for f in client.hkeys(key) if name in f]
    return sorted(found)


@dataclass(frozen=True, slots=True)
class Observed:
    """What a kill left of a topic's deletion, read before the retry."""

    in_kiln: bool
    in_kafka: bool
    note: str  # "none", "started", "finished"
    leftovers: int

    @property
    def kill_point(self) -> str:
        if self.note == "none":
            return "before the deletion began"
        if self.note == "finished":
            return "after the deletion finished"
        if self.in_kafka:
            return "noted, Kafka not deleted yet"
        if self.in_kiln:
            return "Kafka deleted, Kiln registration left"
        return "Kafka and registration deleted, Redis state left" if self.leftovers \
            else "all deleted, note not finished"


def observe(client: redis.Redis, kafka_bootstrap: str, topic: str) -> Observed:
    raw = client.hget("kiln:topics:deleted", topic)
    note = "none" if raw is None else ("started" if b'"finished_ms": null' in raw
                                       else "finished")
    return Observed(client.hget("kiln:topics", topic) is not None,
                    topic in kafka_topics(kafka_bootstrap), note, len(leftovers(client, topic)))


def values(prefix: str, offsets: range) -> list[bytes]:
    return [f"{prefix}-{o}".encode() for o in offsets]


def test_delete_topics_killed_at_random_moments_is_completed_by_a_retry(
        kiln: KilnProcess, redis_url: str, redis_client: redis.Redis, kafka_bootstrap: str,
        rng: random.Random) -> None:
    report: list[str] = []
    points: Counter[str] = Counter()
    topics: list[str] = []
    for i, delay in enumerate(kill_delays(rng, DELETE_TOPICS_KILLS, TOPIC_KILL_WINDOW_S)):
        # Given a 2-partition topic with 3 + 2 records hardened and 2 + 1 still buffered, a
        # durable subscription and a group's committed offsets
        topic = f"deleted-{i}-{uuid.uuid4().hex[:8]}"
        group = f"group-{i}-{uuid.uuid4().hex[:8]}"
        topics.append(topic)
        create_topic(kiln.bootstrap, topic)
        produce(kiln.bootstrap, topic, 0, values("old", range(3)))
        produce(kiln.bootstrap, topic, 1, values("old", range(2)))
        kiln_cli(redis_url, "flush", topic)
        produce(kiln.bootstrap, topic, 0, values("old", range(3, 5)))
        produce(kiln.bootstrap, topic, 1, values("old", range(2, 3)))
        kiln_cli(redis_url, "subscriptions", "add", topic, group)
        commit_offsets(kiln.bootstrap, group, topic, {0: 1, 1: 1})
        assert redis_client.hexists("kiln:subscriptions", f"{topic}/{group}")
        assert leftovers(redis_client, topic), "the topic has no state in Redis to delete"
        assert topic in kafka_topics(kafka_bootstrap)

        # When Kiln is killed while it deletes the topic, restarted, and the operator asks
        # again
        first = send_then_kill(kiln, delete_topics_request(topic), 4, DeleteTopicsResponse,
                               delay)
        kiln.start()
        seen = observe(redis_client, kafka_bootstrap, topic)
        retried = delete_topic(kiln.bootstrap, topic)
        points[seen.kill_point] += 1
        report.append(f"#{i} kill +{delay * 1000:.0f} ms: {seen.kill_point} (first answer "
                      f"{first}, {seen.leftovers} leftovers before the retry); retry answered "
                      f"{retried}")

        # Then the retry succeeds (or finds nothing left to delete), and nothing of the topic
        # is left in Kiln's Metadata, Kafka, Redis or the group's offsets
        assert retried == ErrorCode.NONE or (
            retried == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION and seen.note == "finished"), \
            report[-1]
        assert topic not in kiln_topics(kiln.bootstrap), report[-1]
        assert topic not in kafka_topics(kafka_bootstrap), report[-1]
        left = leftovers(redis_client, topic)
        assert left == [], f"{len(left)} keys/fields of the deleted topic left: {left}; " \
            + report[-1]
        assert committed_offsets(kiln.bootstrap, group) == {}, report[-1]

        # ... and the name created anew starts empty at offset 0 and carries new records
        create_topic(kiln.bootstrap, topic)
        for partition in range(PARTITIONS):
            produce(kiln.bootstrap, topic, partition, values("new", range(2)))
        read = [(r.offset, r.value) for p in range(PARTITIONS)
                for r in consume_kafka_python(kiln.bootstrap, topic, p, BEGINNING, 2)]
        old = [value for _, value in read if value is not None and value.startswith(b"old")]
        assert old == [], f"{len(old)} records of the deleted topic served: {report[-1]}"
        assert read == [(o, v) for _ in range(PARTITIONS)
                        for o, v in enumerate(values("new", range(2)))], report[-1]
    print("DeleteTopics kills:", *report, sep="\n  ")
    print("kill points:", dict(points))

    # Then, once everything buffered is hardened, Kafka holds only the new records
    kiln_cli(redis_url, "flush", timeout_s=90)
    for topic in topics:
        hardened = read_hardened(kafka_bootstrap, topic, PARTITIONS)
        got = [(r.kiln_offset, r.value) for p in range(PARTITIONS) for r in hardened[p]]
        assert got == [(o, v) for _ in range(PARTITIONS)
                       for o, v in enumerate(values("new", range(2)))], topic




RECORDS = 20
HARDENED_FIRST = 10  # offsets 0..9 hardened, 10..19 buffered
BATCH = 4  # records per produced batch, so most deletion offsets fall inside a batch


def test_delete_records_killed_at_random_moments_is_completed_by_a_retry(
        kiln: KilnProcess, redis_url: str, kafka_bootstrap: str, rng: random.Random) -> None:
    report: list[str] = []
    deleted_below: dict[str, int] = {}
    for i, delay in enumerate(kill_delays(rng, DELETE_RECORDS_KILLS, RECORDS_KILL_WINDOW_S)):
        # Given a partition with records 0..9 hardened and 10..19 buffered, in batches of 4
        topic = f"trimmed-{i}-{uuid.uuid4().hex[:8]}"
        create_topic(kiln.bootstrap, topic, 1)
        sent = values(topic, range(RECORDS))
        for first in range(0, HARDENED_FIRST, BATCH):
            produce(kiln.bootstrap, topic, 0, sent[first:min(first + BATCH, HARDENED_FIRST)])
        kiln_cli(redis_url, "flush", topic)
        for first in range(HARDENED_FIRST, RECORDS, BATCH):
            produce(kiln.bootstrap, topic, 0, sent[first:first + BATCH])
        upto = rng.randrange(1, RECORDS)
        deleted_below[topic] = upto

        # When Kiln is killed while it deletes the records below `upto`, restarted, and the
        # operator asks again
        first_answer = send_then_kill(kiln, delete_records_request(topic, upto), 2,
                                      DeleteRecordsResponse, delay)
        kiln.start()
        start_before_retry = earliest(kiln.bootstrap, topic)
        code, low_watermark = delete_records(kiln.bootstrap, topic, upto)
        report.append(f"#{i} delete below {upto}, kill +{delay * 1000:.0f} ms: first answer "
                      f"{first_answer}, log start {start_before_retry} after the restart; "
                      f"retry answered {code} low watermark {low_watermark}")

        # Then the log start is `upto`, and a consumer from the earliest offset reads
        # exactly the records upto..19, each once
        assert (code, low_watermark) == (ErrorCode.NONE, upto), report[-1]
        assert earliest(kiln.bootstrap, topic) == upto, report[-1]
        read = consume_kafka_python(kiln.bootstrap, topic, 0, BEGINNING, RECORDS - upto)
        below = [r.offset for r in read if r.offset < upto]
        assert below == [], f"{len(below)} deleted records served: {report[-1]}"
        assert [(r.offset, r.value) for r in read] == list(enumerate(sent))[upto:], report[-1]
    print("DeleteRecords kills:", *report, sep="\n  ")

    # Then, once everything buffered is hardened, Kafka and Kiln's reads through it hold
    # exactly the records at and after each deletion offset, each once
    kiln_cli(redis_url, "flush", timeout_s=90)
    for topic, upto in deleted_below.items():
        sent = values(topic, range(RECORDS))
        hardened = [(r.kiln_offset, r.value) for r in read_hardened(kafka_bootstrap, topic, 1)[0]]
        counts = Counter(offset for offset, _ in hardened)
        assert [o for o, n in counts.items() if n > 1] == [], f"{topic}: hardened twice"
        assert [o for o in counts if o < upto] == [], f"{topic}: deleted records in Kafka"
        assert hardened == list(enumerate(sent))[upto:], topic
        read = consume_kafka_python(kiln.bootstrap, topic, 0, BEGINNING, RECORDS - upto)
        assert [(r.offset, r.value) for r in read] == list(enumerate(sent))[upto:], topic


def test_delete_topics_while_kiln_is_paused_answers_within_the_timeout(
        kiln: KilnProcess, redis_url: str, redis_client: redis.Redis, kafka_bootstrap: str,
        rng: random.Random) -> None:
    report: list[str] = []
    for i in range(PAUSES):
        # Given a topic with records hardened and buffered, and a group's committed offsets
        topic = f"paused-{i}-{uuid.uuid4().hex[:8]}"
        group = f"group-{i}-{uuid.uuid4().hex[:8]}"
        create_topic(kiln.bootstrap, topic)
        produce(kiln.bootstrap, topic, 0, values("old", range(3)))
        kiln_cli(redis_url, "flush", topic)
        produce(kiln.bootstrap, topic, 1, values("old", range(2)))
        commit_offsets(kiln.bootstrap, group, topic, {0: 1, 1: 1})

        # When Kiln is stopped (SIGSTOP) for up to 2 s while it deletes the topic
        delay, pause = rng.uniform(0, TOPIC_KILL_WINDOW_S / 3), rng.uniform(0.5, 2.0)
        with RawClient(kiln.bootstrap, timeout_s=30) as client:  # the client's request timeout
            correlation_id = client.send(delete_topics_request(topic), 4)
            time.sleep(delay)
            kiln.pause()
            try:
                time.sleep(pause)
            finally:
                kiln.resume()
            asked = time.monotonic()
            answer = client.receive(correlation_id, 4, DeleteTopicsResponse)
            waited = time.monotonic() - asked
        code = int(answer.responses[0].error_code)
        report.append(f"#{i} paused +{delay * 1000:.0f} ms for {pause:.1f} s: answered "
                      f"{code} {waited:.2f} s after SIGCONT")

        # Then the client is answered (no hang), the deletion succeeds, and nothing of the
        # topic is left
        assert code == ErrorCode.NONE, report[-1]
        assert topic not in kiln_topics(kiln.bootstrap), report[-1]
        assert topic not in kafka_topics(kafka_bootstrap), report[-1]
        assert leftovers(redis_client, topic) == [], report[-1]
        assert committed_offsets(kiln.bootstrap, group) == {}, report[-1]
    print("DeleteTopics pauses:", *report, sep="\n  ")
