"""A randomized fault checker: producers and a consumer group work through Kiln while faults
are injected at random, then the whole history is checked.

Services: its own Redis with `appendfsync always` (so that every acknowledged record of
every level must survive a Redis restart); Apache Kafka, which Kiln reaches through a relay
(cut to take Kafka away without losing its data): the test session's broker, or one of its
own; and `kiln serve` as a child process that clients reach through another relay (cut to
drop every client connection at once).

Workload, on three topics:
- `assured`: two idempotent `acks=all` producers (assured_persistent) on one partition,
  read through Kiln by two consumer groups (both durable subscriptions: a record is
  delivered, and may be dropped unwritten, only once both committed past it);
- `reliable`: an `acks=1` producer without retries (reliable_persistent);
- `held`: an `acks=1` producer without retries at reliable_nonpersistent (the topic's
  level), read by a third group that an operator registered as a durable subscription
  before anything was sent: its records are kept in Redis until that group read them, and
  never written to Kafka.

Faults, drawn by a seeded generator: Kiln killed (SIGKILL) and restarted, Kiln paused
(SIGSTOP) and resumed, Redis killed and restarted, Kafka cut off, client connections cut.

Checked afterwards (Kiln drained with SIGTERM, topics read straight from the broker):
- every acknowledged persistent record is in its hardened topic (or was delivered to every
  group reading its topic, which makes hardening it unnecessary), once, in send order
  (per producer), at strictly increasing Kiln offsets, and at the offset its producer was
  told;
- every acknowledged reliable_nonpersistent record was read by its group, and none reached
  Kafka;
- no group is ever handed a record below an offset it committed, and each reads every
  acknowledged record of its topic at least once.

`run_checker` returns a report (faults by kind, anomalies, counts); with anomalies, the
history (faults with their times, the checks' findings) is kept as JSON in `workdir`.
"""

from __future__ import annotations

import json
import random
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import confluent_kafka
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from cli.local_kafka import LocalKafka
from cli.local_services import LocalRedis, free_port
from tests.faults.kiln_process import KilnProcess, kiln_executable
from tests.faults.records import HardenedRecord, NumberedLoop, read_partition, seq_of
from tests.tcp_relay import TcpRelay

# Each producer's record n is value_of(its first + n): records told apart by their values.
FIRSTS = {"assured-a": 0, "assured-b": 5_000_000, "reliable": 10_000_000, "held": 20_000_000}
FAULT_KINDS = ("kill_kiln", "pause_kiln", "restart_redis", "cut_kafka", "cut_clients")
_RETRYING = {"message.timeout.ms": 300_000, "request.timeout.ms": 30_000,
             "retry.backoff.ms": 50, "retry.backoff.max.ms": 500,
             "reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 500, "linger.ms": 5}


@dataclass(frozen=True)
class RelayedBroker:
    """A Kafka broker Kiln reaches through `relay` (given `relayed_bootstrap`), and that
    the checker reads directly (`bootstrap`) in the end."""

    bootstrap: str
    relayed_bootstrap: str
    relay: TcpRelay


@dataclass
class CheckerConfig:
    duration_s: float
    seed: int
    workdir: Path
    broker: RelayedBroker | None = None  # None: an Apache Kafka of its own
    rate: int = 300  # records/s per producer
    mean_gap_s: float = 1.5  # between the end of a fault and the next
    harden_delay_ms: int = 300


@dataclass
class Report:
    seed: int
    faults: Counter[str] = field(default_factory=Counter)
    anomalies: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    history_path: str | None = None

    def table(self) -> str:
        lines = [f"fault checker, seed {self.seed}", f"{'fault':16} {'injected':>9}"]
        lines += [f"{kind:16} {self.faults[kind]:>9}" for kind in FAULT_KINDS]
        lines.append(f"{'total':16} {sum(self.faults.values()):>9}")
        lines += [f"{name}: {value:,}" for name, value in self.counts.items()]
        lines.append(f"anomalies: {len(self.anomalies)}")
        lines += [f"  {a}" for a in self.anomalies[:20]]
        if self.history_path:
            lines.append(f"history kept in {self.history_path}")
        return "\n".join(lines)


class GroupReader(threading.Thread):
    """A consumer in group `group` reading `topic` through Kiln, committing every 0.5 s;
    notes every record it is handed below an offset the group committed."""

    def __init__(self, bootstrap: str, topic: str, group: str) -> None:
        super().__init__(name=f"checker-group-{group}", daemon=True)
        self.topic = topic
        self.group = group
        self._consumer = confluent_kafka.Consumer({
            "bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
            "auto.offset.reset": "earliest", "session.timeout.ms": 10_000,
            "reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 500,
        })
        self._consumer.subscribe([topic])
        self.seen: set[int] = set()
        self.committed: dict[int, int] = {}
        self.anomalies: list[str] = []
        self.commit_failures = 0
        self._stop_requested = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        last_commit = time.monotonic()
        try:
            while not self._stop_requested.is_set():
                for msg in self._consumer.consume(500, 0.2):
                    if msg.error() is not None:
                        continue
                    partition, offset = msg.partition(), msg.offset()
                    assert partition is not None and offset is not None
                    if offset < self.committed.get(partition, 0):
                        self.anomalies.append(
                            f"group {self.group} handed offset {offset} of partition "
                            f"{partition} after committing {self.committed[partition]}")
                    self.seen.add(seq_of(msg.value()))
                if time.monotonic() - last_commit >= 0.5:
                    last_commit = time.monotonic()
                    self._commit()
        except BaseException as exc:
            self.error = exc

    def _commit(self) -> None:
        try:
            done = self._consumer.commit(asynchronous=False)
        except confluent_kafka.KafkaException:
            self.commit_failures += 1
            return
        for tp in done or []:
            if tp.error is None and tp.offset >= 0:
                self.committed[tp.partition] = max(self.committed.get(tp.partition, 0),
                                                   tp.offset)

    def stop(self) -> None:
        self._stop_requested.set()
        self.join(30)
        self._consumer.close()


class FaultChecker:
    def __init__(self, config: CheckerConfig) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self.report = Report(config.seed)
        self.history: list[dict[str, Any]] = []
        self._started = time.monotonic()
        suffix = uuid.uuid4().hex[:8]
        self.topics = {name: f"checker-{name}-{suffix}"
                       for name in ("assured", "reliable", "held")}

    def run(self, progress: Callable[[str], None] = lambda _: None) -> Report:
        cfg = self.config
        redis_server = LocalRedis(extra_args=["--appendonly", "yes", "--appendfsync", "always"])
        own_kafka: LocalKafka | None = None
        broker = cfg.broker
        if broker is None:
            own_kafka = LocalKafka(relays=1).start()
            listen, told = own_kafka.relayed(0)
            broker = RelayedBroker(own_kafka.bootstrap, f"127.0.0.1:{told}",
                                   TcpRelay(listen, told).start())
        kafka_relay = broker.relay
        kiln_port, client_port = free_port(), free_port()
        client_relay = TcpRelay(kiln_port, client_port).start()
        bootstrap = f"127.0.0.1:{client_port}"
        kiln: KilnProcess | None = None
        loops: dict[str, NumberedLoop] = {}
        readers: list[GroupReader] = []
        try:
            redis_server.start()
            kiln = KilnProcess(kiln_port, redis_server.url, broker.relayed_bootstrap,
                               cfg.harden_delay_ms, cfg.workdir / "kiln.log",
                               extra_args=["--advertise", bootstrap],
                               advertised_port=client_port)
            kiln.start()
            self._create_topics(bootstrap)
            held_group = f"checker-held-{uuid.uuid4().hex[:8]}"
            _register_subscription(redis_server.url, self.topics["held"], held_group)
            readers = [GroupReader(bootstrap, self.topics["assured"],
                                   f"checker-{name}-{uuid.uuid4().hex[:8]}")
                       for name in ("a", "b")]
            readers.append(GroupReader(bootstrap, self.topics["held"], held_group))
            idempotent = {"acks": "all", "enable.idempotence": True}
            once = {"acks": "1", "retries": 0, "enable.idempotence": False}
            loops = {name: NumberedLoop({"bootstrap.servers": bootstrap, **settings,
                                         **_RETRYING},
                                        self.topics[name.split("-")[0]], FIRSTS[name],
                                        cfg.rate)
                     for name, settings in (("assured-a", idempotent),
                                            ("assured-b", idempotent),
                                            ("reliable", once), ("held", once))}
            for thread in [*readers, *loops.values()]:
                thread.start()
            faults = {"kill_kiln": lambda: self._kill_kiln(kiln),
                      "pause_kiln": lambda: self._pause_kiln(kiln),
                      "restart_redis": lambda: self._restart_redis(redis_server),
                      "cut_kafka": lambda: self._cut(kafka_relay, 1.0, 4.0),
                      "cut_clients": lambda: self._cut(client_relay, 0.1, 1.0)}
            deadline = self._started + cfg.duration_s
            while time.monotonic() < deadline:
                time.sleep(self.rng.uniform(0.2, 2 * cfg.mean_gap_s))
                kind = self.rng.choice(FAULT_KINDS)
                self._note("fault", kind=kind)
                faults[kind]()
                self.report.faults[kind] += 1
                progress(f"{time.monotonic() - self._started:6.1f}s {kind:14} acked "
                         f"{[len(loop.deliveries.acked) for loop in loops.values()]}")
            self._settle(kiln, loops, readers)
            hardened = {name: read_partition(broker.bootstrap, topic, timeout_s=120)
                        for name, topic in self.topics.items()}
            self._check(loops, readers, hardened)
        finally:
            for loop in loops.values():
                loop.stop(flush_timeout_s=1)
            for reader in readers:
                if reader.is_alive():
                    reader.stop()
            if kiln is not None:
                kiln.stop()
            client_relay.stop()
            if own_kafka is not None:
                kafka_relay.stop()
                own_kafka.stop()
            redis_server.stop()
        if self.report.anomalies:
            self._keep_history()
        return self.report

    # --- faults ----------------------------------------------------------------------------

    def _kill_kiln(self, kiln: KilnProcess) -> None:
        kiln.kill()
        time.sleep(self.rng.uniform(0.1, 1.0))
        kiln.start(timeout_s=60)

    def _pause_kiln(self, kiln: KilnProcess) -> None:
        kiln.pause()
        time.sleep(self.rng.uniform(0.5, 3.0))
        kiln.resume()

    def _restart_redis(self, redis_server: LocalRedis) -> None:
        redis_server.kill()
        time.sleep(self.rng.uniform(0.1, 1.0))
        redis_server.start()

    def _cut(self, relay: TcpRelay, shortest_s: float, longest_s: float) -> None:
        relay.stop()
        time.sleep(self.rng.uniform(shortest_s, longest_s))
        relay.start()

    # --- the end of the run ----------------------------------------------------------------

    def _create_topics(self, bootstrap: str) -> None:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        levels = {"held": {"kiln.reliability": "reliable_nonpersistent"}}
        for future in admin.create_topics([NewTopic(topic, 1, 1, config=levels.get(name, {}))
                                           for name, topic in self.topics.items()]).values():
            future.result(30)

    def _settle(self, kiln: KilnProcess, loops: dict[str, NumberedLoop],
                readers: list[GroupReader]) -> None:
        """Every producer answered, the groups caught up, Kiln drained (SIGTERM)."""
        for loop in loops.values():
            loop.stop_sending()
        for loop in loops.values():
            left = loop.stop(flush_timeout_s=180)
            if left:
                self.report.anomalies.append(f"{loop.name}: {left} records never answered")
        deadline = time.monotonic() + 60
        for reader in readers:
            acked = _acknowledged(loops, reader.topic)
            while not acked <= reader.seen and time.monotonic() < deadline:
                time.sleep(0.2)
            reader.stop()
        exit_code = kiln.terminate(timeout_s=120)
        if exit_code != 0:
            self.report.anomalies.append(f"kiln exited {exit_code} on SIGTERM")

    def _check(self, loops: dict[str, NumberedLoop], readers: list[GroupReader],
               hardened: dict[str, list[HardenedRecord]]) -> None:
        anomalies = self.report.anomalies
        for name, topic in self.topics.items():
            records = hardened[name]
            mine = {n: loop for n, loop in loops.items() if loop.topic == topic}
            told: dict[int, int] = {}
            for loop in mine.values():
                with loop.deliveries.lock:
                    told |= {loop.first + s: offset for s, offset in loop.deliveries.acked.items()}
            groups = [r for r in readers if r.topic == topic]
            # A record every group of the topic read and committed is delivered: it may
            # leave without being hardened (and an assured producer is answered then).
            delivered = set.intersection(*(r.seen for r in groups)) if groups else set()
            if name == "held":
                self._check_held(records, told, delivered)
            else:
                self._check_hardened(name, records, told, delivered, mine)
            self.report.counts[f"{name}_sent"] = sum(loop.sent for loop in mine.values())
            self.report.counts[f"{name}_acknowledged"] = len(told)
            self.report.counts[f"{name}_hardened"] = len(records)
        for reader in readers:
            anomalies.extend(reader.anomalies)
            unread = _acknowledged(loops, reader.topic) - reader.seen
            if unread:
                anomalies.append(f"group {reader.group}: {len(unread)} acknowledged records "
                                 f"never read, e.g. {sorted(unread)[:5]}")
            if reader.error is not None:
                anomalies.append(f"group {reader.group} failed: {reader.error!r}")
            self.report.counts[f"{reader.group.rsplit('-', 1)[0]}_read"] = len(reader.seen)
            self.report.counts["group_commit_failures"] = (
                self.report.counts.get("group_commit_failures", 0) + reader.commit_failures)

    def _check_hardened(self, name: str, records: list[HardenedRecord], told: dict[int, int],
                        delivered: set[int], loops: dict[str, NumberedLoop]) -> None:
        anomalies = self.report.anomalies
        seqs = [r.seq for r in records]
        twice = sorted(s for s, n in Counter(seqs).items() if n > 1)
        missing = sorted(set(told) - set(seqs) - delivered)
        if twice:
            anomalies.append(f"{name}: {len(twice)} records hardened twice, e.g. {twice[:5]}")
        if missing:
            anomalies.append(f"{name}: {len(missing)} acknowledged records missing, "
                             f"e.g. {missing[:5]}")
        for loop in loops.values():
            own = [s for s in seqs if loop.first <= s < loop.first + max(loop.sent, 1)]
            if own != sorted(own):
                anomalies.append(f"{name}: {loop.name}'s records hardened out of send order")
        backwards = [(a.kiln_offset, b.kiln_offset) for a, b in pairwise(records)
                     if b.kiln_offset <= a.kiln_offset]
        if backwards:
            anomalies.append(f"{name}: Kiln offsets not increasing, e.g. {backwards[:3]}")
        moved = {r.seq: (told[r.seq], r.kiln_offset) for r in records
                 if r.seq in told and told[r.seq] != r.kiln_offset}
        if moved:
            anomalies.append(f"{name}: {len(moved)} records not at the offset their "
                             f"producer was told, e.g. {list(moved.items())[:3]}")

    def _check_held(self, records: list[HardenedRecord], told: dict[int, int],
                    delivered: set[int]) -> None:
        if records:
            self.report.anomalies.append(
                f"held: {len(records)} reliable_nonpersistent records reached Kafka")
        lost = sorted(set(told) - delivered)
        if lost:
            self.report.anomalies.append(
                f"held: {len(lost)} acknowledged reliable_nonpersistent records never "
                f"delivered, e.g. {lost[:5]}")

    def _note(self, event: str, **details: Any) -> None:
        self.history.append({"t": round(time.monotonic() - self._started, 3), "event": event,
                             **details})

    def _keep_history(self) -> None:
        path = self.config.workdir / f"fault-history-{self.config.seed}.json"
        path.write_text(json.dumps({"seed": self.config.seed, "history": self.history,
                                    "anomalies": self.report.anomalies,
                                    "faults": dict(self.report.faults),
                                    "counts": self.report.counts}, indent=1))
        self.report.history_path = str(path)


def _acknowledged(loops: dict[str, NumberedLoop], topic: str) -> set[int]:
    """Every acknowledged record (by value) of the producers writing `topic`."""
    return set().union(*(loop.acknowledged() for loop in loops.values() if loop.topic == topic))


def _register_subscription(redis_url: str, topic: str, group: str) -> None:
    """As an operator would, before anything is sent: `kiln subscriptions add`."""
    subprocess.run([kiln_executable(), "subscriptions", "add", topic, group,
                    "--redis-url", redis_url], check=True, capture_output=True, timeout=60)


def run_checker(config: CheckerConfig, progress: Callable[[str], None] = lambda _: None
                ) -> Report:
    config.workdir.mkdir(parents=True, exist_ok=True)
    return FaultChecker(config).run(progress)
