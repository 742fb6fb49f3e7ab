"""CreatePartitions: adds partitions to topics, in Kafka (the hardened store) first, then in
Kiln, where the new partitions start empty at offset 0 as Kafka's do. Manual assignments
and validate_only go to Kafka as given; a count that is not an increase is refused with
INVALID_PARTITIONS, as Kafka refuses it."""

from __future__ import annotations

from proxy.context import KilnContext
from proxy.handlers.admin_requests import DUPLICATE_NAME, given_twice
from proxy.handlers.error_messages import bounded
from wire.apis import CLIENT_APIS, ApiKey, Message, Request
from wire.errors import ErrorCode, KafkaError

_RESP = CLIENT_APIS[ApiKey.CREATE_PARTITIONS].response
_RESULT = _RESP.CreatePartitionsTopicResult


def _result(name: str, code: ErrorCode, message: str | None = None) -> Message:
    return _RESULT(name=name, error_code=int(code), error_message=bounded(message))


async def handle(ctx: KilnContext, request: Request) -> Message:
    body = request.body
    duplicates = given_twice(topic.name for topic in body.topics)
    results = [_result(name, ErrorCode.INVALID_REQUEST, DUPLICATE_NAME) for name in duplicates]
    for topic in body.topics:
        if topic.name in duplicates:
            continue
        assignments = None if topic.assignments is None else [
            list(assignment.broker_ids) for assignment in topic.assignments]
        try:
            await ctx.topics.add_partitions(topic.name, int(topic.count),
                                             assignments=assignments,
                                             validate_only=bool(body.validate_only),
                                             timeout_ms=int(body.timeout_ms))
            results.append(_result(topic.name, ErrorCode.NONE))
        except KafkaError as exc:
            results.append(_result(topic.name, exc.error_code, exc.message))
    return _RESP[request.header.request_api_version](throttle_time_ms=0, results=results)


def error_response(request: Request, code: ErrorCode) -> Message:
    return _RESP[request.header.request_api_version](
        throttle_time_ms=0, results=[_result(t.name, code) for t in request.body.topics])
