"""Render the results of tests/faults/test_redis_durability.py (JSON files in a directory)
as the Markdown table of docs/redis-durability.md:

    KILN_FAULT_RESULTS=build/fault-results pytest tests/faults/test_redis_durability.py \
        tests/cluster/test_redis_cluster.py
    python -m tests.faults.durability_table build/fault-results
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

_MODE_NAMES = {
    "none": "no persistence",
    "aof-everysec": "AOF, `appendfsync everysec`",
    "aof-always": "AOF, `appendfsync always`",
    "sentinel-failover": "a replica, Sentinel failover",
    "redis-cluster-failover": "Redis Cluster, a master's replica takes over",
}


def table(results_dir: Path) -> str:
    runs = {}
    for path in sorted(results_dir.glob("redis-durability-*.json")):
        run = json.loads(path.read_text())
        runs[run["mode"]] = run
    lines = ["| Redis | level | acknowledged before the kill | of them lost "
             "| acknowledged after | of them lost |",
             "|---|---|---:|---:|---:|---:|"]
    for mode in [m for m in _MODE_NAMES if m in runs]:
        for row in runs[mode]["levels"]:
            lines.append(
                f"| {_MODE_NAMES[mode]} | {row['level']} | {row['acknowledged_before_kill']} "
                f"| {row['lost_before_kill']} | {row['acknowledged_after_kill']} "
                f"| {row['lost_after_kill']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(table(Path(sys.argv[1])))
