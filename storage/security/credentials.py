"""SCRAM credentials in Redis, in Kafka's own salted form: what `kiln users` manages and what
a SASL login (PLAIN or SCRAM, docs/security-design.md §4.2) will read, one HGET per login, so
a changed password applies to the next login without a restart.

Layout (one hash tag, so each change is one script in one slot, Redis Cluster-ready):
  kiln:{security}:scram:<MECHANISM>   hash; user -> "salt=…,stored_key=…,server_key=…,
                                      iterations=…" (Kafka's text, ScramCredentialUtils)
  kiln:{security}:rev                 hash; "users" -> a counter bumped with every change,
                                      so nodes can tell their cached view is stale
  kiln:{security}:secret              string; 32 random bytes set once (SET NX): the key
                                      SCRAM's answers to unknown users are derived from, the
                                      same on every node

No password and no key is ever logged or returned by a listing.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

from storage.errors import BufferUnavailable
from storage.redis_pool import REDIS_FAILURES, RedisClient
from wire.sasl.scram import (
    SCRAM_MECHANISMS,
    ScramCredential,
    credential_from_text,
    credential_to_text,
    verify_password,
)

_TAG = "kiln:{security}"
REV_KEY = f"{_TAG}:rev"
SECRET_KEY = f"{_TAG}:secret"
MECHANISMS = tuple(SCRAM_MECHANISMS)  # SCRAM-SHA-256, SCRAM-SHA-512
_CONCURRENT_DERIVATIONS = 2

# KEYS: the mechanism's hash, the rev hash. ARGV: user, credential text ("" removes).
# Returns 1 when something changed.
_CHANGE = """
local changed
if ARGV[2] == '' then
  changed = redis.call('HDEL', KEYS[1], ARGV[1])
else
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  changed = 1
end
if changed == 1 then redis.call('HINCRBY', KEYS[2], 'users', 1) end
return changed
"""


def scram_key(mechanism: str) -> str:
    return f"{_TAG}:scram:{mechanism}"


@dataclass(frozen=True, slots=True)
class UserCredential:
    """What a listing shows of one credential: never its salt or keys."""

    user: str
    mechanism: str
    iterations: int


class UnknownMechanism(ValueError):
    def __init__(self, mechanism: str) -> None:
        super().__init__(f"unknown SCRAM mechanism {mechanism!r}: one of "
                         f"{', '.join(MECHANISMS)}")


class CredentialStore:
    """Redis errors become BufferUnavailable."""

    def __init__(self, redis: RedisClient) -> None:
        self._redis = redis
        self._change = redis.register_script(_CHANGE)
        # PBKDF2 for PLAIN logins runs in threads, at most this many at once: a flood of
        # logins cannot take every core.
        self._derivations = asyncio.Semaphore(_CONCURRENT_DERIVATIONS)

    async def put(self, user: str, mechanism: str, credential: ScramCredential) -> None:
        """Store (or replace) `user`'s credential for `mechanism`."""
        _check(mechanism)
        await self._run(user, mechanism, credential_to_text(credential))

    async def remove(self, user: str, mechanisms: Sequence[str] = MECHANISMS) -> list[str]:
        """Remove `user`'s credentials for `mechanisms`; the mechanisms it had."""
        for mechanism in mechanisms:
            _check(mechanism)
        return [mechanism for mechanism in mechanisms
                if await self._run(user, mechanism, "")]

    async def get(self, mechanism: str, user: str) -> ScramCredential | None:
        """`user`'s credential for `mechanism`, None when it has none (or one that does not
        decode: a login then fails as for an unknown user)."""
        _check(mechanism)
        try:
            raw = await self._redis.hget(scram_key(mechanism), user)
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc
        if raw is None:
            return None
        try:
            return credential_from_text(raw.decode() if isinstance(raw, bytes) else str(raw))
        except ValueError:
            return None

    async def check_password(self, user: str, password: str) -> bool:
        """Whether `password` is `user`'s (a PLAIN login): checked against the user's stored
        SCRAM key, SCRAM-SHA-512's when it has one, else SCRAM-SHA-256's; no password is
        kept in a form that could be replayed."""
        for mechanism in reversed(MECHANISMS):
            credential = await self.get(mechanism, user)
            if credential is not None:
                async with self._derivations:
                    return await asyncio.to_thread(verify_password,
                                                   SCRAM_MECHANISMS[mechanism], credential,
                                                   password)
        return False

    async def users(self) -> list[UserCredential]:
        """Every credential, by user then mechanism."""
        out = []
        for mechanism in MECHANISMS:
            try:
                entries = await self._redis.hgetall(scram_key(mechanism))
            except REDIS_FAILURES as exc:
                raise BufferUnavailable(str(exc)) from exc
            for user, raw in entries.items():
                name = user.decode() if isinstance(user, bytes) else str(user)
                try:
                    text = raw.decode() if isinstance(raw, bytes) else str(raw)
                    iterations = credential_from_text(text).iterations
                except ValueError:
                    iterations = -1  # shown as such: an operator should replace it
                out.append(UserCredential(name, mechanism, iterations))
        return sorted(out, key=lambda c: (c.user, c.mechanism))

    async def fake_salt_key(self) -> bytes:
        """The cluster-wide key SCRAM answers unknown users with (set by the first caller)."""
        try:
            await self._redis.set(SECRET_KEY, secrets.token_bytes(32), nx=True)
            key = await self._redis.get(SECRET_KEY)
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc
        if not isinstance(key, bytes):  # removed between the two calls: unlikely, retry
            return await self.fake_salt_key()
        return key

    async def _run(self, user: str, mechanism: str, text: str) -> bool:
        try:
            return bool(await self._change(keys=[scram_key(mechanism), REV_KEY],
                                           args=[user, text]))
        except REDIS_FAILURES as exc:
            raise BufferUnavailable(str(exc)) from exc


def _check(mechanism: str) -> None:
    if mechanism not in SCRAM_MECHANISMS:
        raise UnknownMechanism(mechanism)
