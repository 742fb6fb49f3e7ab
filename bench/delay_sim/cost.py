"""What a decision and an observation cost: µs per `DelayObserver.decision()`,
`appended()` and `delivered()` call, on an observer warmed up by a simulated workload (so its
windows, sketch and partitions hold realistic state).

A decision reuses the controller's ceiling while none of its inputs moved (see
storage/policy/observer.py), so it is timed twice: alone (calls spread over a second of
virtual time, nothing observed in between: the ceiling is recomputed only as the rate
window's 100 ms buckets turn) and right after an append (every decision recomputes it, as
under load, when appends arrive between any two hardener passes). The second is the cost of
an (append, decision) pair less that of the append alone.

Each figure is the best of many short runs (2,000 calls each): on a shared machine a long
run is mostly a measure of the other work; a short one often runs undisturbed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from bench.delay_sim.engine import Policy, Simulation
from bench.delay_sim.workloads import many_senders

TARGET_US = 5.0


def _best_us(fn: Callable[[int], None], calls: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        fn(calls)
        best = min(best, time.perf_counter() - began)
    return best / calls * 1e6


def decision_cost(calls: int = 2_000, repeats: int = 200, warm_ms: int = 60_000
                  ) -> dict[str, Any]:
    # 500 senders and 8 partitions: the largest sender window and partition set simulated.
    sim = Simulation(many_senders(), Policy("adaptive"))
    now = 0
    while now < warm_ms:
        sim.step(now)
        now += sim.workload.step_ms
    observer = sim.observer
    topic = sim.topics[0]
    name = topic.spec.name
    parts = topic.partitions
    senders = topic.sender_ids
    # Calls spread over one second of virtual time, again and again: the observer's windows
    # keep the state the workload gave them (none of it expires during the timing).
    span_ms = 1_000
    offsets = [p.next for p in parts]
    marks = [p.delivered for p in parts]
    tick = [0]  # calls so far, so that each run carries on where the last one stopped

    def decisions(n: int) -> None:
        start = tick[0]
        for i in range(start, start + n):
            observer.decision(name, now + i % span_ms)
        tick[0] = start + n

    def appends(n: int, decide: bool = False) -> None:
        start = tick[0]
        for i in range(start, start + n):
            j = i % len(parts)
            offsets[j] += 4
            at = now + i % span_ms
            observer.appended(parts[j].tp, senders[i % len(senders)], 4, 1024, offsets[j], at)
            if decide:
                observer.decision(name, at)
        tick[0] = start + n

    def appends_and_decisions(n: int) -> None:
        appends(n, decide=True)

    def deliveries(n: int) -> None:
        # Each call moves one partition's delivered mark by a few records, as a commit does.
        start = tick[0]
        for i in range(start, start + n):
            j = i % len(parts)
            marks[j] = min(marks[j] + 3, offsets[j])
            observer.delivered(parts[j].tp, marks[j], now + i % span_ms)
        tick[0] = start + n

    decision_us = _best_us(decisions, calls, repeats)
    appended_us = _best_us(appends, calls, repeats)
    paired_us = _best_us(appends_and_decisions, calls, repeats)
    delivered_us = _best_us(deliveries, calls, repeats)
    after_append_us = max(0.0, paired_us - appended_us)
    return {
        "decision_us": round(decision_us, 3),
        "decision_after_append_us": round(after_append_us, 3),
        "appended_us": round(appended_us, 3),
        "delivered_us": round(delivered_us, 3),
        "calls": calls, "repeats": repeats,
        "state": {"senders": len(senders), "partitions": len(parts), "warm_ms": warm_ms},
        "target_us": TARGET_US,
        "met": max(decision_us, after_append_us, appended_us, delivered_us) <= TARGET_US,
    }
