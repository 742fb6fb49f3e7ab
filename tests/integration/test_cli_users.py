"""`kiln users`: SCRAM users stored salted in Redis in Kafka's form, a password replaced
for the next login, credentials removed, and nothing secret ever printed."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from storage.redis_pool import connect as redis_connect
from storage.security.credentials import REV_KEY, CredentialStore
from tests.integration.test_cli import run_kiln
from tests.kiln_harness import empty_redis, sync_redis
from wire.sasl.scram import SCRAM_MECHANISMS, ScramCredential, verify_password

pytestmark = pytest.mark.integration

PASSWORD = "correct horse battery staple"


@pytest.fixture(autouse=True)
def _empty(redis_url: str) -> None:
    empty_redis(redis_url)


def users(redis_url: str, *args: str) -> tuple[int, str, str]:
    result = run_kiln("users", *args, "--redis-url", redis_url, timeout=60)
    return result.returncode, result.stdout, result.stderr


def password_file(tmp_path: Path, password: str, name: str = "password") -> str:
    path = tmp_path / name
    path.write_text(password + "\n")
    return str(path)


def stored(redis_url: str, mechanism: str, user: str) -> ScramCredential | None:
    async def read() -> ScramCredential | None:
        redis = redis_connect(redis_url, max_connections=2)
        try:
            return await CredentialStore(redis).get(mechanism, user)
        finally:
            await redis.aclose()
    return asyncio.run(read())


def test_a_user_is_stored_salted_for_both_mechanisms_and_listed_without_secrets(
        redis_url: str, tmp_path: Path) -> None:
    # When an operator adds a user with its password in a file
    code, out, err = users(redis_url, "add", "alice", "--password-file",
                           password_file(tmp_path, PASSWORD))
    # Then both mechanisms hold a credential that checks that password and no other
    assert code == 0, err
    for name, mechanism in SCRAM_MECHANISMS.items():
        credential = stored(redis_url, name, "alice")
        assert credential is not None and credential.iterations == 4096
        assert verify_password(mechanism, credential, PASSWORD)
        assert not verify_password(mechanism, credential, PASSWORD + "!")
    # ... the listing names them, as a table and as JSON, and shows nothing secret
    code, table, _ = users(redis_url, "list")
    code_json, listed, _ = users(redis_url, "list", "--json")
    assert code == code_json == 0
    assert json.loads(listed) == [
        {"user": "alice", "mechanism": "SCRAM-SHA-256", "iterations": 4096},
        {"user": "alice", "mechanism": "SCRAM-SHA-512", "iterations": 4096}]
    assert table.splitlines()[0].split() == ["USER", "MECHANISM", "ITERATIONS"]
    raw = sync_redis(redis_url).hget("kiln:{security}:scram:SCRAM-SHA-256", "alice")
    assert raw is not None and raw.startswith(b"salt=")
    for text in (out, table, listed):
        assert PASSWORD not in text and "salt" not in text and "stored_key" not in text


def test_a_new_password_replaces_the_old_one_for_the_next_login(
        redis_url: str, tmp_path: Path) -> None:
    users(redis_url, "add", "bob", "--mechanism", "SCRAM-SHA-512", "--iterations", "8192",
          "--password-file", password_file(tmp_path, "first"))
    rev = int(sync_redis(redis_url).hget(REV_KEY, "users") or 0)
    # When the operator sets a new password
    code, _, err = users(redis_url, "add", "bob", "--mechanism", "SCRAM-SHA-512",
                         "--password-file", password_file(tmp_path, "second", "new"))
    # Then only the new one checks, the other mechanism was never given, and the change is
    # counted for the nodes to see
    assert code == 0, err
    credential = stored(redis_url, "SCRAM-SHA-512", "bob")
    mechanism = SCRAM_MECHANISMS["SCRAM-SHA-512"]
    assert credential is not None and credential.iterations == 4096
    assert verify_password(mechanism, credential, "second")
    assert not verify_password(mechanism, credential, "first")
    assert stored(redis_url, "SCRAM-SHA-256", "bob") is None
    assert int(sync_redis(redis_url).hget(REV_KEY, "users") or 0) == rev + 1


def test_removing_credentials(redis_url: str, tmp_path: Path) -> None:
    users(redis_url, "add", "carol", "--password-file", password_file(tmp_path, PASSWORD))
    # Removing one mechanism leaves the other
    code, out, _ = users(redis_url, "remove", "carol", "--mechanism", "SCRAM-SHA-256")
    assert code == 0 and "removed SCRAM-SHA-256" in out
    assert [row["mechanism"] for row in json.loads(users(redis_url, "list", "--json")[1])] == [
        "SCRAM-SHA-512"]
    # Removing the rest, then again: nothing is left to remove
    assert users(redis_url, "remove", "carol")[0] == 0
    code, _, err = users(redis_url, "remove", "carol")
    assert code == 1 and "user carol has no such credential" in err
    assert users(redis_url, "list")[1].strip() == "no users"


@pytest.mark.parametrize(("args", "refusal"), [
    (("--iterations", "1000"), "--iterations: Too few iterations"),
    (("--iterations", "20000"), "--iterations: Too many iterations"),
    (("--mechanism", "SCRAM-MD5"), "Invalid value for '--mechanism'"),
])
def test_a_bad_add_is_refused_and_stores_nothing(redis_url: str, tmp_path: Path,
                                                 args: tuple[str, ...], refusal: str) -> None:
    code, _, err = users(redis_url, "add", "dave", *args, "--password-file",
                         password_file(tmp_path, PASSWORD))
    assert code == 2 and refusal in err
    assert users(redis_url, "list", "--json")[1].strip() == "[]"


def test_an_empty_password_is_refused(redis_url: str, tmp_path: Path) -> None:
    code, _, err = users(redis_url, "add", "erin", "--password-file",
                         password_file(tmp_path, ""))
    assert code == 2 and "the password is empty" in err
