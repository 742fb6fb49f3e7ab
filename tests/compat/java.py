"""Kafka's Java client and command-line tools, run from the jars scripts/setup.sh resolves
(`.jvm/kafka`, Apache Kafka 4.4), driven from Python tests without writing any Java.

- `run_tool` runs one of Kafka's tools (kafka-topics, the console producer, ...) to its end
  and returns its exit code and output; a tool that does not finish in time fails the test
  instead of hanging it.
- `run_verifiable_producer` runs Kafka's `VerifiableProducer`, the Java `KafkaProducer`
  printing one JSON event per acknowledged record (partition and offset).
- `VerifiableConsumerProcess` runs Kafka's `VerifiableConsumer`, a Java `KafkaConsumer` in a
  group (the classic protocol, or KIP-848's `consumer` protocol) printing one JSON event per
  record, assignment, revocation and commit, in the background while the test changes the
  group around it.

Each JVM launch costs a second or two, so tests launch as few as they can.
"""

from __future__ import annotations

import json
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from kafka.admin import KafkaAdminClient
from kafka.structs import OffsetAndMetadata, TopicPartition

from cli.local_kafka import kafka_command

TOPICS = "org.apache.kafka.tools.TopicCommand"
CONFIGS = "org.apache.kafka.tools.ConfigCommand"
CONSOLE_PRODUCER = "org.apache.kafka.tools.ConsoleProducer"
CONSOLE_CONSUMER = "org.apache.kafka.tools.consumer.ConsoleConsumer"
CONSUMER_GROUPS = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"
PRODUCER_PERF = "org.apache.kafka.tools.ProducerPerformance"
GET_OFFSETS = "org.apache.kafka.tools.GetOffsetShell"
VERIFIABLE_PRODUCER = "org.apache.kafka.tools.VerifiableProducer"
VERIFIABLE_CONSUMER = "org.apache.kafka.tools.VerifiableConsumer"
TRANSACTIONS = "org.apache.kafka.tools.TransactionsCommand"

# The tools run for a second or two: the JIT's first tier alone starts them in about half
# the time, and a serial collector spares the two cores the broker and Kiln share.
_JVM_OPTIONS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC", "-Djava.awt.headless=true")
_OUTPUT_TAIL = 3000


def java_command(main_class: str, *args: str) -> list[str]:
    command = kafka_command(main_class, *args)
    at = command.index("-cp")
    return [*command[:at], *_JVM_OPTIONS, *command[at:]]


def write_properties(path: Path, values: Mapping[str, str | int]) -> Path:
    """A Java properties file (the tools' --command-config)."""
    path.write_text("".join(f"{key}={value}\n" for key, value in values.items()))
    return path


@dataclass(frozen=True, slots=True)
class ToolRun:
    command: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def lines(self) -> list[str]:
        return [line for line in self.stdout.splitlines() if line.strip()]

    @property
    def output(self) -> str:
        """Everything the tool printed: its errors go to either stream, depending on the tool."""
        return self.stdout + self.stderr

    def __str__(self) -> str:
        # What an assertion message shows: enough to see why a tool failed.
        return (f"{' '.join(self.command[-12:])}\nexit code {self.returncode}\n"
                f"--- stdout ---\n{self.stdout[-_OUTPUT_TAIL:]}\n"
                f"--- stderr ---\n{self.stderr[-_OUTPUT_TAIL:]}")


def run_tool(main_class: str, *args: str, stdin: str | None = None,
             timeout_s: float = 60) -> ToolRun:
    command = java_command(main_class, *args)
    try:
        done = subprocess.run(command, input=stdin, capture_output=True, text=True,
                              timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as exc:
        # subprocess.run has killed the JVM it started; a tool that hangs is a failure.
        raise AssertionError(f"{main_class} {' '.join(args)} did not finish within "
                             f"{timeout_s} s; it printed:\n{_text(exc.stdout)}"
                             f"{_text(exc.stderr)}") from exc
    return ToolRun(tuple(command), done.returncode, done.stdout, done.stderr)


def _text(data: str | bytes | None) -> str:
    if data is None:
        return ""
    return (data.decode(errors="replace") if isinstance(data, bytes) else data)[-_OUTPUT_TAIL:]


def json_events(lines: Sequence[str]) -> list[dict[str, Any]]:
    """A tool's output lines, each a JSON event (the Verifiable* tools print nothing else on
    stdout: a line that is not JSON fails the test rather than pass unnoticed)."""
    events = []
    for line in lines:
        parsed = json.loads(line)
        assert isinstance(parsed, dict), line
        events.append(parsed)
    return events


def table(run: ToolRun, first_column: str = "GROUP") -> list[dict[str, str]]:
    """The rows of the table a tool printed (kafka-consumer-groups), keyed by the columns of
    its header line, the line starting with `first_column`. Cells hold no spaces ("-" when
    empty), so whitespace splits them."""
    lines = run.lines
    starts = [i for i, line in enumerate(lines) if line.split()[0] == first_column]
    assert len(starts) == 1, run
    columns = lines[starts[0]].split()
    rows = [line.split() for line in lines[starts[0] + 1:]]
    assert all(len(row) == len(columns) for row in rows), run
    return [dict(zip(columns, row, strict=True)) for row in rows]


# --- VerifiableProducer --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Acked:
    """One record as the Java producer's callback reported it."""

    key: str
    value: str
    partition: int
    offset: int


@dataclass(frozen=True, slots=True)
class ProducerRun:
    run: ToolRun
    acked: list[Acked]  # in the order the callbacks ran
    errors: list[dict[str, Any]]  # producer_send_error events
    sent: int  # the tool's own count at the end
    acked_count: int


def run_verifiable_producer(bootstrap: str, topic: str, records: int,
                            config: Mapping[str, str | int], workdir: Path,
                            repeating_keys: int = 7) -> ProducerRun:
    """`records` records (key `i % repeating_keys`, value `i`) sent as fast as the producer
    can, with acks=all and `config` on top of the tool's defaults."""
    properties = write_properties(workdir / f"producer-{topic}.properties", config)
    run = run_tool(VERIFIABLE_PRODUCER, "--bootstrap-server", bootstrap, "--topic", topic,
                   "--max-messages", str(records), "--acks", "-1",
                   "--repeating-keys", str(repeating_keys),
                   "--command-config", str(properties), timeout_s=120)
    assert run.returncode == 0, run
    events = json_events(run.lines)
    summary = [e for e in events if e["name"] == "tool_data"]
    assert len(summary) == 1, run
    acked = [Acked(e["key"], e["value"], e["partition"], e["offset"])
             for e in events if e["name"] == "producer_send_success"]
    errors = [e for e in events if e["name"] == "producer_send_error"]
    return ProducerRun(run, acked, errors, summary[0]["sent"], summary[0]["acked"])


# --- VerifiableConsumer --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Assigned:
    timestamp_ms: int
    partitions: frozenset[int]


@dataclass(frozen=True, slots=True)
class Revoked:
    timestamp_ms: int
    partitions: frozenset[int]


@dataclass(frozen=True, slots=True)
class RecordRead:
    timestamp_ms: int
    partition: int
    offset: int
    key: str | None
    value: str | None


@dataclass(frozen=True, slots=True)
class Committed:
    timestamp_ms: int  # taken after commitSync returned
    offsets: Mapping[int, int]
    success: bool
    error: str | None


ConsumerEvent = Assigned | Revoked | RecordRead | Committed


def _consumer_event(event: Mapping[str, Any]) -> ConsumerEvent | None:
    name, ts = event["name"], event["timestamp"]
    if name == "partitions_assigned":
        return Assigned(ts, frozenset(p["partition"] for p in event["partitions"]))
    if name == "partitions_revoked":
        return Revoked(ts, frozenset(p["partition"] for p in event["partitions"]))
    if name == "record_data":
        return RecordRead(ts, event["partition"], event["offset"], event["key"],
                          event["value"])
    if name == "offsets_committed":
        return Committed(ts, {o["partition"]: o["offset"] for o in event["offsets"]},
                         event["success"], event.get("error"))
    return None  # startup, shutdown, records_consumed summaries


class VerifiableConsumerProcess:
    """A `VerifiableConsumer` (commitSync after every poll, --verbose) of one topic in one
    group, running in the background; a thread collects its events as it prints them."""

    def __init__(self, bootstrap: str, topic: str, group: str,
                 config: Mapping[str, str | int], workdir: Path, name: str,
                 group_protocol: str = "classic") -> None:
        self.name = name
        properties = write_properties(workdir / f"consumer-{name}.properties",
                                      {"client.id": name, **config})
        # The KIP-848 protocol has no client session timeout: the coordinator sets it.
        session = (("--session-timeout", "6000") if group_protocol == "classic" else ())
        self._stderr: IO[str] = tempfile.TemporaryFile("w+")  # noqa: SIM115 (closed in stop)
        self._process = subprocess.Popen(
            java_command(VERIFIABLE_CONSUMER, "--bootstrap-server", bootstrap,
                         "--topic", topic, "--group-id", group, "--verbose", *session,
                         "--group-protocol", group_protocol, "--reset-policy", "earliest",
                         "--command-config", str(properties)),
            stdout=subprocess.PIPE, stderr=self._stderr, text=True)
        self._events: list[ConsumerEvent] = []
        self._not_json: list[str] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, name=f"events-{name}", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            try:
                parsed = json.loads(line)
            except ValueError:
                self._not_json.append(line)  # shown when the test fails
                continue
            event = _consumer_event(parsed)
            if event is not None:
                with self._lock:
                    self._events.append(event)

    @property
    def events(self) -> list[ConsumerEvent]:
        with self._lock:
            return list(self._events)

    def assignments(self) -> list[Assigned]:
        return [e for e in self.events if isinstance(e, Assigned)]

    def records(self) -> list[RecordRead]:
        return [e for e in self.events if isinstance(e, RecordRead)]

    def wait_for(self, what: str, check: Callable[[], bool], timeout_s: float = 30) -> None:
        deadline = time.monotonic() + timeout_s
        while not check():
            if self._process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"{self.name}: {what} not seen within {timeout_s} s "
                                     f"(exit code {self._process.poll()})\n{self.stderr()}")
            time.sleep(0.05)

    def stderr(self) -> str:
        """Its stderr, and any stdout line that was not an event."""
        self._stderr.seek(0)
        return "".join(self._not_json) + self._stderr.read()[-_OUTPUT_TAIL:]

    def stop(self, timeout_s: float = 30) -> int:
        """SIGTERM, as an operator stops it: Kafka's shutdown hook closes the consumer, which
        leaves the group. Killed if it does not exit in time."""
        if self._process.poll() is None:
            self._process.send_signal(signal.SIGTERM)
        try:
            code = self._process.wait(timeout_s)
        except subprocess.TimeoutExpired as exc:
            self._process.kill()
            self._process.wait(10)
            raise AssertionError(f"{self.name} did not exit on SIGTERM\n{self.stderr()}") from exc
        finally:
            self._reader.join(10)
        return code

    def close(self) -> None:
        """Kill it if it still runs (cleanup after a failed test)."""
        if self._process.poll() is None:
            self._process.kill()
            self._process.wait(10)
        self._reader.join(10)
        self._stderr.close()


# --- what Kiln holds, asked with a Python client -------------------------------------------


def committed_offsets(bootstrap: str, group: str) -> dict[tuple[str, int], int]:
    """The group's committed offsets by (topic, partition) (OffsetFetch)."""
    with KafkaAdminClient(bootstrap_servers=bootstrap) as admin:
        found = admin.list_group_offsets(group)[group]
    return {(tp.topic, tp.partition): meta.offset for tp, meta in found.items()}


def commit_offsets(bootstrap: str, group: str, topic: str, offsets: Mapping[int, int]) -> None:
    """Commit offsets for a group without members (OffsetCommit, as a tool resetting offsets
    does)."""
    with KafkaAdminClient(bootstrap_servers=bootstrap) as admin:
        results = admin.alter_group_offsets(group, {
            TopicPartition(topic, p): OffsetAndMetadata(o, "", -1) for p, o in offsets.items()})
    assert {error.errno for error in results.values()} == {0}, results

