"""SCRAM-SHA-256/512 server: RFC 7677's exchange byte for byte, Kafka's message grammar
(ScramMessagesTest's tables), Kafka's credential text, kafka-python's client as the other side,
and hostile bytes."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.net.sasl.scram import SaslMechanismScram, ScramClient

from wire.sasl.exchange import client_error_message
from wire.sasl.saslname import decode_saslname, encode_saslname
from wire.sasl.scram import (
    MAX_ITERATIONS,
    MIN_ITERATIONS,
    SCRAM_MECHANISMS,
    SCRAM_SHA_256,
    SCRAM_SHA_512,
    FetchCredential,
    ScramCredential,
    ScramMechanism,
    ScramServer,
    credential_from_salted_password,
    credential_from_text,
    credential_to_text,
    derive_credential,
    iterations_error,
    parse_client_final,
    parse_client_first,
    verify_password,
)
from wire.sasl.steps import Authenticated, Challenge, Failed, SaslFailure

FAKE_SALT_KEY = b"deployment-secret-for-fake-salts"

# RFC 7677 §3, the SCRAM-SHA-256 example exchange (user "user", password "pencil").
RFC_CLIENT_FIRST = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
RFC_SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
RFC_SERVER_FIRST = (b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                    b"s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
RFC_CLIENT_FINAL = (b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                    b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
RFC_SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="

GENERIC_SCRAM_256 = ("Authentication failed during authentication due to invalid credentials "
                     "with SASL mechanism SCRAM-SHA-256")
AUTHZID_MISMATCH = ("Authentication failed: Client requested an authorization id that is "
                    "different from username")


def _rfc_server() -> ScramServer:
    return ScramServer(SCRAM_SHA_256, fake_salt_key=FAKE_SALT_KEY, server_nonce=RFC_SERVER_NONCE)


def _rfc_credential() -> ScramCredential:
    return derive_credential(SCRAM_SHA_256, "pencil", 4096, salt=RFC_SALT)


def _at_client_final(server: ScramServer, client_first: bytes = RFC_CLIENT_FIRST,
                     credential: ScramCredential | None = None) -> Challenge:
    need = server.step(client_first)
    assert isinstance(need, FetchCredential)
    challenge = need.resume(credential if credential is not None else _rfc_credential())
    assert isinstance(challenge, Challenge)
    return challenge


# --- RFC 7677.

def test_rfc7677_server_first_message_is_reproduced_exactly() -> None:
    challenge = _at_client_final(_rfc_server())
    assert challenge.auth_bytes == RFC_SERVER_FIRST


def test_rfc7677_client_proof_is_accepted_and_the_server_signature_is_the_rfcs() -> None:
    server = _rfc_server()
    _at_client_final(server)
    outcome = server.step(RFC_CLIENT_FINAL)
    assert outcome == Authenticated("user", RFC_SERVER_FINAL, None)


def test_rfc7677_proof_with_one_bit_flipped_is_refused() -> None:
    server = _rfc_server()
    _at_client_final(server)
    proof = bytearray(base64.b64decode(RFC_CLIENT_FINAL.rsplit(b",p=", 1)[1]))
    proof[0] ^= 1
    final = RFC_CLIENT_FINAL.rsplit(b",p=", 1)[0] + b",p=" + base64.b64encode(bytes(proof))
    outcome = server.step(final)
    assert outcome == Failed("invalid client credentials")


def test_derived_keys_match_kafka_pythons_client_computation() -> None:
    client = ScramClient("user", "pencil", "SCRAM-SHA-256")
    client.nonce = b"rOprNGfwEbeRWgbNEkqO"
    client.first_message()
    client.process_server_first_message(RFC_SERVER_FIRST)
    credential = _rfc_credential()
    assert (credential.stored_key, credential.server_key) == (client.stored_key,
                                                              client.server_key)
    assert client.final_message() == RFC_CLIENT_FINAL


# --- Kafka's credential text (ScramCredentialUtils).

def test_credential_text_round_trips_in_kafkas_layout() -> None:
    credential = _rfc_credential()
    text = credential_to_text(credential)
    assert text.startswith("salt=W22ZaJ0SNY7soEsUEjb6gQ==,stored_key=")
    assert text.endswith(",iterations=4096")
    assert [field.split("=", 1)[0] for field in text.split(",")] == [
        "salt", "stored_key", "server_key", "iterations"]
    assert credential_from_text(text) == credential


@pytest.mark.parametrize(
    "text",
    [
        "abc",  # ScramCredentialUtilsTest.invalidCredential
        ",stored_key=AA==,server_key=AA==,iterations=4096",  # .missingFields
        "salt=AA==,stored_key=AA==,server_key=AA==,iterations=4096,a=test",  # .extraneousFields
        "salt=AA==,stored_key=AA==,server_key=AA==",
        "salt=AA==,stored_key=AA==,server_key=AA==,iterations=4096,",
        "salt=AA=,stored_key=AA==,server_key=AA==,iterations=4096",
        "salt=AA==,stored_key=!!!!,server_key=AA==,iterations=4096",
        "salt=AA==,stored_key=AA==,server_key=AA==,iterations=-1",
        "salt=AA==,stored_key=AA==,server_key=AA==,iterations=4096x",
        "salt=AA==,stored_key=AA==,server_key=AA==,iterations=99999999999",
        "salt=AA==,stored_key=AA==,server_key=AA==,iterations=" + "9" * 5000,
        "=AA==,stored_key=AA==,server_key=AA==,iterations=4096",
    ],
)
def test_malformed_credential_text_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        credential_from_text(text)


@pytest.mark.parametrize(
    ("iterations", "error"),
    [(4095, "Too few iterations"), (4096, None), (16384, None), (16385, "Too many iterations")],
)
def test_iteration_bounds_are_kafkas(iterations: int, error: str | None) -> None:
    assert iterations_error(iterations) == error
    if error is not None:
        with pytest.raises(ValueError):
            derive_credential(SCRAM_SHA_256, "pw", iterations)
    assert (MIN_ITERATIONS, MAX_ITERATIONS) == (4096, 16384)


def test_derived_credentials_get_a_fresh_32_byte_salt() -> None:
    first = derive_credential(SCRAM_SHA_512, "pw")
    second = derive_credential(SCRAM_SHA_512, "pw")
    assert len(first.salt) == 32 and first.salt != second.salt
    assert (len(first.stored_key), len(first.server_key)) == (64, 64)


def test_a_credential_from_a_salted_password_equals_the_derived_one() -> None:
    salted = SCRAM_SHA_256.salted_password("pencil", RFC_SALT, 4096)
    assert credential_from_salted_password(SCRAM_SHA_256, RFC_SALT, salted, 4096) == (
        _rfc_credential())


@pytest.mark.parametrize(
    ("password", "iterations", "valid"),
    [("pencil", 4096, True), ("pencil!", 4096, False), ("pencil", 1024, False)],
)
def test_verify_password_checks_against_the_stored_key(password: str, iterations: int,
                                                       valid: bool) -> None:
    salted = SCRAM_SHA_256.salted_password("pencil", RFC_SALT, iterations)
    credential = credential_from_salted_password(SCRAM_SHA_256, RFC_SALT, salted, iterations)
    assert verify_password(SCRAM_SHA_256, credential, password) is valid


def test_credential_keys_stay_out_of_repr() -> None:
    credential = _rfc_credential()
    assert repr(credential) == "ScramCredential(iterations=4096)"


# --- Message grammar: ScramMessagesTest's tables.

NONCE = "a1b2c3d4e5f6g7h8i9j0"
VALID_EXTENSIONS = [
    "ext=val1",
    "anotherext=name1=value1 name2=another test value \"'!$[]()",
    "first=val1,second=name1 = value ,third=123",
]
INVALID_EXTENSIONS = ["ext1=value", "ext", "ext=value1,value2", "ext=,", "ext =value"]


@pytest.mark.parametrize(
    ("message", "username", "authorization_id", "extensions"),
    [
        (f"n,,n=testuser,r={NONCE}", "testuser", "", {}),
        (f"n,,n=test=2Cuser,r={NONCE}", "test,user", "", {}),
        (f"n,,n=test=3Duser,r={NONCE}", "test=user", "", {}),
        (f"n,a=testuser,n=testuser,r={NONCE}", "testuser", "testuser", {}),
        (f"n,,n=testuser,r={NONCE},{VALID_EXTENSIONS[0]}", "testuser", "", {"ext": "val1"}),
        (f"n,,n=testuser,r={NONCE},{VALID_EXTENSIONS[1]}", "testuser", "",
         {"anotherext": "name1=value1 name2=another test value \"'!$[]()"}),
        (f"n,,n=testuser,r={NONCE},{VALID_EXTENSIONS[2]}", "testuser", "",
         {"first": "val1", "second": "name1 = value ", "third": "123"}),
        (f"n,,n=testuser,r={NONCE},tokenauth=true", "testuser", "", {"tokenauth": "true"}),
        (f"n,,n=testuser,r={NONCE},e=1,e=2", "testuser", "", {"e": "2"}),
        (f"n,,n=u=3D2C,r={NONCE}", "u=2C", "", {}),
        (f"n,,n=\x01 ~,r={NONCE}", "\x01 ~", "", {}),
    ],
)
def test_valid_client_first_messages(message: str, username: str, authorization_id: str,
                                     extensions: dict[str, str]) -> None:
    first = parse_client_first(message.encode())
    assert (first.username, first.authorization_id, first.nonce, first.extensions) == (
        username, authorization_id, NONCE, extensions)
    assert first.bare == message[len(first.gs2_header):]


@pytest.mark.parametrize(
    "message",
    [
        f"n,x=something,n=testuser,r={NONCE}",
        *(f"n,,{reserved},n=testuser,r={NONCE}" for reserved in ["m", "m=name,value", "m=,"]),
        *(f"n,,n=testuser,r={NONCE},{extension}" for extension in INVALID_EXTENSIONS),
        # RFC 5802: a reserved 'm' must fail (Kafka's table has it valid; Kiln refuses).
        f"n,,m=reserved-value,n=testuser,r={NONCE}",
        f"y,,n=testuser,r={NONCE}",
        f"p=tls-unique,,n=testuser,r={NONCE}",
        f"n,a=,n=testuser,r={NONCE}",
        f"n,,n=,r={NONCE}",
        f"n,,n=test=2cuser,r={NONCE}",
        f"n,,n=test=user,r={NONCE}",
        "n,,n=testuser,r=",
        "n,,n=testuser,r=a b",
        "n,,n=testuser",
        f"n,,r={NONCE},n=testuser",
        f"n,,n=testuser,r={NONCE},",
        f"n,,n=tëstuser,r={NONCE}",
        f"n,,n=test\x00user,r={NONCE}",
        f",,n=testuser,r={NONCE}",
        "",
    ],
)
def test_invalid_client_first_messages(message: str) -> None:
    with pytest.raises(SaslFailure):
        parse_client_first(message.encode())


PROOF = base64.b64encode(bytes(range(32))).decode()


@pytest.mark.parametrize(
    ("message", "extensions"),
    [
        (f"c=biws,r={NONCE},p={PROOF}", ""),
        *((f"c=biws,r={NONCE},{extension},p={PROOF}", extension)
          for extension in VALID_EXTENSIONS),
        (f"c=,r={NONCE},p=", ""),  # Kafka's BASE64 may be empty; the server refuses it later
    ],
)
def test_valid_client_final_messages(message: str, extensions: str) -> None:
    final = parse_client_final(message.encode())
    assert final.nonce == NONCE
    assert final.without_proof == message.rsplit(",p=", 1)[0]


@pytest.mark.parametrize(
    "message",
    [
        f"c=ab,r={NONCE},p={PROOF}",
        f"c=biws,r={NONCE},p=123",
        *(f"c=biws,r={NONCE},{extension},p={PROOF}" for extension in INVALID_EXTENSIONS),
        f"c=biws,r={NONCE}",
        f"r={NONCE},c=biws,p={PROOF}",
        f"c=biws,r={NONCE},p={PROOF},x=y",
        f"c=biws,r=,p={PROOF}",
        f"c=biws,r={NONCE},p={PROOF[:-1]}",
        f"c=b=ws,r={NONCE},p={PROOF}",
        f"c=biws,r={NONCE},p={PROOF}\x00",
        "",
    ],
)
def test_invalid_client_final_messages(message: str) -> None:
    with pytest.raises(SaslFailure):
        parse_client_final(message.encode())


# --- The server's rules.

def test_an_authzid_naming_another_user_fails_with_kafkas_message() -> None:
    outcome = _rfc_server().step(b"n,a=admin,n=user,r=abc")
    assert outcome == Failed("authorization id differs from the user", AUTHZID_MISMATCH)


def test_an_escaped_authzid_equal_to_the_user_is_accepted() -> None:
    need = _rfc_server().step(b"n,a=a=2Cb=3Dc,n=a=2Cb=3Dc,r=abc")
    assert isinstance(need, FetchCredential)
    assert need.username == "a,b=c"


@pytest.mark.parametrize("value", ["true", "TRUE", "True"])
def test_delegation_tokens_are_refused(value: str) -> None:
    outcome = _rfc_server().step(f"n,,n=user,r=abc,tokenauth={value}".encode())
    assert outcome == Failed("delegation tokens (tokenauth) are not supported")


def test_tokenauth_false_and_unknown_extensions_are_ignored() -> None:
    need = _rfc_server().step(b"n,,n=user,r=abc,tokenauth=false,foo=bar")
    assert isinstance(need, FetchCredential)
    assert (need.mechanism_name, need.username) == ("SCRAM-SHA-256", "user")


@pytest.mark.parametrize(
    ("final", "reason"),
    [
        (b"c=biws,r=rOprNGfwEbeRWgbNEkqO,p=" + PROOF.encode(),
         "Invalid client nonce in the final client message."),
        (b"c=eSws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=" + PROOF.encode(),
         "channel binding does not match the gs2 header"),
        (b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=AAAA",
         "client proof has the wrong length"),
        (b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=" + PROOF.encode(),
         "invalid client credentials"),
    ],
)
def test_bad_client_final_messages_fail_with_the_generic_answer(final: bytes,
                                                                reason: str) -> None:
    server = _rfc_server()
    _at_client_final(server)
    outcome = server.step(final)
    assert outcome == Failed(reason)
    assert client_error_message(outcome, "SCRAM-SHA-256") == GENERIC_SCRAM_256


def test_channel_binding_carries_the_authzid_header() -> None:
    server = _rfc_server()
    _at_client_final(server, b"n,a=user,n=user,r=rOprNGfwEbeRWgbNEkqO")
    outcome = server.step(RFC_CLIENT_FINAL)  # c=biws is "n,,", not "n,a=user,"
    assert outcome == Failed("channel binding does not match the gs2 header")


def test_a_stored_credential_below_4096_iterations_fails() -> None:
    salted = SCRAM_SHA_256.salted_password("pencil", RFC_SALT, 4095)
    weak = credential_from_salted_password(SCRAM_SHA_256, RFC_SALT, salted, 4095)
    need = _rfc_server().step(RFC_CLIENT_FIRST)
    assert isinstance(need, FetchCredential)
    outcome = need.resume(weak)
    assert isinstance(outcome, Failed) and outcome.client_message is None


def test_a_store_that_does_not_answer_fails_generically() -> None:
    need = _rfc_server().step(RFC_CLIENT_FIRST)
    assert isinstance(need, FetchCredential)
    assert need.unavailable() == Failed("credentials could not be obtained")


@pytest.mark.parametrize("token", [RFC_CLIENT_FIRST, RFC_CLIENT_FINAL, b""])
def test_tokens_after_success_fail(token: bytes) -> None:
    server = _rfc_server()
    _at_client_final(server)
    assert isinstance(server.step(RFC_CLIENT_FINAL), Authenticated)
    assert isinstance(server.step(token), Failed)


def test_a_token_while_the_credential_is_fetched_fails() -> None:
    server = _rfc_server()
    need = server.step(RFC_CLIENT_FIRST)
    assert isinstance(need, FetchCredential)
    assert isinstance(server.step(RFC_CLIENT_FINAL), Failed)
    assert isinstance(need.resume(_rfc_credential()), Failed)


def test_the_server_nonce_is_fresh_and_long() -> None:
    nonces = set()
    for _ in range(3):
        server = ScramServer(SCRAM_SHA_256, fake_salt_key=FAKE_SALT_KEY)
        challenge = _at_client_final(server)
        nonce = challenge.auth_bytes.split(b",")[0][2:]
        assert nonce.startswith(b"rOprNGfwEbeRWgbNEkqO")
        nonces.add(nonce)
    assert len(nonces) == 3
    assert all(len(nonce) - len(b"rOprNGfwEbeRWgbNEkqO") >= 43 for nonce in nonces)


@pytest.mark.parametrize(
    "kwargs",
    [{"fake_salt_key": b"short"}, {"fake_salt_key": FAKE_SALT_KEY, "fake_iterations": 1000},
     {"fake_salt_key": FAKE_SALT_KEY, "server_nonce": "a,b"}],
)
def test_bad_server_settings_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        ScramServer(SCRAM_SHA_256, **kwargs)  # type: ignore[arg-type]


# --- Unknown users: a challenge like any other, then the answer a wrong password gets.

def _server_first_of(mechanism: ScramMechanism, username: str,
                     credential: ScramCredential | None,
                     fake_salt_key: bytes = FAKE_SALT_KEY) -> dict[bytes, bytes]:
    need = ScramServer(mechanism, fake_salt_key=fake_salt_key).step(
        f"n,,n={username},r=abc".encode())
    assert isinstance(need, FetchCredential)
    challenge = need.resume(credential)
    assert isinstance(challenge, Challenge)
    fields = (field.partition(b"=") for field in challenge.auth_bytes.split(b","))
    return {key: value for key, _, value in fields}


@pytest.mark.parametrize("mechanism", [SCRAM_SHA_256, SCRAM_SHA_512])
def test_an_unknown_user_gets_a_challenge_shaped_like_a_real_one(
        mechanism: ScramMechanism) -> None:
    real = _server_first_of(mechanism, "alice", derive_credential(mechanism, "pw"))
    fake = _server_first_of(mechanism, "mallory", None)
    assert sorted(real) == sorted(fake) == [b"i", b"r", b"s"]
    assert fake[b"i"] == real[b"i"] == b"4096"
    assert len(base64.b64decode(fake[b"s"])) == len(base64.b64decode(real[b"s"])) == 32


def test_an_unknown_users_salt_is_stable_per_user_mechanism_and_secret() -> None:
    def salt(mechanism: ScramMechanism, user: str, key: bytes = FAKE_SALT_KEY) -> bytes:
        return _server_first_of(mechanism, user, None, key)[b"s"]

    assert salt(SCRAM_SHA_256, "mallory") == salt(SCRAM_SHA_256, "mallory")
    assert len({salt(SCRAM_SHA_256, "mallory"), salt(SCRAM_SHA_256, "eve"),
                salt(SCRAM_SHA_512, "mallory"),
                salt(SCRAM_SHA_256, "mallory", b"another-deployment-secret")}) == 4


# --- kafka-python 3.0.12's client (kafka.net.sasl.scram) as the other side.

STORE = {
    (name, "alice"): derive_credential(mechanism, "alice-secret", 4096)
    for name, mechanism in SCRAM_MECHANISMS.items()
}


def _kafka_python_login(mechanism_name: str, username: str,
                        password: str) -> tuple[SaslMechanismScram, Authenticated | Failed]:
    client = SaslMechanismScram(sasl_plain_username=username, sasl_plain_password=password,
                                sasl_mechanism=mechanism_name)
    server = ScramServer(SCRAM_MECHANISMS[mechanism_name], fake_salt_key=FAKE_SALT_KEY)
    need = server.step(client.auth_bytes())
    assert isinstance(need, FetchCredential)
    challenge = need.resume(STORE.get((mechanism_name, username)))
    assert isinstance(challenge, Challenge)
    client.receive(challenge.auth_bytes)
    outcome = server.step(client.auth_bytes())
    assert isinstance(outcome, Authenticated | Failed)
    if isinstance(outcome, Authenticated):
        client.receive(outcome.auth_bytes)  # raises if the server signature is wrong
    return client, outcome


@pytest.mark.parametrize("mechanism_name", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_kafka_python_logs_in_and_accepts_the_server_signature(mechanism_name: str) -> None:
    client, outcome = _kafka_python_login(mechanism_name, "alice", "alice-secret")
    assert isinstance(outcome, Authenticated)
    assert outcome.principal_name == "alice" and outcome.expires_at_ms is None
    assert client.is_done() and client.is_authenticated()


@pytest.mark.parametrize("mechanism_name", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
@pytest.mark.parametrize(("username", "password"), [("alice", "alice-secret2"),
                                                    ("mallory", "alice-secret")])
def test_kafka_python_with_a_wrong_password_or_unknown_user_fails_alike(
        mechanism_name: str, username: str, password: str) -> None:
    client, outcome = _kafka_python_login(mechanism_name, username, password)
    assert isinstance(outcome, Failed)
    assert outcome.client_message is None
    assert client_error_message(outcome, mechanism_name) == (
        "Authentication failed during authentication due to invalid credentials with SASL "
        f"mechanism {mechanism_name}")
    assert not client.is_authenticated()


def test_kafka_python_cannot_log_in_with_another_mechanisms_credential() -> None:
    client = SaslMechanismScram(sasl_plain_username="alice", sasl_plain_password="alice-secret",
                                sasl_mechanism="SCRAM-SHA-512")
    server = ScramServer(SCRAM_SHA_512, fake_salt_key=FAKE_SALT_KEY)
    need = server.step(client.auth_bytes())
    assert isinstance(need, FetchCredential)
    challenge = need.resume(STORE[("SCRAM-SHA-256", "alice")])
    assert isinstance(challenge, Challenge)
    client.receive(challenge.auth_bytes)
    assert server.step(client.auth_bytes()) == Failed("invalid client credentials")


# --- Names and hostile bytes.

@settings(max_examples=300, deadline=None)
@given(name=st.text(st.characters(min_codepoint=1, max_codepoint=0x7F), min_size=1,
                    max_size=40))
def test_saslnames_round_trip_and_reach_the_credential_lookup(name: str) -> None:
    saslname = encode_saslname(name)
    assert "," not in saslname
    assert decode_saslname(saslname) == name
    need = _rfc_server().step(f"n,a={saslname},n={saslname},r=abc".encode())
    assert isinstance(need, FetchCredential)
    assert need.username == name


_FIRSTS = [RFC_CLIENT_FIRST, b"n,a=u,n=u,r=x,ext=1", b"n,,n=a=2Cb,r=x,tokenauth=false"]
_FINALS = [RFC_CLIENT_FINAL, f"c=biws,r={NONCE},e=x,p={PROOF}".encode()]


@st.composite
def _mutated(draw: st.DrawFn, corpus: list[bytes]) -> bytes:
    data = bytearray(draw(st.sampled_from(corpus)))
    for position, byte, delete in draw(st.lists(
            st.tuples(st.integers(0, 120), st.sampled_from(b",=\x00\x01\x7f\x80naprcm2C3D"),
                      st.booleans()), max_size=4)):
        position = min(position, len(data))
        if delete and position < len(data):
            del data[position]
        else:
            data.insert(position, byte)
    return bytes(data)


@settings(max_examples=500, deadline=None)
@given(auth_bytes=st.one_of(st.binary(max_size=300), _mutated(_FIRSTS), _mutated(_FINALS)))
def test_any_bytes_parse_or_raise_sasl_failure(auth_bytes: bytes) -> None:
    for parse in (parse_client_first, parse_client_final):
        try:
            parse(auth_bytes)
        except SaslFailure as failure:
            assert failure.reason


@settings(max_examples=500, deadline=None)
@given(first=st.one_of(st.binary(max_size=200), _mutated(_FIRSTS)),
       final=st.one_of(st.binary(max_size=200), _mutated(_FINALS)),
       known=st.booleans())
def test_any_exchange_ends_in_an_outcome(first: bytes, final: bytes, known: bool) -> None:
    server = _rfc_server()
    step = server.step(first)
    if isinstance(step, FetchCredential):
        step = step.resume(_rfc_credential() if known else None)
    if isinstance(step, Challenge):
        step = server.step(final)
    assert isinstance(step, Challenge | Authenticated | Failed)
    # Only the RFC's own exchange can succeed: no changed message keeps a proof valid.
    assert isinstance(step, Authenticated) == (
        (first, final, known) == (RFC_CLIENT_FIRST, RFC_CLIENT_FINAL, True))
