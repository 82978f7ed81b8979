#!/usr/bin/env bash
# The layer's overhead per request: the same trivial axum app with RateLimitLayer (memory
# store, a limit keyed by client IP that never refuses) and without it, driven by wrk in
# alternating rounds (50 connections, 30 rounds of 2 s by default: many short rounds keep a
# slow drift of the shared machine out of the median). Prints the medians:
#
#   with_layer_rps=X without_layer_rps=Y loss=Z%
#
# `loss` is one minus the median of the rounds' with/without ratios (each round runs every
# target back to back, so a ratio compares like with like on a shared, noisy machine).
#
# With two or more CPUs the server runs on CPU 0 and wrk (one thread) on CPU 1, so the server
# has a core of its own and its throughput is what it can do, not how the scheduler shares
# two cores between four busy threads. PIN=0 runs both unpinned on every core (wrk -t2).
#
# `with_layer` is the layer as configured by default (it sends `RateLimit-Policy` and
# `RateLimit` on every response), wrapped around the router as a limit on every request is
# applied. `with_layer_per_route` is the same layer applied with `Router::layer`, which makes
# axum box and clone each route's service per request on the layer's behalf. On stderr: each
# round, the same layer sending all five fields (with the X-RateLimit trio) and none (what
# the limiter itself costs), the per-route form, and the server's CPU time per request.
#
# ROUNDS and DURATION override the defaults. Installs wrk from Debian when missing.
set -euo pipefail
cd "$(dirname "$0")/../../.."

rounds=${ROUNDS:-30}
duration=${DURATION:-2s}
pin=${PIN:-1}
[[ $(nproc) -ge 2 ]] && command -v taskset >/dev/null || pin=0
if [[ $pin == 1 ]]; then
    server_cpu=(taskset -c 0)
    load=(taskset -c 1 wrk -t1 -c50)
else
    server_cpu=()
    load=(wrk -t2 -c50)
fi
echo "overhead.sh: pinned=$pin rounds=$rounds duration=$duration" >&2

command -v wrk >/dev/null || scripts/apt-install.sh wrk

cargo build --release -q -p sluice-tower --example overhead_server
log=$(mktemp)
"${server_cpu[@]}" "${CARGO_TARGET_DIR:-target}"/release/examples/overhead_server >"$log" &
server=$!
trap 'kill "$server" 2>/dev/null || true; rm -f "$log"' EXIT

targets=(with_layer with_layer_all_fields with_layer_no_fields with_layer_per_route without_layer)
for _ in $(seq 100); do
    [[ $(wc -l <"$log") -ge ${#targets[@]} ]] && break
    sleep 0.1
done
declare -A url
for t in "${targets[@]}"; do
    url[$t]=$(awk -v t="$t" '$1 == t {print $2}' "$log")
    [[ -n ${url[$t]} ]] || { echo "overhead.sh: server did not start" >&2; exit 1; }
done

# The server's CPU time so far, in clock ticks (user + system).
ticks() {
    awk '{print $14 + $15}' "/proc/$server/stat"
}

# One run against target $2 for $1: prints "RPS CPU_MICROSECONDS_PER_REQUEST".
run() {
    local before after out
    before=$(ticks)
    out=$("${load[@]}" -d"$1" "${url[$2]}/")
    after=$(ticks)
    awk -v t="$((after - before))" -v hz="$(getconf CLK_TCK)" '
        / requests in / {n = $1}
        /^Requests\/sec:/ {r = $2}
        END {printf "%s %.2f\n", r, t / hz * 1e6 / n}' <<<"$out"
}

median() {
    sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'
}

# Warm everything up (connections, allocator, the limiter's one state word).
for t in "${targets[@]}"; do run 2s "$t" >/dev/null; done

declare -A rps cpu round_rps
ratios=""
for round in $(seq "$rounds"); do
    # Rotate which goes first, so drift on a shared machine hits all alike.
    k=$((round % ${#targets[@]}))
    order=("${targets[@]:k}" "${targets[@]:0:k}")
    line="round $round:"
    for t in "${order[@]}"; do
        read -r r c < <(run "$duration" "$t")
        rps[$t]+="$r "
        cpu[$t]+="$c "
        line+=" ${t}_rps=$r ${t}_cpu_us=$c"
        round_rps[$t]=$r
    done
    ratios+="$(awk -v a="${round_rps[with_layer]}" -v b="${round_rps[without_layer]}" 'BEGIN {print a / b}') "
    echo "$line" >&2
done

declare -A m mc
for t in "${targets[@]}"; do
    m[$t]=$(tr ' ' '\n' <<<"${rps[$t]}" | grep . | median)
    mc[$t]=$(tr ' ' '\n' <<<"${cpu[$t]}" | grep . | median)
done
loss() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.1f%%", (1 - a / b) * 100}'; }
for t in with_layer_all_fields with_layer_no_fields with_layer_per_route; do
    echo "$t: rps=$(printf '%.0f' "${m[$t]}") loss=$(loss "${m[$t]}" "${m[without_layer]}")" >&2
done
echo "server CPU per request (us): with_layer=${mc[with_layer]}" \
    "with_layer_all_fields=${mc[with_layer_all_fields]}" \
    "with_layer_no_fields=${mc[with_layer_no_fields]}" \
    "with_layer_per_route=${mc[with_layer_per_route]} without_layer=${mc[without_layer]}" >&2
ratio=$(tr ' ' '\n' <<<"$ratios" | grep . | median)
echo "per-round with/without ratios: $ratios(median $ratio)" >&2
echo "with_layer_rps=$(printf '%.0f' "${m[with_layer]}")" \
    "without_layer_rps=$(printf '%.0f' "${m[without_layer]}")" \
    "loss=$(awk -v r="$ratio" 'BEGIN {printf "%.1f%%", (1 - r) * 100}')"
