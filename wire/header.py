"""Request and response headers, read and written by hand.

kafka-python decodes bodies well but wants a stream for headers; the header is small and
fixed, and parsing it here lets a bad frame be answered with its correlation id.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from wire.errors import MalformedRequest

_FIXED = struct.Struct(">hhih")  # api_key, api_version, correlation_id, client_id length
_INT32 = struct.Struct(">i")


@dataclass(frozen=True, slots=True)
class RequestHeader:
    request_api_key: int
    request_api_version: int
    correlation_id: int
    client_id: str | None


def read_uvarint(buf: memoryview | bytes, pos: int) -> tuple[int, int]:
    """Unsigned LEB128 varint, as used by flexible versions; returns (value, next position)."""
    result = 0
    shift = 0
    while True:
        if pos >= len(buf):
            raise MalformedRequest("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift > 28:
            raise MalformedRequest("varint too long")


def skip_tagged_fields(buf: memoryview | bytes, pos: int) -> int:
    count, pos = read_uvarint(buf, pos)
    for _ in range(count):
        _tag, pos = read_uvarint(buf, pos)
        size, pos = read_uvarint(buf, pos)
        pos += size
        if pos > len(buf):
            raise MalformedRequest("truncated tagged field")
    return pos


def peek_correlation_id(frame: memoryview | bytes) -> int | None:
    """The correlation id of a frame too broken to parse otherwise, if its first 8 bytes exist."""
    if len(frame) < 8:
        return None
    return int(_INT32.unpack_from(frame, 4)[0])


def parse_request_header(frame: memoryview | bytes, flexible: bool) -> tuple[RequestHeader, int]:
    """Parse a request header (v1, or v2 when `flexible`); returns it and the body's offset."""
    if len(frame) < _FIXED.size:
        raise MalformedRequest("frame shorter than a request header", peek_correlation_id(frame))
    api_key, api_version, correlation_id, client_len = _FIXED.unpack_from(frame, 0)
    pos = _FIXED.size
    client_id: str | None = None
    if client_len >= 0:
        end = pos + client_len
        if end > len(frame):
            raise MalformedRequest("client_id runs past the frame", correlation_id)
        try:
            client_id = bytes(frame[pos:end]).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise MalformedRequest("client_id is not UTF-8", correlation_id) from exc
        pos = end
    if flexible:
        try:
            pos = skip_tagged_fields(frame, pos)
        except MalformedRequest as exc:
            raise MalformedRequest(str(exc), correlation_id) from exc
    return RequestHeader(api_key, api_version, correlation_id, client_id), pos


def peek_api(frame: memoryview | bytes) -> tuple[int, int]:
    """(api_key, api_version) of a frame, before its header version is known."""
    if len(frame) < 4:
        raise MalformedRequest("frame shorter than api key and version")
    key, version = struct.unpack_from(">hh", frame, 0)
    return int(key), int(version)


def response_frame(correlation_id: int, flexible_header: bool, body: bytes | memoryview) -> bytes:
    """Size prefix + response header (v1 adds an empty tagged-field section) + body."""
    header = struct.pack(">ii", 4 + (1 if flexible_header else 0) + len(body), correlation_id)
    if flexible_header:
        return header + b"\x00" + bytes(body)
    return header + bytes(body)


def request_frame(header: RequestHeader, flexible: bool, body: bytes | memoryview) -> bytes:
    """Size prefix + request header + body, for Kiln's own client side (the hardened store)."""
    client = (header.client_id or "").encode()
    head = _FIXED.pack(
        header.request_api_key, header.request_api_version, header.correlation_id, len(client)
    ) + client
    if flexible:
        head += b"\x00"
    return _INT32.pack(len(head) + len(body)) + head + bytes(body)
