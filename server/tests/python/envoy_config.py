"""Reads server/examples/envoy.yaml as Envoy's own configuration types
(xds-protos' generated Bootstrap, every typed_config resolved, an unknown
field refused), and checks that it asks what the example configuration
serves: the rate-limit filter enabled before the router, on the routes'
stage, in its domain; every route limited, and each descriptor its
actions make a rule path of the configuration (keys and fixed values, in
order, the headers read being the ones the comments name); the service's
default gRPC address over HTTP/2. Envoy's own field rules (required fields,
lengths) are not applied. Exits non-zero, saying why, otherwise.

    python3 envoy_config.py <envoy.yaml> <ratelimit.yaml>
"""

import sys

import yaml
from google.protobuf import json_format

# Importing the modules registers the types every "@type" names.
from envoy.config.bootstrap.v3 import bootstrap_pb2
from envoy.config.core.v3 import config_source_pb2
from envoy.extensions.filters.http.ratelimit.v3 import rate_limit_pb2
from envoy.extensions.filters.http.router.v3 import router_pb2  # noqa: F401
from envoy.extensions.filters.network.http_connection_manager.v3 import (
    http_connection_manager_pb2,
)
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2

# The header each descriptor key is read from.
HEADERS = {"tenant": "x-tenant", "plan": "x-plan"}


def refuse(why):
    sys.exit(f"envoy.yaml: {why}")


def unpacked(any_message, message_type):
    message = message_type()
    if not any_message.Unpack(message):
        refuse(f"{any_message.type_url} is not {message_type.DESCRIPTOR.full_name}")
    return message


def one(items, what):
    if len(items) != 1:
        refuse(f"one {what} expected, found {len(items)}")
    return items[0]


def entry(action):
    """The (key, value) an action makes; value None when the request's."""
    kind = action.WhichOneof("action_specifier")
    if kind == "remote_address":
        return ("remote_address", None)
    if kind == "generic_key":
        return (action.generic_key.descriptor_key, action.generic_key.descriptor_value)
    if kind == "request_headers":
        key = action.request_headers.descriptor_key
        if HEADERS.get(key) != action.request_headers.header_name:
            refuse(f"{key!r} read from {action.request_headers.header_name!r}")
        return (key, None)
    refuse(f"an action this check does not read: {kind}")


def matched(served, entries):
    """Whether `entries` walk a rule path of the served descriptors."""
    level = served["descriptors"]
    for key, value in entries:
        rules = [
            rule
            for rule in level
            if rule["key"] == key and (value is None or rule.get("value") == value)
        ]
        if not rules:
            return False
        level = [child for rule in rules for child in rule.get("descriptors") or []]
    return True


def main(envoy_path, ratelimit_path):
    with open(envoy_path) as envoy_file:
        bootstrap = json_format.ParseDict(yaml.safe_load(envoy_file), bootstrap_pb2.Bootstrap())
    with open(ratelimit_path) as ratelimit_file:
        served = yaml.safe_load(ratelimit_file)

    listener = one(bootstrap.static_resources.listeners, "listener")
    chain = one(listener.filter_chains, "filter chain")
    manager = unpacked(
        one(chain.filters, "network filter").typed_config,
        http_connection_manager_pb2.HttpConnectionManager,
    )
    if not manager.use_remote_address.value:
        refuse("remote_address would be the client's own X-Forwarded-For")
    names = [entry.name for entry in manager.http_filters]
    if names != ["envoy.filters.http.ratelimit", "envoy.filters.http.router"]:
        refuse(f"the rate-limit filter must come just before the router: {names}")
    if manager.http_filters[0].disabled:
        refuse("the rate-limit filter is disabled")
    ratelimit = unpacked(manager.http_filters[0].typed_config, rate_limit_pb2.RateLimit)
    if ratelimit.domain != served["domain"]:
        refuse(f"domain {ratelimit.domain!r}, served {served['domain']!r}")
    if ratelimit.request_type not in ("", "both"):
        refuse(f"only {ratelimit.request_type} requests limited")
    service = ratelimit.rate_limit_service
    if service.transport_api_version != config_source_pb2.ApiVersion.V3:
        refuse("the service speaks RLS v3")

    keys = set()
    for host in manager.route_config.virtual_hosts:
        if host.rate_limits:
            refuse(f"virtual host {host.name}: limits belong to its routes")
        for route in host.routes:
            if not route.route.rate_limits:
                refuse(f"a route without rate_limits: {json_format.MessageToDict(route.match)}")
            for limit in route.route.rate_limits:
                if limit.stage.value != ratelimit.stage or limit.disable_key:
                    refuse(
                        f"a rate limit on stage {limit.stage.value} (the filter's: "
                        f"{ratelimit.stage}) or with a disable key, which the filter may skip"
                    )
                entries = [entry(action) for action in limit.actions]
                if not matched(served, entries):
                    refuse(f"descriptor {entries} matches no rule of the configuration")
                keys.update(key for key, _ in entries)
    served_keys = {rule["key"] for rule in served["descriptors"]}
    if keys != served_keys:
        refuse(f"descriptor keys {sorted(keys)}, served {sorted(served_keys)}")

    clusters = {cluster.name: cluster for cluster in bootstrap.static_resources.clusters}
    cluster_name = service.grpc_service.envoy_grpc.cluster_name
    if cluster_name not in clusters:
        refuse(f"no cluster {cluster_name!r}")
    cluster = clusters[cluster_name]
    options = unpacked(
        cluster.typed_extension_protocol_options[
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
        ],
        http_protocol_options_pb2.HttpProtocolOptions,
    )
    if not options.explicit_http_config.HasField("http2_protocol_options"):
        refuse("gRPC needs HTTP/2 to the service")
    endpoint = one(
        one(cluster.load_assignment.endpoints, "locality").lb_endpoints, "endpoint"
    ).endpoint
    address = endpoint.address.socket_address
    if (address.address, address.port_value) != ("127.0.0.1", 8081):
        refuse(
            f"the service listens on 127.0.0.1:8081, not "
            f"{address.address}:{address.port_value}"
        )
    print("ok")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
