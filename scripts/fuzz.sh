#!/usr/bin/env bash
# Fuzzes one target for a number of minutes: scripts/fuzz.sh TARGET MINUTES
# (targets and what they check: fuzz/README.md). Needs cargo-afl:
#   cargo install cargo-afl --locked && cargo afl config --build
set -euo pipefail
cd "$(dirname "$0")/.."

if (($# != 2)); then
    echo "usage: $0 TARGET MINUTES   (targets: ls fuzz/corpus)" >&2
    exit 2
fi
target=$1
minutes=$2
if [[ ! -d fuzz/corpus/$target ]]; then
    echo "no target $target (there is no fuzz/corpus/$target)" >&2
    exit 2
fi
if ! cargo afl --version >/dev/null 2>&1; then
    echo "cargo-afl is missing: cargo install cargo-afl --locked && cargo afl config --build" >&2
    exit 1
fi

# A target directory of its own: AFL's instrumentation flags would otherwise invalidate the
# normal builds, and the other way round.
export CARGO_TARGET_DIR=target/fuzz
cargo afl build --release --locked -p sluice-fuzz --features afl --bin sluice-fuzz

out=$CARGO_TARGET_DIR/$target/out
rm -rf "$out"
mkdir -p "$out"
# No UI (the log goes to a file); a machine whose core dumps go to a program, or whose CPU
# governor is not `performance`, can still fuzz.
AFL_NO_UI=1 AFL_SKIP_CPUFREQ=1 AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1 \
    cargo afl fuzz -V $((minutes * 60)) -i "fuzz/corpus/$target" -o "$out" \
    -- "$CARGO_TARGET_DIR/release/sluice-fuzz" "$target" >"$out/log" 2>&1 || {
    tail -30 "$out/log" >&2
    exit 1
}

stats=$out/default/fuzzer_stats
grep -E '^(run_time|execs_done|execs_per_sec|corpus_count|saved_crashes|saved_hangs|bitmap_cvg|stability) ' "$stats"
crashes=$(find "$out/default/crashes" -type f -name 'id:*' | wc -l)
if ((crashes)); then
    mkdir -p "$CARGO_TARGET_DIR/$target/crashes"
    cp "$out"/default/crashes/id:* "$CARGO_TARGET_DIR/$target/crashes/"
    echo "$crashes crashes, copied to $CARGO_TARGET_DIR/$target/crashes" >&2
    exit 1
fi
