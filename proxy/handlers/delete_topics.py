"""DeleteTopics: deletes topics in Kafka (the hardened store) and in Kiln.

Topics are named by name, or (v6+) by the topic id Kiln's Metadata gives them; a request is
checked as Kafka's controller checks it (a name or an id, not both, not twice). Deleting
drops what Kiln still buffers for the topic: see storage.catalog's `delete`."""

from __future__ import annotations

import uuid

from proxy.context import KilnContext
from proxy.handlers.admin_requests import DUPLICATE_NAME, given_twice
from proxy.handlers.error_messages import bounded
from wire.apis import CLIENT_APIS, ApiKey, Message, Request
from wire.errors import ErrorCode, KafkaError

_RESP = CLIENT_APIS[ApiKey.DELETE_TOPICS].response
_RESULT = _RESP.DeletableTopicResult
_ZERO_UUID = uuid.UUID(int=0)
_BY_ID = 6  # the first version that names topics by id


def _result(name: str | None, topic_id: uuid.UUID | None, code: ErrorCode,
            message: str | None = None) -> Message:
    return _RESULT(name=name, topic_id=topic_id or _ZERO_UUID, error_code=int(code),
                   error_message=bounded(message))


def _wanted(request: Request) -> list[tuple[str | None, uuid.UUID | None]]:
    """(name, id) of every topic the request names, in its order; a missing id is None."""
    body = request.body
    if request.header.request_api_version < _BY_ID:
        return [(name, None) for name in body.topic_names]
    return [(t.name, None if t.topic_id is None or t.topic_id == _ZERO_UUID else t.topic_id)
            for t in body.topics]


async def handle(ctx: KilnContext, request: Request) -> Message:
    results: list[Message] = []
    by_name: dict[str, uuid.UUID | None] = {}  # name -> the id it was named by, if any
    names = [name for name, topic_id in _wanted(request) if topic_id is None and name]
    ids = [topic_id for _, topic_id in _wanted(request) if topic_id is not None]
    for name, topic_id in _wanted(request):
        if name is None and topic_id is None:
            results.append(_result(None, None, ErrorCode.INVALID_REQUEST,
                                   "Neither topic name nor id were specified."))
        elif name is not None and topic_id is not None:
            results.append(_result(name, topic_id, ErrorCode.INVALID_REQUEST,
                                   "You may not specify both topic name and topic id."))
    for name in given_twice(names):
        results.append(_result(name, None, ErrorCode.INVALID_REQUEST, DUPLICATE_NAME))
    for topic_id in given_twice(ids):
        results.append(_result(None, topic_id, ErrorCode.INVALID_REQUEST,
                               "Duplicate topic id."))
    known = {config.uuid: config.name for config in (await ctx.topics.all()).values()}
    ids_of = {name: topic_id for topic_id, name in known.items()}
    for name in (n for n in dict.fromkeys(names) if names.count(n) == 1):
        by_name[name] = None
    for topic_id in (i for i in dict.fromkeys(ids) if ids.count(i) == 1):
        found = known.get(topic_id)
        if found is None:
            results.append(_result(None, topic_id, ErrorCode.UNKNOWN_TOPIC_ID,
                                   "This server does not host this topic ID."))
        elif found in by_name:
            del by_name[found]
            results.append(_result(found, topic_id, ErrorCode.INVALID_REQUEST,
                                   "The provided topic name maps to an ID that was already "
                                   "supplied."))
        else:
            by_name[found] = topic_id
    for name in by_name:
        topic_id = ids_of.get(name)
        try:
            await ctx.topics.delete(name, timeout_ms=int(request.body.timeout_ms))
            results.append(_result(name, topic_id, ErrorCode.NONE))
        except KafkaError as exc:
            results.append(_result(name, None, exc.error_code, exc.message))
    return _RESP[request.header.request_api_version](throttle_time_ms=0, responses=results)


def error_response(request: Request, code: ErrorCode) -> Message:
    return _RESP[request.header.request_api_version](
        throttle_time_ms=0,
        responses=[_result(name, topic_id, code) for name, topic_id in _wanted(request)])
