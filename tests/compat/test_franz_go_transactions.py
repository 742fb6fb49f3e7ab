"""franz-go's transactions through Kiln (tests/compat/franz_go/txn.go, driven as
test_franz_go.py drives the program).

- A kgo client with a transactional id commits, aborts and commits transactions over two
  partitions: franz-go's and librdkafka's read_committed readers see exactly the committed
  records, in order, at the offsets franz-go was told; read_uncommitted readers see the
  aborted ones too while they are in Redis (topics capped at reliable_persistent).
- Consume-transform-produce with franz-go's GroupTransactSession (read_committed, stable
  offsets, the input offsets committed in the transaction): every input record is in the
  output exactly once and the group's offsets are the input's ends, also when the program
  is killed with a transaction open and run again.
- Fencing: a second client with the same transactional id fences the first, whose next
  produce or commit fails with the error Kafka itself gives franz-go, and whose records
  are never read as committed.
- At the topic's default level (assured_persistent for acks=all producers), committed
  transactions reach Kafka whole with their Kiln offsets, aborted ones never.

One Kiln (transactions on, a delay that never expires during a test) serves the module;
every test uses topics, groups and transactional ids of its own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from tests.compat.clients import ProducerCase, Record
from tests.compat.conftest import answering_all
from tests.compat.java import committed_offsets
from tests.compat.test_franz_go import (  # noqa: F401 (franz_go_binary: a fixture)
    BINARY,
    FranzGoRun,
    admin_results,
    franz_go,
    franz_go_binary,
    new_group,
    produce,
    unb64,
)
from tests.compat.test_transactional_clients import create_topic
from tests.kiln_harness import RunningKiln, fresh_kiln
from tests.txn_readers import read_messages
from wire.lineage import lineage_offset

# Kiln's delay never expires during a test: reads through Kiln are served from Redis, and
# what reaches Kafka is what an assured commit hardened.
HARDEN_DELAY_MS = 30 * 60 * 1000
PARTITIONS = 2
# (commit?, name) of the transactions of the reading tests, 3 records to each partition.
PLAN = ((True, "a"), (False, "b"), (True, "c"))
PER_PARTITION = 3

# Kafka's error codes, as franz-go reports them (-1: an error of franz-go's own).
INVALID_PRODUCER_EPOCH = 47
OPERATION_NOT_ATTEMPTED = 55
PRODUCER_FENCED = 90
API_ADD_PARTITIONS_TO_TXN = 24
# The fenced client's steps through Kiln (txn.go's txnFence). A fenced commit is
# PRODUCER_FENCED. A fenced produce is INVALID_PRODUCER_EPOCH; franz-go then does not attempt
# the commit, takes the abort as its KIP-588 recovery (sending nothing) and initialises again
# with its old epoch when it begins: PRODUCER_FENCED, as Kafka's coordinator answers an
# InitProducerId naming an epoch older than the current one (transactions V1). The last two
# steps are franz-go's recovery, compared with Kafka's only when Kafka serves V1 too.
OK = 0
FENCED_STEPS = {
    "end": {"zombie_produced": OK, "successor_produced": OK, "successor_committed": OK,
            "zombie_commit": PRODUCER_FENCED, "zombie_abort": OK,
            "zombie_begin": PRODUCER_FENCED},
    "produce": {"zombie_produced": OK, "successor_produced": OK, "successor_committed": OK,
                "zombie_produce": INVALID_PRODUCER_EPOCH, "zombie_commit": OPERATION_NOT_ATTEMPTED,
                "zombie_abort": OK, "zombie_begin": PRODUCER_FENCED},
}

pytestmark = pytest.mark.usefixtures("franz_go_binary")


@pytest.fixture(scope="module")
def txn_kiln(redis_url: str, kafka_bootstrap: str) -> Iterator[RunningKiln]:
    """Groups that form at once and let a killed member go after 6 s (franz-go's session
    timeout here)."""
    with fresh_kiln(redis_url, kafka_bootstrap, harden_delay_ms=HARDEN_DELAY_MS,
                    transactions_enabled=True, group_initial_rebalance_delay_ms=0,
                    group_min_session_timeout_ms=1000) as running:
        yield running


@pytest.fixture(autouse=True)
def no_connection_closed_by_kiln(txn_kiln: RunningKiln,
                                 caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """As test_franz_go.py's: Kiln closed no connection for a request it could not take
    and logged no complaint (WARNING or worse) about any."""
    with answering_all(txn_kiln, caplog, warnings_fail=True):
        yield


# --- helpers ----------------------------------------------------------------------------------


def plan_arg(plan: Sequence[tuple[bool, str]], per_partition: int) -> str:
    return ",".join(f"{'commit' if commit else 'abort'}:{name}:{per_partition}"
                    for commit, name in plan)


def values_of(plan: Sequence[tuple[bool, str]], partition: int, *, committed_only: bool,
              per_partition: int = PER_PARTITION) -> list[str]:
    """txn-produce's values in `partition`, in the order it sent them."""
    return [f"{name}.{partition}.{i}" for commit, name in plan
            if commit or not committed_only for i in range(per_partition)]


def txn_produce(bootstrap: str, topic: str, plan: Sequence[tuple[bool, str]], *extra: str,
                per_partition: int = PER_PARTITION) -> FranzGoRun:
    """The plan's transactions, every record acknowledged and every transaction ended as
    planned."""
    run = franz_go("txn-produce", "--brokers", bootstrap, "--topic", topic,
                   "--txn-id", f"fg-{topic}", "--partitions", "0,1",
                   "--plan", plan_arg(plan, per_partition), *extra, timeout_s=300)
    assert [(e["transaction"], e["commit"], e["error_code"]) for e in run.of("ended")] == [
        (name, commit, 0) for commit, name in plan], run
    assert [d["error_code"] for d in run.of("delivered")] == \
        [0] * len(plan) * per_partition * PARTITIONS, run
    return run


def delivered_offsets(run: FranzGoRun) -> dict[str, tuple[int, int]]:
    """value -> (partition, offset) that franz-go was told."""
    return {d["value"]: (d["partition"], d["offset"]) for d in run.of("delivered")}


def read_franz_go(bootstrap: str, topic: str, isolation: str, records: int
                  ) -> dict[int, list[tuple[int, str]]]:
    """(offset, value) by partition, in the order franz-go read them, until `records` came."""
    run = franz_go("consume", "--brokers", bootstrap, "--topic", topic,
                   "--partitions", "0,1", "--from", "start", "--isolation", isolation,
                   "--records", str(records), "--timeout-ms", "30000", timeout_s=60)
    read: dict[int, list[tuple[int, str]]] = {p: [] for p in range(PARTITIONS)}
    for r in run.of("record"):
        value = unb64(r["value"])
        assert value is not None
        read[r["partition"]].append((r["offset"], value.decode()))
    return read


def read_librdkafka(bootstrap: str, topic: str, isolation: str
                    ) -> dict[int, list[tuple[int, str]]]:
    """(offset, value) by partition, in the order librdkafka read them, to each end."""
    read = read_messages(bootstrap, topic, PARTITIONS, isolation, timeout_s=30)
    return {p: [(m.offset(), m.value().decode()) for m in messages]
            for p, messages in read.items()}


# --- committed, aborted, read in both isolation levels ----------------------------------------


def test_committed_transactions_are_read_whole_and_aborted_ones_only_uncommitted(
        txn_kiln: RunningKiln, unique_topic: str) -> None:
    # Given a kgo client with a transactional id that committed, aborted and committed
    # transactions of 3 records to each of 2 partitions (kept in Redis)
    topic = create_topic(txn_kiln, unique_topic, PARTITIONS, in_redis=True)
    sent = delivered_offsets(txn_produce(txn_kiln.bootstrap, topic, PLAN))
    committed_n = PARTITIONS * PER_PARTITION * 2
    everything_n = PARTITIONS * PER_PARTITION * 3

    # When franz-go and librdkafka read the partitions, read_committed and read_uncommitted
    read = {("franz-go", "committed"): read_franz_go(txn_kiln.bootstrap, topic, "committed",
                                                     committed_n),
            ("franz-go", "uncommitted"): read_franz_go(txn_kiln.bootstrap, topic,
                                                       "uncommitted", everything_n),
            ("librdkafka", "committed"): read_librdkafka(txn_kiln.bootstrap, topic,
                                                         "read_committed"),
            ("librdkafka", "uncommitted"): read_librdkafka(txn_kiln.bootstrap, topic,
                                                           "read_uncommitted")}

    # Then read_committed readers read exactly the committed records, read_uncommitted
    # ones every record, each partition in the order sent, at the offsets franz-go was told
    for (client, isolation), by_partition in read.items():
        for p in range(PARTITIONS):
            want = values_of(PLAN, p, committed_only=isolation == "committed")
            assert by_partition[p] == [(sent[v][1], v) for v in want], (client, isolation, p)
    assert all(sent[v][0] == p for p in range(PARTITIONS)
               for v in values_of(PLAN, p, committed_only=False))


# --- consume-transform-produce, exactly once --------------------------------------------------


N_INPUTS = 60


def etl_topics(kiln: RunningKiln, unique_topic: str) -> tuple[str, str, dict[int, list[str]]]:
    """An input topic holding N_INPUTS plain records, half in each partition (franz-go
    produced them, not transactionally: the input's offsets are 0..29), and an empty
    output topic; both kept in Redis. Returns them and the input values by partition."""
    source = create_topic(kiln, f"{unique_topic}-in", PARTITIONS, in_redis=True)
    sink = create_topic(kiln, f"{unique_topic}-out", PARTITIONS, in_redis=True)
    values = {p: [f"in.{p}.{i}" for i in range(N_INPUTS // PARTITIONS)]
              for p in range(PARTITIONS)}
    for p, texts in values.items():
        records = [Record(None, v.encode(), (), 1_700_000_000_000 + i)
                   for i, v in enumerate(texts)]
        delivered = produce(kiln.bootstrap, source, records,
                            ProducerCase("none", "all", True), p)
        assert [d.offset for d in delivered] == list(range(len(texts)))
    return source, sink, values


def etl_args(kiln: RunningKiln, source: str, sink: str, group: str, *extra: str
             ) -> list[str]:
    ends = ",".join(f"{p}:{N_INPUTS // PARTITIONS}" for p in range(PARTITIONS))
    return ["txn-etl", "--brokers", kiln.bootstrap, "--group", group, "--input", source,
            "--output", sink, "--txn-id", f"etl-{source}", "--ends", ends, *extra]


def output_of(kiln: RunningKiln, sink: str, isolation: str
              ) -> dict[int, list[tuple[str, str]]]:
    """(value, "src" header) of the output records by partition, as librdkafka reads them."""
    read = read_messages(kiln.bootstrap, sink, PARTITIONS, isolation, timeout_s=30)
    return {p: [(m.value().decode(), dict(m.headers() or [])["src"].decode())
                for m in messages] for p, messages in read.items()}


def transformed(values: dict[int, list[str]]) -> dict[int, list[tuple[str, str]]]:
    """What the output must hold: each input record once, in its partition, in order."""
    return {p: [(f"out:{v}", f"{p}/{i}") for i, v in enumerate(texts)]
            for p, texts in values.items()}


def test_group_transact_session_outputs_every_input_record_once(
        txn_kiln: RunningKiln, unique_topic: str) -> None:
    # Given 60 input records in 2 partitions
    source, sink, values = etl_topics(txn_kiln, unique_topic)
    group = new_group()

    # When a GroupTransactSession transforms them into the output, at most 7 a transaction
    run = franz_go(*etl_args(txn_kiln, source, sink, group, "--max-poll", "7"),
                   timeout_s=150)

    # Then every transaction committed, the group's offsets are the input's ends (60 in
    # all), and the output holds each input record once, in order, read_committed
    ended = run.of("ended")
    assert [(e["committed"], e["error_code"]) for e in ended] == [(True, 0)] * len(ended), run
    assert sum(e["records"] for e in ended) == N_INPUTS, run
    offsets = committed_offsets(txn_kiln.bootstrap, group)
    assert offsets == {(source, p): N_INPUTS // PARTITIONS for p in range(PARTITIONS)}
    assert sum(offsets.values()) == N_INPUTS
    assert output_of(txn_kiln, sink, "read_committed") == transformed(values)


def test_group_transact_session_killed_mid_transaction_and_rerun_outputs_each_once(
        txn_kiln: RunningKiln, unique_topic: str) -> None:
    # Given 60 input records in 2 partitions, and a GroupTransactSession killed (SIGKILL)
    # while its third transaction is open: its records produced, not yet committed
    source, sink, values = etl_topics(txn_kiln, unique_topic)
    group = new_group()
    killed = run_until_killed(etl_args(txn_kiln, source, sink, group, "--max-poll", "5",
                                       "--pause-ms", "500"), produced=3)
    open_inputs = {tuple(i) for i in killed[-1]["inputs"]}
    assert killed[-1]["event"] == "produced" and open_inputs, killed
    before = [e for e in killed if e["event"] == "ended"]
    assert [e["committed"] for e in before] == [True, True], killed
    committed_before = {tuple(i) for e in killed[:-1] if e["event"] == "produced"
                        for i in e["inputs"]}

    # When the program runs again, with the same group and transactional id
    rerun = franz_go(*etl_args(txn_kiln, source, sink, group, "--max-poll", "7"),
                     timeout_s=150)

    # Then it carried on from the committed offsets (the open transaction's inputs again,
    # none committed before), the group's offsets are the input's ends, and read_committed
    # the output holds each input record once, in order ...
    ended = rerun.of("ended")
    assert [e["error_code"] for e in ended] == [0] * len(ended), rerun
    again = {tuple(i) for e in rerun.of("produced") for i in e["inputs"]}
    assert open_inputs <= again and not committed_before & again, (killed, rerun)
    assert committed_offsets(txn_kiln.bootstrap, group) == {
        (source, p): N_INPUTS // PARTITIONS for p in range(PARTITIONS)}
    assert output_of(txn_kiln, sink, "read_committed") == transformed(values)
    # ... while read_uncommitted shows the killed transaction's records too (aborted when
    # the rerun initialised), and those of any transaction the rerun aborted itself
    aborted = len(open_inputs) + sum(e["records"] for e in ended if not e["committed"])
    uncommitted = output_of(txn_kiln, sink, "read_uncommitted")
    assert sum(len(r) for r in uncommitted.values()) == N_INPUTS + aborted


def run_until_killed(args: Sequence[str], *, produced: int, timeout_s: float = 120
                     ) -> list[dict[str, Any]]:
    """Run the program until its `produced`-th "produced" event, then SIGKILL it: its
    events up to then."""
    # stderr to a file: a pipe nobody reads could fill (FRANZ_GO_DEBUG) and stall the program.
    with tempfile.TemporaryFile("w+") as stderr_file:
        process = subprocess.Popen([str(BINARY), *args], stdout=subprocess.PIPE,
                                   stderr=stderr_file, text=True)
        # A program that never gets there fails the test instead of hanging it.
        watchdog = threading.Timer(timeout_s, process.kill)
        watchdog.start()
        events: list[dict[str, Any]] = []
        try:
            assert process.stdout is not None
            for line in process.stdout:
                events.append(json.loads(line))
                if sum(e["event"] == "produced" for e in events) == produced:
                    os.kill(process.pid, signal.SIGKILL)
                    break
        finally:
            watchdog.cancel()
            process.kill()
            process.communicate(timeout=30)
        stderr_file.seek(0)
        stderr = stderr_file.read()
    assert process.returncode == -signal.SIGKILL, (events, stderr[-3000:])
    assert sum(e["event"] == "produced" for e in events) == produced, (events, stderr[-3000:])
    return events


# --- fencing ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Fencing:
    steps: dict[str, tuple[int, str | None]]  # step -> (error code, error text)
    transactions_v2: bool  # franz-go ran KIP-890's (no AddPartitionsToTxn)

    @property
    def codes(self) -> dict[str, int]:
        return {name: code for name, (code, _) in self.steps.items()}


def fence(bootstrap: str, topic: str, fenced_at: str) -> Fencing:
    run = franz_go("txn-fence", "--brokers", bootstrap, "--topic", topic,
                   "--txn-id", f"fence-{topic}", "--fenced-at", fenced_at, timeout_s=120)
    return Fencing({s["step"]: (s["error_code"], s["error"]) for s in run.of("step")},
                   API_ADD_PARTITIONS_TO_TXN not in run.requests_by_api)


@pytest.mark.parametrize("fenced_at", ["end", "produce"])
def test_a_second_client_with_the_transactional_id_fences_the_first(
        txn_kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str,
        fenced_at: str) -> None:
    # Given a transaction open in one franz-go client, and a second client with the same
    # transactional id that initialised and committed a transaction of its own
    topic = create_topic(txn_kiln, unique_topic, PARTITIONS, in_redis=True)
    # When the first goes on (produces, or commits at once), then aborts and tries to begin
    # anew; and the same against Kafka itself, the control
    kiln = fence(txn_kiln.bootstrap, topic, fenced_at)
    admin_results(kafka_bootstrap, "create-topics", "--topic", f"{topic}-kafka",
                  "--partitions", str(PARTITIONS))
    kafka = fence(kafka_bootstrap, f"{topic}-kafka", fenced_at)

    # Then the first client is fenced, for good, as at Kafka: its first step after the
    # fencing fails as Kafka fails it (the steps after that are franz-go's recovery, which
    # differs with the transaction version: Kiln serves V1, Kafka 4 V2) ...
    assert kiln.codes == FENCED_STEPS[fenced_at], kiln.steps
    assert not kiln.transactions_v2
    shared = list(FENCED_STEPS[fenced_at])[:-2]
    assert [kiln.codes[s] for s in shared] == [kafka.codes[s] for s in shared], (kiln, kafka)
    if not kafka.transactions_v2:
        assert kiln.codes == kafka.codes, (kiln, kafka)

    # ... and only the second client's records are committed; the first's were aborted
    def values(isolation: str) -> dict[int, list[str]]:
        read = read_librdkafka(txn_kiln.bootstrap, topic, isolation)
        return {p: [v for _, v in records] for p, records in read.items()}

    assert values("read_committed") == {0: ["successor.0"], 1: ["successor.1"]}
    assert values("read_uncommitted") == {0: ["zombie.0", "successor.0"], 1: ["successor.1"]}


# --- assured: in Kafka when the commit is answered --------------------------------------------


def test_assured_transactions_are_hardened_whole_with_the_kiln_offsets_told(
        txn_kiln: RunningKiln, kafka_bootstrap: str, unique_topic: str) -> None:
    # Given a topic at its default levels (acks=all producers get assured_persistent)
    topic = create_topic(txn_kiln, unique_topic, PARTITIONS)

    # When franz-go commits, aborts and commits transactions over both partitions
    run = txn_produce(txn_kiln.bootstrap, topic, PLAN)

    # Then Kafka's read_committed readers read the committed transactions, whole, each
    # record with the Kiln offset franz-go was told, and nothing of the aborted one
    sent = delivered_offsets(run)
    committed_n = PARTITIONS * PER_PARTITION * 2
    read = read_messages(kafka_bootstrap, topic, PARTITIONS, "read_committed",
                         expected=committed_n, timeout_s=30)
    at_kafka = {p: [(lineage_offset(m.headers(), m.offset()), m.value().decode())
                    for m in messages] for p, messages in read.items()}
    assert at_kafka == {p: [(sent[v][1], v) for v in values_of(PLAN, p, committed_only=True)]
                        for p in range(PARTITIONS)}

