"""SASL/PLAIN server: Kafka's PlainSaslServer rules and texts, kafka-python's client against it,
and hostile bytes (only `Failed` or the password check ever comes out)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.net.sasl.plain import SaslMechanismPlain

from wire.sasl.exchange import client_error_message
from wire.sasl.plain import CheckPassword, PlainServer, parse_plain
from wire.sasl.scram import SCRAM_SHA_512, derive_credential, verify_password
from wire.sasl.steps import Authenticated, Failed, SaslFailure

ALICE_CREDENTIAL = derive_credential(SCRAM_SHA_512, "alice-secret", 4096, salt=b"s" * 32)


def _check_against_scram(need: CheckPassword) -> bool:
    """Kiln's PLAIN check: the password against the stored SCRAM credential."""
    return need.username == "alice" and verify_password(SCRAM_SHA_512, ALICE_CREDENTIAL,
                                                         need.password)


def _login(auth_bytes: bytes) -> Authenticated | Failed:
    step = PlainServer().step(auth_bytes)
    if isinstance(step, CheckPassword):
        return step.resume(_check_against_scram(step))
    return step


@pytest.mark.parametrize(
    ("auth_bytes", "authorization_id", "username", "password"),
    [
        (b"\x00alice\x00alice-secret", "", "alice", "alice-secret"),
        (b"alice\x00alice\x00alice-secret", "alice", "alice", "alice-secret"),
        ("\x00jöhn\x00pässwörd ∑".encode(), "", "jöhn", "pässwörd ∑"),
        (b"\x00u\x00p,=\x01 \xc2\xa0", "", "u", "p,=\x01 \xa0"),
    ],
)
def test_well_formed_responses_are_parsed(auth_bytes: bytes, authorization_id: str,
                                          username: str, password: str) -> None:
    response = parse_plain(auth_bytes)
    assert (response.authorization_id, response.username, response.password) == (
        authorization_id, username, password)


@pytest.mark.parametrize(
    ("auth_bytes", "client_message"),
    [
        # PlainSaslServerTest.emptyTokens, message for message.
        (b"\x00\x00", "Authentication failed: username not specified"),
        (b"\x00\x00p", "Authentication failed: username not specified"),
        (b"\x00u\x00", "Authentication failed: password not specified"),
        (b"a\x00\x00", "Authentication failed: username not specified"),
        (b"a\x00\x00p", "Authentication failed: username not specified"),
        (b"a\x00u\x00", "Authentication failed: password not specified"),
        (b"a\x00u\x00p\x00", "Invalid SASL/PLAIN response: expected 3 tokens, got 4"),
        (b"\x00u", "Invalid SASL/PLAIN response: expected 3 tokens, got 2"),
        # Kafka stops counting at four tokens.
        (b"a\x00u\x00p\x00x\x00y\x00z", "Invalid SASL/PLAIN response: expected 3 tokens, got 4"),
        (b"", "Invalid SASL/PLAIN response: expected 3 tokens, got 1"),
        (b"alice", "Invalid SASL/PLAIN response: expected 3 tokens, got 1"),
        (b"bob\x00alice\x00alice-secret", "Authentication failed: Client requested an "
         "authorization id that is different from username"),
        # Not UTF-8: Kiln refuses where Java would decode to U+FFFD.
        (b"\x00alice\x00\xff\xfe", "Invalid SASL/PLAIN response: not UTF-8"),
    ],
)
def test_malformed_responses_fail_with_kafkas_message(auth_bytes: bytes,
                                                      client_message: str) -> None:
    outcome = PlainServer().step(auth_bytes)
    assert outcome == Failed(client_message, client_message)


def test_a_good_password_authenticates_the_user() -> None:
    outcome = _login(b"\x00alice\x00alice-secret")
    assert outcome == Authenticated("alice", b"", None)


@pytest.mark.parametrize("auth_bytes", [b"\x00alice\x00wrong", b"\x00mallory\x00alice-secret"])
def test_a_wrong_password_and_an_unknown_user_get_the_same_answer(auth_bytes: bytes) -> None:
    outcome = _login(auth_bytes)
    message = "Authentication failed: Invalid username or password"
    assert outcome == Failed(message, message)


def test_a_check_that_cannot_be_made_fails_with_kafkas_message() -> None:
    need = PlainServer().step(b"\x00alice\x00alice-secret")
    assert isinstance(need, CheckPassword)
    outcome = need.unavailable()
    message = "Authentication failed: credentials for user could not be verified"
    assert outcome == Failed(message, message)


def test_the_password_stays_out_of_reprs() -> None:
    need = PlainServer().step(b"\x00alice\x00hunter2-sentinel")
    assert isinstance(need, CheckPassword)
    assert "hunter2-sentinel" not in repr(need)
    assert "hunter2-sentinel" not in repr(parse_plain(b"\x00alice\x00hunter2-sentinel"))


def test_a_second_token_after_success_fails() -> None:
    server = PlainServer()
    need = server.step(b"\x00alice\x00alice-secret")
    assert isinstance(need, CheckPassword)
    assert isinstance(need.resume(True), Authenticated)
    outcome = server.step(b"\x00alice\x00alice-secret")
    assert isinstance(outcome, Failed)
    assert outcome.client_message is None


def test_a_check_answered_twice_fails_the_second_time() -> None:
    need = PlainServer().step(b"\x00alice\x00alice-secret")
    assert isinstance(need, CheckPassword)
    need.resume(False)
    assert isinstance(need.resume(True), Failed)


def test_the_generic_client_message_is_not_used_for_plain() -> None:
    outcome = _login(b"\x00alice\x00wrong")
    assert isinstance(outcome, Failed)
    assert client_error_message(outcome, "PLAIN") == (
        "Authentication failed: Invalid username or password")


# --- kafka-python 3.0.12's client (kafka.net.sasl.plain) as the other side.

def _kafka_python_plain(username: str, password: str) -> tuple[SaslMechanismPlain,
                                                                  Authenticated | Failed]:
    client = SaslMechanismPlain(sasl_plain_username=username, sasl_plain_password=password)
    outcome = _login(client.auth_bytes())
    if isinstance(outcome, Authenticated):
        client.receive(outcome.auth_bytes)
    return client, outcome


def test_kafka_python_logs_in_with_the_right_password() -> None:
    client, outcome = _kafka_python_plain("alice", "alice-secret")
    assert outcome == Authenticated("alice")
    assert client.is_done() and client.is_authenticated()


def test_kafka_python_is_refused_with_a_wrong_password() -> None:
    _client, outcome = _kafka_python_plain("alice", "alice-secret!")
    assert isinstance(outcome, Failed)
    assert outcome.client_message == "Authentication failed: Invalid username or password"


# --- Hostile bytes.

_CORPUS = [b"\x00alice\x00alice-secret", b"alice\x00alice\x00pw", b"a\x00b\x00c\x00d"]


@st.composite
def _mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(_CORPUS)))
    for position, byte in draw(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 255)),
                                        max_size=4)):
        data.insert(min(position, len(data)), byte)
    return bytes(data)


@settings(max_examples=400, deadline=None)
@given(auth_bytes=st.one_of(st.binary(max_size=300), _mutated()))
def test_any_bytes_parse_or_fail_with_sasl_failure(auth_bytes: bytes) -> None:
    try:
        response = parse_plain(auth_bytes)
    except SaslFailure as failure:
        assert failure.client_message
    else:
        assert response.username and response.password


@settings(max_examples=400, deadline=None)
@given(auth_bytes=st.one_of(st.binary(max_size=300), _mutated()), valid=st.booleans())
def test_any_bytes_end_in_an_outcome(auth_bytes: bytes, valid: bool) -> None:
    step = PlainServer().step(auth_bytes)
    asked = isinstance(step, CheckPassword)
    if isinstance(step, CheckPassword):
        step = step.resume(valid)
    assert isinstance(step, Authenticated | Failed)
    assert isinstance(step, Authenticated) == (asked and valid)
