package main

// Transactions, for tests/compat/test_franz_go_transactions.py:
//
//	franz-go txn-produce --brokers B --topic T --txn-id ID --partitions 0,1 --plan commit:a:3,abort:b:3 [--kafka K]
//	franz-go txn-consume --brokers B --topic T --partitions 0,1 --isolation committed|uncommitted --records N
//	franz-go txn-etl     --brokers B --group G --input I --output O --txn-id ID --ends 0:N0,1:N1 [--max-poll N] [--pause-ms MS]
//	franz-go txn-fence   --brokers B --topic T --txn-id ID --fenced-at end|produce

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// txnStep is one transaction of txn-produce's plan: `perPartition` records to each
// partition, then a commit or an abort.
type txnStep struct {
	name         string
	commit       bool
	perPartition int
}

// parsePlan reads "commit:a:3,abort:b:3": end, name, records per partition.
func parsePlan(text string) ([]txnStep, error) {
	var steps []txnStep
	for _, field := range strings.Split(text, ",") {
		parts := strings.Split(field, ":")
		if len(parts) != 3 || (parts[0] != "commit" && parts[0] != "abort") {
			return nil, fmt.Errorf("--plan: %q is not commit|abort:NAME:COUNT", field)
		}
		n, err := strconv.Atoi(parts[2])
		if err != nil {
			return nil, fmt.Errorf("--plan %q: %w", field, err)
		}
		steps = append(steps, txnStep{name: parts[1], commit: parts[0] == "commit", perPartition: n})
	}
	return steps, nil
}

// txnValue names a record of txn-produce: transaction, partition, index in the partition.
func txnValue(name string, partition int32, i int) []byte {
	return []byte(fmt.Sprintf("%s.%d.%d", name, partition, i))
}

// txnProduce runs the plan's transactions one after the other with one transactional
// client, printing each record's "delivered" event and each transaction's "ended" event.
// With --kafka, "ended" also carries the hardened topic's last stable offsets at Kafka,
// listed as soon as EndTransaction returned: what a read_committed reader of Kafka could
// read at that moment.
func txnProduce(args []string) error {
	fs := flag.NewFlagSet("txn-produce", flag.ContinueOnError)
	brokers := fs.String("brokers", "", "bootstrap servers")
	topic := fs.String("topic", "", "topic")
	txnID := fs.String("txn-id", "", "transactional id")
	partitionList := fs.String("partitions", "0", "comma-separated partitions")
	planText := fs.String("plan", "", "commit|abort:NAME:RECORDS_PER_PARTITION,...")
	kafka := fs.String("kafka", "", "Kafka's bootstrap servers, to list its stable offsets")
	if err := parse(fs, args); err != nil {
		return err
	}
	partitions, err := int32List(*partitionList)
	if err != nil {
		return err
	}
	steps, err := parsePlan(*planText)
	if err != nil {
		return err
	}
	var stable func(context.Context) (map[string]int64, error)
	if *kafka != "" {
		// No request log: it is the client under test's, and this one talks to Kafka.
		kcl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(*kafka, ",")...))
		if err != nil {
			return err
		}
		defer kcl.Close()
		stable = func(ctx context.Context) (map[string]int64, error) {
			return kafkaStableOffsets(ctx, kadm.NewClient(kcl), *topic)
		}
	}
	log := newRequestLog()
	cl, err := newClient(*brokers, log, kgo.TransactionalID(*txnID),
		kgo.DefaultProduceTopic(*topic), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		return err
	}
	defer closeClient(cl, log)
	for _, step := range steps {
		if err := runTxnStep(cl, step, partitions, stable); err != nil {
			return err
		}
	}
	return nil
}

// runTxnStep runs one transaction of txn-produce's plan (stable: nil, or Kafka's stable
// offsets of the topic, listed once EndTransaction returned).
func runTxnStep(cl *kgo.Client, step txnStep, partitions []int32,
	stable func(context.Context) (map[string]int64, error)) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := cl.BeginTransaction(); err != nil {
		return fmt.Errorf("begin %s: %w", step.name, err)
	}
	var records []*kgo.Record
	for i := 0; i < step.perPartition; i++ {
		for _, p := range partitions {
			records = append(records, &kgo.Record{Partition: p, Value: txnValue(step.name, p, i)})
		}
	}
	results := cl.ProduceSync(ctx, records...)
	for _, r := range results {
		emit("delivered", map[string]any{"transaction": step.name,
			"partition": r.Record.Partition, "offset": r.Record.Offset,
			"value": string(r.Record.Value), "error": errText(r.Err),
			"error_code": errorCode(r.Err)})
	}
	if err := results.FirstErr(); err != nil {
		return fmt.Errorf("produce %s: %w", step.name, err)
	}
	endErr := cl.EndTransaction(ctx, kgo.TransactionEndTry(step.commit))
	ended := map[string]any{"transaction": step.name, "commit": step.commit,
		"error": errText(endErr), "error_code": errorCode(endErr)}
	if stable != nil && endErr == nil {
		offsets, err := stable(ctx)
		if err != nil {
			return fmt.Errorf("listing Kafka's stable offsets: %w", err)
		}
		ended["kafka_lso"] = offsets
	}
	emit("ended", ended)
	if endErr != nil {
		return fmt.Errorf("end %s: %w", step.name, endErr)
	}
	return nil
}

// kafkaStableOffsets lists a topic's last stable offsets (ListOffsets, read_committed) by
// partition ("0": offset).
func kafkaStableOffsets(ctx context.Context, adm *kadm.Client, topic string) (map[string]int64, error) {
	listed, err := adm.ListCommittedOffsets(ctx, topic)
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for p, o := range listed[topic] {
		if o.Err != nil {
			return nil, fmt.Errorf("partition %d: %w", p, o.Err)
		}
		out[strconv.Itoa(int(p))] = o.Offset
	}
	return out, nil
}

func isolationOf(name string) (kgo.IsolationLevel, error) {
	switch name {
	case "committed":
		return kgo.ReadCommitted(), nil
	case "uncommitted":
		return kgo.ReadUncommitted(), nil
	}
	return kgo.IsolationLevel{}, fmt.Errorf("unknown isolation %q", name)
}

// txnConsume reads partitions from their start, without a group, in an isolation level,
// until --records records were printed ("record" events, as consume's).
func txnConsume(args []string) error {
	fs := flag.NewFlagSet("txn-consume", flag.ContinueOnError)
	brokers := fs.String("brokers", "", "bootstrap servers")
	topic := fs.String("topic", "", "topic")
	partitionList := fs.String("partitions", "0", "comma-separated partitions")
	isolation := fs.String("isolation", "committed", "committed or uncommitted")
	records := fs.Int("records", 0, "stop after this many records")
	timeoutMs := fs.Int("timeout-ms", 30000, "stop after this long")
	if err := parse(fs, args); err != nil {
		return err
	}
	partitions, err := int32List(*partitionList)
	if err != nil {
		return err
	}
	level, err := isolationOf(*isolation)
	if err != nil {
		return err
	}
	offsets := map[int32]kgo.Offset{}
	for _, p := range partitions {
		offsets[p] = kgo.NewOffset().AtStart()
	}
	log := newRequestLog()
	cl, err := newClient(*brokers, log,
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{*topic: offsets}),
		kgo.FetchIsolationLevel(level), kgo.FetchMaxWait(500*time.Millisecond))
	if err != nil {
		return err
	}
	defer closeClient(cl, log)
	read, err := pollUntil(cl, *records, *timeoutMs, nil)
	emit("consumed", map[string]any{"records": read})
	return err
}

// txnETL is consume-transform-produce, exactly once, with franz-go's GroupTransactSession:
// as a member of --group it reads --input read_committed, at most --max-poll records per
// transaction, and writes each record to the same partition of --output ("out:" before its
// value, its position in a "src" header), committing the input offsets in the transaction.
// It prints "produced" once a transaction's records are acknowledged, waits --pause-ms
// (a window in which the test may kill it, the transaction open), then "ended"; it stops
// once its committed offsets reached --ends, then leaves the group.
func txnETL(args []string) error {
	fs := flag.NewFlagSet("txn-etl", flag.ContinueOnError)
	brokers := fs.String("brokers", "", "bootstrap servers")
	groupID := fs.String("group", "", "group id")
	input := fs.String("input", "", "input topic")
	output := fs.String("output", "", "output topic")
	txnID := fs.String("txn-id", "", "transactional id")
	endsText := fs.String("ends", "", "partition:offset,... of the input to stop at")
	maxPoll := fs.Int("max-poll", 10, "records per transaction at most")
	pauseMs := fs.Int("pause-ms", 0, "wait between producing and ending a transaction")
	timeoutMs := fs.Int("timeout-ms", 90000, "fail after this long")
	if err := parse(fs, args); err != nil {
		return err
	}
	ends, err := partitionOffsets(*endsText)
	if err != nil {
		return err
	}
	log := newRequestLog()
	// newClient's options: a GroupTransactSession builds its client itself.
	opts := []kgo.Opt{
		kgo.SeedBrokers(strings.Split(*brokers, ",")...),
		kgo.WithHooks(log),
		kgo.ClientID("kiln-compat-franz-go"),
		kgo.RequestTimeoutOverhead(15 * time.Second),
		kgo.RetryTimeout(20 * time.Second),
		kgo.TransactionalID(*txnID),
		kgo.ConsumerGroup(*groupID),
		kgo.ConsumeTopics(*input),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		// A no-op in franz-go 1.22, which always asks OffsetFetch for stable offsets
		// (KIP-447); kept so the program says what it relies on.
		kgo.RequireStableFetchOffsets(),
		kgo.FetchMaxWait(500 * time.Millisecond),
		kgo.SessionTimeout(6 * time.Second),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
	}
	if os.Getenv("FRANZ_GO_DEBUG") != "" {
		opts = append(opts, kgo.WithLogger(kgo.BasicLogger(os.Stderr, kgo.LogLevelDebug, nil)))
	}
	s, err := kgo.NewGroupTransactSession(opts...)
	if err != nil {
		return err
	}
	defer closeClient(s.Client(), log)

	ctx, cancel := timeoutContext(*timeoutMs)
	defer cancel()
	done := func() bool {
		committed := s.Client().CommittedOffsets()[*input]
		for p, end := range ends {
			if committed[p].Offset < end {
				return false
			}
		}
		return true
	}
	for !done() {
		if ctx.Err() != nil {
			return fmt.Errorf("input offsets %v not committed in time: %v", ends,
				s.Client().CommittedOffsets()[*input])
		}
		pollCtx, pollCancel := context.WithTimeout(ctx, time.Second)
		fetches := s.PollRecords(pollCtx, *maxPoll)
		pollCancel()
		for _, fe := range fetches.Errors() {
			if errors.Is(fe.Err, context.DeadlineExceeded) || errors.Is(fe.Err, context.Canceled) {
				continue
			}
			emit("fetch_error", map[string]any{"topic": fe.Topic, "partition": fe.Partition,
				"error": fe.Err.Error(), "error_code": errorCode(fe.Err)})
		}
		records := fetches.Records()
		if len(records) == 0 {
			continue
		}
		if err := s.Begin(); err != nil {
			return fmt.Errorf("begin: %w", err)
		}
		out := make([]*kgo.Record, 0, len(records))
		inputs := make([][2]int64, 0, len(records))
		for _, r := range records {
			out = append(out, &kgo.Record{Topic: *output, Partition: r.Partition, Key: r.Key,
				Value:   append([]byte("out:"), r.Value...),
				Headers: []kgo.RecordHeader{{Key: "src", Value: []byte(fmt.Sprintf("%d/%d", r.Partition, r.Offset))}}})
			inputs = append(inputs, [2]int64{int64(r.Partition), r.Offset})
		}
		if err := s.ProduceSync(ctx, out...).FirstErr(); err != nil {
			return fmt.Errorf("produce: %w", err)
		}
		emit("produced", map[string]any{"records": len(out), "inputs": inputs})
		time.Sleep(time.Duration(*pauseMs) * time.Millisecond)
		committed, err := s.End(ctx, kgo.TryCommit)
		emit("ended", map[string]any{"records": len(out), "committed": committed,
			"error": errText(err), "error_code": errorCode(err)})
		if err != nil {
			return fmt.Errorf("end: %w", err)
		}
	}
	final := map[string]int64{}
	for p, o := range s.Client().CommittedOffsets()[*input] {
		final[strconv.Itoa(int(p))] = o.Offset
	}
	emit("done", map[string]any{"committed_offsets": final})
	return nil
}

// txnFence: client A opens a transaction (one record to partition 0); client B, with the
// same transactional id, initialises (fencing A) and commits a transaction of its own
// (one record to each of partitions 0 and 1); then A, a zombie, goes on: with
// --fenced-at end it commits at once, with --fenced-at produce it first produces another
// record to partition 0. Every step's outcome is an event ("step": name, "error_code");
// a refusal is a result, not a failure of the run. Last, A does what franz-go documents
// after a failed commit (abort), begins a new transaction and produces in it, if it can.
func txnFence(args []string) error {
	fs := flag.NewFlagSet("txn-fence", flag.ContinueOnError)
	brokers := fs.String("brokers", "", "bootstrap servers")
	topic := fs.String("topic", "", "topic")
	txnID := fs.String("txn-id", "", "transactional id")
	fencedAt := fs.String("fenced-at", "end", "end or produce: the zombie's next step")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *fencedAt != "end" && *fencedAt != "produce" {
		return fmt.Errorf("--fenced-at %q: end or produce", *fencedAt)
	}
	log := newRequestLog()
	newTxnClient := func() (*kgo.Client, error) {
		return newClient(*brokers, log, kgo.TransactionalID(*txnID),
			kgo.DefaultProduceTopic(*topic), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	}
	zombie, err := newTxnClient()
	if err != nil {
		return err
	}
	successor, err := newTxnClient()
	if err != nil {
		zombie.Close()
		return err
	}
	// One request log for both: close both before it is printed.
	defer func() {
		log.closing.Store(true)
		successor.Close()
		closeClient(zombie, log)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	step := func(name string, err error) {
		emit("step", map[string]any{"step": name, "error": errText(err),
			"error_code": errorCode(err)})
	}
	produce := func(cl *kgo.Client, partition int32, value string) error {
		return cl.ProduceSync(ctx, &kgo.Record{Partition: partition, Value: []byte(value)}).FirstErr()
	}

	if err := zombie.BeginTransaction(); err != nil {
		return err
	}
	if err := produce(zombie, 0, "zombie.0"); err != nil {
		return fmt.Errorf("the first client's first record: %w", err)
	}
	step("zombie_produced", nil)
	if err := successor.BeginTransaction(); err != nil {
		return err
	}
	// Its first record makes it initialise (InitProducerId): the fencing.
	err = produce(successor, 0, "successor.0")
	if err == nil {
		err = produce(successor, 1, "successor.1")
	}
	step("successor_produced", err)
	if err != nil {
		return err
	}
	err = successor.EndTransaction(ctx, kgo.TryCommit)
	step("successor_committed", err)
	if err != nil {
		return err
	}
	if *fencedAt == "produce" {
		step("zombie_produce", produce(zombie, 0, "zombie.1"))
	}
	err = zombie.EndTransaction(ctx, kgo.TryCommit)
	step("zombie_commit", err)
	if err != nil {
		// franz-go's documented next step after a failed commit.
		step("zombie_abort", zombie.EndTransaction(ctx, kgo.TryAbort))
	}
	err = zombie.BeginTransaction()
	step("zombie_begin", err)
	if err == nil {
		step("zombie_produce_again", produce(zombie, 1, "zombie.2"))
	}
	return nil
}
