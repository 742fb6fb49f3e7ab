"""SASL/OAUTHBEARER (RFC 7628) server: the client's initial response and the error answer.

Read at apache/kafka 1eb7644: `OAuthBearerClientInitialResponse` (parsing) and
`OAuthBearerSaslServer` (the exchange):

    n,[a=authzid],^Aauth=Bearer <token>^A[key=value^A...]^A          (^A = %x01)

As Kafka: the gs2 header `n` only; the authzid a saslname; key/value pairs with keys
`[A-Za-z]+` and values `[\\x21-\\x7E \\t\\r\\n]+` (the last of a repeated key wins); `auth`
required and taken out of the extensions; `auth` is `<scheme> <token>` with the scheme
`bearer` in any case and the token `[-_~+/.A-Za-z0-9]+=*` (RFC 6750's b64token). Whether the
token is good is the driver's question (`ValidateToken`). A rejected token is answered with
Kafka's JSON (`{"status":"invalid_token"}`, then `, "scope":...`, `, "openid-configuration":
...`) as a challenge; the client acknowledges it with `%x01` and the exchange fails with that
JSON as the message for the client. Success answers empty bytes; the token's expiry becomes
the credential's expiry (KIP-368). An authzid must name the token's principal.

Where Kiln differs, on purpose:
- after the error challenge anything but `%x01` fails (RFC 7628: the client must send it);
  Kafka starts over and takes it as a new initial response;
- the authzid is compared after unescaping `=2C`/`=3D` (Kafka compares it escaped);
- extensions go to the token validator with the token; Kafka asks a separate callback.
"""

from __future__ import annotations

import enum
import json
import re
from dataclasses import dataclass, field
from typing import TypeAlias

from wire.sasl.saslname import decode_saslname
from wire.sasl.steps import Authenticated, Challenge, Failed, SaslFailure

MECHANISM_NAME = "OAUTHBEARER"

_SEPARATOR = "\x01"
_KEY = re.compile(r"[A-Za-z]+")
_VALUE = re.compile(r"[\x21-\x7e \t\r\n]+")
# Java's \w without UNICODE_CHARACTER_CLASS is ASCII; the token class has no '=', so the
# trailing '=*' cannot overlap it: linear.
_AUTH = re.compile(r"([A-Za-z0-9_]+) +([-_~+/.A-Za-z0-9]+=*)")
_AUTH_KEY = "auth"
_INVALID = "Invalid OAUTHBEARER client first message"


@dataclass(frozen=True, slots=True)
class ClientInitialResponse:
    authorization_id: str  # unescaped; "" when absent
    token: str = field(repr=False)
    extensions: dict[str, str]


def parse_client_initial_response(auth_bytes: bytes) -> ClientInitialResponse:
    try:
        text = auth_bytes.decode("ascii")  # every class of Kafka's grammar is ASCII
    except UnicodeDecodeError:
        raise SaslFailure(f"{_INVALID}: not ASCII") from None
    if not text.startswith("n,"):
        raise SaslFailure(f"{_INVALID}: gs2 header must be 'n,[a=...],'")
    header_end = text.find(",", 2)
    if header_end < 0:
        raise SaslFailure(f"{_INVALID}: gs2 header must be 'n,[a=...],'")
    authzid_field = text[2:header_end]
    authorization_id = ""
    if authzid_field:
        decoded = (decode_saslname(authzid_field[2:]) if authzid_field.startswith("a=")
                   else None)
        if decoded is None:
            raise SaslFailure(f"{_INVALID}: bad authzid")
        authorization_id = decoded
    body = text[header_end + 1:]
    # body = ^A (key=value ^A)* ^A
    if len(body) < 2 or body[0] != _SEPARATOR or body[-1] != _SEPARATOR:
        raise SaslFailure(f"{_INVALID}: key/value pairs must sit between %x01 separators")
    pairs = body[1:-1]
    properties: dict[str, str] = {}
    if pairs:
        if pairs[-1] != _SEPARATOR:
            raise SaslFailure(f"{_INVALID}: key/value pairs must end with %x01")
        for pair in pairs[:-1].split(_SEPARATOR):
            key, sep, value = pair.partition("=")
            if not sep or _KEY.fullmatch(key) is None or _VALUE.fullmatch(value) is None:
                raise SaslFailure(f"{_INVALID}: bad key/value pair")
            properties[key] = value
    auth = properties.pop(_AUTH_KEY, None)
    if auth is None:
        raise SaslFailure(f"{_INVALID}: 'auth' not specified")
    match = _AUTH.fullmatch(auth)
    if match is None:
        raise SaslFailure(f"{_INVALID}: invalid 'auth' format")
    if match.group(1).lower() != "bearer":
        raise SaslFailure(f"{_INVALID}: scheme is not Bearer")
    return ClientInitialResponse(authorization_id, match.group(2), properties)


@dataclass(frozen=True, slots=True)
class TokenAccepted:
    """A valid token: its principal's name and expiry (`OAuthBearerToken.principalName`,
    `lifetimeMs`: epoch milliseconds)."""

    principal_name: str
    expires_at_ms: int


@dataclass(frozen=True, slots=True)
class TokenRejected:
    """Why a token was refused (`OAuthBearerValidatorCallback.error(status, scope,
    openid-configuration)`, RFC 7628 §3.2.2)."""

    status: str = "invalid_token"
    scope: str | None = None
    openid_configuration: str | None = None


def error_challenge(rejected: TokenRejected) -> bytes:
    """`OAuthBearerSaslServer.jsonErrorResponse`, field for field (values JSON-escaped, which
    changes nothing for the plain strings Kafka sends)."""
    text = f'{{"status":{json.dumps(rejected.status)}'
    if rejected.scope is not None:
        text += f', "scope":{json.dumps(rejected.scope)}'
    if rejected.openid_configuration is not None:
        text += f', "openid-configuration":{json.dumps(rejected.openid_configuration)}'
    return (text + "}").encode("utf-8")


@dataclass(frozen=True, slots=True, eq=False)
class ValidateToken:
    """The driver's question: is `token` valid, and whose is it?

    Answer with `resume(TokenAccepted | TokenRejected)`, or `unavailable()` when it could not
    be checked.
    """

    token: str = field(repr=False)
    extensions: dict[str, str]
    server: OAuthBearerServer = field(repr=False)

    def resume(self, verdict: TokenAccepted | TokenRejected) -> Challenge | Authenticated | Failed:
        return self.server._validated(self, verdict)

    def unavailable(self) -> Failed:
        return self.server._unavailable(self)


OAuthBearerStep: TypeAlias = Challenge | Authenticated | Failed | ValidateToken


class _State(enum.Enum):
    RECEIVE_INITIAL_RESPONSE = "receive initial response"
    VALIDATE_TOKEN = "validate token"
    RECEIVE_ERROR_ACK = "receive error acknowledgement"
    COMPLETE = "complete"
    FAILED = "failed"


class OAuthBearerServer:
    """One OAUTHBEARER exchange (`OAuthBearerSaslServer`)."""

    mechanism_name = MECHANISM_NAME

    def __init__(self) -> None:
        self._state = _State.RECEIVE_INITIAL_RESPONSE
        self._pending: ValidateToken | None = None
        self._authorization_id = ""
        self._error_json = ""

    def step(self, auth_bytes: bytes) -> OAuthBearerStep:
        if self._state is _State.RECEIVE_ERROR_ACK:
            if auth_bytes != _SEPARATOR.encode():
                return self._fail(Failed("expected %x01 after the error challenge"))
            return self._fail(Failed("token rejected", self._error_json))
        if self._state is not _State.RECEIVE_INITIAL_RESPONSE:
            return self._fail(Failed(
                f"unexpected SASL/OAUTHBEARER token in state {self._state.value}"))
        try:
            response = parse_client_initial_response(auth_bytes)
        except SaslFailure as failure:
            return self._fail(Failed.of(failure))
        self._authorization_id = response.authorization_id
        self._state = _State.VALIDATE_TOKEN
        self._pending = ValidateToken(response.token, response.extensions, self)
        return self._pending

    def _validated(self, need: ValidateToken,
                   verdict: TokenAccepted | TokenRejected) -> Challenge | Authenticated | Failed:
        if need is not self._pending:
            return self._fail(Failed("a token verdict answered out of turn"))
        self._pending = None
        if isinstance(verdict, TokenRejected):
            challenge = error_challenge(verdict)
            self._error_json = challenge.decode("utf-8")
            self._state = _State.RECEIVE_ERROR_ACK
            return Challenge(challenge)
        authzid = self._authorization_id
        if authzid and authzid != verdict.principal_name:
            message = ("Authentication failed: Client requested an authorization id "
                       f"({authzid}) that is different from the token's principal name "
                       f"({verdict.principal_name})")
            return self._fail(Failed("authorization id differs from the token's principal",
                                     message))
        self._state = _State.COMPLETE
        return Authenticated(verdict.principal_name, b"", verdict.expires_at_ms)

    def _unavailable(self, need: ValidateToken) -> Failed:
        if need is not self._pending:
            return self._fail(Failed("a token verdict answered out of turn"))
        return self._fail(Failed(
            "Authentication could not be performed due to an internal error on the server"))

    def _fail(self, failed: Failed) -> Failed:
        self._state = _State.FAILED
        self._pending = None
        return failed
