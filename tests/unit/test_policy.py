"""Pure decisions: reliability levels, ack points, the fixed delay and the buffer budget."""

from __future__ import annotations

import pytest

from storage.budget import budget_decision
from storage.model import Reliability, StoredBatch
from storage.policy.adaptive import DelayInputs
from storage.policy.delay import FixedDelay, due_prefix
from storage.policy.reliability import AckPoint, ack_point, requested_level, shed_now
from storage.topics import (
    HardenPolicy,
    kiln_configs,
    new_topic,
    split_configs,
    with_kiln_configs,
)
from wire.errors import ErrorCode, KafkaError

R = Reliability


@pytest.mark.parametrize(
    ("acks", "default", "maximum", "override", "expected"),
    [
        (1, R.RELIABLE_PERSISTENT, R.ASSURED_PERSISTENT, True, R.RELIABLE_PERSISTENT),
        (-1, R.RELIABLE_PERSISTENT, R.ASSURED_PERSISTENT, True, R.ASSURED_PERSISTENT),
        (0, R.RELIABLE_PERSISTENT, R.ASSURED_PERSISTENT, True, R.RELIABLE_PERSISTENT),
        (-1, R.RELIABLE_PERSISTENT, R.RELIABLE_PERSISTENT, True, R.RELIABLE_PERSISTENT),
        (-1, R.EXPRESS, R.ASSURED_PERSISTENT, False, R.EXPRESS),
    ],
)
def test_requested_level(acks: int, default: R, maximum: R, override: bool, expected: R) -> None:
    assert requested_level(acks=acks, topic_default=default, topic_max=maximum,
                           producer_override=override) is expected


def test_header_level_is_capped_by_topic_maximum() -> None:
    level = requested_level(acks=1, topic_default=R.RELIABLE_PERSISTENT,
                            topic_max=R.RELIABLE_PERSISTENT, producer_override=True,
                            header_level=R.ASSURED_PERSISTENT)

    assert level is R.RELIABLE_PERSISTENT


def test_only_assured_waits_for_hardening() -> None:
    assert ack_point(R.ASSURED_PERSISTENT) is AckPoint.ON_HARDENED_OR_DELIVERED
    assert {ack_point(r) for r in R if r is not R.ASSURED_PERSISTENT} == {AckPoint.ON_APPEND}


def test_reliability_parse_names_the_choices() -> None:
    assert R.parse("Assured_Persistent") is R.ASSURED_PERSISTENT
    with pytest.raises(ValueError, match="best_effort"):
        R.parse("sometimes")


def test_fixed_delay_due_instant() -> None:
    decision = FixedDelay(2_000).decide(DelayInputs(has_subscriptions=True), now_ms=10_000)

    assert decision.due_before(10_000) == 8_000
    assert decision.binding == "fixed"


def test_negative_delay_rejected() -> None:
    with pytest.raises(ValueError):
        FixedDelay(-1)


def _batch(base: int, appended: int) -> StoredBatch:
    return StoredBatch(base, 10, appended, R.RELIABLE_PERSISTENT, b"")


def test_due_prefix_stops_at_first_batch_still_waiting() -> None:
    batches = [_batch(0, 100), _batch(10, 300), _batch(20, 150)]

    due = due_prefix(batches, due_before_ms=200)

    assert [b.base_offset for b in due] == [0]


@pytest.mark.parametrize(("fill", "shed"), [
    (0.79, set()), (0.8, {R.BEST_EFFORT}), (0.89, {R.BEST_EFFORT}),
    (0.9, {R.BEST_EFFORT, R.EXPRESS}), (1.0, {R.BEST_EFFORT, R.EXPRESS}),
])
def test_best_effort_is_shed_first_then_express_and_nothing_else(fill: float,
                                                                 shed: set[R]) -> None:
    assert {level for level in R if shed_now(level, fill)} == shed


def test_a_shed_batch_is_due_before_its_delay_but_never_overtakes_one_that_waits() -> None:
    best_effort = StoredBatch(10, 10, 300, R.BEST_EFFORT, b"")
    batches = [_batch(0, 100), best_effort, _batch(20, 150), _batch(30, 400)]

    due = due_prefix(batches, due_before_ms=200, shed=lambda b: b.reliability is R.BEST_EFFORT)

    assert [b.base_offset for b in due] == [0, 10, 20]


@pytest.mark.parametrize(
    ("buffered", "incoming", "throttle", "reject"),
    [(0, 10, 0, False), (800, 10, 0, False), (900, 10, 500, False), (995, 10, 1000, True)],
)
def test_budget_throttles_then_rejects(buffered: int, incoming: int, throttle: int,
                                       reject: bool) -> None:
    decision = budget_decision(buffered, 1000, incoming)

    assert (decision.throttle_time_ms, decision.reject) == (throttle, reject)


def test_kiln_topic_configs_set_the_policy_and_others_go_to_kafka() -> None:
    kiln, kafka = split_configs({"kiln.harden": "all", "kiln.reliability": "express",
                                 "retention.ms": "1000", "cleanup.policy": None})

    config = with_kiln_configs(new_topic("t", 1), kiln)

    assert kafka == {"retention.ms": "1000"}
    assert (config.harden, config.reliability) == (HardenPolicy.ALL, Reliability.EXPRESS)
    assert kiln_configs(config)["kiln.harden"] == "all"


@pytest.mark.parametrize(("configs", "message"), [
    ({"kiln.hardening": "all"}, "unknown topic config 'kiln.hardening'"),
    ({"kiln.harden": "sometimes"}, "kiln.harden: unknown harden policy 'sometimes'"),
    ({"kiln.auto.subscribe": "maybe"}, "kiln.auto.subscribe: expected true or false"),
    ({"kiln.reliability": "assured_persistent", "kiln.max.reliability": "express"},
     "kiln.reliability assured_persistent is above kiln.max.reliability express"),
])
def test_a_bad_kiln_topic_config_is_invalid_config(configs: dict[str, str], message: str
                                                    ) -> None:
    with pytest.raises(KafkaError, match=message) as raised:
        with_kiln_configs(new_topic("t", 1), configs)

    assert raised.value.error_code is ErrorCode.INVALID_CONFIG
