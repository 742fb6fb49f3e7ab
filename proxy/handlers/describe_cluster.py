"""DescribeCluster: the cluster as Metadata shows it — the live Kiln nodes the brokers, the
lowest node id the controller, under the cluster id Metadata reports. Kiln is reached as a
broker: asked for the controllers (endpoint type 2, v1+) it answers MISMATCHED_ENDPOINT_TYPE,
for a type it does not know UNSUPPORTED_ENDPOINT_TYPE, as a Kafka broker does. Kiln
authorizes nothing, so it computes no authorized operations: the field reads "not provided"
(Integer.MIN_VALUE), as it does in Kiln's DescribeGroups answers."""

from __future__ import annotations

from proxy.context import KilnContext
from wire.apis import CLIENT_APIS, ApiKey, Message, Request
from wire.errors import ErrorCode

_RESP = CLIENT_APIS[ApiKey.DESCRIBE_CLUSTER].response
_BROKER = _RESP.DescribeClusterBroker
_BROKERS_ENDPOINT = 1
_CONTROLLERS_ENDPOINT = 2


async def handle(ctx: KilnContext, request: Request) -> Message:
    endpoint_type = getattr(request.body, "endpoint_type", _BROKERS_ENDPOINT)  # v1+
    if endpoint_type == _CONTROLLERS_ENDPOINT:
        return _refusal(request, ErrorCode.MISMATCHED_ENDPOINT_TYPE,
                        "The request was sent to an endpoint of type BROKER, but we wanted "
                        "an endpoint of type CONTROLLER")
    if endpoint_type != _BROKERS_ENDPOINT:
        return _refusal(request, ErrorCode.UNSUPPORTED_ENDPOINT_TYPE,
                        f"Unsupported endpoint type {endpoint_type}")
    brokers = ctx.brokers()
    return _RESP[request.header.request_api_version](
        throttle_time_ms=0, error_code=ErrorCode.NONE, error_message=None,
        endpoint_type=_BROKERS_ENDPOINT, cluster_id=ctx.settings.cluster_id,
        controller_id=min(brokers),
        brokers=[_BROKER(broker_id=node, host=host, port=port, rack=None, is_fenced=False)
                 for node, (host, port) in brokers.items()],
        authorized_operations=None)


def _refusal(request: Request, code: ErrorCode, message: str | None) -> Message:
    return _RESP[request.header.request_api_version](
        throttle_time_ms=0, error_code=int(code), error_message=message,
        endpoint_type=_BROKERS_ENDPOINT, cluster_id="", controller_id=-1, brokers=[],
        authorized_operations=None)


def error_response(request: Request, code: ErrorCode) -> Message:
    return _refusal(request, code, None)
