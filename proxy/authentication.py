"""SASL authentication of a connection on a SASL_PLAINTEXT or SASL_SSL listener, as Kafka's
SaslServerAuthenticator does it (docs/security-design.md §2.1, §4.1).

Before authentication a connection may send only ApiVersions, SaslHandshake (v1: the
mechanism; an unknown or disabled one is answered UNSUPPORTED_SASL_MECHANISM with the
enabled list, then the connection closes) and SaslAuthenticate (the mechanism's tokens). Any
other request closes the connection unanswered, its body unread; frames above
`max_preauth_frame_bytes` are refused from their size prefix; the whole exchange must end
within `authentication_timeout_s`. A failed exchange is answered
SASL_AUTHENTICATION_FAILED with a message that does not tell whether the user exists, and
the connection closes after `failed_delay_s` (Kafka's
connection.failed.authentication.delay.ms).

The mechanisms are wire/sasl's I/O-free machines; what they need (a stored SCRAM
credential, a PLAIN password checked) is asked of `Credentials`, which the storage side
implements (storage/security/credentials.py).
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from typing import Protocol

from storage.errors import StorageError
from wire.apis import ApiKey, Message, Request
from wire.errors import ErrorCode
from wire.sasl.exchange import Mechanism, Step, client_error_message, new_mechanism
from wire.sasl.plain import CheckPassword
from wire.sasl.scram import FetchCredential, ScramCredential
from wire.sasl.steps import Authenticated, Challenge, Failed

log = logging.getLogger(__name__)

# Before authentication, in every state: ApiVersions (the API list, for the handshake).
_PREAUTH_APIS = frozenset({ApiKey.API_VERSIONS, ApiKey.SASL_HANDSHAKE, ApiKey.SASL_AUTHENTICATE})


class Credentials(Protocol):
    """What logins need from storage; raises StorageError when it cannot answer."""

    async def get(self, mechanism: str, user: str) -> ScramCredential | None:
        """`user`'s stored credential for a SCRAM mechanism, None for none."""

    async def check_password(self, user: str, password: str) -> bool:
        """Whether `password` is `user`'s (PLAIN)."""

    async def fake_salt_key(self) -> bytes:
        """The key SCRAM answers unknown users with, the same on every node."""


@dataclass(frozen=True, slots=True)
class SaslSettings:
    mechanisms: tuple[str, ...]  # as SaslHandshake names them, enabled on the listener
    credentials: Credentials
    authentication_timeout_s: float = 10.0
    max_preauth_frame_bytes: int = 524_288
    failed_delay_s: float = 0.1


class Verdict(enum.Enum):
    GO_ON = enum.auto()  # answer, read the next request
    AUTHENTICATED = enum.auto()  # answer; the connection is now authenticated
    FAILED = enum.auto()  # answer, then close after the failed-authentication delay


class _State(enum.Enum):
    HANDSHAKE = enum.auto()
    AUTHENTICATE = enum.auto()
    COMPLETE = enum.auto()


@dataclass(slots=True)
class SaslGate:
    """One connection's authentication."""

    settings: SaslSettings
    principal: str | None = None  # "User:<name>" once authenticated
    _state: _State = _State.HANDSHAKE
    _mechanism: Mechanism | None = None
    _mechanism_name: str = ""

    @property
    def authenticated(self) -> bool:
        return self._state is _State.COMPLETE

    def admits(self, api_key: int) -> bool:
        """Whether a request with this key may be read before authentication."""
        if api_key == ApiKey.SASL_AUTHENTICATE:
            return self._state is _State.AUTHENTICATE
        if api_key == ApiKey.SASL_HANDSHAKE:
            return self._state is _State.HANDSHAKE
        return api_key in _PREAUTH_APIS

    async def handle(self, request: Request, peer: object) -> tuple[Message, Verdict]:
        """Answer a SaslHandshake or SaslAuthenticate the gate admitted."""
        version = request.header.request_api_version
        if request.spec.api_key == ApiKey.SASL_HANDSHAKE:
            return self._handshake(request.body.mechanism, request.spec.response[version])
        response = request.spec.response[version]
        step = await self._step(bytes(request.body.auth_bytes))
        if isinstance(step, Challenge):
            return response(error_code=0, error_message=None, auth_bytes=step.auth_bytes,
                            session_lifetime_ms=0), Verdict.GO_ON
        if isinstance(step, Authenticated):
            self._state = _State.COMPLETE
            self.principal = f"User:{step.principal_name}"
            log.info("%s authenticated as %s (%s)", peer, self.principal,
                     self._mechanism_name)
            return response(error_code=0, error_message=None, auth_bytes=step.auth_bytes,
                            session_lifetime_ms=0), Verdict.AUTHENTICATED
        log.warning("failed authentication from %s (%s): %s", peer, self._mechanism_name,
                    step.reason)
        return response(error_code=int(ErrorCode.SASL_AUTHENTICATION_FAILED),
                        error_message=client_error_message(step, self._mechanism_name),
                        auth_bytes=b"", session_lifetime_ms=0), Verdict.FAILED

    def _handshake(self, mechanism: str, response: type) -> tuple[Message, Verdict]:
        enabled = list(self.settings.mechanisms)
        if mechanism not in enabled:
            log.warning("SASL mechanism %r asked for, not enabled (%s)", mechanism,
                        ", ".join(enabled))
            return (response(error_code=int(ErrorCode.UNSUPPORTED_SASL_MECHANISM),
                             mechanisms=enabled), Verdict.FAILED)
        self._mechanism_name = mechanism
        self._state = _State.AUTHENTICATE
        return response(error_code=0, mechanisms=enabled), Verdict.GO_ON

    async def _step(self, auth_bytes: bytes) -> Challenge | Authenticated | Failed:
        if self._mechanism is None:
            self._mechanism = new_mechanism(
                self._mechanism_name,
                fake_salt_key=await self.settings.credentials.fake_salt_key())
        step: Step = self._mechanism.step(auth_bytes)
        credentials = self.settings.credentials
        # Each need is answered; the mechanism then ends its step.
        while not isinstance(step, Challenge | Authenticated | Failed):
            need = step
            try:
                if isinstance(need, FetchCredential):
                    step = need.resume(await credentials.get(need.mechanism_name,
                                                             need.username))
                elif isinstance(need, CheckPassword):
                    step = need.resume(await credentials.check_password(need.username,
                                                                        need.password))
                else:  # OAUTHBEARER's token check: the mechanism is not enabled yet
                    step = need.unavailable()
            except StorageError as exc:
                log.warning("credentials unavailable: %s", exc)
                step = need.unavailable()
        return step
