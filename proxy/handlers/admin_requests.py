"""What the topic administration APIs (CreateTopics, CreatePartitions, DeleteTopics) check
alike in a request, as Apache Kafka's controller checks it."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

T = TypeVar("T")

DUPLICATE_NAME = "Duplicate topic name."


def given_twice(values: Iterable[T]) -> list[T]:
    """The values given more than once, in the order first given: Kafka refuses each once
    and serves none of their entries."""
    seen: set[T] = set()
    twice: dict[T, None] = {}
    for value in values:
        if value in seen:
            twice[value] = None
        seen.add(value)
    return list(twice)
