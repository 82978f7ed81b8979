"""Decisions per second from Python, one thread: sluice beside `limits` and `django-ratelimit`.

    python bindings/python/bench.py                       # starts its own redis-server
    python bindings/python/bench.py --redis redis://127.0.0.1:6379 --seconds 5 --rounds 5
    python bindings/python/bench.py --only memory --json

Every library decides the same workload, on the same store, in the same run:

- ``10000 keys`` (`--keys`): hits spread round-robin over distinct users, the limit
  (`--limit`, 1000/minute) high enough that every hit is admitted: the cost of an ordinary
  decision;
- ``1 key``: every hit on one user, so after the first `--limit` nearly every hit is refused:
  the hot key under attack.

Rows: sluice (`Limiter.check`) with its default GCRA and with the algorithms that match the
others' (fixed window; sliding log, exact like `limits`' moving window); `limits` (5.x) with
`FixedWindowRateLimiter` and `MovingWindowRateLimiter` on its ``memory://`` and
``redis://`` storages; `django-ratelimit` (`is_ratelimited(..., increment=True)`, a fixed
window) on Django's locmem cache and on `django.core.cache.backends.redis.RedisCache`. On
Redis all of them share one server.

Each row runs `--seconds` per round; rounds go over every row in turn (so drift hits all rows
alike) and the table gives the median. "sluice ×" is how many times more decisions per second
sluice makes with the matching algorithm on the same store and workload (fixed window for
fixed window, sliding log for moving window). On Redis a row of redis-py PINGs shows the
floor: one thread cannot decide faster than one round trip per decision.

Each run decides fresh keys (a run-unique prefix), so rounds never inherit counters and a
server given with `--redis` is never flushed; what the run leaves expires within minutes.
The redis-py clients use its pure-Python parser unless `hiredis` is installed.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional, Sequence

SPAN = "minute"
WARMUP_HITS = 200
CHECK_CLOCK_EVERY = 64  # reading the clock on every hit would be a large share of a fast hit

Decide = Callable[[Any], bool]


@dataclass
class Row:
    """One library on one store with one workload; `prepare(keys)` turns key names into the
    arguments its `decide` takes (built before the clock starts, as an app would hold them)."""

    library: str
    strategy: str
    store: str
    workload: str
    decide: Decide
    prepare: Callable[[list[str]], list[Any]]
    matches: Optional[str] = None  # the sluice strategy to compare with
    before: Callable[[], None] = lambda: None  # run before each of the row's runs
    decisions: list[int] = field(default_factory=list)  # per round
    admitted: list[int] = field(default_factory=list)
    rates: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.rates)

    @property
    def admitted_share(self) -> float:
        return sum(self.admitted) / sum(self.decisions)


def identity(keys: list[str]) -> list[str]:
    return keys


# --- the libraries -----------------------------------------------------------------------

SLUICE_STRATEGIES = {
    "gcra": "",
    "fixed window": " algorithm=fixed-window",
    "sliding log": " algorithm=sliding-log",
}


def sluice_rows(store_name: str, url: str, workload: str, run: str, limit: int) -> Iterator[Row]:
    import sluice

    for strategy, suffix in SLUICE_STRATEGIES.items():
        policy = {"rule": f"user:{limit}/m{suffix}", "namespace": f"bench{run}"}
        limiter = sluice.Limiter(url, {"bench": policy})

        def decide(selectors: dict[str, str], check=limiter.check) -> bool:
            return check("bench", selectors).allowed

        yield Row("sluice", strategy, store_name, workload, decide,
                  lambda keys: [{"user": key} for key in keys])


def limits_rows(store_name: str, url: str, workload: str, run: str, limit: int) -> Iterator[Row]:
    from limits import parse, storage, strategies

    item = parse(f"{limit}/{SPAN}")
    store = storage.storage_from_string("memory://" if url == "memory://" else url)
    for strategy, limiter_class, matches in (
        ("fixed window", strategies.FixedWindowRateLimiter, "fixed window"),
        ("moving window", strategies.MovingWindowRateLimiter, "sliding log"),
    ):
        limiter = limiter_class(store)

        def decide(key: str, hit=limiter.hit) -> bool:
            return hit(item, key)

        yield Row("limits", strategy, store_name, workload, decide, identity, matches)


def django_rows(store_name: str, url: str, workload: str, run: str, limit: int) -> Iterator[Row]:
    from django.conf import settings
    from django.http import HttpRequest
    from django_ratelimit.core import is_ratelimited

    cache = "locmem" if url == "memory://" else "redis"
    rate = f"{limit}/m"

    def user_of(group: str, request: HttpRequest) -> str:
        return request.bench_user  # type: ignore[attr-defined]

    def requests(keys: list[str]) -> list[HttpRequest]:
        out = []
        for key in keys:
            request = HttpRequest()
            request.method = "GET"
            request.bench_user = key  # type: ignore[attr-defined]
            out.append(request)
        return out

    def decide(request: HttpRequest) -> bool:
        return not is_ratelimited(request, group="bench", key=user_of, rate=rate,
                                  increment=True)

    def use_cache() -> None:  # django-ratelimit reads the setting on every hit
        settings.RATELIMIT_USE_CACHE = cache

    yield Row("django-ratelimit", "fixed window", store_name, workload, decide, requests,
              "fixed window", use_cache)


def round_trip_rows(store_name: str, url: str, workload: str, run: str,
                    limit: int) -> Iterator[Row]:
    """Not a limiter: redis-py's PING, the floor under every Redis row on one thread (each
    decision there is at least one round trip)."""
    if url == "memory://" or workload == "1 key":
        return
    import redis

    client = redis.Redis.from_url(url)

    def decide(key: str) -> bool:
        return client.ping()

    yield Row("redis-py", "PING (round trip)", store_name, workload, decide, identity)


def configure_django(redis_url: Optional[str]) -> None:
    from django.conf import settings

    caches: dict[str, Any] = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        # Large enough to hold the workload: the default 300 entries would cull counters.
        "locmem": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache",
                   "LOCATION": "bench", "OPTIONS": {"MAX_ENTRIES": 10_000_000}},
    }
    if redis_url is not None:
        caches["redis"] = {"BACKEND": "django.core.cache.backends.redis.RedisCache",
                           "LOCATION": redis_url}
    settings.configure(CACHES=caches, RATELIMIT_USE_CACHE="locmem",
                       SILENCED_SYSTEM_CHECKS=["django_ratelimit.W001"])


# --- measuring ---------------------------------------------------------------------------

def measure(decide: Decide, arguments: Sequence[Any], seconds: float) -> tuple[int, int, float]:
    """Decides for `seconds` or a little more: (decisions, admitted, elapsed seconds)."""
    cycle = itertools.cycle(arguments)
    decisions = admitted = 0
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        for _ in range(CHECK_CLOCK_EVERY):
            if decide(next(cycle)):
                admitted += 1
        decisions += CHECK_CLOCK_EVERY
        now = time.perf_counter()
        if now >= deadline:
            return decisions, admitted, now - start


def workload_keys(workload: str, keys: int, run: str) -> list[str]:
    if workload == "1 key":
        return [f"r{run}-hot"]
    return [f"r{run}-user{n}" for n in range(keys)]


def run_row(row: Row, keys: int, seconds: float, run: str) -> None:
    row.before()
    warmup = row.prepare([f"r{run}-warmup{n}" for n in range(WARMUP_HITS)])
    for argument in warmup:  # connections opened, scripts loaded, code paths warm
        row.decide(argument)
    arguments = row.prepare(workload_keys(row.workload, keys, run))
    decisions, admitted, elapsed = measure(row.decide, arguments, seconds)
    row.decisions.append(decisions)
    row.admitted.append(admitted)
    row.rates.append(decisions / elapsed)


# --- a Redis of our own ------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_redis() -> tuple[subprocess.Popen, str, str]:
    binary = shutil.which("redis-server")
    if binary is None:
        sys.exit("redis-server is not installed; install it or pass --redis URL (or --only memory)")
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="sluice-bench-redis-")
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", workdir],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while True:
        if process.poll() is not None:
            sys.exit(f"redis-server exited with {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                break
        except OSError:
            if time.monotonic() > deadline:
                stop(process)
                sys.exit(f"redis-server did not listen on {port}")
            time.sleep(0.02)  # polling the port of a starting server
    return process, f"redis://127.0.0.1:{port}", workdir


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait()


# --- the report --------------------------------------------------------------------------

def sluice_factor(row: Row, rows: list[Row]) -> Optional[float]:
    if row.matches is None:
        return None
    for other in rows:
        if (other.library, other.strategy, other.store, other.workload) == (
                "sluice", row.matches, row.store, row.workload):
            return other.median / row.median
    return None


def table(rows: list[Row]) -> str:
    header = ("library", "strategy", "store", "workload", "decisions/s", "admitted", "sluice ×")
    lines = [header]
    for row in rows:
        factor = sluice_factor(row, rows)
        lines.append((row.library, row.strategy, row.store, row.workload, f"{row.median:,.0f}",
                      f"{row.admitted_share:.0%}",
                      "" if factor is None else f"{factor:.2f}"))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    numeric = {4, 5, 6}
    out = []
    for n, line in enumerate(lines):
        out.append("  ".join(cell.rjust(widths[i]) if i in numeric else cell.ljust(widths[i])
                             for i, cell in enumerate(line)).rstrip())
        if n == 0:
            out.append("  ".join("-" * width for width in widths))
    return "\n".join(out)


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    import sluice

    out = {"python": platform.python_version(), "sluice": sluice.__version__}
    for package in ("limits", "django-ratelimit", "Django", "redis", "hiredis"):
        try:
            out[package] = version(package)
        except PackageNotFoundError:
            pass
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="per row and round (2)")
    parser.add_argument("--rounds", type=int, default=3, help="the table gives the median (3)")
    parser.add_argument("--keys", type=int, default=10_000, help="distinct users (10000)")
    parser.add_argument("--limit", type=int, default=1000, help="hits per minute per user (1000)")
    parser.add_argument("--redis", metavar="URL", help="use this Redis instead of starting one")
    parser.add_argument("--only", choices=("memory", "redis"), help="one store's rows")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.rounds < 1 or args.keys < 1 or args.limit < 1:
        parser.error("--seconds, --rounds, --keys and --limit must be positive")

    stores = [store for store in ("memory", "redis") if args.only in (None, store)]
    redis_process = workdir = None
    redis_url = args.redis
    if "redis" in stores and redis_url is None:
        redis_process, redis_url, workdir = start_redis()
    try:
        configure_django(redis_url if "redis" in stores else None)
        rows: list[Row] = []
        run_id = f"{os.getpid()}x{int(time.time())}"
        for store in stores:
            url = "memory://" if store == "memory" else redis_url
            for workload in (f"{args.keys} keys", "1 key"):
                for make in (sluice_rows, limits_rows, django_rows, round_trip_rows):
                    rows.extend(make(store, url, workload, run_id, args.limit))
        for round_number in range(args.rounds):
            for n, row in enumerate(rows):
                run_row(row, args.keys, args.seconds, f"{run_id}r{round_number}n{n}")
    finally:
        if redis_process is not None:
            stop(redis_process)
            shutil.rmtree(workdir, ignore_errors=True)

    if args.json:
        print(json.dumps({
            "seconds": args.seconds, "rounds": args.rounds, "keys": args.keys,
            "limit": args.limit, "span": SPAN, "versions": versions(),
            "rows": [{
                "library": row.library, "strategy": row.strategy, "store": row.store,
                "workload": row.workload, "decisions_per_second": row.median,
                "rates": row.rates, "decisions": row.decisions, "admitted": row.admitted,
                "sluice_factor": sluice_factor(row, rows),
            } for row in rows],
        }, indent=2))
    else:
        print(f"{args.limit}/{SPAN} per user; median of {args.rounds} rounds of {args.seconds:g} s; "
              + ", ".join(f"{name} {value}" for name, value in versions().items()))
        print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
