"""Reads server/examples/envoy.yaml as Envoy's own configuration types
(xds-protos' generated Bootstrap, every typed_config resolved), and checks
that it asks the service the example configuration serves: its domain, the
descriptor keys its rules match, and the service's default gRPC address
over HTTP/2. Exits non-zero, saying why, otherwise.

    python3 envoy_config.py <envoy.yaml> <ratelimit.yaml>
"""

import sys

import yaml
from google.protobuf import json_format

# Importing the modules registers the types every "@type" names.
from envoy.config.bootstrap.v3 import bootstrap_pb2
from envoy.extensions.filters.http.ratelimit.v3 import rate_limit_pb2
from envoy.extensions.filters.http.router.v3 import router_pb2  # noqa: F401
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2,
)
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2


def unpacked(any_message, message_type):
    message = message_type()
    if not any_message.Unpack(message):
        sys.exit(f"{any_message.type_url} is not {message_type.DESCRIPTOR.full_name}")
    return message


def main(envoy_path, ratelimit_path):
    with open(envoy_path) as envoy_file:
        # ignore_unknown_fields=False: a misspelt field fails here.
        bootstrap = json_format.ParseDict(yaml.safe_load(envoy_file), bootstrap_pb2.Bootstrap())
    with open(ratelimit_path) as ratelimit_file:
        served = yaml.safe_load(ratelimit_file)
    served_keys = {descriptor["key"] for descriptor in served["descriptors"]}

    (listener,) = bootstrap.static_resources.listeners
    (manager,) = listener.filter_chains[0].filters
    manager = unpacked(
        manager.typed_config, http_connection_manager_pb2.HttpConnectionManager
    )
    filters = [entry.name for entry in manager.http_filters]
    if filters != ["envoy.filters.http.ratelimit", "envoy.filters.http.router"]:
        sys.exit(f"the rate-limit filter must come before the router: {filters}")
    ratelimit = unpacked(manager.http_filters[0].typed_config, rate_limit_pb2.RateLimit)
    if ratelimit.domain != served["domain"]:
        sys.exit(f"domain {ratelimit.domain!r}, served {served['domain']!r}")
    service = ratelimit.rate_limit_service
    if service.transport_api_version != 2:  # V3
        sys.exit("the service speaks v3")
    cluster_name = service.grpc_service.envoy_grpc.cluster_name

    keys = set()
    for host in manager.route_config.virtual_hosts:
        for route in host.routes:
            for limit in route.route.rate_limits:
                for action in limit.actions:
                    kind = action.WhichOneof("action_specifier")
                    if kind == "remote_address":
                        keys.add("remote_address")
                    elif kind == "request_headers":
                        keys.add(action.request_headers.descriptor_key)
                    else:
                        sys.exit(f"an action this check does not read: {kind}")
    if keys != served_keys:
        sys.exit(f"descriptor keys {sorted(keys)}, served {sorted(served_keys)}")

    clusters = {cluster.name: cluster for cluster in bootstrap.static_resources.clusters}
    if cluster_name not in clusters:
        sys.exit(f"no cluster {cluster_name!r}")
    cluster = clusters[cluster_name]
    options = unpacked(
        cluster.typed_extension_protocol_options[
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
        ],
        http_protocol_options_pb2.HttpProtocolOptions,
    )
    if not options.explicit_http_config.HasField("http2_protocol_options"):
        sys.exit("gRPC needs HTTP/2 to the service")
    endpoint = cluster.load_assignment.endpoints[0].lb_endpoints[0].endpoint
    address = endpoint.address.socket_address
    if (address.address, address.port_value) != ("127.0.0.1", 8081):
        sys.exit(
            f"the service listens on 127.0.0.1:8081, not "
            f"{address.address}:{address.port_value}"
        )
    print("ok")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
