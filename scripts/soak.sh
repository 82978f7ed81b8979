#!/usr/bin/env bash
# The soak: scripts/soak.sh DURATION (e.g. 30m). Two `sluice serve` (release build) share one
# redis-server under steady load, with a fault each minute (reload, connections killed,
# Redis restarted, none); prints a Markdown table, one row per minute: decisions, p50/p99,
# exactness, resident memory and open files of each server. See RELIABILITY.md.
set -euo pipefail
cd "$(dirname "$0")/.."

if (($# != 1)); then
    echo "usage: $0 DURATION   (90s, 30m, 2h)" >&2
    exit 2
fi
command -v redis-server >/dev/null || scripts/apt-install.sh redis-server
command -v redis-cli >/dev/null || scripts/apt-install.sh redis-tools
cargo build --release --locked -p sluice-cli -p sluice-testkit --bin sluice --bin sluice-soak
exec target/release/sluice-soak "$1" target/release/sluice
