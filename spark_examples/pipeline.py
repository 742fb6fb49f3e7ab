"""The transformations of the jobs: functions from DataFrames to DataFrames that work on batch
and streaming frames alike, with no I/O.

The input is what Spark's Kafka source gives with `includeHeaders=true`. `with_lineage`
turns it into decoded records that name their Kiln topic, partition and offset; the other
functions drop duplicates by that lineage, count records per key and window, or summarise
which Kiln offsets a topic holds (the audit).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from wire.lineage import KILN_OFFSET_BYTES, KILN_OFFSET_HEADER

LINEAGE = ("topic", "partition", "kiln_offset")
# A non-negative 8-byte big-endian number starts with a hex digit below 8.
_HIGHEST_FIRST_HEX_DIGIT = "7"


def kiln_offset_column(headers: Column) -> Column:
    """The Kiln offset in a record's headers, or null: the last `kiln.offset` header holding
    8 bytes that read as a non-negative big-endian number (`wire.lineage`)."""
    wellformed = F.filter(headers, lambda h: (h["key"] == F.lit(KILN_OFFSET_HEADER))
                          & (F.length(h["value"]) == KILN_OFFSET_BYTES)
                          & (F.substring(F.hex(h["value"]), 1, 1) <= _HIGHEST_FIRST_HEX_DIGIT))
    last = F.try_element_at(wellformed, F.lit(-1))
    return F.conv(F.hex(last["value"]), 16, 10).cast("long")


def with_lineage(raw: DataFrame) -> DataFrame:
    """Decoded records: the Kiln lineage (topic, partition, kiln_offset), the Kafka offset,
    `kiln_header` (true when the Kiln offset came from a `kiln.offset` header, false when it
    is the Kafka offset: both are Kiln's lineage, see `lineage`), and the record's key,
    value, timestamp and headers as Kafka gave them."""
    kiln_offset = kiln_offset_column(F.col("headers"))
    return raw.select(
        F.col("topic"),
        F.col("partition"),
        F.coalesce(kiln_offset, F.col("offset")).alias("kiln_offset"),
        F.col("offset").alias("kafka_offset"),
        kiln_offset.isNotNull().alias("kiln_header"),
        F.col("key"),
        F.col("value"),
        F.col("timestamp"),
        F.col("headers"),
    )


def drop_duplicate_lineage(records: DataFrame, horizon: str = "10 minutes") -> DataFrame:
    """Each Kiln record once. In a stream, a copy is recognised if it is read within
    `horizon` of the first (a watermark on the time each micro-batch is read, which Spark
    keeps in its offset log so a replayed batch sees the same time); unlike a watermark on
    record timestamps this never discards a record for being late. Kiln writes copies only
    if its exactly-once hardening failed; the audit finds any that get through."""
    return (records.withColumn("_read_at", F.current_timestamp())
            .withWatermark("_read_at", horizon)
            .dropDuplicatesWithinWatermark(list(LINEAGE))
            .drop("_read_at"))


def windowed_key_counts(records: DataFrame, window: str = "1 minute",
                        lateness: str = "10 minutes") -> DataFrame:
    """Records per topic, key and tumbling window of record time, each Kiln record counted
    once. With a watermark `lateness` behind the latest record time: a stream emits a window
    once the watermark has passed its end, and drops records that arrive later than that."""
    return (records.withWatermark("timestamp", lateness)
            .dropDuplicatesWithinWatermark(list(LINEAGE))
            .groupBy(F.window("timestamp", window), F.col("topic"), F.col("key"))
            .count()
            .select(F.col("window.start").alias("window_start"),
                    F.col("window.end").alias("window_end"),
                    F.col("topic"), F.col("key"), F.col("count").alias("records")))


# --- the audit (batch) ------------------------------------------------------------------


def partition_totals(records: DataFrame) -> DataFrame:
    """Per topic and partition: records read, distinct Kiln offsets and their range, and
    records without a `kiln.offset` header (whose Kiln offset is their Kafka offset)."""
    return (records.groupBy("topic", "partition")
            .agg(F.count(F.lit(1)).alias("records"),
                 F.count_distinct("kiln_offset").alias("kiln_offsets"),
                 F.min("kiln_offset").alias("min_offset"),
                 F.max("kiln_offset").alias("max_offset"),
                 F.sum(F.when(F.col("kiln_header"), 0).otherwise(1))
                 .alias("without_kiln_header"))
            .orderBy("topic", "partition"))


def present_ranges(records: DataFrame) -> DataFrame:
    """Per topic and partition, the runs of consecutive Kiln offsets present
    (`first`..`last`), in order: offset minus its rank is constant along a run."""
    by_offset = Window.partitionBy("topic", "partition").orderBy("kiln_offset")
    return (records.select(*LINEAGE).distinct()
            .withColumn("run", F.col("kiln_offset") - F.row_number().over(by_offset))
            .groupBy("topic", "partition", "run")
            .agg(F.min("kiln_offset").alias("first"), F.max("kiln_offset").alias("last"))
            .select("topic", "partition", "first", "last")
            .orderBy("topic", "partition", "first"))


def duplicated_offsets(records: DataFrame) -> DataFrame:
    """Kiln offsets present more than once, with how many copies, in order."""
    return (records.groupBy(*LINEAGE).count()
            .where(F.col("count") > 1)
            .select(*LINEAGE, F.col("count").alias("copies"))
            .orderBy(*LINEAGE))
