"""DescribeConfigs: a topic's configs are Kafka's for the hardened topic plus Kiln's `kiln.*`
policies (storage.topic_configs); Kiln's node answers with the configs of the Kafka brokers
it stands for (storage.broker_configs). Other resource types are refused as Kafka refuses a
type it does not serve: INVALID_REQUEST, for that resource, or for the whole request when
the type is not one Kafka knows at all."""

from __future__ import annotations

from collections.abc import Sequence

from proxy.context import KilnContext
from proxy.handlers.error_messages import bounded
from storage.kafka.client import DescribedConfig, DescribedResource
from wire.apis import CLIENT_APIS, ApiKey, Message, Request
from wire.configs import ResourceType
from wire.errors import ErrorCode

_RESP = CLIENT_APIS[ApiKey.DESCRIBE_CONFIGS].response
_RESULT = _RESP.DescribeConfigsResult
_CONFIG = _RESULT.DescribeConfigsResourceResult
_SYNONYM = _CONFIG.DescribeConfigsSynonym
# Kafka's message for a request naming a resource type it does not know.
_MALFORMED = ("This most likely occurs because of a request being malformed by the client "
              "library or the message was sent to an incompatible broker. See the broker "
              "logs for more details.")


async def handle(ctx: KilnContext, request: Request) -> Message:
    body = request.body
    resources = list(body.resources)
    if not all(ResourceType.known(r.resource_type) for r in resources):
        return error_response(request, ErrorCode.INVALID_REQUEST, _MALFORMED)
    synonyms = bool(body.include_synonyms)
    documentation = bool(getattr(body, "include_documentation", False))  # v3+
    topics = [i for i, r in enumerate(resources) if r.resource_type == ResourceType.TOPIC]
    answers: dict[int, DescribedResource] = {}
    if topics:
        # One request to Kafka for all of them.
        described = await ctx.topic_configs.describe(
            [(resources[i].resource_name, resources[i].configuration_keys) for i in topics],
            include_synonyms=synonyms, include_documentation=documentation)
        answers.update(zip(topics, described, strict=True))
    for i, resource in enumerate(resources):
        if resource.resource_type == ResourceType.BROKER:
            answers[i] = await ctx.broker_configs.describe(
                resource.resource_name, resource.configuration_keys,
                include_synonyms=synonyms, include_documentation=documentation)
        elif i not in answers:
            kind = ResourceType(resource.resource_type).name
            answers[i] = DescribedResource(ErrorCode.INVALID_REQUEST,
                                           f"Kiln does not serve configs of {kind} resources")
    return _RESP[request.header.request_api_version](
        throttle_time_ms=0,
        results=[_result(resource.resource_type, resource.resource_name, answers[i])
                 for i, resource in enumerate(resources)])


def _result(resource_type: int, resource_name: str, answer: DescribedResource) -> Message:
    return _RESULT(error_code=int(answer.error_code), error_message=bounded(answer.error_message),
                   resource_type=resource_type, resource_name=resource_name,
                   configs=_configs(answer.configs))


def _configs(configs: Sequence[DescribedConfig]) -> list[Message]:
    return [_CONFIG(name=c.name, value=c.value, read_only=c.read_only,
                    config_source=int(c.config_source), is_default=False,
                    is_sensitive=c.is_sensitive,
                    synonyms=[_SYNONYM(name=s.name, value=s.value, source=int(s.source))
                              for s in c.synonyms],
                    config_type=int(c.config_type), documentation=c.documentation)
            for c in configs]


def error_response(request: Request, code: ErrorCode, message: str | None = None) -> Message:
    return _RESP[request.header.request_api_version](
        throttle_time_ms=0,
        results=[_result(r.resource_type, r.resource_name, DescribedResource(int(code), message))
                 for r in request.body.resources])
