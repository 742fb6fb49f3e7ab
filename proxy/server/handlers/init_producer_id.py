"""InitProducerId: ids for idempotent producers. Transactions are not offered by Kiln."""

from __future__ import annotations

from proxy.protocol.apis import CLIENT_APIS, ApiKey, Message, Request
from proxy.protocol.errors import ErrorCode, KafkaError
from proxy.server.context import KilnContext
from storage.producer_ids import ProducerIds

_RESP = CLIENT_APIS[ApiKey.INIT_PRODUCER_ID].response


async def handle(ctx: KilnContext, request: Request) -> Message:
    body = request.body
    if body.transactional_id is not None:
        raise KafkaError(ErrorCode.INVALID_REQUEST, "Kiln does not offer transactions")
    ids = ProducerIds(ctx.queue.redis)
    if body.producer_id is not None and body.producer_id >= 0 and body.producer_epoch >= 0:
        producer_id, epoch = await ids.bump(body.producer_id, body.producer_epoch)
    else:
        producer_id, epoch = await ids.allocate()
    return _RESP[request.header.request_api_version](
        throttle_time_ms=0, error_code=0, producer_id=producer_id, producer_epoch=epoch
    )
