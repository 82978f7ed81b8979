#!/usr/bin/env bash
# Makes the README's picture of the live page with the project's own commands: `sluice serve
# --ui` on the example policies, a generated load for about 90 s (steady API traffic, then a
# login attack from many addresses, then calm), photographed by headless Chromium into
# docs/live-page.png. (The simulate picture's command is next to it in the README.)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -p sluice-cli
command -v chromium >/dev/null || scripts/apt-install.sh chromium

out=$(mktemp)
target/release/sluice serve --listen 127.0.0.1:0 --config examples/sluice.toml --ui >"$out" 2>/dev/null &
server=$!
trap 'kill $server 2>/dev/null; rm -f "$out"' EXIT
until grep -q "listening on" "$out"; do sleep 0.1; done  # the line the binary prints when bound
base=$(sed -n 's/^sluice listening on //p' "$out" | head -1)

# One curl process sending `count` checks of `policy` with `selectors` (JSON) over one
# connection.
burst() {
    local policy=$1 selectors=$2 count=$3 args=()
    for ((i = 0; i < count; i++)); do
        # curl's options hold until --next, so each request repeats them.
        args+=(-s -o /dev/null -H 'content-type: application/json'
            --data-binary "{\"policy\":\"$policy\",\"selectors\":$selectors}" "$base/v1/check" --next)
    done
    curl "${args[@]}" -s -o /dev/null "$base/health"
}

phase() {  # phase SECONDS ATTACK: a second of traffic at a time
    local seconds=$1 attack=$2
    for ((s = 0; s < seconds; s++)); do
        local pids=()
        for key in alpha beta gamma delta; do
            burst api "{\"apikey\":\"$key\"}" 3 &
            pids+=($!)
        done
        burst exports "{\"user\":\"u$((s % 5))\"}" 4 &
        pids+=($!)
        burst search-trial "{\"user\":\"trial-$((s % 3))\"}" 15 &
        pids+=($!)
        if ((attack)); then
            for n in 1 2 3 4 5 6; do
                burst login "{\"ip\":\"198.51.100.$((n * 7 + s % 4))\",\"user\":\"admin\"}" 8 &
                pids+=($!)
            done
        else
            burst login "{\"ip\":\"203.0.113.$((s % 9))\",\"user\":\"u$((s % 5))\"}" 1 &
            pids+=($!)
        fi
        wait "${pids[@]}"  # this round's clients, not the server
        sleep 0.5  # pacing the load to about one round a second, not a synchronisation
    done
}
phase 30 0
phase 40 1
phase 20 0

chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync \
    --hide-scrollbars --user-data-dir="$(mktemp -d)" --virtual-time-budget=3000 \
    --window-size=1280,1400 --screenshot=docs/live-page.png "$base/ui" 2>/dev/null
echo "wrote docs/live-page.png"
