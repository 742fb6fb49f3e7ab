"""How the test services read a Redis Cluster's CLUSTER NODES answer."""

from __future__ import annotations

from cli.local_redis_cluster import ClusterNodeState, _parse_cluster_nodes

# As redis-server 7.0 answers, a master failed and its replica promoted, a slot migrating.
ANSWER = (
    b"c545 127.0.0.1:10986@20986 myself,master - 0 1795741343000 1 connected 0-5460\n"
    b"749c 127.0.0.1:23275@33275 master,fail - 0 1795741343641 3 connected\n"
    b"27b2 127.0.0.1:20846@30846 master - 0 1795741343641 4 connected 10923-16383\n"
    b"f683 127.0.0.1:26088@36088 master - 0 1795741343541 2 connected 5461-10921 10922 "
    b"[10922->-749c]\n"
    b"d548 127.0.0.1:18649@28649 slave f683 0 1795741343541 2 connected\n"
)


def test_cluster_nodes_give_each_servers_role_state_and_slot_count() -> None:
    assert _parse_cluster_nodes(ANSWER) == [
        ClusterNodeState(port=10986, master=True, failed=False, slots=5461),
        ClusterNodeState(port=23275, master=True, failed=True, slots=0),
        ClusterNodeState(port=20846, master=True, failed=False, slots=5461),
        ClusterNodeState(port=26088, master=True, failed=False, slots=5462),
        ClusterNodeState(port=18649, master=False, failed=False, slots=0),
    ]
