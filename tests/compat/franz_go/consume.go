package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// pollUntil polls until `records` records were printed or the time is up, printing each
// record ("record") and each fetch error ("fetch_error"); after every poll that returned
// records, `afterPoll` runs (a group commits there).
func pollUntil(cl *kgo.Client, records, timeoutMs int, afterPoll func() error) (int, error) {
	ctx, cancel := timeoutContext(timeoutMs)
	defer cancel()
	read := 0
	for read < records {
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			break
		}
		emitFetchErrors(fetches)
		n := 0
		fetches.EachRecord(func(r *kgo.Record) {
			emit("record", recordJSON(r))
			n++
		})
		read += n
		if n > 0 && afterPoll != nil {
			if err := afterPoll(); err != nil {
				return read, err
			}
		}
	}
	return read, nil
}

// emitFetchErrors prints each fetch error ("fetch_error") but a poll's own end (its
// deadline, its cancellation).
func emitFetchErrors(fetches kgo.Fetches) {
	for _, fe := range fetches.Errors() {
		if errors.Is(fe.Err, context.DeadlineExceeded) || errors.Is(fe.Err, context.Canceled) {
			continue
		}
		emitOutcome("fetch_error", map[string]any{"topic": fe.Topic, "partition": fe.Partition},
			fe.Err)
	}
}

// offsetOf reads --from: start, end or an offset.
func offsetOf(text string) (kgo.Offset, error) {
	switch text {
	case "start":
		return kgo.NewOffset().AtStart(), nil
	case "end":
		return kgo.NewOffset().AtEnd(), nil
	}
	at, err := strconv.ParseInt(text, 10, 64)
	if err != nil {
		return kgo.Offset{}, err
	}
	return kgo.NewOffset().At(at), nil
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

// consume reads partitions directly (no group) from an offset, in an isolation level.
func consume(args []string) error {
	fs, brokers := commandFlags("consume")
	topic := fs.String("topic", "", "topic")
	partitions := parsedVar(fs, "partitions", "0", "comma-separated partitions", int32List)
	start := parsedVar(fs, "from", "start", "start, end or an offset", offsetOf)
	level := parsedVar(fs, "isolation", "uncommitted", "committed or uncommitted", isolationOf)
	records := fs.Int("records", 0, "stop after this many records")
	timeoutMs := fs.Int("timeout-ms", 20000, "stop after this long")
	if err := parse(fs, args); err != nil {
		return err
	}
	offsets := map[int32]kgo.Offset{}
	for _, p := range *partitions {
		offsets[p] = *start
	}
	log := newRequestLog()
	cl, err := newClient(*brokers, log,
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{*topic: offsets}),
		kgo.FetchIsolationLevel(*level), kgo.FetchMaxWait(500*time.Millisecond))
	if err != nil {
		return err
	}
	defer closeClient(cl, log)
	read, err := pollUntil(cl, *records, *timeoutMs, nil)
	emit("consumed", map[string]any{"records": read})
	return err
}

// group reads topics as a member of a consumer group, committing what it read after every
// poll (synchronously, so each "committed" event is in the group when it is printed), and
// leaves the group at the end.
func group(args []string) error {
	fs, brokers := commandFlags("group")
	topics := fs.String("topics", "", "comma-separated topics")
	groupID := fs.String("group", "", "group id")
	protocol := fs.String("protocol", "classic",
		"classic (JoinGroup/SyncGroup) or consumer (KIP-848 ConsumerGroupHeartbeat)")
	records := fs.Int("records", 0, "stop after this many records")
	timeoutMs := fs.Int("timeout-ms", 30000, "stop after this long")
	if err := parse(fs, args); err != nil {
		return err
	}
	opts := []kgo.Opt{
		kgo.ConsumerGroup(*groupID),
		kgo.ConsumeTopics(strings.Split(*topics, ",")...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.DisableAutoCommit(),
		kgo.FetchMaxWait(500 * time.Millisecond),
		kgo.SessionTimeout(6 * time.Second),
	}
	switch *protocol {
	case "classic":
	case "consumer":
		// franz-go's opt-in to KIP-848; it needs a range or sticky balancer (the default,
		// cooperative-sticky, is one) and falls back to the classic protocol, silently,
		// when the broker does not offer ConsumerGroupHeartbeat v1+.
		opts = append(opts, kgo.ServerSideBalancer())
	default:
		return fmt.Errorf("unknown protocol %q", *protocol)
	}
	log := newRequestLog()
	cl, err := newClient(*brokers, log, opts...)
	if err != nil {
		return err
	}
	defer closeClient(cl, log)
	commit := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		defer cancel()
		commitErr := cl.CommitUncommittedOffsets(ctx)
		committed := []map[string]any{}
		for topic, partitions := range cl.CommittedOffsets() {
			for p, o := range partitions {
				committed = append(committed, map[string]any{"topic": topic, "partition": p,
					"offset": o.Offset, "leader_epoch": o.Epoch})
			}
		}
		emit("committed", map[string]any{"offsets": committed, "error": errText(commitErr)})
		return commitErr
	}
	read, err := pollUntil(cl, *records, *timeoutMs, commit)
	emit("consumed", map[string]any{"records": read})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	return cl.LeaveGroupContext(ctx)
}
