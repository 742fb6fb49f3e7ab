"""Produce: validate batch headers, append whole batches to the log queue in one Redis round
trip, answer per the reliability level (on append, or once hardened for assured)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from proxy.context import KilnContext
from proxy.handlers.error_messages import bounded
from proxy.peer import CLIENT_HOST
from proxy.reply import Deferred
from storage.acks import AckOutcome
from storage.log_queue import AppendBatch, AppendRequest
from storage.model import Reliability, TopicPartition
from storage.policy.reliability import AckPoint, ack_point, requested_level
from wire.apis import CLIENT_APIS, ApiKey, Message, Request
from wire.errors import ErrorCode, KafkaError
from wire.txn_markers import batch_is_transactional as is_transactional_record_set
from wire.validation import RecordLimits, ValidatedBatch, validate_produce_records

log = logging.getLogger(__name__)

_RESP = CLIENT_APIS[ApiKey.PRODUCE].response
_TOPIC = _RESP.TopicProduceResponse
_PARTITION = _TOPIC.PartitionProduceResponse


@dataclass(slots=True)
class _Outcome:
    error_code: ErrorCode = ErrorCode.NONE
    base_offset: int = -1
    message: str | None = None
    # (incarnation, offset) of the last record appended: an assured ack waits until it is
    # hardened or delivered in that incarnation of the partition.
    wait_for: tuple[str, int] | None = None


def _fail(exc: KafkaError) -> _Outcome:
    return _Outcome(exc.error_code, -1, exc.message)


async def _plan(ctx: KilnContext, request: Request, outcomes: dict[TopicPartition, _Outcome]
                ) -> tuple[list[AppendRequest], list[AckPoint]]:
    """Validate every partition's records; return what to append and each one's ack point.
    Failures are written into `outcomes`."""
    body = request.body
    appends: list[AppendRequest] = []
    points: list[AckPoint] = []
    now = ctx.clock_ms()
    limits = RecordLimits(max_uncompressed_bytes=ctx.settings.max_frame_bytes)
    version = request.header.request_api_version
    for topic in body.topic_data:
        # Records first, as Kafka's broker validates them: a partition with one bad batch is
        # refused whole, the others go ahead, and a request refused everywhere must not
        # create its topic.
        valid: list[tuple[Any, ValidatedBatch, Reliability | None]] = []
        for part in topic.partition_data:
            try:
                if part.records is None:
                    raise KafkaError(ErrorCode.CORRUPT_MESSAGE, "no records")
                batch = validate_produce_records(part.records, now_ms=now, limits=limits,
                                                 api_version=version)
                if batch.header.is_transactional and ctx.transactions is None:
                    raise KafkaError(ErrorCode.INVALID_REQUEST,
                                     "transactions are off in this Kiln")
                asked = _header_level(batch)
            except KafkaError as exc:
                outcomes[TopicPartition(topic.name, part.index)] = _fail(exc)
                continue
            valid.append((part, batch, asked))
        if not valid:
            continue
        try:
            config = await ctx.topics.lookup(topic.name, allow_create=True)
            if config is None:
                raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {topic.name!r}")
        except KafkaError as exc:
            for part, _, _ in valid:
                outcomes[TopicPartition(topic.name, part.index)] = _fail(exc)
            continue
        for part, batch, asked in valid:
            level = requested_level(acks=body.acks, topic_default=config.reliability,
                                    topic_max=config.max_reliability,
                                    producer_override=config.producer_override,
                                    header_level=asked)
            tp = TopicPartition(topic.name, part.index)
            if not 0 <= part.index < config.partitions:
                outcomes[tp] = _fail(KafkaError(
                    ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                    f"{topic.name} has {config.partitions} partitions"))
                continue
            if not ctx.cluster.leads(tp):
                outcomes[tp] = _fail(ctx.not_leader(tp))
                continue
            header = batch.header
            # A produce request holds exactly one batch per partition (validated above).
            data = part.records if len(batch.data) == len(part.records) else bytes(batch.data)
            outcomes[tp] = _Outcome()
            appends.append(AppendRequest(tp, level, [AppendBatch(
                data, header.record_count, header.producer_id, header.producer_epoch,
                header.base_sequence, carries_kiln_header=batch.carries_kiln_header,
                transactional=header.is_transactional)]))
            # A transaction's records can be neither hardened nor delivered before it
            # commits, and its producer commits only once every produce is answered: they
            # are answered on append whatever the level (the commit answers for them).
            points.append(AckPoint.ON_APPEND if header.is_transactional else ack_point(level))
    return appends, points


def _carries_transactional_batches(body: Any) -> bool:
    return any(part.records is not None and is_transactional_record_set(part.records)
               for topic in body.topic_data for part in topic.partition_data)


def _header_level(batch: ValidatedBatch) -> Reliability | None:
    """The level a batch's `kiln.reliability` headers ask for: the strongest one named
    (the batch is stored and answered as one); None when no record names one."""
    if not batch.reliability_names:
        return None
    try:
        return max(Reliability.parse(name.decode()) for name in batch.reliability_names)
    except (UnicodeDecodeError, ValueError) as exc:
        raise KafkaError(ErrorCode.INVALID_RECORD, f"kiln.reliability header: {exc}") from None


async def handle(ctx: KilnContext, request: Request) -> Message | Deferred | None:
    body = request.body
    if body.acks not in (0, 1, -1):
        raise KafkaError(ErrorCode.INVALID_REQUIRED_ACKS, f"acks={body.acks}")
    if body.transactional_id is not None and ctx.transactions is None:
        raise KafkaError(ErrorCode.INVALID_REQUEST, "transactions are off in this Kiln")
    if body.transactional_id is None and _carries_transactional_batches(body):
        # As Kafka's broker: transactional records come with their transactional id.
        raise KafkaError(ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                         "transactional records without a transactional id")
    outcomes: dict[TopicPartition, _Outcome] = {}
    appends, points = await _plan(ctx, request, outcomes)
    sender = (request.header.client_id, CLIENT_HOST.get())
    results, throttle_ms = await ctx.log.append(appends, sender, ctx.clock_ms())
    for append, point, result in zip(appends, points, results, strict=True):
        outcome = outcomes[append.tp]
        outcome.error_code = result.error_code
        if result.error_code is not ErrorCode.NONE:
            outcome.message = result.error_code.name
            continue
        outcome.base_offset = result.base_offset
        if point is AckPoint.ON_HARDENED_OR_DELIVERED:
            outcome.wait_for = (result.incarnation,
                                result.base_offset + append.record_count - 1)
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


# What a producer waiting for an assured ack is told when it is not settled. Both are
# retriable: an idempotent producer's retry of records still buffered is answered with the
# original offset; records Redis lost are appended again.
_NOT_SETTLED = {
    AckOutcome.TIMED_OUT: (ErrorCode.REQUEST_TIMED_OUT,
                           "appended but not yet hardened within the request timeout"),
    AckOutcome.LOST: (ErrorCode.KAFKA_STORAGE_ERROR,
                      "Redis lost the records before they were hardened; send them again"),
}


async def _wait_for_guarantees(ctx: KilnContext, outcomes: dict[TopicPartition, _Outcome],
                               timeout_ms: int) -> None:
    waiting = [(tp, o, o.wait_for) for tp, o in outcomes.items() if o.wait_for is not None]
    if not waiting:
        return
    timeout_s = max(timeout_ms, 1) / 1000
    done = await asyncio.gather(*(ctx.log.wait_settled(tp, incarnation, last, timeout_s)
                                  for tp, _, (incarnation, last) in waiting))
    for (tp, outcome, _), settled in zip(waiting, done, strict=True):
        if settled is not AckOutcome.SETTLED:
            outcome.error_code, outcome.message = _NOT_SETTLED[settled]
            outcome.base_offset = -1
        if settled is AckOutcome.LOST and await ctx.topics.was_deleted(tp.topic):
            # Not lost by Redis but deleted (its partitions' state went with it): answered
            # as Kafka's broker answers a produce waiting on a partition deleted under it,
            # neither "safe" nor a loss to make up for by sending again.
            outcome.error_code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            outcome.message = f"topic {tp.topic!r} was deleted before the records were safe"


def _response(request: Request, outcomes: dict[TopicPartition, _Outcome],
              throttle_ms: int) -> Message:
    topics = []
    for topic in request.body.topic_data:
        partitions = []
        for part in topic.partition_data:
            outcome = outcomes.get(TopicPartition(topic.name, part.index), _Outcome())
            # A refused partition's answer carries no log start, as Kafka's does.
            log_start = 0 if outcome.error_code is ErrorCode.NONE else -1
            partitions.append(_PARTITION(
                index=part.index, error_code=int(outcome.error_code),
                base_offset=outcome.base_offset, log_append_time_ms=-1,
                log_start_offset=log_start, record_errors=[],
                error_message=bounded(outcome.message),
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
