"""Settings precedence and the messages for bad values."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli.settings import SettingsError, load_settings
from storage.redis_pool import parse_cluster_url, parse_sentinel_url, redact_url


def test_flags_beat_environment_beat_file(tmp_path: Path) -> None:
    config = tmp_path / "kiln.toml"
    config.write_text('listen = "127.0.0.1:1000"\nharden_delay_ms = 5\nredis_url = "redis://r:1/0"\n')

    settings = load_settings(config, overrides={"listen": "127.0.0.1:3000"},
                             environ={"KILN_LISTEN": "127.0.0.1:2000", "KILN_HARDEN_DELAY_MS": "7"})

    assert settings.listen == "127.0.0.1:3000"
    assert settings.harden_delay_ms == 7
    assert settings.redis_url == "redis://r:1/0"


def test_unknown_key_is_named(tmp_path: Path) -> None:
    config = tmp_path / "kiln.toml"
    config.write_text("harden_delay = 5\n")

    with pytest.raises(SettingsError, match="unknown key 'harden_delay'"):
        load_settings(config, environ={})


def test_wrong_type_names_key_and_source() -> None:
    with pytest.raises(SettingsError, match=r"harden_delay_ms .*KILN_HARDEN_DELAY_MS"):
        load_settings(environ={"KILN_HARDEN_DELAY_MS": "soon"})


def test_bad_listen_address() -> None:
    with pytest.raises(SettingsError, match="listen: expected HOST:PORT"):
        load_settings(overrides={"listen": "localhost"}, environ={})


def test_advertise_defaults_to_loopback_for_wildcard_listen() -> None:
    settings = load_settings(overrides={"listen": "0.0.0.0:9092"}, environ={})

    assert settings.advertised_address == ("127.0.0.1", 9092)


def test_negative_delay_rejected() -> None:
    with pytest.raises(SettingsError, match="harden_delay_ms: must be >= 0"):
        load_settings(overrides={"harden_delay_ms": -1}, environ={})


def test_durable_subscriptions_are_topic_group_pairs() -> None:
    settings = load_settings(environ={"KILN_DURABLE_SUBSCRIPTIONS": "orders:billing, orders:a:b"})

    assert settings.subscriptions == [("orders", "billing"), ("orders", "a:b")]


def test_a_subscription_without_group_is_named() -> None:
    with pytest.raises(SettingsError,
                       match="durable_subscriptions: expected TOPIC:GROUP, got 'orders'"):
        load_settings(environ={"KILN_DURABLE_SUBSCRIPTIONS": "orders"})


def test_group_settings_default_and_are_checked() -> None:
    defaults = load_settings(environ={})

    assert (defaults.group_initial_rebalance_delay_ms, defaults.group_min_session_timeout_ms,
            defaults.group_max_session_timeout_ms) == (300, 6_000, 1_800_000)
    with pytest.raises(SettingsError, match="group_initial_rebalance_delay_ms: must be >= 0"):
        load_settings(overrides={"group_initial_rebalance_delay_ms": -1}, environ={})
    with pytest.raises(SettingsError, match="group_max_session_timeout_ms: must be >= "):
        load_settings(environ={"KILN_GROUP_MIN_SESSION_TIMEOUT_MS": "10000",
                               "KILN_GROUP_MAX_SESSION_TIMEOUT_MS": "9000"})


def test_a_sentinel_url_names_its_sentinels_service_and_database() -> None:
    url = "redis+sentinel://:s%40cret@10.0.0.1:26379,[::1]:26380/kiln/2"

    assert parse_sentinel_url(url) == ([("10.0.0.1", 26379), ("::1", 26380)], "kiln", 2,
                                       "s@cret")
    assert load_settings(overrides={"redis_url": url}, environ={}).redis_url == url


@pytest.mark.parametrize("url", ["redis+sentinel://10.0.0.1:26379",
                                 "redis+sentinel://10.0.0.1/kiln",
                                 "redis+sentinel://10.0.0.1:26379/kiln/x"])
def test_a_bad_sentinel_url_is_refused(url: str) -> None:
    with pytest.raises(SettingsError, match="redis_url"):
        load_settings(overrides={"redis_url": url}, environ={})


def test_a_cluster_url_names_some_of_its_nodes_and_a_password() -> None:
    url = "redis+cluster://:s%40cret@10.0.0.1:7000,[::1]:7001"

    assert parse_cluster_url(url) == ([("10.0.0.1", 7000), ("::1", 7001)], "s@cret")
    assert parse_cluster_url("redis+cluster://10.0.0.1:7000/0") == ([("10.0.0.1", 7000)], None)
    assert load_settings(overrides={"redis_url": url}, environ={}).redis_url == url


@pytest.mark.parametrize("url", ["redis+cluster://", "redis+cluster://10.0.0.1",
                                 "redis+cluster://10.0.0.1:7000/2", "rediscluster://h:1"])
def test_a_bad_cluster_url_is_refused(url: str) -> None:
    # (a Redis Cluster has only database 0)
    with pytest.raises(SettingsError, match="redis_url"):
        load_settings(overrides={"redis_url": url}, environ={})


@pytest.mark.parametrize(("url", "shown"), [
    ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
    ("redis://:s3cret@h:6379/0", "redis://:***@h:6379/0"),
    ("rediss://kiln:s3cret@h:6379/1?ssl_cert_reqs=none",
     "rediss://kiln:***@h:6379/1?ssl_cert_reqs=none"),
    ("redis+sentinel://:s3cret@a:26379,b:26379/kiln", "redis+sentinel://:***@a:26379,b:26379/kiln"),
    ("redis+cluster://u:s%40cret@a:7000,b:7001", "redis+cluster://u:***@a:7000,b:7001"),
    ("redis://h:1/0?password=s3cret&db=1", "redis://h:1/0?password=***&db=1"),
    ("unix:///run/redis.sock?password=s3cret", "unix:///run/redis.sock?password=***"),
    ("redis://kiln@h:1/0", "redis://kiln@h:1/0"),
])
def test_the_redis_url_is_shown_without_its_password(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_a_refused_redis_url_is_named_without_its_password() -> None:
    with pytest.raises(SettingsError, match="redis_url") as refused:
        load_settings(overrides={"redis_url": "redis+cluster://:s3cret@10.0.0.1:7000/2"},
                      environ={})
    assert "s3cret" not in str(refused.value) and ":***@" in str(refused.value)


def test_listeners_advertise_their_own_addresses_unless_told() -> None:
    settings = load_settings(overrides={
        "listeners": "INTERNAL://0.0.0.0:9092,EXTERNAL://10.0.0.5:9093",
        "listener_security_protocol_map": "internal:PLAINTEXT,EXTERNAL:SSL",
        "advertised_listeners": "EXTERNAL://kiln.example:19093",
        "ssl_certificate_file": "server.pem", "ssl_key_file": "server.key"}, environ={})

    assert [(str(listener), listener.protocol) for listener in settings.kafka_listeners] == [
        ("INTERNAL://0.0.0.0:9092", "PLAINTEXT"), ("EXTERNAL://10.0.0.5:9093", "SSL")]
    assert settings.advertised_listener_addresses == {
        "INTERNAL": ("127.0.0.1", 9092), "EXTERNAL": ("kiln.example", 19093)}
    # The first listener names the node and places its HTTP endpoints
    assert settings.advertised_address == ("127.0.0.1", 9092)
    assert settings.http_address == ("127.0.0.1", 9644)


def test_a_listener_is_named_as_on_a_kafka_broker() -> None:
    tls = {"ssl_certificate_file": "server.pem", "ssl_key_file": "server.key"}
    listener = load_settings(overrides={"listeners": "ssl://0.0.0.0:9093", **tls},
                             environ={})
    assert str(listener.listener) == "SSL://0.0.0.0:9093"
    assert listener.listen_address == ("0.0.0.0", 9093)
    assert listener.advertised_address == ("127.0.0.1", 9093)
    assert str(load_settings(environ={}).listener) == "PLAINTEXT://127.0.0.1:9092"


@pytest.mark.parametrize(("overrides", "refusal"), [
    ({"listeners": "PLAINTEXT://h:1,SSL://h:1"}, "SSL and PLAINTEXT both on h:1"),
    ({"listeners": "PLAINTEXT://h:1,plaintext://h:2"}, "PLAINTEXT given twice"),
    ({"listeners": "SASL_SSL://h:1"}, "ssl_certificate_file: an SSL listener needs it"),
    ({"listeners": "OUTSIDE://h:1", "listener_security_protocol_map": "OUTSIDE:SASL_SSL"},
     "ssl_certificate_file: an SSL listener needs it"),
    ({"listeners": "SASL_PLAINTEXT://h:1", "sasl_enabled_mechanisms": "OAUTHBEARER"},
     "OAUTHBEARER is not built yet"),
    ({"listeners": "SASL_PLAINTEXT://h:1", "sasl_enabled_mechanisms": "GSSAPI"},
     "sasl_enabled_mechanisms: one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, got 'GSSAPI'"),
    ({"listeners": "SASL_PLAINTEXT://h:1", "sasl_enabled_mechanisms": ""},
     "a SASL listener needs at least one"),
    ({"listeners": "HTTP://h:1"}, "HTTP has no protocol: one of PLAINTEXT, SSL"),
    ({"listeners": "h:1"}, "expected NAME://HOST:PORT"),
    ({"listener_security_protocol_map": "OUTSIDE", "listeners": "OUTSIDE://h:1"},
     "expected NAME:PROTOCOL"),
    ({"listeners": "PLAINTEXT://h:1", "listen": "h:2"}, "listeners and listen both"),
    ({"listeners": "PLAINTEXT://h:1", "advertise": "x:1"}, "give advertised_listeners"),
    ({"advertised_listeners": "PLAINTEXT://x:1"}, "with listen, give advertise"),
    ({"listeners": "PLAINTEXT://h:1", "advertised_listeners": "SSL://x:1"},
     "SSL is not in listeners"),
    ({"listeners": "SSL://h:1"}, "ssl_certificate_file: an SSL listener needs it"),
    ({"listeners": "SSL://h:1", "ssl_certificate_file": "c", "ssl_key_file": "k",
      "ssl_client_auth": "required"}, "ssl_ca_file: ssl_client_auth = required needs"),
    ({"ssl_client_auth": "maybe"}, "ssl_client_auth: one of none, requested, required"),
])
def test_a_bad_listener_is_refused_naming_what_is_wrong(overrides: dict[str, str],
                                                       refusal: str) -> None:
    with pytest.raises(SettingsError, match=refusal):
        load_settings(overrides=overrides, environ={})


def test_default_partitions_are_kafkas_unless_given(tmp_path: Path) -> None:
    config = tmp_path / "kiln.toml"
    config.write_text('default_partitions = "kafka"\n')

    unset = load_settings(environ={})
    from_file = load_settings(config, environ={})
    from_environment = load_settings(environ={"KILN_DEFAULT_PARTITIONS": "6"})

    # 0: the Kafka cluster's num.partitions (storage.catalog.KAFKA_DEFAULT)
    assert (unset.default_partitions, from_file.default_partitions,
            from_environment.default_partitions) == (0, 0, 6)
    with pytest.raises(SettingsError, match="default_partitions: must be >= 0"):
        load_settings(environ={"KILN_DEFAULT_PARTITIONS": "-1"})


@pytest.mark.parametrize(("listen", "http"), [
    ("127.0.0.1:9092", ("127.0.0.1", 9644)),  # the documented default pair
    # a second node on the host: the next port; on loopback, whatever the Kafka host
    ("0.0.0.0:9093", ("127.0.0.1", 9645)),
    ("10.1.2.3:9092", ("127.0.0.1", 9644)),
    ("127.0.0.1:0", ("127.0.0.1", 0)),  # any free port, as the Kafka listener
    ("127.0.0.1:65000", ("127.0.0.1", 0)),  # + 552 is no port: any free one
])
def test_http_listen_auto_follows_the_kafka_port(listen: str, http: tuple[str, int]) -> None:
    settings = load_settings(overrides={"listen": listen}, environ={})
    assert settings.http_listen == "auto"
    assert settings.http_address == http


def test_node_id_defaults_to_any_free_one_and_is_checked() -> None:
    assert load_settings(environ={}).node_id == -1
    assert load_settings(environ={"KILN_NODE_ID": "3"}).node_id == 3
    with pytest.raises(SettingsError, match="node_id: must be >= 0, or -1"):
        load_settings(overrides={"node_id": -2}, environ={})
    with pytest.raises(SettingsError, match="node_heartbeat_ms: must be >= 1 and below"):
        load_settings(overrides={"node_heartbeat_ms": 3000, "node_session_timeout_ms": 3000},
                      environ={})
