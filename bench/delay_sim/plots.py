"""One PNG per workload (matplotlib, the optional `bench` extra): the delay over time per
policy, at-risk bytes and buffer memory against their budgets, and the share written."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.delay_sim.engine import RunResult
from bench.delay_sim.model import Workload
from storage.policy.adaptive import BUFFER_THROTTLE_FROM

MIB = 1024 * 1024


def available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def plot_workload(workload: Workload, runs: Sequence[RunResult],
                  summaries: Sequence[dict[str, Any]], out_dir: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    main_topic = next((t.name for t in workload.topics if t.subscriptions),
                      workload.topics[0].name)
    fig, axes = plt.subplots(2, 2, figsize=(14, 9))
    (ax_delay, ax_risk), (ax_buffer, ax_written) = axes
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, run in enumerate(runs):
        adaptive = run.policy == "adaptive"
        extra = run.fixed_delay_ms is None and not adaptive
        style = {"color": colors[i % len(colors)], "linewidth": 2.2 if adaptive else 1.0,
                 "alpha": 1.0 if adaptive else 0.75, "label": run.policy,
                 "linestyle": "--" if extra else "-", "zorder": 3 if adaptive else 2}
        t = run.series["t_s"]
        ax_delay.step(t, [d / 1000 for d in run.delay_series[main_topic]], where="post",
                      **style)
        ax_risk.plot(t, [b / MIB for b in run.series["at_risk_bytes"]], **style)
        ax_buffer.plot(t, [b / MIB for b in run.series["buffer_bytes"]], **style)
    limits = workload.limits
    ax_delay.set_yscale("symlog", linthresh=0.1)
    ax_delay.set_title(f"delay of `{main_topic}` (s)")
    risk_line = ax_risk.axhline(limits.risk_budget_bytes / MIB, color="red", linestyle="--",
                                label="risk budget")
    ax_risk.set_title("at-risk bytes (MiB): acknowledged, not hardened nor delivered")
    memory_line = ax_buffer.axhline(BUFFER_THROTTLE_FROM * limits.memory_budget_bytes / MIB,
                                    color="red", linestyle="--",
                                    label="producers throttled above (budget kept below)")
    ax_buffer.axhline(limits.memory_budget_bytes / MIB, color="red", linestyle=":",
                      linewidth=0.8, label="memory budget: producers refused")
    ax_buffer.set_title("buffer memory (MiB)")
    for ax in (ax_delay, ax_risk, ax_buffer):
        ax.set_xlabel("virtual time (s)")
        ax.axvline(workload.duration_ms / 1000, color="grey", linestyle=":", linewidth=1)
        for start, end in workload.unhealthy_windows():
            ax.axvspan(start / 1000, end / 1000, color="orange", alpha=0.12)
        for start, end in workload.kafka.failures:
            ax.axvspan(start / 1000, end / 1000, color="red", alpha=0.12)
        for topic in workload.topics:
            for sub in topic.subscriptions:
                for start, end in sub.outages:
                    ax.axvspan(start / 1000, end / 1000, color="grey", alpha=0.15)
    ax_delay.legend(fontsize=8, loc="upper left")
    ax_risk.legend(fontsize=8, loc="upper left", handles=[risk_line])
    ax_buffer.legend(fontsize=8, loc="upper left",
                     handles=[memory_line, ax_buffer.get_lines()[len(runs) + 1]])
    names = [s["policy"] for s in summaries]
    shares = [100 * s["written_share"] for s in summaries]
    bar_colors = [colors[i % len(colors)] for i in range(len(summaries))]
    bars = ax_written.bar(names, shares, color=bar_colors)
    for bar, s in zip(bars, summaries, strict=True):
        if not s["within_budgets"]:
            bar.set_hatch("//")
            bar.set_edgecolor("red")
        label = f"{bar.get_height():.1f}%" + ("" if s["within_budgets"] else "\nbudget broken")
        ax_written.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                            ha="center", va="bottom", fontsize=8)
    ax_written.set_ylim(0, 115)
    ax_written.set_title("records written to Kafka (%); hatched: a budget broken")
    ax_written.tick_params(axis="x", labelsize=8, labelrotation=20)
    fig.suptitle(f"{workload.name}: {workload.description}", fontsize=9, wrap=True)
    fig.tight_layout()
    path = out_dir / f"{workload.name}.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
