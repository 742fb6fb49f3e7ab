"""SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677): the server, Kafka's stored
credentials and their text form.

Read at apache/kafka 1eb7644: `ScramSaslServer`, `ScramMessages`, `ScramFormatter`,
`ScramMechanism`, `ScramExtensions`, `ScramCredentialUtils`, `ScramControlManager`.

    client-first   n,[a=authzid],n=saslname,r=cnonce[,ext=value...]
    server-first   r=cnonce+snonce,s=base64(salt),i=iterations
    client-final   c=base64(gs2 header),r=cnonce+snonce[,ext=value...],p=base64(ClientProof)
    server-final   v=base64(ServerSignature)

As Kafka: gs2 header `n` only (no channel binding), names and values ASCII only (Kafka's
grammar), `=2C`/`=3D` escapes, unknown extensions ignored (the last of a repeated one wins),
an authzid must name the user, a stored credential below 4096 iterations fails, proof checked
as `H(ClientSignature XOR ClientProof) == StoredKey` in constant time. A failure never sends
`e=`: Kafka answers SASL_AUTHENTICATION_FAILED instead, with its generic text except for the
authzid mismatch.

Where Kiln differs, on purpose:
- **Unknown user**: answered with a server-first message like any other (salt = HMAC of the
  deployment's secret over mechanism and name, the configured iterations); the exchange fails
  at the client-final message, as a wrong password does. Kafka fails at once, which lets a
  client list users (docs/security-design.md §4.2).
- The authzid is compared with the user after both are unescaped, and before the credential
  is fetched (Kafka compares the escaped authzid, after the lookup: its answer differs for
  users that exist).
- `tokenauth=true` (a delegation token) fails at the first message: Kiln has none.
- `m=` (reserved) fails, as RFC 5802 requires; Kafka ignores it.
- The AuthMessage is made of the messages as sent (RFC 5802); Kafka rebuilds them from what
  it parsed, which differs only for clients that send extensions in the final message or
  several in the first.
- `c=` must be the base64 of the client's own gs2 header (RFC 5802's `c` attribute); Kafka
  decodes it and checks nothing.
"""

from __future__ import annotations

import base64
import binascii
import enum
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass, field
from typing import TypeAlias

from wire.sasl.saslname import decode_saslname
from wire.sasl.steps import Authenticated, Challenge, Failed, SaslFailure

MIN_ITERATIONS = 4096  # ScramMechanism.minIterations, both mechanisms
MAX_ITERATIONS = 16384  # ScramMechanism.maxIterations, ScramControlManager.MAX_ITERATIONS
SALT_BYTES = 32
SERVER_NONCE_BYTES = 32


@dataclass(frozen=True, slots=True)
class ScramMechanism:
    mechanism_name: str
    hash_name: str
    digest_size: int

    def hmac(self, key: bytes, message: bytes) -> bytes:
        return hmac.digest(key, message, self.hash_name)

    def hash(self, data: bytes) -> bytes:
        return hashlib.new(self.hash_name, data).digest()

    def salted_password(self, password: str, salt: bytes, iterations: int) -> bytes:
        """Hi(password, salt, i) of RFC 5802: PBKDF2 with this HMAC; Kafka sends the
        password's UTF-8 bytes as they are (no SASLprep), and so does Kiln."""
        return hashlib.pbkdf2_hmac(self.hash_name, password.encode("utf-8"), salt, iterations)


SCRAM_SHA_256 = ScramMechanism("SCRAM-SHA-256", "sha256", 32)
SCRAM_SHA_512 = ScramMechanism("SCRAM-SHA-512", "sha512", 64)
SCRAM_MECHANISMS = {m.mechanism_name: m for m in (SCRAM_SHA_256, SCRAM_SHA_512)}


@dataclass(frozen=True, slots=True)
class ScramCredential:
    """What a server keeps of a password (`org.apache.kafka.common.security.scram.
    ScramCredential`): enough to check a proof, nothing to replay. Keys stay out of `repr`."""

    salt: bytes = field(repr=False)
    stored_key: bytes = field(repr=False)
    server_key: bytes = field(repr=False)
    iterations: int


def iterations_error(iterations: int) -> str | None:
    """Why a credential with this many iterations may not be stored, or None
    (`ScramControlManager`: UNACCEPTABLE_CREDENTIAL with these texts)."""
    if iterations < MIN_ITERATIONS:
        return "Too few iterations"
    if iterations > MAX_ITERATIONS:
        return "Too many iterations"
    return None


def credential_from_salted_password(mechanism: ScramMechanism, salt: bytes,
                                    salted_password: bytes, iterations: int) -> ScramCredential:
    """As `ScramControlManager` turns an AlterUserScramCredentials upsertion into a credential."""
    client_key = mechanism.hmac(salted_password, b"Client Key")
    return ScramCredential(salt=salt, stored_key=mechanism.hash(client_key),
                           server_key=mechanism.hmac(salted_password, b"Server Key"),
                           iterations=iterations)


def derive_credential(mechanism: ScramMechanism, password: str, iterations: int = MIN_ITERATIONS,
                      salt: bytes | None = None) -> ScramCredential:
    """A new credential for `password` (`ScramFormatter.generateCredential`), with a random
    32-byte salt unless one is given. Iterations outside 4096..16384 raise `ValueError`, as
    Kafka refuses to store them."""
    error = iterations_error(iterations)
    if error is not None:
        raise ValueError(f"{error}: {iterations} (allowed {MIN_ITERATIONS}..{MAX_ITERATIONS})")
    if salt is None:
        salt = secrets.token_bytes(SALT_BYTES)
    salted = mechanism.salted_password(password, salt, iterations)
    return credential_from_salted_password(mechanism, salt, salted, iterations)


def verify_password(mechanism: ScramMechanism, credential: ScramCredential, password: str) -> bool:
    """Whether `password` is the one `credential` was made from (Kiln's PLAIN check). One
    PBKDF2 run; a credential outside the allowed iterations is refused, so the work is bounded
    whatever the store holds."""
    if iterations_error(credential.iterations) is not None:
        return False
    salted = mechanism.salted_password(password, credential.salt, credential.iterations)
    stored_key = mechanism.hash(mechanism.hmac(salted, b"Client Key"))
    return hmac.compare_digest(stored_key, credential.stored_key)


# --- Kafka's text form (ScramCredentialUtils), as kafka-configs and the metadata log show it.

_CREDENTIAL_KEYS = ("salt", "stored_key", "server_key", "iterations")
_DIGITS = re.compile(r"[0-9]{1,10}")


def credential_to_text(credential: ScramCredential) -> str:
    """`salt=<b64>,stored_key=<b64>,server_key=<b64>,iterations=<n>`."""
    return (f"salt={_b64(credential.salt)},stored_key={_b64(credential.stored_key)},"
            f"server_key={_b64(credential.server_key)},iterations={credential.iterations}")


def credential_from_text(text: str) -> ScramCredential:
    """The inverse of `credential_to_text`; anything else raises `ValueError` (Kafka: exactly
    those four keys, each `key=value`, base64 values, an integer count)."""
    fields: dict[str, str] = {}
    for token in text.split(","):
        key, sep, value = token.partition("=")
        if not sep or not key:
            raise ValueError("SCRAM credential text: every field must be key=value")
        fields[key] = value
    if sorted(fields) != sorted(_CREDENTIAL_KEYS):
        raise ValueError("SCRAM credential text: needs exactly salt, stored_key, server_key, "
                         "iterations")
    if _DIGITS.fullmatch(fields["iterations"]) is None or int(fields["iterations"]) > 2**31 - 1:
        raise ValueError("SCRAM credential text: iterations is not a positive int32")
    decoded: dict[str, bytes] = {}
    for key in ("salt", "stored_key", "server_key"):
        try:
            decoded[key] = base64.b64decode(fields[key], validate=True)
        except binascii.Error:
            raise ValueError(f"SCRAM credential text: {key} is not base64") from None
    return ScramCredential(salt=decoded["salt"], stored_key=decoded["stored_key"],
                           server_key=decoded["server_key"], iterations=int(fields["iterations"]))


# --- Messages (ScramMessages), parsed by hand: the fields never contain a comma, so a split
# on commas and a check of each field is Kafka's regular expression, in linear time.

_PRINTABLE = re.compile(r"[\x21-\x2b\x2d-\x7e]+")  # Kafka's PRINTABLE: \x21-\x7E but ','
_ALPHA = re.compile(r"[A-Za-z]+")
_VALUE = re.compile(r"[\x01-\x2b\x2d-\x7f]+")  # Kafka's VALUE: \x01-\x7F but ','
_BASE64 = re.compile(r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{3}=|[A-Za-z0-9+/]{2}==)?")


@dataclass(frozen=True, slots=True)
class ClientFirstMessage:
    gs2_header: str
    authorization_id: str  # unescaped; "" when absent
    username: str  # unescaped
    nonce: str
    extensions: dict[str, str]
    bare: str  # client-first-message-bare as sent, for the AuthMessage

    @property
    def token_authenticated(self) -> bool:
        # ScramExtensions.tokenAuthenticated: Boolean.parseBoolean, i.e. "true" in any case.
        return self.extensions.get("tokenauth", "").lower() == "true"


@dataclass(frozen=True, slots=True)
class ClientFinalMessage:
    channel_binding: bytes
    nonce: str
    proof: bytes = field(repr=False)
    without_proof: str  # client-final-message-without-proof as sent, for the AuthMessage


def parse_client_first(auth_bytes: bytes) -> ClientFirstMessage:
    text = _ascii(auth_bytes, "client first")
    parts = text.split(",")
    if len(parts) < 4 or parts[0] != "n":
        raise SaslFailure("invalid SCRAM client first message: gs2 header must be 'n,[a=...],'")
    authorization_id = ""
    if parts[1]:
        decoded = decode_saslname(parts[1][2:]) if parts[1].startswith("a=") else None
        if decoded is None:
            raise SaslFailure("invalid SCRAM client first message: bad authzid")
        authorization_id = decoded
    if parts[2].startswith("m="):
        raise SaslFailure("invalid SCRAM client first message: reserved 'm' attribute")
    username = decode_saslname(parts[2][2:]) if parts[2].startswith("n=") else None
    if username is None:
        raise SaslFailure("invalid SCRAM client first message: bad user name")
    nonce = parts[3][2:]
    if not parts[3].startswith("r=") or _PRINTABLE.fullmatch(nonce) is None:
        raise SaslFailure("invalid SCRAM client first message: bad nonce")
    extensions = _extensions(parts[4:], "client first")
    gs2_header = f"n,{parts[1]},"
    return ClientFirstMessage(gs2_header, authorization_id, username, nonce, extensions,
                              text[len(gs2_header):])


def parse_client_final(auth_bytes: bytes) -> ClientFinalMessage:
    text = _ascii(auth_bytes, "client final")
    parts = text.split(",")
    if len(parts) < 3:
        raise SaslFailure("invalid SCRAM client final message: too few fields")
    channel = _base64_field(parts[0], "c", "client final")
    nonce = parts[1][2:]
    if not parts[1].startswith("r=") or _PRINTABLE.fullmatch(nonce) is None:
        raise SaslFailure("invalid SCRAM client final message: bad nonce")
    _extensions(parts[2:-1], "client final")
    proof = _base64_field(parts[-1], "p", "client final")
    return ClientFinalMessage(channel, nonce, proof, text[:len(text) - len(parts[-1]) - 1])


def server_first_message(nonce: str, salt: bytes, iterations: int) -> bytes:
    return f"r={nonce},s={_b64(salt)},i={iterations}".encode("ascii")


def server_final_message(server_signature: bytes) -> bytes:
    return f"v={_b64(server_signature)}".encode("ascii")


def _ascii(auth_bytes: bytes, name: str) -> str:
    # Every class in Kafka's grammar is within \x01-\x7F.
    try:
        text = auth_bytes.decode("ascii")
    except UnicodeDecodeError:
        raise SaslFailure(f"invalid SCRAM {name} message: not ASCII") from None
    if "\x00" in text:
        raise SaslFailure(f"invalid SCRAM {name} message: NUL byte")
    return text


def _extensions(parts: list[str], name: str) -> dict[str, str]:
    extensions: dict[str, str] = {}
    for part in parts:
        key, sep, value = part.partition("=")
        if not sep or _ALPHA.fullmatch(key) is None or _VALUE.fullmatch(value) is None:
            raise SaslFailure(f"invalid SCRAM {name} message: bad extension")
        extensions[key] = value
    return extensions


def _base64_field(part: str, attribute: str, name: str) -> bytes:
    value = part[2:]
    if part[:2] != f"{attribute}=" or _BASE64.fullmatch(value) is None:
        raise SaslFailure(f"invalid SCRAM {name} message: bad '{attribute}'")
    try:
        return base64.b64decode(value, validate=True)
    except binascii.Error:
        raise SaslFailure(f"invalid SCRAM {name} message: bad '{attribute}'") from None


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


# --- The server.

@dataclass(frozen=True, slots=True, eq=False)
class FetchCredential:
    """The driver's question: the stored credential of `username` for `mechanism_name`.

    Answer with `resume(credential)` (None: no such user), or `unavailable()` when the store
    did not answer.
    """

    mechanism_name: str
    username: str
    server: ScramServer = field(repr=False)

    def resume(self, credential: ScramCredential | None) -> Challenge | Failed:
        return self.server._fetched(self, credential)

    def unavailable(self) -> Failed:
        return self.server._unavailable(self)


ScramStep: TypeAlias = Challenge | Authenticated | Failed | FetchCredential


class _State(enum.Enum):
    RECEIVE_CLIENT_FIRST_MESSAGE = "receive client first message"
    FETCH_CREDENTIAL = "fetch credential"
    RECEIVE_CLIENT_FINAL_MESSAGE = "receive client final message"
    COMPLETE = "complete"
    FAILED = "failed"


_AUTHZID_MISMATCH = ("Authentication failed: Client requested an authorization id that is "
                     "different from username")


class ScramServer:
    """One SCRAM exchange, server side (`ScramSaslServer`).

    `fake_salt_key` is the deployment's secret that salts the answer to an unknown user
    (the same on every node, so the same user always gets the same salt); `fake_iterations`
    should be what most stored credentials use. `server_nonce` is for tests that replay a
    published exchange; otherwise 32 random bytes, URL-safe base64.
    """

    def __init__(self, mechanism: ScramMechanism, *, fake_salt_key: bytes,
                 fake_iterations: int = MIN_ITERATIONS, server_nonce: str | None = None) -> None:
        if len(fake_salt_key) < 16:
            raise ValueError("fake_salt_key must hold at least 16 bytes")
        if iterations_error(fake_iterations) is not None:
            raise ValueError(f"fake_iterations must be within {MIN_ITERATIONS}..{MAX_ITERATIONS}")
        if server_nonce is not None and _PRINTABLE.fullmatch(server_nonce) is None:
            raise ValueError("server_nonce must be printable ASCII without ','")
        self.mechanism = mechanism
        self.mechanism_name = mechanism.mechanism_name
        self._fake_salt_key = fake_salt_key
        self._fake_iterations = fake_iterations
        self._server_nonce = server_nonce
        self._state = _State.RECEIVE_CLIENT_FIRST_MESSAGE
        self._pending: FetchCredential | None = None
        self._client_first: ClientFirstMessage | None = None
        self._server_first = ""
        self._nonce = ""
        self._credential: ScramCredential | None = None
        self._known_user = False

    def step(self, auth_bytes: bytes) -> ScramStep:
        try:
            if self._state is _State.RECEIVE_CLIENT_FIRST_MESSAGE:
                return self._receive_client_first(auth_bytes)
            if self._state is _State.RECEIVE_CLIENT_FINAL_MESSAGE:
                return self._receive_client_final(auth_bytes)
            raise SaslFailure(f"unexpected SASL/SCRAM token in state {self._state.value}")
        except SaslFailure as failure:
            return self._fail(Failed.of(failure))

    def _receive_client_first(self, auth_bytes: bytes) -> FetchCredential:
        first = parse_client_first(auth_bytes)
        if first.token_authenticated:
            raise SaslFailure("delegation tokens (tokenauth) are not supported")
        if first.authorization_id and first.authorization_id != first.username:
            raise SaslFailure("authorization id differs from the user", _AUTHZID_MISMATCH)
        self._client_first = first
        self._state = _State.FETCH_CREDENTIAL
        self._pending = FetchCredential(self.mechanism_name, first.username, self)
        return self._pending

    def _fetched(self, need: FetchCredential,
                 credential: ScramCredential | None) -> Challenge | Failed:
        first = self._client_first
        if need is not self._pending or first is None:
            return self._fail(Failed("a credential answered out of turn"))
        self._pending = None
        if credential is None:
            credential = self._fake_credential(first.username)
        elif credential.iterations < MIN_ITERATIONS:
            return self._fail(Failed(f"stored credential has {credential.iterations} iterations, "
                                     f"less than the minimum {MIN_ITERATIONS}"))
        else:
            self._known_user = True
        self._credential = credential
        server_nonce = self._server_nonce or secrets.token_urlsafe(SERVER_NONCE_BYTES)
        self._nonce = first.nonce + server_nonce
        message = server_first_message(self._nonce, credential.salt, credential.iterations)
        self._server_first = message.decode("ascii")
        self._state = _State.RECEIVE_CLIENT_FINAL_MESSAGE
        return Challenge(message)

    def _unavailable(self, need: FetchCredential) -> Failed:
        if need is not self._pending:
            return self._fail(Failed("a credential answered out of turn"))
        return self._fail(Failed("credentials could not be obtained"))

    def _receive_client_final(self, auth_bytes: bytes) -> Authenticated:
        first, credential = self._client_first, self._credential
        if first is None or credential is None:  # unreachable in this state; keeps mypy honest
            raise SaslFailure("SCRAM state lost")
        final = parse_client_final(auth_bytes)
        if final.channel_binding != first.gs2_header.encode("ascii"):
            raise SaslFailure("channel binding does not match the gs2 header")
        if final.nonce != self._nonce:
            raise SaslFailure("Invalid client nonce in the final client message.")
        if len(final.proof) != self.mechanism.digest_size:
            raise SaslFailure("client proof has the wrong length")
        auth_message = f"{first.bare},{self._server_first},{final.without_proof}".encode("ascii")
        m = self.mechanism
        client_signature = m.hmac(credential.stored_key, auth_message)
        client_key = bytes(a ^ b for a, b in zip(client_signature, final.proof, strict=True))
        proof_valid = hmac.compare_digest(m.hash(client_key), credential.stored_key)
        if not self._known_user:
            raise SaslFailure("unknown user")
        if not proof_valid:
            raise SaslFailure("invalid client credentials")
        server_signature = m.hmac(credential.server_key, auth_message)
        self._state = _State.COMPLETE
        self._clear()
        return Authenticated(first.username, server_final_message(server_signature))

    def _fake_credential(self, username: str) -> ScramCredential:
        # Salt and iterations look like a stored credential's; the keys are random, so no
        # proof can match (and the user is refused after the check anyway).
        salt = hmac.digest(self._fake_salt_key,
                           f"{self.mechanism_name}\x00{username}".encode(), "sha256")
        size = self.mechanism.digest_size
        return ScramCredential(salt=salt, stored_key=secrets.token_bytes(size),
                               server_key=secrets.token_bytes(size),
                               iterations=self._fake_iterations)

    def _fail(self, failed: Failed) -> Failed:
        self._state = _State.FAILED
        self._clear()
        return failed

    def _clear(self) -> None:
        self._pending = None
        self._credential = None
        self._client_first = None
