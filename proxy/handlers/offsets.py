"""OffsetCommit and OffsetFetch: committed offsets kept in Redis by the group coordinator.

A commit is validated as Kafka validates it (generation and member, or a simple commit by a
client that does not use group management; the member epoch, from v9, for a member of a
KIP-848 consumer group, which must commit and fetch at v9 or above), stored in Redis before
it is answered, and then reported to delivery (storage/delivery.py), which may make records
delivered. The report says whether a member of the group's current generation made the
commit: a standalone one never counts for a subscription the group registered itself
(docs/delivery.md).

The two writes are not one Redis transaction (the group's offsets and a partition's commits
live under different hash tags), so their order is what keeps a crash between them safe:
the stored commit first, delivery second, both while the group is locked. Delivery can lag
behind a stored commit (records are then hardened, not lost) but never run ahead of it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from proxy.context import KilnContext
from storage.errors import coordinator_errors, offset_fetch_errors
from storage.groups.model import CommittedOffset
from storage.model import TopicPartition
from wire.apis import CLIENT_APIS, ApiKey, Message, Request
from wire.errors import ErrorCode, KafkaError

_COMMIT = CLIENT_APIS[ApiKey.OFFSET_COMMIT].response
_COMMIT_TOPIC = _COMMIT.OffsetCommitResponseTopic
_COMMIT_PARTITION = _COMMIT_TOPIC.OffsetCommitResponsePartition
_FETCH = CLIENT_APIS[ApiKey.OFFSET_FETCH].response
_FETCH_TOPIC = _FETCH.OffsetFetchResponseTopic
_FETCH_PARTITION = _FETCH_TOPIC.OffsetFetchResponsePartition
_FETCH_GROUP = _FETCH.OffsetFetchResponseGroup
_FETCH_GROUP_TOPIC = _FETCH_GROUP.OffsetFetchResponseTopics
_FETCH_GROUP_PARTITION = _FETCH_GROUP_TOPIC.OffsetFetchResponsePartitions
_NOTHING_COMMITTED = CommittedOffset(-1, "", -1)


# --- OffsetCommit ------------------------------------------------------------------------


async def commit(ctx: KilnContext, request: Request) -> Message:
    body = request.body
    version = request.header.request_api_version
    with coordinator_errors():
        codes, wanted = await requested_offsets(ctx, body.topics, leader_epochs=version >= 6)
        if wanted:
            codes.update(await ctx.groups.commit_offsets(
                body.group_id, body.generation_id_or_member_epoch, body.member_id,
                body.group_instance_id if version >= 7 else None, wanted, version=version))
    return _commit_body(request, codes)


async def requested_offsets(ctx: KilnContext, topics: Any, *, leader_epochs: bool,
                            commit_timestamp_ms: int = -1
                            ) -> tuple[dict[TopicPartition, ErrorCode],
                                       dict[TopicPartition, CommittedOffset]]:
    """The offsets a commit request names, of the partitions that exist; the others get
    UNKNOWN_TOPIC_OR_PARTITION. Raises StorageError."""
    codes: dict[TopicPartition, ErrorCode] = {}
    wanted: dict[TopicPartition, CommittedOffset] = {}
    for topic in topics:
        for part in topic.partitions:
            tp = TopicPartition(topic.name, part.partition_index)
            if not await ctx.topics.has_partition(tp):
                codes[tp] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                continue
            wanted[tp] = CommittedOffset(
                part.committed_offset, part.committed_metadata,
                part.committed_leader_epoch if leader_epochs else -1, commit_timestamp_ms)
    return codes, wanted


def _commit_body(request: Request, codes: dict[TopicPartition, ErrorCode]) -> Message:
    topics = [
        _COMMIT_TOPIC(name=topic.name, partitions=[
            _COMMIT_PARTITION(partition_index=part.partition_index, error_code=int(
                codes.get(TopicPartition(topic.name, part.partition_index),
                          ErrorCode.UNKNOWN_SERVER_ERROR)))
            for part in topic.partitions])
        for topic in request.body.topics
    ]
    return _COMMIT[request.header.request_api_version](throttle_time_ms=0, topics=topics)


def commit_error(request: Request, code: ErrorCode) -> Message:
    every = {TopicPartition(t.name, p.partition_index): code
             for t in request.body.topics for p in t.partitions}
    return _commit_body(request, every)


# --- OffsetFetch -------------------------------------------------------------------------


async def fetch(ctx: KilnContext, request: Request) -> Message:
    body = request.body
    version = request.header.request_api_version
    if version >= 8:  # several groups per request, each answered on its own
        answers = []
        for group in body.groups:
            member_id, member_epoch = ((group.member_id, group.member_epoch) if version >= 9
                                       else (None, -1))
            try:
                with offset_fetch_errors():
                    answers.append(await _fetch_group(ctx, group.group_id, group.topics,
                                                      member_id, member_epoch,
                                                      body.require_stable))
            except KafkaError as exc:
                answers.append(_GroupOffsets(group.group_id, {}, {}, exc.error_code))
        return _fetch_groups_body(version, answers)
    with offset_fetch_errors():
        answer = await _fetch_group(ctx, body.group_id, body.topics, None, -1,
                                    version >= 7 and body.require_stable)
    return _fetch_body(request, answer.by_topic, answer.found, ErrorCode.NONE,
                       answer.unstable)


@dataclass(frozen=True, slots=True)
class _GroupOffsets:
    group_id: str
    by_topic: dict[str, list[int]]
    found: dict[TopicPartition, CommittedOffset]
    error_code: ErrorCode
    # require_stable (v7+, KIP-447): partitions with offsets waiting for a transaction to
    # end, answered UNSTABLE_OFFSET_COMMIT (retriable) instead of their offset.
    unstable: frozenset[TopicPartition] = frozenset()


async def _fetch_group(ctx: KilnContext, group_id: str, topics: Any,
                       member_id: str | None, member_epoch: int,
                       require_stable: bool = False) -> _GroupOffsets:
    """One group's committed offsets: of `topics` (name and partition_indexes each), or of
    every partition the group has committed when None. A member of a consumer group
    (OffsetFetch v9+) must be one, at its epoch."""
    code = await ctx.groups.validate_fetch(group_id, member_id, member_epoch)
    if code is not ErrorCode.NONE:
        return _GroupOffsets(group_id, {}, {}, code)
    unstable: frozenset[TopicPartition] = frozenset()
    if require_stable and ctx.transactions is not None:
        unstable = frozenset(await ctx.transactions.unstable_partitions(group_id))
    if topics is None:
        found = await ctx.groups.fetch_offsets(group_id, None)
        by_topic: dict[str, list[int]] = {}
        for tp in sorted(found, key=lambda tp: (tp.topic, tp.partition)):
            by_topic.setdefault(tp.topic, []).append(tp.partition)
    else:
        by_topic = {t.name: list(t.partition_indexes) for t in topics}
        tps = [TopicPartition(name, p) for name, parts in by_topic.items() for p in parts]
        found = await ctx.groups.fetch_offsets(group_id, tps)
    return _GroupOffsets(group_id, by_topic, found, ErrorCode.NONE, unstable)


def _committed(by_topic: dict[str, list[int]], found: dict[TopicPartition, CommittedOffset],
               unstable: frozenset[TopicPartition] = frozenset(), code: ErrorCode = ErrorCode.NONE
               ) -> Iterator[tuple[str, list[tuple[int, CommittedOffset, ErrorCode]]]]:
    for name, partitions in by_topic.items():
        entries = []
        for p in partitions:
            tp = TopicPartition(name, p)
            if tp in unstable:
                entries.append((p, _NOTHING_COMMITTED, ErrorCode.UNSTABLE_OFFSET_COMMIT))
            else:
                entries.append((p, found.get(tp, _NOTHING_COMMITTED), code))
        yield name, entries


def _fetch_body(request: Request, by_topic: dict[str, list[int]],
                found: dict[TopicPartition, CommittedOffset], code: ErrorCode,
                unstable: frozenset[TopicPartition] = frozenset()) -> Message:
    topics = [
        _FETCH_TOPIC(name=name, partitions=[
            _FETCH_PARTITION(partition_index=partition, committed_offset=committed.offset,
                             committed_leader_epoch=committed.leader_epoch,
                             metadata=committed.metadata, error_code=int(partition_code))
            for partition, committed, partition_code in entries])
        for name, entries in _committed(by_topic, found, unstable, code)
    ]
    return _FETCH[request.header.request_api_version](throttle_time_ms=0, error_code=int(code),
                                                      topics=topics)


def _fetch_groups_body(version: int, answers: list[_GroupOffsets]) -> Message:
    groups = [
        _FETCH_GROUP(group_id=answer.group_id, error_code=int(answer.error_code), topics=[
            _FETCH_GROUP_TOPIC(name=name, partitions=[
                _FETCH_GROUP_PARTITION(partition_index=partition,
                                       committed_offset=committed.offset,
                                       committed_leader_epoch=committed.leader_epoch,
                                       metadata=committed.metadata,
                                       error_code=int(partition_code))
                for partition, committed, partition_code in entries])
            for name, entries in _committed(answer.by_topic, answer.found,
                                            answer.unstable)])
        for answer in answers
    ]
    return _FETCH[version](throttle_time_ms=0, groups=groups)


def fetch_error(request: Request, code: ErrorCode) -> Message:
    """As Kafka: v8+ carries the error per group, v2+ at the top with no partitions; v1 has
    no top-level error, so every requested partition carries it."""
    version = request.header.request_api_version
    if version >= 8:
        return _fetch_groups_body(version, [_GroupOffsets(g.group_id, {}, {}, code)
                                            for g in request.body.groups])
    if version >= 2 or request.body.topics is None:
        return _fetch_body(request, {}, {}, code)
    by_topic = {t.name: list(t.partition_indexes) for t in request.body.topics}
    return _fetch_body(request, by_topic, {}, code)
