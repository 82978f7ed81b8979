"""Envoy's rate limit protocol from a client no one here wrote: grpcio with the compiled
protos of the xds-protos package. Reads a JSON list of requests on stdin, calls
ShouldRateLimit for each, prints one JSON answer per line.

A request: {"domain": d, "descriptors": [{"entries": [[k, v], ...], "hits_addend": n?,
"limit": [requests_per_unit, "MINUTE"]?}], "hits_addend": n?}.
"""
import json
import sys
import time

import grpc
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc


def request_of(spec):
    request = rls_pb2.RateLimitRequest(domain=spec["domain"], hits_addend=spec.get("hits_addend", 0))
    for d in spec["descriptors"]:
        descriptor = request.descriptors.add()
        for key, value in d["entries"]:
            descriptor.entries.add(key=key, value=value)
        if "hits_addend" in d:
            descriptor.hits_addend.value = d["hits_addend"]
        if "limit" in d:
            descriptor.limit.requests_per_unit = d["limit"][0]
            descriptor.limit.unit = rls_pb2.RateLimitResponse.RateLimit.Unit.Value(d["limit"][1])
    return request


def answer_of(response):
    Code = rls_pb2.RateLimitResponse.Code
    Unit = rls_pb2.RateLimitResponse.RateLimit.Unit
    statuses = []
    for s in response.statuses:
        status = {"code": Code.Name(s.code), "remaining": s.limit_remaining}
        if s.HasField("current_limit"):
            status["limit"] = [s.current_limit.requests_per_unit, Unit.Name(s.current_limit.unit)]
        if s.HasField("duration_until_reset"):
            status["reset"] = s.duration_until_reset.seconds
        statuses.append(status)
    headers = {h.key: h.value for h in response.response_headers_to_add}
    return {"overall": Code.Name(response.overall_code), "statuses": statuses,
            "headers": headers, "now": int(time.time())}


def main():
    address = sys.argv[1]
    specs = json.load(sys.stdin)
    with grpc.insecure_channel(address) as channel:
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        for spec in specs:
            try:
                print(json.dumps(answer_of(stub.ShouldRateLimit(request_of(spec), timeout=5))))
            except grpc.RpcError as e:
                print(json.dumps({"error": e.code().name}))


if __name__ == "__main__":
    main()
