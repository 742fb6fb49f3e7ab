"""A transactional producer committing and aborting transactions over three partitions
while Kiln is made to fail, and the check that follows: a read_committed reader must find
every transaction whose commit was acknowledged, each exactly once and whole, and of the
others none or all of its records (a commit whose answer a crash swallowed may have
happened) — never part of one, never an aborted one."""

from __future__ import annotations

import threading
import time
from collections import Counter

from confluent_kafka import KafkaException, Producer

from tests.txn_readers import read_to_end

PARTITIONS = 3
RECORDS = 9  # per transaction, three per partition


class TransactionLoop:
    """A transactional producer in a thread: transaction n carries RECORDS values
    "n:i"; every fourth is aborted on purpose. Errors are handled as the client's
    documentation says: abortable → abort and go on, fatal → a new producer."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self._config = {"bootstrap.servers": bootstrap, "transactional.id": f"kill9-{topic}",
                        "linger.ms": 5, "message.timeout.ms": 20_000,
                        "transaction.timeout.ms": 20_000, "reconnect.backoff.max.ms": 500}
        self._topic = topic
        self.committed: set[int] = set()  # commit acknowledged
        self.aborted: set[int] = set()  # abort acknowledged (on purpose or after an error)
        self.attempts = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="txn-loop", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(120)
        assert not self._thread.is_alive(), "the transactional producer is stuck"

    def _producer(self) -> Producer:
        while not self._stop.is_set():
            producer = Producer(self._config)
            try:
                producer.init_transactions(30)
                return producer
            except KafkaException as exc:
                self.errors.append(f"init: {exc}")
                time.sleep(0.5)
        raise RuntimeError("stopped")

    def _run(self) -> None:
        producer = self._producer()
        n = 0
        while not self._stop.is_set():
            n += 1
            self.attempts = n
            try:
                producer.begin_transaction()
                for i in range(RECORDS):
                    producer.produce(self._topic, f"{n}:{i}".encode(), partition=i % PARTITIONS)
                if n % 4 == 0:
                    producer.abort_transaction(30)
                    self.aborted.add(n)
                else:
                    producer.commit_transaction(30)
                    self.committed.add(n)
            except KafkaException as exc:
                error = exc.args[0]
                self.errors.append(f"{n}: {error}")
                if error.txn_requires_abort():
                    try:
                        producer.abort_transaction(30)
                        self.aborted.add(n)
                    except KafkaException as again:
                        self.errors.append(f"{n} abort: {again}")
                        producer = self._renew(producer)
                elif not error.retriable():
                    producer = self._renew(producer)
                else:
                    # A retriable commit failure: the outcome is unknown; a new producer
                    # (InitProducerId) finishes or aborts it.
                    producer = self._renew(producer)
        producer.flush(10)

    def _renew(self, producer: Producer) -> Producer:
        del producer
        try:
            return self._producer()
        except RuntimeError:
            return Producer({"bootstrap.servers": self._config["bootstrap.servers"]})


def read_committed(bootstrap: str, topic: str, timeout_s: float = 30) -> list[str]:
    read = read_to_end(bootstrap, topic, PARTITIONS, "read_committed", timeout_s=timeout_s)
    return [value for values in read.values() for _, value in values]


def check(values: list[str], loop: TransactionLoop) -> None:
    """Each transaction read is whole, once; every acknowledged commit is there; no
    acknowledged abort is."""
    counts = Counter(int(v.split(":")[0]) for v in values)
    partial = {n: c for n, c in counts.items() if c != RECORDS}
    assert not partial, f"transactions read in part or twice: {partial}"
    missing = sorted(loop.committed - set(counts))
    assert not missing, f"acknowledged commits missing: {missing}"
    aborted_read = sorted(loop.aborted & set(counts))
    assert not aborted_read, f"aborted transactions read: {aborted_read}"
    print(f"{loop.attempts} attempts, {len(loop.committed)} acknowledged commits, "
          f"{len(loop.aborted)} aborts, {len(counts)} transactions read")
