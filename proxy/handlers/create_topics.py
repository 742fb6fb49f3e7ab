"""CreateTopics: creates the topic in Kafka (the hardened store), then in Kiln.

Topic configs named `kiln.*` set Kiln's policy for the topic (reliability, harden, ...) and
are checked by Kiln; the others are Kafka's, checked by Kafka (with `validate_only` when the
client asks for it) and set on the hardened topic. Either refusal comes before anything is
created anywhere. A manual replica assignment goes to Kafka as given (the partition count is
the assignment's). The answer carries what Kafka made of the topic: its partition count,
replication factor and configs, with Kiln's `kiln.*` ones among them."""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from proxy.context import KilnContext
from proxy.handlers.admin_requests import DUPLICATE_NAME, given_twice
from proxy.handlers.error_messages import bounded
from storage.catalog import CreatedTopic
from storage.topics import kiln_configs
from wire.apis import CLIENT_APIS, ApiKey, Message, Request
from wire.configs import ConfigSource
from wire.errors import ErrorCode, KafkaError

_RESP = CLIENT_APIS[ApiKey.CREATE_TOPICS].response
_RESULT = _RESP.CreatableTopicResult
_CONFIG = _RESULT.CreatableTopicConfigs
_ZERO_UUID = uuid.UUID(int=0)


def _result(name: str, code: ErrorCode, message: str | None = None) -> Message:
    return _RESULT(name=name, topic_id=_ZERO_UUID, error_code=int(code),
                   error_message=bounded(message), topic_config_error_code=0,
                   num_partitions=-1, replication_factor=-1, configs=[])


def _created(name: str, created: CreatedTopic, given: Sequence[str]) -> Message:
    configs = [_CONFIG(name=c.name, value=None if c.is_sensitive else c.value,
                       read_only=c.read_only, config_source=c.config_source,
                       is_sensitive=c.is_sensitive)
               for c in created.kafka_configs]
    configs += [_CONFIG(name=key, value=value, read_only=False, is_sensitive=False,
                        config_source=ConfigSource.TOPIC_CONFIG if key in given
                        else ConfigSource.DEFAULT_CONFIG)
                for key, value in sorted(kiln_configs(created.topic).items())]
    return _RESULT(name=name, topic_id=created.topic.uuid, error_code=0, error_message=None,
                   topic_config_error_code=0, num_partitions=created.topic.partitions,
                   replication_factor=created.replication_factor, configs=configs)


def _assignments(topic: Message) -> dict[int, list[int]] | None:
    """partition -> brokers, or None when Kafka is to place the partitions."""
    if not topic.assignments:
        return None
    assignments: dict[int, list[int]] = {}
    for assignment in topic.assignments:
        if assignment.partition_index in assignments:
            raise KafkaError(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                             "Found multiple manual partition assignments for partition "
                             f"{assignment.partition_index}")
        assignments[assignment.partition_index] = list(assignment.broker_ids)
    return assignments


async def _create(ctx: KilnContext, topic: Message, validate_only: bool) -> Message:
    assignments = _assignments(topic)
    # -1 without an assignment: the default count (Kiln's, or else Kafka's num.partitions).
    partitions = None if topic.num_partitions == -1 and assignments is None \
        else int(topic.num_partitions)
    configs = {c.name: c.value for c in topic.configs}
    created = await ctx.topics.create_and_describe(
        topic.name, partitions, require_kafka=True, validate_only=validate_only,
        configs=configs, replication_factor=int(topic.replication_factor),
        assignments=assignments)
    return _created(topic.name, created, list(configs))


async def handle(ctx: KilnContext, request: Request) -> Message:
    body = request.body
    duplicates = given_twice(topic.name for topic in body.topics)
    results = [_result(name, ErrorCode.INVALID_REQUEST, DUPLICATE_NAME) for name in duplicates]
    for topic in body.topics:
        if topic.name in duplicates:
            continue
        try:
            results.append(await _create(ctx, topic, bool(body.validate_only)))
        except KafkaError as exc:
            results.append(_result(topic.name, exc.error_code, exc.message))
    return _RESP[request.header.request_api_version](throttle_time_ms=0, topics=results)


def error_response(request: Request, code: ErrorCode) -> Message:
    return _RESP[request.header.request_api_version](
        throttle_time_ms=0, topics=[_result(t.name, code) for t in request.body.topics]
    )
