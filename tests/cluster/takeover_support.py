"""What the takeover tests share: three `kiln serve` child processes on one Redis and one
Kafka, a producer spreading numbered records over a topic's partitions, who leads what (as
Metadata and the partition leases in Redis say), and the count of what reached Kafka."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]
from kafka.protocol.metadata import MetadataRequest, MetadataResponse

from cli.local_services import free_port
from storage.leadership import lease_key
from storage.log_queue import partition_key
from storage.model import TopicPartition
from storage.nodes import NODES_KEY, KilnNode, decode_node
from tests.cluster.conftest import HEARTBEAT_MS, NODES, SESSION_MS
from tests.faults.conftest import HARDEN_DELAY_MS
from tests.faults.kiln_process import KilnProcess
from tests.faults.records import Deliveries, HardenedRecord, ProducerLoop, read_partition, value_of
from tests.faults.test_kill9 import PRODUCER_MODES, assert_exactly_once_in_order
from tests.kiln_harness import eventually, sync_redis
from tests.raw_client import RawClient

PARTITIONS = 6
NODE_ARGS = ["--node-heartbeat-ms", str(HEARTBEAT_MS),
             "--node-session-timeout-ms", str(SESSION_MS)]


@dataclass(frozen=True, slots=True)
class Lease:
    """A partition's lease as Redis holds it: `<epoch> <node id> <incarnation>`."""

    epoch: int
    node_id: int  # -1 once released
    incarnation: str


class Cluster:
    """`kiln serve` nodes on free ports, one log file each; `bootstrap` names them all."""

    def __init__(self, redis_url: str, kafka_bootstrap: str, log_dir: Path,
                 nodes: int = NODES, node_args: Sequence[str] = NODE_ARGS) -> None:
        self.redis = sync_redis(redis_url)
        self.processes = [KilnProcess(free_port(), redis_url, kafka_bootstrap, HARDEN_DELAY_MS,
                                      log_dir / f"node-{i}.log", extra_args=node_args)
                          for i in range(nodes)]
        self.bootstrap = ",".join(p.bootstrap for p in self.processes)

    def start(self) -> None:
        """Start every node on an emptied Redis; return once each one's Metadata lists
        them all."""
        self.redis.flushdb()
        for process in self.processes:
            process.start()
        assert eventually(lambda: all(len(self.brokers(p)) == len(self.processes)
                                      for p in self.processes), 15), \
            "the nodes did not see each other:\n" + self.log_tails()

    def stop(self) -> None:
        for process in self.processes:
            process.resume()  # a SIGSTOPped child would not die of SIGKILL before SIGCONT
            process.stop()
        self.redis.close()

    def create_topic(self, topic: str, partitions: int = PARTITIONS) -> None:
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)

    # -- who leads what ------------------------------------------------------------------

    def metadata(self, process: KilnProcess, topic: str | None = None) -> Any:
        """That node's own Metadata answer (not another broker's: a bare connection)."""
        topics = None if topic is None else [MetadataRequest.MetadataRequestTopic(name=topic)]
        with RawClient(process.bootstrap, timeout_s=5) as client:
            return client.request(MetadataRequest[1](topics=topics), 1, MetadataResponse)

    def brokers(self, process: KilnProcess) -> dict[int, int]:
        """Broker node id -> port, as that node's Metadata lists them."""
        return {b.node_id: b.port for b in self.metadata(process).brokers}

    def leaders(self, process: KilnProcess, topic: str) -> dict[int, int]:
        """Partition -> leader node id, as that node's Metadata says."""
        answer = self.metadata(process, topic)
        (entry,) = [t for t in answer.topics if t.name == topic]
        assert entry.error_code == 0, entry
        return {p.partition_index: p.leader_id for p in entry.partitions}

    def node_ids(self) -> dict[int, KilnProcess]:
        """Node id -> the process registered under it (from the registrations in Redis)."""
        by_port = {p.port: p for p in self.processes}
        return {n.node_id: by_port[n.port] for n in self.registrations() if n.port in by_port}

    def registrations(self) -> list[KilnNode]:
        return [node for node_id, text in self.redis.hgetall(NODES_KEY).items()
                if (node := decode_node(node_id, text)) is not None]

    def busiest(self, topic: str) -> tuple[KilnProcess, int, list[int]]:
        """The node leading the most partitions of `topic`: process, node id, partitions."""
        leaders = self.leaders(self.processes[0], topic)
        counts = {n: sorted(p for p, leader in leaders.items() if leader == n)
                  for n in set(leaders.values())}
        node_id = max(counts, key=lambda n: (len(counts[n]), n))
        return self.node_ids()[node_id], node_id, counts[node_id]

    def leases(self, topic: str, partitions: int = PARTITIONS) -> dict[int, Lease | None]:
        out: dict[int, Lease | None] = {}
        for p in range(partitions):
            raw = self.redis.get(lease_key(TopicPartition(topic, p)))
            if raw is None:
                out[p] = None
                continue
            text = raw.decode() if isinstance(raw, bytes) else raw
            epoch, node_id, incarnation = text.split(" ")
            out[p] = Lease(int(epoch), int(node_id), incarnation)
        return out

    def hardened_everything(self, topic: str, partitions: int = PARTITIONS) -> bool:
        """Every partition's hardened mark has reached its end."""
        for p in range(partitions):
            state = self.redis.hmget(partition_key(TopicPartition(topic, p), "meta"), "next",
                                     "hardened")
            if state[0] is not None and state[0] != state[1]:
                return False
        return True

    def log_tails(self, limit: int = 3000) -> str:
        return "\n".join(f"--- {p.log_path.name}\n{p.log_tail(limit)}" for p in self.processes)


@contextmanager
def running_cluster(redis_url: str, kafka_bootstrap: str, log_dir: Path) -> Iterator[Cluster]:
    """A started Cluster; every child killed in the end whatever happened."""
    cluster = Cluster(redis_url, kafka_bootstrap, log_dir)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


class SpreadLoop(ProducerLoop):
    """An idempotent acks=all ProducerLoop whose record n goes to partition n % partitions,
    and which notes when each record was acknowledged."""

    def __init__(self, bootstrap: str, topic: str, partitions: int = PARTITIONS,
                 rate: int = 1500, **config: Any) -> None:
        super().__init__({"bootstrap.servers": bootstrap,
                          **PRODUCER_MODES["idempotent-acks-all"], **config}, topic, rate=rate,
                         name="spread-producer")
        self.partitions = partitions
        self._acked_lock = threading.Lock()
        self.acked_at: dict[int, float] = {}  # seq -> time.monotonic() of its report

    def _send(self, seq: int, on_delivery: Callable[[Any, Any], None]) -> None:
        def reported(err: Any, msg: Any) -> None:
            if err is None:
                with self._acked_lock:
                    self.acked_at[seq] = time.monotonic()
            on_delivery(err, msg)
        self.producer.produce(self.topic, value=value_of(seq), partition=seq % self.partitions,
                              on_delivery=reported)

    def stop(self, flush_timeout_s: float) -> int:
        remaining = super().stop(flush_timeout_s)
        if remaining == 0:
            self.producer.close()  # or it goes on dialling the nodes once they are gone
        return remaining

    def first_ack_after(self, since: float, first_seq: int, partitions: list[int]) -> float | None:
        """When the first record numbered `first_seq` or later, of one of `partitions`, was
        acknowledged after `since`; None if none was yet."""
        with self._acked_lock:
            times = [at for seq, at in self.acked_at.items()
                     if seq >= first_seq and seq % self.partitions in partitions and at > since]
        return min(times, default=None)

    def partition_deliveries(self, partition: int) -> Deliveries:
        """The delivery reports of one partition's records."""
        out = Deliveries()
        with self.deliveries.lock:
            out.acked = {s: o for s, o in self.deliveries.acked.items()
                         if s % self.partitions == partition}
            out.failed = {s: e for s, e in self.deliveries.failed.items()
                          if s % self.partitions == partition}
        return out


def read_topic(kafka_bootstrap: str, topic: str, partitions: int = PARTITIONS
               ) -> dict[int, list[HardenedRecord]]:
    """Every partition of the hardened topic, read from Kafka itself."""
    return {p: read_partition(kafka_bootstrap, topic, p, timeout_s=60) for p in range(partitions)}


def assert_every_record_once_in_order(hardened: dict[int, list[HardenedRecord]],
                                      loop: SpreadLoop, consecutive: bool = True) -> None:
    """Each partition of the hardened topic holds exactly its records of the idempotent
    producer, each once, in send order, at consecutive Kiln offsets from 0 (increasing ones
    unless `consecutive`: a partition Redis lost starts again past a fencing marker in
    Kafka), each at the offset its producer was told."""
    failed = list(loop.deliveries.failed.items())
    assert not failed, f"{len(failed)} deliveries failed, first {failed[:5]}"
    assert len(loop.deliveries.acked) == loop.sent
    for p, records in hardened.items():
        deliveries = loop.partition_deliveries(p)
        mine = list(range(p, loop.sent, loop.partitions))
        assert_exactly_once_in_order(records, deliveries, len(mine), idempotent=False)
        assert [r.seq for r in records] == mine, f"partition {p}"
        if consecutive:
            assert [r.kiln_offset for r in records] == list(range(len(mine))), f"partition {p}"


def assert_nothing_lost_or_duplicated(producer: SpreadLoop, undelivered: int,
                                      hardened_in_time: bool,
                                      hardened: dict[int, list[HardenedRecord]],
                                      logs: str, consecutive: bool = True) -> None:
    """The producer delivered everything it sent, Kiln hardened all of it, and Kafka holds
    every record once, in send order per partition."""
    assert producer.error is None, producer.error
    assert undelivered == 0
    assert hardened_in_time, f"not everything was hardened:\n{logs}"
    assert_every_record_once_in_order(hardened, producer, consecutive)


def lease_disagreements(cluster: Cluster, topic: str, partitions: int = PARTITIONS
                        ) -> dict[int, str]:
    """The partitions whose lease is not held by the running incarnation of the node that
    every running node's Metadata names as its leader (empty when every one is)."""
    incarnations = {n.node_id: n.incarnation for n in cluster.registrations()}
    views = [cluster.leaders(p, topic) for p in cluster.processes if p.pid is not None]
    leases = cluster.leases(topic, partitions)
    out: dict[int, str] = {}
    for p in range(partitions):
        named = sorted({view[p] for view in views})
        lease = leases[p]
        if len(named) != 1:
            out[p] = f"the nodes name different leaders: {named}"
        elif lease is None or lease.node_id != named[0] \
                or lease.incarnation != incarnations.get(named[0]):
            out[p] = f"led by node {named[0]} ({incarnations.get(named[0])}), lease {lease}"
    return out
