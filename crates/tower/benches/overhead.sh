#!/usr/bin/env bash
# The layer's overhead per request: the same trivial axum app with RateLimitLayer (memory
# store, a limit keyed by client IP that never refuses) and without it, driven by wrk in
# alternating rounds (-t2 -c50, 10 s each, 3 rounds by default). Prints the medians:
#
#   with_layer_rps=X without_layer_rps=Y loss=Z%
#
# and, on stderr, each round and the server's CPU time per request (steadier than
# throughput on a machine shared with other work).
#
# ROUNDS and DURATION override the defaults. Installs wrk from Debian when missing.
set -euo pipefail
cd "$(dirname "$0")/../../.."

rounds=${ROUNDS:-3}
duration=${DURATION:-10s}

if ! command -v wrk >/dev/null; then
    echo "overhead.sh: installing wrk" >&2
    sudo=""
    [[ $(id -u) -eq 0 ]] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq wrk >/dev/null
fi

cargo build --release -q -p sluice-tower --example overhead_server
log=$(mktemp)
target/release/examples/overhead_server >"$log" &
server=$!
trap 'kill "$server" 2>/dev/null || true; rm -f "$log"' EXIT

for _ in $(seq 100); do
    [[ $(wc -l <"$log") -ge 2 ]] && break
    sleep 0.1
done
with_url=$(awk '$1 == "with_layer" {print $2}' "$log")
without_url=$(awk '$1 == "without_layer" {print $2}' "$log")
[[ -n $with_url && -n $without_url ]] || { echo "overhead.sh: server did not start" >&2; exit 1; }

# The server's CPU time so far, in clock ticks (user + system).
ticks() {
    awk '{print $14 + $15}' "/proc/$server/stat"
}

rps() {
    wrk -t2 -c50 -d"$1" "$2/" | awk '/^Requests\/sec:/ {print $2}'
}

# One measured run: "RPS CPU_US_PER_REQUEST". The CPU time is the server's own, so it is
# steadier than throughput when other work shares the machine.
run() {
    local before after out
    before=$(ticks)
    out=$(wrk -t2 -c50 -d"$1" "$2/")
    after=$(ticks)
    awk -v t="$((after - before))" -v hz="$(getconf CLK_TCK)" '
        / requests in / {n = $1}
        /^Requests\/sec:/ {r = $2}
        END {printf "%s %.2f\n", r, t / hz * 1e6 / n}' <<<"$out"
}

median() {
    sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'
}

# Warm both up (connections, allocator, the limiter's one state word).
rps 2s "$with_url" >/dev/null
rps 2s "$without_url" >/dev/null

with=()
without=()
with_cpu=()
without_cpu=()
for round in $(seq "$rounds"); do
    # Alternate which goes first, so drift on a shared machine hits both alike.
    if ((round % 2)); then
        read -r r c < <(run "$duration" "$with_url"); with+=("$r"); with_cpu+=("$c")
        read -r r c < <(run "$duration" "$without_url"); without+=("$r"); without_cpu+=("$c")
    else
        read -r r c < <(run "$duration" "$without_url"); without+=("$r"); without_cpu+=("$c")
        read -r r c < <(run "$duration" "$with_url"); with+=("$r"); with_cpu+=("$c")
    fi
    echo "round $round: with_layer_rps=${with[-1]} without_layer_rps=${without[-1]}" \
        "with_layer_cpu_us=${with_cpu[-1]} without_layer_cpu_us=${without_cpu[-1]}" >&2
done

w=$(printf '%s\n' "${with[@]}" | median)
wo=$(printf '%s\n' "${without[@]}" | median)
wc=$(printf '%s\n' "${with_cpu[@]}" | median)
woc=$(printf '%s\n' "${without_cpu[@]}" | median)
echo "server CPU per request: with_layer_cpu_us=$wc without_layer_cpu_us=$woc" \
    "(+$(awk -v a="$wc" -v b="$woc" 'BEGIN {printf "%.1f%%", (a / b - 1) * 100}'))" >&2
awk -v w="$w" -v wo="$wo" 'BEGIN {printf "with_layer_rps=%.0f without_layer_rps=%.0f loss=%.1f%%\n", w, wo, (1 - w / wo) * 100}'
