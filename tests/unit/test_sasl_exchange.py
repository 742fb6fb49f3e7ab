"""The common interface: every mechanism by name, needs answered by a synchronous verifier,
and any sequence of tokens ending in outcomes only."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.net.sasl.scram import SaslMechanismScram

from wire.sasl.exchange import (
    MECHANISM_NAMES,
    Mechanism,
    client_error_message,
    new_mechanism,
    resolve,
)
from wire.sasl.oauthbearer import OAuthBearerServer, TokenAccepted, TokenRejected
from wire.sasl.plain import PlainServer
from wire.sasl.scram import (
    SCRAM_MECHANISMS,
    ScramCredential,
    ScramServer,
    derive_credential,
    verify_password,
)
from wire.sasl.steps import Authenticated, Challenge, Failed

FAKE_SALT_KEY = b"0123456789abcdef0123456789abcdef"


class _Verifier:
    """A store holding alice's SCRAM credentials and one good token."""

    def __init__(self) -> None:
        self.credentials = {name: derive_credential(mechanism, "alice-secret")
                            for name, mechanism in SCRAM_MECHANISMS.items()}

    def check_password(self, username: str, password: str) -> bool:
        return username == "alice" and verify_password(
            SCRAM_MECHANISMS["SCRAM-SHA-512"], self.credentials["SCRAM-SHA-512"], password)

    def scram_credential(self, mechanism_name: str, username: str) -> ScramCredential | None:
        return self.credentials[mechanism_name] if username == "alice" else None

    def validate_token(self, token: str,
                       extensions: Mapping[str, str]) -> TokenAccepted | TokenRejected:
        return TokenAccepted("alice", 1_000) if token == "good" else TokenRejected()


VERIFIER = _Verifier()


@pytest.mark.parametrize(
    ("name", "server_type"),
    [("PLAIN", PlainServer), ("SCRAM-SHA-256", ScramServer), ("SCRAM-SHA-512", ScramServer),
     ("OAUTHBEARER", OAuthBearerServer)],
)
def test_each_mechanism_name_makes_its_server(name: str, server_type: type) -> None:
    mechanism = new_mechanism(name, fake_salt_key=FAKE_SALT_KEY)
    assert isinstance(mechanism, server_type)
    assert mechanism.mechanism_name == name
    assert name in MECHANISM_NAMES


@pytest.mark.parametrize("name", ["GSSAPI", "plain", "SCRAM-SHA-1", "", "OAUTHBEARER "])
def test_other_names_are_refused(name: str) -> None:
    with pytest.raises(ValueError):
        new_mechanism(name, fake_salt_key=FAKE_SALT_KEY)


@pytest.mark.parametrize(
    ("name", "auth_bytes", "principal_name", "expires_at_ms"),
    [
        ("PLAIN", b"\x00alice\x00alice-secret", "alice", None),
        ("OAUTHBEARER", b"n,,\x01auth=Bearer good\x01\x01", "alice", 1_000),
    ],
)
def test_one_message_mechanisms_resolve_to_authenticated(
        name: str, auth_bytes: bytes, principal_name: str, expires_at_ms: int | None) -> None:
    mechanism = new_mechanism(name, fake_salt_key=FAKE_SALT_KEY)
    outcome = resolve(mechanism.step(auth_bytes), VERIFIER)
    assert outcome == Authenticated(principal_name, b"", expires_at_ms)


@pytest.mark.parametrize("name", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_resolves_through_a_challenge(name: str) -> None:
    client = SaslMechanismScram(sasl_plain_username="alice", sasl_plain_password="alice-secret",
                                sasl_mechanism=name)
    mechanism = new_mechanism(name, fake_salt_key=FAKE_SALT_KEY)
    challenge = resolve(mechanism.step(client.auth_bytes()), VERIFIER)
    assert isinstance(challenge, Challenge)
    client.receive(challenge.auth_bytes)
    outcome = resolve(mechanism.step(client.auth_bytes()), VERIFIER)
    assert isinstance(outcome, Authenticated)
    client.receive(outcome.auth_bytes)
    assert client.is_authenticated()


def test_generic_message_names_the_mechanism() -> None:
    assert client_error_message(Failed("unknown user"), "SCRAM-SHA-512") == (
        "Authentication failed during authentication due to invalid credentials with SASL "
        "mechanism SCRAM-SHA-512")


@settings(max_examples=400, deadline=None)
@given(name=st.sampled_from(MECHANISM_NAMES),
       tokens=st.lists(st.one_of(st.binary(max_size=120),
                                 st.sampled_from([b"\x00alice\x00alice-secret", b"\x01",
                                                  b"n,,n=alice,r=abc",
                                                  b"n,,\x01auth=Bearer bad\x01\x01"])),
                       min_size=1, max_size=4))
def test_any_token_sequence_gives_outcomes_and_nothing_after_the_end(
        name: str, tokens: list[bytes]) -> None:
    mechanism: Mechanism = new_mechanism(name, fake_salt_key=FAKE_SALT_KEY)
    ended = False
    for token in tokens:
        outcome = resolve(mechanism.step(token), VERIFIER)
        assert isinstance(outcome, Challenge | Authenticated | Failed)
        if ended:
            assert isinstance(outcome, Failed)
        ended = ended or not isinstance(outcome, Challenge)
