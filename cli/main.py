"""The `kiln` command."""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path
from typing import Any

import click

from cli import dev_instance, logs
from cli.admin import settings_from
from cli.app import KilnApp, StartupError
from cli.delay import delay
from cli.flush import drain, flush
from cli.inspect import inspect
from cli.nodes import nodes
from cli.process_memory import return_large_buffers_to_the_system
from cli.settings import Settings, dev_state_file
from cli.status import status
from cli.subscriptions import subscriptions
from cli.topics import topics
from cli.transactions import transactions
from cli.users import users
from cli.workers import command_flags, default_workers, supervise, worker_commands
from storage.errors import StorageError

log = logging.getLogger(__name__)

_SERVE_OPTIONS = [
    click.option("--listen", help="HOST:PORT Kafka clients connect to [KILN_LISTEN]"),
    click.option("--listeners", help="the Kafka listeners as NAME://HOST:PORT,..., each "
                 "PLAINTEXT or SSL, instead of --listen [KILN_LISTENERS]"),
    click.option("--advertised-listeners", help="NAME://HOST:PORT,...: the addresses given to "
                 "clients of each listener [KILN_ADVERTISED_LISTENERS]"),
    click.option("--ssl-certificate-file", help="an SSL listener's certificate chain (PEM) "
                 "[KILN_SSL_CERTIFICATE_FILE]"),
    click.option("--ssl-key-file", help="an SSL listener's private key (PEM) [KILN_SSL_KEY_FILE]"),
    click.option("--ssl-ca-file", help="CAs (PEM) client certificates are checked against "
                 "[KILN_SSL_CA_FILE]"),
    click.option("--ssl-client-auth", type=click.Choice(["none", "requested", "required"]),
                 help="ask SSL clients for a certificate [KILN_SSL_CLIENT_AUTH]"),
    click.option("--advertise", help="HOST:PORT given to clients in Metadata [KILN_ADVERTISE]"),
    click.option("--http-listen", help="HOST:PORT of /metrics, /healthz and /readyz; \"\" "
                 "turns them off; auto (default): 127.0.0.1, the Kafka port + 552 "
                 "[KILN_HTTP_LISTEN]"),
    click.option("--node-id", type=int, help="this node's id, unique among live nodes; -1 "
                 "(default): the one this address had, else the lowest free [KILN_NODE_ID]"),
    click.option("--node-heartbeat-ms", type=int,
                 help="how often the node renews its registration [KILN_NODE_HEARTBEAT_MS]"),
    click.option("--node-session-timeout-ms", type=int,
                 help="a node not heard from this long is dead to the others "
                 "[KILN_NODE_SESSION_TIMEOUT_MS]"),
    click.option("--workers", type=int,
                 help="node processes to run on this machine, on consecutive ports from "
                 "--listen's; 0 (default): one per core [KILN_WORKERS]"),
    click.option("--redis-url", help="Redis holding the log queue [KILN_REDIS_URL]"),
    click.option("--kafka-bootstrap", help="HOST:PORT of the Kafka that survivors are hardened "
                 "to [KILN_KAFKA_BOOTSTRAP]"),
    click.option("--delay-policy", type=click.Choice(["adaptive", "fixed"]),
                 help="adaptive: computed from live signals (default); fixed: "
                 "--harden-delay-ms always [KILN_DELAY_POLICY]"),
    click.option("--harden-delay-ms", type=int,
                 help="the fixed delay; for the adaptive policy, the wait before any "
                 "delivery was timed [KILN_HARDEN_DELAY_MS]"),
    click.option("--min-delay-ms", type=int, help="adaptive delay floor [KILN_MIN_DELAY_MS]"),
    click.option("--max-delay-ms", type=int, help="adaptive delay ceiling [KILN_MAX_DELAY_MS]"),
    click.option("--risk-budget-bytes", type=int,
                 help="bytes acknowledged but not yet hardened that the adaptive delay keeps "
                 "within [KILN_RISK_BUDGET_BYTES]"),
    click.option("--risk-budget-records", type=int,
                 help="the same, in records [KILN_RISK_BUDGET_RECORDS]"),
    click.option("--config", "config_file", type=click.Path(path_type=Path, dir_okay=False),
                 help="TOML configuration file"),
    click.option("--log-json", is_flag=True, default=None, help="log one JSON object per line"),
]


def serve_options(func: Any) -> Any:
    for option in reversed(_SERVE_OPTIONS):
        func = option(func)
    return func




@click.group()
@click.version_option(package_name="kiln")
def main() -> None:
    """Kiln: a Kafka-compatible write-behind proxy (Redis in front, Kafka behind)."""


main.add_command(subscriptions)
main.add_command(status)
main.add_command(nodes)
main.add_command(topics)
main.add_command(delay)
main.add_command(flush)
main.add_command(drain)
main.add_command(inspect)
main.add_command(transactions)
main.add_command(users)


@main.command()
@serve_options
def serve(config_file: Path | None, **flags: Any) -> None:
    """Run the proxy against an existing Redis and Kafka."""
    settings = settings_from(config_file, **flags)
    logs.configure(settings.log_level, settings.log_json)
    _run(settings, {**flags, "config_file": config_file})


@main.command()
@serve_options
@click.option("--broker", type=click.Choice(["kafka", "tansu"]), default="kafka",
              show_default=True,
              help="the local broker: Apache Kafka (KRaft, from the jars scripts/setup.sh "
                   "resolves; starts in about 5 s) or tansu (starts at once, memory only)")
def dev(config_file: Path | None, broker: str, **flags: Any) -> None:
    """Start a local Redis and a local broker, then Kiln in front of them.

    While it runs, every other `kiln` command on this machine uses its Redis and broker
    unless told otherwise. Ctrl-C hardens what is buffered and stops all three."""
    from cli.local_kafka import LocalKafka
    from cli.local_services import ChildService, LocalRedis, LocalTansu, ServiceError

    settings = settings_from(config_file, **flags)
    logs.configure(settings.log_level, settings.log_json)
    redis = LocalRedis()
    local: LocalKafka | LocalTansu = LocalKafka() if broker == "kafka" else LocalTansu()
    services: list[ChildService] = [redis, local]
    try:
        for service in services:
            service.start()
    except ServiceError as exc:
        for service in services:
            service.stop()
        raise click.ClickException(f"cannot start local services: {exc}") from exc
    state = dev_state_file()
    shared = {"redis_url": redis.url, "kafka_bootstrap": local.bootstrap}
    click.echo(f"redis  {redis.url}\nkafka  {local.bootstrap} ({broker})\n"
               f"kiln   {settings.listener}  (point your Kafka clients here; Ctrl-C stops all)")
    if state is not None:
        dev_instance.announce(state, shared)
        click.echo(f"other kiln commands use this instance while it runs ({state})")
    try:
        values = {**flags, **shared}
        _run(settings_from(config_file, **values), {**values, "config_file": config_file})
    finally:
        if state is not None:
            dev_instance.withdraw(state)
        for service in reversed(services):
            service.stop()


def _run(settings: Settings, flags: dict[str, Any]) -> None:
    """Serve in this process, or supervise `settings.workers` node processes (each given
    `flags`, `kiln serve`'s own, and its own port)."""
    workers = settings.workers or default_workers()
    if workers > 1:
        commands = worker_commands(settings, command_flags(serve, flags), workers)
        raise SystemExit(supervise(commands))
    return_large_buffers_to_the_system()
    try:
        asyncio.run(_serve(settings))
    except (StartupError, StorageError) as exc:
        raise click.ClickException(str(exc)) from exc
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {settings.listener}: {exc}") from exc


async def _serve(settings: Settings) -> None:
    app = KilnApp(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    interrupts = 0

    def on_signal(signum: int) -> None:
        nonlocal interrupts
        interrupts += 1
        if interrupts > 1 and signum == signal.SIGINT:
            log.warning("second interrupt: exiting without hardening")
            raise SystemExit(130)
        log.info("%s: planned shutdown, hardening buffered records",
                 signal.Signals(signum).name)
        stop.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        await app.start()
    except BaseException:  # a port taken, a store unreachable: stop what did start
        await app.close()
        raise
    delay = (f"fixed {settings.harden_delay_ms} ms" if settings.delay_policy == "fixed" else
             f"adaptive {settings.min_delay_ms}..{settings.max_delay_ms} ms")
    log.info("Kiln ready: redis=%s kafka=%s delay=%s", settings.shown_redis_url,
             settings.kafka_bootstrap, delay)
    watcher = asyncio.create_task(app.watch_drain_requests(stop), name="kiln-drain-watch")
    try:
        await stop.wait()
        await app.drain()
    finally:
        watcher.cancel()
        await app.close()
