"""Bodies of the KIP-848 consumer group APIs (ConsumerGroupHeartbeat, ConsumerGroupDescribe),
which kafka-python does not ship: the same generated codec, fed schemas of Kiln's own
(wire/schemas, written from the Kafka protocol guide)."""

from __future__ import annotations

import types
from typing import Any

from kafka.protocol.api_message import ApiMessage

from wire import schemas


def _message(name: str) -> Any:
    # kafka-python's metaclass reads the schema named after the class from `load_json`.
    return types.new_class(name, (ApiMessage,), {"load_json": schemas})


ConsumerGroupHeartbeatRequest = _message("ConsumerGroupHeartbeatRequest")
ConsumerGroupHeartbeatResponse = _message("ConsumerGroupHeartbeatResponse")
ConsumerGroupDescribeRequest = _message("ConsumerGroupDescribeRequest")
ConsumerGroupDescribeResponse = _message("ConsumerGroupDescribeResponse")
