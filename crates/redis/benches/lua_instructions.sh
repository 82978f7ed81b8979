#!/usr/bin/env bash
# Instructions redis-server spends per step of sluice's batched scripts, under callgrind:
# the one Redis cost figure this machine's noise cannot move. Each scenario makes calls of 16
# steps (see lua_drive.py) on a fresh redis-server, counts only the measured calls, and
# prints instructions per step; an acquire + release pair is two lease steps. Issue 13's
# target: a pair costs at most 2 rate checks.
# Installs what it needs where missing: valgrind and redis-server (Debian), redis-py (PyPI).
# With SLUICE_BENCH_REDIS_CELL=/path/to/libredis_cell.so (redis-cell, built outside the
# repository), the same counts for its native CL.THROTTLE, 16 commands pipelined per call:
# the Redis CPU issue 12 compares the store with, in instructions.
# Run: crates/redis/benches/lua_instructions.sh [calls per scenario, default 2000]
#
# fixed-1, fixed-many, sliding-1 and sliding-many count the lean fixed-window and
# sliding-window scripts' hits the same way; "log-1 log-many" (opt-in) the lean sliding log's.
# SLUICE_BENCH_SCENARIOS="full-fixed-1 full-fixed-many full-gcra-many full-sliding-1
# full-sliding-many full-log-1 full-log-many" counts the whole decision script instead (a Redis Function, one
# decision per FCALL): what every rule but the lean shapes costs (see lua_drive.py).
# "or-shared fixed-or-shared sliding-or-shared log-or-shared and-shared login-flood" count
# the lean rule script (GCRA, fixed-window, sliding-window or sliding-log leaves joined by `;`
# or `and`, a login form's penalty), "full-or-shared full-fixed-or-shared
# full-sliding-or-shared full-log-or-shared full-login-flood" the same rules through the
# whole script.
# "rate-many", "fixed-many", "sliding-many" and "log-many" send their 16 distinct keys as
# the store does (one set, no key twice: the script's loop for many users); the same names
# ending in "-general" send the same hits through the script's general loop, and "floor-many" only each key's share
# of an MGET and its SET with an expiry, nothing decided: what no script can spare.
# "lease-floor-1" (opt-in) counts lease-1's commands alone, batched as no script on sorted
# sets could beat (one ZCARD, ZREM, ZADD and PEXPIRE a call, nothing decided): the floor
# of a busy lease set, beside rate-1 (SLUICE_BENCH_FLOOR_READS=1 adds the drop of expired
# leases and the read of the latest expiry). "lease-hash-floor-1" (opt-in) is the same floor
# on a hash, the layout with the cheapest insert and removal.
# For a profile: SLUICE_BENCH_SCENARIOS="lease-1 rate-1" runs only those scenarios;
# SLUICE_BENCH_KEEP=DIR keeps each scenario's callgrind output (DIR/out.SCENARIO.1, the
# measured calls) for callgrind_annotate; SLUICE_BENCH_REDIS_SERVER=/path/to/redis-server
# runs another server, e.g. one built from Redis's sources with `make` (outside this
# repository), whose symbols name Lua's own functions in the profile. Figures quoted in the
# README come from the system's redis-server.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
command -v valgrind >/dev/null || "$root/scripts/apt-install.sh" valgrind
command -v redis-server >/dev/null || "$root/scripts/apt-install.sh" redis-server
command -v redis-cli >/dev/null || "$root/scripts/apt-install.sh" redis-tools
python3 -c 'import redis' 2>/dev/null || python3 -m pip install --quiet redis
calls=${1:-2000}
server=${SLUICE_BENCH_REDIS_SERVER:-redis-server}
if [[ -n ${SLUICE_BENCH_KEEP:-} ]]; then
  mkdir -p "$SLUICE_BENCH_KEEP"
  work=$(cd "$SLUICE_BENCH_KEEP" && pwd)
else
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
fi
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

measure() {
  local scenario=$1 port pid driver total module=()
  port=$(free_port)
  [[ $scenario == cell-* ]] && module=(--loadmodule "$SLUICE_BENCH_REDIS_CELL")
  rm -f "$work"/ready "$work"/go "$work"/done
  valgrind --tool=callgrind --callgrind-out-file="$work/out.$scenario" \
    "$server" --port "$port" --save "" --appendonly no "${module[@]}" >"$work/log.$scenario" 2>&1 &
  pid=$!
  until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.2; done
  python3 "$here/lua_drive.py" "$port" "$scenario" "$calls" "$work" &
  driver=$!
  until [ -f "$work/ready" ]; do
    kill -0 "$driver" 2>/dev/null || { echo "$scenario: the driver failed" >&2; kill "$pid"; exit 1; }
    sleep 0.1
  done
  callgrind_control -z "$pid" >/dev/null 2>&1
  touch "$work/go"
  wait "$driver"
  callgrind_control -d "$pid" >/dev/null 2>&1
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  # The dump taken after zeroing (part 1) holds the measured calls only.
  total=$(grep -hE '^(summary|totals):' "$work/out.$scenario.1" | head -1 | awk '{print $2}')
  echo $((total / (calls * 16)))
}

printf '%-16s %s\n' scenario 'instructions per step'
declare -A per
for scenario in ${SLUICE_BENCH_SCENARIOS:-rate-1 lease-1 rate-many lease-many fixed-1 fixed-many sliding-1 sliding-many}; do
  per[$scenario]=$(measure "$scenario")
  printf '%-16s %s\n' "$scenario" "${per[$scenario]}"
done
if [[ -n ${SLUICE_BENCH_REDIS_CELL:-} ]]; then
  for scenario in cell-1 cell-many; do
    per[$scenario]=$(measure "$scenario")
    printf '%-16s %s\n' "$scenario" "${per[$scenario]}"
  done
fi
for keys in 1 many; do
  [[ -n ${per[rate-$keys]:-} ]] || continue
  if [[ -n ${per[lease-$keys]:-} ]]; then
    python3 -c "import sys; r, l = int(sys.argv[1]), int(sys.argv[2]); print(f'an acquire + release on $keys key(s): {2 * l} instructions, {2 * l / r:.2f} rate checks')" \
      "${per[rate-$keys]}" "${per[lease-$keys]}"
  fi
  if [[ -n ${per[lease-floor-$keys]:-} ]]; then
    python3 -c "import sys; r, l = int(sys.argv[1]), int(sys.argv[2]); print(f'the floor of an acquire + release on $keys key(s): {2 * l} instructions, {2 * l / r:.2f} rate checks')" \
      "${per[rate-$keys]}" "${per[lease-floor-$keys]}"
  fi
  if [[ -n ${per[lease-hash-floor-$keys]:-} ]]; then
    python3 -c "import sys; r, l = int(sys.argv[1]), int(sys.argv[2]); print(f'the floor on a hash, on $keys key(s): {2 * l} instructions, {2 * l / r:.2f} rate checks')" \
      "${per[rate-$keys]}" "${per[lease-hash-floor-$keys]}"
  fi
  if [[ -n ${per[cell-$keys]:-} ]]; then
    python3 -c "import sys; r, c = int(sys.argv[1]), int(sys.argv[2]); print(f'a rate check on $keys key(s) costs {r / c:.2f} CL.THROTTLE')" \
      "${per[rate-$keys]}" "${per[cell-$keys]}"
  fi
done
