"""The transaction APIs of a transactional producer: AddPartitionsToTxn (the client
versions, 0-3), AddOffsetsToTxn and EndTxn (0-4, transactions V1) to its transaction
coordinator, TxnOffsetCommit (0-4) to the group's. The coordinators
(storage.transactions.coordinator, storage.groups) decide; these only translate."""

from __future__ import annotations

from dataclasses import replace

from proxy.context import KilnContext, Transactions
from proxy.handlers.offsets import requested_offsets
from storage.errors import coordinator_errors
from storage.model import TopicPartition
from wire.apis import CLIENT_APIS, ApiKey, Message, Request
from wire.errors import ErrorCode, KafkaError

_ADD_RESP = CLIENT_APIS[ApiKey.ADD_PARTITIONS_TO_TXN].response
_ADD_TOPIC = _ADD_RESP.AddPartitionsToTxnTopicResult
_ADD_PARTITION = _ADD_TOPIC.AddPartitionsToTxnPartitionResult
_END_RESP = CLIENT_APIS[ApiKey.END_TXN].response


def for_version(code: ErrorCode, version: int, fenced_since: int = 2) -> ErrorCode:
    """PRODUCER_FENCED as the request's version knows it: older clients do not know the code
    (Kafka 2.7 added it), and Kafka answers them INVALID_PRODUCER_EPOCH instead."""
    if code is ErrorCode.PRODUCER_FENCED and version < fenced_since:
        return ErrorCode.INVALID_PRODUCER_EPOCH
    return code


def enabled(ctx: KilnContext) -> Transactions:
    if ctx.transactions is None:
        raise KafkaError(ErrorCode.INVALID_REQUEST,
                         "transactions are off in this Kiln (transactions_enabled)")
    return ctx.transactions


async def add_partitions(ctx: KilnContext, request: Request) -> Message:
    body = request.body
    transactions = enabled(ctx)
    wanted = [TopicPartition(t.name, p) for t in body.v3_and_below_topics
              for p in t.partitions]
    # As Kafka's broker: partitions of unknown topics fail, and then the others are not
    # attempted at all.
    unknown = {tp for tp in wanted if not await ctx.topics.has_partition(tp)}
    if unknown:
        codes = {tp: ErrorCode.UNKNOWN_TOPIC_OR_PARTITION if tp in unknown
                 else ErrorCode.OPERATION_NOT_ATTEMPTED for tp in wanted}
    else:
        code = await transactions.add_partitions(
            body.v3_and_below_transactional_id, body.v3_and_below_producer_id,
            body.v3_and_below_producer_epoch, wanted)
        codes = dict.fromkeys(wanted, for_version(code, request.header.request_api_version))
    return _add_response(request, codes)


def _add_response(request: Request, codes: dict[TopicPartition, ErrorCode]) -> Message:
    topics = [_ADD_TOPIC(name=t.name, results_by_partition=[
        _ADD_PARTITION(partition_index=p,
                       partition_error_code=int(codes[TopicPartition(t.name, p)]))
        for p in t.partitions]) for t in request.body.v3_and_below_topics]
    return _ADD_RESP[request.header.request_api_version](
        throttle_time_ms=0, results_by_topic_v3_and_below=topics)


def add_partitions_error(request: Request, code: ErrorCode) -> Message:
    return _add_response(request, {TopicPartition(t.name, p): code
                                   for t in request.body.v3_and_below_topics
                                   for p in t.partitions})


async def end_transaction(ctx: KilnContext, request: Request) -> Message:
    body = request.body
    code = await enabled(ctx).end_transaction(body.transactional_id, body.producer_id,
                                              body.producer_epoch, bool(body.committed))
    return end_transaction_error(request, for_version(code, request.header.request_api_version))


def end_transaction_error(request: Request, code: ErrorCode) -> Message:
    return _END_RESP[request.header.request_api_version](throttle_time_ms=0,
                                                         error_code=int(code))


# --- offsets in transactions ----------------------------------------------------------------

_OFFSETS_RESP = CLIENT_APIS[ApiKey.ADD_OFFSETS_TO_TXN].response
_COMMIT_RESP = CLIENT_APIS[ApiKey.TXN_OFFSET_COMMIT].response
_COMMIT_TOPIC = _COMMIT_RESP.TxnOffsetCommitResponseTopic
_COMMIT_PARTITION = _COMMIT_TOPIC.TxnOffsetCommitResponsePartition


async def add_offsets(ctx: KilnContext, request: Request) -> Message:
    body = request.body
    code = await enabled(ctx).add_offsets(body.transactional_id, body.producer_id,
                                          body.producer_epoch, body.group_id)
    return add_offsets_error(request, for_version(code, request.header.request_api_version))


def add_offsets_error(request: Request, code: ErrorCode) -> Message:
    return _OFFSETS_RESP[request.header.request_api_version](throttle_time_ms=0,
                                                             error_code=int(code))


async def txn_offset_commit(ctx: KilnContext, request: Request) -> Message:
    """TxnOffsetCommit, sent to the group's coordinator: the committer is checked as an
    OffsetCommit's (v3+ name it; older versions are not checked, as in Kafka), then the
    offsets wait with the transaction until it ends."""
    body = request.body
    version = request.header.request_api_version
    transactions = enabled(ctx)
    if ctx.cluster.coordinator(body.group_id) != ctx.settings.node_id:
        return txn_offset_commit_error(request, ErrorCode.NOT_COORDINATOR)
    with coordinator_errors():
        codes, wanted = await requested_offsets(ctx, body.topics, leader_epochs=version >= 2,
                                                commit_timestamp_ms=ctx.clock_ms())
        # A null metadata is stored as the empty one, as OffsetCommit's is.
        wanted = {tp: replace(c, metadata=c.metadata or "") for tp, c in wanted.items()}
        generation = body.generation_id if version >= 3 else -1
        member = body.member_id if version >= 3 else ""
        if wanted and (generation >= 0 or member):
            refused = await ctx.groups.validate_transactional_commit(
                body.group_id, generation, member,
                body.group_instance_id if version >= 3 else None, list(wanted),
                # A KIP-848 member names its epoch as OffsetCommit v9 does.
                version=9)
            for tp, code in refused.items():
                # Kafka's group coordinator answers a stale member epoch so here.
                codes[tp] = (ErrorCode.ILLEGAL_GENERATION
                             if code is ErrorCode.STALE_MEMBER_EPOCH else code)
                del wanted[tp]
    if wanted:
        code = await transactions.stage_offsets(body.group_id, body.producer_id,
                                                body.producer_epoch, wanted)
        codes.update(dict.fromkeys(wanted, code))
    return _commit_body(request, codes)


def _commit_body(request: Request, codes: dict[TopicPartition, ErrorCode]) -> Message:
    topics = [_COMMIT_TOPIC(name=t.name, partitions=[
        _COMMIT_PARTITION(partition_index=p.partition_index, error_code=int(
            codes.get(TopicPartition(t.name, p.partition_index),
                      ErrorCode.UNKNOWN_SERVER_ERROR)))
        for p in t.partitions]) for t in request.body.topics]
    return _COMMIT_RESP[request.header.request_api_version](throttle_time_ms=0, topics=topics)


def txn_offset_commit_error(request: Request, code: ErrorCode) -> Message:
    return _commit_body(request, {TopicPartition(t.name, p.partition_index): code
                                  for t in request.body.topics for p in t.partitions})
