"""Facts about where Kiln offsets lie in Kafka partitions bound the search for a record."""

from __future__ import annotations

from storage.kiln_positions import Bounds, KilnPositions
from storage.model import TopicPartition

TP = TopicPartition("t", 0)


def test_nothing_known_means_search_everything() -> None:
    assert KilnPositions().bounds(TP, 500) == Bounds(0, None, False)


def test_reading_on_after_the_last_record_served_is_exact() -> None:
    # Given the last record served: Kafka 99 holds Kiln 149
    positions = KilnPositions()
    positions.learn(TP, 99, 149)

    # When the consumer asks for Kiln 150
    bounds = positions.bounds(TP, 150)

    # Then the next Kafka record is the one
    assert bounds == Bounds(100, None, True)


def test_facts_on_both_sides_bound_the_search() -> None:
    # Given records known at Kafka 10 (Kiln 10), 50 (Kiln 80) and 90 (Kiln 200)
    positions = KilnPositions()
    for kafka, kiln in [(10, 10), (50, 80), (90, 200)]:
        positions.learn(TP, kafka, kiln)

    # When Kiln 100 is wanted
    bounds = positions.bounds(TP, 100)

    # Then it lies after Kafka 50 and at or before Kafka 90
    assert bounds == Bounds(51, 90, False)


def test_neighbouring_facts_across_a_gap_are_exact() -> None:
    # Given Kafka 7 holds Kiln 20 and Kafka 8 holds Kiln 40 (21..39 were dropped)
    positions = KilnPositions()
    positions.learn(TP, 7, 20)
    positions.learn(TP, 8, 40)

    # When a consumer asks for Kiln 30 (inside the gap)
    bounds = positions.bounds(TP, 30)

    # Then Kafka 8 is the record to read
    assert bounds == Bounds(8, 8, True)


def test_least_recently_used_facts_and_partitions_are_dropped() -> None:
    # Given room for 2 facts per partition and 2 partitions
    positions = KilnPositions(per_partition=2, partitions=2)
    positions.learn(TP, 1, 1)
    positions.learn(TP, 2, 2)
    positions.bounds(TP, 2)  # uses the fact at Kafka 1
    positions.learn(TP, 3, 3)  # drops the fact at Kafka 2, used least recently
    other, third = TopicPartition("t", 1), TopicPartition("t", 2)
    positions.learn(other, 5, 5)

    # When a third partition is learned
    positions.learn(third, 9, 9)

    # Then the partition used least recently is forgotten, the others keep what was used
    assert positions.bounds(TP, 4) == Bounds(0, None, False)
    assert positions.bounds(other, 6) == Bounds(6, None, True)
    assert positions.bounds(third, 10) == Bounds(10, None, True)


def test_forget_drops_a_partition() -> None:
    positions = KilnPositions()
    positions.learn(TP, 1, 1)

    positions.forget(TP)

    assert positions.bounds(TP, 2) == Bounds(0, None, False)
