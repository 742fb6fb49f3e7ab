"""What one SASL step ends in, for every mechanism.

A mechanism's `step(auth_bytes)` answers the client (`Challenge`), ends the exchange
(`Authenticated`, `Failed`) or hands its driver a question only I/O can answer: a password
check, a stored SCRAM credential, a token verdict (each mechanism's own need type, resumed
with the answer). Kafka's `SaslServer.evaluateResponse` calls a blocking callback there
instead; Kiln's credentials sit in Redis and PBKDF2 runs off the event loop, so the machine
gives the question back and stays free of I/O.
"""

from __future__ import annotations

from dataclasses import dataclass


class SaslFailure(Exception):
    """A client message that is malformed or breaks the mechanism's rules.

    `client_message` is the text Kafka sends the client for it (where Kafka raises a
    `SaslAuthenticationException`); None where Kafka answers with its generic message (a
    `SaslException`, whose own text may say whether a user exists). The exception's text is
    for Kiln's log: it never holds a password, token or proof.
    """

    def __init__(self, reason: str, client_message: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.client_message = client_message


@dataclass(frozen=True, slots=True)
class Challenge:
    """Bytes for the client (SaslAuthenticate `auth_bytes`, error 0); the exchange goes on."""

    auth_bytes: bytes


@dataclass(frozen=True, slots=True)
class Authenticated:
    """The exchange succeeded.

    `auth_bytes` go to the client with the success (SCRAM's server-final message, else
    empty). `expires_at_ms` is the credential's expiry in epoch milliseconds (an OAUTHBEARER
    token's `exp`; Kafka's `CREDENTIAL_LIFETIME_MS` negotiated property), None when the
    credential does not expire; the session lifetime (KIP-368) is computed from it by the
    caller, who knows the clock.
    """

    principal_name: str
    auth_bytes: bytes = b""
    expires_at_ms: int | None = None


@dataclass(frozen=True, slots=True)
class Failed:
    """The exchange failed: answer SASL_AUTHENTICATION_FAILED (58) and close.

    `reason` is for Kiln's log and names no password, token, proof or user; `client_message`
    as in `SaslFailure` (None: the generic text, `exchange.client_error_message`).
    """

    reason: str
    client_message: str | None = None

    @classmethod
    def of(cls, failure: SaslFailure) -> Failed:
        return cls(failure.reason, failure.client_message)
