"""`kiln serve --workers N`: N nodes on one machine on consecutive ports, clients routed
across them, a crashed worker started again, a planned shutdown of all hardening
everything."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
from collections import defaultdict
from pathlib import Path
from typing import Any

from click.testing import CliRunner
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from cli.local_services import free_port
from cli.main import main
from tests.faults.kiln_process import kiln_executable
from tests.integration.test_produce_harden import read_hardened
from tests.kiln_harness import eventually, sync_redis

PARTITIONS = 12


def free_port_pair() -> int:
    """A port free now whose next one is free too."""
    for _ in range(50):
        port = free_port()
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise AssertionError("no two consecutive free ports")


def live_nodes(redis_url: str) -> dict[int, dict[str, Any]]:
    result = CliRunner().invoke(main, ["nodes", "--json", "--redis-url", redis_url])
    assert result.exit_code == 0, result.output
    return {row["node_id"]: row for row in json.loads(result.output) if row["state"] == "live"}


def test_two_workers_serve_as_two_nodes_and_a_planned_shutdown_hardens_all(
        redis_url: str, kafka_bootstrap: str, unique_topic: str, tmp_path: Path) -> None:
    # Given `kiln serve --workers 2` on a port whose next one is free
    sync_redis(redis_url).flushdb()
    port = free_port_pair()
    log = (tmp_path / "workers.log").open("wb")
    supervisor = subprocess.Popen(
        [kiln_executable(), "serve", "--workers", "2", "--listen", f"127.0.0.1:{port}",
         "--redis-url", redis_url, "--kafka-bootstrap", kafka_bootstrap,
         "--delay-policy", "fixed", "--harden-delay-ms", "600000", "--http-listen", "",
         "--node-heartbeat-ms", "200", "--node-session-timeout-ms", "1000"],
        stdout=log, stderr=subprocess.STDOUT,
        env={k: v for k, v in os.environ.items() if not k.startswith("KILN_")})
    try:
        # Then two nodes run, on the port and the next one
        addresses = {f"127.0.0.1:{port}", f"127.0.0.1:{port + 1}"}
        assert eventually(lambda: {n["address"] for n in live_nodes(redis_url).values()}
                          == addresses, timeout_s=30), (tmp_path / "workers.log").read_text()
        bootstrap = f"127.0.0.1:{port}"
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(unique_topic, PARTITIONS, 1)])[unique_topic].result(30)

        def told_both() -> bool:
            meta = admin.list_topics(unique_topic, timeout=10)
            return {f"{b.host}:{b.port}" for b in meta.brokers.values()} == addresses and \
                len({p.leader for p in meta.topics[unique_topic].partitions.values()}) == 2
        assert eventually(told_both)

        # When a producer that knows only the first produces to every partition
        producer = Producer({"bootstrap.servers": bootstrap, "acks": 1})
        sent: dict[int, list[bytes]] = defaultdict(list)
        for i in range(PARTITIONS * 20):
            producer.produce(unique_topic, value=b"w%d" % i, partition=i % PARTITIONS,
                             on_delivery=lambda err, msg: err is None and sent[
                                 msg.partition()].append(msg.value()))
        assert producer.flush(30) == 0
        assert sum(map(len, sent.values())) == PARTITIONS * 20

        # and one worker is killed: it is started again under the same node id
        before = live_nodes(redis_url)
        victim = next(n for n in before.values() if n["address"].endswith(f":{port + 1}"))
        os.kill(victim["pid"], signal.SIGKILL)
        assert eventually(lambda: any(
            n["address"] == victim["address"] and n["pid"] != victim["pid"]
            for n in live_nodes(redis_url).values()), timeout_s=30)
        assert {n["node_id"]: n["address"] for n in live_nodes(redis_url).values()} == {
            n["node_id"]: n["address"] for n in before.values()}

        # When the supervisor is told to stop (a planned shutdown)
        supervisor.send_signal(signal.SIGTERM)
        code = supervisor.wait(timeout=90)
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
            supervisor.wait()
        log.close()

    # Then it exits cleanly with both nodes gone, and Kafka holds every record, in order
    assert code == 0, (tmp_path / "workers.log").read_text()[-3000:]
    assert live_nodes(redis_url) == {}
    for partition, values in sent.items():
        assert [r.value for r in read_hardened(kafka_bootstrap, unique_topic, partition,
                                               len(values))] == values
