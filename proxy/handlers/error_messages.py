"""Error messages as they go into answers.

A message may quote what the client sent (a topic or broker name) or what Kafka answered,
and a quoted name alone can take a string field's whole 32767 bytes (the limit of the
int16-length strings of non-flexible versions): the answer could then not be encoded, and
the client would get UNKNOWN_SERVER_ERROR instead of the refusal. The message is free text
(the error code carries the meaning), so it is cut instead."""

from __future__ import annotations

MAX_MESSAGE_CHARS = 1000
_CUT = "..."


def bounded(message: str | None) -> str | None:
    """`message`, cut to at most MAX_MESSAGE_CHARS characters (4000 UTF-8 bytes)."""
    if message is None or len(message) <= MAX_MESSAGE_CHARS:
        return message
    return message[:MAX_MESSAGE_CHARS - len(_CUT)] + _CUT
