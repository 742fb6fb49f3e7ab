"""A bare socket Kafka client for tests that need exact requests: error codes, duplicate
batches, malformed frames."""

from __future__ import annotations

import socket
import struct
from typing import Any, Self

from aiokafka.record.default_records import DefaultRecordBatchBuilder
from kafka.protocol.producer import ProduceRequest, ProduceResponse


def record_batch(values: list[bytes], producer: tuple[int, int, int] = (-1, -1, -1),
                 codec: int = 0, transactional: bool = False) -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=codec,
                                        is_transactional=int(transactional),
                                        producer_id=producer[0], producer_epoch=producer[1],
                                        base_sequence=producer[2], batch_size=1 << 22)
    for i, value in enumerate(values):
        builder.append(i, timestamp=1_700_000_000_000 + i, key=None, value=value, headers=[])
    return bytes(builder.build())


class RawClient:
    def __init__(self, bootstrap: str, timeout_s: float = 10, client_id: str = "raw-test"
                 ) -> None:
        host, _, port = bootstrap.rpartition(":")
        self.client_id = client_id
        self.sock = socket.create_connection((host, int(port)), timeout=timeout_s)
        self._correlation_id = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send_frame(self, payload: bytes) -> None:
        self.sock.sendall(struct.pack(">i", len(payload)) + payload)

    def read_frame(self) -> bytes:
        size = struct.unpack(">i", self._read_exactly(4))[0]
        return self._read_exactly(size)

    def _read_exactly(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("closed by peer")
            out += chunk
        return out

    def request(self, message: Any, version: int, response_class: Any) -> Any:
        return self.receive(self.send(message, version), version, response_class)

    def send(self, message: Any, version: int) -> int:
        """Send a request without waiting for its answer; returns its correlation id."""
        self._correlation_id += 1
        message.with_header(correlation_id=self._correlation_id, client_id=self.client_id)
        self.send_frame(bytes(message.encode(version=version, header=True)))
        return self._correlation_id

    def receive(self, correlation_id: int, version: int, response_class: Any) -> Any:
        """The next answer on the connection, which must be the one to `correlation_id`."""
        frame = self.read_frame()
        assert struct.unpack_from(">i", frame)[0] == correlation_id
        flexible = response_class.flexible_version_q(version)
        return response_class.decode(frame[5 if flexible else 4:], version=version)

    def produce(self, topic: str, partition: int, records: bytes, acks: int = 1,
                version: int = 9, transactional_id: str | None = None) -> Any:
        data = ProduceRequest.TopicProduceData
        request = ProduceRequest[version](
            transactional_id=transactional_id, acks=acks, timeout_ms=10_000,
            topic_data=[data(name=topic, partition_data=[
                data.PartitionProduceData(index=partition, records=records)])])
        response = self.request(request, version, ProduceResponse)
        return response.responses[0].partition_responses[0]
