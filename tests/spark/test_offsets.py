"""Offset-range planning of the compatible reader, as Spark's Kafka source plans."""

from __future__ import annotations

from spark_examples.offsets import (
    OffsetRange,
    from_stream_offset,
    lost_between,
    plan_ranges,
    rate_limit,
    to_stream_offset,
)
from spark_examples.options import TopicPartition

A0, A1, B0 = TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b", 0)


def test_stream_offsets_are_spark_s_json_shape_and_round_trip() -> None:
    offsets = {B0: 3, A1: 7, A0: 5}
    doc = to_stream_offset(offsets)
    assert doc == {"a": {"0": 5, "1": 7}, "b": {"0": 3}}
    assert list(doc) == ["a", "b"]  # a stable order: Spark compares offsets as JSON text
    assert from_stream_offset(doc) == offsets


def test_rate_limit_shares_in_proportion_to_what_is_waiting() -> None:
    # Given 900 records waiting in a0 and 100 in a1, and a limit of 500
    start = {A0: 100, A1: 0}
    latest = {A0: 1000, A1: 100}
    # Then a0 gets 450 and a1 50
    assert rate_limit(start, latest, 500) == {A0: 550, A1: 50}


def test_rate_limit_never_starves_a_small_partition_or_passes_the_end() -> None:
    start = {A0: 0, A1: 0, B0: 10}
    latest = {A0: 10_000, A1: 1, B0: 10}
    limited = rate_limit(start, latest, 100)
    assert limited[A1] == 1  # its share (0.01) rounds up to one record
    assert limited[A0] == 99  # floor(100 * 10000 / 10001)
    assert limited[B0] == 10  # nothing waiting: stays at its end
    assert rate_limit({A0: 0}, {A0: 3}, 100) == {A0: 3}


def test_rate_limit_with_nothing_waiting_returns_the_ends() -> None:
    assert rate_limit({A0: 5, A1: 9}, {A0: 5, A1: 9}, 100) == {A0: 5, A1: 9}


def test_plan_ranges_skips_empty_and_unknown_partitions() -> None:
    ranges = plan_ranges({A0: 5, A1: 9}, {A0: 8, A1: 9, B0: 4})
    assert ranges == [OffsetRange("a", 0, 5, 8)]
    assert ranges[0].size == 3


def test_min_partitions_splits_large_ranges_like_spark() -> None:
    # Given ranges of 1 and 9 records and minPartitions 4: the 9 get round(3.6) = 4 pieces,
    # the last taking the round-off, and the 1 keeps its one
    ranges = plan_ranges({A0: 1, A1: 1}, {A0: 2, A1: 10}, min_partitions=4)
    assert ranges == [
        OffsetRange("a", 0, 1, 2),
        OffsetRange("a", 1, 1, 3), OffsetRange("a", 1, 3, 5), OffsetRange("a", 1, 5, 7),
        OffsetRange("a", 1, 7, 10),
    ]
    assert sum(r.size for r in ranges) == 10
    # with as many ranges as asked for already, nothing is split
    assert plan_ranges({A0: 0, A1: 0}, {A0: 50, A1: 50}, min_partitions=2) == [
        OffsetRange("a", 0, 0, 50), OffsetRange("a", 1, 0, 50)]


def test_lost_between_names_vanished_and_rewound_partitions() -> None:
    assert lost_between({A0: 5, A1: 7}, {A0: 9, A1: 7}) == []
    problems = lost_between({A0: 5, A1: 7}, {A0: 3})
    assert len(problems) == 2
    assert "a-0: offset went back from 5 to 3" in problems[0]
    assert "partition a-1 disappeared" in problems[1]
