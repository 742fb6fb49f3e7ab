"""SASL/OAUTHBEARER server: Kafka's OAuthBearerClientInitialResponse grammar (its test cases),
OAuthBearerSaslServer's error challenge and %x01 acknowledgement, kafka-python's client as the
other side, and hostile bytes."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.net.sasl.oauth import AbstractTokenProvider, SaslMechanismOAuth

from wire.sasl.exchange import client_error_message
from wire.sasl.oauthbearer import (
    OAuthBearerServer,
    TokenAccepted,
    TokenRejected,
    ValidateToken,
    error_challenge,
    parse_client_initial_response,
)
from wire.sasl.steps import Authenticated, Challenge, Failed, SaslFailure

GOOD_TOKEN = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.c2lnbmF0dXJl"
EXPIRES_AT_MS = 1_767_225_600_000


def _validate(need: ValidateToken) -> TokenAccepted | TokenRejected:
    if need.token == GOOD_TOKEN:
        return TokenAccepted("alice", EXPIRES_AT_MS)
    return TokenRejected()


# --- Grammar: OAuthBearerClientInitialResponseTest's cases, then Kiln's own.

@pytest.mark.parametrize(
    ("message", "token", "authorization_id", "extensions"),
    [
        ("n,,\x01auth=Bearer 123.345.567\x01nineteen=42\x01\x01", "123.345.567", "",
         {"nineteen": "42"}),
        ("n,,\x01auth=Bearer 123.345.567\x01\x01", "123.345.567", "", {}),
        ("n,a=myuser,\x01auth=Bearer 345\x01\x01", "345", "myuser", {}),
        ("n,,\x01propA=valueA1, valueA2\x01auth=Bearer 567\x01propB=valueB\x01\x01", "567", "",
         {"propA": "valueA1, valueA2", "propB": "valueB"}),
        # RFC 7628's example, padding dropped as in Kafka's testRfc7688Example.
        ("n,a=user@example.com,\x01host=server.example.com\x01port=143\x01"
         "auth=Bearer vF9dft4qmTc2Nvb3RlckBhbHRhdmlzdGEuY29tCg\x01\x01",
         "vF9dft4qmTc2Nvb3RlckBhbHRhdmlzdGEuY29tCg", "user@example.com",
         {"host": "server.example.com", "port": "143"}),
        # RFC 6750 token characters (testCharSupportForRfc6750Token).
        ("n,a=user@example.com,\x01host=server.example.com\x01port=143\x01"
         "auth=Bearer vF-9.df_t4qm~Tc2Nvb3RlckBhbHR+hdmlzdGEuY29/tCg==\x01\x01",
         "vF-9.df_t4qm~Tc2Nvb3RlckBhbHR+hdmlzdGEuY29/tCg==", "user@example.com",
         {"host": "server.example.com", "port": "143"}),
        ("n,,\x01auth=bEaReR   tok\x01\x01", "tok", "", {}),
        ("n,,\x01auth=Bearer old\x01auth=Bearer new\x01\x01", "new", "", {}),
        ("n,,\x01k=a=b\t\r\n \x01auth=Bearer t\x01k=c\x01\x01", "t", "", {"k": "c"}),
        ("n,a=a=2Cb=3Dc,\x01auth=Bearer t\x01\x01", "t", "a,b=c", {}),
    ],
)
def test_valid_initial_responses(message: str, token: str, authorization_id: str,
                                 extensions: dict[str, str]) -> None:
    response = parse_client_initial_response(message.encode())
    assert (response.token, response.authorization_id, response.extensions) == (
        token, authorization_id, extensions)


@pytest.mark.parametrize(
    "message",
    [
        "",
        "n,,",
        "n,,\x01",
        "n,,\x01\x01",  # no auth
        "n,,\x01auth=Bearer t\x01",  # no final %x01
        "n,,auth=Bearer t\x01\x01",  # no %x01 after the gs2 header
        "n,,\x01auth=Bearer t\x01\x01\x01",
        "n,,\x01auth=Bearer t\x01x\x01\x01",
        "y,,\x01auth=Bearer t\x01\x01",
        "n,b=x,\x01auth=Bearer t\x01\x01",
        "n,a=,\x01auth=Bearer t\x01\x01",
        "n,a=a=b,\x01auth=Bearer t\x01\x01",
        "n,a=x\x01auth=Bearer t\x01\x01",
        "n,,\x01auth=Basic dXNlcjpwdw==\x01\x01",
        "n,,\x01auth=Bearer\x01\x01",
        "n,,\x01auth=Bearer a b\x01\x01",
        "n,,\x01auth=Bearer t=x\x01\x01",
        "n,,\x01auth= Bearer t\x01\x01",
        "n,,\x01auth=Bearer\tt\x01\x01",
        # testThrowsSaslExceptionOnInvalidExtensionKey: keys are letters only
        "n,,\x01auth=Bearer t\x01nineteen9=42\x01\x01",
        "n,,\x01auth=Bearer t\x01key=\x01\x01",
        "n,,\x01auth=Bearer t\x01=v\x01\x01",
        "n,,\x01auth=Bearer t\x01key=v\x00\x01\x01",
        "n,,\x01auth=Bearer tökén\x01\x01",
        "n,,\x01auth=Bearer t\x01\x01 ",
    ],
)
def test_invalid_initial_responses(message: str) -> None:
    with pytest.raises(SaslFailure):
        parse_client_initial_response(message.encode())


def test_the_token_stays_out_of_reprs() -> None:
    message = f"n,,\x01auth=Bearer {GOOD_TOKEN}\x01\x01".encode()
    need = OAuthBearerServer().step(message)
    assert isinstance(need, ValidateToken)
    assert GOOD_TOKEN not in repr(need)
    assert GOOD_TOKEN not in repr(parse_client_initial_response(message))


# --- The exchange.

def _first_step(message: bytes) -> tuple[OAuthBearerServer, ValidateToken]:
    server = OAuthBearerServer()
    need = server.step(message)
    assert isinstance(need, ValidateToken)
    return server, need


def test_a_valid_token_authenticates_its_principal_until_it_expires() -> None:
    _server, need = _first_step(f"n,,\x01auth=Bearer {GOOD_TOKEN}\x01x=y\x01\x01".encode())
    assert need.extensions == {"x": "y"}
    assert need.resume(_validate(need)) == Authenticated("alice", b"", EXPIRES_AT_MS)


def test_an_authzid_naming_the_principal_is_accepted() -> None:
    _server, need = _first_step(f"n,a=alice,\x01auth=Bearer {GOOD_TOKEN}\x01\x01".encode())
    assert need.resume(_validate(need)) == Authenticated("alice", b"", EXPIRES_AT_MS)


def test_an_authzid_naming_someone_else_fails_with_kafkas_message() -> None:
    _server, need = _first_step(f"n,a=bob,\x01auth=Bearer {GOOD_TOKEN}\x01\x01".encode())
    outcome = need.resume(_validate(need))
    assert outcome == Failed(
        "authorization id differs from the token's principal",
        "Authentication failed: Client requested an authorization id (bob) that is different "
        "from the token's principal name (alice)")


def test_a_rejected_token_gets_the_json_challenge_then_fails_on_the_acknowledgement() -> None:
    server, need = _first_step(b"n,,\x01auth=Bearer forged\x01\x01")
    challenge = need.resume(_validate(need))
    assert challenge == Challenge(b'{"status":"invalid_token"}')
    outcome = server.step(b"\x01")
    assert outcome == Failed("token rejected", '{"status":"invalid_token"}')
    assert isinstance(outcome, Failed)
    assert client_error_message(outcome, "OAUTHBEARER") == '{"status":"invalid_token"}'


@pytest.mark.parametrize("second", [b"", b"\x01\x01", f"n,,\x01auth=Bearer {GOOD_TOKEN}\x01\x01"
                                    .encode()])
def test_after_the_json_challenge_anything_but_the_acknowledgement_fails(second: bytes) -> None:
    server, need = _first_step(b"n,,\x01auth=Bearer forged\x01\x01")
    need.resume(TokenRejected())
    outcome = server.step(second)
    assert outcome == Failed("expected %x01 after the error challenge")


@pytest.mark.parametrize(
    ("rejected", "json_text"),
    [
        (TokenRejected(), '{"status":"invalid_token"}'),
        (TokenRejected("invalid_token", "kafka.write"),
         '{"status":"invalid_token", "scope":"kafka.write"}'),
        (TokenRejected("insufficient_scope", None, "https://idp/.well-known/openid-configuration"),
         '{"status":"insufficient_scope", "openid-configuration":'
         '"https://idp/.well-known/openid-configuration"}'),
        (TokenRejected("invalid_token", "a b", "u"),
         '{"status":"invalid_token", "scope":"a b", "openid-configuration":"u"}'),
        (TokenRejected('quote"and\\'), '{"status":"quote\\"and\\\\"}'),
    ],
)
def test_error_challenges_are_kafkas_json(rejected: TokenRejected, json_text: str) -> None:
    challenge = error_challenge(rejected)
    assert challenge == json_text.encode()
    assert json.loads(challenge)["status"] == rejected.status


def test_a_validator_that_cannot_answer_fails_generically() -> None:
    _server, need = _first_step(f"n,,\x01auth=Bearer {GOOD_TOKEN}\x01\x01".encode())
    outcome = need.unavailable()
    assert isinstance(outcome, Failed) and outcome.client_message is None
    assert client_error_message(outcome, "OAUTHBEARER", reauthenticating=True) == (
        "Authentication failed during re-authentication due to invalid credentials with SASL "
        "mechanism OAUTHBEARER")


def test_malformed_input_fails_generically() -> None:
    outcome = OAuthBearerServer().step(b"n,,\x01auth=Basic abc\x01\x01")
    assert isinstance(outcome, Failed) and outcome.client_message is None


def test_tokens_after_success_fail() -> None:
    server, need = _first_step(f"n,,\x01auth=Bearer {GOOD_TOKEN}\x01\x01".encode())
    assert isinstance(need.resume(_validate(need)), Authenticated)
    assert isinstance(server.step(b"\x01"), Failed)


def test_a_verdict_given_twice_fails_the_second_time() -> None:
    _server, need = _first_step(f"n,,\x01auth=Bearer {GOOD_TOKEN}\x01\x01".encode())
    need.resume(TokenRejected())
    assert isinstance(need.resume(TokenAccepted("alice", EXPIRES_AT_MS)), Failed)


# --- kafka-python 3.0.12's client (kafka.net.sasl.oauth) as the other side.

class _Provider(AbstractTokenProvider):  # type: ignore[misc]
    def __init__(self, token: str, extensions: dict[str, str]) -> None:
        super().__init__()
        self._token = token
        self._extensions = extensions

    def token(self) -> str:
        return self._token

    def extensions(self) -> dict[str, str]:
        return self._extensions


def _kafka_python_login(token: str, extensions: dict[str, str]) -> tuple[SaslMechanismOAuth,
                                                                         list[object]]:
    client = SaslMechanismOAuth(sasl_oauth_token_provider=_Provider(token, extensions))
    server = OAuthBearerServer()
    outcomes: list[object] = []
    while not client.is_done() and len(outcomes) < 3:
        step = server.step(client.auth_bytes())
        if isinstance(step, ValidateToken):
            step = step.resume(_validate(step))
        outcomes.append(step)
        if isinstance(step, Failed):
            break
        assert isinstance(step, Challenge | Authenticated)
        client.receive(step.auth_bytes)
    return client, outcomes


def test_kafka_python_logs_in_with_a_valid_token_and_extensions() -> None:
    client, outcomes = _kafka_python_login(GOOD_TOKEN, {"traceId": "abc-123"})
    assert outcomes == [Authenticated("alice", b"", EXPIRES_AT_MS)]
    assert client.is_authenticated()


def test_kafka_python_acknowledges_the_json_challenge_and_is_refused() -> None:
    client, outcomes = _kafka_python_login("forged.token.value", {})
    assert outcomes == [Challenge(b'{"status":"invalid_token"}'),
                        Failed("token rejected", '{"status":"invalid_token"}')]
    assert not client.is_authenticated()


# --- Hostile bytes.

_CORPUS = [f"n,a=alice,\x01auth=Bearer {GOOD_TOKEN}\x01k=v\x01\x01".encode(),
           b"n,,\x01auth=Bearer a.b.c\x01\x01"]


@st.composite
def _mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(_CORPUS)))
    for position, byte, delete in draw(st.lists(
            st.tuples(st.integers(0, 100), st.sampled_from(b",=\x00\x01 \t\x80naA2C3D"),
                      st.booleans()), max_size=4)):
        position = min(position, len(data))
        if delete and position < len(data):
            del data[position]
        else:
            data.insert(position, byte)
    return bytes(data)


@settings(max_examples=500, deadline=None)
@given(auth_bytes=st.one_of(st.binary(max_size=300), _mutated()))
def test_any_bytes_parse_or_raise_sasl_failure(auth_bytes: bytes) -> None:
    try:
        response = parse_client_initial_response(auth_bytes)
    except SaslFailure as failure:
        assert failure.reason
    else:
        assert response.token and "auth" not in response.extensions


@settings(max_examples=500, deadline=None)
@given(first=st.one_of(st.binary(max_size=200), _mutated()), second=st.binary(max_size=4),
       accept=st.booleans())
def test_any_exchange_ends_in_an_outcome(first: bytes, second: bytes, accept: bool) -> None:
    server = OAuthBearerServer()
    step = server.step(first)
    if isinstance(step, ValidateToken):
        step = step.resume(TokenAccepted("alice", EXPIRES_AT_MS) if accept else TokenRejected())
    if isinstance(step, Challenge):
        step = server.step(second)
    assert isinstance(step, Authenticated | Failed)
