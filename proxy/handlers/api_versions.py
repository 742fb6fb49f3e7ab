"""ApiVersions: the ranges Kiln serves. A version above them gets a v0 reply with error 35 and
the range of ApiVersions alone, as Kafka answers it (KIP-511): the client retries within it
and learns the rest then."""

from __future__ import annotations

from proxy.context import KilnContext
from wire.apis import CLIENT_APIS, ApiKey, ApiSpec, Message, Request
from wire.errors import ErrorCode
from wire.header import response_frame

_SPEC = CLIENT_APIS[ApiKey.API_VERSIONS]


def _body(version: int, error_code: ErrorCode, specs: list[ApiSpec]) -> Message:
    entry = _SPEC.response.ApiVersion
    return _SPEC.response[version](
        error_code=int(error_code),
        api_keys=[entry(api_key=int(s.api_key), min_version=s.min_version,
                        max_version=s.max_version) for s in specs],
        throttle_time_ms=0,
    )


async def handle(ctx: KilnContext, request: Request) -> Message:
    return _body(request.header.request_api_version, ErrorCode.NONE,
                 sorted(CLIENT_APIS.values(), key=lambda s: int(s.api_key)))


def unsupported_version_frame(correlation_id: int) -> bytes:
    return response_frame(correlation_id, False,
                          _body(0, ErrorCode.UNSUPPORTED_VERSION, [_SPEC]).encode(version=0))
