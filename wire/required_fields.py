"""Nulls where a request's schema allows none: refused as Apache Kafka's parser refuses them.

kafka-python's generated decoder reads a length of -1 as None in any string, bytes or array
field, whatever the schema says; Kafka's broker refuses such a request as malformed ("non-
nullable field ... was serialized as null") and closes the connection. Without this check
the None reached the handlers, which then failed on it. The check walks only the fields that
can decode to None, with a plan made once per message and version."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from wire.errors import MalformedRequest

# Field types whose wire form has a null (-1 length); numbers, booleans and uuids have none.
_NULLABLE_KINDS = ("string", "bytes", "records")


@dataclass(frozen=True, slots=True)
class _Check:
    name: str
    nullable: bool
    # The plan for the entries of an array of structs, or of a nested struct.
    inner: tuple[_Check, ...] | None = None
    is_array: bool = False
    # An array whose entries are strings: none of them may be null either.
    strings: bool = False


def refuse_nulls(message_class: Any, version: int, body: Any, what: str,
                 correlation_id: int | None) -> None:
    """Raise MalformedRequest when `body` holds None where its schema allows no null."""
    _walk(body, _plan(message_class._struct, version), what, correlation_id)


def _walk(value: Any, plan: tuple[_Check, ...], what: str, correlation_id: int | None) -> None:
    for check in plan:
        field = getattr(value, check.name)
        if field is None:
            if check.nullable:
                continue
            raise MalformedRequest(f"{what}: non-nullable field {check.name} was serialized "
                                   "as null", correlation_id)
        if check.strings and any(entry is None for entry in field):
            raise MalformedRequest(f"{what}: a null in the string array {check.name}",
                                   correlation_id)
        if check.inner is not None:
            for entry in (field if check.is_array else (field,)):
                _walk(entry, check.inner, what, correlation_id)


# By the schema object's id: kafka-python's schema objects cannot be hashed, and they live as
# long as the process.
_PLANS: dict[tuple[int, int], tuple[_Check, ...]] = {}


def _plan(struct: Any, version: int) -> tuple[_Check, ...]:
    plan = _PLANS.get((id(struct), version))
    if plan is None:
        plan = _PLANS[(id(struct), version)] = _make_plan(struct, version)
    return plan


def _make_plan(struct: Any, version: int) -> tuple[_Check, ...]:
    checks = []
    for field in struct._fields:
        if not field.for_version_q(version) or field.tagged_field_q(version):
            continue
        nullable = bool(field.nullable_for_version_q(version))
        kind = field._type_str
        if field.is_struct_array():
            checks.append(_Check(field.name, nullable, _plan(field.array_of, version),
                                 is_array=True))
        elif field.is_array():
            checks.append(_Check(field.name, nullable, strings=kind == "[]string"))
        elif field.is_struct():
            checks.append(_Check(field.name, nullable, _plan(field, version)))
        elif kind in _NULLABLE_KINDS:
            checks.append(_Check(field.name, nullable))
    return tuple(checks)
