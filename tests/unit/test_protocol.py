"""Request framing, headers and the API registry, with frames built by kafka-python's client
classes (what a real client sends)."""

from __future__ import annotations

import struct

import pytest
from kafka.protocol.metadata import ApiVersionsRequest, MetadataRequest
from kafka.protocol.producer import ProduceRequest

from wire import apis
from wire.apis import ApiKey, UnsupportedRequest
from wire.errors import ErrorCode, MalformedRequest
from wire.header import parse_request_header, read_uvarint


def client_frame(message: object, version: int, correlation_id: int = 7) -> bytes:
    message.with_header(correlation_id=correlation_id, client_id="test-client")  # type: ignore[attr-defined]
    framed = bytes(message.encode(version=version, header=True))  # type: ignore[attr-defined]
    return framed


def test_flexible_produce_request_decodes_with_header_and_records() -> None:
    topic = ProduceRequest.TopicProduceData
    given = ProduceRequest[9](
        transactional_id=None, acks=-1, timeout_ms=1500,
        topic_data=[topic(name="orders", partition_data=[
            topic.PartitionProduceData(index=2, records=b"batch-bytes")])],
    )

    request = apis.decode_request(client_frame(given, 9))

    assert request.header.request_api_key == ApiKey.PRODUCE
    assert request.header.correlation_id == 7
    assert request.header.client_id == "test-client"
    assert request.body.acks == -1
    assert request.body.topic_data[0].name == "orders"
    assert request.body.topic_data[0].partition_data[0].index == 2
    assert request.body.topic_data[0].partition_data[0].records == b"batch-bytes"


def test_produce_below_v3_is_unsupported_although_advertised() -> None:
    topic = ProduceRequest.TopicProduceData
    given = ProduceRequest[2](acks=1, timeout_ms=10,
                              topic_data=[topic(name="t", partition_data=[])])

    with pytest.raises(UnsupportedRequest) as raised:
        apis.decode_request(client_frame(given, 2, correlation_id=11))

    assert raised.value.header.correlation_id == 11
    assert apis.CLIENT_APIS[ApiKey.PRODUCE].min_version == 0


def test_unknown_api_key_is_unsupported_with_its_correlation_id() -> None:
    frame = struct.pack(">hhih", 999, 0, 42, 1) + b"x"

    with pytest.raises(UnsupportedRequest) as raised:
        apis.decode_request(frame)

    assert raised.value.header.correlation_id == 42
    assert not raised.value.known


def test_truncated_body_is_malformed_with_correlation_id() -> None:
    given = MetadataRequest[1](topics=[MetadataRequest.MetadataRequestTopic(name="abc")])
    frame = client_frame(given, 1, correlation_id=5)

    with pytest.raises(MalformedRequest) as raised:
        apis.decode_request(frame[:-2])

    assert raised.value.correlation_id == 5


def test_bytes_after_the_fields_are_ignored_as_kafka_ignores_them() -> None:
    # Given librdkafka's all-topics Metadata v12: null topics, two false flags, no tags, and
    # its 4-byte placeholder's last 3 bytes left after the fields
    header = struct.pack(">hhih", 3, 12, 7, 4) + b"rdk" + b"\x00"  # flexible: empty tags
    frame = header + bytes.fromhex("00000000010000")

    # When it is decoded
    request = apis.decode_request(frame)

    # Then it is an all-topics request
    assert request.header.correlation_id == 7
    assert request.body.topics is None
    assert request.body.allow_auto_topic_creation is False


def test_client_id_running_past_frame_is_malformed() -> None:
    frame = struct.pack(">hhih", 18, 0, 9, 500) + b"short"

    with pytest.raises(MalformedRequest) as raised:
        parse_request_header(frame, flexible=False)

    assert raised.value.correlation_id == 9


def test_api_versions_v3_request_parses_flexible_header() -> None:
    given = ApiVersionsRequest[3](client_software_name="k", client_software_version="1")

    request = apis.decode_request(client_frame(given, 3))

    assert request.body.client_software_name == "k"


def test_response_frames_api_versions_with_header_v0_even_when_flexible() -> None:
    given = ApiVersionsRequest[3](client_software_name="k", client_software_version="1")
    request = apis.decode_request(client_frame(given, 3, correlation_id=77))
    body = apis.error_response(request.spec, 3, ErrorCode.NONE)

    frame = apis.encode_response(request, body)

    size, correlation_id = struct.unpack_from(">ii", frame)
    assert size == len(frame) - 4
    assert correlation_id == 77
    decoded = request.spec.response.decode(frame[8:], version=3)
    assert decoded.error_code == 0


@pytest.mark.parametrize(("encoded", "value"), [(b"\x00", 0), (b"\x7f", 127), (b"\x80\x01", 128),
                                                (b"\xff\xff\x03", 65535)])
def test_uvarint(encoded: bytes, value: int) -> None:
    assert read_uvarint(encoded, 0) == (value, len(encoded))


def test_uvarint_truncated_is_malformed() -> None:
    with pytest.raises(MalformedRequest):
        read_uvarint(b"\x80", 0)
