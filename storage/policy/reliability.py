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
