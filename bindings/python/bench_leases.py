"""Concurrency leases per second from Python, one thread: a slot taken and given back.

    python bindings/python/bench_leases.py                 # starts its own redis-server
    python bindings/python/bench_leases.py --only memory --seconds 2 --rounds 5 --json

Rows, each an acquire and its release on one key of 64 slots (so every acquire is admitted):

- memory: `with threading.Semaphore(64)` (Python's own, which no other process can share),
  `with limiter.acquire(...)`, `limiter.acquire(...).release()`, and `limiter.check` on a
  rate limit for scale;
- redis: `with limiter.acquire(...)` and `limiter.check` on the same server, and a redis-py
  PING: one thread cannot do better than a round trip per call, and a lease takes two.

Each row runs `--seconds` per round; rounds go over every row in turn and the table gives the
median. "×" is the row's time per pair over the first row of its store (the semaphore on
memory, the check on Redis).
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
import uuid
from typing import Callable, Optional, Sequence

import sluice
from bench import start_redis, stop

CHECK_CLOCK_EVERY = 64


def measure(step: Callable[[], bool], seconds: float) -> tuple[int, int, float]:
    """Runs `step` for `seconds` or a little more: (steps, admitted, elapsed seconds)."""
    steps = admitted = 0
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        for _ in range(CHECK_CLOCK_EVERY):
            if step():
                admitted += 1
        steps += CHECK_CLOCK_EVERY
        now = time.perf_counter()
        if now >= deadline:
            return steps, admitted, now - start


def rows_for(store: str, url: str) -> list[tuple[str, Callable[[], bool]]]:
    namespace = f"bl{uuid.uuid4().hex[:8]}"
    limiter = sluice.Limiter(url, {
        "slots": {"rule": "user:64 concurrent", "namespace": namespace},
        "rate": {"rule": "user:1000000000/s", "namespace": namespace},
    })
    user = {"user": "u"}

    def lease_with() -> bool:
        with limiter.acquire("slots", user) as lease:
            return bool(lease)

    def lease_release() -> bool:
        lease = limiter.acquire("slots", user)
        return lease.release() == "released"

    def check() -> bool:
        return limiter.check("rate", user).allowed

    if store == "memory":
        semaphore = threading.Semaphore(64)

        def with_semaphore() -> bool:
            with semaphore:
                return True

        return [("threading.Semaphore", with_semaphore), ("with acquire", lease_with),
                ("acquire + release", lease_release), ("check", check)]
    import redis

    client = redis.Redis.from_url(url)
    return [("check", check), ("with acquire", lease_with), ("PING", lambda: bool(client.ping()))]


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=1.0, help="per row per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", choices=("memory", "redis"))
    parser.add_argument("--redis", help="a Redis URL instead of a server of our own")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    process = workdir = None
    stores = [s for s in ("memory", "redis") if args.only in (None, s)]
    try:
        urls = {"memory": "memory://"}
        if "redis" in stores:
            if args.redis:
                urls["redis"] = args.redis
            else:
                process, urls["redis"], workdir = start_redis()
        rows = [(store, name, step) for store in stores for name, step in rows_for(store, urls[store])]
        for _, _, step in rows:  # warm: connections opened, scripts loaded
            for _ in range(200):
                step()
        rates: dict[tuple[str, str], list[float]] = {(s, n): [] for s, n, _ in rows}
        admitted: dict[tuple[str, str], list[float]] = {(s, n): [] for s, n, _ in rows}
        for _ in range(args.rounds):
            for store, name, step in rows:
                steps, passed, elapsed = measure(step, args.seconds)
                rates[(store, name)].append(steps / elapsed)
                admitted[(store, name)].append(passed / steps)
    finally:
        if process is not None:
            stop(process)
    report = []
    for store in stores:
        first = None
        for (s, name), rate in rates.items():
            if s != store:
                continue
            median = statistics.median(rate)
            first = first or median
            report.append({"store": store, "row": name, "per_second": median,
                           "microseconds": 1e6 / median, "ratio": first / median,
                           "admitted": min(admitted[(s, name)])})
    if args.json:
        print(json.dumps({"seconds": args.seconds, "rounds": args.rounds, "rows": report}))
        return 0
    print(f"median of {args.rounds} rounds of {args.seconds:g} s, one thread")
    print(f"{'store':7} {'row':20} {'per second':>12} {'µs each':>8} {'×':>6}")
    for row in report:
        print(f"{row['store']:7} {row['row']:20} {row['per_second']:12,.0f} "
              f"{row['microseconds']:8.2f} {row['ratio']:6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
