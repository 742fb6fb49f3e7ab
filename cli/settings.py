"""Settings: defaults < a running `kiln dev` < TOML file < KILN_* environment variables <
command-line flags.

The only module that reads the environment. A wrong key, type or value is rejected at start
with a message that names it. While `kiln dev` runs, its Redis URL and Kafka bootstrap
replace the defaults (cli/dev_instance.py), so other commands find it without flags.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from cli import dev_instance
from proxy.limits import ListenerLimits
from storage.catalog import KAFKA_DEFAULT
from storage.faults import parse_crash_at
from storage.kafka.client import parse_bootstrap
from storage.nodes import AUTO_NODE_ID
from storage.redis_pool import (
    CLUSTER_SCHEME,
    SENTINEL_SCHEME,
    parse_cluster_url,
    parse_sentinel_url,
    redact_url,
)

_LISTENER = ListenerLimits()  # the listener's defaults are its own
HTTP_PORT_OFFSET = 552  # http_listen "auto": Kafka's 9092 serves HTTP on 9644


class SettingsError(ValueError):
    """A configuration problem, worded for the operator."""


@dataclass(frozen=True, slots=True)
class Settings:
    listen: str = "127.0.0.1:9092"
    advertise: str = ""  # defaults to `listen` (with 0.0.0.0 replaced by 127.0.0.1)
    # The Kafka listeners as on a Kafka broker, NAME://HOST:PORT,..., instead of `listen`:
    # each name's protocol, PLAINTEXT or SSL, from `listener_security_protocol_map` (the
    # protocol names map to themselves). "": PLAINTEXT://`listen`. `advertised_listeners`,
    # the same names: the addresses Metadata gives clients that came in on each (default:
    # the listener's own, 0.0.0.0 as 127.0.0.1).
    listeners: str = ""
    advertised_listeners: str = ""
    listener_security_protocol_map: str = ""
    # An SSL listener's certificate chain and private key (PEM), the file holding the key's
    # password if it is encrypted, and the CAs (PEM) client certificates are checked
    # against when `ssl_client_auth` is "requested" or "required" ("none": not asked for).
    ssl_certificate_file: str = ""
    ssl_key_file: str = ""
    ssl_key_password_file: str = ""
    ssl_ca_file: str = ""
    ssl_client_auth: str = "none"
    # A client that has not finished its TLS handshake by then is disconnected.
    tls_handshake_timeout_ms: int = 10_000
    # SASL listeners (docs/security-design.md): the mechanisms they offer (PLAIN,
    # SCRAM-SHA-256, SCRAM-SHA-512; users from `kiln users`); a connection must be
    # authenticated within `authentication_timeout_ms`, may send frames of at most
    # `max_preauth_frame_bytes` until then, and is closed
    # `failed_authentication_delay_ms` after a failed attempt.
    sasl_enabled_mechanisms: str = "SCRAM-SHA-256,SCRAM-SHA-512"
    authentication_timeout_ms: int = 10_000
    max_preauth_frame_bytes: int = 524_288
    failed_authentication_delay_ms: int = 100
    # HOST:PORT of the HTTP endpoints /metrics, /healthz and /readyz; "" turns them off;
    # "auto": on loopback (whatever the Kafka listener's host: the endpoints are for the
    # machine's own scraper unless an address says otherwise), at the Kafka port + 552
    # (9092: 9644, 9093: 9645; any free port for port 0 or past 65535), so that several
    # nodes on one host do not collide.
    http_listen: str = "auto"
    redis_url: str = "redis://127.0.0.1:6379/0"
    kafka_bootstrap: str = "127.0.0.1:9093"
    # The hardening delay (DESIGN §4): "adaptive" computes it from live signals within the
    # bounds and budgets below; "fixed" is `harden_delay_ms` always. The adaptive policy
    # waits `harden_delay_ms` for a subscribed topic until it has timed a delivery.
    delay_policy: str = "adaptive"
    harden_delay_ms: int = 2000
    min_delay_ms: int = 0
    max_delay_ms: int = 60_000
    # Acknowledged but not yet hardened: the adaptive delay keeps within these.
    risk_budget_bytes: int = 64 * 1024 * 1024
    risk_budget_records: int = 1_000_000
    # Senders x delay (seconds): more sending clients, shorter delay.
    sender_budget_s: int = 600
    # Producers waiting for hardening (acks=all) wait no longer than this.
    max_ack_delay_ms: int = 10_000
    buffer_budget_bytes: int = 512 * 1024 * 1024
    auto_create_topics: bool = True
    # Kafka transactions (docs/transactions-design.md); off: Kiln answers transactional
    # producers as a broker without a transaction coordinator (COORDINATOR_NOT_AVAILABLE).
    transactions_enabled: bool = True
    # Partitions of a topic created without a count (auto-created, CreateTopics asking for
    # the default, `kiln topics create` without --partitions); 0 (or "kafka"): as many as
    # the Kafka cluster behind Kiln gives one, its brokers' num.partitions.
    default_partitions: int = KAFKA_DEFAULT
    # The node's id, unique among live nodes (storage/nodes.py); -1: the id this address
    # had before, else the lowest free one.
    node_id: int = AUTO_NODE_ID
    # A node not heard from for this long is dead to the others.
    node_heartbeat_ms: int = 1_000
    node_session_timeout_ms: int = 3_000
    # `kiln serve` runs this many node processes on the machine (cli/workers.py); 0: one per
    # core.
    workers: int = 0
    max_frame_bytes: int = 100 * 1024 * 1024
    # What the Kafka listener may hold for its clients (proxy/limits.py).
    max_request_bytes: int = _LISTENER.max_request_bytes
    max_answer_bytes_per_connection: int = _LISTENER.max_answer_bytes_per_connection
    max_answer_bytes: int = _LISTENER.max_answer_bytes
    max_fetch_bytes: int = _LISTENER.max_fetch_bytes
    frame_read_timeout_ms: int = round(_LISTENER.frame_read_timeout_s * 1000)
    connections_max_idle_ms: int = round(_LISTENER.idle_timeout_s * 1000)
    max_connections: int = _LISTENER.max_connections
    max_connections_per_host: int = _LISTENER.max_connections_per_host
    log_level: str = "info"
    log_json: bool = False
    # Durable subscriptions registered at start: "TOPIC:GROUP,TOPIC:GROUP" (DESIGN §1).
    durable_subscriptions: str = ""
    # Consumer groups: how long a new group waits for more members before its first
    # rebalance completes (Kafka's group.initial.rebalance.delay.ms, 3 s there), and the
    # session timeouts members may ask for (Kafka's group.min/max.session.timeout.ms).
    group_initial_rebalance_delay_ms: int = 300
    group_min_session_timeout_ms: int = 6_000
    group_max_session_timeout_ms: int = 1_800_000
    # KIP-848 consumer groups (group.protocol=consumer): Kafka's
    # group.consumer.session.timeout.ms and group.consumer.heartbeat.interval.ms.
    group_consumer_session_timeout_ms: int = 45_000
    group_consumer_heartbeat_interval_ms: int = 5_000
    # For fault tests only: end the process at this crash point (storage/faults.py).
    crash_at: str = ""

    @property
    def subscriptions(self) -> list[tuple[str, str]]:
        return parse_subscriptions(self.durable_subscriptions)

    @property
    def shown_redis_url(self) -> str:
        """redis_url as logs and messages show it: without its password."""
        return redact_url(self.redis_url)

    @property
    def kafka_listeners(self) -> list[Listener]:
        """The Kafka listeners: `listeners`, else PLAINTEXT on `listen`."""
        if not self.listeners:
            return [Listener(PLAINTEXT, PLAINTEXT, *parse_host_port(self.listen, "listen"))]
        return parse_listeners(self.listeners,
                               parse_protocol_map(self.listener_security_protocol_map))

    @property
    def sasl_mechanisms(self) -> tuple[str, ...]:
        mechanisms = tuple(m.strip().upper() for m in self.sasl_enabled_mechanisms.split(",")
                           if m.strip())
        for mechanism in mechanisms:
            if mechanism in _LATER_MECHANISMS:
                raise SettingsError(f"sasl_enabled_mechanisms: {mechanism} is not built yet")
            if mechanism not in SASL_MECHANISMS:
                raise SettingsError(f"sasl_enabled_mechanisms: one of "
                                    f"{', '.join(SASL_MECHANISMS)}, got {mechanism!r}")
        return mechanisms

    @property
    def listener(self) -> Listener:
        """The first listener: its port places the HTTP endpoints and the workers."""
        return self.kafka_listeners[0]

    @property
    def listen_address(self) -> tuple[str, int]:
        listener = self.listener
        return listener.host, listener.port

    @property
    def advertised_listener_addresses(self) -> dict[str, tuple[str, int]]:
        """Per listener name, the address Metadata gives clients that came in on it."""
        own = {listener.name: (_reachable(listener.host), listener.port)
               for listener in self.kafka_listeners}
        if self.advertise:
            own[self.listener.name] = parse_host_port(self.advertise, "advertise")
        own.update(parse_advertised(self.advertised_listeners, own))
        return own

    @property
    def advertised_address(self) -> tuple[str, int]:
        """The first listener's advertised address: the node's own name for itself."""
        return self.advertised_listener_addresses[self.listener.name]

    @property
    def http_address(self) -> tuple[str, int] | None:
        if self.http_listen == "auto":
            _, port = self.listen_address
            fits = 0 < port <= 65535 - HTTP_PORT_OFFSET
            return "127.0.0.1", port + HTTP_PORT_OFFSET if fits else 0
        return parse_host_port(self.http_listen, "http_listen") if self.http_listen else None


PLAINTEXT = "PLAINTEXT"
SSL = "SSL"
SASL_PLAINTEXT = "SASL_PLAINTEXT"
SASL_SSL = "SASL_SSL"
_PROTOCOLS = (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL)
TLS_PROTOCOLS = (SSL, SASL_SSL)
SASL_PROTOCOLS = (SASL_PLAINTEXT, SASL_SSL)
SSL_CLIENT_AUTH = ("none", "requested", "required")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_LATER_MECHANISMS = ("OAUTHBEARER",)


@dataclass(frozen=True, slots=True)
class Listener:
    name: str  # as in `listeners`, upper case
    protocol: str  # PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.name}://{_host_port(self.host, self.port)}"


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _reachable(host: str) -> str:
    """A listener's host as clients are told it: every interface as loopback."""
    return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host


def _named_addresses(text: str, key: str) -> list[tuple[str, str, int]]:
    """NAME://HOST:PORT,... as (NAME, host, port), names upper case and each once."""
    out: list[tuple[str, str, int]] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, sep, address = item.partition("://")
        if not sep or not name:
            raise SettingsError(f"{key}: expected NAME://HOST:PORT, got {item!r}")
        if any(name.upper() == seen for seen, _, _ in out):
            raise SettingsError(f"{key}: {name.upper()} given twice")
        out.append((name.upper(), *parse_host_port(address, key)))
    return out


def parse_protocol_map(text: str) -> dict[str, str]:
    """`listener_security_protocol_map`: NAME:PROTOCOL,... (Kafka's syntax)."""
    mapping = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        name, sep, protocol = item.partition(":")
        if not sep or not name or not protocol:
            raise SettingsError("listener_security_protocol_map: expected NAME:PROTOCOL, got "
                                f"{item!r}")
        mapping[name.strip().upper()] = protocol.strip().upper()
    return mapping


def parse_listeners(text: str, protocols: Mapping[str, str]) -> list[Listener]:
    """`listeners` as Kafka writes it, each name's protocol from `protocols` (a protocol's
    own name stands for itself)."""
    listeners: list[Listener] = []
    for name, host, port in _named_addresses(text, "listeners"):
        protocol = protocols.get(name, name)
        if protocol not in _PROTOCOLS:
            raise SettingsError(f"listeners: {name} has no protocol: one of "
                                f"{', '.join(_PROTOCOLS)}, by its name or in "
                                "listener_security_protocol_map")
        taken = [other for other in listeners if (other.host, other.port) == (host, port)]
        if port and taken:
            raise SettingsError(f"listeners: {name} and {taken[0].name} both on "
                                f"{_host_port(host, port)}")
        listeners.append(Listener(name, protocol, host, port))
    if not listeners:
        raise SettingsError(f"listeners: expected NAME://HOST:PORT,..., got {text!r}")
    return listeners


def parse_advertised(text: str, listeners: Mapping[str, tuple[str, int]]
                     ) -> dict[str, tuple[str, int]]:
    """`advertised_listeners`: NAME://HOST:PORT,... for names among `listeners`."""
    advertised = {}
    for name, host, port in _named_addresses(text, "advertised_listeners"):
        if name not in listeners:
            raise SettingsError(f"advertised_listeners: {name} is not in listeners "
                                f"({', '.join(listeners)})")
        advertised[name] = (host, port)
    return advertised


_LOG_LEVELS = ("debug", "info", "warning", "error")
_DELAY_POLICIES = ("adaptive", "fixed")


def parse_host_port(text: str, key: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise SettingsError(f"{key}: expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def parse_subscriptions(text: str) -> list[tuple[str, str]]:
    """"orders:billing,orders:audit" -> [("orders", "billing"), ("orders", "audit")]; topic
    names cannot hold ':', so the first one splits topic from group."""
    pairs = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        topic, sep, group = item.partition(":")
        if not sep or not topic or not group:
            raise SettingsError(f"durable_subscriptions: expected TOPIC:GROUP, got {item!r}")
        pairs.append((topic, group))
    return pairs


# Keys whose value may be given as "kafka": take Kafka's own (KAFKA_DEFAULT).
_KAFKA_DEFAULTS = frozenset({"default_partitions"})


def _coerce(key: str, raw: Any, kind: type, source: str) -> Any:
    if key in _KAFKA_DEFAULTS and isinstance(raw, str) and raw.strip().lower() == "kafka":
        return KAFKA_DEFAULT
    if kind is bool:
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.lower() in ("1", "true", "yes", "on", "0", "false",
                                                     "no", "off"):
            return raw.lower() in ("1", "true", "yes", "on")
    elif kind is int:
        if isinstance(raw, int) and not isinstance(raw, bool):
            return raw
        if isinstance(raw, str):
            try:
                return int(raw.replace("_", ""))
            except ValueError:
                pass
    elif kind is str and isinstance(raw, str):
        return raw
    raise SettingsError(f"{key} ({source}): expected {kind.__name__}, got {raw!r}")


_TYPES: dict[str, type] = {f.name: {"int": int, "bool": bool, "str": str}[str(f.type)]
                           for f in fields(Settings)}


def _validate(settings: Settings) -> Settings:
    if settings.listeners and settings.listen != Settings().listen:
        raise SettingsError("listeners and listen both name the Kafka listener: give one")
    if settings.advertise and settings.listeners:
        raise SettingsError("advertise goes with listen; with listeners, give "
                            "advertised_listeners")
    if settings.advertised_listeners and not settings.listeners:
        raise SettingsError("advertised_listeners goes with listeners; with listen, give "
                            "advertise")
    settings.listen_address  # noqa: B018 - parses and raises on a bad value
    _validate_tls(settings)
    _validate_sasl(settings)
    settings.advertised_address  # noqa: B018
    settings.http_address  # noqa: B018
    try:
        parse_bootstrap(settings.kafka_bootstrap)
    except ValueError as exc:
        raise SettingsError(f"kafka_bootstrap: {exc}, got {settings.kafka_bootstrap!r}") from None
    parse = {SENTINEL_SCHEME: parse_sentinel_url, CLUSTER_SCHEME: parse_cluster_url}
    scheme = next((s for s in parse if settings.redis_url.startswith(s)), None)
    if scheme is not None:
        try:
            parse[scheme](settings.redis_url)
        except ValueError as exc:
            raise SettingsError(f"redis_url: {exc}, got {settings.shown_redis_url!r}") from None
    elif not settings.redis_url.startswith(("redis://", "rediss://", "unix://")):
        raise SettingsError(f"redis_url: expected redis://HOST:PORT/DB, "
                            f"{SENTINEL_SCHEME}HOST:PORT/SERVICE or "
                            f"{CLUSTER_SCHEME}HOST:PORT[,HOST:PORT...], "
                            f"got {settings.shown_redis_url!r}")
    if settings.node_id < AUTO_NODE_ID:
        raise SettingsError(f"node_id: must be >= 0, or -1 for any free id, got "
                            f"{settings.node_id}")
    if not 1 <= settings.node_heartbeat_ms < settings.node_session_timeout_ms:
        raise SettingsError("node_heartbeat_ms: must be >= 1 and below node_session_timeout_ms, "
                            f"got {settings.node_heartbeat_ms}")
    for key in ("harden_delay_ms", "buffer_budget_bytes", "min_delay_ms",
                "max_ack_delay_ms", "default_partitions", "workers"):
        if getattr(settings, key) < 0:
            raise SettingsError(f"{key}: must be >= 0, got {getattr(settings, key)}")
    for key in ("max_frame_bytes", "risk_budget_bytes",
                "risk_budget_records", "sender_budget_s", "max_request_bytes",
                "max_answer_bytes_per_connection", "max_answer_bytes", "max_fetch_bytes",
                "frame_read_timeout_ms", "connections_max_idle_ms", "max_connections",
                "max_connections_per_host"):
        if getattr(settings, key) < 1:
            raise SettingsError(f"{key}: must be >= 1, got {getattr(settings, key)}")
    settings.subscriptions  # noqa: B018
    if settings.delay_policy not in _DELAY_POLICIES:
        raise SettingsError(f"delay_policy: one of {', '.join(_DELAY_POLICIES)}, got "
                            f"{settings.delay_policy!r}")
    if settings.max_delay_ms < settings.min_delay_ms:
        raise SettingsError(f"max_delay_ms: must be >= min_delay_ms ({settings.min_delay_ms}), "
                            f"got {settings.max_delay_ms}")
    if settings.group_initial_rebalance_delay_ms < 0:
        raise SettingsError("group_initial_rebalance_delay_ms: must be >= 0, got "
                            f"{settings.group_initial_rebalance_delay_ms}")
    if settings.group_min_session_timeout_ms < 1:
        raise SettingsError("group_min_session_timeout_ms: must be >= 1, got "
                            f"{settings.group_min_session_timeout_ms}")
    if not 1 <= settings.group_consumer_heartbeat_interval_ms \
            < settings.group_consumer_session_timeout_ms:
        raise SettingsError("group_consumer_heartbeat_interval_ms: must be >= 1 and below "
                            "group_consumer_session_timeout_ms "
                            f"({settings.group_consumer_session_timeout_ms}), got "
                            f"{settings.group_consumer_heartbeat_interval_ms}")
    if settings.group_max_session_timeout_ms < settings.group_min_session_timeout_ms:
        raise SettingsError("group_max_session_timeout_ms: must be >= group_min_session_"
                            f"timeout_ms ({settings.group_min_session_timeout_ms}), got "
                            f"{settings.group_max_session_timeout_ms}")
    try:
        parse_crash_at(settings.crash_at)
    except ValueError as exc:
        raise SettingsError(f"crash_at: {exc}") from None
    if settings.log_level not in _LOG_LEVELS:
        raise SettingsError(f"log_level: one of {', '.join(_LOG_LEVELS)}, got "
                            f"{settings.log_level!r}")
    return settings


def _validate_sasl(settings: Settings) -> None:
    if not any(listener.protocol in SASL_PROTOCOLS for listener in settings.kafka_listeners):
        return
    if not settings.sasl_mechanisms:
        raise SettingsError("sasl_enabled_mechanisms: a SASL listener needs at least one")
    for key in ("authentication_timeout_ms", "max_preauth_frame_bytes"):
        if getattr(settings, key) < 1:
            raise SettingsError(f"{key}: must be >= 1, got {getattr(settings, key)}")
    if settings.failed_authentication_delay_ms < 0:
        raise SettingsError("failed_authentication_delay_ms: must be >= 0, got "
                            f"{settings.failed_authentication_delay_ms}")


def _validate_tls(settings: Settings) -> None:
    if settings.ssl_client_auth not in SSL_CLIENT_AUTH:
        raise SettingsError(f"ssl_client_auth: one of {', '.join(SSL_CLIENT_AUTH)}, got "
                            f"{settings.ssl_client_auth!r}")
    if settings.tls_handshake_timeout_ms < 1:
        raise SettingsError("tls_handshake_timeout_ms: must be >= 1, got "
                            f"{settings.tls_handshake_timeout_ms}")
    secure = [listener for listener in settings.kafka_listeners
              if listener.protocol in TLS_PROTOCOLS]
    if not secure:
        return
    for key in ("ssl_certificate_file", "ssl_key_file"):
        if not getattr(settings, key):
            raise SettingsError(f"{key}: an SSL listener needs it ({secure[0]})")
    if settings.ssl_client_auth != "none" and not settings.ssl_ca_file:
        raise SettingsError(f"ssl_ca_file: ssl_client_auth = {settings.ssl_client_auth} "
                            "needs the CAs client certificates are checked against")


def load_settings(config_file: Path | None = None, overrides: Mapping[str, Any] | None = None,
                  environ: Mapping[str, str] | None = None) -> Settings:
    env = os.environ if environ is None else environ
    state = dev_state_file(env)
    values: dict[str, Any] = dict(dev_instance.running(state)) if state else {}
    if config_file is not None:
        try:
            document = tomllib.loads(config_file.read_text())
        except OSError as exc:
            raise SettingsError(f"cannot read config file {config_file}: {exc}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise SettingsError(f"config file {config_file} is not valid TOML: {exc}") from exc
        section = document.get("kiln", document)
        for key, raw in section.items():
            if key not in _TYPES:
                known = ", ".join(sorted(_TYPES))
                raise SettingsError(f"unknown key {key!r} in {config_file} (known: {known})")
            values[key] = _coerce(key, raw, _TYPES[key], str(config_file))
    for key, kind in _TYPES.items():
        name = f"KILN_{key.upper()}"
        if name in env:
            values[key] = _coerce(key, env[name], kind, f"environment {name}")
    for key, raw in (overrides or {}).items():
        if raw is not None:
            values[key] = _coerce(key, raw, _TYPES[key], f"--{key.replace('_', '-')}")
    return _validate(dataclasses.replace(Settings(), **values))


def dev_state_file(environ: Mapping[str, str] | None = None) -> Path | None:
    """Where a running `kiln dev` records what it started ($XDG_STATE_HOME, or
    ~/.local/state); None when the environment names neither."""
    env = os.environ if environ is None else environ
    if env.get("XDG_STATE_HOME"):
        return dev_instance.state_file(Path(env["XDG_STATE_HOME"]))
    if env.get("HOME"):
        return dev_instance.state_file(Path(env["HOME"]) / ".local" / "state")
    return None
