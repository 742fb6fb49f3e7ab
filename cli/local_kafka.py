"""Apache Kafka brokers as local child processes, for the test suite and ``kiln dev``.

The broker runs from the jars scripts/setup.sh resolves from Maven Central into
``.jvm/kafka`` (``scripts/jvm/kafka/pom.xml``): ``kafka.Kafka`` in KRaft mode, each node
both broker and controller, its data in the service's working directory, so ``kill()`` and
``start()`` restart it on what it wrote to disk. ``LocalKafka`` is one node;
``LocalKafkaCluster`` three (a controller quorum of three, topics replicated across them),
for the tests that break a broker.

Like every local service it is stopped by PID (SIGTERM, a bounded wait, SIGKILL); nothing
here reads ``os.environ``.
"""

from __future__ import annotations

import atexit
import logging
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Self

from cli.local_services import (
    PROBE_TIMEOUT_S,
    ChildService,
    ExitedEarly,
    ServiceError,
    free_port,
    probe_kafka,
)

log = logging.getLogger(__name__)

KAFKA_VERSION = "4.4.0"  # scripts/jvm/kafka/pom.xml
_PROJECT_ROOT = Path(__file__).resolve().parents[1]
_LOG4J2 = """Configuration:
  Appenders:
    Console:
      name: STDOUT
      PatternLayout:
        pattern: "[%d] %p %m (%c)%n"
  Loggers:
    Root:
      level: WARN
      AppenderRef:
        - ref: STDOUT
    Logger:
      - name: kafka.server.KafkaServer
        level: INFO
      - name: kafka.server.BrokerServer
        level: INFO
"""
# A small cluster for tests: short waits where Kafka's defaults are tuned for production.
_TEST_DEFAULTS = {
    "group.initial.rebalance.delay.ms": "0",
    "num.partitions": "1",
    "auto.create.topics.enable": "true",
    "log.segment.bytes": str(64 * 1024 * 1024),
    # Kept whatever their timestamps: tests stamp records with fixed dates (2023, 2026-01-01)
    # that Kafka's default retention (7 days by record time) deletes at its first check,
    # 30 s after start and every 5 minutes, moving the log start from under a test's readers.
    "log.retention.ms": "-1",
}


def kafka_jars(root: Path = _PROJECT_ROOT) -> Path:
    """The folder of Apache Kafka's jars (broker, tools, Java client)."""
    jars = root / ".jvm" / "kafka"
    if not any(jars.glob("kafka_2.13-*.jar")):
        raise ServiceError(f"Apache Kafka's jars are not in {jars}; run scripts/setup.sh "
                           "(it resolves them from Maven Central with mvn)")
    return jars


def java_binary(search_path: str | None = None) -> str:
    found = shutil.which("java", path=search_path)
    if found is None:
        raise ServiceError("java not found on PATH; install a JDK 17+ (or run scripts/setup.sh)")
    return found


def kafka_command(main_class: str, *args: str, jars: Path | None = None,
                  heap: str = "256m") -> list[str]:
    """A command line running one of Kafka's main classes (a tool, the storage formatter)
    from the jars."""
    jars = kafka_jars() if jars is None else jars
    return [java_binary(), f"-Xmx{heap}", "-cp", f"{jars}/*", main_class, *args]


class LocalKafka(ChildService):
    """One Apache Kafka node on 127.0.0.1: broker and KRaft controller in one process.

    Alone (``voters`` None) it is a single-node cluster; ``LocalKafkaCluster`` gives each of
    its nodes the quorum and the ports of the others. ``config`` adds to or overrides the
    broker's properties.

    ``relays`` extra listeners each advertise a port of their own (``relayed(i)``): a
    client that reaches the broker through a relay on that port is told to come back
    through it, so a test can cut or hold the relay to take Kafka away from one client
    without restarting the broker.
    """

    name = "kafka"

    def __init__(
        self,
        port: int | None = None,
        *,
        node_id: int = 1,
        controller_port: int | None = None,
        voters: str | None = None,
        cluster_id: str | None = None,
        config: Mapping[str, str] | None = None,
        heap: str = "768m",
        jars: Path | None = None,
        start_timeout: float = 90.0,
        stop_timeout: float = 30.0,
        relays: int = 0,
    ) -> None:
        super().__init__(port=port, start_timeout=start_timeout, stop_timeout=stop_timeout,
                         env=None)
        self.node_id = node_id
        self._controller_port = controller_port
        self._voters = voters
        self._cluster_id = cluster_id
        self._config = dict(config or {})
        self._heap = heap
        self._jars = jars
        # (the broker's listening port, the port it tells clients) per relayed listener
        self._relays = [(free_port(), free_port()) for _ in range(relays)]

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def relayed(self, index: int) -> tuple[int, int]:
        """(the port the broker listens on, the port a relay must listen on) of relayed
        listener `index`."""
        return self._relays[index]

    @property
    def data_dir(self) -> Path:
        return self.workdir / "data"

    def _command(self, port: int, workdir: Path) -> list[str]:
        jars = kafka_jars() if self._jars is None else self._jars
        if self._controller_port is None:
            self._controller_port = free_port()
        voters = self._voters or f"{self.node_id}@127.0.0.1:{self._controller_port}"
        properties = workdir / "server.properties"
        properties.write_text(_properties({
            **_TEST_DEFAULTS,
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            "controller.quorum.voters": voters,
            "listeners": ",".join([f"PLAINTEXT://127.0.0.1:{port}",
                                   f"CONTROLLER://127.0.0.1:{self._controller_port}",
                                   *(f"RELAY{i}://127.0.0.1:{listen}"
                                     for i, (listen, _) in enumerate(self._relays))]),
            "advertised.listeners": ",".join([f"PLAINTEXT://127.0.0.1:{port}",
                                              *(f"RELAY{i}://127.0.0.1:{told}"
                                                for i, (_, told) in enumerate(self._relays))]),
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": ",".join([
                "PLAINTEXT:PLAINTEXT", "CONTROLLER:PLAINTEXT",
                *(f"RELAY{i}:PLAINTEXT" for i in range(len(self._relays)))]),
            "log.dirs": str(self.data_dir),
            "offsets.topic.replication.factor": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            **self._config,
        }))
        (workdir / "log4j2.yaml").write_text(_LOG4J2)
        if not (self.data_dir / "meta.properties").exists():
            self._format(jars, properties)
        return [java_binary(), f"-Xms{self._heap}", f"-Xmx{self._heap}",
                "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile={workdir / 'log4j2.yaml'}",
                "-cp", f"{jars}/*", "kafka.Kafka", str(properties)]

    def _format(self, jars: Path, properties: Path) -> None:
        """Format the node's storage (once: a restart keeps what is on disk)."""
        if self._cluster_id is None:
            self._cluster_id = random_cluster_id(jars)
        done = subprocess.run(
            kafka_command("kafka.tools.StorageTool", "format", "-t", self._cluster_id,
                          "-c", str(properties), "--ignore-formatted", jars=jars),
            capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            raise ExitedEarly(f"formatting Kafka's storage failed ({done.returncode}):\n"
                              f"{done.stdout}{done.stderr}")

    def _probe(self, port: int) -> None:
        probe_kafka("127.0.0.1", port, PROBE_TIMEOUT_S)


def random_cluster_id(jars: Path | None = None) -> str:
    done = subprocess.run(kafka_command("kafka.tools.StorageTool", "random-uuid", jars=jars),
                          capture_output=True, text=True, timeout=120, check=True)
    return done.stdout.strip().splitlines()[-1]


class LocalKafkaCluster:
    """Three Apache Kafka nodes on 127.0.0.1, each broker and controller, with topics
    replicated three ways by default (``min.insync.replicas`` 2, as a production cluster
    that must survive one broker). Each node can be killed and started again on its own."""

    def __init__(self, size: int = 3, *, config: Mapping[str, str] | None = None,
                 heap: str = "512m", start_timeout: float = 120.0) -> None:
        self._size = size
        self._config = dict(config or {})
        self._heap = heap
        self._start_timeout = start_timeout
        self.nodes: list[LocalKafka] = []

    @property
    def bootstrap(self) -> str:
        return ",".join(node.bootstrap for node in self.nodes)

    def start(self) -> Self:
        ports = [free_port() for _ in range(self._size)]
        controllers = [free_port() for _ in range(self._size)]
        voters = ",".join(f"{i + 1}@127.0.0.1:{controllers[i]}" for i in range(self._size))
        cluster_id = random_cluster_id()
        replicated = {
            "default.replication.factor": str(self._size),
            "min.insync.replicas": str(min(2, self._size)),
            "offsets.topic.replication.factor": str(self._size),
            "transaction.state.log.replication.factor": str(self._size),
            "transaction.state.log.min.isr": str(min(2, self._size)),
            **self._config,
        }
        self.nodes = [LocalKafka(ports[i], node_id=i + 1, controller_port=controllers[i],
                                 voters=voters, cluster_id=cluster_id, config=replicated,
                                 heap=self._heap, start_timeout=self._start_timeout)
                      for i in range(self._size)]
        try:
            start_together(self.nodes)
        except BaseException:
            self.stop()
            raise
        atexit.register(self.stop)
        return self

    def stop(self) -> None:
        atexit.unregister(self.stop)
        for node in self.nodes:
            node.request_stop()
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_together(services: Sequence[ChildService]) -> None:
    """Spawn every service, then wait for each: the nodes of a quorum answer only once
    enough of them run."""
    for service in services:
        service.spawn()
    for service in services:
        service.await_ready()


def _properties(values: Mapping[str, str]) -> str:
    return "".join(f"{key}={value}\n" for key, value in values.items())


__all__ = ["KAFKA_VERSION", "LocalKafka", "LocalKafkaCluster", "java_binary", "kafka_command",
           "kafka_jars"]
