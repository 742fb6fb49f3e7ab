package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// inputRecord is one line of produce's stdin.
type inputRecord struct {
	Key         *string      `json:"key"`
	Value       *string      `json:"value"`
	Headers     [][2]*string `json:"headers"`
	TimestampMs int64        `json:"timestamp_ms"`
}

func codecOf(name string) (kgo.CompressionCodec, error) {
	switch name {
	case "none":
		return kgo.NoCompression(), nil
	case "gzip":
		return kgo.GzipCompression(), nil
	case "snappy":
		return kgo.SnappyCompression(), nil
	case "lz4":
		return kgo.Lz4Compression(), nil
	case "zstd":
		return kgo.ZstdCompression(), nil
	}
	return kgo.CompressionCodec{}, fmt.Errorf("unknown codec %q", name)
}

func acksOf(name string) (kgo.Acks, error) {
	switch name {
	case "0":
		return kgo.NoAck(), nil
	case "1":
		return kgo.LeaderAck(), nil
	case "all", "-1":
		return kgo.AllISRAcks(), nil
	}
	return kgo.Acks{}, fmt.Errorf("unknown acks %q", name)
}

func readRecords(topic string, partition int) ([]*kgo.Record, error) {
	var records []*kgo.Record
	scanner := bufio.NewScanner(os.Stdin)
	scanner.Buffer(make([]byte, 1<<20), 64<<20)
	for scanner.Scan() {
		var in inputRecord
		if err := json.Unmarshal(scanner.Bytes(), &in); err != nil {
			return nil, fmt.Errorf("record %d: %w", len(records), err)
		}
		key, err := unb64(in.Key)
		if err != nil {
			return nil, err
		}
		value, err := unb64(in.Value)
		if err != nil {
			return nil, err
		}
		r := &kgo.Record{Topic: topic, Key: key, Value: value,
			Timestamp: time.UnixMilli(in.TimestampMs), Partition: int32(partition)}
		for _, h := range in.Headers {
			if h[0] == nil {
				return nil, fmt.Errorf("record %d: a header without a name", len(records))
			}
			hv, err := unb64(h[1])
			if err != nil {
				return nil, err
			}
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: *h[0], Value: hv})
		}
		records = append(records, r)
	}
	return records, scanner.Err()
}

// produce sends stdin's records (JSON lines) and prints one "delivered" event per record,
// with its index in stdin and the partition and offset franz-go was told (acks=0: told
// nothing, the offset is franz-go's own placeholder), or the record's error.
func produce(args []string) error {
	fs, brokers := commandFlags("produce")
	topic := fs.String("topic", "", "topic")
	partition := fs.Int("partition", -1, "partition; -1: franz-go's default partitioner")
	compression := parsedVar(fs, "codec", "none", "none, gzip, snappy, lz4 or zstd", codecOf)
	requiredAcks := parsedVar(fs, "acks", "all", "0, 1 or all", acksOf)
	idempotent := fs.Bool("idempotent", true, "idempotent producer (needs acks=all)")
	lingerMs := fs.Int("linger-ms", 5, "linger")
	batchBytes := fs.Int("batch-bytes", 4096, "batch size limit")
	autoCreate := fs.Bool("auto-create", false,
		"ask for the topic's creation in Metadata (franz-go does not by default)")
	if err := parse(fs, args); err != nil {
		return err
	}
	records, err := readRecords(*topic, *partition)
	if err != nil {
		return err
	}
	opts := []kgo.Opt{
		kgo.ProducerBatchCompression(*compression),
		kgo.RequiredAcks(*requiredAcks),
		kgo.ProducerLinger(time.Duration(*lingerMs) * time.Millisecond),
		// Small batches: several per partition, several in flight.
		kgo.ProducerBatchMaxBytes(int32(*batchBytes)),
		kgo.DefaultProduceTopic(*topic),
	}
	if !*idempotent {
		opts = append(opts, kgo.DisableIdempotentWrite())
	}
	if *autoCreate {
		opts = append(opts, kgo.AllowAutoTopicCreation())
	}
	if *partition >= 0 {
		opts = append(opts, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	}
	log := newRequestLog()
	cl, err := newClient(*brokers, log, opts...)
	if err != nil {
		return err
	}
	defer closeClient(cl, log)

	// The bound on delivery: not RecordDeliveryTimeout, which franz-go counts from each
	// record's timestamp (these are from 2023, so it would fail them all at once).
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	wg.Add(len(records))
	for i, r := range records {
		cl.Produce(ctx, r, func(r *kgo.Record, err error) {
			defer wg.Done()
			emitOutcome("delivered", map[string]any{"index": i, "partition": r.Partition,
				"offset": r.Offset}, err)
		})
	}
	if err := cl.Flush(ctx); err != nil {
		return fmt.Errorf("flush: %w", err)
	}
	wg.Wait()
	return nil
}
