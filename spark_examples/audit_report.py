"""The audit's findings per partition — Kiln offsets present, gaps, duplicates — and their two
renderings: JSON for scripts and a table for people. No Spark, no I/O.

A record's Kiln offset is its `kiln.offset` header or, when it has none, its Kafka offset
(`wire/lineage.py`): both are Kiln's lineage, and the audit treats them alike. It counts the records
without the header apart (`without_kiln_header`) for information only: a partition holds
them from its start until Kiln first drops a record or fences the partition (the abort
marker takes a Kafka offset), so a topic where neither happened has nothing else, and any
count is normal.

A gap is a run of Kiln offsets between the lowest and the highest present that the hardened
topic does not hold. Header-less records sit at consecutive Kafka offsets, so Kiln leaves no
gap among them; gaps come where Kiln dropped records, which is also where the headers start.
Gaps are expected where records never had to be hardened (delivered to every durable
subscription first, or non-persistent levels); with the topic policy `harden = all`, or no
durable subscriptions, a persistent record in a gap was lost. Duplicates (a Kiln offset
present more than once, whether each copy carries it in a header or as its Kafka offset)
are never expected: Kiln's hardening is exactly-once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

OffsetSpan = tuple[int, int]  # first, last (inclusive)


@dataclass(frozen=True, slots=True)
class PartitionAudit:
    """What one partition holds. `gaps` and `duplicates` list at most the audit's listing
    limit each; `gap_count`, `missing`, `duplicated_offsets` and `duplicate_records` are
    always complete. `without_kiln_header` counts the records whose Kiln offset is their
    Kafka offset (no `kiln.offset` header): information, not a finding."""

    topic: str
    partition: int
    records: int
    kiln_offsets: int
    min_offset: int
    max_offset: int
    without_kiln_header: int
    gaps: tuple[OffsetSpan, ...]
    gap_count: int
    duplicates: tuple[tuple[int, int], ...]  # kiln offset, copies
    duplicated_offsets: int

    @property
    def missing(self) -> int:
        """Kiln offsets between min and max that are not there."""
        return self.max_offset - self.min_offset + 1 - self.kiln_offsets

    @property
    def duplicate_records(self) -> int:
        """Records beyond the first copy of each Kiln offset."""
        return self.records - self.kiln_offsets

    @property
    def listing_truncated(self) -> bool:
        return len(self.gaps) < self.gap_count or len(self.duplicates) < self.duplicated_offsets

    def as_json(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "records": self.records,
            "kiln_offsets": {"count": self.kiln_offsets, "min": self.min_offset,
                             "max": self.max_offset},
            "without_kiln_header": self.without_kiln_header,
            "gaps": [list(gap) for gap in self.gaps],
            "gap_count": self.gap_count,
            "missing": self.missing,
            "duplicates": [{"kiln_offset": o, "copies": c} for o, c in self.duplicates],
            "duplicated_offsets": self.duplicated_offsets,
            "duplicate_records": self.duplicate_records,
            "listing_truncated": self.listing_truncated,
        }


def contiguous_ranges(offsets: Iterable[int]) -> list[OffsetSpan]:
    """The runs of consecutive values among `offsets` (any order, repeats allowed)."""
    runs: list[OffsetSpan] = []
    for offset in sorted(set(offsets)):
        if runs and runs[-1][1] + 1 == offset:
            runs[-1] = (runs[-1][0], offset)
        else:
            runs.append((offset, offset))
    return runs


def gaps_between(runs: Sequence[OffsetSpan]) -> list[OffsetSpan]:
    """The spans missing between consecutive runs (sorted, not overlapping)."""
    gaps = []
    for (_, last), (first, _) in pairwise(runs):
        if first > last + 1:
            gaps.append((last + 1, first - 1))
    return gaps


def duplicates_of(offsets: Iterable[int]) -> list[tuple[int, int]]:
    """(offset, copies) for every value present more than once, in order."""
    counts: dict[int, int] = {}
    for offset in offsets:
        counts[offset] = counts.get(offset, 0) + 1
    return sorted((o, c) for o, c in counts.items() if c > 1)


def partition_audit(totals: Mapping[str, Any], runs: Sequence[OffsetSpan], run_count: int,
                    duplicates: Sequence[tuple[int, int]], duplicated_offsets: int,
                    limit: int) -> PartitionAudit:
    """One partition's findings from the Spark aggregates: `totals` (topic, partition,
    records, kiln_offsets, min_offset, max_offset, without_kiln_header), its first runs of
    present offsets (at least limit + 1 of them when there are that many) and how many runs
    there are, and its first duplicated offsets and how many there are."""
    return PartitionAudit(
        topic=str(totals["topic"]),
        partition=int(totals["partition"]),
        records=int(totals["records"]),
        kiln_offsets=int(totals["kiln_offsets"]),
        min_offset=int(totals["min_offset"]),
        max_offset=int(totals["max_offset"]),
        without_kiln_header=int(totals["without_kiln_header"]),
        gaps=tuple(gaps_between(runs)[:limit]),
        gap_count=max(0, run_count - 1),
        duplicates=tuple(duplicates[:limit]),
        duplicated_offsets=duplicated_offsets,
    )


def audit_offsets(topic: str, partition: int, kiln_offsets: Sequence[int],
                  without_kiln_header: int = 0, limit: int = 1000) -> PartitionAudit:
    """The same findings from a plain list of Kiln offsets (one per record read), for
    readers other than Spark and as the reference the Spark audit is checked against."""
    runs = contiguous_ranges(kiln_offsets)
    duplicates = duplicates_of(kiln_offsets)
    totals = {"topic": topic, "partition": partition, "records": len(kiln_offsets),
              "kiln_offsets": len(set(kiln_offsets)), "min_offset": min(kiln_offsets),
              "max_offset": max(kiln_offsets), "without_kiln_header": without_kiln_header}
    return partition_audit(totals, runs, len(runs), duplicates, len(duplicates), limit)


def report_json(partitions: Sequence[PartitionAudit], **context: Any) -> dict[str, Any]:
    """The audit as one JSON document: `context` (topic, reader, ...), the partitions, and
    totals over them."""
    return {
        **context,
        "partitions": [p.as_json() for p in partitions],
        "totals": {
            "partitions": len(partitions),
            "records": sum(p.records for p in partitions),
            "missing": sum(p.missing for p in partitions),
            "duplicate_records": sum(p.duplicate_records for p in partitions),
            "without_kiln_header": sum(p.without_kiln_header for p in partitions),
        },
    }


def _spans(spans: Sequence[OffsetSpan], more: int) -> str:
    text = ", ".join(str(a) if a == b else f"{a}..{b}" for a, b in spans)
    return text + (f", ... ({more} more)" if more > 0 else "")


def render_table(partitions: Sequence[PartitionAudit]) -> str:
    """A readable table, then the gaps and duplicates of each partition that has any."""
    if not partitions:
        return "no records found"
    header = ("topic", "partition", "records", "kiln offsets", "min", "max", "gaps",
              "missing", "duplicates", "no kiln header")
    rows = [(p.topic, str(p.partition), str(p.records), str(p.kiln_offsets),
             str(p.min_offset), str(p.max_offset), str(p.gap_count), str(p.missing),
             str(p.duplicate_records), str(p.without_kiln_header)) for p in partitions]
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i < 1 else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    lines = [line(header), *(line(row) for row in rows)]
    for p in partitions:
        if p.gap_count:
            lines.append(f"gaps in {p.topic}-{p.partition}: "
                         f"{_spans(p.gaps, p.gap_count - len(p.gaps))}")
        if p.duplicated_offsets:
            listed = ", ".join(f"{o} (x{c})" for o, c in p.duplicates)
            more = p.duplicated_offsets - len(p.duplicates)
            lines.append(f"duplicates in {p.topic}-{p.partition}: {listed}"
                         + (f", ... ({more} more)" if more > 0 else ""))
    total_missing = sum(p.missing for p in partitions)
    total_duplicates = sum(p.duplicate_records for p in partitions)
    lines.append(f"{sum(p.records for p in partitions)} records in {len(partitions)} "
                 f"partition(s); {total_missing} Kiln offsets missing between the lowest and "
                 f"highest present, {total_duplicates} duplicate record(s)")
    return "\n".join(lines)
