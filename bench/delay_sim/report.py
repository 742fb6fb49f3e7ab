"""Turning runs into verdicts: budgets kept per run, the issue's targets per workload and
per fixed delay, the JSON document and the table."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bench.delay_sim.engine import RunResult
from bench.delay_sim.model import Workload
from storage.policy.adaptive import BUFFER_THROTTLE_FROM

MIB = 1024 * 1024
# The adaptive policy may write at most this many times the records of the best fixed
# delay that keeps every budget (issue 4).
WRITE_RATIO_TARGET = 1.05


@dataclass(frozen=True, slots=True)
class Budget:
    name: str
    peak: float     # while Kafka is healthy
    limit: float

    @property
    def kept(self) -> bool:
        return self.peak <= self.limit


def budgets(run: RunResult, workload: Workload) -> list[Budget]:
    """Each budget with its peak while Kafka is healthy. The risk budgets are promises about
    exposure: kept while the peak stays within them. The memory budget is a wall Kiln
    enforces itself: producers are throttled once the buffer passes 80 % of it
    (storage.budget) and refused at 100 %. The simulated producers do not slow down when
    throttled, so a run that passes the throttle line shows savings Kiln would have made
    by pushing its producers back: the memory budget is kept only below that line."""
    limits = workload.limits
    return [
        Budget("risk_bytes", run.at_risk_bytes.healthy_peak, limits.risk_budget_bytes),
        Budget("risk_records", run.at_risk_records.healthy_peak, limits.risk_budget_records),
        Budget("sender_seconds", run.sender_seconds.healthy_peak, limits.sender_budget_s),
        Budget("memory", run.buffer_bytes.healthy_peak,
               limits.memory_budget_bytes * BUFFER_THROTTLE_FROM),
    ]


def percentile(sorted_values: Sequence[int], q: float) -> int | None:
    if not sorted_values:
        return None
    index = min(len(sorted_values) - 1, int(q * len(sorted_values)))
    return sorted_values[index]


def written_share(run: RunResult) -> float:
    return run.written / run.produced if run.produced else 0.0


def run_summary(run: RunResult, workload: Workload) -> dict[str, Any]:
    latencies = sorted(run.ack_latencies_ms)
    kept = budgets(run, workload)
    return {
        "workload": run.workload,
        "policy": run.policy,
        "fixed_delay_ms": run.fixed_delay_ms,
        "produced": run.produced,
        "written": run.written,
        "dropped_as_delivered": run.dropped,
        "buffered_at_end": run.buffered_end,
        "written_share": round(written_share(run), 6),
        "per_topic": run.per_topic,
        "at_risk_bytes": {"peak": int(run.at_risk_bytes.peak),
                          "peak_kafka_healthy": int(run.at_risk_bytes.healthy_peak),
                          "mean": round(run.at_risk_bytes.mean)},
        "at_risk_records": {"peak": int(run.at_risk_records.peak),
                            "peak_kafka_healthy": int(run.at_risk_records.healthy_peak),
                            "mean": round(run.at_risk_records.mean)},
        "buffer_bytes": {"peak": int(run.buffer_bytes.peak),
                         "peak_kafka_healthy": int(run.buffer_bytes.healthy_peak),
                         "mean": round(run.buffer_bytes.mean)},
        "sender_seconds": {"peak": round(run.sender_seconds.peak, 1),
                           "peak_kafka_healthy": round(run.sender_seconds.healthy_peak, 1),
                           "mean": round(run.sender_seconds.mean, 1)},
        "throttled_s": run.throttled_ms / 1000,
        "guarantee_acks": {"count": len(latencies),
                           "p50_ms": percentile(latencies, 0.5),
                           "p99_ms": percentile(latencies, 0.99),
                           "max_ms": latencies[-1] if latencies else None,
                           "pending_at_end": run.acks_pending_end},
        "budgets_kept": {b.name: b.kept for b in kept},
        "budget_use": {b.name: round(b.peak / b.limit, 4) for b in kept},
        "within_budgets": all(b.kept for b in kept),
        "binding_share": run.binding_share if run.fixed_delay_ms is None else {},
        "decisions": run.decisions,
        "appends": run.appends,
        "checks": run.checks,
    }


def workload_verdict(summaries: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The first target on one workload: the adaptive policy keeps its budgets and writes no
    more than 1.05x the records of the best fixed delay that keeps them too."""
    key = "within_budgets"
    adaptive = next((s for s in summaries if s["policy"] == "adaptive"), None)
    fixed = [s for s in summaries if s["fixed_delay_ms"] is not None]
    within = [s for s in fixed if s[key]]
    best = min(within, key=lambda s: s["written"], default=None)
    out: dict[str, Any] = {
        "best_fixed_within_budgets": best["policy"] if best else None,
        "best_fixed_written": best["written"] if best else None,
    }
    if adaptive is None:
        return out
    out["adaptive_within_budgets"] = adaptive[key]
    out["adaptive_written"] = adaptive["written"]
    if best is None:
        out["write_ratio"] = None
        out["writes_ok"] = True
    else:
        ratio = (adaptive["written"] / best["written"] if best["written"]
                 else (1.0 if adaptive["written"] == 0 else float("inf")))
        out["write_ratio"] = round(ratio, 4)
        out["writes_ok"] = ratio <= WRITE_RATIO_TARGET
    out["met"] = out["adaptive_within_budgets"] and out["writes_ok"]
    return out


def fixed_verdicts(by_workload: Mapping[str, Sequence[dict[str, Any]]]) -> dict[str, Any]:
    """The second target: every fixed delay breaks a budget, or writes more than 1.05x the
    adaptive policy's records, on at least one workload."""
    out: dict[str, Any] = {}
    for summaries in by_workload.values():
        adaptive = next((s for s in summaries if s["policy"] == "adaptive"), None)
        for s in summaries:
            if s["fixed_delay_ms"] is None or adaptive is None:
                continue
            entry = out.setdefault(s["policy"], {"breaks_budget_on": [], "writes_more_on": []})
            if not s["within_budgets"]:
                entry["breaks_budget_on"].append(s["workload"])
            if s["written"] > WRITE_RATIO_TARGET * adaptive["written"]:
                entry["writes_more_on"].append(s["workload"])
    for entry in out.values():
        entry["met"] = bool(entry["breaks_budget_on"] or entry["writes_more_on"])
    return out


def table(document: dict[str, Any]) -> str:
    head = ("| workload | policy | written | at-risk peak / mean MiB | at-risk records peak | "
            "buffer peak / mean MiB (of the throttle line) | sender-s peak | ack p50 / p99 ms "
            "| budgets |")
    lines = [head, "|" + "---|" * 9]
    for w in document["workloads"]:
        limits = w["budgets"]
        for s in w["runs"]:
            broken = [k for k, ok in s["budgets_kept"].items() if not ok]
            acks = s["guarantee_acks"]
            ack = (f"{acks['p50_ms']} / {acks['p99_ms']}" if acks["count"] else "-")
            lines.append(
                f"| {w['name']} | {s['policy']} | {100 * s['written_share']:.2f} % | "
                f"{s['at_risk_bytes']['peak_kafka_healthy'] / MIB:.1f} / "
                f"{s['at_risk_bytes']['mean'] / MIB:.1f} "
                f"(of {limits['risk_budget_bytes'] / MIB:.0f}) | "
                f"{s['at_risk_records']['peak_kafka_healthy']:,} "
                f"(of {limits['risk_budget_records']:,}) | "
                f"{s['buffer_bytes']['peak_kafka_healthy'] / MIB:.1f} / "
                f"{s['buffer_bytes']['mean'] / MIB:.1f} "
                f"(of {limits['memory_budget_bytes'] * BUFFER_THROTTLE_FROM / MIB:.1f}"
                f"{_throttled(s['throttled_s'])}) | "
                f"{s['sender_seconds']['peak_kafka_healthy']:,.0f} "
                f"(of {limits['sender_budget_s']:,.0f}) | {ack} | "
                f"{'kept' if not broken else 'BROKEN: ' + ', '.join(broken)} |")
    return "\n".join(lines)


def _throttled(seconds: float) -> str:
    return f"; throttled {seconds:.0f} s" if seconds else ""


def targets_text(document: dict[str, Any]) -> str:
    lines = ["Targets (issue 4):"]
    for w in document["workloads"]:
        v = w["verdict"]
        ratio = v.get("write_ratio")
        lines.append(
            f"  {w['name']:16} adaptive within budgets: {v.get('adaptive_within_budgets')}; "
            f"best fixed within budgets: {v['best_fixed_within_budgets']}; "
            f"written adaptive/best: {'-' if ratio is None else f'{ratio:.3f}'} "
            f"-> {'met' if v.get('met') else 'NOT MET'}")
    for policy, entry in document["fixed_policies"].items():
        lines.append(
            f"  {policy:16} breaks a budget on: {', '.join(entry['breaks_budget_on']) or '-'}; "
            f"writes >1.05x adaptive on: {', '.join(entry['writes_more_on']) or '-'} "
            f"-> {'met' if entry['met'] else 'NOT MET'}")
    cost = document.get("decision_cost")
    if cost:
        lines.append(
            f"  decision cost: decision() {cost['decision_us']:.2f} us alone, "
            f"{cost['decision_after_append_us']:.2f} us after an append; appended() "
            f"{cost['appended_us']:.2f} us, delivered() {cost['delivered_us']:.2f} us per call "
            f"(target <= {cost['target_us']} us) -> {'met' if cost['met'] else 'NOT MET'}")
    lines.append(f"  all targets met: {document['all_targets_met']}")
    return "\n".join(lines)
