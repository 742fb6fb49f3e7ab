package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// adminFlags are the flags of every admin operation; each uses the ones it needs.
type adminFlags struct {
	brokers           string
	topics            repeated
	groups            repeated
	configs           repeated // name=value
	alters            repeated // set:name=value, delete:name
	partitions        int
	replicationFactor int
	assignment        string // JSON: the broker ids of each partition, [[1], [1]]
	add, set          int
	broker            int
	legacy            bool
	offsets           string // partition:offset,...
	partitionList     string
	spec              string
}

type adminOp func(ctx context.Context, adm *kadm.Client, cl *kgo.Client, f *adminFlags) (any, error)

var adminOps = map[string]adminOp{
	"create-topics":     createTopics,
	"delete-topics":     deleteTopics,
	"create-partitions": createPartitions,
	"list-topics":       listTopics,
	"metadata":          metadata,
	"describe-configs":  describeConfigs,
	"alter-configs":     alterConfigs,
	"delete-records":    deleteRecords,
	"list-groups":       listGroups,
	"describe-groups":   describeGroups,
	"delete-groups":     deleteGroups,
	"fetch-offsets":     fetchOffsets,
	"commit-offsets":    commitOffsets,
	"delete-offsets":    deleteOffsets,
	"describe-cluster":  describeCluster,
	"list-offsets":      listOffsets,
	"api-versions":      apiVersions,
}

// admin runs one operation and prints its per-item results as one "admin" event. A Kafka
// error, on an item or on the whole request, is a result (an error_code), not a failure of
// the run.
func admin(args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("admin: no operation")
	}
	name, args := args[0], args[1:]
	op, ok := adminOps[name]
	if !ok {
		return fmt.Errorf("admin: unknown operation %q", name)
	}
	var f adminFlags
	fs := flag.NewFlagSet("admin "+name, flag.ContinueOnError)
	fs.StringVar(&f.brokers, "brokers", "", "bootstrap servers")
	fs.Var(&f.topics, "topic", "topic (repeatable)")
	fs.Var(&f.groups, "group", "group (repeatable)")
	fs.Var(&f.configs, "config", "name=value (repeatable)")
	fs.Var(&f.alters, "alter", "set:name=value or delete:name (repeatable)")
	fs.IntVar(&f.partitions, "partitions", 1, "partitions of a new topic")
	fs.IntVar(&f.replicationFactor, "replication-factor", 1, "replication factor")
	fs.StringVar(&f.assignment, "assignment", "", "replica assignment, JSON [[broker...]...]")
	fs.IntVar(&f.add, "add", 0, "partitions to add")
	fs.IntVar(&f.set, "set", 0, "partition count to grow to")
	fs.IntVar(&f.broker, "broker", -1, "broker id (configs of a broker)")
	fs.BoolVar(&f.legacy, "legacy", false, "AlterConfigs instead of IncrementalAlterConfigs")
	fs.StringVar(&f.offsets, "offsets", "", "partition:offset,...")
	fs.StringVar(&f.partitionList, "partitions-list", "", "partitions, comma-separated")
	fs.StringVar(&f.spec, "spec", "end", "list-offsets: start, end, max-timestamp or a ms")
	if err := parse(fs, args); err != nil {
		return err
	}
	log := newRequestLog()
	cl, err := newClient(f.brokers, log)
	if err != nil {
		return err
	}
	defer closeClient(cl, log)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	results, err := op(ctx, kadm.NewClient(cl), cl, &f)
	if code := errorCode(err); code > 0 {
		// Kafka's answer for the whole request (a group's error in DeleteOffsets).
		emit("admin", map[string]any{"op": name, "results": nil, "error_code": code,
			"error": err.Error()})
		return nil
	}
	if err != nil {
		return fmt.Errorf("admin %s: %w", name, err)
	}
	emit("admin", map[string]any{"op": name, "results": results, "error_code": 0})
	return nil
}

func itemError(err error, message string) map[string]any {
	out := map[string]any{"error_code": errorCode(err), "error": errText(err)}
	if message != "" {
		out["error_message"] = message
	}
	return out
}

func with(base map[string]any, fields map[string]any) map[string]any {
	for k, v := range fields {
		base[k] = v
	}
	return base
}

func configMap(pairs []string) (map[string]*string, error) {
	out := map[string]*string{}
	for _, pair := range pairs {
		name, value, ok := strings.Cut(pair, "=")
		if !ok {
			return nil, fmt.Errorf("config %q is not name=value", pair)
		}
		out[name] = kadm.StringPtr(value)
	}
	return out, nil
}

func partitionOffsets(text string) (map[int32]int64, error) {
	out := map[int32]int64{}
	for _, field := range strings.Split(text, ",") {
		p, o, ok := strings.Cut(field, ":")
		if !ok {
			return nil, fmt.Errorf("%q is not partition:offset", field)
		}
		partition, err := strconv.ParseInt(p, 10, 32)
		if err != nil {
			return nil, err
		}
		offset, err := strconv.ParseInt(o, 10, 64)
		if err != nil {
			return nil, err
		}
		out[int32(partition)] = offset
	}
	return out, nil
}

// --- topics -------------------------------------------------------------------------------

func createTopics(ctx context.Context, adm *kadm.Client, cl *kgo.Client, f *adminFlags) (any, error) {
	configs, err := configMap(f.configs)
	if err != nil {
		return nil, err
	}
	if f.assignment != "" {
		return createTopicsAssigned(ctx, cl, f, configs)
	}
	created, err := adm.CreateTopics(ctx, int32(f.partitions), int16(f.replicationFactor),
		configs, f.topics...)
	if err != nil {
		return nil, err
	}
	var out []map[string]any
	for _, t := range created.Sorted() {
		values := map[string]any{}
		for name, c := range t.Configs {
			values[name] = c.Value
		}
		out = append(out, with(itemError(t.Err, t.ErrMessage), map[string]any{
			"topic": t.Topic, "partitions": t.NumPartitions,
			"replication_factor": t.ReplicationFactor, "configs": values}))
	}
	return out, nil
}

// createTopicsAssigned sends CreateTopics itself: kadm places partitions by count only.
func createTopicsAssigned(ctx context.Context, cl *kgo.Client, f *adminFlags,
	configs map[string]*string) (any, error) {
	var assignment [][]int32
	if err := json.Unmarshal([]byte(f.assignment), &assignment); err != nil {
		return nil, fmt.Errorf("--assignment: %w", err)
	}
	req := kmsg.NewPtrCreateTopicsRequest()
	req.TimeoutMillis = 15000
	for _, topic := range f.topics {
		t := kmsg.NewCreateTopicsRequestTopic()
		t.Topic = topic
		t.NumPartitions, t.ReplicationFactor = -1, -1
		for p, replicas := range assignment {
			a := kmsg.NewCreateTopicsRequestTopicReplicaAssignment()
			a.Partition, a.Replicas = int32(p), replicas
			t.ReplicaAssignment = append(t.ReplicaAssignment, a)
		}
		for name, value := range configs {
			c := kmsg.NewCreateTopicsRequestTopicConfig()
			c.Name, c.Value = name, value
			t.Configs = append(t.Configs, c)
		}
		req.Topics = append(req.Topics, t)
	}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return nil, err
	}
	var out []map[string]any
	for _, t := range resp.Topics {
		message := ""
		if t.ErrorMessage != nil {
			message = *t.ErrorMessage
		}
		out = append(out, with(itemError(kerr.ErrorForCode(t.ErrorCode), message),
			map[string]any{"topic": t.Topic, "partitions": t.NumPartitions,
				"replication_factor": t.ReplicationFactor}))
	}
	return out, nil
}

func deleteTopics(ctx context.Context, adm *kadm.Client, _ *kgo.Client, f *adminFlags) (any, error) {
	deleted, err := adm.DeleteTopics(ctx, f.topics...)
	if err != nil {
		return nil, err
	}
	var out []map[string]any
	for _, t := range deleted.Sorted() {
		out = append(out, with(itemError(t.Err, t.ErrMessage), map[string]any{"topic": t.Topic}))
	}
	return out, nil
}

func createPartitions(ctx context.Context, adm *kadm.Client, _ *kgo.Client, f *adminFlags) (any, error) {
	var done kadm.CreatePartitionsResponses
	var err error
	if f.set > 0 {
		done, err = adm.UpdatePartitions(ctx, f.set, f.topics...)
	} else {
		done, err = adm.CreatePartitions(ctx, f.add, f.topics...)
	}
	if err != nil {
		return nil, err
	}
	var out []map[string]any
	for _, t := range done.Sorted() {
		out = append(out, with(itemError(t.Err, t.ErrMessage), map[string]any{"topic": t.Topic}))
	}
	return out, nil
}

func listTopics(ctx context.Context, adm *kadm.Client, _ *kgo.Client, _ *adminFlags) (any, error) {
	topics, err := adm.ListTopics(ctx)
	if err != nil {
		return nil, err
	}
	names := topics.Names()
	sort.Strings(names)
	return names, nil
}

func metadata(ctx context.Context, adm *kadm.Client, _ *kgo.Client, f *adminFlags) (any, error) {
	m, err := adm.Metadata(ctx, f.topics...)
	if err != nil {
		return nil, err
	}
	brokers := []map[string]any{}
	for _, b := range m.Brokers {
		brokers = append(brokers, map[string]any{"node_id": b.NodeID, "host": b.Host,
			"port": b.Port})
	}
	topics := []map[string]any{}
	for _, t := range m.Topics.Sorted() {
		partitions := []map[string]any{}
		for _, p := range t.Partitions.Sorted() {
			partitions = append(partitions, with(itemError(p.Err, ""), map[string]any{
				"partition": p.Partition, "leader": p.Leader, "replicas": p.Replicas,
				"isr": p.ISR}))
		}
		topics = append(topics, with(itemError(t.Err, ""), map[string]any{
			"topic": t.Topic, "partitions": partitions}))
	}
	return map[string]any{"cluster_id": m.Cluster, "controller": m.Controller,
		"brokers": brokers, "topics": topics}, nil
}

// --- configs ------------------------------------------------------------------------------

func describeConfigs(ctx context.Context, adm *kadm.Client, _ *kgo.Client, f *adminFlags) (any, error) {
	var described kadm.ResourceConfigs
	var err error
	if f.broker >= 0 {
		described, err = adm.DescribeBrokerConfigs(ctx, int32(f.broker))
	} else {
		described, err = adm.DescribeTopicConfigs(ctx, f.topics...)
	}
	if err != nil {
		return nil, err
	}
	var out []map[string]any
	for _, r := range described {
		configs := map[string]any{}
		for _, c := range r.Configs {
			configs[c.Key] = map[string]any{"value": c.Value, "source": c.Source.String(),
				"sensitive": c.Sensitive}
		}
		out = append(out, with(itemError(r.Err, r.ErrMessage), map[string]any{
			"name": r.Name, "configs": configs}))
	}
	return out, nil
}

func alterConfigs(ctx context.Context, adm *kadm.Client, _ *kgo.Client, f *adminFlags) (any, error) {
	var alters []kadm.AlterConfig
	for _, a := range f.alters {
		kind, rest, _ := strings.Cut(a, ":")
		switch kind {
		case "set":
			name, value, ok := strings.Cut(rest, "=")
			if !ok {
				return nil, fmt.Errorf("--alter %q: set:name=value", a)
			}
			alters = append(alters, kadm.AlterConfig{Op: kadm.SetConfig, Name: name,
				Value: kadm.StringPtr(value)})
		case "delete":
			alters = append(alters, kadm.AlterConfig{Op: kadm.DeleteConfig, Name: rest})
		default:
			return nil, fmt.Errorf("--alter %q: set:... or delete:...", a)
		}
	}
	var done kadm.AlterConfigsResponses
	var err error
	if f.legacy {
		done, err = adm.AlterTopicConfigsState(ctx, alters, f.topics...)
	} else {
		done, err = adm.AlterTopicConfigs(ctx, alters, f.topics...)
	}
	if err != nil {
		return nil, err
	}
	var out []map[string]any
	for _, r := range done {
		out = append(out, with(itemError(r.Err, r.ErrMessage), map[string]any{"name": r.Name}))
	}
	return out, nil
}

// --- records and offsets ------------------------------------------------------------------

func deleteRecords(ctx context.Context, adm *kadm.Client, _ *kgo.Client, f *adminFlags) (any, error) {
	at, err := partitionOffsets(f.offsets)
	if err != nil {
		return nil, err
	}
	var offsets kadm.Offsets
	for p, o := range at {
		offsets.AddOffset(f.topics[0], p, o, -1)
	}
	done, err := adm.DeleteRecords(ctx, offsets)
	if err != nil {
		return nil, err
	}
	var out []map[string]any
	for _, r := range done.Sorted() {
		out = append(out, with(itemError(r.Err, ""), map[string]any{"topic": r.Topic,
			"partition": r.Partition, "low_watermark": r.LowWatermark}))
	}
	return out, nil
}

func listOffsets(ctx context.Context, adm *kadm.Client, _ *kgo.Client, f *adminFlags) (any, error) {
	var listed kadm.ListedOffsets
	var err error
	switch f.spec {
	case "start":
		listed, err = adm.ListStartOffsets(ctx, f.topics...)
	case "end":
		listed, err = adm.ListEndOffsets(ctx, f.topics...)
	case "max-timestamp":
		listed, err = adm.ListMaxTimestampOffsets(ctx, f.topics...)
	default:
		ms, parseErr := strconv.ParseInt(f.spec, 10, 64)
		if parseErr != nil {
			return nil, fmt.Errorf("--spec %q: %w", f.spec, parseErr)
		}
		listed, err = adm.ListOffsetsAfterMilli(ctx, ms, f.topics...)
	}
	if err != nil {
		return nil, err
	}
	var out []map[string]any
	listed.Each(func(o kadm.ListedOffset) {
		out = append(out, with(itemError(o.Err, ""), map[string]any{"topic": o.Topic,
			"partition": o.Partition, "offset": o.Offset, "timestamp": o.Timestamp,
			"leader_epoch": o.LeaderEpoch}))
	})
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a["topic"] != b["topic"] {
			return a["topic"].(string) < b["topic"].(string)
		}
		return a["partition"].(int32) < b["partition"].(int32)
	})
	return out, nil
}

// --- groups -------------------------------------------------------------------------------

func listGroups(ctx context.Context, adm *kadm.Client, _ *kgo.Client, _ *adminFlags) (any, error) {
	listed, err := adm.ListGroups(ctx)
	if err != nil {
		return nil, err
	}
	var out []map[string]any
	for _, g := range listed.Sorted() {
		out = append(out, map[string]any{"group": g.Group, "state": g.State,
			"protocol_type": g.ProtocolType, "group_type": g.GroupType,
			"coordinator": g.Coordinator})
	}
	return out, nil
}

func describeGroups(ctx context.Context, adm *kadm.Client, _ *kgo.Client, f *adminFlags) (any, error) {
	described, err := adm.DescribeGroups(ctx, f.groups...)
	if err != nil {
		return nil, err
	}
	var out []map[string]any
	for _, g := range described.Sorted() {
		members := []map[string]any{}
		for _, m := range g.Members {
			assigned := map[string][]int32{}
			if c, ok := m.Assigned.AsConsumer(); ok {
				for _, t := range c.Topics {
					assigned[t.Topic] = t.Partitions
				}
			}
			members = append(members, map[string]any{"member_id": m.MemberID,
				"client_id": m.ClientID, "client_host": m.ClientHost, "assigned": assigned})
		}
		out = append(out, with(itemError(g.Err, g.ErrMessage), map[string]any{
			"group": g.Group, "state": g.State, "protocol_type": g.ProtocolType,
			"protocol": g.Protocol, "coordinator": g.Coordinator.NodeID, "members": members}))
	}
	return out, nil
}

func deleteGroups(ctx context.Context, adm *kadm.Client, _ *kgo.Client, f *adminFlags) (any, error) {
	deleted, err := adm.DeleteGroups(ctx, f.groups...)
	if err != nil {
		return nil, err
	}
	var out []map[string]any
	for _, g := range deleted.Sorted() {
		out = append(out, with(itemError(g.Err, g.ErrMessage), map[string]any{"group": g.Group}))
	}
	return out, nil
}

func offsetResults(responses kadm.OffsetResponses) []map[string]any {
	out := []map[string]any{}
	for _, topic := range sortedKeys(responses) {
		for _, p := range sortedKeys(responses[topic]) {
			o := responses[topic][p]
			out = append(out, with(itemError(o.Err, ""), map[string]any{"topic": o.Topic,
				"partition": o.Partition, "offset": o.At, "leader_epoch": o.LeaderEpoch,
				"metadata": o.Metadata}))
		}
	}
	return out
}

func fetchOffsets(ctx context.Context, adm *kadm.Client, _ *kgo.Client, f *adminFlags) (any, error) {
	fetched, err := adm.FetchOffsets(ctx, f.groups[0])
	if err != nil {
		return nil, err
	}
	return offsetResults(fetched), nil
}

func commitOffsets(ctx context.Context, adm *kadm.Client, _ *kgo.Client, f *adminFlags) (any, error) {
	at, err := partitionOffsets(f.offsets)
	if err != nil {
		return nil, err
	}
	var offsets kadm.Offsets
	for p, o := range at {
		offsets.Add(kadm.Offset{Topic: f.topics[0], Partition: p, At: o, LeaderEpoch: -1,
			Metadata: "franz-go"})
	}
	committed, err := adm.CommitOffsets(ctx, f.groups[0], offsets)
	if err != nil {
		return nil, err
	}
	return offsetResults(committed), nil
}

func deleteOffsets(ctx context.Context, adm *kadm.Client, _ *kgo.Client, f *adminFlags) (any, error) {
	partitions, err := int32List(f.partitionList)
	if err != nil {
		return nil, err
	}
	set := kadm.TopicsSet{}
	set.Add(f.topics[0], partitions...)
	deleted, err := adm.DeleteOffsets(ctx, f.groups[0], set)
	if err != nil {
		return nil, err
	}
	out := []map[string]any{}
	for _, topic := range sortedKeys(deleted) {
		for _, p := range sortedKeys(deleted[topic]) {
			out = append(out, with(itemError(deleted[topic][p], ""), map[string]any{
				"topic": topic, "partition": p}))
		}
	}
	return out, nil
}

// --- cluster ------------------------------------------------------------------------------

// describeCluster sends DescribeCluster itself: kadm learns the cluster from Metadata.
func describeCluster(ctx context.Context, _ *kadm.Client, cl *kgo.Client, _ *adminFlags) (any, error) {
	resp, err := kmsg.NewPtrDescribeClusterRequest().RequestWith(ctx, cl)
	if err != nil {
		return nil, err
	}
	brokers := []map[string]any{}
	for _, b := range resp.Brokers {
		brokers = append(brokers, map[string]any{"node_id": b.NodeID, "host": b.Host,
			"port": b.Port, "rack": b.Rack})
	}
	message := ""
	if resp.ErrorMessage != nil {
		message = *resp.ErrorMessage
	}
	return with(itemError(kerr.ErrorForCode(resp.ErrorCode), message), map[string]any{
		"cluster_id": resp.ClusterID, "controller": resp.ControllerID, "brokers": brokers}), nil
}

func apiVersions(ctx context.Context, adm *kadm.Client, _ *kgo.Client, _ *adminFlags) (any, error) {
	versions, err := adm.ApiVersions(ctx)
	if err != nil {
		return nil, err
	}
	var out []map[string]any
	for _, v := range versions.Sorted() {
		keys := map[string][2]int16{}
		v.EachKeySorted(func(key, lo, hi int16) {
			keys[strconv.Itoa(int(key))] = [2]int16{lo, hi}
		})
		out = append(out, with(itemError(v.Err, ""), map[string]any{"node_id": v.NodeID,
			"api_keys": keys}))
	}
	return out, nil
}

func sortedKeys[K int32 | string, V any](m map[K]V) []K {
	keys := make([]K, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return keys[i] < keys[j] })
	return keys
}
