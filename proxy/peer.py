"""The address of the client whose request is being handled, as Kafka reports it
(`client_host` in DescribeGroups, e.g. "/127.0.0.1"). Set once per connection task."""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

CLIENT_HOST: ContextVar[str] = ContextVar("kiln_client_host", default="")
# The name of the Kafka listener the connection came in on ("": the first one): brokers are
# given to it at their addresses on that listener.
LISTENER_NAME: ContextVar[str] = ContextVar("kiln_listener_name", default="")


def client_host_of(peername: Any) -> str:
    if isinstance(peername, tuple) and peername:
        return f"/{peername[0]}"
    return ""
