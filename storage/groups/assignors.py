"""Server-side assignors of the KIP-848 consumer group protocol: who should own which
partition (the group's target assignment). I/O-free.

- `uniform` (Kafka's default): balanced and sticky. A partition stays with the member that
  had it in the previous target while that member is still subscribed to its topic and not
  above its fair share; the rest go to the least loaded subscribed member.
- `range`: per topic, the subscribed members sorted by member id each take a contiguous
  range, the first ones one partition more (the classic range assignor, server-side).

An assignment is `{topic name: frozenset of partitions}` per member id.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

Assignment = dict[str, frozenset[int]]
Assignor = Callable[[Mapping[str, frozenset[str]], Mapping[str, int],
                     Mapping[str, Assignment]], dict[str, Assignment]]

UNIFORM = "uniform"
RANGE = "range"


def uniform(subscriptions: Mapping[str, frozenset[str]], partitions: Mapping[str, int],
            previous: Mapping[str, Assignment]) -> dict[str, Assignment]:
    """`subscriptions`: member id -> topics it is subscribed to (that exist);
    `partitions`: topic -> partition count; `previous`: the last target assignment."""
    owned: dict[str, set[tuple[str, int]]] = {m: set() for m in subscriptions}
    # Topics with the fewest subscribers first: their partitions have the fewest places to go.
    topics = sorted({t for ts in subscriptions.values() for t in ts if t in partitions},
                    key=lambda t: (sum(t in ts for ts in subscriptions.values()), t))
    every = [(t, p) for t in topics for p in range(partitions[t])]
    eligible = {m: sum(partitions[t] for t in ts if t in partitions)
                for m, ts in subscriptions.items()}
    floor, spare = _fair_share(len(every), eligible)
    quota = dict(floor)
    previous_owner = {(t, p): m for m, assigned in previous.items() if m in subscriptions
                      for t, ps in assigned.items() for p in ps}
    # Sticky first: a partition stays where it was, up to the member's even share; one more
    # only while some of the split's remainder is left to hand out.
    unassigned = []
    for tp in every:
        member = previous_owner.get(tp)
        if member is None or tp[0] not in subscriptions[member]:
            unassigned.append(tp)
        elif len(owned[member]) < quota[member]:
            owned[member].add(tp)
        elif spare and quota[member] == floor[member] and quota[member] < eligible[member]:
            spare -= 1
            quota[member] += 1
            owned[member].add(tp)
        else:
            unassigned.append(tp)
    for topic, partition in unassigned:
        candidates = [m for m, ts in subscriptions.items() if topic in ts]
        member = min(candidates, key=lambda m: (len(owned[m]) - floor[m], len(owned[m]), m))
        owned[member].add((topic, partition))
    return {m: _by_topic(tps) for m, tps in owned.items()}


def range_(subscriptions: Mapping[str, frozenset[str]], partitions: Mapping[str, int],
           previous: Mapping[str, Assignment]) -> dict[str, Assignment]:
    owned: dict[str, set[tuple[str, int]]] = {m: set() for m in subscriptions}
    for topic in sorted({t for ts in subscriptions.values() for t in ts if t in partitions}):
        members = sorted(m for m, ts in subscriptions.items() if topic in ts)
        count = partitions[topic]
        base, extra = divmod(count, len(members))
        start = 0
        for i, member in enumerate(members):
            size = base + (1 if i < extra else 0)
            owned[member].update((topic, p) for p in range(start, start + size))
            start += size
    return {m: _by_topic(tps) for m, tps in owned.items()}


ASSIGNORS: dict[str, Assignor] = {UNIFORM: uniform, RANGE: range_}


def _fair_share(total: int, eligible: Mapping[str, int]) -> tuple[dict[str, int], int]:
    """Each member's even share of `total` partitions (water-filling: a member that can take
    fewer than an even split takes all it can, the others split the rest), and how many of
    the split's members may take one more (the remainder)."""
    floor: dict[str, int] = {}
    left, open_members = total, sorted(eligible, key=lambda m: (eligible[m], m))
    while open_members:
        even = left // len(open_members)
        capped = [m for m in open_members if eligible[m] <= even]
        if not capped:
            for m in open_members:
                floor[m] = even
            return floor, left - even * len(open_members)
        for m in capped:
            floor[m] = eligible[m]
            left -= eligible[m]
        open_members = [m for m in open_members if m not in floor]
    return floor, 0


def _by_topic(tps: set[tuple[str, int]]) -> Assignment:
    grouped: dict[str, set[int]] = {}
    for topic, partition in tps:
        grouped.setdefault(topic, set()).add(partition)
    return {t: frozenset(ps) for t, ps in grouped.items()}
