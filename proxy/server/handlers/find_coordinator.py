"""FindCoordinator: advertised because librdkafka only compresses with lz4 for brokers that
offer it. Kiln coordinates no groups or transactions yet (consumer groups come with the
delivery issue), so every lookup answers COORDINATOR_NOT_AVAILABLE, which clients retry."""

from __future__ import annotations

from proxy.protocol.apis import CLIENT_APIS, ApiKey, Message, Request
from proxy.protocol.errors import ErrorCode
from proxy.server.context import KilnContext

_RESP = CLIENT_APIS[ApiKey.FIND_COORDINATOR].response
_REASON = "Kiln does not coordinate consumer groups or transactions yet"


async def handle(ctx: KilnContext, request: Request) -> Message:
    code = int(ErrorCode.COORDINATOR_NOT_AVAILABLE)
    version = request.header.request_api_version
    if version >= 4:
        return _RESP[version](throttle_time_ms=0, coordinators=[
            _RESP.Coordinator(key=key, node_id=-1, host="", port=-1, error_code=code,
                              error_message=_REASON)
            for key in request.body.coordinator_keys])
    return _RESP[version](throttle_time_ms=0, error_code=code, error_message=_REASON,
                          node_id=-1, host="", port=-1)
