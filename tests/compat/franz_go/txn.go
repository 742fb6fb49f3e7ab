package main

// Transactions, for tests/compat/test_franz_go_transactions.py (which reads them with
// consume --isolation committed|uncommitted):
//
//	franz-go txn-produce --brokers B --topic T --txn-id ID --partitions 0,1 --plan commit:a:3,abort:b:3
//	franz-go txn-etl     --brokers B --group G --input I --output O --txn-id ID --ends 0:N0,1:N1 [--max-poll N] [--pause-ms MS]
//	franz-go txn-fence   --brokers B --topic T --txn-id ID --fenced-at end|produce

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

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
func txnProduce(args []string) error {
	fs, brokers := commandFlags("txn-produce")
	topic := fs.String("topic", "", "topic")
	txnID := fs.String("txn-id", "", "transactional id")
	partitions := parsedVar(fs, "partitions", "0", "comma-separated partitions", int32List)
	planText := fs.String("plan", "", "commit|abort:NAME:RECORDS_PER_PARTITION,...")
	if err := parse(fs, args); err != nil {
		return err
	}
	steps, err := parsePlan(*planText)
	if err != nil {
		return err
	}
	log := newRequestLog()
	cl, err := newTxnClient(*brokers, *topic, *txnID, log)
	if err != nil {
		return err
	}
	defer closeClient(cl, log)
	for _, step := range steps {
		if err := runTxnStep(cl, step, *partitions); err != nil {
			return err
		}
	}
	return nil
}

// newTxnClient: a transactional producer of `topic` that names each record's partition.
func newTxnClient(brokers, topic, txnID string, log *requestLog) (*kgo.Client, error) {
	return newClient(brokers, log, kgo.TransactionalID(txnID),
		kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner()))
}

// runTxnStep runs one transaction of txn-produce's plan.
func runTxnStep(cl *kgo.Client, step txnStep, partitions []int32) error {
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
		emitOutcome("delivered", map[string]any{"transaction": step.name,
			"partition": r.Record.Partition, "offset": r.Record.Offset,
			"value": string(r.Record.Value)}, r.Err)
	}
	if err := results.FirstErr(); err != nil {
		return fmt.Errorf("produce %s: %w", step.name, err)
	}
	endErr := cl.EndTransaction(ctx, kgo.TransactionEndTry(step.commit))
	emitOutcome("ended", map[string]any{"transaction": step.name, "commit": step.commit},
		endErr)
	if endErr != nil {
		return fmt.Errorf("end %s: %w", step.name, endErr)
	}
	return nil
}

// txnETL is consume-transform-produce, exactly once, with franz-go's GroupTransactSession:
// as a member of --group it reads --input read_committed, at most --max-poll records per
// transaction, and writes each record to the same partition of --output ("out:" before its
// value, its position in a "src" header), committing the input offsets in the transaction.
// It prints "produced" once a transaction's records are acknowledged, waits --pause-ms
// (a window in which the test may kill it, the transaction open), then "ended"; it stops
// once its committed offsets reached --ends, then leaves the group.
func txnETL(args []string) error {
	fs, brokers := commandFlags("txn-etl")
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
	// A GroupTransactSession builds its client itself.
	s, err := kgo.NewGroupTransactSession(clientOpts(*brokers, log,
		kgo.TransactionalID(*txnID),
		kgo.ConsumerGroup(*groupID),
		kgo.ConsumeTopics(*input),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		// A no-op in franz-go 1.22, which always asks OffsetFetch for stable offsets
		// (KIP-447); kept so the program says what it relies on.
		kgo.RequireStableFetchOffsets(),
		kgo.FetchMaxWait(500*time.Millisecond),
		kgo.SessionTimeout(6*time.Second),
		kgo.RecordPartitioner(kgo.ManualPartitioner()))...)
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
		emitFetchErrors(fetches)
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
		emitOutcome("ended", map[string]any{"records": len(out), "committed": committed}, err)
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
	fs, brokers := commandFlags("txn-fence")
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
	zombie, err := newTxnClient(*brokers, *topic, *txnID, log)
	if err != nil {
		return err
	}
	successor, err := newTxnClient(*brokers, *topic, *txnID, log)
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
		emitOutcome("step", map[string]any{"step": name}, err)
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
