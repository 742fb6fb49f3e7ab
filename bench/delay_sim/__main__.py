"""python -m bench.delay_sim: replay the workloads under every policy and judge the targets.

    python -m bench.delay_sim                          # everything, a few minutes
    python -m bench.delay_sim --workloads steady,bursty --policies adaptive,"fixed 10 s"
    python -m bench.delay_sim --json-out out.json      # JSON to a file, table on stdout
    python -m bench.delay_sim --jobs 2                 # runs in parallel processes

JSON goes to stdout (or --json-out) and to OUT/results.json; the table and the verdicts go
to stderr (stdout with --json-out); one PNG per workload goes to OUT (default
bench/results/delay_sim/, which git ignores) when matplotlib (the `bench` extra) is there.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.delay_sim import cost, plots
from bench.delay_sim.engine import Policy, RunResult, simulate
from bench.delay_sim.model import Workload
from bench.delay_sim.report import (
    fixed_verdicts,
    run_summary,
    table,
    targets_text,
    workload_verdict,
)
from bench.delay_sim.workloads import WORKLOADS

DEFAULT_OUT = Path("bench/results/delay_sim")


def _run(args: tuple[Workload, Policy]) -> tuple[RunResult, float]:
    began = time.perf_counter()
    result = simulate(*args)
    return result, time.perf_counter() - began


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.delay_sim", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", default=",".join(WORKLOADS),
                        help="comma-separated, from: " + ", ".join(WORKLOADS))
    parser.add_argument("--policies", default=",".join(p.name for p in Policy.all()),
                        help="comma-separated, from: " + ", ".join(
                            p.name for p in (*Policy.all(), *Policy.extras())))
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help="directory for the PNGs and results.json")
    parser.add_argument("--json-out", type=Path, help="write the JSON here, not to stdout")
    parser.add_argument("--series", action="store_true",
                        help="include the per-second time series in the JSON")
    parser.add_argument("--no-plots", action="store_true")
    parser.add_argument("--no-cost", action="store_true", help="skip the decision-cost timing")
    parser.add_argument("--jobs", type=int, default=1, help="parallel processes")
    args = parser.parse_args(argv)

    names = [n.strip() for n in args.workloads.split(",") if n.strip()]
    unknown = [n for n in names if n not in WORKLOADS]
    policies_by_name = {p.name: p for p in (*Policy.all(), *Policy.extras())}
    wanted = [n.strip() for n in args.policies.split(",") if n.strip()]
    unknown += [n for n in wanted if n not in policies_by_name]
    if unknown:
        parser.error(f"unknown workload or policy: {', '.join(unknown)}")
    workloads = [WORKLOADS[n] for n in names]
    policies = [policies_by_name[n] for n in wanted]
    jobs = [(w, p) for w in workloads for p in policies]

    began = time.perf_counter()
    if args.jobs > 1:
        with ProcessPoolExecutor(args.jobs) as pool:
            outcomes = list(pool.map(_run, jobs))
    else:
        outcomes = []
        for job in jobs:
            outcomes.append(_run(job))
            print(f"  {job[0].name} / {job[1].name}: {outcomes[-1][1]:.1f} s", file=sys.stderr)
    sim_s = time.perf_counter() - began

    out_dir: Path = args.out
    out_dir.mkdir(parents=True, exist_ok=True)
    can_plot = not args.no_plots and plots.available()
    document: dict[str, Any] = {"workloads": []}
    summaries_by_workload: dict[str, list[dict[str, Any]]] = {}
    pngs: list[str] = []
    for w in workloads:
        runs = [r for (r, _), (jw, _) in zip(outcomes, jobs, strict=True) if jw is w]
        seconds = [s for (_, s), (jw, _) in zip(outcomes, jobs, strict=True) if jw is w]
        summaries = [run_summary(r, w) for r in runs]
        for summary, run, s in zip(summaries, runs, seconds, strict=True):
            summary["sim_seconds"] = round(s, 2)
            if args.series:
                summary["series"] = {**run.series, "delay_ms": run.delay_series}
        summaries_by_workload[w.name] = summaries
        entry = {
            "name": w.name, "description": w.description, "why_budgets": w.why_budgets,
            "budgets": asdict(w.limits),
            "duration_ms": w.duration_ms, "tail_ms": w.tail_ms, "step_ms": w.step_ms,
            "kafka": asdict(w.kafka),
            "budgets_not_judged_ms": [list(x) for x in w.unhealthy_windows()],
            "topics": [asdict(t) for t in w.topics],
            "runs": summaries,
            "verdict": workload_verdict(summaries),
        }
        if can_plot:
            path = plots.plot_workload(w, runs, summaries, out_dir)
            entry["plot"] = str(path)
            pngs.append(str(path))
        document["workloads"].append(entry)
    document["fixed_policies"] = fixed_verdicts(summaries_by_workload)
    if not args.no_cost:
        document["decision_cost"] = cost.decision_cost()
    full = (len(workloads) == len(WORKLOADS)
            and {p.name for p in Policy.all()} <= {p.name for p in policies})
    met = [w["verdict"].get("met", False) for w in document["workloads"]]
    met += [e["met"] for e in document["fixed_policies"].values()]
    if "decision_cost" in document:
        met.append(document["decision_cost"]["met"])
    document["all_targets_met"] = all(met) if full else None
    skipped = ("--no-plots" if args.no_plots
               else "matplotlib is not installed (pip install -e '.[bench]')")
    document["plots"] = pngs if can_plot else f"skipped: {skipped}"
    document["environment"] = {"python": platform.python_version(),
                               "simulated_seconds_wall": round(sim_s, 1)}

    text = json.dumps(document, indent=2)
    (out_dir / "results.json").write_text(text + "\n")
    report_stream = sys.stderr
    if args.json_out is not None:
        args.json_out.write_text(text + "\n")
        report_stream = sys.stdout
    else:
        print(text)
    print(table(document), file=report_stream)
    print(targets_text(document), file=report_stream)
    if can_plot:
        print("plots: " + ", ".join(pngs), file=report_stream)
    else:
        print(f"plots {document['plots']}", file=report_stream)
    return 0


if __name__ == "__main__":
    sys.exit(main())
