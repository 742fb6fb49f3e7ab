"""Collectors that read, when Prometheus scrapes, numbers other parts keep anyway: the
hardener's counters, the buffer snapshot, the delay in force. Nothing here runs on the
request path."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from storage.hardener import HardenerCounters
from storage.observability.buffer import BufferSnapshot, TopicBuffer

# topic -> (delay in ms, the constraint that bound it); see KilnMetrics.set_delay_source.
DelaySource = Callable[[], Mapping[str, tuple[int, str]]]


class HardenerCollector(Collector):
    """What this process wrote to Kafka (other Kiln processes report their own)."""

    def __init__(self, counters: HardenerCounters) -> None:
        self._counters = counters

    def collect(self) -> Iterator[Metric]:
        c = self._counters
        records = CounterMetricFamily("kiln_hardened_records",
                                      "Records written to Kafka by this process",
                                      labels=["topic"])
        for topic, count in sorted(c.per_topic_records.items()):
            records.add_metric([topic], count)
        yield records
        yield CounterMetricFamily("kiln_hardened_forwarded_records",
                                  "Of the records written to Kafka, those in client batches "
                                  "forwarded whole (no record decoded)",
                                  value=c.records_forwarded)
        yield CounterMetricFamily("kiln_hardened_bytes",
                                  "Record batch bytes written to Kafka by this process",
                                  value=c.bytes_hardened)
        yield CounterMetricFamily("kiln_hardened_batches",
                                  "Record batches written to Kafka by this process",
                                  value=c.batches_written)
        yield CounterMetricFamily("kiln_harden_errors",
                                  "Failures (Kafka, Redis or fencing) that paused hardening "
                                  "of a partition", value=c.errors)


class BufferCollector(Collector):
    """The log queue per topic, from the last snapshot (refreshed before each scrape).
    Nothing is reported while Redis does not answer."""

    def __init__(self, snapshot: BufferSnapshot) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        topics = self._snapshot.topics
        if topics is None:
            return
        families: list[tuple[GaugeMetricFamily | CounterMetricFamily,
                             Callable[[TopicBuffer], float]]] = [
            (GaugeMetricFamily("kiln_buffered_records", "Records in the log queue (Redis)",
                               labels=["topic"]), lambda b: b.records),
            (GaugeMetricFamily("kiln_buffered_bytes", "Record batch bytes in the log queue",
                               labels=["topic"]), lambda b: b.bytes),
            (GaugeMetricFamily("kiln_buffered_oldest_age_seconds",
                               "Age of the oldest record in the log queue (0 when empty)",
                               labels=["topic"]), lambda b: b.oldest_age_ms / 1000),
            (GaugeMetricFamily("kiln_at_risk_records",
                               "Buffered records of persistent levels not yet hardened: "
                               "only in Redis", labels=["topic"]), lambda b: b.at_risk_records),
            (GaugeMetricFamily("kiln_at_risk_bytes",
                               "Bytes of buffered records of persistent levels not yet "
                               "hardened", labels=["topic"]), lambda b: b.at_risk_bytes),
            (CounterMetricFamily("kiln_delivered_dropped_records",
                                 "Records dropped from the log queue as delivered, never "
                                 "written to Kafka", labels=["topic"]),
             lambda b: b.delivered_records),
            (CounterMetricFamily("kiln_delivered_dropped_bytes",
                                 "Bytes dropped from the log queue as delivered",
                                 labels=["topic"]), lambda b: b.delivered_bytes),
        ]
        for family, value in families:
            for topic, buffer in sorted(topics.items()):
                family.add_metric([topic], value(buffer))
            yield family


class DelayCollector(Collector):
    def __init__(self, source: DelaySource) -> None:
        self.source = source

    def collect(self) -> Iterator[Metric]:
        delay = GaugeMetricFamily("kiln_harden_delay_seconds",
                                  "How long records of the topic wait before hardening",
                                  labels=["topic"])
        binding = GaugeMetricFamily("kiln_harden_delay_binding",
                                    "1 for the constraint that set the topic's delay",
                                    labels=["topic", "constraint"])
        for topic, (delay_ms, constraint) in sorted(self.source().items()):
            delay.add_metric([topic], delay_ms / 1000)
            binding.add_metric([topic, constraint], 1)
        yield delay
        yield binding
