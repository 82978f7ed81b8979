"""Keeps `bench.py` from rotting: its memory rows, run for a moment with a small limit, must
decide the workload they claim (every keyed hit admitted; on the hot key, the first `limit`
hits admitted and the rest refused) for every library, and the table must print."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench.py"

EXPECTED = {
    ("sluice", "gcra"), ("sluice", "fixed window"), ("sluice", "sliding log"),
    ("limits", "fixed window"), ("limits", "moving window"),
    ("django-ratelimit", "fixed window"),
}


def test_memory_rows_decide_the_workload() -> None:
    completed = subprocess.run(
        [sys.executable, str(BENCH), "--seconds", "0.05", "--rounds", "1", "--only", "memory",
         "--keys", "5000", "--limit", "50", "--json"],
        capture_output=True, text=True, timeout=120,
    )
    assert completed.returncode == 0, completed.stderr
    report = json.loads(completed.stdout)
    rows = report["rows"]
    limit = report["limit"]
    for workload in ("5000 keys", "1 key"):
        chosen = [row for row in rows if row["workload"] == workload]
        assert {(row["library"], row["strategy"]) for row in chosen} == EXPECTED
    for row in rows:
        assert row["store"] == "memory"
        [decisions], [admitted] = row["decisions"], row["admitted"]
        assert decisions > 0 and row["decisions_per_second"] > 0
        if row["workload"] == "5000 keys":
            # A few hits per key in 0.05 s: under the limit.
            assert admitted == decisions, row
        else:
            # A fresh key admits its first `limit` hits; a fixed window may open once more
            # at a clock edge, GCRA refills one hit per 1.2 s. The rest are refused.
            assert decisions > 2 * limit + 1, "too few hits to see the limit"
            assert limit <= admitted <= 2 * limit + 1, row
        assert (row["sluice_factor"] is None) == (row["library"] == "sluice"), row


def test_table_prints_every_row() -> None:
    spec = importlib.util.spec_from_file_location("bench", BENCH)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench  # dataclasses look their module up while the class is made
    try:
        spec.loader.exec_module(bench)
    finally:
        del sys.modules[spec.name]

    def row(library: str, strategy: str, rate: float, matches: str | None = None):
        made = bench.Row(library, strategy, "redis", "10 keys", lambda key: True,
                         bench.identity, matches)
        made.decisions, made.admitted, made.rates = [30, 10], [20, 10], [rate, rate]
        return made

    rows = [row("sluice", "fixed window", 50_000.0),
            row("limits", "fixed window", 10_000.0, "fixed window")]
    lines = bench.table(rows).splitlines()
    assert lines[0].split() == ["library", "strategy", "store", "workload", "decisions/s",
                                "admitted", "sluice", "×"]
    assert lines[2].split()[-2:] == ["50,000", "75%"]  # no factor against itself
    assert lines[3].split()[-3:] == ["10,000", "75%", "5.00"]


def test_lease_bench_rows_take_and_give_back_every_slot() -> None:
    """Keeps `bench_leases.py` from rotting: every row runs, and every acquire is admitted
    and released (64 slots, one holder at a time), so the rows time what they claim."""
    completed = subprocess.run(
        [sys.executable, str(BENCH.with_name("bench_leases.py")), "--seconds", "0.05",
         "--rounds", "1", "--only", "memory", "--json"],
        capture_output=True, text=True, timeout=120,
    )
    assert completed.returncode == 0, completed.stderr
    rows = json.loads(completed.stdout)["rows"]
    assert [row["row"] for row in rows] == [
        "threading.Semaphore", "with acquire", "acquire + release", "check"]
    for row in rows:
        assert row["store"] == "memory" and row["per_second"] > 0
        assert row["admitted"] == 1.0, row
    assert rows[0]["ratio"] == 1.0
