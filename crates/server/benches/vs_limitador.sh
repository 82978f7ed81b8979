#!/usr/bin/env bash
# Envoy's rate limit protocol (gRPC), sluice beside Limitador (Kuadrant's Rust rate limit
# service) in one run: 10,000 users on 1000/minute, driven by sluice's own load client
# (crates/server/examples/load.rs, 16 connections x 8 streams = 128 requests in flight),
# alternating servers round by round. Prints, per round and server: decisions per second,
# p50 and p99 latency, the server's CPU per decision (utime + stime from /proc/PID/stat),
# and on Redis the redis-server's CPU per decision.
#
# Limitador is not part of this repository: build it elsewhere and point LIMITADOR at the
# binary (github.com/Kuadrant/limitador, `cargo build --release -p limitador-server`).
#
#   LIMITADOR=/path/to/limitador-server crates/server/benches/vs_limitador.sh [ROUNDS] [SECONDS]
#
# Servers: `sluice` (default worker threads: one per core), `sluice-1` (`--threads 1`, as
# Limitador serves gRPC on one thread), `limitador`; on memory, then on one Redis.
set -euo pipefail
cd "$(dirname "$0")/../../.."
rounds=${1:-3}
seconds=${2:-5}
: "${LIMITADOR:?set LIMITADOR to a limitador-server binary}"
sluice=${SLUICE:-${CARGO_TARGET_DIR:-target}/release/sluice}
load=${LOAD:-${CARGO_TARGET_DIR:-target}/release/examples/load}
if [[ -z ${SLUICE:-} ]]; then
    cargo build --release -q -p sluice-cli
    cargo build --release -q -p sluice-server --example load
fi
dir=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$dir"' EXIT

mkdir "$dir/envoy"
cat >"$dir/envoy/bench.yaml" <<'YAML'
domain: bench
descriptors:
  - key: user
    rate_limit: { unit: minute, requests_per_unit: 1000 }
YAML
cat >"$dir/limits.yaml" <<'YAML'
- namespace: bench
  max_value: 1000
  seconds: 60
  conditions: []
  variables:
    - descriptors[0]['user']
YAML

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
wait_port() {
    for _ in $(seq 100); do
        (echo >"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
        sleep 0.1
    done
    echo "vs_limitador.sh: nothing listening on $1" >&2
    exit 1
}

redis_pid=""
redis_url=""
start_redis() {
    local port
    port=$(free_port)
    taskset -c 0 redis-server --port "$port" --save '' --appendonly no --daemonize no >/dev/null &
    redis_pid=$!
    pids+=("$redis_pid")
    wait_port "$port"
    redis_url="redis://127.0.0.1:$port"
}

# Starts server $1 on store $2 (memory or redis); sets server_pid and grpc.
start() {
    local port
    port=$(free_port)
    case $1 in
        sluice | sluice-1)
            local store=memory://
            [[ $2 == redis ]] && store="$redis_url?timeout_ms=5000"
            local threads=()
            [[ $1 == sluice-1 ]] && threads=(--threads 1)
            "$sluice" serve --listen 127.0.0.1:0 --grpc-listen "127.0.0.1:$port" \
                --envoy-config "$dir/envoy" --store "$store" "${threads[@]}" >/dev/null 2>&1 &
            ;;
        limitador)
            local storage=(memory)
            [[ $2 == redis ]] && storage=(redis "$redis_url")
            "$LIMITADOR" --rls-ip 127.0.0.1 --rls-port "$port" --http-ip 127.0.0.1 \
                --http-port "$(free_port)" "$dir/limits.yaml" "${storage[@]}" >/dev/null 2>&1 &
            ;;
    esac
    server_pid=$!
    pids+=("$server_pid")
    grpc=127.0.0.1:$port
    wait_port "$port"
}

tck=$(getconf CLK_TCK)
for store in memory redis; do
    [[ $store == redis ]] && start_redis
    for round in $(seq "$rounds"); do
        for server in sluice sluice-1 limitador; do
            start "$server" "$store"
            "$load" grpc "$grpc" 4 1 check >/dev/null # warm up
            t0=$(cpu_ticks "$server_pid")
            r0=0
            [[ -n $redis_pid ]] && r0=$(cpu_ticks "$redis_pid")
            out=$("$load" grpc "$grpc" 16 "$seconds" check)
            t1=$(cpu_ticks "$server_pid")
            r1=0
            [[ -n $redis_pid ]] && r1=$(cpu_ticks "$redis_pid")
            kill "$server_pid"
            wait "$server_pid" 2>/dev/null || true
            echo "$out" | awk -v store="$store" -v round="$round" -v server="$server" \
                -v t="$((t1 - t0))" -v r="$((r1 - r0))" -v tck="$tck" '{
                    n = $3
                    for (i = 1; i <= NF; i++) {
                        if ($i ~ /\/s$/) rate = $i
                        if ($i ~ /^p50=/) p50 = substr($i, 5)
                        if ($i ~ /^p99=/) p99 = substr($i, 5)
                    }
                    line = sprintf("store=%s round=%s server=%-9s decisions=%s p50=%s p99=%s server_cpu_us=%.1f",
                        store, round, server, rate, p50, p99, t / tck * 1e6 / n)
                    if (store == "redis") line = line sprintf(" redis_cpu_us=%.1f", r / tck * 1e6 / n)
                    print line
                }'
        done
    done
done
