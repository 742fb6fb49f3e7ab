"""Produce: validate batch headers, append whole batches to the log queue in one Redis round
trip, answer per the reliability level (on append, or once hardened for assured)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from proxy.protocol.apis import CLIENT_APIS, ApiKey, Message, Request
from proxy.protocol.batch import split_batches
from proxy.protocol.errors import ErrorCode, KafkaError
from proxy.server.context import KilnContext
from proxy.server.peer import CLIENT_HOST
from proxy.server.reply import Deferred
from storage.log_queue import AppendRequest
from storage.model import TopicPartition
from storage.policy.reliability import AckPoint, ack_point, requested_level

log = logging.getLogger(__name__)

_RESP = CLIENT_APIS[ApiKey.PRODUCE].response
_TOPIC = _RESP.TopicProduceResponse
_PARTITION = _TOPIC.PartitionProduceResponse


@dataclass(slots=True)
class _Outcome:
    error_code: ErrorCode = ErrorCode.NONE
    base_offset: int = -1
    message: str | None = None
    # Offset of the last record appended; an assured ack waits until it is hardened.
    wait_for: int | None = None


def _fail(exc: KafkaError) -> _Outcome:
    return _Outcome(exc.error_code, -1, exc.message)


async def _plan(ctx: KilnContext, request: Request, outcomes: dict[TopicPartition, _Outcome]
                ) -> tuple[list[AppendRequest], list[AckPoint], int]:
    """Validate every partition's records; return what to append, each one's ack point and
    the bytes to be appended. Failures are written into `outcomes`."""
    body = request.body
    appends: list[AppendRequest] = []
    points: list[AckPoint] = []
    total = 0
    for topic in body.topic_data:
        try:
            config = await ctx.catalog.lookup(topic.name, allow_create=True)
            if config is None:
                raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {topic.name!r}")
        except KafkaError as exc:
            for part in topic.partition_data:
                outcomes[TopicPartition(topic.name, part.index)] = _fail(exc)
            continue
        level = requested_level(acks=body.acks, topic_default=config.reliability,
                                topic_max=config.max_reliability,
                                producer_override=config.producer_override)
        for part in topic.partition_data:
            tp = TopicPartition(topic.name, part.index)
            try:
                if not 0 <= part.index < config.partitions:
                    raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                     f"{topic.name} has {config.partitions} partitions")
                if part.records is None:
                    raise KafkaError(ErrorCode.CORRUPT_MESSAGE, "no records")
                batches = []
                for header, view in split_batches(part.records):
                    if header.is_transactional:
                        raise KafkaError(ErrorCode.INVALID_REQUEST,
                                         "Kiln does not offer transactions")
                    data = part.records if len(view) == len(part.records) else bytes(view)
                    batches.append((data, header.record_count, header.producer_id,
                                    header.producer_epoch, header.base_sequence))
            except KafkaError as exc:
                outcomes[tp] = _fail(exc)
                continue
            outcomes[tp] = _Outcome()
            appends.append(AppendRequest(tp, level, batches))
            points.append(ack_point(level))
            total += len(part.records)
    return appends, points, total


async def handle(ctx: KilnContext, request: Request) -> Message | Deferred | None:
    body = request.body
    if body.acks not in (0, 1, -1):
        raise KafkaError(ErrorCode.INVALID_REQUIRED_ACKS, f"acks={body.acks}")
    if body.transactional_id is not None:
        raise KafkaError(ErrorCode.INVALID_REQUEST, "Kiln does not offer transactions")
    outcomes: dict[TopicPartition, _Outcome] = {}
    appends, points, total_bytes = await _plan(ctx, request, outcomes)
    throttle_ms = ctx.budget.admit(total_bytes) if appends else 0
    now = ctx.clock_ms()
    results = await ctx.queue.append(appends, now)
    sender = (request.header.client_id, CLIENT_HOST.get())
    records = 0
    for append, point, result in zip(appends, points, results, strict=True):
        outcome = outcomes[append.tp]
        outcome.error_code = result.error_code
        if result.error_code is not ErrorCode.NONE:
            outcome.message = result.error_code.name
            continue
        outcome.base_offset = result.base_offset
        ctx.appends.appended(append.tp)
        count = sum(b[1] for b in append.batches)
        size = sum(len(b[0]) for b in append.batches)
        records += count
        ctx.metrics.appended(append.tp.topic, append.reliability, count, size)
        ctx.delay.appended(append.tp, sender, count, size, result.base_offset + count, now)
        if point is AckPoint.ON_HARDENED_OR_DELIVERED:
            outcome.wait_for = result.base_offset + count - 1
    ctx.counters.records_in += records
    ctx.counters.bytes_in += total_bytes
    if body.acks == 0:
        return None
    if any(o.wait_for is not None for o in outcomes.values()):
        return Deferred(_answer_when_guaranteed(ctx, request, outcomes, throttle_ms))
    return _response(request, outcomes, throttle_ms)


async def _answer_when_guaranteed(ctx: KilnContext, request: Request,
                                  outcomes: dict[TopicPartition, _Outcome],
                                  throttle_ms: int) -> Message:
    await _wait_for_guarantees(ctx, outcomes, request.body.timeout_ms)
    return _response(request, outcomes, throttle_ms)


async def _wait_for_guarantees(ctx: KilnContext, outcomes: dict[TopicPartition, _Outcome],
                               timeout_ms: int) -> None:
    waiting = [(tp, o, o.wait_for) for tp, o in outcomes.items() if o.wait_for is not None]
    if not waiting:
        return
    timeout_s = max(timeout_ms, 1) / 1000
    done = await asyncio.gather(*(ctx.waiters.wait(tp, last, timeout_s)
                                  for tp, _, last in waiting))
    for (_, outcome, _), hardened in zip(waiting, done, strict=True):
        if not hardened:
            # Retriable: an idempotent producer's retry is answered with the original offset.
            outcome.error_code = ErrorCode.REQUEST_TIMED_OUT
            outcome.message = "appended but not yet hardened within the request timeout"


def _response(request: Request, outcomes: dict[TopicPartition, _Outcome],
              throttle_ms: int) -> Message:
    topics = []
    for topic in request.body.topic_data:
        partitions = []
        for part in topic.partition_data:
            outcome = outcomes.get(TopicPartition(topic.name, part.index), _Outcome())
            partitions.append(_PARTITION(
                index=part.index, error_code=int(outcome.error_code),
                base_offset=outcome.base_offset, log_append_time_ms=-1, log_start_offset=0,
                record_errors=[], error_message=outcome.message,
            ))
        topics.append(_TOPIC(name=topic.name, partition_responses=partitions))
    return _RESP[request.header.request_api_version](responses=topics,
                                                     throttle_time_ms=throttle_ms)


def error_response(request: Request, code: ErrorCode) -> Message:
    outcomes = {
        TopicPartition(t.name, p.index): _Outcome(code, -1, code.name)
        for t in request.body.topic_data for p in t.partition_data
    }
    return _response(request, outcomes, 0)
