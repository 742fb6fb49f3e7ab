"""The audit's gap and duplicate computation and its two renderings, without Spark."""

from __future__ import annotations

import json

from spark_examples.audit_report import (
    audit_offsets,
    contiguous_ranges,
    duplicates_of,
    gaps_between,
    partition_audit,
    render_table,
    report_json,
)


def test_runs_and_gaps() -> None:
    offsets = [9, 0, 1, 2, 3, 7, 8, 8, 12]
    assert contiguous_ranges(offsets) == [(0, 3), (7, 9), (12, 12)]
    assert gaps_between(contiguous_ranges(offsets)) == [(4, 6), (10, 11)]
    assert gaps_between([(0, 5)]) == []
    assert contiguous_ranges([]) == []


def test_duplicates_with_their_copies() -> None:
    assert duplicates_of([3, 1, 3, 2, 3, 1]) == [(1, 2), (3, 3)]
    assert duplicates_of([1, 2, 3]) == []


def test_a_partition_with_a_gap_and_a_duplicate() -> None:
    # Given Kiln offsets 0-3, 7-9 with 8 twice, one record without a kiln.offset header
    audit = audit_offsets("orders", 1, [0, 1, 2, 3, 7, 8, 8, 9], without_kiln_header=1)
    # Then
    assert (audit.records, audit.kiln_offsets, audit.min_offset, audit.max_offset) == (8, 7, 0, 9)
    assert audit.gaps == ((4, 6),)
    assert audit.gap_count == 1
    assert audit.missing == 3
    assert audit.duplicates == ((8, 2),)
    assert audit.duplicate_records == 1
    assert audit.without_kiln_header == 1
    assert not audit.listing_truncated
    assert audit.as_json() == {
        "topic": "orders", "partition": 1, "records": 8,
        "kiln_offsets": {"count": 7, "min": 0, "max": 9}, "without_kiln_header": 1,
        "gaps": [[4, 6]], "gap_count": 1, "missing": 3,
        "duplicates": [{"kiln_offset": 8, "copies": 2}], "duplicated_offsets": 1,
        "duplicate_records": 1, "listing_truncated": False,
    }


def test_listings_stop_at_the_limit_but_counts_do_not() -> None:
    # Given every other offset of 0..20, 5 of them twice
    offsets = [*range(0, 21, 2), 0, 2, 4, 6, 8]
    audit = audit_offsets("t", 0, offsets, limit=3)
    assert audit.gaps == ((1, 1), (3, 3), (5, 5))
    assert audit.gap_count == 10
    assert audit.missing == 10
    assert audit.duplicates == ((0, 2), (2, 2), (4, 2))
    assert audit.duplicated_offsets == 5
    assert audit.duplicate_records == 5
    assert audit.listing_truncated


def test_partition_audit_from_spark_aggregates_matches_the_reference() -> None:
    totals = {"topic": "t", "partition": 0, "records": 6, "kiln_offsets": 5, "min_offset": 0,
              "max_offset": 6, "without_kiln_header": 0}
    from_aggregates = partition_audit(totals, [(0, 1), (4, 6)], 2, [(5, 2)], 1, limit=10)
    assert from_aggregates == audit_offsets("t", 0, [0, 1, 4, 5, 5, 6])
    assert from_aggregates.gaps == ((2, 3),)


def test_json_document_for_scripts() -> None:
    partitions = [audit_offsets("t", 0, [0, 1, 1]), audit_offsets("t", 1, [0, 2])]
    doc = report_json(partitions, topic="t", reader="kafka")
    assert json.loads(json.dumps(doc)) == doc
    assert doc["topic"] == "t" and doc["reader"] == "kafka"
    assert [p["partition"] for p in doc["partitions"]] == [0, 1]
    assert doc["totals"] == {"partitions": 2, "records": 5, "missing": 1,
                             "duplicate_records": 1, "without_kiln_header": 0}


def test_table_for_people() -> None:
    text = render_table([audit_offsets("orders", 0, [0, 1, 2]),
                         audit_offsets("orders", 1, [0, 1, 1, 5])])
    lines = text.splitlines()
    assert lines[0].split() == ["topic", "partition", "records", "kiln", "offsets", "min",
                                "max", "gaps", "missing", "duplicates", "no", "kiln",
                                "header"]
    assert lines[1].split() == ["orders", "0", "3", "3", "0", "2", "0", "0", "0", "0"]
    assert lines[2].split() == ["orders", "1", "4", "3", "0", "5", "1", "3", "1", "0"]
    assert lines[3] == "gaps in orders-1: 2..4"
    assert lines[4] == "duplicates in orders-1: 1 (x2)"
    assert lines[5].startswith("7 records in 2 partition(s); 3 Kiln offsets missing")
    assert render_table([]) == "no records found"
