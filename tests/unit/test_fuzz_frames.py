"""Hostile bytes: the protocol layer answers with its own errors, never anything else.

Any other exception (IndexError, struct.error, ...) escapes and fails the test."""

from __future__ import annotations

import contextlib
import struct

from hypothesis import given, settings
from hypothesis import strategies as st

from wire import apis
from wire.apis import CLIENT_APIS, UnsupportedRequest
from wire.batch import split_batches
from wire.errors import KafkaError, MalformedRequest

_KNOWN = [(int(spec.api_key), v) for spec in CLIENT_APIS.values()
          for v in range(spec.lowest_handled, spec.max_version + 1)]


@settings(max_examples=600, deadline=None)
@given(api=st.sampled_from(_KNOWN), correlation_id=st.integers(-(2**31), 2**31 - 1),
       body=st.binary(max_size=300))
def test_random_bodies_of_known_apis_decode_or_are_malformed(
        api: tuple[int, int], correlation_id: int, body: bytes) -> None:
    frame = struct.pack(">hhih", api[0], api[1], correlation_id, 3) + b"cli" + body
    try:
        apis.decode_request(frame)
    except MalformedRequest as exc:
        assert exc.correlation_id in (correlation_id, None)
    except UnsupportedRequest:
        raise AssertionError("a known API and version was called unsupported") from None


@settings(max_examples=300, deadline=None)
@given(frame=st.binary(max_size=200))
def test_random_frames_never_escape_the_protocol_errors(frame: bytes) -> None:
    with contextlib.suppress(MalformedRequest, UnsupportedRequest):
        apis.decode_request(frame)


@settings(max_examples=300, deadline=None)
@given(records=st.binary(max_size=400))
def test_random_record_sets_are_refused_with_a_kafka_error(records: bytes) -> None:
    with contextlib.suppress(KafkaError):
        list(split_batches(records))
