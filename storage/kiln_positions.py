"""Where Kiln offsets lie in hardened Kafka partitions, as learned from reads.

A fact is "the record at Kafka offset p has Kiln offset k". Kiln offsets increase along a
partition, so facts bound where the first record at or above a wanted Kiln offset lies. A
consumer that reads on from the last record it was served asks for that record's Kiln offset
plus one, and the fact learned from its previous read places it exactly: it never searches.

Bounded: the most recently used facts of the most recently read partitions. I/O-free.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from storage.model import TopicPartition


@dataclass(frozen=True, slots=True)
class Bounds:
    """What the facts say about the first record with a Kiln offset >= the wanted one."""

    after: int  # it is at this Kafka offset or later (0 when nothing is known)
    at_most: int | None  # it is at this Kafka offset or earlier (None: unknown)
    exact: bool  # it is the first record at or after `after`


class KilnPositions:
    def __init__(self, per_partition: int = 64, partitions: int = 4096) -> None:
        if per_partition < 1 or partitions < 1:
            raise ValueError("KilnPositions needs room for at least one fact")
        self._per_partition = per_partition
        self._partitions = partitions
        # partition -> {Kafka offset: Kiln offset}, least recently used first
        self._facts: OrderedDict[TopicPartition, OrderedDict[int, int]] = OrderedDict()

    def learn(self, tp: TopicPartition, kafka_offset: int, kiln_offset: int) -> None:
        facts = self._facts.get(tp)
        if facts is None:
            facts = self._facts[tp] = OrderedDict()
            if len(self._facts) > self._partitions:
                self._facts.popitem(last=False)
        else:
            self._facts.move_to_end(tp)
        facts[kafka_offset] = kiln_offset
        facts.move_to_end(kafka_offset)
        if len(facts) > self._per_partition:
            facts.popitem(last=False)

    def bounds(self, tp: TopicPartition, kiln_offset: int) -> Bounds:
        facts = self._facts.get(tp)
        if not facts:
            return Bounds(0, None, False)
        below: tuple[int, int] | None = None  # (Kafka, Kiln) of the last record below
        at_most: int | None = None
        for kafka, kiln in facts.items():
            if kiln < kiln_offset:
                if below is None or kafka > below[0]:
                    below = (kafka, kiln)
            elif at_most is None or kafka < at_most:
                at_most = kafka
        for used in (below[0] if below else None, at_most):
            if used is not None:
                facts.move_to_end(used)
        self._facts.move_to_end(tp)
        if below is None:
            return Bounds(0, at_most, False)
        after = below[0] + 1
        return Bounds(after, at_most, below[1] == kiln_offset - 1 or at_most == after)

    def forget(self, tp: TopicPartition) -> None:
        """Drop what is known of a partition (its Kafka log was lost or rewritten)."""
        self._facts.pop(tp, None)
