"""FindCoordinator: a group's or a transactional id's coordinator is the Kiln node it is
placed on (storage/leadership.py), not available while that node is silent. With
transactions off, a transaction coordinator is never available (clients retry, then give
up)."""

from __future__ import annotations

from dataclasses import dataclass

from proxy.context import KilnContext
from wire.apis import CLIENT_APIS, ApiKey, Message, Request
from wire.errors import ErrorCode

_RESP = CLIENT_APIS[ApiKey.FIND_COORDINATOR].response
GROUP = 0
TRANSACTION = 1


@dataclass(frozen=True, slots=True)
class _Found:
    error_code: ErrorCode
    error_message: str | None = None
    node_id: int = -1
    host: str = ""
    port: int = -1


def _locate(ctx: KilnContext, key_type: int, key: str) -> _Found:
    if key_type == GROUP:
        node = ctx.cluster.coordinator(key)
    elif key_type == TRANSACTION:
        if ctx.transactions is None:
            return _Found(ErrorCode.COORDINATOR_NOT_AVAILABLE, "transactions are off")
        if not key:
            return _Found(ErrorCode.INVALID_REQUEST, "empty transactional id")
        node = ctx.cluster.transaction_coordinator(key)
    else:
        return _Found(ErrorCode.INVALID_REQUEST, f"unknown coordinator key type {key_type}")
    address = ctx.brokers().get(node)
    if address is None or ctx.cluster.silent(node):
        # Placed on a node that left since, or that stopped heartbeating (what it
        # coordinates moves once it is declared dead): the client asks again.
        return _Found(ErrorCode.COORDINATOR_NOT_AVAILABLE)
    return _Found(ErrorCode.NONE, None, node, *address)


async def handle(ctx: KilnContext, request: Request) -> Message:
    body = request.body
    version = request.header.request_api_version
    key_type = body.key_type if version >= 1 else GROUP
    if version >= 4:
        return _body(version, [(key, _locate(ctx, key_type, key))
                                for key in body.coordinator_keys])
    return _body(version, [(body.key, _locate(ctx, key_type, body.key))])


def _body(version: int, found: list[tuple[str, _Found]]) -> Message:
    if version >= 4:
        return _RESP[version](throttle_time_ms=0, coordinators=[
            _RESP.Coordinator(key=key, node_id=f.node_id, host=f.host, port=f.port,
                              error_code=int(f.error_code), error_message=f.error_message)
            for key, f in found])
    _, f = found[0]
    return _RESP[version](throttle_time_ms=0, error_code=int(f.error_code),
                          error_message=f.error_message, node_id=f.node_id, host=f.host,
                          port=f.port)


def error_response(request: Request, code: ErrorCode) -> Message:
    version = request.header.request_api_version
    keys = request.body.coordinator_keys if version >= 4 else [request.body.key]
    return _body(version, [(key, _Found(code)) for key in keys])
