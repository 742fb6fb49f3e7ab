"""AlterConfigs and IncrementalAlterConfigs: `kiln.*` topic configs change Kiln's policies
for the topic, the others are relayed to Kafka (storage.topic_configs); Kiln's node's configs
are relayed to the Kafka brokers it stands for (storage.broker_configs). Each resource
changes in full or not at all. Other resource types are refused with INVALID_REQUEST, as
Kafka refuses a type it does not serve, and so is a resource named twice in one request."""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable

from proxy.context import KilnContext
from proxy.handlers.error_messages import bounded
from storage.topic_configs import Altered, ConfigChange
from wire.apis import Message, Request
from wire.configs import ResourceType
from wire.errors import ErrorCode


async def alter(ctx: KilnContext, request: Request) -> Message:
    """AlterConfigs: each resource's dynamic configs are replaced by those given."""
    validate_only = bool(request.body.validate_only)

    async def one(resource: Message) -> Altered:
        kind, name = resource.resource_type, resource.resource_name
        values = [(c.name, c.value) for c in resource.configs]
        if kind == ResourceType.TOPIC:
            return await ctx.topic_configs.replace(name, values, validate_only=validate_only)
        if kind == ResourceType.BROKER:
            return await ctx.broker_configs.replace(name, values, validate_only=validate_only)
        return _unserved(kind)

    return _response(request, await _each(request, one))


async def incremental_alter(ctx: KilnContext, request: Request) -> Message:
    """IncrementalAlterConfigs: SET, DELETE, APPEND and SUBTRACT of single configs."""
    validate_only = bool(request.body.validate_only)

    async def one(resource: Message) -> Altered:
        kind, name = resource.resource_type, resource.resource_name
        changes = [ConfigChange(c.name, int(c.config_operation), c.value)
                   for c in resource.configs]
        if kind == ResourceType.TOPIC:
            return await ctx.topic_configs.alter_incrementally(name, changes,
                                                               validate_only=validate_only)
        if kind == ResourceType.BROKER:
            return await ctx.broker_configs.alter_incrementally(name, changes,
                                                                validate_only=validate_only)
        return _unserved(kind)

    return _response(request, await _each(request, one))


def _unserved(kind: int) -> Altered:
    if not ResourceType.known(kind):
        return Altered(ErrorCode.INVALID_REQUEST, f"Unknown resource type {kind}")
    return Altered(ErrorCode.INVALID_REQUEST,
                   f"Kiln does not serve configs of {ResourceType(kind).name} resources")


_DUPLICATE = Altered(ErrorCode.INVALID_REQUEST, "Each resource must appear at most once.")


async def _each(request: Request, one: Callable[[Message], Awaitable[Altered]]
                ) -> list[tuple[Message, Altered]]:
    """Every resource with its outcome, in the request's order; one whose type and name
    appear twice is refused (both times) and left as it is."""
    resources = list(request.body.resources)
    seen = Counter((r.resource_type, r.resource_name) for r in resources)
    return [(r, _DUPLICATE if seen[(r.resource_type, r.resource_name)] > 1 else await one(r))
            for r in resources]


def _response(request: Request, outcomes: list[tuple[Message, Altered]]) -> Message:
    response = request.spec.response
    entry = response.AlterConfigsResourceResponse
    return response[request.header.request_api_version](
        throttle_time_ms=0,
        responses=[entry(error_code=int(altered.error_code),
                         error_message=bounded(altered.error_message),
                         resource_type=resource.resource_type,
                         resource_name=resource.resource_name)
                   for resource, altered in outcomes])


def error_response(request: Request, code: ErrorCode) -> Message:
    return _response(request, [(r, Altered(int(code), None)) for r in request.body.resources])
