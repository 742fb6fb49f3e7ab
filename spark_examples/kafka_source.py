"""Kiln's compatible Kafka reader: a Spark Python data source with the options and the schema
of Spark's Kafka source, for machines where the spark-sql-kafka connector is not on Spark's
classpath (`session.py` chooses it, and says so, only then).

    spark.readStream.format("kiln-kafka")
        .option("kafka.bootstrap.servers", "host:9092").option("subscribe", "orders")
        .option("startingOffsets", "earliest").option("includeHeaders", "true").load()

Batch (`spark.read`) and streaming (`spark.readStream`) reads are supported. A stream offset
is the same JSON the real source checkpoints (`{"orders": {"0": 42}}`); each micro-batch
plans one Spark task per partition range (`offsets.py`), and a task fetches its range with
a small blocking client (`kafka_wire.py`), decodes it (`record_sets.py`) and hands Spark
Arrow record batches. `maxOffsetsPerTrigger` is Spark's admission control (a ReadMaxRows
limit), `Trigger.AvailableNow` is supported, and with `kafka.isolation.level=read_committed`
offsets end at each partition's last stable offset and aborted transactions are skipped.

Spark's Python workers import this module by name, so the package must be installed where
they run (`pip install` of this project, or `--py-files` with spark-submit).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from itertools import accumulate
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from spark_examples.kafka_wire import KafkaWire, with_retries
from spark_examples.offsets import (
    OffsetRange,
    StreamOffset,
    from_stream_offset,
    lost_between,
    plan_ranges,
    rate_limit,
    to_stream_offset,
)
from spark_examples.options import (
    EARLIEST,
    LATEST,
    OptionError,
    SourceOptions,
    TopicPartition,
    parse_options,
)
from spark_examples.partition_reader import DataLoss, read_range
from spark_examples.record_sets import RecordColumns

log = logging.getLogger(__name__)

T = TypeVar("T")
SOURCE_NAME = "kiln-kafka"


def kafka_schema(include_headers: bool) -> StructType:
    """The schema of Spark's Kafka source (`headers` only with includeHeaders=true)."""
    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if include_headers:
        fields.append(StructField("headers", ArrayType(StructType([
            StructField("key", StringType()), StructField("value", BinaryType())]))))
    return StructType(fields)


class RangePartition(InputPartition):
    """One Spark task: one offset range of one Kafka partition."""

    def __init__(self, offsets: OffsetRange) -> None:
        super().__init__(offsets)
        self.offsets = offsets


class KafkaCompatibleSource(DataSource):
    """`format("kiln-kafka")`: Spark's Kafka source, reimplemented in Python."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        include = str(self.options.get("includeHeaders", "false")).strip().lower() == "true"
        return kafka_schema(include)

    def reader(self, schema: StructType) -> DataSourceReader:
        options = parse_options(dict(self.options), streaming=False)
        return KafkaBatchReader(options, _checked_schema(schema, options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        options = parse_options(dict(self.options), streaming=True)
        return KafkaStreamReader(options, _checked_schema(schema, options))


def _checked_schema(schema: StructType, options: SourceOptions) -> StructType:
    expected = kafka_schema(options.include_headers)
    if schema != expected:
        raise OptionError("the Kafka source has a fixed schema and cannot be given another one "
                          f"(expected {expected.simpleString()}, got {schema.simpleString()})")
    if options.ignored:
        log.info("these options have no effect on Kiln's compatible Kafka reader: %s",
                 ", ".join(options.ignored))
    return schema


class _RangeReader:
    """What batch and stream readers share: resolving offsets on the driver, and reading a
    range in a task."""

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema
        self._wire: KafkaWire | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Spark pickles the reader to its Python workers; a socket must not travel.
        state = self.__dict__.copy()
        state["_wire"] = None
        return state

    def wire(self) -> KafkaWire:
        if self._wire is None:
            self._wire = KafkaWire(self.options.bootstrap_servers,
                                   client_id=self.options.client_id,
                                   timeout_s=self.options.poll_timeout_ms / 1000)
        return self._wire

    def close_wire(self) -> None:
        if self._wire is not None:
            self._wire.close()
            self._wire = None

    def _ask(self, action: Callable[[], T], what: str) -> T:
        """An offset lookup on the driver, retried as fetchOffset.numRetries says."""
        return with_retries(action, attempts=self.options.offset_fetch_attempts,
                            interval_s=self.options.offset_retry_interval_ms / 1000, what=what)

    def current_partitions(self) -> list[TopicPartition]:
        return self._ask(lambda: self.wire().partitions(self.options.subscription), "metadata")

    def earliest(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        if not tps:
            return {}
        return self._ask(lambda: self.wire().earliest_offsets(tps), "earliest offsets")

    def ends(self, tps: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        if not tps:
            return {}
        return self._ask(lambda: self.wire().end_offsets(tps, self.options.read_committed),
                         "end offsets")

    def resolve(self, spec: str | dict[TopicPartition, int], tps: Sequence[TopicPartition],
                name: str) -> dict[TopicPartition, int]:
        """Offsets for `earliest`, `latest` or a JSON offset map (-2 and -1 resolved)."""
        if spec == "earliest":
            return self.earliest(tps)
        if spec == "latest":
            return self.ends(tps)
        assert isinstance(spec, dict)
        if self.options.subscription.kind != "assign" and set(spec) != set(tps):
            raise OptionError(
                f"{name} names partitions {sorted(map(str, spec))} but the subscription has "
                f"{sorted(map(str, tps))}; if {name} holds specific offsets, it must name "
                "every partition (use -2 for earliest, -1 for latest)")
        earliest = self.earliest([tp for tp, o in spec.items() if o == EARLIEST])
        latest = self.ends([tp for tp, o in spec.items() if o == LATEST])
        return {tp: earliest.get(tp, latest.get(tp, offset)) for tp, offset in spec.items()}

    def check_loss(self, start: dict[TopicPartition, int], end: dict[TopicPartition, int]
                   ) -> None:
        for problem in lost_between(start, end):
            if self.options.fail_on_data_loss:
                raise DataLoss(problem + ". Set failOnDataLoss=false to read on.")
            log.warning("%s; reading on (failOnDataLoss=false)", problem)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, RangePartition):
            return  # Spark runs one task with a bare partition when a batch plans none
        arrow_schema = to_arrow_schema(self.schema, timezone="UTC")
        r = partition.offsets
        with KafkaWire(self.options.bootstrap_servers, client_id=self.options.client_id,
                       timeout_s=self.options.poll_timeout_ms / 1000) as wire:
            for columns in read_range(wire, r, self.options):
                yield to_arrow_batch(columns, r.topic, r.partition, arrow_schema,
                                     self.options.include_headers)


class KafkaBatchReader(_RangeReader, DataSourceReader):
    """`spark.read`: from startingOffsets (default earliest) to endingOffsets (latest)."""

    def partitions(self) -> Sequence[InputPartition]:
        try:
            tps = self.current_partitions()
            start = self.resolve(self.options.starting_offsets, tps, "startingOffsets")
            end = self.resolve(self.options.ending_offsets, tps, "endingOffsets")
        finally:
            self.close_wire()
        self.check_loss(start, end)
        ranges = plan_ranges(start, end, self.options.min_partitions)
        log.info("reading %d records in %d ranges", sum(r.size for r in ranges), len(ranges))
        return [RangePartition(r) for r in ranges]


class KafkaStreamReader(_RangeReader, DataSourceStreamReader,
                        SupportsTriggerAvailableNow):
    """`spark.readStream`: micro-batches of offset ranges, checkpointed by Spark."""

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        super().__init__(options, schema)
        self._target: dict[TopicPartition, int] | None = None
        self._latest: dict[TopicPartition, int] | None = None

    def initialOffset(self) -> StreamOffset:
        tps = self.current_partitions()
        start = self.resolve(self.options.starting_offsets, tps, "startingOffsets")
        log.info("new query starts at %s", to_stream_offset(start))
        return to_stream_offset(start)

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self.options.max_offsets_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self.ends(self.current_partitions())
        log.info("available-now: reading up to %s", to_stream_offset(self._target))

    def latestOffset(self, start: StreamOffset, limit: ReadLimit) -> StreamOffset:
        begin = from_stream_offset(start)
        if self._target is not None:
            latest = dict(self._target)
        else:
            latest = self.ends(self.current_partitions())
        self._latest = latest
        if isinstance(limit, ReadMaxRows):
            new = self.earliest([tp for tp in latest if tp not in begin])
            latest = rate_limit({**new, **begin}, latest, limit.max_rows)
        return to_stream_offset(latest)

    def reportLatestOffset(self) -> StreamOffset | None:
        return None if self._latest is None else to_stream_offset(self._latest)

    def partitions(self, start: StreamOffset, end: StreamOffset) -> Sequence[InputPartition]:
        begin = from_stream_offset(start)
        until = from_stream_offset(end)
        self.check_loss(begin, until)
        new = self.earliest([tp for tp in until if tp not in begin])
        for tp, offset in new.items():
            log.info("new partition %s: reading from its earliest offset %d", tp, offset)
        ranges = plan_ranges({**new, **begin}, until, self.options.min_partitions)
        return [RangePartition(r) for r in ranges]

    def commit(self, end: StreamOffset) -> None:
        """Nothing to do: Kafka keeps the records, and Spark's checkpoint the position."""

    def stop(self) -> None:
        self.close_wire()


def to_arrow_batch(columns: RecordColumns, topic: str, partition: int, schema: pa.Schema,
                   include_headers: bool) -> pa.RecordBatch:
    """One Arrow record batch in the Kafka source's schema (timestamps in microseconds, UTC,
    as Spark's TimestampType travels in Arrow)."""
    count = len(columns)
    timestamp_type = schema.field("timestamp").type
    millis = pa.array(columns.timestamps, pa.int64())
    arrays: list[pa.Array] = [
        pa.array(columns.keys, pa.binary()),
        pa.array(columns.values, pa.binary()),
        pa.repeat(pa.scalar(topic, pa.string()), count),
        pa.repeat(pa.scalar(partition, pa.int32()), count),
        pa.array(columns.offsets, pa.int64()),
        pc.multiply(millis, 1000).cast(timestamp_type),
        pa.array(columns.timestamp_types, pa.int32()),
    ]
    if include_headers:
        headers_type = schema.field("headers").type
        entries = pa.StructArray.from_arrays(
            [pa.array(columns.header_keys, pa.string()),
             pa.array(columns.header_values, pa.binary())],
            fields=list(headers_type.value_type))
        bounds = pa.array([0, *accumulate(columns.header_counts)], pa.int32())
        arrays.append(pa.ListArray.from_arrays(bounds, entries, type=headers_type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
