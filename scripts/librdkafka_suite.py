"""librdkafka's own transaction tests (0103, 0129, 0098) against Kiln, and as a control
directly against the Apache Kafka behind it.

Started by scripts/librdkafka_suite.sh, which builds librdkafka 2.0.2's test-runner (Debian
bookworm's source package) and passes ``--tests-dir``. This script starts what the tests
need, each stopped again by PID (or, for the in-process Kiln, closed) when it ends:

- a Redis (``redis-server``, as the test session's ``LocalRedis``), unless ``--redis-url``;
- a 3-broker Apache Kafka in KRaft mode (``LocalKafkaCluster(3)``): 0103 creates its topics
  with replication factor 3 (docs/transactions-design.md §11 Q1);
- Kiln in this process (``tests.kiln_harness.fresh_kiln``) with ``transactions_enabled``;

then runs ``TESTS=<n> ./test-runner`` per test, and for 0103 once per subtest
(``SUBTESTS=<selector>``: a failing subtest aborts the rest of its test, so run in one
process the first failure hides every later result). ``--target kafka`` runs the same
against the Kafka cluster directly (the control), ``--target both`` runs both. Each run's
output goes to ``<log-dir>/<target>-<test>-<n>.log``, Kiln's log to
``<log-dir>/kiln.log``; a table of (target, test, subtest, result, seconds) ends the run.

0098 first drives Apache Kafka's Java producer (``tests/java/TransactionProducerCli``, run
through ``$KAFKA_PATH/bin/kafka-run-class.sh``), then librdkafka's own producer, in one
process. ``KAFKA_PATH`` is a stand-in built here on the project's Kafka jars
(``.jvm/kafka``): ``libs/`` and a ``bin/kafka-run-class.sh`` that runs ``java -cp``.

``NNNN@VARIANT`` runs test NNNN from ``<tests-dir>/../tests-VARIANT``, a copy of the tests
with that one test adapted (built by librdkafka_suite.sh, which says what each changes):
``0129@kafka4`` (segment.bytes Apache Kafka 4 accepts), ``0098@rdkhalf`` (librdkafka
producer half only), ``0098@rconly`` (read_uncommitted checks reduced to a printed count),
``0098@rdkrc`` (both). Results of variants are not librdkafka's verdicts: they locate a
failure past the first one.

Exit status: 0 when every run passed (or was skipped), 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cli.local_kafka import LocalKafkaCluster, kafka_jars  # noqa: E402
from cli.local_services import LocalRedis  # noqa: E402
from storage.kafka.client import KafkaClient  # noqa: E402
from tests.kiln_harness import RunningKiln, fresh_kiln  # noqa: E402

# SUBTESTS selectors (substrings of "function:line: description", test.c test_sub_start)
# that pick exactly one subtest each, in the order main_0103_transactions runs them.
SUBTESTS: dict[str, list[str]] = {
    "0103": [
        "do_test_txn_local",  # 0103_transactions_local: needs no broker
        "do_test_misuse_txn",
        "without compression",
        "with compression",
        "do_test_consumer_producer_txn",
        ": do not produce after fence",
        ": produce after fence",
        "do_test_fatal_idempo_error_without_kip360",
        "don't send offsets, commit",
        "don't send offsets, abort",
        ": send offsets, commit",
        ": send offsets, abort",
        "do_test_wmark_isolation_level",
    ],
}
DEFAULT_TESTS = "0103,0129,0129@kafka4,0098,0098@rconly,0098@rdkrc"

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# A subtest is named "function:line" or "function:line: description" (test_sub_start).
_SUB_START = re.compile(r"\] \[ (?P<name>\w+:\d+(?:: [^\[\]]*?)?) \]\s*$")
_SUB_PASS = re.compile(r"\[ (?P<name>[^\[\]]+?): PASS \((?P<secs>[\d.]+)s\) \]")
_SUB_SKIP = re.compile(r"\[ (?P<name>[^\[\]]+?): SKIP: (?P<why>.*) \]")
_FAILED_AT = re.compile(r'### Test "(?P<test>.+?)" failed at (?P<where>\S+) at .*: ###$')
# 0098 has no subtests: it says which producer (half) and which numbered scenario it is in.
_SCENARIO = re.compile(r"\] (?:\[ Consumer transaction tests using (?P<half>\w+) producer"
                       r"|(?P<test>Test [\d.]+)(?: - .*)?$)")
_TEST_SKIPPED = re.compile(r"SKIPPING TEST: |=+ Test \S+ SKIPPED")


@dataclass
class Outcome:
    target: str
    test: str
    selector: str  # "" for the whole test
    result: str  # PASS, FAIL, SKIP, TIMEOUT
    seconds: float
    log_path: Path
    subtests: list[tuple[str, str]] = field(default_factory=list)  # (name, PASS/SKIP/...)
    failure: str = ""


def strip(text: str) -> str:
    return _ANSI.sub("", text)


def parse_output(text: str) -> tuple[list[tuple[str, str]], str, bool]:
    """(subtests seen with their result, the first failure's message, whether the test was
    skipped as a whole) from a test-runner's output."""
    subtests: dict[str, str] = {}
    failure = ""
    skipped = False
    half = scenario = ""
    lines = strip(text).splitlines()
    for i, line in enumerate(lines):
        if (m := _SCENARIO.search(line)) and not failure:
            if m["half"]:
                half, scenario = m["half"], ""
            else:
                scenario = m["test"]
        if m := _SUB_PASS.search(line):
            subtests[m["name"]] = "PASS"
        elif m := _SUB_SKIP.search(line):
            subtests[m["name"]] = f"SKIP ({m['why']})"
        elif m := _FAILED_AT.search(line):
            message = lines[i + 1].strip() if i + 1 < len(lines) else ""
            if not failure:
                where = f"[{half} producer, {scenario}] " if half else ""
                failure = f"{where}{m['where']}: {message}"
        elif (m := _SUB_START.search(line)) and ": PASS (" not in line:
            subtests.setdefault(m["name"], "FAIL")
        elif _TEST_SKIPPED.search(line):
            skipped = True
    return list(subtests.items()), failure, skipped


def kafka_path_stand_in(cache: Path) -> Path:
    """A directory that looks enough like an Apache Kafka release for librdkafka's tests:
    ``libs/`` (the project's Kafka jars) and ``bin/kafka-run-class.sh``."""
    root = cache / "kafka-path"
    (root / "bin").mkdir(parents=True, exist_ok=True)
    libs = root / "libs"
    jars = kafka_jars(ROOT)
    if libs.is_symlink() or libs.exists():
        libs.unlink()
    libs.symlink_to(jars)
    runner = root / "bin" / "kafka-run-class.sh"
    runner.write_text(
        "#!/bin/sh\n"
        "# Stand-in for Apache Kafka's bin/kafka-run-class.sh (scripts/librdkafka_suite.py)\n"
        'here="$(cd "$(dirname "$0")/.." && pwd)"\n'
        'exec java -Xmx256m -cp "${CLASSPATH:+$CLASSPATH:}$here/libs/*" "$@"\n')
    runner.chmod(0o755)
    return root


def write_conf(path: Path, bootstrap: str, multiplier: float, extra: list[str]) -> None:
    path.write_text("\n".join([
        f"metadata.broker.list={bootstrap}",
        f"test.timeout.multiplier={multiplier}",
        *extra,
    ]) + "\n")


def run_one(tests_dir: Path, env: dict[str, str], log_path: Path, timeout_s: float
            ) -> tuple[int | None, float, str]:
    """Run ./test-runner once; (exit code or None on our timeout, seconds, output)."""
    started = time.monotonic()
    with log_path.open("wb") as out:
        # Line-buffered stdout: test-runner's output otherwise comes twice, out of order with
        # its stderr, when a failing test aborts.
        stdbuf = ["stdbuf", "-oL"] if shutil.which("stdbuf") else []
        proc = subprocess.Popen([*stdbuf, "./test-runner", "-p1"], cwd=tests_dir, env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code: int | None = proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            # Its own process group (the Java producer of 0098 included), by its id.
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = None
    seconds = time.monotonic() - started
    return code, seconds, log_path.read_text(errors="replace")


def run_target(target: str, bootstrap: str, args: argparse.Namespace, log_dir: Path,
               kafka_path: Path | None) -> list[Outcome]:
    conf = log_dir / f"test-{target}.conf"
    write_conf(conf, bootstrap, args.timeout_multiplier, args.conf)
    base_env = {
        **os.environ,
        "RDKAFKA_TEST_CONF": str(conf),
        "TEST_KAFKA_VERSION": args.kafka_version,
        "LD_LIBRARY_PATH": ":".join(filter(None, [
            str(args.tests_dir.parent / "src"), str(args.tests_dir.parent / "src-cpp"),
            os.environ.get("LD_LIBRARY_PATH", "")])),
    }
    base_env.pop("CI", None)  # CI=... raises librdkafka's timeouts: keep runs comparable
    base_env.pop("SUBTESTS", None)
    if args.debug:
        base_env["TEST_DEBUG"] = args.debug
    if kafka_path is not None:
        base_env["KAFKA_PATH"] = str(kafka_path)
    outcomes: list[Outcome] = []
    for spec in args.tests:
        test, _, variant = spec.partition("@")
        tests_dir = args.tests_dir.parent / f"tests-{variant}" if variant else args.tests_dir
        if args.whole or test not in SUBTESTS:
            selectors = [""]
        elif args.subtests:  # the known selectors matching, else the words themselves
            selectors = [s for s in SUBTESTS[test] if any(w in s for w in args.subtests)]
            selectors = selectors or args.subtests
        else:
            selectors = SUBTESTS[test]
        for n, selector in enumerate(selectors):
            env = dict(base_env, TESTS=test)
            if selector:
                env["SUBTESTS"] = selector
            log_path = log_dir / f"{target}-{spec.replace('@', '-')}-{n:02d}.log"
            print(f"[librdkafka-suite] {target}: TESTS={test}"
                  + (f" SUBTESTS={selector!r}" if selector else "")
                  + (f" ({tests_dir.name})" if variant else ""), flush=True)
            code, seconds, output = run_one(tests_dir, env, log_path, args.run_timeout)
            subtests, failure, skipped = parse_output(output)
            if code is None:
                result = "TIMEOUT"
                failure = failure or f"no result after {args.run_timeout:.0f} s (killed)"
            elif code == 0:
                result = "SKIP" if skipped else "PASS"
            else:
                result = "FAIL"
                failure = failure or f"test-runner exited {code}"
            outcome = Outcome(target, spec, selector, result, seconds, log_path, subtests,
                              failure)
            print(f"[librdkafka-suite]   {result} in {seconds:.1f}s"
                  + (f": {failure}" if failure else ""), flush=True)
            outcomes.append(outcome)
    return outcomes


def print_summary(outcomes: list[Outcome]) -> None:
    rows = [("target", "test", "subtest", "result", "seconds", "detail")]
    for o in outcomes:
        named = [name for name, _ in o.subtests if o.selector == "" or o.selector in name]
        subtest = (named[0] if len(named) == 1 else o.selector) or "(whole test)"
        detail = o.failure
        if o.selector == "" and o.subtests:
            ok = sum(r == "PASS" or r.startswith("SKIP") for _, r in o.subtests)
            bad = [n for n, r in o.subtests if not (r == "PASS" or r.startswith("SKIP"))]
            detail = f"{ok}/{len(o.subtests)} subtests passed" + (
                f", not: {', '.join(bad)}" if bad else "") + (
                f"; {o.failure}" if o.failure else "")
        rows.append((o.target, o.test, subtest, o.result, f"{o.seconds:.1f}",
                     (detail[:140] + "…") if len(detail) > 141 else detail))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    print()
    for r in rows:
        print("  ".join(r[i].ljust(widths[i]) for i in range(5)) + "  " + r[5])
    passed = sum(o.result in ("PASS", "SKIP") for o in outcomes)
    print(f"\n{passed} passed, {len(outcomes) - passed} failed")


@contextmanager
def services(args: argparse.Namespace, log_dir: Path
             ) -> Iterator[tuple[str, str, RunningKiln | None]]:
    """(redis url, Kafka bootstrap, Kiln or None): started, and stopped on exit."""
    with ExitStack() as stack:
        redis_url = args.redis_url
        if not redis_url:
            redis = LocalRedis()
            redis.start()
            stack.callback(redis.stop)
            redis_url = redis.url
            print(f"[librdkafka-suite] Redis {redis_url} (pid {redis.pid})", flush=True)
        if args.kafka_bootstrap:
            bootstrap = args.kafka_bootstrap
        else:
            started = time.monotonic()
            cluster = LocalKafkaCluster(3, start_timeout=args.kafka_start_timeout).start()
            stack.callback(cluster.stop)
            bootstrap = cluster.bootstrap
            print(f"[librdkafka-suite] Kafka {bootstrap} (pids "
                  f"{', '.join(str(n.pid) for n in cluster.nodes)}; logs "
                  f"{', '.join(str(n.log_path) for n in cluster.nodes)}) in "
                  f"{time.monotonic() - started:.0f}s", flush=True)
        await_kafka(bootstrap)
        kiln: RunningKiln | None = None
        if "kiln" in args.targets:
            overrides = dict(transactions_enabled=True)
            for item in args.kiln_setting:
                key, _, value = item.partition("=")
                overrides[key] = value
            kiln = fresh_kiln(redis_url, bootstrap, **overrides)
            stack.callback(kiln.stop)
            print(f"[librdkafka-suite] Kiln {kiln.bootstrap} (in this process, log "
                  f"{log_dir / 'kiln.log'})", flush=True)
        yield redis_url, bootstrap, kiln


def await_kafka(bootstrap: str, timeout_s: float = 120) -> None:
    """Wait until the cluster's metadata lists every broker with a controller."""
    async def brokers() -> int:
        client = KafkaClient(bootstrap, client_id="librdkafka-suite")
        await client.start()
        try:
            meta = await client.metadata([])
            return len(meta.brokers)
        finally:
            await client.close()

    deadline = time.monotonic() + timeout_s
    expected = len(bootstrap.split(","))
    while True:
        try:
            if asyncio.run(brokers()) >= expected:
                return
        except Exception as exc:  # retried until the deadline
            if time.monotonic() > deadline:
                raise RuntimeError(f"Kafka {bootstrap} not ready: {exc}") from exc
        if time.monotonic() > deadline:
            raise RuntimeError(f"Kafka {bootstrap} lists fewer than {expected} brokers")
        time.sleep(1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tests-dir", type=Path, required=True,
                        help="librdkafka's tests/ directory with a built test-runner")
    parser.add_argument("--tests", default=DEFAULT_TESTS,
                        help=f"comma-separated test numbers (default {DEFAULT_TESTS}); "
                        "NNNN@VARIANT runs NNNN from <tests-dir>/../tests-VARIANT, e.g. "
                        "0129@kafka4 (built by librdkafka_suite.sh)")
    parser.add_argument("--subtests", default="",
                        help="comma-separated substrings: only the 0103 subtests matching "
                        "(each run alone)")
    parser.add_argument("--whole", action="store_true",
                        help="run each test in one process (as upstream) instead of per subtest")
    parser.add_argument("--target", dest="target", choices=("kiln", "kafka", "both"),
                        default="kiln", help="through Kiln (default), directly against "
                        "the Kafka cluster (the control), or both")
    parser.add_argument("--kafka-version", default="4.0.0",
                        help="TEST_KAFKA_VERSION (default 4.0.0; librdkafka's default 2.4.0 "
                        "skips the KIP-360 subtest)")
    parser.add_argument("--timeout-multiplier", type=float, default=2.0,
                        help="test.timeout.multiplier (default 2: a slow, shared machine)")
    parser.add_argument("--run-timeout", type=float, default=900,
                        help="seconds before one test-runner process is killed (default 900)")
    parser.add_argument("--conf", action="append", default=[],
                        help="an extra test.conf line (librdkafka property), repeatable")
    parser.add_argument("--debug", default="",
                        help="TEST_DEBUG: librdkafka debug contexts, e.g. eos,protocol,msg")
    parser.add_argument("--kiln-setting", action="append", default=[],
                        help="a Kiln setting override name=value, repeatable")
    parser.add_argument("--kiln-log-level", default="INFO")
    parser.add_argument("--redis-url", default="", help="use this Redis instead of starting one "
                        "(its database is emptied)")
    parser.add_argument("--kafka-bootstrap", default="",
                        help="use this Kafka instead of starting a 3-broker cluster")
    parser.add_argument("--kafka-start-timeout", type=float, default=240)
    parser.add_argument("--no-java", action="store_true",
                        help="no KAFKA_PATH stand-in: 0098's Java half cannot run")
    parser.add_argument("--log-dir", type=Path, default=None,
                        help="where outputs go (default <tests-dir>/../../runs/<time>)")
    args = parser.parse_args(argv)
    args.tests_dir = args.tests_dir.resolve()
    if not (args.tests_dir / "test-runner").exists():
        parser.error(f"no test-runner in {args.tests_dir}: run scripts/librdkafka_suite.sh")
    args.tests = [t.strip() for t in args.tests.split(",") if t.strip()]
    args.subtests = [s for s in args.subtests.split(",") if s]
    args.targets = ["kiln", "kafka"] if args.target == "both" else [args.target]
    cache = args.tests_dir.parent.parent
    log_dir = (args.log_dir or cache / "runs" / time.strftime("%Y%m%d-%H%M%S")).resolve()
    log_dir.mkdir(parents=True, exist_ok=True)

    handler = logging.FileHandler(log_dir / "kiln.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    logging.getLogger().handlers[:] = [handler]
    logging.getLogger().setLevel(args.kiln_log_level.upper())

    kafka_path = None if args.no_java else kafka_path_stand_in(cache)
    print(f"[librdkafka-suite] logs in {log_dir}", flush=True)
    outcomes: list[Outcome] = []
    with services(args, log_dir) as (_redis_url, bootstrap, kiln):
        for target in args.targets:
            address = kiln.bootstrap if target == "kiln" and kiln else bootstrap
            outcomes += run_target(target, address, args, log_dir, kafka_path)
    print_summary(outcomes)
    (log_dir / "summary.txt").write_text("\n".join(
        f"{o.target}\t{o.test}\t{o.selector}\t{o.result}\t{o.seconds:.1f}\t{o.failure}"
        for o in outcomes) + "\n")
    return 0 if all(o.result in ("PASS", "SKIP") for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
