"""Calls tollgate-server as Envoy does, from outside the project: Envoy's
generated stubs (the xds-protos package) over grpcio.

    python3 rls_client.py ADDRESS

Sends the requests the Rust test names and prints one JSON line each: the
overall code and every status's fields, or the gRPC error's code and
details.
"""

import json
import sys

import grpc
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from google.protobuf import wrappers_pb2


def descriptor(entries, hits_addend=None, limit=None):
    built = ratelimit_pb2.RateLimitDescriptor(
        entries=[
            ratelimit_pb2.RateLimitDescriptor.Entry(key=key, value=value)
            for key, value in entries
        ]
    )
    if hits_addend is not None:
        built.hits_addend.CopyFrom(wrappers_pb2.UInt64Value(value=hits_addend))
    if limit is not None:
        requests, unit = limit
        built.limit.CopyFrom(
            ratelimit_pb2.RateLimitDescriptor.RateLimitOverride(
                requests_per_unit=requests,
                unit=rls_pb2.RateLimitResponse.RateLimit.Unit.Value(unit),
            )
        )
    return built


def ask(stub, domain, descriptors, hits_addend=0):
    request = rls_pb2.RateLimitRequest(
        domain=domain, descriptors=descriptors, hits_addend=hits_addend
    )
    try:
        response = stub.ShouldRateLimit(request, timeout=10)
    except grpc.RpcError as error:
        return {"error": error.code().name, "details": error.details()}
    return {
        "overall": rls_pb2.RateLimitResponse.Code.Name(response.overall_code),
        "statuses": [
            {
                "code": rls_pb2.RateLimitResponse.Code.Name(status.code),
                "limit": (
                    [
                        status.current_limit.name,
                        status.current_limit.requests_per_unit,
                        rls_pb2.RateLimitResponse.RateLimit.Unit.Name(
                            status.current_limit.unit
                        ),
                    ]
                    if status.HasField("current_limit")
                    else None
                ),
                "remaining": status.limit_remaining,
                "has_reset": status.HasField("duration_until_reset"),
            }
            for status in response.statuses
        ],
    }


def main():
    address = sys.argv[1]
    with grpc.insecure_channel(address) as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        calls = [
            ("shop", [descriptor([("remote_address", "py")])], 0),
            ("shop", [descriptor([("remote_address", "py")])], 2),
            ("shop", [descriptor([("remote_address", "py")])], 0),
            (
                "shop",
                [descriptor([("tenant", "py")]), descriptor([("remote_address", "py")])],
                0,
            ),
            ("shop", [descriptor([("tenant", "py")], hits_addend=0)], 0),
            ("shop", [descriptor([("x", "y")], limit=(1, "DAY"))], 0),
            ("shop", [descriptor([("x", "y")], limit=(1, "DAY"))], 0),
            ("", [descriptor([("k", "v")])], 0),
        ]
        for domain, descriptors, hits_addend in calls:
            print(json.dumps(ask(stub, domain, descriptors, hits_addend)), flush=True)


if __name__ == "__main__":
    main()
