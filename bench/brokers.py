"""The broker a benchmark measures against, chosen in one place: `--broker kafka|tansu`.

- `kafka` (the default): Apache Kafka in KRaft mode, one node that is broker and controller
  (`cli/local_kafka.py`), its log on local disk; `start_kafka_cluster()` adds three nodes
  with topics replicated three ways (`min.insync.replicas` 2), for a real replicated
  acks=all.
- `tansu`: the tansu broker with memory storage (`cli/local_services.py`), which starts at
  once.

A bench starts one broker per run and gives every measurement a fresh topic on it; Kiln and
its Redis stay fresh per measurement (`bench.produce.Stack`). Starting a JVM broker takes
5-20 s, more than many measurements last, and Kiln and "direct" runs then meet the same
broker process in the same state, one after the other. Before the first measurement the
broker is warmed up (records produced and read back on a throwaway topic, its transaction
log created), so that the first run does not meet a JVM that has not compiled its hot paths
yet, nor pay for setting up the transaction coordinator Kiln's hardener needs.
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Sequence
from typing import Self

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer
from confluent_kafka import TopicPartition as CkTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from cli.local_kafka import KAFKA_VERSION, LocalKafka, LocalKafkaCluster
from cli.local_services import LocalTansu

BROKER_KINDS = ("kafka", "tansu")
DEFAULT_BROKER = "kafka"
WARM_UP_RECORDS = 300_000


def add_broker_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--broker", choices=BROKER_KINDS, default=DEFAULT_BROKER,
        help=f"the broker to measure against (default {DEFAULT_BROKER}): Apache Kafka "
             f"{KAFKA_VERSION} (KRaft, one node) or tansu (memory storage); one per run, a "
             "fresh topic per measurement")


class Broker:
    """A running broker, one node or a cluster's nodes: where clients connect, which
    processes to count, and how many replicas a topic gets. `stop()` stops it by PID."""

    def __init__(self, kind: str, nodes: Sequence[LocalKafka | LocalTansu],
                 cluster: LocalKafkaCluster | None = None) -> None:
        self.kind = kind
        self.nodes = list(nodes)
        self._cluster = cluster

    @property
    def bootstrap(self) -> str:
        return ",".join(node.bootstrap for node in self.nodes)

    @property
    def pids(self) -> list[int | None]:
        return [node.pid for node in self.nodes]

    @property
    def pid(self) -> int | None:
        """The process of a one-node broker."""
        if len(self.nodes) != 1:
            raise ValueError(f"{self.description} has {len(self.nodes)} processes")
        return self.nodes[0].pid

    @property
    def replication_factor(self) -> int:
        return len(self.nodes)

    @property
    def description(self) -> str:
        if self.kind == "tansu":
            return "tansu, memory storage"
        size = len(self.nodes)
        nodes = ("one node" if size == 1 else
                 f"{size} nodes, replication {size}, min.insync.replicas {min(2, size)}")
        return f"Apache Kafka {KAFKA_VERSION}, KRaft, {nodes}"

    def describe(self) -> dict[str, object]:
        return {"kind": self.kind, "nodes": len(self.nodes), "description": self.description,
                **({"version": KAFKA_VERSION} if self.kind != "tansu" else {})}

    def stop(self) -> None:
        if self._cluster is not None:
            # Its data is thrown away: SIGKILL each node rather than wait for controlled
            # shutdowns one node at a time (the first one can wait out its whole timeout).
            for node in self.nodes:
                node.kill()
            self._cluster.stop()
        else:
            for node in self.nodes:
                node.stop()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_broker(kind: str = DEFAULT_BROKER, *, warm_up_records: int = WARM_UP_RECORDS
                 ) -> Broker:
    """One broker of `kind`, started and warmed up."""
    if kind not in BROKER_KINDS:
        raise ValueError(f"unknown broker {kind!r}; one of {', '.join(BROKER_KINDS)}")
    node = LocalKafka() if kind == "kafka" else LocalTansu()
    return _warmed(Broker(kind, [node.start()]), warm_up_records)


def start_kafka_cluster(size: int = 3, *, warm_up_records: int = WARM_UP_RECORDS) -> Broker:
    """Apache Kafka nodes replicating every topic `size` ways, started and warmed up."""
    cluster = LocalKafkaCluster(size).start()
    return _warmed(Broker("kafka-cluster", cluster.nodes, cluster), warm_up_records)


def create_topic(bootstrap: str, topic: str, replication_factor: int = 1,
                 partitions: int = 1) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    new = NewTopic(topic, partitions, replication_factor)
    for future in admin.create_topics([new], operation_timeout=10).values():
        future.result(timeout=15)


def _warmed(broker: Broker, records: int) -> Broker:
    try:
        warm_up(broker, records)
    except BaseException:
        broker.stop()
        raise
    return broker


def warm_up(broker: Broker, records: int) -> None:
    """Have the broker set up its transaction coordinator; produce `records` of 100 B with
    acks=all to a throwaway topic and read them back."""
    topic = f"bench-warm-up-{uuid.uuid4().hex[:10]}"
    # Kiln's hardener writes under a transactional id (it fences earlier writers): Kafka
    # creates its transaction log on the first such request, now rather than in a
    # measurement.
    Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": topic,
              "log_level": 3}).init_transactions(120)
    if records <= 0:
        return
    create_topic(broker.bootstrap, topic, broker.replication_factor)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all",
                         "linger.ms": 5, "log_level": 3})
    value = bytes(100)
    for _ in range(records):
        while True:
            try:
                producer.produce(topic, value)
                break
            except BufferError:
                producer.poll(0.01)
    if producer.flush(60):
        raise RuntimeError(f"warm-up: {broker.description} did not take {records} records")
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": topic,
                         "enable.auto.commit": False, "log_level": 3})
    consumer.assign([CkTopicPartition(topic, 0, OFFSET_BEGINNING)])
    read = 0
    deadline = time.monotonic() + 60
    try:
        while read < records and time.monotonic() < deadline:
            read += sum(1 for message in consumer.consume(10_000, 0.5)
                        if message.error() is None)
    finally:
        consumer.close()
