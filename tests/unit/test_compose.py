"""compose/docker-compose.yml, checked where no Docker engine runs: against the Compose
Specification's JSON schema (the copy check-jsonschema ships, vendored from
compose-spec/compose-spec), and for the things the schema cannot know — that Kiln's
variables are real settings with valid values, the Dockerfiles copy files that exist, ports
and addresses agree, and the Spark job's script and connector match this repository."""

from __future__ import annotations

import base64
import json
import re
import shlex
import tomllib
from dataclasses import fields
from importlib import resources
from pathlib import Path, PurePosixPath
from typing import Any

import click
import jsonschema
import pytest
import yaml

from cli.main import main
from cli.settings import Settings, load_settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_DIR = ROOT / "compose"
COMPOSE_FILE = COMPOSE_DIR / "docker-compose.yml"
KILN_SERVICES = ("kiln", "topics")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text())
    return document


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = compose["services"]
    return found


def compose_schema() -> dict[str, Any]:
    vendored = resources.files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json"
    schema: dict[str, Any] = json.loads(vendored.read_text(encoding="utf-8"))
    return schema


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {key: str(value) for key, value in env.items()}


def published(service: dict[str, Any]) -> dict[int, int]:
    """Container port -> host port, from "HOST:CONTAINER" entries."""
    ports = {}
    for entry in service.get("ports", []):
        host, container = str(entry).rsplit(":", 1)
        ports[int(container)] = int(host.rsplit(":", 1)[-1])
    return ports


def port_of(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


class Dockerfile:
    """The few instructions these checks need: WORKDIR and COPY (sources, destination)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.copies: list[tuple[list[str], PurePosixPath]] = []
        self.entrypoint: list[str] = []
        workdir = PurePosixPath("/")
        text = re.sub(r"\\\n", " ", path.read_text())
        for line in text.splitlines():
            words = shlex.split(line, comments=True)
            if not words:
                continue
            instruction, args = words[0].upper(), [w for w in words[1:]
                                                   if not w.startswith("--")]
            if instruction == "WORKDIR":
                workdir = workdir / args[0]
            elif instruction == "COPY":
                self.copies.append((args[:-1], workdir / args[-1]))
            elif instruction == "ENTRYPOINT":
                self.entrypoint = json.loads(line.split(None, 1)[1])

    def source_of(self, container_path: str) -> Path | None:
        """The file of the build context that lands at `container_path`, if one does."""
        wanted = PurePosixPath(container_path)
        for sources, destination in self.copies:
            for source in sources:
                target = destination if len(sources) == 1 else destination / source
                if wanted == target or target in wanted.parents:
                    return Path(source) / wanted.relative_to(target)
        return None


def build_of(service: dict[str, Any]) -> tuple[Path, Dockerfile]:
    context = (COMPOSE_DIR / service["build"]["context"]).resolve()
    return context, Dockerfile(context / service["build"]["dockerfile"])


def dockerignored(context: Path) -> list[str]:
    ignore = context / ".dockerignore"
    lines = ignore.read_text().splitlines() if ignore.exists() else []
    return [line.strip().rstrip("/") for line in lines
            if line.strip() and not line.startswith("#")]


# --- the Compose Specification ------------------------------------------------------------


def test_the_file_is_valid_under_the_compose_specification(compose: dict[str, Any]) -> None:
    schema = compose_schema()
    validator_class = jsonschema.validators.validator_for(schema)
    validator_class.check_schema(schema)

    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
              for e in validator_class(schema).iter_errors(compose)]

    assert errors == []


def test_the_schema_check_catches_a_mistake(compose: dict[str, Any]) -> None:
    """The check above can fail: a misspelt key and a wrong depends_on condition do."""
    broken = json.loads(json.dumps(compose))
    broken["services"]["kiln"]["helthcheck"] = broken["services"]["kiln"].pop("healthcheck")
    broken["services"]["kiln"]["depends_on"]["redis"]["condition"] = "service_ready"
    schema = compose_schema()

    errors = list(jsonschema.validators.validator_for(schema)(schema).iter_errors(broken))

    assert len(errors) >= 2


# --- what the schema cannot know -----------------------------------------------------------


def test_the_stack_has_its_services(services: dict[str, Any]) -> None:
    assert set(services) == {"redis", "kafka", "kiln", "topics", "spark"}
    assert services["kafka"]["image"].startswith("apache/kafka:")
    assert services["redis"]["image"].startswith("redis:")


@pytest.mark.parametrize("name", KILN_SERVICES)
def test_kiln_variables_are_settings_with_valid_values(services: dict[str, Any],
                                                       name: str) -> None:
    env = environment(services[name])
    keys = {f"KILN_{f.name.upper()}" for f in fields(Settings)}

    assert env and set(env) <= keys, set(env) - keys
    settings = load_settings(environ=env)  # raises SettingsError naming a bad value
    assert settings.redis_url == "redis://redis:6379/0"
    assert settings.kafka_bootstrap == "kafka:9092"


def test_the_images_copy_only_what_exists_and_is_not_ignored(services: dict[str, Any]) -> None:
    for name, service in services.items():
        if "build" not in service:
            continue
        context, dockerfile = build_of(service)
        ignored = dockerignored(context)
        assert dockerfile.path.is_file(), name
        assert dockerfile.copies, name
        for sources, _ in dockerfile.copies:
            for source in sources:
                assert (context / source).exists(), f"{name}: COPY {source}"
                assert source.split("/")[0] not in ignored, f"{name}: {source} is ignored"


def test_the_kiln_image_runs_kiln_and_the_topics_job_is_a_kiln_command(
        services: dict[str, Any]) -> None:
    _, dockerfile = build_of(services["kiln"])
    assert dockerfile.entrypoint == ["kiln"]
    assert services["topics"]["build"] == services["kiln"]["build"]

    command = list(services["topics"]["command"])
    group: click.Command = main
    context = click.Context(main, info_name="kiln")
    while isinstance(group, click.Group):
        name, found, command = group.resolve_command(context, command)
        assert found is not None, name
        group = found
    group.make_context("create", command, parent=context)  # raises on a bad option


def test_ports_and_addresses_agree(services: dict[str, Any]) -> None:
    kiln_env = environment(services["kiln"])
    kiln_ports = published(services["kiln"])
    kafka_env = environment(services["kafka"])
    kafka_listeners = kafka_env["KAFKA_ADVERTISED_LISTENERS"].split(",")

    # Clients reach Kiln where Metadata sends them: the advertised port is the published one.
    assert kiln_ports[port_of(kiln_env["KILN_LISTEN"])] == port_of(kiln_env["KILN_ADVERTISE"])
    assert port_of(kiln_env["KILN_HTTP_LISTEN"]) in kiln_ports
    assert "9644/readyz" in " ".join(services["kiln"]["healthcheck"]["test"])
    # Kiln's stores are services of this file, at addresses they listen on.
    assert kiln_env["KILN_REDIS_URL"].split("//")[1].split(":")[0] in services
    assert f"PLAINTEXT://{kiln_env['KILN_KAFKA_BOOTSTRAP']}" in kafka_listeners
    # The host's listener is the published port.
    external = next(a for a in kafka_listeners if a.startswith("EXTERNAL://"))
    assert published(services["kafka"]) == {port_of(external): port_of(external)}
    assert base64.urlsafe_b64decode(kafka_env["CLUSTER_ID"] + "==").__len__() == 16


def test_dependencies_wait_for_what_they_need(services: dict[str, Any]) -> None:
    for name, service in services.items():
        for dependency, condition in service.get("depends_on", {}).items():
            assert dependency in services, f"{name} -> {dependency}"
            if condition["condition"] == "service_healthy":
                assert "healthcheck" in services[dependency], f"{name} -> {dependency}"
            if condition["condition"] == "service_completed_successfully":
                assert services[dependency].get("restart") == "no", dependency
    assert set(services["kiln"]["depends_on"]) == {"redis", "kafka"}
    compile(services["kiln"]["healthcheck"]["test"][-1], "healthcheck", "exec")


def test_the_spark_job_is_this_repository_s_script_and_connector(
        services: dict[str, Any]) -> None:
    spark = services["spark"]
    command = list(spark["command"])
    script = next(arg for arg in command if arg.endswith(".py"))
    options = dict(zip(command[command.index(script) + 1::2],
                       command[command.index(script) + 2::2], strict=True))
    context, dockerfile = build_of(spark)
    pins = tomllib.loads((ROOT / "pyproject.toml").read_text())[
        "project"]["optional-dependencies"]["spark"]
    pyspark = next(pin.split("==")[1] for pin in pins if pin.startswith("pyspark=="))

    source = dockerfile.source_of(script)
    assert source == Path("spark_examples/hardened_stream.py")
    assert (context / source).is_file(), "spark_examples/hardened_stream.py is missing"
    assert command[0] == "spark-submit"
    assert command[command.index("--packages") + 1] == (
        f"org.apache.spark:spark-sql-kafka-0-10_2.13:{pyspark}")
    assert options["--bootstrap"] == environment(services["kiln"])["KILN_KAFKA_BOOTSTRAP"]
    assert options["--topic"] == services["topics"]["command"][2]
    assert {options["--output"], options["--checkpoint"]} <= {
        str(PurePosixPath("/data") / p) for p in ("events", "checkpoints/events")}
    assert any(volume.endswith(":/data") for volume in spark["volumes"])


def test_the_quick_start_uses_this_file_and_its_services(services: dict[str, Any]) -> None:
    readme = (COMPOSE_DIR / "README.md").read_text()
    used = set(re.findall(r"docker compose -f compose/docker-compose\.yml "
                          r"(?:exec|logs -f|logs) (\w+)", readme))

    assert "docker compose -f compose/docker-compose.yml up" in readme
    assert used and used <= set(services), used - set(services)
