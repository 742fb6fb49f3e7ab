"""`kiln inspect TOPIC PARTITION`: the records the log queue holds, decoded, read from the
deployment's Redis (batches as the producers sent them, opened with the protocol layer's
record decoder)."""

from __future__ import annotations

import asyncio
import base64
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from cli import output
from cli.admin import connect, settings_from
from cli.settings import Settings
from cli.subscriptions import store_options
from storage.clock import wall_clock_ms
from storage.model import StoredBatch, TopicPartition
from wire.batch import (
    CODEC_GZIP,
    CODEC_LZ4,
    CODEC_NONE,
    CODEC_SNAPPY,
    CODEC_ZSTD,
    NO_PRODUCER_ID,
    TIMESTAMP_TYPE_BIT,
    read_header,
)
from wire.errors import KafkaError
from wire.records import decode_records

_COLUMNS = ("offset", "timestamp", "age_s", "key", "value", "headers", "producer",
            "compression", "level")
_CODECS = {CODEC_NONE: "none", CODEC_GZIP: "gzip", CODEC_SNAPPY: "snappy", CODEC_LZ4: "lz4",
           CODEC_ZSTD: "zstd"}
_READ_BYTES = 1 << 20
_KEY_WIDTH = 16
_VALUE_WIDTH = 32
_HEADERS_WIDTH = 24


@dataclass(frozen=True, slots=True)
class Buffered:
    """What a partition's log queue holds: offsets first..next-1 (none when equal)."""

    first: int
    next: int

    def describe(self) -> str:
        if self.first == self.next:
            return f"nothing is buffered (next offset {self.next})"
        return f"the log queue holds offsets {self.first}-{self.next - 1}"


@click.command()
@click.argument("topic")
@click.argument("partition", type=int)
@click.option("--from", "from_offset", type=int,
              help="first offset to show [default: the oldest buffered]")
@click.option("--limit", type=click.IntRange(min=1), default=20, show_default=True,
              help="records to show at most")
@click.option("--json", "as_json", is_flag=True,
              help="print JSON (keys, values and header values as utf-8 or base64)")
@store_options
def inspect(topic: str, partition: int, from_offset: int | None, limit: int, as_json: bool,
            config_file: Path | None, redis_url: str | None) -> None:
    """Decoded records buffered in the log queue of TOPIC's PARTITION: offset, timestamp,
    key, value, headers, producer id/epoch/sequence, compression and reliability level."""
    settings = settings_from(config_file, redis_url=redis_url)
    try:
        rows, buffered = asyncio.run(_read(settings, TopicPartition(topic, partition),
                                           from_offset, limit))
    except KafkaError as exc:  # a batch that does not decode, or Redis failing mid-way
        raise click.ClickException(exc.message) from exc
    if as_json:
        output.emit(rows, _COLUMNS, as_json=True)
        return
    output.emit([_table_row(row) for row in rows], _COLUMNS, as_json=False,
                empty=f"{topic}/{partition}: {buffered.describe()}")
    if rows:
        click.echo(f"{topic}/{partition}: showing offsets {rows[0]['offset']}-"
                   f"{rows[-1]['offset']}; {buffered.describe()}")


async def _read(settings: Settings, tp: TopicPartition, from_offset: int | None, limit: int
                ) -> tuple[list[dict[str, Any]], Buffered]:
    async with connect(settings) as stores:
        config = await stores.topics.get(tp.topic)
        if config is None:
            raise click.ClickException(f"unknown topic {tp.topic!r}")
        if not 0 <= tp.partition < config.partitions:
            raise click.ClickException(f"topic {tp.topic} has partitions 0-"
                                       f"{config.partitions - 1}, not {tp.partition}")
        state = await stores.queue.state(tp)
        buffered = Buffered(await stores.queue.start_offset(tp), state.next_offset)
        offset = buffered.first if from_offset is None else from_offset
        if from_offset is not None and not buffered.first <= offset < buffered.next:
            raise click.ClickException(f"offset {offset} is not buffered in {tp.topic}/"
                                       f"{tp.partition}: {buffered.describe()}")
        now = wall_clock_ms()
        rows: list[dict[str, Any]] = []
        while len(rows) < limit and offset < buffered.next:
            batches = (await stores.queue.read_from(tp, offset, _READ_BYTES)).batches
            if not batches:
                break  # hardened or delivered meanwhile
            rows += _records(batches, offset, now)[:limit - len(rows)]
            offset = batches[-1].next_offset
    return rows, buffered


def _records(batches: Sequence[StoredBatch], from_offset: int, now_ms: int
             ) -> list[dict[str, Any]]:
    """Every record of the batches at or above `from_offset`, in Kiln offsets."""
    rows = []
    for batch in batches:
        header = read_header(batch.data)
        producer = header.producer_id != NO_PRODUCER_ID
        for record in decode_records(batch.data):
            delta = record.offset - header.base_offset
            offset = batch.base_offset + delta
            if offset < from_offset:
                continue
            rows.append({
                "offset": offset,
                "timestamp": record.timestamp,
                "timestamp_type": ("log_append" if header.attributes & TIMESTAMP_TYPE_BIT
                                   else "create"),
                "appended_ms": batch.append_time_ms,
                "age_s": round((now_ms - batch.append_time_ms) / 1000, 1),
                "key": _encoded(record.key),
                "value": _encoded(record.value),
                "headers": [{"key": key, "value": _encoded(value)}
                            for key, value in record.headers],
                "producer_id": header.producer_id,
                "producer_epoch": header.producer_epoch,
                "sequence": ((header.base_sequence + delta) & 0x7FFFFFFF) if producer else None,
                "compression": _CODECS.get(header.compression, str(header.compression)),
                "level": batch.reliability.name.lower(),
                "batch_offset": batch.base_offset,
            })
    return rows


def _encoded(data: bytes | None) -> dict[str, Any] | None:
    """Bytes for JSON: as text when they are UTF-8, else base64; None stays null."""
    if data is None:
        return None
    try:
        return {"encoding": "utf-8", "data": data.decode("utf-8"), "size": len(data)}
    except UnicodeDecodeError:
        return {"encoding": "base64", "data": base64.b64encode(data).decode("ascii"),
                "size": len(data)}


def _table_row(row: dict[str, Any]) -> dict[str, Any]:
    headers = ",".join(f"{h['key']}={_preview(h['value'], _HEADERS_WIDTH)}"
                       for h in row["headers"])
    producer = (None if row["sequence"] is None
                else f"{row['producer_id']}/{row['producer_epoch']}/{row['sequence']}")
    return {
        **row,
        "timestamp": datetime.fromtimestamp(row["timestamp"] / 1000, UTC).strftime(
            "%Y-%m-%d %H:%M:%S.%f")[:-3],
        "key": _preview(row["key"], _KEY_WIDTH),
        "value": _preview(row["value"], _VALUE_WIDTH),
        "headers": _cut(headers, _HEADERS_WIDTH * 2) or None,
        "producer": producer,
    }


def _preview(encoded: dict[str, Any] | None, width: int) -> str | None:
    """Printable text for a table cell: bytes that are not UTF-8 and characters that are
    not printable appear as escapes (\\xff), and long values are cut."""
    if encoded is None:
        return None
    if encoded["encoding"] == "utf-8":
        raw = encoded["data"].encode("utf-8")
    else:
        raw = base64.b64decode(encoded["data"])
    text = raw.replace(b"\\", b"\\\\").decode("utf-8", "backslashreplace")
    pieces = [piece if piece.isprintable() else piece.encode("unicode_escape").decode("ascii")
              # an escape made here stays whole when the text is cut
              for piece in re.findall(r"\\\\|\\x[0-9a-f]{2}|.", text, re.DOTALL)]
    if sum(map(len, pieces)) <= width:
        return "".join(pieces)
    shown = ""
    for piece in pieces:
        if len(shown) + len(piece) > width - 1:
            break
        shown += piece
    return shown + "…"


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"
