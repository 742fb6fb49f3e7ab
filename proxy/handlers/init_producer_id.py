"""InitProducerId: ids for idempotent producers (storage.producer_ids) and, with a
transactional id, from the id's transaction coordinator (storage.transactions)."""

from __future__ import annotations

from proxy.context import KilnContext
from proxy.handlers.transactions import enabled, for_version
from storage.producer_ids import NO_PRODUCER_EPOCH, NO_PRODUCER_ID
from wire.apis import CLIENT_APIS, ApiKey, Message, Request
from wire.errors import ErrorCode

_RESP = CLIENT_APIS[ApiKey.INIT_PRODUCER_ID].response


async def handle(ctx: KilnContext, request: Request) -> Message:
    body = request.body
    # Versions before 3 carry no producer id or epoch.
    version = request.header.request_api_version
    producer_id = body.producer_id if version >= 3 else NO_PRODUCER_ID
    epoch = body.producer_epoch if version >= 3 else NO_PRODUCER_EPOCH
    if body.transactional_id is not None:
        answer = await enabled(ctx).init_producer_id(
            body.transactional_id, body.transaction_timeout_ms, producer_id, epoch)
        return error_response(request, for_version(answer.error_code, version, 4),
                              answer.producer_id, answer.producer_epoch)
    producer_id, epoch = await ctx.producer_ids.init(producer_id, epoch)
    return error_response(request, ErrorCode.NONE, producer_id, epoch)


def error_response(request: Request, code: ErrorCode, producer_id: int = NO_PRODUCER_ID,
                   producer_epoch: int = NO_PRODUCER_EPOCH) -> Message:
    return _RESP[request.header.request_api_version](
        throttle_time_ms=0, error_code=int(code), producer_id=producer_id,
        producer_epoch=producer_epoch)
