"""Bad and unusual input over a bare socket: Kiln answers with the right error or closes
the connection, never dies, and stores nothing it should not."""

from __future__ import annotations

import struct

import pytest
from kafka.protocol.metadata import (
    ApiVersionsRequest,
    ApiVersionsResponse,
    MetadataRequest,
    MetadataResponse,
)
from kafka.protocol.producer import ProduceRequest

from tests.kiln_harness import RunningKiln, sync_redis
from tests.raw_client import RawClient, record_batch
from wire.errors import ErrorCode


def partition_next_offset(redis_url: str, topic: str, partition: int = 0) -> int:
    raw = sync_redis(redis_url).hget(f"kiln:{{{topic}/{partition}}}:meta", "next")
    return int(raw or 0)


def assert_closed(client: RawClient) -> None:
    with pytest.raises((ConnectionError, OSError)):
        client.read_frame()


def assert_alive(kiln: RunningKiln) -> None:
    client = RawClient(kiln.bootstrap)
    answer = client.request(ApiVersionsRequest[0](), 0, ApiVersionsResponse)
    client.close()
    assert answer.error_code == 0


@pytest.mark.parametrize("size", [-1, 0, 200 * 1024 * 1024])
def test_frame_size_out_of_bounds_closes_connection(kiln: RunningKiln, size: int) -> None:
    client = RawClient(kiln.bootstrap)
    client.sock.sendall(struct.pack(">i", size) + b"\x00" * 16)

    assert_closed(client)
    assert_alive(kiln)


def test_truncated_body_closes_connection(kiln: RunningKiln) -> None:
    client = RawClient(kiln.bootstrap)
    request = MetadataRequest[1](topics=[MetadataRequest.MetadataRequestTopic(name="abc")])
    request.with_header(correlation_id=3, client_id="raw")
    client.send_frame(bytes(request.encode(version=1, header=True))[:-2])

    assert_closed(client)
    assert_alive(kiln)


def test_unknown_api_key_closes_connection(kiln: RunningKiln) -> None:
    client = RawClient(kiln.bootstrap)
    client.send_frame(struct.pack(">hhih", 999, 0, 1, 0))

    assert_closed(client)
    assert_alive(kiln)


def test_produce_v2_closes_connection(kiln: RunningKiln, unique_topic: str) -> None:
    client = RawClient(kiln.bootstrap)
    data = ProduceRequest.TopicProduceData
    request = ProduceRequest[2](acks=1, timeout_ms=1000, topic_data=[data(
        name=unique_topic, partition_data=[data.PartitionProduceData(index=0, records=b"x")])])
    request.with_header(correlation_id=1, client_id="raw")
    client.send_frame(bytes(request.encode(version=2, header=True)))

    assert_closed(client)


def test_api_versions_unknown_version_answers_v0_with_error_35(kiln: RunningKiln) -> None:
    client = RawClient(kiln.bootstrap)
    client.send_frame(struct.pack(">hhih", 18, 99, 12, 1) + b"c" + b"\x00" * 8)

    frame = client.read_frame()
    client.close()

    # Then the range to retry within, ApiVersions' only, as Kafka answers (KIP-511)
    assert struct.unpack_from(">i", frame)[0] == 12
    answer = ApiVersionsResponse.decode(frame[4:], version=0)
    assert answer.error_code == ErrorCode.UNSUPPORTED_VERSION
    assert [(k.api_key, k.min_version, k.max_version) for k in answer.api_keys] == [(18, 0, 4)]


def test_corrupt_batch_is_refused_and_not_stored(kiln: RunningKiln, redis_url: str,
                                                 unique_topic: str) -> None:
    batch = bytearray(record_batch([b"a", b"b"]))
    batch[-1] ^= 0x55
    client = RawClient(kiln.bootstrap)

    answer = client.produce(unique_topic, 0, bytes(batch))
    client.close()

    assert answer.error_code == ErrorCode.CORRUPT_MESSAGE
    assert partition_next_offset(redis_url, unique_topic) == 0


def test_partition_out_of_range_is_unknown(kiln: RunningKiln, unique_topic: str) -> None:
    client = RawClient(kiln.bootstrap)

    answer = client.produce(unique_topic, 5, record_batch([b"a"]))
    client.close()

    assert answer.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    # No offsets in a refused partition's answer, as from Kafka
    assert (answer.base_offset, answer.log_start_offset) == (-1, -1)


def test_illegal_topic_name_is_refused(kiln: RunningKiln) -> None:
    client = RawClient(kiln.bootstrap)

    answer = client.produce("bad/topic", 0, record_batch([b"a"]))
    client.close()

    assert answer.error_code == ErrorCode.INVALID_TOPIC_EXCEPTION


def test_acks_zero_gets_no_response_and_order_is_kept(kiln: RunningKiln, redis_url: str,
                                                      unique_topic: str) -> None:
    client = RawClient(kiln.bootstrap)
    data = ProduceRequest.TopicProduceData
    silent = ProduceRequest[9](transactional_id=None, acks=0, timeout_ms=1000, topic_data=[
        data(name=unique_topic, partition_data=[
            data.PartitionProduceData(index=0, records=record_batch([b"quiet"]))])])
    silent.with_header(correlation_id=1, client_id="raw")
    client.send_frame(bytes(silent.encode(version=9, header=True)))

    answer = client.request(MetadataRequest[1](topics=None), 1, MetadataResponse)
    client.close()

    assert [t.name for t in answer.topics if t.name == unique_topic] == [unique_topic]
    assert partition_next_offset(redis_url, unique_topic) == 1


def test_responses_keep_request_order_behind_a_waiting_assured_produce(
        kiln: RunningKiln, unique_topic: str) -> None:
    client = RawClient(kiln.bootstrap)
    data = ProduceRequest.TopicProduceData
    assured = ProduceRequest[9](transactional_id=None, acks=-1, timeout_ms=10_000, topic_data=[
        data(name=unique_topic, partition_data=[
            data.PartitionProduceData(index=0, records=record_batch([b"slow"]))])])
    assured.with_header(correlation_id=100, client_id="raw")
    quick = ApiVersionsRequest[0]()
    quick.with_header(correlation_id=101, client_id="raw")
    client.send_frame(bytes(assured.encode(version=9, header=True)))
    client.send_frame(bytes(quick.encode(version=0, header=True)))

    first, second = client.read_frame(), client.read_frame()
    client.close()

    assert struct.unpack_from(">i", first)[0] == 100
    assert struct.unpack_from(">i", second)[0] == 101


def test_idempotent_retry_is_answered_with_original_offset_and_stored_once(
        kiln: RunningKiln, redis_url: str, unique_topic: str) -> None:
    client = RawClient(kiln.bootstrap)
    first = client.produce(unique_topic, 0, record_batch([b"a", b"b"], producer=(5000, 0, 0)))
    second = client.produce(unique_topic, 0, record_batch([b"c"], producer=(5000, 0, 2)))

    retried = client.produce(unique_topic, 0, record_batch([b"a", b"b"], producer=(5000, 0, 0)))
    client.close()

    assert (first.error_code, first.base_offset) == (0, 0)
    assert (second.error_code, second.base_offset) == (0, 2)
    assert (retried.error_code, retried.base_offset) == (0, 0)
    assert partition_next_offset(redis_url, unique_topic) == 3


def test_sequence_gap_and_stale_epoch_are_refused(kiln: RunningKiln, redis_url: str,
                                                  unique_topic: str) -> None:
    client = RawClient(kiln.bootstrap)
    client.produce(unique_topic, 0, record_batch([b"a"], producer=(6000, 3, 0)))

    gap = client.produce(unique_topic, 0, record_batch([b"b"], producer=(6000, 3, 5)))
    stale = client.produce(unique_topic, 0, record_batch([b"c"], producer=(6000, 2, 1)))
    client.close()

    assert gap.error_code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert stale.error_code == ErrorCode.INVALID_PRODUCER_EPOCH
    assert partition_next_offset(redis_url, unique_topic) == 1


