#!/usr/bin/env bash
# The layer's cost per request as a count of instructions, a figure a noisy machine cannot
# move: the benchmark's server (examples/overhead_server.rs) runs under valgrind's
# callgrind, and curl sends N requests (3,000 by default) on one keep-alive connection to
# each target, counters zeroed before and dumped after. Prints one line per target:
#
#   without_layer instructions_per_request=15928
#   with_layer instructions_per_request=19645 added=3717
#
# `refused` is a request the layer refuses (429 with the default problem+json body): under a
# flood most requests are, so its whole cost is compared with `without_layer`'s.
#
# Counts the server's user-space instructions only: not the kernel's share of a request
# (most of it on a trivial handler), nor cache misses or contention between cores, which
# overhead.sh's throughput sees. Installs valgrind from Debian when missing.
set -euo pipefail
cd "$(dirname "$0")/../../.."

n=${N:-3000}
command -v valgrind >/dev/null || scripts/apt-install.sh valgrind

cargo build --release -q -p sluice-tower --example overhead_server
dir=$(mktemp -d)
valgrind --tool=callgrind --callgrind-out-file="$dir/out" \
    "${CARGO_TARGET_DIR:-target}"/release/examples/overhead_server >"$dir/log" 2>"$dir/valgrind" &
server=$!
trap 'kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; rm -rf "$dir"' EXIT

targets=(without_layer with_layer_no_fields with_layer with_layer_all_fields with_layer_per_route with_layer_wrapped refused)
for _ in $(seq 300); do
    [[ $(wc -l <"$dir/log") -ge ${#targets[@]} ]] && break
    sleep 0.1
done
[[ $(wc -l <"$dir/log") -ge ${#targets[@]} ]] || { echo "instructions.sh: server did not start" >&2; exit 1; }

base=""
for t in "${targets[@]}"; do
    url=$(awk -v t="$t" '$1 == t {print $2}' "$dir/log")
    # Warm the connection's path and the limiter's state, then count N requests alone.
    curl -s -o /dev/null "$url/?[1-200]"
    callgrind_control -z "$server" >/dev/null 2>&1
    curl -s -o /dev/null "$url/?[1-$n]"
    callgrind_control -d "$t" "$server" >/dev/null 2>&1
    dump=$(ls -t "$dir"/out.* | head -1)
    per=$(awk -v n="$n" '/^summary:/ {printf "%.0f", $2 / n}' "$dump")
    line="$t instructions_per_request=$per"
    if [[ -z $base ]]; then base=$per; else line+=" added=$((per - base))"; fi
    echo "$line"
done
