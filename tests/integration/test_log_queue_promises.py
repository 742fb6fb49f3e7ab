"""The log queue's own promises, against a real Redis: a partition Redis lost is never
appended to as if new, a request is appended whole or not at all, idempotent producers are
checked as Kafka checks them, and their state does not grow forever."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import redis

from storage import redis_pool
from storage.errors import Fenced, PartitionLost
from storage.leadership import lease_key
from storage.log_queue import AppendBatch, AppendRequest, AppendResult, Lease, LogQueue
from storage.model import Reliability, TopicPartition
from storage.topics import new_topic, with_kiln_configs
from tests.raw_client import record_batch
from wire.errors import ErrorCode, KafkaError

T = TypeVar("T")
TP = TopicPartition("orders", 0)


# The partition's leader lease, as storage.leadership writes it: appends are made under it.
TOKEN = "1 0 this-process"


def run(redis_url: str, body: Callable[[LogQueue], Awaitable[T]]) -> T:
    async def main() -> T:
        queue = LogQueue(redis_pool.connect(redis_url, max_connections=4))
        try:
            return await body(queue)
        finally:
            await queue.close()
    return asyncio.run(main())


def batch(values: list[bytes], producer: tuple[int, int, int] = (-1, -1, -1)) -> AppendBatch:
    data = record_batch(values, producer)
    return AppendBatch(data, len(values), *producer)


async def append(queue: LogQueue, *batches: AppendBatch, now: int = 1000) -> AppendResult:
    # This process leads the partition, unless a test gave the lease to another.
    await queue.redis.set(lease_key(TP), TOKEN, nx=True)
    [result] = await queue.append([AppendRequest(TP, Reliability.RELIABLE_PERSISTENT,
                                                 list(batches))], now, [TOKEN])
    return result


def test_an_append_under_a_lease_another_node_took_stores_nothing(
        redis_client: redis.Redis, redis_url: str) -> None:
    # Given a partition appended to under this process's lease, which another node then took
    # (this process was paused past its session)
    async def scenario(queue: LogQueue) -> tuple[AppendResult, AppendResult, int]:
        await queue.initialize(TP, 0)
        before = await append(queue, batch([b"a", b"b"]))
        redis_client.set(lease_key(TP), "2 1 another-process")
        # When this process appends again with the token it holds
        fenced = await append(queue, batch([b"c"]))
        return before, fenced, (await queue.state(TP)).next_offset

    before, fenced, next_offset = run(redis_url, scenario)

    # Then it is told it no longer leads the partition, and nothing is stored
    assert (before.error_code, before.base_offset) == (ErrorCode.NONE, 0)
    assert fenced.error_code is ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert next_offset == 2
    assert redis_client.xlen(f"kiln:{{{TP.topic}/{TP.partition}}}:log") == 1


def test_a_partition_redis_does_not_know_is_not_appended_to(
        redis_client: redis.Redis, redis_url: str) -> None:
    # Given a partition that was started and appended to, whose state Redis then lost
    async def scenario(queue: LogQueue) -> tuple[AppendResult, AppendResult, int]:
        await queue.initialize(TP, 40)
        before = await append(queue, batch([b"a", b"b"]))
        redis_client.delete(f"kiln:{{{TP.topic}/{TP.partition}}}:meta")
        # When a producer appends to it
        lost = await append(queue, batch([b"c"]))
        return before, lost, (await queue.state(TP)).next_offset

    before, lost, next_offset = run(redis_url, scenario)

    # Then nothing is appended: the caller must start it again from Kafka first
    assert (before.error_code, before.base_offset) == (ErrorCode.NONE, 40)
    assert lost.needs_start and lost.base_offset == -1
    assert next_offset == 0  # no state was created by the refused append


def test_a_new_incarnation_is_told_apart_and_a_pass_over_the_old_one_trims_nothing(
        redis_client: redis.Redis, redis_url: str) -> None:
    # Given a read of a partition's batches, after which Redis lost it and Kiln started it
    # again at the same offset
    async def scenario(queue: LogQueue) -> tuple[str, str, bool, int]:
        await queue.initialize(TP, 0)
        old = await append(queue, batch([b"a"]))
        read = await queue.read(TP, 1 << 20)
        redis_client.flushdb()
        await queue.initialize(TP, 0)
        new = await append(queue, batch([b"b"]))
        # When the hardener finishes its pass over what it read
        try:
            await queue.finish_pass(TP, read.incarnation, owner="hardener",
                                    trim_below=read.batches[-1].next_offset,
                                    hardened_below=read.batches[-1].next_offset,
                                    written_records=1, written_bytes=1)
            refused = False
        except PartitionLost:
            refused = True
        return old.incarnation, new.incarnation, refused, (await queue.state(TP)).buffered_records

    old, new, refused, buffered = run(redis_url, scenario)

    # Then the incarnations differ, and the new incarnation's record stays buffered
    assert old and new and old != new
    assert refused
    assert buffered == 1


def test_a_hardening_lease_is_taken_at_once_from_an_owner_no_longer_live(
        redis_client: redis.Redis, redis_url: str) -> None:
    # Given a partition whose hardening lease A holds, for a minute
    async def scenario(queue: LogQueue) -> tuple[Lease, Lease, Lease]:
        redis_client.flushdb()
        assert await queue.acquire_lease(TP, "A", 60_000) is Lease.HELD
        # When B asks for it while A is live, then once A is not among the live owners
        while_live = await queue.acquire_lease(TP, "B", 60_000, ["A", "B"])
        once_gone = await queue.acquire_lease(TP, "B", 60_000, ["B"])
        # and A, back, asks while B is live
        back = await queue.acquire_lease(TP, "A", 60_000, ["A", "B"])
        return while_live, once_gone, back

    while_live, once_gone, back = run(redis_url, scenario)

    # Then B waits while A lives, takes it over (to be fenced in Kafka) once A is gone, and
    # A does not get it back from a live B
    assert (while_live, once_gone, back) == (Lease.REFUSED, Lease.TAKEN_OVER, Lease.REFUSED)


def test_a_pass_by_a_paused_owner_whose_lease_was_taken_over_changes_nothing(
        redis_client: redis.Redis, redis_url: str) -> None:
    # Given a partition hardened by A, who read its batches and then paused past its lease,
    # and B, who took the lease over
    async def scenario(queue: LogQueue) -> tuple[Lease, bool, tuple[int, int, int], int]:
        redis_client.flushdb()
        await queue.initialize(TP, 0)
        await append(queue, batch([b"a", b"b"]))
        assert await queue.acquire_lease(TP, "A", 50) is Lease.HELD
        read = await queue.read(TP, 1 << 20)
        await asyncio.sleep(0.1)
        taken = await queue.acquire_lease(TP, "B", 10_000)
        # When A wakes and finishes its pass (it wrote the batches, it says)
        end = read.batches[-1].next_offset
        try:
            await queue.finish_pass(TP, read.incarnation, owner="A", trim_below=end,
                                    hardened_below=end, written_records=2, written_bytes=9)
            fenced = False
        except Fenced:
            fenced = True
        state = await queue.state(TP)
        # B's own pass is taken
        removed = await queue.finish_pass(TP, read.incarnation, owner="B", trim_below=end,
                                          hardened_below=end, written_records=2,
                                          written_bytes=9)
        return taken, fenced, (state.hardened_offset, state.buffered_records,
                               state.hardened_records), removed

    taken, fenced, (hardened, buffered, counted), removed = run(redis_url, scenario)

    # Then A is told it was fenced and nothing of its pass happened: no trim, no mark moved,
    # nothing counted; B's pass does all of it
    assert (taken, fenced) == (Lease.TAKEN_OVER, True)
    assert (hardened, buffered, counted) == (0, 2, 0)
    assert removed == 2


def test_a_request_whose_second_batch_is_out_of_sequence_stores_nothing(
        redis_client: redis.Redis, redis_url: str) -> None:
    # Given an idempotent producer whose request carries a good batch and one with a gap
    async def scenario(queue: LogQueue) -> tuple[AppendResult, int]:
        await queue.initialize(TP, 0)
        result = await append(queue, batch([b"a", b"b"], (7, 0, 0)),
                              batch([b"c"], (7, 0, 5)))
        return result, (await queue.state(TP)).next_offset

    result, next_offset = run(redis_url, scenario)

    # Then the request is refused whole: not even its first batch is stored
    assert result.error_code is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert next_offset == 0


def test_a_new_producer_epoch_must_start_at_sequence_zero(
        redis_client: redis.Redis, redis_url: str) -> None:
    async def scenario(queue: LogQueue) -> tuple[AppendResult, AppendResult, AppendResult]:
        await queue.initialize(TP, 0)
        first = await append(queue, batch([b"a"], (7, 0, 0)))
        # When the producer appears with a bumped epoch, first at sequence 3, then at 0
        skipped = await append(queue, batch([b"b"], (7, 1, 3)))
        restarted = await append(queue, batch([b"b"], (7, 1, 0)))
        return first, skipped, restarted

    first, skipped, restarted = run(redis_url, scenario)

    # Then only the batch that starts the epoch at 0 is taken, as Kafka checks
    assert first.error_code is ErrorCode.NONE
    assert skipped.error_code is ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert (restarted.error_code, restarted.base_offset) == (ErrorCode.NONE, 1)


def test_a_retried_batch_is_answered_as_a_duplicate_with_its_offset(
        redis_client: redis.Redis, redis_url: str) -> None:
    async def scenario(queue: LogQueue) -> tuple[AppendResult, AppendResult, int]:
        await queue.initialize(TP, 10)
        first = await append(queue, batch([b"a", b"b"], (7, 0, 0)))
        retry = await append(queue, batch([b"a", b"b"], (7, 0, 0)))
        return first, retry, (await queue.state(TP)).next_offset

    first, retry, next_offset = run(redis_url, scenario)

    assert (first.base_offset, first.duplicate) == (10, False)
    assert (retry.base_offset, retry.duplicate) == (10, True)
    assert next_offset == 12


def test_producers_silent_for_longer_than_the_expiry_are_forgotten(
        redis_client: redis.Redis, redis_url: str) -> None:
    # Given three producers, two of which last appended long ago
    async def scenario(queue: LogQueue) -> tuple[int, AppendResult]:
        await queue.initialize(TP, 0)
        await append(queue, batch([b"a"], (1, 0, 0)), now=1_000)
        await append(queue, batch([b"b"], (2, 0, 0)), now=2_000)
        await append(queue, batch([b"c"], (3, 0, 0)), now=90_000)
        # When producers silent since 50 s are pruned
        forgotten = await queue.prune_producers(TP, silent_since_ms=50_000)
        # a forgotten producer coming back is taken as new (any first sequence)
        back = await append(queue, batch([b"d"], (1, 0, 9)), now=100_000)
        return forgotten, back

    forgotten, back = run(redis_url, scenario)

    assert forgotten == 2
    assert sorted(redis_client.hkeys(f"kiln:{{{TP.topic}/{TP.partition}}}:pids")) == [b"1", b"3"]
    assert back.error_code is ErrorCode.NONE


def test_harden_never_brings_the_levels_down_and_refuses_an_assured_maximum() -> None:
    topic = new_topic("orders", 1)

    lowered = with_kiln_configs(topic, {"kiln.harden": "never"})
    try:
        with_kiln_configs(topic, {"kiln.harden": "never",
                                  "kiln.max.reliability": "assured_persistent"})
        refused = ""
    except KafkaError as exc:
        refused = f"{exc.error_code.name}: {exc}"

    assert (lowered.max_reliability, lowered.reliability) == (
        Reliability.RELIABLE_NONPERSISTENT, Reliability.RELIABLE_NONPERSISTENT)
    assert refused.startswith("INVALID_CONFIG")
    assert "kiln.max.reliability assured_persistent needs hardening" in refused
