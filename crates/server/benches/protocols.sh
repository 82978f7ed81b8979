#!/usr/bin/env bash
# Decisions per second over gRPC, HTTP/JSON and RESP on the memory store, each beside the
# same server's trivial answer in the same run (gRPC: a domain with no config; HTTP:
# GET /health; RESP: PING). Needs wrk. Usage: crates/server/benches/protocols.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/../../.."
seconds=${1:-5}
# Two builds: with --example, cargo would build only the example, not the binary.
cargo build --release -q -p sluice-cli
cargo build --release -q -p sluice-server --example load
dir=$(mktemp -d)
trap 'kill "$pid" 2>/dev/null; rm -rf "$dir"' EXIT
mkdir "$dir/envoy"
cat >"$dir/envoy/bench.yaml" <<'YAML'
domain: bench
descriptors:
  - key: user
    rate_limit: { unit: second, requests_per_unit: 1000000 }
YAML
# A static body: wrk's per-request Lua generator costs more client CPU than the server
# spends deciding, which on a small machine would measure wrk. gRPC and RESP spread their
# hits over 10,000 users.
cat >"$dir/json.lua" <<'LUA'
wrk.method = "POST"
wrk.headers["content-type"] = "application/json"
wrk.body = '{"domain":"bench","descriptors":[{"entries":[{"key":"user","value":"u1"}]}]}'
LUA
"${CARGO_TARGET_DIR:-target}"/release/sluice serve --listen 127.0.0.1:0 --grpc-listen 127.0.0.1:0 \
    --resp-listen 127.0.0.1:0 --envoy-config "$dir/envoy" >"$dir/out" 2>/dev/null &
pid=$!
for _ in $(seq 50); do [[ $(wc -l <"$dir/out") -ge 3 ]] && break; sleep 0.1; done
http=$(awk '/sluice listening/ {print $NF}' "$dir/out")
grpc=$(awk '/grpc listening/ {print $NF}' "$dir/out")
resp=$(awk '/resp listening/ {print $NF}' "$dir/out")
load="${CARGO_TARGET_DIR:-target}"/release/examples/load
rate() { awk '{for (i = 1; i <= NF; i++) if ($i ~ /\/s$/) {sub("/s", "", $i); print $i}}'; }
wrk_rate() { awk '/Requests\/sec/ {print $2}'; }
ratio() { awk -v a="$2" -v b="$3" -v n="$1" 'BEGIN {printf "%s decisions=%.0f/s trivial=%.0f/s ratio=%.2f\n", n, a, b, a / b}'; }
for round in 1 2; do
    t=$($load grpc "$grpc" 16 "$seconds" trivial | rate)
    d=$($load grpc "$grpc" 16 "$seconds" check | rate)
    ratio "round=$round grpc" "$d" "$t"
    t=$(wrk -t1 -c64 -d"${seconds}s" "$http/health" | wrk_rate)
    d=$(wrk -t1 -c64 -d"${seconds}s" -s "$dir/json.lua" "$http/json" | wrk_rate)
    ratio "round=$round http_json" "$d" "$t"
    t=$($load resp "$resp" 64 "$seconds" ping | rate)
    d=$($load resp "$resp" 64 "$seconds" throttle | rate)
    ratio "round=$round resp" "$d" "$t"
done
