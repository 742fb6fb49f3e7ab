// Command franz-go drives franz-go (github.com/twmb/franz-go) for Kiln's client
// compatibility tests: tests/compat/test_franz_go.py runs it as a subprocess and reads
// the JSON lines it prints on stdout, one event per line.
//
//	franz-go produce --brokers B --topic T [--partition P] --codec C --acks A --idempotent=BOOL < records
//	franz-go consume --brokers B --topic T --partitions 0,1 --from OFFSET [--isolation committed|uncommitted] --records N
//	franz-go group   --brokers B --topics T --group G [--protocol classic|consumer] --records N
//	franz-go admin OP --brokers B [flags of OP]
//	franz-go txn-produce|txn-etl|txn-fence ... (txn.go)
//
// Every run ends with a "requests" event: the requests franz-go wrote, by API key, and
// those whose answer never came because the connection failed before franz-go itself
// began closing. A failure to run at all prints {"event":"fatal"} and exits 1.
package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// commands: the subcommands, by name (txn-* in txn.go).
var commands = map[string]func(args []string) error{
	"produce":     produce,
	"consume":     consume,
	"group":       group,
	"admin":       admin,
	"txn-produce": txnProduce,
	"txn-etl":     txnETL,
	"txn-fence":   txnFence,
}

func main() {
	if len(os.Args) < 2 {
		fatal(errors.New("usage: franz-go produce|consume|group|admin ..."))
	}
	run, ok := commands[os.Args[1]]
	if !ok {
		fatal(fmt.Errorf("unknown command %q", os.Args[1]))
	}
	if err := run(os.Args[2:]); err != nil {
		fatal(err)
	}
}

var stdout = json.NewEncoder(os.Stdout)

// emitMu keeps lines whole: produce promises and hooks run on franz-go's goroutines.
var emitMu sync.Mutex

func emit(event string, fields map[string]any) {
	fields["event"] = event
	emitMu.Lock()
	defer emitMu.Unlock()
	if err := stdout.Encode(fields); err != nil {
		fmt.Fprintln(os.Stderr, "writing stdout:", err)
		os.Exit(1)
	}
}

// emitOutcome prints an event with err's text and Kafka error code ("error": null and
// "error_code": 0 for nil).
func emitOutcome(event string, fields map[string]any, err error) {
	fields["error"], fields["error_code"] = errText(err), errorCode(err)
	emit(event, fields)
}

func fatal(err error) {
	emit("fatal", map[string]any{"error": err.Error()})
	os.Exit(1)
}

// requestLog is a franz-go hook: the Python tests assert that no request of theirs went
// unanswered because the connection failed (Kiln closes a connection on a request it
// cannot take), and which APIs franz-go really used (a KIP-848 consumer falls back to the
// classic protocol without telling its caller).
type requestLog struct {
	mu     sync.Mutex
	byKey  map[int16]int
	broken []map[string]any
	// Connections that ended before franz-go began closing, for diagnosis only: franz-go
	// also closes one itself when it gives up on a request on it.
	disconnects int
	closing     atomic.Bool
}

func newRequestLog() *requestLog { return &requestLog{byKey: map[int16]int{}} }

func (l *requestLog) OnBrokerE2E(meta kgo.BrokerMetadata, key int16, e2e kgo.BrokerE2E) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.byKey[key]++
	if l.closing.Load() {
		return
	}
	if connectionFailed(e2e.WriteErr) || connectionFailed(e2e.ReadErr) {
		l.broken = append(l.broken, map[string]any{
			"api_key": key, "node_id": meta.NodeID,
			"write_error": errText(e2e.WriteErr), "read_error": errText(e2e.ReadErr),
		})
	}
}

// connectionFailed: the request's connection failed under it. A request franz-go gave up
// on itself (its context ended: a poll's deadline, a group leaving) is not counted.
func connectionFailed(err error) bool {
	return err != nil && !errors.Is(err, context.Canceled) &&
		!errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, kgo.ErrClientClosed)
}

func (l *requestLog) OnBrokerDisconnect(_ kgo.BrokerMetadata, _ net.Conn) {
	if l.closing.Load() {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.disconnects++
}

func (l *requestLog) emit() {
	l.mu.Lock()
	defer l.mu.Unlock()
	byKey := map[string]int{}
	for key, n := range l.byKey {
		byKey[strconv.Itoa(int(key))] = n
	}
	broken := l.broken
	if broken == nil {
		broken = []map[string]any{}
	}
	emit("requests", map[string]any{"by_api_key": byKey, "broken": broken,
		"disconnects": l.disconnects})
}

func errText(err error) any {
	if err == nil {
		return nil
	}
	return err.Error()
}

// newClient builds a client with the request log hooked in; close it with closeClient so
// the connections franz-go closes itself are not counted as broken.
func newClient(brokers string, log *requestLog, opts ...kgo.Opt) (*kgo.Client, error) {
	return kgo.NewClient(clientOpts(brokers, log, opts...)...)
}

// clientOpts: every client's options (the request log hooked in), then opts; for clients
// built by something else (a GroupTransactSession builds its own).
func clientOpts(brokers string, log *requestLog, opts ...kgo.Opt) []kgo.Opt {
	base := []kgo.Opt{
		kgo.SeedBrokers(strings.Split(brokers, ",")...),
		kgo.WithHooks(log),
		kgo.ClientID("kiln-compat-franz-go"),
		// Bounded, so a request Kiln never answers fails the test instead of hanging it.
		kgo.RequestTimeoutOverhead(15 * time.Second),
		kgo.RetryTimeout(20 * time.Second),
	}
	// FRANZ_GO_DEBUG=1: franz-go's own debug log on stderr, to see what it sent and got.
	if os.Getenv("FRANZ_GO_DEBUG") != "" {
		base = append(base, kgo.WithLogger(kgo.BasicLogger(os.Stderr, kgo.LogLevelDebug, nil)))
	}
	return append(base, opts...)
}

func closeClient(cl *kgo.Client, log *requestLog) {
	log.closing.Store(true)
	cl.Close()
	log.emit()
}

// --- shared encodings -----------------------------------------------------------------

// b64 is how bytes travel in the JSON lines: base64, with null for a nil slice (Kafka's
// null key, value or header value, distinct from an empty one).
func b64(data []byte) *string {
	if data == nil {
		return nil
	}
	s := base64.StdEncoding.EncodeToString(data)
	return &s
}

func unb64(s *string) ([]byte, error) {
	if s == nil {
		return nil, nil
	}
	data, err := base64.StdEncoding.DecodeString(*s)
	if data == nil {
		data = []byte{}
	}
	return data, err
}

func recordJSON(r *kgo.Record) map[string]any {
	headers := make([][2]any, 0, len(r.Headers))
	for _, h := range r.Headers {
		headers = append(headers, [2]any{h.Key, b64(h.Value)})
	}
	return map[string]any{
		"topic": r.Topic, "partition": r.Partition, "offset": r.Offset,
		"key": b64(r.Key), "value": b64(r.Value), "headers": headers,
		"timestamp_ms": r.Timestamp.UnixMilli(), "leader_epoch": r.LeaderEpoch,
	}
}

// errorCode is Kafka's error code of err: 0 for nil, -1 for an error that is not Kafka's.
func errorCode(err error) int16 {
	if err == nil {
		return 0
	}
	var ke *kerr.Error
	if errors.As(err, &ke) {
		return ke.Code
	}
	return -1
}

func int32List(text string) ([]int32, error) {
	var out []int32
	for _, field := range strings.Split(text, ",") {
		if field == "" {
			continue
		}
		n, err := strconv.ParseInt(field, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("%q: %w", text, err)
		}
		out = append(out, int32(n))
	}
	return out, nil
}

// repeated is a flag that may be given several times.
type repeated []string

func (r *repeated) String() string     { return strings.Join(*r, ",") }
func (r *repeated) Set(v string) error { *r = append(*r, v); return nil }

// parsedFlag is a flag whose text is parsed as it is set: a bad value fails parse.
type parsedFlag[T any] struct {
	value T
	text  string
	parse func(string) (T, error)
}

func (f *parsedFlag[T]) String() string { return f.text }

func (f *parsedFlag[T]) Set(text string) error {
	value, err := f.parse(text)
	if err != nil {
		return err
	}
	f.value, f.text = value, text
	return nil
}

// parsedVar defines a flag read with parseText; its default, `text`, must parse.
func parsedVar[T any](fs *flag.FlagSet, name, text, usage string,
	parseText func(string) (T, error)) *T {
	f := &parsedFlag[T]{parse: parseText}
	if err := f.Set(text); err != nil {
		panic(fmt.Sprintf("--%s's default: %v", name, err))
	}
	fs.Var(f, name, usage)
	return &f.value
}

// commandFlags: a command's flags, with the --brokers every command takes.
func commandFlags(name string) (*flag.FlagSet, *string) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	return fs, fs.String("brokers", "", "bootstrap servers")
}

func parse(fs *flag.FlagSet, args []string) error {
	fs.SetOutput(os.Stderr)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%s: unexpected arguments %q", fs.Name(), fs.Args())
	}
	return nil
}

func timeoutContext(ms int) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), time.Duration(ms)*time.Millisecond)
}
