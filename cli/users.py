"""`kiln users`: the SASL/SCRAM users Kiln will authenticate (storage/security/credentials.py),
managed straight in Redis like the other operator commands, so the first one exists before
any client can log in. Passwords come from a prompt or a file, never a flag (it would show
in `ps` and in shell history); only names, mechanisms and iteration counts are ever shown."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import click

from cli import output
from cli.admin import connect, settings_from
from cli.settings import Settings
from cli.subscriptions import store_options
from storage.security.credentials import MECHANISMS, CredentialStore
from wire.sasl.scram import (
    MIN_ITERATIONS,
    SCRAM_MECHANISMS,
    derive_credential,
    iterations_error,
)

_COLUMNS = ("user", "mechanism", "iterations")
_MECHANISM = click.Choice(MECHANISMS)


@click.group()
def users() -> None:
    """SASL/SCRAM users (SCRAM-SHA-256, SCRAM-SHA-512), salted in Redis as Kafka stores them."""


@users.command()
@click.argument("name")
@click.option("--mechanism", "mechanisms", type=_MECHANISM, multiple=True,
              help="SCRAM-SHA-256 or SCRAM-SHA-512 (repeat for both; default: both)")
@click.option("--iterations", type=int, default=MIN_ITERATIONS, show_default=True,
              help="PBKDF2 iterations, 4096..16384 as Kafka allows")
@click.option("--password-file", type=click.Path(path_type=Path, dir_okay=False, exists=True),
              help="read the password from this file (its first line); default: a prompt")
@store_options
def add(name: str, mechanisms: Sequence[str], iterations: int, password_file: Path | None,
        config_file: Path | None, redis_url: str | None) -> None:
    """Add user NAME, or give it a new password: logins use it from the next one on, without
    a restart."""
    if not name:
        raise click.UsageError("the user name is empty")
    problem = iterations_error(iterations)
    if problem is not None:
        raise click.UsageError(f"--iterations: {problem}")
    password = _password(password_file)
    settings = settings_from(config_file, redis_url=redis_url)
    chosen = tuple(mechanisms) or MECHANISMS
    asyncio.run(_add(settings, name, chosen, password, iterations))
    click.echo(f"user {name}: {', '.join(chosen)} ({iterations} iterations)")


@users.command()
@click.argument("name")
@click.option("--mechanism", "mechanisms", type=_MECHANISM, multiple=True,
              help="remove only this mechanism's credential (repeatable; default: all)")
@store_options
def remove(name: str, mechanisms: Sequence[str], config_file: Path | None,
           redis_url: str | None) -> None:
    """Remove user NAME's credentials: its next login fails."""
    settings = settings_from(config_file, redis_url=redis_url)
    removed = asyncio.run(_remove(settings, name, tuple(mechanisms) or MECHANISMS))
    if not removed:
        raise click.ClickException(f"user {name} has no such credential")
    click.echo(f"user {name}: removed {', '.join(removed)}")


@users.command("list")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
@store_options
def list_(as_json: bool, config_file: Path | None, redis_url: str | None) -> None:
    """Every user's mechanisms and iteration counts (never salts or keys)."""
    settings = settings_from(config_file, redis_url=redis_url)
    output.emit(asyncio.run(_rows(settings)), _COLUMNS, as_json=as_json, empty="no users")


def _password(password_file: Path | None) -> str:
    if password_file is None:
        password = str(click.prompt("password", hide_input=True,
                                    confirmation_prompt=True))
    else:
        lines = password_file.read_text().splitlines()
        password = lines[0] if lines else ""
    if not password:
        raise click.UsageError("the password is empty")
    return password


async def _add(settings: Settings, name: str, mechanisms: Sequence[str], password: str,
               iterations: int) -> None:
    async with connect(settings) as stores:
        credentials = CredentialStore(stores.queue.redis)
        for mechanism in mechanisms:
            # PBKDF2 takes milliseconds: off the event loop, though nothing else runs here.
            credential = await asyncio.to_thread(
                derive_credential, SCRAM_MECHANISMS[mechanism], password, iterations)
            await credentials.put(name, mechanism, credential)


async def _remove(settings: Settings, name: str, mechanisms: Sequence[str]) -> list[str]:
    async with connect(settings) as stores:
        return await CredentialStore(stores.queue.redis).remove(name, mechanisms)


async def _rows(settings: Settings) -> list[dict[str, object]]:
    async with connect(settings) as stores:
        found = await CredentialStore(stores.queue.redis).users()
    return [{"user": c.user, "mechanism": c.mechanism, "iterations": c.iterations}
            for c in found]
