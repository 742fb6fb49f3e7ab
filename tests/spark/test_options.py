"""The Kafka source's options as the compatible reader reads them, and the jobs' options."""

from __future__ import annotations

import pytest

from spark_examples.audit import audit_options
from spark_examples.hardened_stream import parse_args, settings_from, source_options
from spark_examples.options import (
    EARLIEST,
    LATEST,
    OptionError,
    Subscription,
    TopicPartition,
    parse_options,
)
from spark_examples.session import spark_conf

BASE = {"kafka.bootstrap.servers": "127.0.0.1:9092", "subscribe": "orders"}


def test_streaming_defaults_are_spark_s() -> None:
    options = parse_options(BASE, streaming=True)
    assert options.bootstrap_servers == "127.0.0.1:9092"
    assert options.subscription == Subscription("subscribe", topics=("orders",))
    assert options.starting_offsets == "latest"
    assert options.ending_offsets == "latest"
    assert options.fail_on_data_loss is True
    assert options.max_offsets_per_trigger is None
    assert options.include_headers is False
    assert options.read_committed is False
    assert options.max_partition_fetch_bytes == 1_048_576


def test_batch_reads_from_earliest_by_default() -> None:
    assert parse_options(BASE, streaming=False).starting_offsets == "earliest"


def test_option_names_are_case_insensitive() -> None:
    options = parse_options({"KAFKA.BOOTSTRAP.SERVERS": "h:1", "SubscribePattern": "ord.*",
                             "STARTINGOFFSETS": "earliest", "includeheaders": "TRUE",
                             "maxOffsetsPerTrigger": "500", "failondataloss": "false",
                             "Kafka.Isolation.Level": "read_committed"}, streaming=True)
    assert options.subscription.kind == "subscribePattern"
    assert options.subscription.wants("orders") and not options.subscription.wants("xorders")
    assert options.starting_offsets == "earliest"
    assert options.include_headers is True
    assert options.max_offsets_per_trigger == 500
    assert options.fail_on_data_loss is False
    assert options.read_committed is True


def test_offsets_json_with_earliest_and_latest_markers() -> None:
    options = parse_options({**BASE, "startingOffsets": '{"orders": {"0": 23, "1": -2}}',
                             "endingOffsets": '{"orders": {"0": -1, "1": 50}}'},
                            streaming=False)
    assert options.starting_offsets == {TopicPartition("orders", 0): 23,
                                        TopicPartition("orders", 1): EARLIEST}
    assert options.ending_offsets == {TopicPartition("orders", 0): LATEST,
                                      TopicPartition("orders", 1): 50}


def test_assign_names_partitions() -> None:
    options = parse_options({"kafka.bootstrap.servers": "h:1",
                             "assign": '{"b": [1], "a": [0, 2]}'}, streaming=True)
    assert options.subscription.partitions == (
        TopicPartition("a", 0), TopicPartition("a", 2), TopicPartition("b", 1))
    assert options.subscription.wants("a") and not options.subscription.wants("c")


def test_consumer_settings_without_effect_are_listed() -> None:
    options = parse_options({**BASE, "kafka.group.id": "g", "kafka.fetch.min.bytes": "1"},
                            streaming=True)
    assert options.ignored == ("kafka.fetch.min.bytes", "kafka.group.id")


@pytest.mark.parametrize(("options", "streaming", "complaint"), [
    ({"subscribe": "t"}, True, "kafka.bootstrap.servers"),
    ({**BASE, "assign": '{"t": [0]}'}, True, "exactly one of"),
    ({"kafka.bootstrap.servers": "h:1"}, True, "exactly one of"),
    ({**BASE, "startingOffsets": "latest"}, False, "not valid for batch"),
    ({**BASE, "endingOffsets": "latest"}, True, "not valid for streaming"),
    ({**BASE, "endingOffsets": "earliest"}, False, "cannot be earliest"),
    ({**BASE, "endingOffsets": '{"orders": {"0": -2}}'}, False, "cannot be earliest"),
    ({**BASE, "startingOffsets": "yesterday"}, True, "neither earliest, latest nor JSON"),
    ({**BASE, "startingOffsets": '{"orders": {"x": 1}}'}, True, "bad partition"),
    ({**BASE, "startingOffsets": '{"orders": {"0": -3}}'}, True, "bad offset"),
    ({**BASE, "maxOffsetsPerTrigger": "0"}, True, "positive integer"),
    ({**BASE, "failOnDataLoss": "maybe"}, True, "true or false"),
    ({**BASE, "kafka.isolation.level": "serializable"}, True, "read_committed"),
    ({**BASE, "startingTimestamp": "1000"}, True, "not supported by Kiln's compatible"),
    ({**BASE, "minOffsetsPerTrigger": "10"}, True, "not supported by Kiln's compatible"),
    ({**BASE, "kafka.security.protocol": "SASL_SSL"}, True, "PLAINTEXT only"),
    ({"kafka.bootstrap.servers": "h:1", "subscribePattern": "("}, True, "subscribePattern"),
    ({"kafka.bootstrap.servers": "h:1", "assign": '{"t": ["0"]}'}, True, "assign must be"),
])
def test_bad_options_are_refused_with_a_reason(options: dict[str, str], streaming: bool,
                                               complaint: str) -> None:
    with pytest.raises(OptionError) as raised:
        parse_options(options, streaming=streaming)
    assert complaint in str(raised.value)


def test_the_stream_job_passes_the_standard_options() -> None:
    args = parse_args(["--bootstrap", "h:9092", "--topic", "orders,refunds", "--output", "o",
                       "--checkpoint", "c", "--max-offsets-per-trigger", "500"])
    assert source_options(settings_from(args)) == {
        "kafka.bootstrap.servers": "h:9092",
        "subscribe": "orders,refunds",
        "startingOffsets": "earliest",
        "includeHeaders": "true",
        "kafka.isolation.level": "read_committed",
        "failOnDataLoss": "true",
        "maxOffsetsPerTrigger": "500",
    }
    unlimited = parse_args(["--bootstrap", "h:1", "--topic", "t", "--output", "o",
                            "--checkpoint", "c", "--max-offsets-per-trigger", "0",
                            "--no-fail-on-data-loss"])
    options = source_options(settings_from(unlimited))
    assert "maxOffsetsPerTrigger" not in options
    assert options["failOnDataLoss"] == "false"
    # and the compatible reader accepts every one of them
    parse_options(options, streaming=True)


def test_the_audit_reads_the_whole_topic_once() -> None:
    options = audit_options("h:9092", "orders")
    assert options["startingOffsets"] == "earliest"
    assert options["endingOffsets"] == "latest"
    assert options["includeHeaders"] == "true"
    parse_options(options, streaming=False)


def test_spark_conf_pairs() -> None:
    assert spark_conf(["spark.sql.shuffle.partitions=4", "a.b = c"]) == {
        "spark.ui.showConsoleProgress": "false", "spark.sql.shuffle.partitions": "4",
        "a.b": "c"}
    with pytest.raises(SystemExit):
        spark_conf(["no-equals"])
