"""InitProducerId: ids for idempotent producers. Transactions are not offered by Kiln."""

from __future__ import annotations

from proxy.context import KilnContext
from storage.producer_ids import NO_PRODUCER_EPOCH, NO_PRODUCER_ID
from wire.apis import CLIENT_APIS, ApiKey, Message, Request
from wire.errors import ErrorCode, KafkaError

_RESP = CLIENT_APIS[ApiKey.INIT_PRODUCER_ID].response


async def handle(ctx: KilnContext, request: Request) -> Message:
    body = request.body
    if body.transactional_id is not None:
        raise KafkaError(ErrorCode.INVALID_REQUEST, "Kiln does not offer transactions")
    # Versions before 3 carry no producer id or epoch.
    version = request.header.request_api_version
    producer_id = body.producer_id if version >= 3 else NO_PRODUCER_ID
    epoch = body.producer_epoch if version >= 3 else NO_PRODUCER_EPOCH
    producer_id, epoch = await ctx.producer_ids.init(producer_id, epoch)
    return _RESP[version](
        throttle_time_ms=0, error_code=0, producer_id=producer_id, producer_epoch=epoch
    )
