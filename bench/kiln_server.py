"""`kiln serve` for the benchmarks, with one compatibility patch applied only when needed.

    python -m bench.kiln_server serve --listen HOST:PORT --redis-url URL ...

Same command line as the `kiln` entry point (it calls `cli.main.main`). librdkafka 2.x
(confluent-kafka) enables message format v2 only when the broker's ApiVersions answer lists
Produce v3+ *and* Fetch v4+; otherwise it falls back to magic-0 message sets, which Kiln
refuses (UNSUPPORTED_FOR_MESSAGE_FORMAT, error 43, for every record). Kiln serves no Fetch,
so while its ApiVersions answer lacks Fetch this module adds the entry `Fetch 4..12` to that
answer and changes nothing else: no Fetch handler is added, and producers never send one.
When Kiln's own answer already lists Fetch, the patch does nothing.

The benchmark records whether the patch was in effect (`kiln_api_versions_patch`).
"""

from __future__ import annotations

import sys
from typing import Any

FETCH = 1
PATCH_ENTRY = (FETCH, 4, 12)


def kiln_lists_fetch() -> bool:
    """True when Kiln's own ApiVersions answer already lists Fetch."""
    from proxy.protocol.errors import ErrorCode
    from proxy.server.handlers import api_versions

    body = api_versions._body(0, ErrorCode.NONE)
    return any(int(e.api_key) == FETCH for e in body.api_keys)


def install() -> bool:
    """Patch Kiln's ApiVersions answer if it lacks Fetch; True when patched."""
    from proxy.server.handlers import api_versions

    if kiln_lists_fetch():
        return False
    original = api_versions._body
    entry = api_versions._SPEC.response.ApiVersion

    def body_with_fetch(version: int, error_code: Any) -> Any:
        body = original(version, error_code)
        if not any(int(e.api_key) == FETCH for e in body.api_keys):
            key, lo, hi = PATCH_ENTRY
            body.api_keys.append(entry(api_key=key, min_version=lo, max_version=hi))
            body.api_keys.sort(key=lambda e: int(e.api_key))
        return body

    api_versions._body = body_with_fetch
    return True


def main() -> None:
    if "--no-patch" in sys.argv:
        sys.argv.remove("--no-patch")
    elif install():
        print("bench.kiln_server: ApiVersions patched to list Fetch 4..12 "
              "(librdkafka needs it for message format v2)", file=sys.stderr, flush=True)
    from cli.main import main as kiln_main

    kiln_main(prog_name="kiln")


if __name__ == "__main__":
    main()
