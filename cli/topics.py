"""`kiln topics list|create|describe|alter|delete`: Kiln's topics and their policies
(DESIGN §3).

Policies are Kiln's `kiln.*` topic configs; every flag here becomes one of them, so
`with_kiln_configs` (storage/topics.py) is the one place that checks them, for the CLI as for
CreateTopics. Creating, adding partitions and deleting go through the storage Catalog, as
CreateTopics, CreatePartitions and DeleteTopics do: in Kafka first, then in Kiln."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import click

from cli import output
from cli.admin import Stores, connect, settings_from
from cli.settings import Settings
from cli.status import status_rows
from cli.subscriptions import _subscription_rows, store_options
from storage.catalog import Catalog, CatalogSettings, DeletedTopic, forget_topic_state
from storage.errors import StorageError
from storage.groups.store import GroupStore
from storage.kafka.client import KafkaClient
from storage.model import Reliability
from storage.subscriptions import SubscriptionRegistry
from storage.topics import CACHE_TTL_S, HardenPolicy, TopicConfig, kiln_configs, with_kiln_configs
from wire.errors import ErrorCode, KafkaError

_LIST_COLUMNS = ("name", "partitions", "reliability", "max_reliability", "producer_override",
                 "harden", "auto_subscribe", "buffered", "subscriptions")
_PARTITION_COLUMNS = ("partition", "next", "hardened", "delivered", "buffered", "bytes",
                      "oldest_s", "kafka_end")
_SUBSCRIPTION_COLUMNS = ("group", "source", "since", "committed", "lag")

# Flag (and TopicConfig field) -> the `kiln.*` topic config it sets.
_POLICY_CONFIGS = {
    "reliability": "kiln.reliability",
    "max_reliability": "kiln.max.reliability",
    "producer_override": "kiln.producer.override",
    "harden": "kiln.harden",
    "auto_subscribe": "kiln.auto.subscribe",
}
_LEVELS = ", ".join(level.name.lower() for level in Reliability)
_HARDEN = ", ".join(policy.value for policy in HardenPolicy)
_POLICY_OPTIONS = [
    click.option("--reliability", metavar="LEVEL",
                 help=f"level of records whose producer names none: {_LEVELS}"),
    click.option("--max-reliability", metavar="LEVEL",
                 help="the strongest level a producer may ask for"),
    click.option("--producer-override/--no-producer-override", default=None,
                 help="may producers ask for a level (acks=all, kiln.reliability header)"),
    click.option("--harden", metavar="POLICY", help=f"what is written to Kafka: {_HARDEN}"),
    click.option("--auto-subscribe/--no-auto-subscribe", default=None,
                 help="a group's first commit makes it a durable subscription"),
]


def _policy_options(func: Any) -> Any:
    for option in reversed(_POLICY_OPTIONS):
        func = option(func)
    return func


def _kafka_option(func: Any) -> Any:
    return click.option("--kafka-bootstrap",
                        help="Kafka of the Kiln deployment [KILN_KAFKA_BOOTSTRAP]")(func)


@click.group()
def topics() -> None:
    """Kiln's topics: partitions, reliability and hardening policies."""


@topics.command("list")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
@store_options
def list_(as_json: bool, config_file: Path | None, redis_url: str | None) -> None:
    """Every topic with its policies, records buffered and durable subscriptions."""
    settings = settings_from(config_file, redis_url=redis_url)
    rows = asyncio.run(_list_rows(settings))
    output.emit(rows if as_json else [_for_table(row) for row in rows], _LIST_COLUMNS,
                as_json=as_json, empty="no topics")


@topics.command()
@click.argument("name")
@click.option("--partitions", type=int, help="partition count, in Kiln and Kafka "
              "[default: default_partitions, else Kafka's num.partitions]")
@_policy_options
@click.option("--topic-config", "-c", "topic_configs", multiple=True, metavar="KEY=VALUE",
              help="a topic config for Kafka (e.g. retention.ms=86400000); kiln.* ones set "
                   "Kiln's policy; repeatable")
@click.option("--if-not-exists", is_flag=True, help="a topic that exists already is no error")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
@store_options
@_kafka_option
def create(name: str, partitions: int | None, topic_configs: tuple[str, ...],
           if_not_exists: bool, as_json: bool, config_file: Path | None,
           redis_url: str | None, kafka_bootstrap: str | None, **policies: Any) -> None:
    """Create topic NAME in Kafka and in Kiln.

    Both get the same partition count; Kafka gets the topic configs that are not Kiln's."""
    settings = settings_from(config_file, redis_url=redis_url, kafka_bootstrap=kafka_bootstrap)
    configs = _merge(_parse_topic_configs(topic_configs), _policy_configs(policies))
    try:
        created = asyncio.run(_create(settings, name, partitions, configs))
    except KafkaError as exc:
        if if_not_exists and exc.error_code is ErrorCode.TOPIC_ALREADY_EXISTS:
            click.echo(f"topic {name} already exists; left unchanged")
            return
        raise click.ClickException(exc.message) from exc
    if not as_json:
        click.echo(f"created topic {name} with {created.partitions} partition(s) in Kafka "
                   "and Kiln")
    _emit_one(_topic_row(created), as_json)


@topics.command()
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
@store_options
@_kafka_option
def describe(name: str, as_json: bool, config_file: Path | None, redis_url: str | None,
             kafka_bootstrap: str | None) -> None:
    """Policies, partitions and subscriptions of topic NAME.

    Per partition: next, hardened and delivered offsets, records and bytes buffered, age
    of the oldest, and the end offset of the Kafka partition."""
    settings = settings_from(config_file, redis_url=redis_url, kafka_bootstrap=kafka_bootstrap)
    described = asyncio.run(_describe(settings, name))
    if as_json:
        click.echo(json.dumps(described, indent=2, sort_keys=True))
        return
    for key in ("name", "topic_id", *_LIST_COLUMNS[1:7]):
        click.echo(f"{key + ':':<19}{_text(described[key])}")
    click.echo(f"{'kafka:':<19}{_kafka_text(described['kafka'])}")
    click.echo()
    output.emit(described["partition_states"], _PARTITION_COLUMNS, as_json=False)
    click.echo()
    output.emit(described["durable_subscriptions"], _SUBSCRIPTION_COLUMNS, as_json=False,
                empty="no durable subscriptions")


@topics.command()
@click.argument("name")
@_policy_options
@click.option("--partitions", type=int,
              help="add partitions, up to this count, in Kafka then in Kiln (as "
                   "CreatePartitions: a count can only grow; keyed records of new producers "
                   "may move to other partitions)")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
@store_options
@_kafka_option
def alter(name: str, partitions: int | None, as_json: bool, config_file: Path | None,
          redis_url: str | None, kafka_bootstrap: str | None, **policies: Any) -> None:
    """Change the policies or the partition count of topic NAME.

    Running Kiln processes apply the change within a second."""
    changes = _policy_configs(policies)
    if not changes and partitions is None:
        flags = ", ".join(f"--{flag.replace('_', '-')}" for flag in _POLICY_CONFIGS)
        raise click.UsageError(f"nothing to change: give one or more of {flags}, --partitions")
    settings = settings_from(config_file, redis_url=redis_url, kafka_bootstrap=kafka_bootstrap)
    try:
        before, after = asyncio.run(_alter(settings, name, changes, partitions))
    except KafkaError as exc:
        raise click.ClickException(exc.message) from exc
    if not as_json:
        if before.partitions != after.partitions:
            click.echo(f"partitions: {before.partitions} -> {after.partitions} (in Kafka and "
                       "Kiln)")
        old, new = kiln_configs(before), kiln_configs(after)
        for key in sorted(new):
            if old[key] != new[key]:
                click.echo(f"{key}: {old[key]} -> {new[key]}")
        click.echo(f"running Kiln processes apply it within {CACHE_TTL_S:g} s")
    _emit_one(_topic_row(after), as_json)


@topics.command()
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="print JSON")
@store_options
@_kafka_option
def delete(name: str, as_json: bool, config_file: Path | None, redis_url: str | None,
           kafka_bootstrap: str | None) -> None:
    """Delete topic NAME in Kafka and in Kiln, as DeleteTopics does.

    The records Kiln still buffers for it are dropped (not hardened), and its durable
    subscriptions and the consumer groups' committed offsets of it are forgotten. A topic
    only Kafka has is deleted there."""
    settings = settings_from(config_file, redis_url=redis_url, kafka_bootstrap=kafka_bootstrap)
    try:
        row = asyncio.run(_delete(settings, name))
    except KafkaError as exc:
        if exc.error_code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
            raise click.ClickException(f"unknown topic {name!r}: neither Kiln nor Kafka has "
                                       "it") from exc
        raise click.ClickException(exc.message) from exc
    if as_json:
        click.echo(json.dumps(row, indent=2, sort_keys=True))
        return
    where = " and ".join(side for side, had in (("Kafka", row["in_kafka"]),
                                                 ("Kiln", row["in_kiln"])) if had)
    click.echo(f"deleted topic {name} ({row['partitions']} partition(s)) in {where}")
    click.echo(f"dropped {row['buffered_records']} buffered record(s); forgot "
               f"{len(row['durable_subscriptions'])} durable subscription(s)")


# --- policies and configs ----------------------------------------------------------------


def _policy_configs(policies: Mapping[str, Any]) -> dict[str, str]:
    """The `kiln.*` topic configs the policy flags that were given ask for (unchecked)."""
    configs = {}
    for flag, value in policies.items():
        if value is not None:
            configs[_POLICY_CONFIGS[flag]] = (str(value).lower() if isinstance(value, bool)
                                              else value)
    return configs


def _parse_topic_configs(items: Sequence[str]) -> dict[str, str]:
    configs: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.UsageError(f"--topic-config: expected KEY=VALUE, got {item!r}")
        if key.strip() in configs:
            raise click.UsageError(f"--topic-config: {key.strip()} given twice")
        configs[key.strip()] = value.strip()
    return configs


def _merge(topic_configs: dict[str, str], policies: dict[str, str]) -> dict[str, str]:
    for key, value in policies.items():
        if topic_configs.get(key, value) != value:
            raise click.UsageError(f"{key} given twice, as {topic_configs[key]} and {value}")
    return {**topic_configs, **policies}


# --- work against the deployment ---------------------------------------------------------


@asynccontextmanager
async def _kafka(settings: Settings) -> AsyncIterator[KafkaClient]:
    client = KafkaClient(settings.kafka_bootstrap, client_id="kiln-cli", connect_timeout=5.0,
                         request_timeout=30.0)
    try:
        yield client
    finally:
        await client.close()


def _catalog(settings: Settings, stores: Stores, kafka: KafkaClient) -> Catalog:
    """The deployment's catalog, as a Kiln process has it (a deletion through it forgets
    what it forgets in a Kiln process)."""
    catalog = Catalog(stores.topics, stores.queue, kafka,
                      CatalogSettings(auto_create_topics=False,
                                      default_partitions=settings.default_partitions))
    forget_topic_state(catalog, SubscriptionRegistry(stores.queue.redis),
                       GroupStore(stores.queue.redis))
    return catalog


async def _start_kafka(settings: Settings, kafka: KafkaClient) -> None:
    try:
        await kafka.start()
    except StorageError as exc:
        raise click.ClickException(f"cannot reach Kafka at {settings.kafka_bootstrap}: "
                                   f"{exc.message}") from exc


async def _create(settings: Settings, name: str, partitions: int | None,
                  configs: dict[str, str]) -> TopicConfig:
    async with connect(settings) as stores, _kafka(settings) as kafka:
        catalog = _catalog(settings, stores, kafka)
        # Names, policy values and Kiln's registry first: a typo needs no Kafka.
        catalog.validate_new(name, 1 if partitions is None else partitions, configs)
        if await stores.topics.get(name) is not None:
            raise KafkaError(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists")
        await _start_kafka(settings, kafka)
        return await catalog.create(name, partitions, require_kafka=True, configs=configs)


async def _alter(settings: Settings, name: str, changes: dict[str, str],
                 partitions: int | None) -> tuple[TopicConfig, TopicConfig]:
    async with connect(settings) as stores:
        before = await _known(stores, name)
        with_kiln_configs(before, changes)  # a bad policy stops the partitions too
        if partitions is not None:
            async with _kafka(settings) as kafka:
                await _start_kafka(settings, kafka)
                await _catalog(settings, stores, kafka).add_partitions(name, partitions)
        current = await stores.topics.get(name, fresh=True)
        if current is None:
            raise click.ClickException(f"topic {name!r} was deleted meanwhile")
        after = with_kiln_configs(current, changes)
        if changes:
            await stores.topics.update(after)
        return before, after


async def _delete(settings: Settings, name: str) -> dict[str, Any]:
    async with connect(settings) as stores, _kafka(settings) as kafka:
        buffered = sum(row["buffered"] for row in await status_rows(stores, name))
        subscriptions = sorted((await stores.delivery.subscriptions()).get(name, {}))
        await _start_kafka(settings, kafka)
        deleted = await _catalog(settings, stores, kafka).delete(name)
    return _deleted_row(deleted, buffered, subscriptions)


async def _known(stores: Stores, name: str) -> TopicConfig:
    config = await stores.topics.get(name)
    if config is None:
        raise click.ClickException(f"unknown topic {name!r}")
    return config


async def _list_rows(settings: Settings) -> list[dict[str, Any]]:
    async with connect(settings) as stores:
        configs = await stores.topics.all()
        buffered: dict[str, int] = {}
        for row in await status_rows(stores, None):
            buffered[row["topic"]] = buffered.get(row["topic"], 0) + row["buffered"]
        subscriptions = await stores.delivery.subscriptions()
    return [_topic_row(config, buffered.get(name, 0), len(subscriptions.get(name, {})))
            for name, config in sorted(configs.items())]


async def _describe(settings: Settings, name: str) -> dict[str, Any]:
    async with connect(settings) as stores:
        config = await _known(stores, name)
        partitions = await status_rows(stores, name)
        subscriptions = await _subscription_rows(stores, name)
    kafka = await _kafka_side(settings, name, config.partitions)
    ends = kafka.pop("ends")
    states = [{key: row[key] for key in _PARTITION_COLUMNS if key in row}
              | {"kafka_end": ends.get(row["partition"])} for row in partitions]
    for row in subscriptions:
        del row["topic"]
    return (_topic_row(config, sum(s["buffered"] for s in states), len(subscriptions))
            | {"partition_states": states, "durable_subscriptions": subscriptions,
               "kafka": kafka})


async def _kafka_side(settings: Settings, name: str, partitions: int) -> dict[str, Any]:
    """Kafka's partition count and each partition's end offset; a Kafka that does not answer
    leaves them out rather than failing the command."""
    async with _kafka(settings) as kafka:
        try:
            count = (await kafka.list_topics()).get(name)
            ends = {} if count is None else {
                p: await kafka.high_watermark(name, p) for p in range(min(count, partitions))}
        except StorageError as exc:
            return {"reachable": False, "partitions": None, "error": exc.message, "ends": {}}
    return {"reachable": True, "partitions": count, "error": None, "ends": ends}


# --- output ------------------------------------------------------------------------------


def _topic_row(config: TopicConfig, buffered: int | None = None,
               subscriptions: int | None = None) -> dict[str, Any]:
    return {
        "name": config.name, "topic_id": config.topic_id, "partitions": config.partitions,
        "reliability": config.reliability.name.lower(),
        "max_reliability": config.max_reliability.name.lower(),
        "producer_override": config.producer_override, "harden": config.harden.value,
        "auto_subscribe": config.auto_subscribe, "buffered": buffered,
        "subscriptions": subscriptions,
    }


def _deleted_row(deleted: DeletedTopic, buffered: int, subscriptions: list[str]
                 ) -> dict[str, Any]:
    return {**dataclasses.asdict(deleted), "buffered_records": buffered,
            "durable_subscriptions": subscriptions}


def _emit_one(row: dict[str, Any], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(row, indent=2, sort_keys=True))
    else:
        output.emit([_for_table(row)], _LIST_COLUMNS[:7], as_json=False)


def _kafka_text(kafka: dict[str, Any]) -> str:
    if not kafka["reachable"]:
        return f"unreachable ({kafka['error']})"
    if kafka["partitions"] is None:
        return "no such topic yet (created before Kiln first hardens to it)"
    return f"{kafka['partitions']} partition(s)"


def _for_table(row: dict[str, Any]) -> dict[str, Any]:
    return {key: _text(value) if isinstance(value, bool) else value
            for key, value in row.items()}


def _text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
