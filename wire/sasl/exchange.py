"""One interface over the SASL mechanisms Kiln serves, and the text a failure shows.

A driver (the connection's authentication, later) makes a mechanism with `new_mechanism`,
feeds it each SaslAuthenticate `auth_bytes` with `step`, and answers the needs it gets back
(`CheckPassword`, `FetchCredential`, `ValidateToken`) with their `resume`, doing the I/O
itself; `Challenge` goes to the client, `Authenticated` and `Failed` end the exchange. No step
raises: malformed input of any kind becomes `Failed`.

`Verifier` and `resolve` answer the needs synchronously, for tests, fuzzing and any caller
whose checks do not block.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, TypeAlias

from wire.sasl import oauthbearer, plain, scram
from wire.sasl.oauthbearer import (
    OAuthBearerServer,
    TokenAccepted,
    TokenRejected,
    ValidateToken,
)
from wire.sasl.plain import CheckPassword, PlainServer
from wire.sasl.scram import (
    MIN_ITERATIONS,
    SCRAM_MECHANISMS,
    FetchCredential,
    ScramCredential,
    ScramServer,
)
from wire.sasl.steps import Authenticated, Challenge, Failed

Need: TypeAlias = CheckPassword | FetchCredential | ValidateToken
Outcome: TypeAlias = Challenge | Authenticated | Failed
Step: TypeAlias = Outcome | Need

MECHANISM_NAMES = (plain.MECHANISM_NAME, scram.SCRAM_SHA_256.mechanism_name,
                   scram.SCRAM_SHA_512.mechanism_name, oauthbearer.MECHANISM_NAME)


class Mechanism(Protocol):
    @property
    def mechanism_name(self) -> str: ...

    def step(self, auth_bytes: bytes) -> Step: ...


def new_mechanism(name: str, *, fake_salt_key: bytes,
                  fake_iterations: int = MIN_ITERATIONS) -> Mechanism:
    """A fresh server for one exchange of mechanism `name` (one of `MECHANISM_NAMES`, as
    SaslHandshake spells it; anything else raises `ValueError`: the handshake answers
    UNSUPPORTED_SASL_MECHANISM before this is called). The `fake_*` arguments are SCRAM's
    answer to unknown users (`scram.ScramServer`)."""
    if name == plain.MECHANISM_NAME:
        return PlainServer()
    if name == oauthbearer.MECHANISM_NAME:
        return OAuthBearerServer()
    mechanism = SCRAM_MECHANISMS.get(name)
    if mechanism is None:
        raise ValueError(f"unsupported SASL mechanism {name!r}")
    return ScramServer(mechanism, fake_salt_key=fake_salt_key, fake_iterations=fake_iterations)


def client_error_message(failed: Failed, mechanism_name: str, *,
                         reauthenticating: bool = False) -> str:
    """SaslAuthenticate's `error_message` for a failure: the mechanism's own text where Kafka
    sends one, else `SaslServerAuthenticator`'s generic text, which says nothing of the user."""
    if failed.client_message is not None:
        return failed.client_message
    stage = "re-authentication" if reauthenticating else "authentication"
    return (f"Authentication failed during {stage} due to invalid credentials with SASL "
            f"mechanism {mechanism_name}")


class Verifier(Protocol):
    """The three questions mechanisms ask, answered without blocking."""

    def check_password(self, username: str, password: str) -> bool: ...

    def scram_credential(self, mechanism_name: str, username: str) -> ScramCredential | None: ...

    def validate_token(self, token: str,
                       extensions: Mapping[str, str]) -> TokenAccepted | TokenRejected: ...


def resolve(step: Step, verifier: Verifier) -> Outcome:
    """Answer `step`'s need, if it has one, with `verifier`: the step's outcome. (A resumed
    need never asks again: its `resume` returns an outcome, by type.)"""
    if isinstance(step, CheckPassword):
        return step.resume(verifier.check_password(step.username, step.password))
    if isinstance(step, FetchCredential):
        return step.resume(verifier.scram_credential(step.mechanism_name, step.username))
    if isinstance(step, ValidateToken):
        return step.resume(verifier.validate_token(step.token, step.extensions))
    return step
