"""How fast HardenedPartitionWriter.write() puts stored client batches into Kafka.

For each codec: N records of V bytes in client batches of B records (built as aiokafka's
producer would), written through write() in chunks, against a broker, twice:

- forwarded: Kiln offsets from 0 on a fresh topic, so Kafka offsets equal Kiln offsets and
  client batches go whole, header rewritten (what a topic without delivered records gets);
- headers: the same batches at Kiln offsets from 10^9, so every record is re-encoded with a
  `kiln.offset` header (what a partition gets once delivered records were dropped);

then the same records sent with aiokafka's create_batch()/send_batch() (acks=all, not
idempotent: aiokafka cannot get a producer id from tansu) as a yardstick. Every measurement
writes to a fresh topic on one broker per run (`--broker kafka|tansu`, see bench/brokers.py,
or a running one with `--bootstrap`). Prints JSON, then a table.

    python -m bench.harden_write                       # Apache Kafka, every codec
    python -m bench.harden_write --broker tansu
    python -m bench.harden_write --bootstrap HOST:PORT --records 2000000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import asdict, dataclass
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.record._crecords import DefaultRecordBatchBuilder

from bench.brokers import add_broker_option, start_broker
from storage.hardened_store import HardenedPartitionWriter
from storage.kafka.client import KafkaClient
from storage.model import Reliability, StoredBatch
from wire.batch import CODEC_GZIP, CODEC_LZ4, CODEC_NONE, CODEC_SNAPPY, CODEC_ZSTD

CODECS = {"none": CODEC_NONE, "gzip": CODEC_GZIP, "snappy": CODEC_SNAPPY, "lz4": CODEC_LZ4,
          "zstd": CODEC_ZSTD}


@dataclass(frozen=True, slots=True)
class KilnRun:
    seconds: float
    records_per_s: float
    cpu_us_per_record: float
    bytes_out: int
    batches_out: int


@dataclass(frozen=True, slots=True)
class Result:
    broker: str
    codec: str
    records: int
    forwarded: KilnRun
    headers: KilnRun
    aiokafka_seconds: float
    aiokafka_records_per_s: float
    forwarded_to_aiokafka: float
    headers_to_aiokafka: float
    forwarded_to_headers: float


def values(count: int, size: int, seed: int = 7) -> list[bytes]:
    """Text-like values: compressible, but not trivially."""
    rng = random.Random(seed)
    words = [rng.randbytes(4).hex().encode() for _ in range(2000)]
    pool = []
    for _ in range(4096):
        value = b" ".join(rng.choice(words) for _ in range(size // 8 + 1))
        pool.append(value[:size])
    return [pool[i % len(pool)] for i in range(count)]


def client_batches(vals: list[bytes], per_batch: int, codec: int, kiln_start: int = 0
                   ) -> list[StoredBatch]:
    now = int(time.time() * 1000)
    out = []
    for start in range(0, len(vals), per_batch):
        builder: Any = DefaultRecordBatchBuilder(2, codec, 0, -1, -1, -1, 1 << 30)
        chunk = vals[start:start + per_batch]
        for i, value in enumerate(chunk):
            builder.append(i, now, None, value, [])
        out.append(StoredBatch(kiln_start + start, len(chunk), now,
                               Reliability.RELIABLE_PERSISTENT,
                               bytes(builder.build())))
    return out


@asynccontextmanager
async def fresh_topic(bootstrap: str, kind: str) -> AsyncIterator[tuple[KafkaClient, str]]:
    """A started client and a new one-partition topic `bench-{kind}-…`; closes the client."""
    topic = f"bench-{kind}-{uuid.uuid4().hex[:8]}"
    client = KafkaClient(bootstrap, client_id="kiln-bench")
    await client.start()
    try:
        await client.create_topic(topic, 1)
        yield client, topic
    finally:
        await client.close()


async def run_kiln(bootstrap: str, batches: list[StoredBatch], per_write: int) -> KilnRun:
    """Writes the batches to a fresh topic; checks the high watermark."""
    async with fresh_topic(bootstrap, "kiln") as (client, topic):
        writer = HardenedPartitionWriter(client, topic, 0)
        await writer.recover()
        written = out_batches = 0
        wall, cpu = time.perf_counter(), time.process_time()
        for start in range(0, len(batches), per_write):
            result = await writer.write(batches[start:start + per_write], skip_below=0)
            written += result.bytes
            out_batches += result.batches
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        expected = batches[-1].next_offset - batches[0].base_offset
        high_watermark = await client.high_watermark(topic, 0)
        if high_watermark != expected:
            raise SystemExit(f"high watermark {high_watermark}, expected {expected}")
        return KilnRun(round(wall, 3), round(expected / wall), round(cpu / expected * 1e6, 3),
                       written, out_batches)


async def run_aiokafka(bootstrap: str, vals: list[bytes], per_batch: int, codec: str) -> float:
    async with fresh_topic(bootstrap, "aiokafka") as (client, topic):
        producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap, acks="all", linger_ms=0,
            compression_type=None if codec == "none" else codec,
            max_batch_size=2_000_000, max_request_size=4_000_000,
        )
        await producer.start()
        try:
            now = int(time.time() * 1000)
            wall = time.perf_counter()
            pending = []
            for start in range(0, len(vals), per_batch):
                batch = producer.create_batch()
                for value in vals[start:start + per_batch]:
                    batch.append(key=None, value=value, timestamp=now)
                batch.close()
                pending.append(await producer.send_batch(batch, topic, partition=0))
            await asyncio.gather(*pending)
            wall = time.perf_counter() - wall
            high_watermark = await client.high_watermark(topic, 0)
            if high_watermark != len(vals):
                raise SystemExit(f"aiokafka: high watermark {high_watermark}, "
                                 f"expected {len(vals)}")
            return wall
        finally:
            await producer.stop()


@contextmanager
def broker(args: argparse.Namespace) -> Iterator[tuple[str, str]]:
    """(bootstrap, description) of `--bootstrap`, or of a local broker of `--broker`."""
    if args.bootstrap:
        yield args.bootstrap, args.bootstrap
        return
    with start_broker(args.broker) as local:
        yield local.bootstrap, local.description


def measure(codec: str, args: argparse.Namespace, vals: list[bytes], bootstrap: str,
            description: str) -> Result:
    forwarded = asyncio.run(run_kiln(
        bootstrap, client_batches(vals, args.batch_records, CODECS[codec]),
        args.batches_per_write))
    headers = asyncio.run(run_kiln(
        bootstrap, client_batches(vals, args.batch_records, CODECS[codec], 10**9),
        args.batches_per_write))
    aio_s = asyncio.run(run_aiokafka(bootstrap, vals, args.batch_records, codec))
    n = len(vals)
    return Result(description, codec, n, forwarded, headers, round(aio_s, 3), round(n / aio_s),
                  round(forwarded.records_per_s * aio_s / n, 2),
                  round(headers.records_per_s * aio_s / n, 2),
                  round(forwarded.records_per_s / headers.records_per_s, 2))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    add_broker_option(parser)
    parser.add_argument("--bootstrap", help="a running broker instead of a local one")
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--batch-records", type=int, default=1000)
    parser.add_argument("--batches-per-write", type=int, default=100,
                        help="client batches per write() call (a hardener read)")
    parser.add_argument("--codecs", default=",".join(CODECS))
    args = parser.parse_args(argv)
    vals = values(args.records, args.value_bytes)
    with broker(args) as (bootstrap, description):
        results = [measure(codec.strip(), args, vals, bootstrap, description)
                   for codec in args.codecs.split(",")]
    print(json.dumps([asdict(r) for r in results], indent=2))
    print(f"\nbroker: {results[0].broker if results else '-'}", file=sys.stderr)
    print(f"{'codec':8} {'forwarded rec/s':>16} {'µs CPU/rec':>11} {'headers rec/s':>14}"
          f" {'µs CPU/rec':>11} {'aiokafka rec/s':>15} {'fwd/headers':>12}"
          f" {'fwd/aiokafka':>13}", file=sys.stderr)
    for r in results:
        print(f"{r.codec:8} {r.forwarded.records_per_s:>16,} "
              f"{r.forwarded.cpu_us_per_record:>11.2f} {r.headers.records_per_s:>14,} "
              f"{r.headers.cpu_us_per_record:>11.2f} {r.aiokafka_records_per_s:>15,} "
              f"{r.forwarded_to_headers:>12.2f} {r.forwarded_to_aiokafka:>13.2f}",
              file=sys.stderr)


if __name__ == "__main__":
    main()
