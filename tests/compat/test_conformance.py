"""Kiln answers every request it advertises as Apache Kafka 4.4 answers it.

For each (API, version) Kiln advertises, the builder of tests/compat/conformance.py makes the
same state on Kiln and on the Kafka behind it and sends both the same requests; the answers
must carry the same error codes, field by field and entry by entry, and have the same shape,
after a normalisation whose every rule says why it is there. An advertised API without a
builder fails. The edge cases (invalid but decodable requests, and valid ones off the common
path) are compared at the lowest and the highest version Kiln handles. No request may be
answered by a closed connection.

A difference that is a Kiln bug is listed in KNOWN, with the fields that differ: its case is
marked xfail (strict), and fails outright if any other field differs, or if a listed one no
longer does (then the entry must go).
"""

from __future__ import annotations

import pprint
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse

from tests.compat.conformance import (
    API_VERSIONS_KEY,
    BUILDERS,
    EDGE_CASES,
    Builder,
    Case,
    Normaliser,
    ServerClosed,
    Wire,
    await_coordinators,
    decode_exactly,
    differences,
    drive,
)
from tests.kiln_harness import RunningKiln, fresh_kiln
from wire.apis import CLIENT_APIS

UNSUPPORTED_VERSION = 35
CLOSED = "<connection closed>"
# Kiln hardens a topic when its case says so (Case.harden), never on its own while the
# module runs: which tier answers must not depend on how fast a busy machine runs a case.
HARDEN_DELAY_MS = 30 * 60 * 1000
# A new group forms at once, as on Kafka's test broker (group.initial.rebalance.delay.ms=0).
GROUP_SETTINGS = {"group_initial_rebalance_delay_ms": 0}


@dataclass(frozen=True, slots=True)
class Known:
    """Kiln differs from Kafka here: in these fields (paths without indexes) and no other."""

    fields: tuple[str, ...]
    reason: str


_PRODUCE_OLD = Known(
    (CLOSED,),
    "Produce v0-2 with a magic-2 batch: Kiln closes the connection, exactly as Kafka 4.4 does "
    "(both advertise Produce v0 for librdkafka, KAFKA-18659, and serve v3+ only)")

_UNKNOWN_TOPIC = Known(
    ("responses.partition_responses.error_code", "responses.partition_responses.base_offset"),
    "Produce to a topic that does not exist: Kiln creates it and appends (error 0, base offset "
    "0), Kafka answers UNKNOWN_TOPIC_OR_PARTITION (base offset -1); Kafka creates topics on "
    "Metadata only, never on Produce")

# Case id ("Fetch-v4", "CreateTopics-name-v7") -> Kiln's known difference.
KNOWN: dict[str, Known] = {
    **{f"Produce-{v}": _PRODUCE_OLD for v in ("v0", "v1", "v2")},
    "Produce-unknown-topic-v3": _UNKNOWN_TOPIC,
    "Produce-unknown-topic-v11": Known(
        (*_UNKNOWN_TOPIC.fields, "responses.partition_responses.log_start_offset"),
        _UNKNOWN_TOPIC.reason + "; and log_start_offset 0 where Kafka answers -1"),
}


class KnownDifference(AssertionError):
    """Kiln's answers differ from Kafka's exactly as KNOWN says."""


def _case(case_id: str, *values: Any) -> Any:
    known = KNOWN.get(case_id)
    marks = ([pytest.mark.xfail(strict=True, raises=KnownDifference, reason=known.reason)]
             if known else [])
    return pytest.param(*values, marks=marks, id=case_id)


def _name(api_key: int) -> str:
    api = BUILDERS.get(api_key)
    return api.name if api is not None else f"api{api_key}"


def _advertised() -> list[Any]:
    return [_case(f"{_name(key)}-v{version}", int(key), version)
            for key, spec in sorted(CLIENT_APIS.items())
            for version in range(spec.min_version, spec.max_version + 1)]


def _edge_cases() -> list[Any]:
    cases = []
    for name, edge in EDGE_CASES.items():
        spec = CLIENT_APIS.get(edge.api_key)
        if spec is None:
            continue
        for version in sorted({max(spec.lowest_handled, edge.since), spec.max_version}):
            cases.append(_case(f"{name}-v{version}", name, version))
    return cases


@dataclass
class Sides:
    kiln: Wire
    kafka: Wire
    server: RunningKiln
    # Kiln's own count of connections it closed on a request (malformed, unsupported) when
    # the module started.
    closed_before: int

    def cases(self) -> tuple[Case, Case]:
        tag = uuid.uuid4().hex[:8]
        return (Case(self.kiln, "kiln", tag, harden=self._harden),
                Case(self.kafka, "kafka", tag))

    def _harden(self, topic: str) -> None:
        hardener = self.server.app.hardener
        if not self.server.call(hardener.flush([topic], timeout_s=20), timeout=25):
            raise AssertionError(f"Kiln did not harden {topic} within 20s")


@pytest.fixture(scope="module")
def conformance_kiln(redis_url: str, kafka_bootstrap: str) -> Iterator[RunningKiln]:
    """One Kiln (empty Redis at its start) for the module, hardening only on demand."""
    with fresh_kiln(redis_url, kafka_bootstrap, harden_delay_ms=HARDEN_DELAY_MS,
                    transactions_enabled=True, **GROUP_SETTINGS) as running:
        yield running


@pytest.fixture(scope="module")
def sides(conformance_kiln: RunningKiln, kafka_bootstrap: str) -> Iterator[Sides]:
    """One connection to Kiln and one to Kafka for the whole module."""
    both = Sides(Wire("Kiln", conformance_kiln.bootstrap), Wire("Kafka", kafka_bootstrap),
                 conformance_kiln,
                 conformance_kiln.app.metrics.value("kiln_malformed_frames_total"))
    await_coordinators(both.kafka)
    yield both
    both.kiln.close()
    both.kafka.close()


def _compare(sides: Sides, case_id: str, api_key: int, version: int, build: Builder,
             response: Any) -> None:
    kiln_case, kafka_case = sides.cases()
    closed: dict[str, ServerClosed] = {}
    answers: dict[str, list[tuple[Any, Any]]] = {}
    missing: NotImplementedError | None = None
    for case in (kiln_case, kafka_case):
        try:
            answers[case.side] = drive(build, response, case, version)
        except ServerClosed as exc:
            closed[case.side] = exc
        except NotImplementedError as exc:
            missing = exc
            break
    if missing is not None:
        pytest.fail(str(missing), pytrace=False)
    if "kafka" in closed and "kiln" not in closed:
        pytest.fail(f"{closed['kafka']}, where Kiln answered: the builder's request is not "
                    "one Kafka serves", pytrace=False)
    if "kiln" in closed:
        kafka_did = "closed it too" if "kafka" in closed else "answered"
        _judge(case_id, [f"{CLOSED}: {closed['kiln']} (Kafka {kafka_did})"])
        return
    kiln, kafka = answers["kiln"], answers["kafka"]
    assert len(kiln) == len(kafka), f"{len(kiln)} answers from Kiln, {len(kafka)} from Kafka"
    kiln_view = Normaliser(api_key, kiln_case.labels)
    kafka_view = Normaliser(api_key, kafka_case.labels)
    found = []
    for step, ((kiln_asked, kiln_answer), (kafka_asked, kafka_answer)) in enumerate(
            zip(kiln, kafka, strict=True)):
        ours = kiln_view.answer(kiln_asked, kiln_answer)
        theirs = kafka_view.answer(kafka_asked, kafka_answer)
        for line in differences(ours, theirs):
            found.append(f"{line}\n    (step {step}: {_name(api_key)} v{version}; Kiln's "
                         f"answer {_brief(ours)}; Kafka's {_brief(theirs)})")
    _judge(case_id, found)
    check = BUILDERS[api_key].check
    if check is not None:
        check([answer for _, answer in kiln], [answer for _, answer in kafka])


def _brief(answer: Any, limit: int = 1500) -> str:
    text = pprint.pformat(answer, width=200, compact=True)
    return text if len(text) <= limit else text[:limit] + "..."


def _field(difference: str) -> str:
    """The path a difference line is about, without its array indexes."""
    return re.sub(r"\[\d+\]", "", difference.split(":", 1)[0])


def _judge(case_id: str, found: list[str]) -> None:
    known = KNOWN.get(case_id)
    unknown = [d for d in found if known is None or _field(d) not in known.fields]
    if unknown:
        pytest.fail("Kiln's answers differ from Kafka's:\n" + "\n".join(unknown),
                    pytrace=False)
    if known is None:
        return
    gone = set(known.fields) - {_field(d) for d in found}
    if gone:
        pytest.fail(f"KNOWN[{case_id!r}] lists {sorted(gone)}, which no longer differ: "
                    "update or remove the entry", pytrace=False)
    raise KnownDifference("\n".join(found))


def test_every_advertised_api_has_a_builder(sides: Sides) -> None:
    """What Kiln advertises live is what the cases below are made from, and each API of it
    has a builder: none is added without conformance."""
    answer = sides.kiln.request(ApiVersionsRequest(client_software_name="kiln-conformance",
                                                   client_software_version="1.0"),
                                3, ApiVersionsResponse)
    advertised = {(e.api_key, e.min_version, e.max_version) for e in answer.api_keys}
    parametrized = {(int(k), s.min_version, s.max_version) for k, s in CLIENT_APIS.items()}
    assert advertised == parametrized
    missing = sorted(key for key, _, _ in advertised if key not in BUILDERS)
    assert not missing, f"advertised APIs without a conformance builder: {missing}"


@pytest.mark.parametrize(("api_key", "version"), _advertised())
def test_answer_conforms(request: pytest.FixtureRequest, sides: Sides, api_key: int,
                         version: int) -> None:
    api = BUILDERS.get(api_key)
    if api is None:
        pytest.fail(f"Kiln advertises api {api_key} v{version} and "
                    "tests/compat/conformance.py has no builder for it", pytrace=False)
    _compare(sides, request.node.callspec.id, api_key, version, api.build, api.response)


@pytest.mark.parametrize(("name", "version"), _edge_cases())
def test_edge_case_conforms(request: pytest.FixtureRequest, sides: Sides, name: str,
                            version: int) -> None:
    edge = EDGE_CASES[name]
    _compare(sides, request.node.callspec.id, edge.api_key, version, edge.build,
             BUILDERS[edge.api_key].response)


# --- ApiVersions at a version the server does not serve ------------------------------------------


def _unsupported(wire: Wire, far: bool) -> Any:
    """The answer of `wire`'s server to ApiVersions one version above its highest (or at
    v127), sent as a newer client sends it: with its own version's body, which the server
    cannot read (KIP-511)."""
    version = 127
    if not far:
        answer = wire.request(ApiVersionsRequest(), 0, ApiVersionsResponse)
        [entry] = [e for e in answer.api_keys if e.api_key == API_VERSIONS_KEY]
        version = int(entry.max_version) + 1
    body = bytes(ApiVersionsRequest(client_software_name="kiln-conformance",
                                    client_software_version="1.0").encode(version=3))
    # Read as v0 with a v0 header: what the client can read whatever it sent.
    return decode_exactly(ApiVersionsResponse, 0, wire.raw_api_versions(version, body),
                          f"{wire.name}'s ApiVersions v{version} answer")


@pytest.mark.parametrize("far", [False, True], ids=["one-above", "v127"])
def test_api_versions_above_advertised_is_answered_at_v0(sides: Sides, far: bool) -> None:
    """Answered, not closed: error 35 in a v0 body, with the ApiVersions range to retry
    within."""
    answers = {wire.name: _unsupported(wire, far) for wire in (sides.kiln, sides.kafka)}
    for name, answer in answers.items():
        assert answer.error_code == UNSUPPORTED_VERSION, (name, answer)
        assert [e.api_key for e in answer.api_keys].count(API_VERSIONS_KEY) == 1, (name, answer)
    [kiln_range] = [(e.min_version, e.max_version) for e in answers["Kiln"].api_keys
                    if e.api_key == API_VERSIONS_KEY]
    spec = CLIENT_APIS[API_VERSIONS_KEY]
    assert kiln_range == (spec.min_version, spec.max_version)


@pytest.mark.parametrize("far", [False, True], ids=["one-above", "v127"])
def test_api_versions_above_advertised_lists_what_kafka_lists(sides: Sides, far: bool
                                                              ) -> None:
    kiln_answer, kafka_answer = (_unsupported(wire, far) for wire in (sides.kiln, sides.kafka))
    assert ([e.api_key for e in kiln_answer.api_keys]
            == [e.api_key for e in kafka_answer.api_keys])


def test_no_connection_was_closed_but_where_known(sides: Sides) -> None:
    """Runs last: every request of the module got its answer frame, but those KNOWN says
    Kiln closes the connection on."""
    expected = {case_id for case_id, known in KNOWN.items() if CLOSED in known.fields}
    unexpected = [what for what in sides.kiln.closed_on
                  if _closed_case_id(what) not in expected]
    assert unexpected == [], f"Kiln closed the connection on {unexpected}"
    # What Kiln counted itself: no connection closed that the client side did not see.
    closed = sides.server.app.metrics.value("kiln_malformed_frames_total") - sides.closed_before
    assert closed == len(sides.kiln.closed_on), (closed, sides.kiln.closed_on)


def _closed_case_id(what: str) -> str:
    """'ProduceRequest v1' -> 'Produce-v1'."""
    request, version = what.split(" ")
    return f"{request.removesuffix('Request')}-{version}"
