"""The multi-node tier: several Kiln nodes on one Redis and one Kafka, as a cluster of Kiln
nodes runs. In-process nodes for routing (`kiln_cluster`); `kiln serve` child processes
where a node must be killed or paused (tests/faults/kiln_process.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from tests.kiln_harness import RunningKiln, empty_redis, eventually, start_kiln

NODES = 3
# Short heartbeats and sessions, so that nodes learn of each other (and of a dead one)
# within a test's patience; the defaults are 1000 and 3000 ms.
HEARTBEAT_MS = 200
SESSION_MS = 1_000


def start_cluster(redis_url: str, kafka_bootstrap: str, nodes: int = NODES,
                  **overrides: object) -> list[RunningKiln]:
    """`nodes` in-process Kiln nodes on an emptied Redis, returned once every one of them
    sees all of them live."""
    empty_redis(redis_url)
    started: list[RunningKiln] = []
    try:
        for _ in range(nodes):
            started.append(start_kiln(redis_url, kafka_bootstrap,
                                      node_heartbeat_ms=HEARTBEAT_MS,
                                      node_session_timeout_ms=SESSION_MS, **overrides))
        ids = {k.app.node_id for k in started}
        assert eventually(lambda: all(
            {n.node_id for n in k.app.membership.live_nodes()} == ids for k in started)), \
            "the nodes did not see each other"
    except BaseException:
        for kiln in started:
            kiln.stop()
        raise
    return started


@contextmanager
def running_nodes(redis_url: str, kafka_bootstrap: str, nodes: int = NODES,
                  **overrides: object) -> Iterator[list[RunningKiln]]:
    """start_cluster's nodes by node id, every one stopped on the way out."""
    started = sorted(start_cluster(redis_url, kafka_bootstrap, nodes, **overrides),
                     key=lambda k: k.app.node_id)
    try:
        yield started
    finally:
        for kiln in started:
            kiln.stop()


@pytest.fixture
def kiln_cluster(redis_url: str, kafka_bootstrap: str) -> Iterator[list[RunningKiln]]:
    """Three in-process nodes, by node id (0, 1, 2); a test that stops one removes it."""
    with running_nodes(redis_url, kafka_bootstrap) as nodes:
        yield nodes
