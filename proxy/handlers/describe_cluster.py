"""DescribeCluster: the cluster as Metadata shows it — Kiln's node the only broker and the
controller, under the cluster id Metadata reports. Kiln is reached as a broker: asked for the
controllers (endpoint type 2, v1+) it answers MISMATCHED_ENDPOINT_TYPE, for a type it does
not know UNSUPPORTED_ENDPOINT_TYPE, as a Kafka broker does. Kiln authorizes nothing, so it
computes no authorized operations: the field reads "not provided" (Integer.MIN_VALUE), as it
does in Kiln's DescribeGroups answers."""

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
    settings = ctx.settings
    return _RESP[request.header.request_api_version](
        throttle_time_ms=0, error_code=ErrorCode.NONE, error_message=None,
        endpoint_type=_BROKERS_ENDPOINT, cluster_id=settings.cluster_id,
        controller_id=settings.node_id,
        brokers=[_BROKER(broker_id=settings.node_id, host=settings.advertised_host,
                         port=settings.advertised_port, rack=None, is_fenced=False)],
        authorized_operations=None)


def _refusal(request: Request, code: ErrorCode, message: str | None) -> Message:
    return _RESP[request.header.request_api_version](
        throttle_time_ms=0, error_code=int(code), error_message=message,
        endpoint_type=_BROKERS_ENDPOINT, cluster_id="", controller_id=-1, brokers=[],
        authorized_operations=None)


def error_response(request: Request, code: ErrorCode) -> Message:
    return _refusal(request, code, None)
