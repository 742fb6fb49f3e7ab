"""The workloads the simulator replays, each with the budgets Kiln is given for it.

Budgets are chosen so that the trade-off is real: large enough that a delay long enough for
the consumers to deliver first fits in steady operation, small enough that a long delay
breaks them when something goes wrong (a burst, a stopped consumer, many senders, a high
rate). `why_budgets` says how, per workload. Every workload runs 10 minutes of production
and 90 s more with producers stopped, so the last records are settled too.
"""

from __future__ import annotations

from bench.delay_sim.model import (
    Bursts,
    Kafka,
    Producers,
    Subscription,
    Topic,
    Workload,
)
from storage.policy.adaptive import DelayLimits

KIB = 1024
MIB = 1024 * 1024


def steady() -> Workload:
    orders = Topic(
        "orders", partitions=4, record_bytes=1 * KIB,
        producers=Producers(2_000, senders=40, send_interval_ms=100, guarantee_share=0.1),
        subscriptions=(
            Subscription("billing", max_records_per_s=20_000, processing_ms=200,
                         commit_interval_ms=5_000),
            Subscription("audit", max_records_per_s=20_000, processing_ms=50,
                         commit_interval_ms=1_000, commit_phase_ms=370),
        ))
    app_logs = Topic(
        "app-logs", partitions=2, record_bytes=512,
        producers=Producers(1_000, senders=10, send_interval_ms=100))
    return Workload(
        "steady",
        "2,000 x 1 KiB/s on `orders` read by two durable groups (auto-commit every 5 s and "
        "1 s), 10% of its senders acks=all; 1,000 x 512 B/s on `app-logs`, which no durable "
        "subscription reads",
        topics=(orders, app_logs),
        limits=DelayLimits(risk_budget_bytes=32 * MIB, risk_budget_records=200_000,
                           memory_budget_bytes=256 * MIB),
        why_budgets="32 MiB at risk holds ~13 s of ingress (2.5 MiB/s): enough for `orders` "
                    "to wait out its 5 s commits, not for 60 s of `app-logs` on top",
    )


def bursty() -> Workload:
    events = Topic(
        "events", partitions=4, record_bytes=512,
        producers=Producers(1_000, senders=50, send_interval_ms=100, guarantee_share=0.05,
                            bursts=Bursts(factor=10, length_ms=15_000, every_ms=120_000,
                                          first_ms=60_000)),
        subscriptions=(
            Subscription("stream-proc", max_records_per_s=6_000, processing_ms=100,
                         commit_interval_ms=2_000),
        ))
    return Workload(
        "bursty",
        "1,000 x 512 B/s on `events` with 10x bursts (15 s every 2 min); the consumer group "
        "reads at most 6,000/s (commits every 2 s), so it lags during each burst",
        topics=(events,),
        limits=DelayLimits(risk_budget_bytes=16 * MIB, risk_budget_records=100_000,
                           memory_budget_bytes=128 * MIB),
        why_budgets="16 MiB at risk is 32 s of the base rate but 3.3 s of a burst: the delay "
                    "that saves everything in between must shrink during bursts",
    )


def outage() -> Workload:
    payments = Topic(
        "payments", partitions=4, record_bytes=1 * KIB,
        producers=Producers(2_000, senders=20, send_interval_ms=100, guarantee_share=0.25),
        subscriptions=(
            Subscription("ledger", max_records_per_s=20_000, processing_ms=200,
                         commit_interval_ms=5_000, outages=((120_000, 300_000),)),
        ))
    return Workload(
        "consumer_outage",
        "2,000 x 1 KiB/s on `payments`, 25% acks=all; its only consumer group is down from "
        "120 s to 300 s, then catches up at 20,000/s",
        topics=(payments,),
        limits=DelayLimits(risk_budget_bytes=64 * MIB, risk_budget_records=500_000,
                           memory_budget_bytes=512 * MIB),
        why_budgets="64 MiB at risk is ~43 s of the acknowledged ingress (1.5 MiB/s): a "
                    "60 s delay breaks it as soon as the consumers are gone for a minute",
    )


def many_senders() -> Workload:
    telemetry = Topic(
        "telemetry", partitions=8, record_bytes=256,
        producers=Producers(2_000, senders=500, send_interval_ms=1_000),
        subscriptions=(
            Subscription("ingest", max_records_per_s=20_000, processing_ms=100,
                         commit_interval_ms=5_000),
        ))
    return Workload(
        "many_senders",
        "500 clients (devices) each sending 4 x 256 B every second to `telemetry`; one "
        "consumer group commits every 5 s",
        topics=(telemetry,),
        limits=DelayLimits(risk_budget_bytes=16 * MIB, risk_budget_records=200_000,
                           memory_budget_bytes=128 * MIB, sender_budget_s=600),
        why_budgets="bytes and records are far from their budgets (0.5 MiB/s); the "
                    "sender-seconds budget (600, the default) allows 1.2 s for 500 senders",
    )


def slow_kafka() -> Workload:
    clicks = Topic(
        "clicks", partitions=4, record_bytes=1 * KIB,
        producers=Producers(3_000, senders=30, send_interval_ms=100, guarantee_share=0.1),
        subscriptions=(
            Subscription("sessionizer", max_records_per_s=20_000, processing_ms=500,
                         commit_interval_ms=3_000),
        ))
    audit = Topic(
        "audit-raw", partitions=2, record_bytes=1 * KIB,
        producers=Producers(1_000, senders=10, send_interval_ms=100))
    return Workload(
        "slow_kafka",
        "3,000 x 1 KiB/s on `clicks` (one group, commits every 3 s) and 1,000 x 1 KiB/s on "
        "`audit-raw` (no durable subscription); Kafka takes 400 ms per write, carries 6 MiB/s "
        "at most and fails from 240 s to 300 s",
        topics=(clicks, audit),
        kafka=Kafka(write_latency_ms=400, bytes_per_s=6 * MIB, failures=((240_000, 300_000),),
                    fail_after_ms=1_000),
        limits=DelayLimits(risk_budget_bytes=48 * MIB, risk_budget_records=300_000,
                           memory_budget_bytes=512 * MIB),
        why_budgets="48 MiB at risk is 12 s of ingress: `clicks` needs ~4 s to be delivered, "
                    "`audit-raw` must not wait; during the failure and the catch-up after it "
                    "(Kafka's spare 2 MiB/s) budgets are not judged",
    )


def memory_pressure() -> Workload:
    firehose = Topic(
        "firehose", partitions=8, record_bytes=1 * KIB,
        producers=Producers(20_000, senders=50, send_interval_ms=100),
        subscriptions=(
            Subscription("indexer", max_records_per_s=60_000, processing_ms=300,
                         commit_interval_ms=5_000),
        ))
    return Workload(
        "memory_pressure",
        "20,000 x 1 KiB/s (19.5 MiB/s) on `firehose`; the consumer group keeps up but commits "
        "only every 5 s, so ~100 MiB is always waiting to be delivered",
        topics=(firehose,),
        limits=DelayLimits(risk_budget_bytes=512 * MIB, risk_budget_records=2_000_000,
                           memory_budget_bytes=128 * MIB),
        why_budgets="the buffer budget (128 MiB, Kiln's memory for the log queue) binds, not "
                    "the risk budget: what waits 5 s for a commit nearly fills it",
    )


def no_subscription() -> Workload:
    metrics = Topic(
        "metrics", partitions=4, record_bytes=512,
        producers=Producers(4_000, senders=20, send_interval_ms=100, guarantee_share=0.2))
    return Workload(
        "no_subscription",
        "4,000 x 512 B/s on `metrics`, which no durable subscription reads (a Spark job reads "
        "the hardened topic); 20% acks=all",
        topics=(metrics,),
        limits=DelayLimits(risk_budget_bytes=32 * MIB, risk_budget_records=200_000,
                           memory_budget_bytes=256 * MIB),
        why_budgets="every record is written whatever the delay; a delay only adds risk "
                    "(32 MiB is ~20 s of the acknowledged ingress) and ack latency",
    )


WORKLOADS = {w.name: w for w in (steady(), bursty(), outage(), many_senders(), slow_kafka(),
                                 memory_pressure(), no_subscription())}
