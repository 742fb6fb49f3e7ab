"""DescribeTransactions and ListTransactions (KIP-664): what operators' tools
(`kafka-transactions list|describe`, admin clients) ask each broker about the transactional
ids its coordinator holds. Each Kiln node answers for the ids placed on it; the admin client
asks every node and merges, as it does with Kafka's brokers."""

from __future__ import annotations

from collections import defaultdict

from proxy.context import KilnContext
from proxy.handlers.transactions import enabled
from storage.errors import coordinator_errors
from storage.transactions.state import TxnState, TxnStatus
from wire.apis import CLIENT_APIS, ApiKey, Message, Request
from wire.errors import ErrorCode

_DESCRIBE = CLIENT_APIS[ApiKey.DESCRIBE_TRANSACTIONS].response
_DESCRIBED = _DESCRIBE.TransactionState
_TOPIC = _DESCRIBED.TopicData
_LIST = CLIENT_APIS[ApiKey.LIST_TRANSACTIONS].response
_LISTED = _LIST.TransactionState
_STATE_NAMES = frozenset(status.value for status in TxnStatus) | {"PrepareEpochFence"}


async def describe(ctx: KilnContext, request: Request) -> Message:
    transactions = enabled(ctx)
    described = []
    for tid in request.body.transactional_ids:
        code, state = await transactions.describe(tid)
        described.append(_described(tid, code, state))
    return _DESCRIBE[request.header.request_api_version](throttle_time_ms=0,
                                                        transaction_states=described)


def _described(tid: str, code: ErrorCode, state: TxnState | None) -> Message:
    if state is None:
        # The schema's defaults, as Kafka leaves them in an entry that failed.
        return _DESCRIBED(error_code=int(code), transactional_id=tid, transaction_state="",
                          transaction_timeout_ms=0, transaction_start_time_ms=0,
                          producer_id=0, producer_epoch=0, topics=[])
    by_topic: dict[str, list[int]] = defaultdict(list)
    for topic, partition in sorted(state.partitions):
        by_topic[topic].append(partition)
    return _DESCRIBED(
        error_code=0, transactional_id=tid, transaction_state=state.status.value,
        transaction_timeout_ms=state.timeout_ms, transaction_start_time_ms=state.start_ms,
        producer_id=state.producer_id, producer_epoch=state.producer_epoch,
        topics=[_TOPIC(topic=topic, partitions=parts) for topic, parts in by_topic.items()])


def describe_error(request: Request, code: ErrorCode) -> Message:
    return _DESCRIBE[request.header.request_api_version](
        throttle_time_ms=0,
        transaction_states=[_described(tid, code, None)
                            for tid in request.body.transactional_ids])


async def list_transactions(ctx: KilnContext, request: Request) -> Message:
    body = request.body
    version = request.header.request_api_version
    transactions = enabled(ctx)
    wanted = set(body.state_filters or ())
    unknown = sorted(wanted - _STATE_NAMES)
    producers = set(body.producer_id_filters or ())
    # v1+ (KIP-994): only transactions running longer than this; -1: all.
    older_than = body.duration_filter if version >= 1 else -1
    now = ctx.clock_ms()
    listed = []
    if not wanted or wanted & _STATE_NAMES:
        with coordinator_errors(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS):
            states = await transactions.coordinated()
        for state in states:
            if wanted and state.status.value not in wanted:
                continue
            if producers and state.producer_id not in producers:
                continue
            if older_than >= 0 and (state.start_ms < 0 or now - state.start_ms < older_than):
                continue
            listed.append(_LISTED(transactional_id=state.transactional_id,
                                  producer_id=state.producer_id,
                                  transaction_state=state.status.value))
    return _LIST[version](throttle_time_ms=0, error_code=0, unknown_state_filters=unknown,
                          transaction_states=listed)


def list_error(request: Request, code: ErrorCode) -> Message:
    return _LIST[request.header.request_api_version](
        throttle_time_ms=0, error_code=int(code), unknown_state_filters=[],
        transaction_states=[])
