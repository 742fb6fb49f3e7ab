"""SASL names in SCRAM and GS2 headers (RFC 5802 §5.1): `,` is sent as `=2C`, `=` as `=3D`.

Kafka's grammar (`ScramMessages.SASLNAME`, also `OAuthBearerClientInitialResponse`):
`(?:[\\x01-\\x7F&&[^=,]]|=2C|=3D)+`, so names are ASCII only, as in Kafka.
"""

from __future__ import annotations

import re

# Each alternative starts with a different character class, so matching is linear.
_SASLNAME = re.compile(r"(?:[\x01-\x2b\x2d-\x3c\x3e-\x7f]|=2C|=3D)+")
_ESCAPE = re.compile(r"=2C|=3D")


def is_saslname(value: str) -> bool:
    return _SASLNAME.fullmatch(value) is not None


def decode_saslname(value: str) -> str | None:
    """The name a saslname stands for, or None if `value` is not a saslname."""
    if not is_saslname(value):
        return None
    return _ESCAPE.sub(lambda m: "," if m.group() == "=2C" else "=", value)


def encode_saslname(name: str) -> str:
    return name.replace("=", "=3D").replace(",", "=2C")
