"""DeleteGroups: delete groups without members, their metadata and committed offsets, as
Kafka's coordinator does (GROUP_ID_NOT_FOUND for a group it does not know, NON_EMPTY_GROUP
for one with members).

A deleted group that counted for delivery stops counting where it registered itself
(storage.delivery.Delivery.group_deleted): records held for it are held no longer, and
those the remaining durable subscriptions have read are dropped at once. The group is
deleted before delivery hears of it: a failure in between leaves records held (hardened
after the delay), never dropped for a group that still exists.
"""

from __future__ import annotations

from proxy.context import KilnContext
from storage.errors import coordinator_errors
from wire.apis import CLIENT_APIS, ApiKey, Message, Request
from wire.errors import ErrorCode, KafkaError

_RESP = CLIENT_APIS[ApiKey.DELETE_GROUPS].response
_RESULT = _RESP.DeletableGroupResult


async def _delete(ctx: KilnContext, group_id: str) -> ErrorCode:
    with coordinator_errors():
        return await ctx.groups.delete_group(group_id)


async def handle(ctx: KilnContext, request: Request) -> Message:
    results = []
    # A group named twice is deleted (and answered) once, as Kafka does.
    for group_id in dict.fromkeys(request.body.groups_names):
        try:
            code = await _delete(ctx, group_id)
        except KafkaError as exc:  # Redis unreachable, or the group changed meanwhile
            code = exc.error_code
        results.append(_RESULT(group_id=group_id, error_code=int(code)))
    return _RESP[request.header.request_api_version](throttle_time_ms=0, results=results)


def error_response(request: Request, code: ErrorCode) -> Message:
    return _RESP[request.header.request_api_version](
        throttle_time_ms=0,
        results=[_RESULT(group_id=g, error_code=int(code))
                 for g in dict.fromkeys(request.body.groups_names)])
