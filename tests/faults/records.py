"""What the fault tests send (values that name their place in the send order) and how they
read the hardened topic back, directly from the Kafka broker."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import confluent_kafka

from wire.lineage import lineage_offset

PAD = b"." * 90


def value_of(seq: int) -> bytes:
    return b"rec-%08d|" % seq + PAD


def seq_of(value: bytes | None) -> int:
    assert value is not None and value.startswith(b"rec-"), value
    return int(value[4:12])


@dataclass(frozen=True, slots=True)
class HardenedRecord:
    seq: int
    kiln_offset: int
    kafka_offset: int


def read_partition(kafka_bootstrap: str, topic: str, partition: int = 0,
                   timeout_s: float = 30) -> list[HardenedRecord]:
    """Every record of one partition, up to the high watermark of the Fetch answers."""
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": kafka_bootstrap, "group.id": f"faults-{uuid.uuid4().hex}",
        "enable.auto.commit": False, "enable.partition.eof": True,
        "auto.offset.reset": "earliest",
    })
    out: list[HardenedRecord] = []
    at_end = False
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, partition,
                                                        confluent_kafka.OFFSET_BEGINNING)])
        deadline = time.monotonic() + timeout_s
        while not at_end and time.monotonic() < deadline:
            for msg in consumer.consume(5000, 0.5):
                err = msg.error()
                if err is not None:
                    if err.code() == confluent_kafka.KafkaError._PARTITION_EOF:
                        at_end = True
                        continue
                    raise AssertionError(f"reading {topic}: {err}")
                offset = msg.offset()
                assert offset is not None
                out.append(HardenedRecord(seq_of(msg.value()),
                                          lineage_offset(msg.headers(), offset), offset))
    finally:
        consumer.close()
    assert at_end, f"end of {topic}[{partition}] not reached in {timeout_s}s"
    return out


class Deliveries:
    """Delivery reports by sequence number (written from librdkafka callbacks)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.acked: dict[int, int] = {}  # seq -> offset the producer was given
        self.failed: dict[int, str] = {}

    def callback(self, seq: int) -> Callable[[Any, Any], None]:
        def on_delivery(err: Any, msg: Any) -> None:
            with self.lock:
                if err is None:
                    self.acked[seq] = msg.offset()
                else:
                    self.failed[seq] = str(err)
        return on_delivery

    def counts(self) -> tuple[int, int]:
        with self.lock:
            return len(self.acked), len(self.failed)


class ProducerLoop(threading.Thread):
    """A confluent-kafka producer sending value_of(0), value_of(1), ... to partition 0 at
    about `rate` records/s until stop(), then flushing."""

    def __init__(self, config: dict[str, Any], topic: str, rate: int = 1000,
                 name: str = "fault-producer") -> None:
        super().__init__(name=name, daemon=True)
        self.producer = confluent_kafka.Producer(config)
        self.topic = topic
        self.rate = rate
        self.deliveries = Deliveries()
        self.sent = 0
        self.error: BaseException | None = None
        self._stop_requested = threading.Event()

    def run(self) -> None:
        step = 0.02
        per_step = max(1, int(self.rate * step))
        try:
            while not self._stop_requested.is_set():
                began = time.monotonic()
                for _ in range(per_step):
                    self._produce(self.sent)
                    self.sent += 1
                self.producer.poll(0)
                time.sleep(max(0.0, step - (time.monotonic() - began)))
        except BaseException as exc:
            self.error = exc

    def _produce(self, seq: int) -> None:
        while True:
            try:
                self._send(seq, self.deliveries.callback(seq))
                return
            except BufferError:
                self.producer.poll(0.05)

    def _send(self, seq: int, on_delivery: Callable[[Any, Any], None]) -> None:
        """Record `seq`; subclasses choose its key, partition and timestamp."""
        self.producer.produce(self.topic, value=value_of(seq), partition=0,
                              on_delivery=on_delivery)

    def wait_for_acks(self, at_least: int, timeout_s: float, fail_fast: bool = False) -> bool:
        """Wait until `at_least` records were acknowledged; False on timeout (or, with
        fail_fast, as soon as a delivery fails; or when the send loop died)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            acked, failed = self.deliveries.counts()
            if acked >= at_least:
                return True
            if (failed and fail_fast) or self.error is not None:
                return False
            time.sleep(0.05)
        return False

    def stop_sending(self) -> None:
        """Send no more records (outstanding ones are still reported)."""
        self._stop_requested.set()

    def stop(self, flush_timeout_s: float) -> int:
        """Stop sending, wait for every outstanding delivery report; the number left
        undelivered."""
        self._stop_requested.set()
        self.join(10)
        remaining: int = self.producer.flush(flush_timeout_s)
        return remaining


class NumberedLoop(ProducerLoop):
    """A ProducerLoop whose record n is value_of(first + n), so that several producers on
    one partition send records told apart by their values."""

    def __init__(self, config: dict[str, Any], topic: str, first: int, rate: int) -> None:
        super().__init__(config, topic, rate=rate, name=f"producer-{first}")
        self.first = first

    def _send(self, seq: int, on_delivery: Callable[[Any, Any], None]) -> None:
        self.producer.produce(self.topic, value=value_of(self.first + seq), partition=0,
                              on_delivery=on_delivery)

    def acknowledged(self) -> set[int]:
        with self.deliveries.lock:
            return {self.first + seq for seq in self.deliveries.acked}
