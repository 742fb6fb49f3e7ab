"""SASL/PLAIN (RFC 4616) server: `[authzid] NUL authcid NUL passwd`, UTF-8.

As Kafka's `PlainSaslServer` (apache/kafka 1eb7644): exactly three NUL-separated tokens
(Kafka counts at most four: "expected 3 tokens, got N"), an empty user or password fails, a
non-empty authzid must equal the user, the server answers success with empty bytes. Every
failure is a `SaslAuthenticationException` there, so its text reaches the client; the texts
below are Kafka's.

Where Kiln differs, on purpose:
- bytes that are not UTF-8 fail here; Java decodes them to U+FFFD and checks the result;
- an authzid different from the user fails before the password is checked (Kafka checks the
  password first), so a malformed attempt costs no PBKDF2 run; the client sees Kafka's
  authzid message instead of "Invalid username or password" in that case only.

The password check is the driver's (`CheckPassword`): Kiln checks it against the stored
SCRAM credential (`scram.verify_password`), off the event loop.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TypeAlias

from wire.sasl.steps import Authenticated, Failed, SaslFailure

MECHANISM_NAME = "PLAIN"

_MAX_COUNTED_TOKENS = 4  # PlainSaslServer.extractTokens stops counting at four


@dataclass(frozen=True, slots=True)
class PlainResponse:
    authorization_id: str
    username: str
    password: str = field(repr=False)


def parse_plain(auth_bytes: bytes) -> PlainResponse:
    """The client's one message, or `SaslFailure` with Kafka's message for the client."""
    try:
        text = auth_bytes.decode("utf-8")
    except UnicodeDecodeError:
        raise SaslFailure("Invalid SASL/PLAIN response: not UTF-8",
                          "Invalid SASL/PLAIN response: not UTF-8") from None
    tokens = text.split("\x00", 3)
    if len(tokens) != 3:
        message = ("Invalid SASL/PLAIN response: expected 3 tokens, got "
                   f"{min(len(tokens), _MAX_COUNTED_TOKENS)}")
        raise SaslFailure(message, message)
    authorization_id, username, password = tokens
    if not username:
        message = "Authentication failed: username not specified"
        raise SaslFailure(message, message)
    if not password:
        message = "Authentication failed: password not specified"
        raise SaslFailure(message, message)
    if authorization_id and authorization_id != username:
        message = ("Authentication failed: Client requested an authorization id that is "
                   "different from username")
        raise SaslFailure(message, message)
    return PlainResponse(authorization_id, username, password)


@dataclass(frozen=True, slots=True, eq=False)
class CheckPassword:
    """The driver's question: is `password` the password of `username`?

    Answer with `resume(valid)`, or `unavailable()` when it could not be checked (the store
    did not answer).
    """

    username: str
    password: str = field(repr=False)
    server: PlainServer = field(repr=False)

    def resume(self, valid: bool) -> Authenticated | Failed:
        return self.server._checked(self, valid)

    def unavailable(self) -> Failed:
        return self.server._unavailable(self)


PlainStep: TypeAlias = Authenticated | Failed | CheckPassword


class _State(enum.Enum):
    RECEIVE_RESPONSE = "receive response"
    CHECK_PASSWORD = "check password"
    COMPLETE = "complete"
    FAILED = "failed"


class PlainServer:
    """One PLAIN exchange: one client message, one password check."""

    mechanism_name = MECHANISM_NAME

    def __init__(self) -> None:
        self._state = _State.RECEIVE_RESPONSE
        self._pending: CheckPassword | None = None

    def step(self, auth_bytes: bytes) -> PlainStep:
        if self._state is not _State.RECEIVE_RESPONSE:
            return self._fail(Failed(f"unexpected SASL/PLAIN token in state {self._state.value}"))
        try:
            response = parse_plain(auth_bytes)
        except SaslFailure as failure:
            return self._fail(Failed.of(failure))
        self._state = _State.CHECK_PASSWORD
        self._pending = CheckPassword(response.username, response.password, self)
        return self._pending

    def _checked(self, need: CheckPassword, valid: bool) -> Authenticated | Failed:
        if need is not self._pending:
            return self._fail(Failed("a password check answered out of turn"))
        self._pending = None
        if not valid:
            message = "Authentication failed: Invalid username or password"
            return self._fail(Failed(message, message))
        self._state = _State.COMPLETE
        return Authenticated(need.username)

    def _unavailable(self, need: CheckPassword) -> Failed:
        if need is not self._pending:
            return self._fail(Failed("a password check answered out of turn"))
        self._pending = None
        message = "Authentication failed: credentials for user could not be verified"
        return self._fail(Failed(message, message))

    def _fail(self, failed: Failed) -> Failed:
        self._state = _State.FAILED
        self._pending = None
        return failed
