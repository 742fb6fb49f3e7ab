"""`--log-json`: one JSON object per line, with timestamp, level, logger, message, the
fields passed with `extra=` and the traceback of a logged exception."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator

import pytest

from cli import logs


@pytest.fixture
def json_lines() -> Iterator[io.StringIO]:
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    logs.configure("info", as_json=True)
    stream = io.StringIO()
    root.handlers[0].setStream(stream)  # type: ignore[attr-defined]
    yield stream
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])


def test_each_line_is_an_object_with_the_standard_fields_and_extras(
        json_lines: io.StringIO) -> None:
    logging.getLogger("kiln.test").warning("partition %s/%d paused", "orders", 3,
                                           extra={"topic": "orders", "partition": 3})

    entry = json.loads(json_lines.getvalue())

    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", entry.pop("timestamp"))
    assert entry == {"level": "warning", "logger": "kiln.test",
                     "message": "partition orders/3 paused", "topic": "orders",
                     "partition": 3}


def test_an_exception_carries_its_traceback_and_extras_are_json(
        json_lines: io.StringIO) -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("kiln.test").exception("failed", extra={"peer": ("10.0.0.1", 9)})
    logging.getLogger("kiln.test").debug("below the level")

    # (only this test's logger: a client thread another test left running may log too)
    lines = [line for line in json_lines.getvalue().splitlines()
             if json.loads(line)["logger"] == "kiln.test"]

    assert len(lines) == 1
    entry = json.loads(lines[0])
    assert entry["level"] == "error"
    assert entry["peer"] == ["10.0.0.1", 9]
    assert entry["exception"].startswith("Traceback")
    assert entry["exception"].endswith("RuntimeError: boom")
