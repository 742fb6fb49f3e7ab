"""What read-through costs: rebuilding hardened Kafka batches in Kiln offsets, and reading a
partition back through ColdReader.

1. Re-encode (no I/O): N records of V bytes hardened as the hardener writes them (batches of
   up to 1 MB uncompressed with a `kiln.offset` header each, compressed with the codec),
   then rebuilt by `to_kiln_offsets()` into uncompressed batches in Kiln offsets. Baselines:
   decoding the same batches (aiokafka's C reader, headers read) and, to show what serving
   compressed would add, compressing the rebuilt batches again at level 1.
2. Read back (skip with --no-broker): the same records written to a fresh topic by
   HardenedPartitionWriter, then read from Kiln offset 0 to the end with ColdReader.read()
   in 1 MiB reads, as a consumer catching up would. One broker per run (`--broker
   kafka|tansu`, see bench/brokers.py, or a running one with `--bootstrap`).

    python -m bench.read_through                      # 1,000,000 records, every codec
    python -m bench.read_through --broker tansu
    python -m bench.read_through --records 200000 --codecs none,lz4 --no-broker

Prints JSON, then a table (on stderr).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

from bench.brokers import add_broker_option
from bench.harden_write import CODECS, broker, client_batches, fresh_topic, values
from storage.hardened_batches import iter_hardened_batches, to_kiln_offsets
from storage.hardened_store import HardenedPartitionWriter
from storage.model import TopicPartition
from storage.read_through import ColdReader
from wire.batch import CODEC_NONE, HEADER_SIZE, with_base_offset
from wire.lineage import kiln_offset_of
from wire.records import compress, records_of


@dataclass(frozen=True, slots=True)
class Result:
    broker: str | None
    codec: str
    records: int
    hardened_batches: int
    hardened_mb: float
    rebuilt_mb: float
    decode_records_per_s: int
    rebuild_records_per_s: int
    rebuild_cpu_us_per_record: float
    recompress_extra_us_per_record: float
    read_back_records_per_s: int | None
    read_back_cpu_us_per_record: float | None


def hardened_record_sets(vals: list[bytes], codec: int) -> list[bytes]:
    """Batches as Kafka returns them after the hardener wrote the records."""
    sources = [(b.base_offset, b.data) for b in client_batches(vals, 1000, codec)]
    built = iter_hardened_batches(sources, 0, producer_id=-1, producer_epoch=-1,
                                  base_sequence=-1, max_batch_bytes=1_000_000)
    out = []
    kafka_offset = 0
    for batch in built:
        out.append(with_base_offset(batch.data, kafka_offset))
        kafka_offset += batch.record_count
    return out


def best_of(runs: int, work: Callable[[], Any]) -> tuple[float, float]:
    """(wall s, CPU s) of the fastest of `runs` runs."""
    best = (float("inf"), float("inf"))
    for _ in range(runs):
        wall, cpu = time.perf_counter(), time.process_time()
        work()
        best = min(best, (time.perf_counter() - wall, time.process_time() - cpu))
    return best


def decode_all(record_sets: list[bytes]) -> None:
    for data in record_sets:
        for record in records_of(data):
            kiln_offset_of(record.headers)


def rebuild_all(record_sets: list[bytes]) -> list[bytes]:
    return [to_kiln_offsets(data, 0, 1 << 30).data for data in record_sets]


async def read_back(bootstrap: str, vals: list[bytes], codec: int) -> tuple[float, float]:
    """(wall s, CPU s) to read the records back from Kiln offset 0 with ColdReader."""
    async with fresh_topic(bootstrap, "read") as (client, topic):
        writer = HardenedPartitionWriter(client, topic, 0)
        await writer.recover()
        batches = client_batches(vals, 1000, codec)
        for start in range(0, len(batches), 100):
            await writer.write(batches[start:start + 100], skip_below=0)
        reader = ColdReader(client)
        tp = TopicPartition(topic, 0)
        offset: int | None = 0
        wall, cpu = time.perf_counter(), time.process_time()
        while offset is not None and offset < len(vals):
            offset = (await reader.read(tp, offset, 1 << 20)).next_offset
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        if offset != len(vals):
            raise SystemExit(f"read back stopped at {offset}, expected {len(vals)}")
        return wall, cpu


@contextmanager
def optional_broker(args: argparse.Namespace) -> Iterator[tuple[str, str] | None]:
    """broker() (`--bootstrap` or a local `--broker`), or None with `--no-broker`."""
    if args.no_broker:
        yield None
        return
    with broker(args) as target:
        yield target


def measure(codec: str, vals: list[bytes], args: argparse.Namespace,
            target: tuple[str, str] | None) -> Result:
    record_sets = hardened_record_sets(vals, CODECS[codec])
    n = len(vals)
    decode_s, _ = best_of(args.runs, lambda: decode_all(record_sets))
    rebuild_s, rebuild_cpu = best_of(args.runs, lambda: rebuild_all(record_sets))
    rebuilt = rebuild_all(record_sets)
    code = CODECS[codec]
    recompress_s, _ = (0.0, 0.0) if code == CODEC_NONE else best_of(
        args.runs, lambda: [compress(code, r[HEADER_SIZE:]) for r in rebuilt])
    read_s: float | None = None
    read_cpu: float | None = None
    if target is not None:
        read_s, read_cpu = asyncio.run(read_back(target[0], vals, CODECS[codec]))
    return Result(
        None if target is None else target[1], codec, n, len(record_sets),
        round(sum(map(len, record_sets)) / 1e6, 1),
        round(sum(map(len, rebuilt)) / 1e6, 1), round(n / decode_s), round(n / rebuild_s),
        round(rebuild_cpu / n * 1e6, 3),
        round(recompress_s / n * 1e6, 3),
        None if read_s is None else round(n / read_s),
        None if read_cpu is None else round(read_cpu / n * 1e6, 3),
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--codecs", default=",".join(CODECS))
    parser.add_argument("--runs", type=int, default=3, help="re-encode runs; the best counts")
    add_broker_option(parser)
    parser.add_argument("--bootstrap", help="a running broker for the read-back part")
    parser.add_argument("--no-broker", action="store_true", help="re-encode only")
    args = parser.parse_args(argv)
    vals = values(args.records, args.value_bytes)
    with optional_broker(args) as target:
        results = [measure(codec.strip(), vals, args, target)
                   for codec in args.codecs.split(",")]
    print(json.dumps([asdict(r) for r in results], indent=2))
    print(f"\nbroker for the read back: {results[0].broker if results else '-'}",
          file=sys.stderr)
    print(f"{'codec':7} {'in MB':>6} {'out MB':>6} {'decode rec/s':>13} {'rebuild rec/s':>14}"
          f" {'µs/rec':>7} {'+recompress µs':>15} {'read-back rec/s':>16}", file=sys.stderr)
    for r in results:
        read = "-" if r.read_back_records_per_s is None else f"{r.read_back_records_per_s:,}"
        print(f"{r.codec:7} {r.hardened_mb:>6.1f} {r.rebuilt_mb:>6.1f}"
              f" {r.decode_records_per_s:>13,} {r.rebuild_records_per_s:>14,}"
              f" {r.rebuild_cpu_us_per_record:>7.2f} {r.recompress_extra_us_per_record:>15.2f}"
              f" {read:>16}", file=sys.stderr)


if __name__ == "__main__":
    main()
