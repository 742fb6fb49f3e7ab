"""Routes a decoded request to its handler; the one place that turns any unexpected
exception into UNKNOWN_SERVER_ERROR (logged once, with its traceback)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from proxy.context import KilnContext
from proxy.handlers import (
    alter_configs,
    api_versions,
    consumer_groups,
    create_partitions,
    create_topics,
    delete_groups,
    delete_records,
    delete_topics,
    describe_cluster,
    describe_configs,
    fetch,
    find_coordinator,
    groups,
    init_producer_id,
    list_offsets,
    metadata,
    offset_delete,
    offset_for_leader_epoch,
    offsets,
    produce,
    sasl,
    transaction_admin,
    transactions,
)
from proxy.reply import Deferred
from proxy.request_metrics import API_LABELS
from wire.apis import ApiKey, Message, Request, encode_response, error_response
from wire.errors import ErrorCode, KafkaError

log = logging.getLogger(__name__)

Handler = Callable[[KilnContext, Request], Awaitable[Message | Deferred | None]]
ErrorBuilder = Callable[[Request, ErrorCode], Message]

HANDLERS: dict[int, tuple[Handler, ErrorBuilder | None]] = {
    ApiKey.API_VERSIONS: (api_versions.handle, None),
    ApiKey.METADATA: (metadata.handle, None),
    ApiKey.SASL_HANDSHAKE: (sasl.handle, None),
    ApiKey.SASL_AUTHENTICATE: (sasl.handle, None),
    ApiKey.PRODUCE: (produce.handle, produce.error_response),
    ApiKey.INIT_PRODUCER_ID: (init_producer_id.handle, init_producer_id.error_response),
    ApiKey.CREATE_TOPICS: (create_topics.handle, create_topics.error_response),
    ApiKey.DELETE_TOPICS: (delete_topics.handle, delete_topics.error_response),
    ApiKey.CREATE_PARTITIONS: (create_partitions.handle, create_partitions.error_response),
    ApiKey.DESCRIBE_CONFIGS: (describe_configs.handle, describe_configs.error_response),
    ApiKey.ALTER_CONFIGS: (alter_configs.alter, alter_configs.error_response),
    ApiKey.INCREMENTAL_ALTER_CONFIGS: (alter_configs.incremental_alter,
                                       alter_configs.error_response),
    ApiKey.DESCRIBE_CLUSTER: (describe_cluster.handle, describe_cluster.error_response),
    ApiKey.FETCH: (fetch.handle, fetch.error_response),
    ApiKey.LIST_OFFSETS: (list_offsets.handle, None),
    ApiKey.OFFSET_FOR_LEADER_EPOCH: (offset_for_leader_epoch.handle, None),
    ApiKey.DELETE_RECORDS: (delete_records.handle, delete_records.error_response),
    ApiKey.FIND_COORDINATOR: (find_coordinator.handle, find_coordinator.error_response),
    ApiKey.JOIN_GROUP: (groups.join, groups.join_error),
    ApiKey.SYNC_GROUP: (groups.sync, groups.sync_error),
    ApiKey.HEARTBEAT: (groups.heartbeat, groups.heartbeat_error),
    ApiKey.LEAVE_GROUP: (groups.leave, groups.leave_error),
    ApiKey.DESCRIBE_GROUPS: (groups.describe, groups.describe_error),
    ApiKey.LIST_GROUPS: (groups.list_groups, groups.list_groups_error),
    ApiKey.OFFSET_COMMIT: (offsets.commit, offsets.commit_error),
    ApiKey.OFFSET_FETCH: (offsets.fetch, offsets.fetch_error),
    ApiKey.CONSUMER_GROUP_HEARTBEAT: (consumer_groups.heartbeat,
                                      consumer_groups.heartbeat_error),
    ApiKey.CONSUMER_GROUP_DESCRIBE: (consumer_groups.describe,
                                     consumer_groups.describe_error),
    ApiKey.DELETE_GROUPS: (delete_groups.handle, delete_groups.error_response),
    ApiKey.OFFSET_DELETE: (offset_delete.handle, offset_delete.error_response),
    ApiKey.ADD_PARTITIONS_TO_TXN: (transactions.add_partitions,
                                   transactions.add_partitions_error),
    ApiKey.END_TXN: (transactions.end_transaction, transactions.end_transaction_error),
    ApiKey.ADD_OFFSETS_TO_TXN: (transactions.add_offsets, transactions.add_offsets_error),
    ApiKey.TXN_OFFSET_COMMIT: (transactions.txn_offset_commit,
                               transactions.txn_offset_commit_error),
    ApiKey.DESCRIBE_TRANSACTIONS: (transaction_admin.describe, transaction_admin.describe_error),
    ApiKey.LIST_TRANSACTIONS: (transaction_admin.list_transactions,
                               transaction_admin.list_error),
}


def expects_response(request: Request) -> bool:
    """Produce with acks=0 is never answered, not even with an error."""
    return not (request.spec.api_key == ApiKey.PRODUCE and request.body.acks == 0)


def failure_response(request: Request, code: ErrorCode) -> Message:
    builder = HANDLERS[request.spec.api_key][1]
    if builder is not None:
        return builder(request, code)
    return error_response(request.spec, request.header.request_api_version, code)


async def dispatch(ctx: KilnContext, request: Request) -> asyncio.Future[bytes | None]:
    """Process `request` now; the returned future holds its response frame (None when none
    is to be sent). It is already done unless the handler deferred its answer."""
    ctx.metrics.requested(API_LABELS[request.spec.api_key.name])
    log.debug("request %s v%d correlation_id=%d client_id=%s", request.spec.api_key.name,
              request.header.request_api_version, request.header.correlation_id,
              request.header.client_id)
    handler, _ = HANDLERS[request.spec.api_key]
    outcome = await _answer(ctx, request, handler(ctx, request))
    if isinstance(outcome, Deferred):
        return asyncio.ensure_future(_deferred(ctx, request, outcome))
    done: asyncio.Future[bytes | None] = asyncio.get_running_loop().create_future()
    done.set_result(outcome)
    return done


async def _deferred(ctx: KilnContext, request: Request, deferred: Deferred) -> bytes | None:
    outcome = await _answer(ctx, request, deferred.answer)
    assert not isinstance(outcome, Deferred), "a deferred answer cannot defer again"
    return outcome


async def _answer(ctx: KilnContext, request: Request, work: Awaitable[object]
                  ) -> bytes | Deferred | None:
    try:
        body = await work
        if body is None or isinstance(body, Deferred):
            return body
        return encode_response(request, body)
    except KafkaError as exc:
        ctx.metrics.failed(exc, "request")
        if not expects_response(request):
            return None
        log.info("%s failed for client %s: %s", request.spec.api_key.name,
                 request.header.client_id, exc)
        return encode_response(request, failure_response(request, exc.error_code))
    except Exception:
        log.exception("unexpected failure in %s (correlation_id=%d, client_id=%s)",
                      request.spec.api_key.name, request.header.correlation_id,
                      request.header.client_id)
        if not expects_response(request):
            return None
        return encode_response(request, failure_response(request, ErrorCode.UNKNOWN_SERVER_ERROR))
