"""Which node leads what, as every node computes it (storage/leadership.py), and when a
leader counts as silent (its partitions reported offline in Metadata)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from storage.leadership import Leadership, partition_placement_key, place
from storage.model import TopicPartition
from storage.nodes import KilnNode

SESSION_MS = 3_000
SILENT_AFTER_MS = 2_000


def node(node_id: int, renewed_ms: int) -> KilnNode:
    return KilnNode(node_id=node_id, host="127.0.0.1", port=9092 + node_id, http="", pid=1,
                    incarnation=f"inc-{node_id}", started_ms=0, renewed_ms=renewed_ms,
                    expires_ms=renewed_ms + SESSION_MS)


class View:
    """This node's membership as Leadership sees it."""

    def __init__(self, own: int, nodes: Sequence[KilnNode]) -> None:
        self.node_id, self.incarnation = own, f"inc-{own}"
        self._nodes = tuple(sorted(nodes, key=lambda n: n.node_id))

    def live_nodes(self) -> Sequence[KilnNode]:
        return self._nodes

    def live_ids(self) -> tuple[int, ...]:
        return tuple(n.node_id for n in self._nodes)

    def view_age_s(self) -> float:
        return 0.0


class NoRedis:
    def register_script(self, script: str) -> Any:
        return None


def leadership(view: View, now_ms: int) -> Leadership:
    return Leadership(NoRedis(), view, fresh_within_s=SESSION_MS / 1000,  # type: ignore[arg-type]
                      silent_after_ms=SILENT_AFTER_MS, clock_ms=lambda: now_ms)


def test_a_node_that_missed_its_heartbeats_is_silent_until_it_renews_again() -> None:
    # Given node 0's view: node 1 renewed 1.9 s ago, node 2 2.1 s ago (not dead before 3 s)
    now = 100_000
    view = View(0, [node(0, now - 5_000), node(1, now - 1_900), node(2, now - 2_100)])
    seen = leadership(view, now)

    # Then node 2 is silent, node 1 is not, and this node never is to itself
    assert [seen.silent(n) for n in (0, 1, 2)] == [False, False, True]
    # and a node that is not in the view (dead, or unknown) is not silent: it leads nothing
    assert not seen.silent(7)


def test_every_node_places_a_partition_on_the_same_live_node() -> None:
    tps = [TopicPartition("orders", p) for p in range(24)]
    views = [View(own, [node(n, 0) for n in (0, 1, 2)]) for own in (0, 1, 2)]

    leaders = [[leadership(v, 0).leader(tp) for tp in tps] for v in views]

    assert leaders[0] == leaders[1] == leaders[2]
    assert set(leaders[0]) == {0, 1, 2}
    assert leaders[0] == [place(partition_placement_key(tp), (0, 1, 2)) for tp in tps]
    # and when node 2 is gone only its partitions move
    after = [leadership(View(0, [node(0, 0), node(1, 0)]), 0).leader(tp) for tp in tps]
    assert [a for a, b in zip(after, leaders[0], strict=True) if b != 2] == [
        b for b in leaders[0] if b != 2]
