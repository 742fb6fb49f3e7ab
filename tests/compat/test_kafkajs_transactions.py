"""kafkajs 2.2.4's transactions through Kiln, driven by tests/compat/node/kafkajs_transactions.js
(one `node` process per run) from the packages scripts/clients/kafkajs.sh installs.

- `producer.transaction()` over two partitions, committed, aborted, committed: kafkajs's
  read_committed consumer (its default) and librdkafka's read exactly the committed records,
  in order, at the offsets kafkajs was told; read_uncommitted readers read the aborted ones
  too while they are in Redis.
- Consume-transform-produce with `sendOffsets`: the group's offsets commit with the output;
  an aborted transaction's output is never read committed and its offsets are not
  committed, so the next run transforms those records again, and the output ends up with
  every input record once, in order.
- Zombie fencing: once a second producer of the same transactional id has initialised, the
  first one's Produce, AddPartitionsToTxn, AddOffsetsToTxn and EndTxn are refused with
  INVALID_PRODUCER_EPOCH (kafkajs's transaction APIs are v0/v1, older than PRODUCER_FENCED),
  and its open transaction is aborted.
- At the topic's default level (assured: kafkajs sends transactions with acks=-1), a commit
  is answered once the transaction is in Kafka: read_committed readers of Kafka itself find
  it right after.

Kiln's delay is half an hour: nothing is hardened during a test unless a commit needs it.
Every test also checks that Kiln closed no connection and failed no request unexpectedly.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.compat.conftest import answering_all
from tests.compat.java import committed_offsets
from tests.compat.test_kafkajs import (  # noqa: F401 (kafkajs_installed: an autouse fixture)
    DriverRun,
    kafkajs_installed,
    run_kafkajs,
)
from tests.kiln_harness import RunningKiln, fresh_kiln
from tests.txn_readers import read_messages, read_to_end
from wire.lineage import lineage_offset

DRIVER = Path(__file__).resolve().parent / "node" / "kafkajs_transactions.js"
# Kiln's delay never expires during a test: reads are served from the log queue, and what
# reaches Kafka is what a commit at the assured level puts there.
HARDEN_DELAY_MS = 30 * 60 * 1000
PARTITIONS = 2
# Groups that form in a fraction of a second: each kafkajs run starts a member.
GROUP_SETTINGS = {"group_initial_rebalance_delay_ms": 0, "group_min_session_timeout_ms": 1000}
INVALID_PRODUCER_EPOCH = "INVALID_PRODUCER_EPOCH"

Pair = tuple[int, str]  # (Kiln offset, value)


@pytest.fixture(scope="module")
def txn_kiln(redis_url: str, kafka_bootstrap: str) -> Iterator[RunningKiln]:
    with fresh_kiln(redis_url, kafka_bootstrap, harden_delay_ms=HARDEN_DELAY_MS,
                    transactions_enabled=True, **GROUP_SETTINGS) as running:
        yield running


@pytest.fixture
def kiln(txn_kiln: RunningKiln, caplog: pytest.LogCaptureFixture) -> Iterator[RunningKiln]:
    """`txn_kiln`, checked when the test is over as tests/compat/conftest.py's
    kiln_answering_all checks its Kiln: no connection closed on a request Kiln could not
    take, no request failed unexpectedly (logged at ERROR)."""
    with answering_all(txn_kiln, caplog):
        yield txn_kiln


def create_topic(kiln: RunningKiln, topic: str, *, in_redis: bool) -> str:
    """With `in_redis`, producers get at most reliable_persistent: transactions stay in the
    log queue for the delay, aborted records with them."""
    config = {"kiln.max.reliability": "reliable_persistent"} if in_redis else {}
    admin = AdminClient({"bootstrap.servers": kiln.bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1, config=config)])[topic].result(30)
    return topic


# --- the driver ------------------------------------------------------------------------------


def run_driver(command: str, spec: Mapping[str, Any], timeout_s: float = 90) -> DriverRun:
    return run_kafkajs(command, spec, timeout_s, driver=DRIVER)


def run_script(kiln: RunningKiln, topic: str, producers: Mapping[str, str],
               steps: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every step's outcome, in order (the driver goes on after a failed step)."""
    run = run_driver("script", {"brokers": [kiln.bootstrap], "topic": topic,
                                "producers": producers, "steps": list(steps)})
    assert run.returncode == 0, run
    outcomes = run.of("step")
    assert [o["index"] for o in outcomes] == list(range(len(steps))), run
    return outcomes


def transaction(producer: str, name: str, size: int, end: str) -> list[dict[str, Any]]:
    """Steps of one transaction of `size` records named name.0, name.1, ... placed round
    robin over the partitions, ended with `end` (commit or abort)."""
    messages = [{"partition": i % PARTITIONS, "key": f"k{i}", "value": f"{name}.{i}"}
                for i in range(size)]
    return [{"producer": producer, "action": "begin"},
            {"producer": producer, "action": "send", "messages": messages},
            {"producer": producer, "action": end}]


def acked(outcomes: Sequence[Mapping[str, Any]], steps: Sequence[Mapping[str, Any]],
          transactions: Sequence[int]) -> dict[int, list[Pair]]:
    """Per partition, (offset kafkajs was told, value) of the records the sends of the
    given transactions (by their place among the script's `send` steps) carried."""
    sends = [(step, outcome) for step, outcome in zip(steps, outcomes, strict=True)
             if step["action"] == "send"]
    out: dict[int, list[Pair]] = {p: [] for p in range(PARTITIONS)}
    for n in transactions:
        step, outcome = sends[n]
        for message, ack in zip(step["messages"], outcome["acks"], strict=True):
            assert ack["partition"] == message["partition"], outcome
            out[ack["partition"]].append((ack["offset"], message["value"]))
    return out


def read_kafkajs(kiln: RunningKiln, topic: str, *, read_uncommitted: bool,
                 count: int) -> dict[int, list[Pair]]:
    """Per partition, (offset, value) of what a kafkajs consumer of a new group reads from
    the beginning, in the order it read them: until `count` records and a second more."""
    run = run_driver("read", {"brokers": [kiln.bootstrap], "topic": topic,
                              "groupId": f"g-{uuid.uuid4().hex[:8]}",
                              "readUncommitted": read_uncommitted, "count": count,
                              "graceMs": 1000, "timeoutMs": 40_000}, timeout_s=90)
    assert run.returncode == 0, run
    assert [e["reason"] for e in run.of("end")] == ["count"], run
    out: dict[int, list[Pair]] = {p: [] for p in range(PARTITIONS)}
    for record in run.of("record"):
        out[record["partition"]].append((record["offset"], record["value"]))
    return out


def read_librdkafka(kiln: RunningKiln, topic: str, isolation: str,
                    expected: int) -> dict[int, list[Pair]]:
    return read_to_end(kiln.bootstrap, topic, PARTITIONS, isolation, expected=expected,
                       timeout_s=30)


def values(read: Mapping[int, Sequence[Pair]]) -> dict[int, list[str]]:
    return {p: [v for _, v in pairs] for p, pairs in read.items()}


# --- transactions read back ------------------------------------------------------------------


def test_committed_transactions_are_read_whole_and_aborted_ones_only_uncommitted(
        kiln: RunningKiln, unique_topic: str) -> None:
    topic = create_topic(kiln, unique_topic, in_redis=True)
    # Given kafkajs committing, aborting and committing transactions of 4 records over both
    # partitions, kept in Redis
    steps = [*transaction("p", "a", 4, "commit"), *transaction("p", "b", 4, "abort"),
             *transaction("p", "c", 4, "commit")]
    outcomes = run_script(kiln, topic, {"p": f"kjs-{topic}"}, steps)
    assert [o for o in outcomes if not o["ok"]] == []
    committed = acked(outcomes, steps, [0, 2])
    everything = acked(outcomes, steps, [0, 1, 2])

    # When kafkajs and librdkafka read both partitions with either isolation level
    kafkajs_committed = read_kafkajs(kiln, topic, read_uncommitted=False, count=8)
    kafkajs_everything = read_kafkajs(kiln, topic, read_uncommitted=True, count=12)
    librdkafka_committed = read_librdkafka(kiln, topic, "read_committed", 8)
    librdkafka_everything = read_librdkafka(kiln, topic, "read_uncommitted", 12)

    # Then read_committed readers read a and c whole, in order, at the offsets kafkajs was
    # told, and never b; read_uncommitted ones read b between them
    assert values(committed) == {0: ["a.0", "a.2", "c.0", "c.2"],
                                 1: ["a.1", "a.3", "c.1", "c.3"]}
    assert kafkajs_committed == committed
    assert librdkafka_committed == committed
    assert values(everything) == {0: ["a.0", "a.2", "b.0", "b.2", "c.0", "c.2"],
                                  1: ["a.1", "a.3", "b.1", "b.3", "c.1", "c.3"]}
    assert kafkajs_everything == everything
    assert librdkafka_everything == everything


# --- consume-transform-produce ---------------------------------------------------------------


N_INPUT = 40
PER_TXN = 5


def produce_input(kiln: RunningKiln, topic: str, count: int) -> list[str]:
    """`count` records on partition 0, plain acks=1 (no transaction); their values."""
    producer = Producer({"bootstrap.servers": kiln.bootstrap, "acks": 1, "linger.ms": 5})
    sent = [f"in.{i:03d}" for i in range(count)]
    for value in sent:
        producer.produce(topic, value.encode(), partition=0)
    assert producer.flush(30) == 0
    return sent


def transform(kiln: RunningKiln, source: str, sink: str, group: str, *,
              abort_after: int | None) -> DriverRun:
    spec: dict[str, Any] = {"brokers": [kiln.bootstrap], "input": source, "output": sink,
                            "groupId": group, "transactionalId": f"kjs-{group}",
                            "perTxn": PER_TXN, "until": {"0": N_INPUT}, "timeoutMs": 60_000}
    if abort_after is not None:
        spec["abortAfter"] = abort_after
    run = run_driver("transform", spec, timeout_s=120)
    assert run.returncode == 0, run
    return run


def test_consume_transform_produce_commits_offsets_with_the_output_and_not_when_aborted(
        kiln: RunningKiln, unique_topic: str) -> None:
    # Given 40 records in an input topic, an output topic kept in Redis, and a kafkajs
    # transform that committed two transactions of up to 5 records (output and input
    # offsets), aborted the third and stopped
    source = create_topic(kiln, f"{unique_topic}-in", in_redis=True)
    sink = create_topic(kiln, f"{unique_topic}-out", in_redis=True)
    sent = produce_input(kiln, source, N_INPUT)
    group = f"g-{uuid.uuid4().hex[:8]}"
    first = transform(kiln, source, sink, group, abort_after=2)
    assert [e["reason"] for e in first.of("end")] == ["aborted"], first
    first_txns = first.of("txn")
    assert [t["end"] for t in first_txns] == ["commit", "commit", "abort"], first
    assert first_txns[0]["first"] == 0, first
    assert first_txns[1]["first"] == first_txns[0]["last"] + 1, first
    stopped_at = first_txns[1]["last"] + 1
    aborted = first_txns[2]
    assert aborted["first"] == stopped_at, first
    offsets_after_abort = committed_offsets(kiln.bootstrap, group)
    out_committed = read_librdkafka(kiln, sink, "read_committed", stopped_at)
    out_everything = read_librdkafka(kiln, sink, "read_uncommitted",
                                     aborted["last"] + 1)

    # When the transform runs again in the same group until the input's end
    second = transform(kiln, source, sink, group, abort_after=None)

    # Then the abort committed no offset (the group stood where the second commit left it)
    # and left its output unread by read_committed readers (read_uncommitted ones read it)
    assert offsets_after_abort == {(source, 0): stopped_at}
    assert values(out_committed)[0] == [v.upper() for v in sent[:stopped_at]]
    assert values(out_everything)[0] == [v.upper() for v in sent[:aborted["last"] + 1]]
    # ... so the second run began at the aborted transaction's first record, committed up
    # to the end, and the output holds every input record once, transformed, in order
    second_txns = second.of("txn")
    assert [e["reason"] for e in second.of("end")] == ["until"], second
    assert second_txns[0]["first"] == stopped_at, second
    assert {t["end"] for t in second_txns} == {"commit"}, second
    ranges = [(t["first"], t["last"]) for t in second_txns]
    assert ranges[-1][1] == N_INPUT - 1, second
    assert all(a[1] + 1 == b[0] for a, b in itertools.pairwise(ranges)), second
    assert committed_offsets(kiln.bootstrap, group) == {(source, 0): N_INPUT}
    output = read_kafkajs(kiln, sink, read_uncommitted=False, count=N_INPUT)
    assert values(output) == {0: [v.upper() for v in sent], 1: []}


# --- fencing ---------------------------------------------------------------------------------


def test_a_second_producer_of_the_same_id_fences_the_first(
        kiln: RunningKiln, unique_topic: str) -> None:
    topic = create_topic(kiln, unique_topic, in_redis=True)
    group = f"g-{uuid.uuid4().hex[:8]}"
    # Given kafkajs producer a with a transaction open on partition 0
    steps: list[dict[str, Any]] = [
        {"producer": "a", "action": "begin"},
        {"producer": "a", "action": "send", "messages": [{"partition": 0, "value": "a.0"}]},
        # When producer b of the same transactional id begins (InitProducerId), sends and
        # commits
        {"producer": "b", "action": "begin"},
        {"producer": "b", "action": "send", "messages": [{"partition": 0, "value": "b.0"},
                                                         {"partition": 1, "value": "b.1"}]},
        {"producer": "b", "action": "commit"},
        # ... and a goes on: a send to its partition (Produce), one to a new partition
        # (AddPartitionsToTxn), offsets (AddOffsetsToTxn), a commit (EndTxn)
        {"producer": "a", "action": "send", "messages": [{"partition": 0, "value": "a.1"}]},
        {"producer": "a", "action": "send", "messages": [{"partition": 1, "value": "a.2"}]},
        {"producer": "a", "action": "sendOffsets", "groupId": group, "offsets": {"0": 1}},
        {"producer": "a", "action": "commit"},
    ]
    tid = f"kjs-{topic}"
    outcomes = run_script(kiln, topic, {"a": tid, "b": tid}, steps)
    committed = read_librdkafka(kiln, topic, "read_committed", 2)
    everything = read_librdkafka(kiln, topic, "read_uncommitted", 3)

    # Then b's steps and a's first ones succeeded; each of a's later requests was refused
    # as a fenced epoch
    assert [o["ok"] for o in outcomes[:5]] == [True] * 5, outcomes
    assert [(o["action"], o["ok"], o["errorType"]) for o in outcomes[5:]] == [
        ("send", False, INVALID_PRODUCER_EPOCH), ("send", False, INVALID_PRODUCER_EPOCH),
        ("sendOffsets", False, INVALID_PRODUCER_EPOCH),
        ("commit", False, INVALID_PRODUCER_EPOCH)], outcomes
    # ... a's open transaction was aborted: only b's records are read committed, and a's
    # record sent before b began is read uncommitted
    assert values(committed) == {0: ["b.0"], 1: ["b.1"]}
    assert values(everything) == {0: ["a.0", "b.0"], 1: ["b.1"]}
    # ... and a's offsets were not committed for the group
    assert committed_offsets(kiln.bootstrap, group) == {}


# --- assured commits -------------------------------------------------------------------------


def test_an_assured_commit_is_answered_once_the_transaction_is_in_kafka(
        kiln: RunningKiln, unique_topic: str, kafka_bootstrap: str) -> None:
    # Given a topic at the default level (producers may ask for assured_persistent, which
    # kafkajs's acks=-1 does) and Kiln's delay of half an hour
    topic = create_topic(kiln, unique_topic, in_redis=False)
    steps = [*transaction("p", "a", 4, "commit"), *transaction("p", "b", 4, "abort"),
             *transaction("p", "c", 4, "commit")]

    # When kafkajs commits, aborts and commits transactions over both partitions
    outcomes = run_script(kiln, topic, {"p": f"kjs-{topic}"}, steps)

    # Then each was answered, and a read_committed reader of Kafka itself (Kafka writes its
    # markers just after answering the lane's commit) reads both committed transactions to
    # the partitions' ends, in Kiln's order, each record with the Kiln offset kafkajs was
    # told, and nothing of the aborted
    assert [o for o in outcomes if not o["ok"]] == []
    read = read_messages(kafka_bootstrap, topic, PARTITIONS, "read_committed", expected=8,
                         timeout_s=30)
    hardened = {p: [(lineage_offset(m.headers(), m.offset()), m.value().decode())
                    for m in messages] for p, messages in read.items()}
    committed = acked(outcomes, steps, [0, 2])
    assert values(committed) == {0: ["a.0", "a.2", "c.0", "c.2"],
                                 1: ["a.1", "a.3", "c.1", "c.3"]}
    assert hardened == committed
