"""A null where a request's schema allows none is refused as malformed, as Kafka refuses it;
nulls the schema allows still decode."""

from __future__ import annotations

import struct

import pytest
from kafka.protocol.admin import CreateTopicsRequest
from kafka.protocol.metadata import MetadataRequest
from kafka.protocol.producer import ProduceRequest

from wire import apis
from wire.errors import MalformedRequest


def frame(request: object, api_key: int, version: int, flexible: bool) -> bytes:
    header = struct.pack(">hhih", api_key, version, 7, 3) + b"cli"
    body = bytes(request.encode())  # type: ignore[attr-defined]
    return header + (b"\x00" if flexible else b"") + body


def test_a_null_topic_name_in_produce_is_malformed() -> None:
    topic = ProduceRequest.TopicProduceData
    request = ProduceRequest[3](transactional_id=None, acks=1, timeout_ms=100, topic_data=[
        topic(name=None, partition_data=[])])
    with pytest.raises(MalformedRequest, match="non-nullable field name") as raised:
        apis.decode_request(frame(request, 0, 3, flexible=False))
    assert raised.value.correlation_id == 7


def test_a_null_in_an_array_of_topics_to_create_is_malformed() -> None:
    request = CreateTopicsRequest[5](topics=None, timeout_ms=100, validate_only=False)
    with pytest.raises(MalformedRequest, match="non-nullable field topics"):
        apis.decode_request(frame(request, 19, 5, flexible=True))


def test_nulls_the_schema_allows_decode() -> None:
    # Metadata v12 for every topic (a null topic list), a Produce without transactional id
    every = apis.decode_request(frame(MetadataRequest[12](
        topics=None, allow_auto_topic_creation=False,
        include_topic_authorized_operations=False), 3, 12, flexible=True))
    assert every.body.topics is None
    produce = apis.decode_request(frame(ProduceRequest[3](
        transactional_id=None, acks=1, timeout_ms=100, topic_data=[]), 0, 3, flexible=False))
    assert produce.body.transactional_id is None
