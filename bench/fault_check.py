"""The randomized fault checker (tests/faults/checker.py) for as long as you like: faults of
every kind at random moments while producers and a consumer group work through Kiln, then
the whole history checked. Prints a table of faults injected and anomalies found on stderr
and the report as JSON on stdout; a run with anomalies keeps its history in --workdir.

    python -m bench.fault_check --minutes 30            # about 630 faults
    python -m bench.fault_check --minutes 36 --mean-gap-s 0.5   # about 1,000 (983 measured)
    python -m bench.fault_check --minutes 2 --seed 7    # replay a seed
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

from bench.produce import kiln_source, stop_on_signals
from tests.faults.checker import CheckerConfig, run_checker


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--rate", type=int, default=300, help="records/s per producer")
    parser.add_argument("--mean-gap-s", type=float, default=1.5,
                        help="mean pause between one fault's end and the next")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="where Kiln's log and failing histories go (default: a new "
                             "temporary directory, kept)")
    args = parser.parse_args()
    stop_on_signals()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="kiln-fault-check-"))
    started = time.monotonic()
    report = run_checker(
        CheckerConfig(duration_s=args.minutes * 60, seed=seed, workdir=workdir,
                      rate=args.rate, mean_gap_s=args.mean_gap_s),
        progress=lambda line: print(line, file=sys.stderr, flush=True))
    doc = {"seed": seed, "minutes": args.minutes, "seconds": round(time.monotonic() - started),
           "faults": dict(report.faults), "faults_total": sum(report.faults.values()),
           "counts": report.counts, "anomalies": report.anomalies,
           "history": report.history_path, "workdir": str(workdir), "source": kiln_source()}
    print(json.dumps(doc, indent=2))
    print(report.table(), file=sys.stderr)
    sys.exit(1 if report.anomalies else 0)


if __name__ == "__main__":
    main()
