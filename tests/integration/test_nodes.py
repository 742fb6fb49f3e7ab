"""Kiln nodes sharing one Redis (storage/nodes.py): each registers under an id of its own,
renews it with a heartbeat, keeps it across a restart at the same address, is seen dead when
killed or paused, and is refused an id a live node holds. Real Redis, real `kiln serve`
processes where a kill or a pause is the point."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
import redis
import redis.asyncio as aioredis
from click.testing import CliRunner
from confluent_kafka.admin import AdminClient

from cli.app import StartupError
from cli.local_services import free_port
from cli.main import main
from storage.nodes import (
    NODES_KEY,
    KilnNode,
    Membership,
    NodeSettings,
    decode_node,
    read_nodes,
)
from tests.faults.kiln_process import KilnProcess
from tests.kiln_harness import RunningKiln, eventually, start_kiln

T = TypeVar("T")
SESSION_MS = 1500  # a dead node is seen dead this long after its last heartbeat
HEARTBEAT_MS = 300


def registered(redis_url: str) -> dict[int, KilnNode]:
    """The registrations in Redis, by node id, as every process reads them."""
    raw = redis.Redis.from_url(redis_url).hgetall(NODES_KEY)
    return {n.node_id: n for k, v in raw.items() if (n := decode_node(k, v)) is not None}


def live(redis_url: str) -> dict[int, KilnNode]:
    now = int(time.time() * 1000)
    return {i: n for i, n in registered(redis_url).items() if n.live(now)}


def metadata_broker_ids(bootstrap: str) -> set[int]:
    meta = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10)
    return set(meta.brokers)


@pytest.fixture
def nodes_cleared(redis_url: str) -> Iterator[str]:
    """No registration of an earlier test is left (a killed process's would hold its id)."""
    redis.Redis.from_url(redis_url).delete(NODES_KEY)
    yield redis_url


@pytest.fixture
def node_process(nodes_cleared: str, kafka_bootstrap: str, tmp_path: Path
                 ) -> Iterator[KilnProcess]:
    process = KilnProcess(free_port(), nodes_cleared, kafka_bootstrap, 200,
                          tmp_path / "node.log",
                          extra_args=["--node-heartbeat-ms", str(HEARTBEAT_MS),
                                      "--node-session-timeout-ms", str(SESSION_MS)])
    try:
        yield process
    finally:
        process.stop()


def test_nodes_on_one_redis_take_distinct_ids_and_deregister_when_stopped(
        nodes_cleared: str, kafka_bootstrap: str) -> None:
    # Given three Kiln nodes started on the same Redis without a node id
    kilns: list[RunningKiln] = []
    try:
        for _ in range(3):
            kilns.append(start_kiln(nodes_cleared, kafka_bootstrap))
        # Then each took an id no other holds, the lowest free ones, and every node tells
        # clients of all three (once a heartbeat read the nodes that came after it)
        ids = [k.app.node_id for k in kilns]
        assert sorted(ids) == [0, 1, 2]
        for kiln in kilns:
            assert eventually(lambda k=kiln: metadata_broker_ids(k.bootstrap) == {0, 1, 2})
            assert kiln.settings.node_id == kiln.app.node_id
        # and Redis lists them live, with the addresses they are reached at
        nodes = live(nodes_cleared)
        assert {i: nodes[i].address for i in nodes} == {
            k.app.node_id: k.bootstrap for k in kilns}
        assert {nodes[k.app.node_id].http for k in kilns} == {
            f"127.0.0.1:{k.app.http_port}" for k in kilns}
        # When the middle one stops (a planned shutdown)
        stopped = kilns.pop(1)
        stopped.stop()
        # Then its registration is gone at once, the others' stay
        assert set(registered(nodes_cleared)) == {k.app.node_id for k in kilns}
    finally:
        for kiln in kilns:
            kiln.stop()


def test_an_id_a_live_node_holds_is_refused_at_start(nodes_cleared: str,
                                                     kafka_bootstrap: str) -> None:
    # Given a node that took id 7
    with start_kiln(nodes_cleared, kafka_bootstrap, node_id=7) as first:
        assert first.app.node_id == 7
        # When another node at another address is configured with id 7
        with pytest.raises(StartupError, match="node_id: node id 7 is held by the live node "
                                               f"at {first.bootstrap}"):
            start_kiln(nodes_cleared, kafka_bootstrap, node_id=7)
        # Then the first keeps it, registered and ready
        assert live(nodes_cleared)[7].address == first.bootstrap
        assert first.call(first.app.readiness.report()).ready


def test_a_node_lost_by_redis_registers_again_under_its_id(nodes_cleared: str,
                                                           kafka_bootstrap: str) -> None:
    with start_kiln(nodes_cleared, kafka_bootstrap, node_heartbeat_ms=HEARTBEAT_MS,
                    node_session_timeout_ms=SESSION_MS) as kiln:
        node_id = kiln.app.node_id
        # When Redis loses the registration (restarted empty, flushed)
        redis.Redis.from_url(nodes_cleared).delete(NODES_KEY)
        # Then the next heartbeat registers the node again, under the same id
        assert eventually(lambda: node_id in live(nodes_cleared), timeout_s=5)
        assert live(nodes_cleared)[node_id].address == kiln.bootstrap
        assert kiln.app.membership.member


def test_a_killed_node_is_seen_dead_and_keeps_its_id_when_it_restarts(
        node_process: KilnProcess, nodes_cleared: str, kafka_bootstrap: str) -> None:
    # Given a node process and an in-process node beside it
    node_process.start()
    with start_kiln(nodes_cleared, kafka_bootstrap) as other:
        [killed_id] = [i for i, n in live(nodes_cleared).items()
                       if n.address == node_process.bootstrap]
        assert killed_id != other.app.node_id
        # When the process is killed (kill -9: nothing deregisters it)
        node_process.kill()
        killed_at = time.monotonic()
        # Then the others see it dead once its session is over
        assert eventually(lambda: killed_id not in live(nodes_cleared), timeout_s=5)
        assert time.monotonic() - killed_at >= (SESSION_MS - HEARTBEAT_MS) / 1000 - 0.1
        # and a node started meanwhile does not take its id
        with start_kiln(nodes_cleared, kafka_bootstrap) as newcomer:
            assert newcomer.app.node_id not in (killed_id, other.app.node_id)
        # When it is started again at the same address, it is the same node
        node_process.start()
        assert live(nodes_cleared)[killed_id].address == node_process.bootstrap
        # (and tells clients of the others once it reads them)
        assert eventually(lambda: metadata_broker_ids(node_process.bootstrap)
                          == set(live(nodes_cleared)))


def test_a_paused_node_is_seen_dead_and_is_a_member_again_when_it_wakes(
        node_process: KilnProcess, nodes_cleared: str) -> None:
    node_process.start()
    [(node_id, before)] = live(nodes_cleared).items()
    # When the process is paused past its session (SIGSTOP)
    node_process.pause()
    try:
        assert eventually(lambda: node_id not in live(nodes_cleared), timeout_s=5)
    finally:
        node_process.resume()
    # Then on waking it renews the same registration (the same process: its incarnation)
    assert eventually(lambda: node_id in live(nodes_cleared), timeout_s=5)
    after = live(nodes_cleared)[node_id]
    assert (after.incarnation, after.pid) == (before.incarnation, before.pid)
    assert after.renewed_ms > before.renewed_ms


def test_kiln_nodes_lists_live_and_dead_nodes(node_process: KilnProcess, nodes_cleared: str,
                                              kafka_bootstrap: str) -> None:
    node_process.start()
    node_process.kill()
    with start_kiln(nodes_cleared, kafka_bootstrap) as kiln:
        assert eventually(lambda: len(live(nodes_cleared)) == 1, timeout_s=5)
        result = CliRunner().invoke(main, ["nodes", "--json", "--redis-url", nodes_cleared])
        assert result.exit_code == 0, result.output
        rows = {row["node_id"]: row for row in json.loads(result.output)}
        assert {i: (r["state"], r["address"]) for i, r in rows.items()} == {
            kiln.app.node_id: ("live", kiln.bootstrap),
            **{i: ("dead", node_process.bootstrap) for i in rows if i != kiln.app.node_id}}
        assert len(rows) == 2
        table = CliRunner().invoke(main, ["nodes", "--redis-url", nodes_cleared])
        assert table.exit_code == 0
        assert table.output.splitlines()[0].split() == [
            "NODE_ID", "STATE", "ADDRESS", "HTTP", "PID", "UP_S", "HEARD_S_AGO", "PARTITIONS",
            "GROUPS", "IN_REC_S", "IN_MB_S"]


def test_two_nodes_on_one_host_start_with_default_http_ports(
        nodes_cleared: str, kafka_bootstrap: str, tmp_path: Path) -> None:
    # Given two `kiln serve` on one host with the default http_listen ("auto")
    first_port = free_port()
    processes = [KilnProcess(port, nodes_cleared, kafka_bootstrap, 200, tmp_path / f"{port}.log",
                             extra_args=["--http-listen", "auto"])
                 for port in (first_port, free_port())]
    try:
        for process in processes:
            process.start()
        # Then both run, each serving HTTP at its Kafka port + 552, registered as such
        nodes = {n.address: n for n in live(nodes_cleared).values()}
        for process in processes:
            assert nodes[process.bootstrap].http == f"127.0.0.1:{process.port + 552}"
    finally:
        for process in processes:
            process.stop()


def membership_run(redis_url: str, body: Callable[[aioredis.Redis], Awaitable[T]]) -> T:
    async def main() -> T:
        client = aioredis.Redis.from_url(redis_url)
        try:
            return await body(client)
        finally:
            await client.aclose()
    return asyncio.run(main())


def test_entries_that_are_no_registration_are_removed_not_fatal(nodes_cleared: str) -> None:
    # Given a nodes hash holding what no Kiln wrote: not JSON, JSON without the fields, a
    # field that is no id, and a registration of a newer Kiln with a field this one lacks
    store = redis.Redis.from_url(nodes_cleared)
    newer = {"host": "10.0.0.9", "port": 9092, "address": "10.0.0.9:9092", "http": "",
             "pid": 1, "incarnation": "x", "started_ms": 1, "renewed_ms": 1,
             "expires_ms": 2**52, "rack": "r1"}
    store.hset(NODES_KEY, mapping={"0": "{not json", "1": "[]", "two": "{}",
                                   "3": json.dumps(newer)})

    # When a node registers and `kiln nodes` lists the hash
    async def scenario(client: aioredis.Redis) -> tuple[int, list[int]]:
        node_id = await Membership(client).register(-1, "127.0.0.1", 1111)
        return node_id, [n.node_id for n in await read_nodes(client)]

    node_id, listed = membership_run(nodes_cleared, scenario)

    # Then the junk is gone, the newer registration is kept and read, the node took id 0
    assert (node_id, listed) == (0, [0, 3])
    assert sorted(store.hkeys(NODES_KEY)) == [b"0", b"3"]


def test_registrations_dead_longer_than_the_reuse_time_are_removed(nodes_cleared: str) -> None:
    now = [1_000_000]
    settings = NodeSettings(session_timeout_ms=3_000, id_reuse_after_ms=60_000)

    async def scenario(client: aioredis.Redis) -> tuple[list[int], list[int], int]:
        # Given five nodes at five addresses that died (never renewed) one after another
        for port in range(1, 6):
            await Membership(client, settings, lambda: now[0]).register(-1, "h", port)
        died = [n.node_id for n in await read_nodes(client)]
        # When a sixth registers more than the reuse time after they died
        now[0] += 3_000 + 60_000
        newcomer = await Membership(client, settings, lambda: now[0]).register(-1, "h", 9)
        return died, [n.node_id for n in await read_nodes(client)], newcomer

    died, left, newcomer = membership_run(nodes_cleared, scenario)

    # Then the dead ones' registrations are gone and the newcomer takes the lowest id
    assert died == [0, 1, 2, 3, 4]
    assert (left, newcomer) == ([0], 0)
