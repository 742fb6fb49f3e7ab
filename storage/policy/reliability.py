"""Which reliability level a produced batch gets, and when its producer is answered.

DESIGN.md section 3: `acks=all` asks for the strongest level; the topic caps what producers
may ask for; `acks=0` only suppresses the response and never weakens the level.
"""

from __future__ import annotations

import enum

from storage.model import Reliability


class AckPoint(enum.Enum):
    ON_APPEND = "on_append"
    ON_HARDENED_OR_DELIVERED = "on_hardened_or_delivered"


def requested_level(
    *,
    acks: int,
    topic_default: Reliability,
    topic_max: Reliability,
    producer_override: bool,
    header_level: Reliability | None = None,
) -> Reliability:
    if not producer_override:
        return topic_default
    wanted = topic_default
    if header_level is not None:
        wanted = header_level
    elif acks == -1:
        wanted = Reliability.ASSURED_PERSISTENT
    return min(wanted, topic_max)


def ack_point(level: Reliability) -> AckPoint:
    if level is Reliability.ASSURED_PERSISTENT:
        return AckPoint.ON_HARDENED_OR_DELIVERED
    return AckPoint.ON_APPEND


def should_harden(level: Reliability) -> bool:
    return level.persistent


# Under memory pressure (the buffer's fill, 0..1, across every Kiln process), the levels that
# promise nothing past a crash give their room up first: best_effort from the fill at which
# producers start being throttled, express from halfway between that and full. They are
# then dropped as soon as they are read, their delay or not. reliable_nonpersistent and the
# persistent levels are never shed: their producers are pushed back instead.
SHED_BEST_EFFORT_FROM = 0.8
SHED_EXPRESS_FROM = 0.9


def shed_now(level: Reliability, buffer_fill: float) -> bool:
    """Whether records of `level` are dropped now, before their delay, to make room."""
    if level is Reliability.BEST_EFFORT:
        return buffer_fill >= SHED_BEST_EFFORT_FROM
    if level is Reliability.EXPRESS:
        return buffer_fill >= SHED_EXPRESS_FROM
    return False
