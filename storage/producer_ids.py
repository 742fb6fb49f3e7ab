"""Producer ids for idempotent producers, allocated in Redis so they are unique across every
Kiln process and survive restarts.

Kiln offers no transactions, so every InitProducerId is a non-transactional one, and Kafka
answers those with a fresh producer id at epoch 0 whatever id and epoch the client sends
(TransactionCoordinator.handleInitProducerId: "if the transactional id is null, then always
blindly accept the request and return a new producerId"). Kiln does the same. Bumping the
epoch of the id a client names would let any client fence another producer's id; a fresh
id fences nobody, and every idempotent client takes it: the Java producer bumps its epoch
locally and librdkafka and kafka-python, which ask again after UNKNOWN_PRODUCER_ID or
OUT_OF_ORDER_SEQUENCE_NUMBER, reset their sequences for whatever id they are given.
"""

from __future__ import annotations

from storage.errors import BufferUnavailable
from storage.redis_pool import REDIS_FAILURES, RedisClient
from wire.errors import ErrorCode, KafkaError

_COUNTER = "kiln:producer_ids"
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1


class ProducerIds:
    def __init__(self, redis: RedisClient) -> None:
        self._redis = redis

    async def allocate(self) -> tuple[int, int]:
        """A fresh (producer_id, epoch 0)."""
        try:
            return int(await self._redis.incr(_COUNTER)), 0
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc

    async def init(self, producer_id: int, producer_epoch: int) -> tuple[int, int]:
        """A non-transactional InitProducerId carrying the client's current id and epoch
        (KIP-360; both -1 when it has none): a fresh id, as Kafka gives. As Kafka's
        KafkaApis, an id without an epoch or an epoch without an id is INVALID_REQUEST."""
        if (producer_id == NO_PRODUCER_ID) != (producer_epoch == NO_PRODUCER_EPOCH):
            raise KafkaError(ErrorCode.INVALID_REQUEST,
                             f"producer id {producer_id} with epoch {producer_epoch}")
        return await self.allocate()
