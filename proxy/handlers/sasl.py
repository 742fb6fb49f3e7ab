"""SaslHandshake and SaslAuthenticate outside an authentication (on a listener without SASL,
or once authenticated): ILLEGAL_SASL_STATE, in the words of Kafka's KafkaApis. Before
authentication they are the connection's own business (proxy/authentication.py)."""

from __future__ import annotations

from proxy.context import KilnContext
from wire.apis import ApiKey, Message, Request
from wire.errors import ErrorCode


async def handle(ctx: KilnContext, request: Request) -> Message:
    response = request.spec.response[request.header.request_api_version]
    if request.spec.api_key == ApiKey.SASL_HANDSHAKE:
        return response(error_code=int(ErrorCode.ILLEGAL_SASL_STATE), mechanisms=[])
    return response(error_code=int(ErrorCode.ILLEGAL_SASL_STATE),
                    error_message="SaslAuthenticate request received after successful "
                                  "authentication", auth_bytes=b"", session_lifetime_ms=0)
