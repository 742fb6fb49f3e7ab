"""CreateTopics: creates the topic in Kafka (the hardened store) and in Kiln.

Topic configs named `kiln.*` set Kiln's policy for the topic (reliability, harden, ...);
the others are Kafka's and go with the topic to the hardened store."""

from __future__ import annotations

from proxy.protocol.apis import CLIENT_APIS, ApiKey, Message, Request
from proxy.protocol.errors import ErrorCode, KafkaError
from proxy.server.context import KilnContext

_RESP = CLIENT_APIS[ApiKey.CREATE_TOPICS].response
_RESULT = _RESP.CreatableTopicResult


def _result(name: str, code: ErrorCode, message: str | None = None,
            partitions: int = -1, topic_id: object = None) -> Message:
    fields: dict[str, object] = {
        "name": name, "error_code": int(code), "error_message": message,
        "num_partitions": partitions, "replication_factor": -1 if partitions < 0 else 1,
        "configs": None if partitions < 0 else [],
    }
    if topic_id is not None:
        fields["topic_id"] = topic_id
    return _RESULT(**fields)


async def handle(ctx: KilnContext, request: Request) -> Message:
    body = request.body
    results = []
    for topic in body.topics:
        partitions = topic.num_partitions
        if partitions == -1:
            partitions = ctx.catalog.settings.default_partitions
        try:
            if topic.assignments:
                raise KafkaError(ErrorCode.INVALID_REQUEST, "manual replica assignment")
            config = await ctx.catalog.create(topic.name, partitions, require_kafka=True,
                                              validate_only=bool(body.validate_only),
                                              configs={c.name: c.value for c in topic.configs})
            results.append(_result(topic.name, ErrorCode.NONE, None, config.partitions,
                                   config.uuid))
        except KafkaError as exc:
            results.append(_result(topic.name, exc.error_code, exc.message))
    return _RESP[request.header.request_api_version](throttle_time_ms=0, topics=results)


def error_response(request: Request, code: ErrorCode) -> Message:
    return _RESP[request.header.request_api_version](
        throttle_time_ms=0, topics=[_result(t.name, code) for t in request.body.topics]
    )
