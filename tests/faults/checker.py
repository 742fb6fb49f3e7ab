"""A randomized fault checker: producers and a consumer group work through Kiln while faults
are injected at random, then the whole history is checked.

Services are its own: Redis with `appendfsync always` (so that every acknowledged record of
every level must survive a Redis restart), a tansu broker that Kiln reaches through a relay
(cut to take Kafka away without losing its data), and `kiln serve` as a child process that
clients reach through another relay (cut to drop every client connection at once).

Workload: an idempotent `acks=all` producer (assured_persistent) and an `acks=1` producer
without retries (reliable_persistent) on two topics, and a consumer group reading the first
through Kiln, committing as it goes.

Faults, drawn by a seeded generator: Kiln killed (SIGKILL) and restarted, Kiln paused
(SIGSTOP) and resumed, Redis killed and restarted, Kafka cut off, client connections cut.

Checked afterwards (Kiln drained with SIGTERM, topics read straight from the broker):
- every acknowledged record is in its hardened topic (or, for the topic the group reads,
  was delivered to the group, which makes hardening it unnecessary), once, in send order,
  at strictly increasing Kiln offsets, and at the offset its producer was told;
- the group is never handed a record below an offset it committed, and reads every
  acknowledged record at least once.

`run_checker` returns a report (faults by kind, anomalies, counts); with anomalies, the
history (faults with their times, the checks' findings) is kept as JSON in `workdir`.
"""

from __future__ import annotations

import json
import random
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

from cli.local_services import LocalRedis, free_port
from tests.faults.kiln_process import KilnProcess
from tests.faults.records import HardenedRecord, NumberedLoop, read_partition, seq_of
from tests.tcp_relay import RelayedTansu, TcpRelay

RELIABLE_FIRST = 10_000_000  # the acks=1 producer's records are value_of(RELIABLE_FIRST + n)
FAULT_KINDS = ("kill_kiln", "pause_kiln", "restart_redis", "cut_kafka", "cut_clients")
_RETRYING = {"message.timeout.ms": 300_000, "request.timeout.ms": 30_000,
             "retry.backoff.ms": 50, "retry.backoff.max.ms": 500,
             "reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 500, "linger.ms": 5}


@dataclass
class CheckerConfig:
    duration_s: float
    seed: int
    workdir: Path
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
        super().__init__(name="checker-group", daemon=True)
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
                            f"group handed offset {offset} of partition {partition} after "
                            f"committing {self.committed[partition]}")
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
        self.topics = {"assured": f"checker-assured-{suffix}",
                       "reliable": f"checker-reliable-{suffix}"}

    def run(self, progress: Callable[[str], None] = lambda _: None) -> Report:
        cfg = self.config
        redis_server = LocalRedis(extra_args=["--appendonly", "yes", "--appendfsync", "always"])
        kafka_port, broker_port = free_port(), free_port()
        kafka_relay = TcpRelay(broker_port, kafka_port).start()
        broker = RelayedTansu(broker_port, kafka_port)
        kiln_port, client_port = free_port(), free_port()
        client_relay = TcpRelay(kiln_port, client_port).start()
        bootstrap = f"127.0.0.1:{client_port}"
        kiln: KilnProcess | None = None
        loops: list[NumberedLoop] = []
        reader: GroupReader | None = None
        try:
            redis_server.start()
            broker.start()
            kiln = KilnProcess(kiln_port, redis_server.url, f"127.0.0.1:{kafka_port}",
                               cfg.harden_delay_ms, cfg.workdir / "kiln.log",
                               extra_args=["--advertise", bootstrap],
                               advertised_port=client_port)
            kiln.start()
            self._create_topics(bootstrap)
            loops = [
                NumberedLoop({"bootstrap.servers": bootstrap, "acks": "all",
                              "enable.idempotence": True, **_RETRYING},
                             self.topics["assured"], 0, cfg.rate),
                NumberedLoop({"bootstrap.servers": bootstrap, "acks": "1", "retries": 0,
                              "enable.idempotence": False, **_RETRYING},
                             self.topics["reliable"], RELIABLE_FIRST, cfg.rate),
            ]
            for loop in loops:
                loop.start()
            reader = GroupReader(bootstrap, self.topics["assured"], f"checker-{uuid.uuid4()}")
            reader.start()
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
                progress(f"{time.monotonic() - self._started:6.1f}s {kind:14} "
                         f"acked {[len(loop.deliveries.acked) for loop in loops]}")
            self._settle(kiln, loops, reader)
            hardened = {name: read_partition(f"127.0.0.1:{kafka_port}", topic, timeout_s=120)
                        for name, topic in self.topics.items()}
            self._check(loops, reader, hardened)
        finally:
            for loop in loops:
                loop.stop(flush_timeout_s=1)
            if reader is not None and reader.is_alive():
                reader.stop()
            if kiln is not None:
                kiln.stop()
            client_relay.stop()
            kafka_relay.stop()
            broker.stop()
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
        for future in admin.create_topics([NewTopic(t, 1, 1)
                                           for t in self.topics.values()]).values():
            future.result(30)

    def _settle(self, kiln: KilnProcess, loops: list[NumberedLoop],
                reader: GroupReader) -> None:
        """Every producer answered, the group caught up, Kiln drained (SIGTERM)."""
        for loop in loops:
            loop.stop_sending()
        for loop in loops:
            left = loop.stop(flush_timeout_s=180)
            if left:
                self.report.anomalies.append(f"{loop.name}: {left} records never answered")
        acked = loops[0].acknowledged()
        deadline = time.monotonic() + 60
        while not acked <= reader.seen and time.monotonic() < deadline:
            time.sleep(0.2)
        reader.stop()
        exit_code = kiln.terminate(timeout_s=120)
        if exit_code != 0:
            self.report.anomalies.append(f"kiln exited {exit_code} on SIGTERM")

    def _check(self, loops: list[NumberedLoop], reader: GroupReader,
               hardened: dict[str, list[HardenedRecord]]) -> None:
        anomalies = self.report.anomalies
        for loop, name in zip(loops, ("assured", "reliable"), strict=True):
            records = hardened[name]
            seqs = [r.seq for r in records]
            with loop.deliveries.lock:
                told = {loop.first + s: offset for s, offset in loop.deliveries.acked.items()}
            twice = sorted(s for s, n in Counter(seqs).items() if n > 1)
            # The group is a durable subscription of the assured topic: what it read and
            # committed is delivered, and is dropped instead of hardened (and its producer
            # answered on delivery).
            delivered = reader.seen if name == "assured" else set()
            missing = sorted(set(told) - set(seqs) - delivered)
            if twice:
                anomalies.append(f"{name}: {len(twice)} records hardened twice, e.g. {twice[:5]}")
            if missing:
                anomalies.append(f"{name}: {len(missing)} acknowledged records missing, "
                                 f"e.g. {missing[:5]}")
            if seqs != sorted(seqs):
                anomalies.append(f"{name}: hardened out of send order")
            backwards = [(a.kiln_offset, b.kiln_offset) for a, b in pairwise(records)
                         if b.kiln_offset <= a.kiln_offset]
            if backwards:
                anomalies.append(f"{name}: Kiln offsets not increasing, e.g. {backwards[:3]}")
            moved = {r.seq: (told[r.seq], r.kiln_offset) for r in records
                     if r.seq in told and told[r.seq] != r.kiln_offset}
            if moved:
                anomalies.append(f"{name}: {len(moved)} records not at the offset their "
                                 f"producer was told, e.g. {list(moved.items())[:3]}")
            self.report.counts[f"{name}_sent"] = loop.sent
            self.report.counts[f"{name}_acknowledged"] = len(told)
            self.report.counts[f"{name}_hardened"] = len(records)
        anomalies.extend(reader.anomalies)
        unread = loops[0].acknowledged() - reader.seen
        if unread:
            anomalies.append(f"group: {len(unread)} acknowledged records never read, "
                             f"e.g. {sorted(unread)[:5]}")
        if reader.error is not None:
            anomalies.append(f"group reader failed: {reader.error!r}")
        self.report.counts["group_read"] = len(reader.seen)
        self.report.counts["group_commit_failures"] = reader.commit_failures

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


def run_checker(config: CheckerConfig, progress: Callable[[str], None] = lambda _: None
                ) -> Report:
    config.workdir.mkdir(parents=True, exist_ok=True)
    return FaultChecker(config).run(progress)
