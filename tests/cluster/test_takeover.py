"""Kiln nodes failing under load: three `kiln serve` child processes on one Redis and one
Kafka, an idempotent acks=all producer spreading numbered records over six partitions, and a
node killed (SIGKILL), paused past its session (SIGSTOP), or restarted in turn (SIGTERM).
Afterwards Kafka itself is read: every acknowledged record is in the hardened topic exactly
once, in send order per partition, at the Kiln offset its producer was told (DESIGN.md §6-7:
the partitions of a dead node move to the live ones, and the partition leases fence a node
that lost them).

The takeover time (kill to the first acknowledgement in a partition the killed node led) is
printed, and bounded generously only: timings belong in bench/.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from storage.leadership import group_placement_key, place
from tests.cluster.conftest import SESSION_MS
from tests.cluster.takeover_support import (
    Cluster,
    SpreadLoop,
    assert_nothing_lost_or_duplicated,
    lease_disagreements,
    read_topic,
    running_cluster,
)
from tests.cluster.test_routing import find_coordinators
from tests.kiln_harness import eventually
from wire.errors import ErrorCode

WARM_UP_ACKS = 600  # records acknowledged before the fault: every partition is flowing
AFTER_FAULT_S = 3  # how long the producer goes on once the cluster has recovered
TAKEOVER_BOUND_S = 20
CLIENT_GIVES_UP_MS = 1_500  # socket.timeout.ms of the SIGSTOP test's producer
HARDENED_WITHIN_S = 40  # a killed node's hardening leases run out (4 s), then the delay


def test_kill9_of_a_leading_node_under_load_loses_and_duplicates_nothing(
        redis_url: str, kafka_bootstrap: str, unique_topic: str, tmp_path: Path) -> None:
    with running_cluster(redis_url, kafka_bootstrap, tmp_path) as cluster:
        # Given three nodes, a six-partition topic created through Kiln, and an idempotent
        # producer writing to every partition through all three
        cluster.create_topic(unique_topic)
        victim, victim_id, led = cluster.busiest(unique_topic)
        producer = SpreadLoop(cluster.bootstrap, unique_topic)
        producer.start()
        try:
            assert producer.wait_for_acks(WARM_UP_ACKS, 30, fail_fast=True), (
                f"nothing delivered: {producer.error}\n{cluster.log_tails()}")
            epochs_before = {p: lease.epoch for p, lease in cluster.leases(unique_topic).items()
                             if lease is not None}

            # When the node leading the most partitions is killed -9 in mid-stream
            killed_at = time.monotonic()
            victim.kill()
            sent_at_kill = producer.sent  # records from here on were sent once it was dead

            eventually(lambda: producer.first_ack_after(killed_at, sent_at_kill, led)
                       is not None, TAKEOVER_BOUND_S)
            first_ack = producer.first_ack_after(killed_at, sent_at_kill, led)
            settled = eventually(lambda: not lease_disagreements(cluster, unique_topic), 15)
            disagreements = lease_disagreements(cluster, unique_topic)
            leases_after = cluster.leases(unique_topic)
            time.sleep(AFTER_FAULT_S)
        finally:
            undelivered = producer.stop(flush_timeout_s=60)
        survivors = [p for p in cluster.processes if p is not victim]
        leaders_after = [cluster.leaders(p, unique_topic) for p in survivors]
        hardened_in_time = eventually(lambda: cluster.hardened_everything(unique_topic),
                                      HARDENED_WITHIN_S)
        logs = cluster.log_tails()
    hardened = read_topic(kafka_bootstrap, unique_topic)

    # Then the survivors took the killed node's partitions over, its leases too, within a
    # generous bound (acks=all asks for assured_persistent, answered once hardened: the
    # first answer also waits for the killed node's hardening lease to run out) ...
    takeover_s = -1.0 if first_ack is None else first_ack - killed_at
    print(f"node {victim_id} led partitions {led}; takeover after kill -9: "
          f"{takeover_s:.3f} s; sent {producer.sent}, {sent_at_kill} before the kill")
    assert 0 < takeover_s < TAKEOVER_BOUND_S, f"no takeover:\n{logs}"
    assert leaders_after[0] == leaders_after[1]
    assert victim_id not in leaders_after[0].values()
    assert settled, f"leases not held by the leaders: {disagreements}\n{logs}"
    assert all((lease := leases_after[p]) is not None and lease.node_id != victim_id
               and lease.epoch > epochs_before[p] for p in led), (epochs_before, leases_after)
    # ... and Kafka holds every record once, in send order per partition
    assert producer.sent > sent_at_kill > WARM_UP_ACKS
    assert_nothing_lost_or_duplicated(producer, undelivered, hardened_in_time, hardened, logs)


def test_a_node_paused_past_its_session_is_fenced_then_leads_again(
        redis_url: str, kafka_bootstrap: str, unique_topic: str, tmp_path: Path) -> None:
    with running_cluster(redis_url, kafka_bootstrap, tmp_path) as cluster:
        # Given three nodes, a six-partition topic, and an idempotent producer writing to
        # every partition; it gives up on a request unanswered for 1.5 s (a stopped process
        # answers nothing, and the default, 60 s, is longer than the pause)
        cluster.create_topic(unique_topic)
        sleeper, sleeper_id, led = cluster.busiest(unique_topic)
        awake = [p for p in cluster.processes if p is not sleeper]
        leaders_before = cluster.leaders(awake[0], unique_topic)
        producer = SpreadLoop(cluster.bootstrap, unique_topic,
                              **{"socket.timeout.ms": CLIENT_GIVES_UP_MS})
        producer.start()
        try:
            assert producer.wait_for_acks(WARM_UP_ACKS, 30, fail_fast=True), (
                f"nothing delivered: {producer.error}\n{cluster.log_tails()}")
            epochs_before = {p: lease.epoch for p, lease in cluster.leases(unique_topic).items()
                             if lease is not None}

            # When the node leading the most partitions is paused for three sessions (and
            # until the others hold the leases of its partitions) while the producer
            # writes, then resumed
            paused_at = time.monotonic()
            sleeper.pause()
            time.sleep(3 * SESSION_MS / 1000)
            taken = eventually(lambda: all(
                (lease := cluster.leases(unique_topic)[p]) is not None
                and lease.node_id != sleeper_id for p in led), 10)
            leaders_during = cluster.leaders(awake[0], unique_topic)
            leases_during = cluster.leases(unique_topic)
            sleeper.resume()
            resumed_at = time.monotonic()

            settled = eventually(lambda: not lease_disagreements(cluster, unique_topic), 15)
            settled_s = time.monotonic() - resumed_at
            disagreements = lease_disagreements(cluster, unique_topic)
            leaders_after = cluster.leaders(sleeper, unique_topic)
            leases_after = cluster.leases(unique_topic)
            time.sleep(AFTER_FAULT_S)
        finally:
            sleeper.resume()
            undelivered = producer.stop(flush_timeout_s=60)
        hardened_in_time = eventually(lambda: cluster.hardened_everything(unique_topic),
                                      HARDENED_WITHIN_S)
        logs = cluster.log_tails()
    hardened = read_topic(kafka_bootstrap, unique_topic)

    # Then while it slept the others led its partitions and took their leases from it ...
    print(f"node {sleeper_id} led partitions {led}, paused {resumed_at - paused_at:.2f} s; "
          f"leases during the pause {leases_during}; after {leases_after}, settled "
          f"{settled_s:.2f} s after it woke")
    assert taken, f"its partitions were not taken over: {leases_during}\n{logs}"
    assert sleeper_id not in leaders_during.values()
    assert {p: lease.node_id for p, lease in leases_during.items()
            if lease is not None and p in led} == {p: leaders_during[p] for p in led}
    # ... once awake it leads them again, and every lease is held by the running incarnation
    # of the node every node names as the partition's leader, taken anew
    assert settled, f"leases not held by the leaders: {disagreements}\n{logs}"
    assert leaders_after == leaders_before
    assert all((lease := leases_after[p]) is not None and lease.node_id == sleeper_id
               and lease.epoch >= epochs_before[p] + 2 for p in led), (epochs_before,
                                                                       leases_after)
    # ... and Kafka holds every record once, in send order per partition
    assert_nothing_lost_or_duplicated(producer, undelivered, hardened_in_time, hardened, logs)


def test_rolling_restart_under_load_loses_and_duplicates_nothing(
        redis_url: str, kafka_bootstrap: str, unique_topic: str, tmp_path: Path) -> None:
    with running_cluster(redis_url, kafka_bootstrap, tmp_path) as cluster:
        # Given three nodes, a six-partition topic, and an idempotent producer writing to
        # every partition
        cluster.create_topic(unique_topic)
        producer = SpreadLoop(cluster.bootstrap, unique_topic)
        producer.start()
        exit_codes: list[int] = []
        shutdown_s: list[float] = []
        try:
            assert producer.wait_for_acks(WARM_UP_ACKS, 30, fail_fast=True), (
                f"nothing delivered: {producer.error}\n{cluster.log_tails()}")

            # When each node in turn is stopped (SIGTERM, a planned shutdown) and started
            # again on its port, the next one once records flow through all three again
            for process in cluster.processes:
                began = time.monotonic()
                exit_codes.append(process.terminate(timeout_s=60))
                shutdown_s.append(round(time.monotonic() - began, 2))
                process.start()
                acked = producer.deliveries.counts()[0]
                assert eventually(lambda: all(len(cluster.brokers(p)) == len(cluster.processes)
                                              for p in cluster.processes), 15)
                assert producer.wait_for_acks(acked + WARM_UP_ACKS, 30), (
                    f"no progress after restarting {process.log_path.name}:\n"
                    f"{cluster.log_tails()}")
            settled = eventually(lambda: not lease_disagreements(cluster, unique_topic), 15)
            disagreements = lease_disagreements(cluster, unique_topic)
            time.sleep(AFTER_FAULT_S)
        finally:
            undelivered = producer.stop(flush_timeout_s=60)
        hardened_in_time = eventually(lambda: cluster.hardened_everything(unique_topic),
                                      HARDENED_WITHIN_S)
        logs = cluster.log_tails()
    hardened = read_topic(kafka_bootstrap, unique_topic)

    # Then every node shut down cleanly and came back, every lease is held by its
    # partition's leader, and Kafka holds every record once, in send order per partition
    print(f"sent {producer.sent}; exits {exit_codes}; shutdowns took {shutdown_s} s")
    assert exit_codes == [0, 0, 0], logs
    assert [p.starts for p in cluster.processes] == [2, 2, 2]
    assert settled, f"leases not held by the leaders: {disagreements}\n{logs}"
    assert_nothing_lost_or_duplicated(producer, undelivered, hardened_in_time, hardened, logs)


def test_a_silent_nodes_partitions_and_groups_are_reported_unavailable_until_taken_over(
        redis_url: str, kafka_bootstrap: str, unique_topic: str, tmp_path: Path) -> None:
    # Given three nodes heartbeating every 500 ms with a 3 s session, and a six-partition
    # topic
    cluster = Cluster(redis_url, kafka_bootstrap, tmp_path, node_args=[
        "--node-heartbeat-ms", "500", "--node-session-timeout-ms", "3000"])
    try:
        cluster.start()
        cluster.create_topic(unique_topic)
        sleeper, sleeper_id, led = cluster.busiest(unique_topic)
        awake = next(p for p in cluster.processes if p is not sleeper)
        before = cluster.leaders(awake, unique_topic)
        ids = tuple(sorted(cluster.node_ids()))
        group = next(g for g in (f"g-{i}" for i in range(1000))
                     if place(group_placement_key(g), ids) == sleeper_id)

        # When the node leading the most partitions is paused (it stops heartbeating)
        sleeper.pause()

        # Then, once it missed two heartbeats and while it is still a live broker, another
        # node's Metadata reports its partitions as Kafka reports offline ones, and its
        # groups' coordinator as not available
        def partitions() -> dict[int, Any]:
            (entry,) = cluster.metadata(awake, unique_topic).topics
            return {p.partition_index: p for p in entry.partitions}

        assert eventually(lambda: partitions()[led[0]].leader_id == -1, 10)
        offline = partitions()
        coordinator_while_silent = find_coordinators(awake.bootstrap, [group])[group]
        still_a_broker = sleeper_id in cluster.brokers(awake)
        # ... and after the session, another node leads them
        taken = eventually(lambda: all(
            cluster.leaders(awake, unique_topic)[p] not in (-1, sleeper_id) for p in led), 10)
        after = cluster.leaders(awake, unique_topic)
        coordinator_after = find_coordinators(awake.bootstrap, [group])[group]
    finally:
        sleeper.resume()
        cluster.stop()

    assert still_a_broker
    for p, entry in offline.items():
        if p in led:
            assert (entry.error_code, entry.leader_id, entry.replica_nodes,
                    entry.isr_nodes) == (ErrorCode.LEADER_NOT_AVAILABLE, -1, [sleeper_id], []), p
        else:
            assert (entry.error_code, entry.leader_id) == (0, before[p]), p
    assert coordinator_while_silent[:2] == (ErrorCode.COORDINATOR_NOT_AVAILABLE, -1)
    assert taken, after
    assert coordinator_after[0] == 0 and coordinator_after[1] not in (-1, sleeper_id)
    assert {p: after[p] for p in before if p not in led} == {
        p: before[p] for p in before if p not in led}
