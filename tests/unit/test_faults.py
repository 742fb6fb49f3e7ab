"""Crash points are armed only by a well-formed `crash_at` setting."""

from __future__ import annotations

import pytest

from cli.settings import SettingsError, load_settings
from storage.faults import parse_crash_at


@pytest.mark.parametrize(("spec", "armed"), [
    ("", None), ("lane.committed", ("lane.committed", 1)), ("txn.marked:3", ("txn.marked", 3)),
])
def test_a_crash_point_is_named_with_the_passage_that_ends_the_process(
        spec: str, armed: tuple[str, int] | None) -> None:
    assert parse_crash_at(spec) == armed


@pytest.mark.parametrize("spec", [":2", "txn.marked:0", "txn.marked:x", "txn.marked:-1"])
def test_a_malformed_crash_point_is_refused_at_start(spec: str) -> None:
    with pytest.raises(SettingsError, match="crash_at"):
        load_settings(environ={"KILN_CRASH_AT": spec})
