"""The native limiter from Python: decisions, errors, config files, stores, threads and
asyncio. The framework integrations have their own files."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import sluice
from conftest import ROOT, own_redis_server


def test_a_decision_carries_the_numbers_a_client_needs():
    limiter = sluice.Limiter(policies={"api": "user:2/h"})
    first = limiter.check("api", {"user": "alice"})
    assert first.allowed and bool(first)
    assert (first.remaining, first.limit, first.leaf, first.policy) == (1, 2, "user:2/h", "api")
    assert first.denial is None and first.retry_after is None
    limiter.check("api", {"user": "alice"})
    third = limiter.check("api", {"user": "alice"})
    assert not third.allowed and not bool(third)
    assert third.denial == "limited"
    assert 1799 < third.retry_after <= 1800  # 2/h: the next one frees in half an hour
    assert third.remaining == 0
    # Another user has their own counter.
    assert limiter.check("api", {"user": "bob"}).remaining == 1


def test_peek_records_nothing_and_reset_pardons():
    limiter = sluice.Limiter(policies={"api": "user:1/h"})
    assert limiter.peek("api", {"user": "u"}).allowed
    assert limiter.check("api", {"user": "u"}).allowed
    assert not limiter.peek("api", {"user": "u"}).allowed
    limiter.reset("api", {"user": "u"})
    assert limiter.check("api", {"user": "u"}).allowed


def test_cost_and_integer_selector_values():
    limiter = sluice.Limiter(policies={"tokens": "user:100/h"})
    assert limiter.check("tokens", {"user": 42}, cost=60).remaining == 40
    # 42 and "42" are one user.
    assert not limiter.check("tokens", {"user": "42"}, cost=60).allowed
    too_big = limiter.check("tokens", {"user": "7"}, cost=101)
    assert too_big.denial == "cost_exceeds_capacity" and too_big.retry_after is None


def test_header_fields_and_the_default_refusal():
    limiter = sluice.Limiter(policies={"api": "user:1/h"})
    admitted = limiter.check("api", {"user": "u"})
    assert admitted.refusal() is None
    assert dict(admitted.headers()) == {
        "RateLimit-Policy": '"api";q=1;w=3600',
        "RateLimit": '"api";r=0;t=3600',
    }
    denied = limiter.check("api", {"user": "u"})
    status, headers, body = denied.refusal(x_ratelimit=True)
    headers = dict(headers)
    assert status == 429
    assert headers["Content-Type"] == "application/problem+json"
    assert headers["Retry-After"] == "3600"
    assert headers["X-RateLimit-Remaining"] == "0"
    import json

    problem = json.loads(body)
    assert (problem["status"], problem["policy"], problem["reason"]) == (429, "api", "limited")


def test_policies_as_dicts_take_the_config_files_fields():
    limiter = sluice.Limiter(
        policies={
            "login": {
                "rule": "ip+user:2/h",
                "count_denied": True,
                "namespace": "web",
                "penalty": {"base": "1s", "max": "15m", "forget_after": "1h"},
            },
            "log": {"rule": "user:2/h", "algorithm": "sliding-log"},
        }
    )
    assert limiter.policies == {"log": "user:2/h", "login": "ip+user:2/h"}
    assert limiter.selectors("login") == ["ip", "user"]
    for _ in range(2):
        assert limiter.check("login", {"ip": "10.0.0.1", "user": "a"}).allowed
    denied = limiter.check("login", {"ip": "10.0.0.1", "user": "a"})
    assert denied.denial in ("limited", "penalized")


def test_rule_errors_say_where():
    with pytest.raises(sluice.RuleError) as error:
        sluice.Limiter(policies={"api": "user:10/q"})
    assert isinstance(error.value, ValueError)
    assert error.value.column == 9 and error.value.policy == "api"
    assert "column 9" in str(error.value)
    with pytest.raises(sluice.RuleError) as error:
        sluice.Limiter(policies={"api": {"rule": "user:0/m"}})
    with pytest.raises(sluice.RuleError):
        sluice.parse_rule("user:")
    assert sluice.parse_rule("user:10/m") == "user:10/m"


def test_bad_policy_fields_name_the_field():
    with pytest.raises(sluice.ConfigError) as error:
        sluice.Limiter(policies={"api": {"rule": "user:1/m", "algorithm": "leaky"}})
    assert error.value.field == "policies.api.algorithm"
    assert error.value.line is None
    with pytest.raises(sluice.ConfigError) as error:
        sluice.Limiter(policies={"api": {"rule": "user:1/m", "colour": "red"}})
    assert "colour" in str(error.value)
    with pytest.raises(TypeError):
        sluice.Limiter(policies={"api": 5})
    with pytest.raises(TypeError):
        sluice.Limiter(policies={"api": {"rule": "user:1/m", "shadow": object()}})
    with pytest.raises(sluice.PolicyError):
        sluice.Limiter(policies={"bad name": "user:1/m"})


def test_a_config_file_as_sluice_serve_reads_it(tmp_path: Path):
    limiter = sluice.Limiter.from_config(ROOT / "examples" / "sluice.toml")
    assert {"api", "login", "exports"} <= set(limiter.policies)
    bad = tmp_path / "bad.toml"
    bad.write_text('[policies.api]\nrule = "10/s"\n\n[policies.web]\nrule = "0/s"\n')
    with pytest.raises(sluice.ConfigError) as error:
        sluice.Limiter.from_config(bad)
    assert (error.value.line, error.value.column) == (5, 9)
    assert error.value.field == "policies.web.rule"
    assert str(error.value).startswith(f"{bad}:5:9: policies.web.rule:")
    # Both at once: the file's policies and the dict's.
    both = sluice.Limiter(config=ROOT / "examples" / "sluice.toml", policies={"x": "1/s"})
    assert "x" in both.policies and "api" in both.policies
    with pytest.raises(sluice.ConfigError):
        sluice.Limiter.from_config(tmp_path / "missing.toml")


def test_calls_that_cannot_decide_raise_clear_errors():
    limiter = sluice.Limiter(policies={"api": "user:1/m"})
    with pytest.raises(sluice.UnknownPolicy) as error:
        limiter.check("nope", {"user": "u"})
    assert isinstance(error.value, KeyError) and str(error.value) == "unknown policy `nope`"
    with pytest.raises(sluice.MissingSelector) as error:
        limiter.check("api", {})
    assert error.value.selector == "user"
    with pytest.raises(TypeError):
        limiter.check("api", {"user": None})
    with pytest.raises(TypeError):
        limiter.check("api", {"user": True})
    with pytest.raises(TypeError):
        limiter.check("api", ["user", "u"])
    with pytest.raises(OverflowError):
        limiter.check("api", {"user": "u"}, cost=-1)
    # Nothing above recorded a hit.
    assert limiter.check("api", {"user": "u"}).allowed


def test_store_urls_that_cannot_be_used():
    with pytest.raises(sluice.StoreError) as error:
        sluice.Limiter("mongodb://x", {"api": "1/s"})
    assert "mongodb" in str(error.value)
    with pytest.raises(sluice.StoreError) as error:
        sluice.Limiter("redis://user:hunter2@127.0.0.1:1/?timeout_ms=zero", {"api": "1/s"})
    assert "hunter2" not in str(error.value)
    with pytest.raises(ValueError):
        sluice.Limiter(policies={"api": "1/s"}, near_cache=(10, 0.0))


def test_client_ip_believes_only_trusted_proxies():
    untrusted = sluice.ClientIp()
    forwarded = [("X-Forwarded-For", "203.0.113.9, 10.0.0.2")]
    assert untrusted.resolve("198.51.100.7", forwarded) == "198.51.100.7"
    trusted = sluice.ClientIp(["10.0.0.0/8"])
    assert trusted.resolve("10.0.0.3", forwarded) == "203.0.113.9"
    assert trusted.key("2001:db8::1") == "2001:db8::/64"
    rfc = sluice.ClientIp(["10.0.0.3"], header="forwarded")
    assert rfc.resolve("10.0.0.3", [("Forwarded", 'for="[2001:db8::5]:4711"')]) == "2001:db8::5"
    with pytest.raises(ValueError):
        sluice.ClientIp(["not-a-network"])
    with pytest.raises(ValueError):
        sluice.ClientIp(header="x-real-ip")
    with pytest.raises(ValueError):
        trusted.key("nowhere")
    assert sluice.hashed("alice") == sluice.hashed("alice") != sluice.hashed("bob")
    assert len(sluice.hashed("alice")) == 32


def test_async_calls_decide_exactly_on_memory():
    limiter = sluice.Limiter(policies={"api": "user:50/h"})

    async def main() -> list[sluice.Decision]:
        return await asyncio.gather(
            *(limiter.check_async("api", {"user": "u"}) for _ in range(80))
        )

    decisions = asyncio.run(main())
    assert sum(d.allowed for d in decisions) == 50


def redis_policies(namespace: str, rule: str) -> dict:
    return {"api": {"rule": rule, "namespace": namespace}}


def test_redis_threads_share_one_exact_limit(redis_url: str, namespace: str):
    limiter = sluice.Limiter(redis_url, redis_policies(namespace, "user:100/h"))
    barrier = threading.Barrier(8)

    def hits(_: int) -> int:
        barrier.wait()
        return sum(limiter.check("api", {"user": "u"}).allowed for _ in range(40))

    with ThreadPoolExecutor(8) as pool:
        admitted = sum(pool.map(hits, range(8)))
    assert admitted == 100
    assert limiter.peek("api", {"user": "u"}).remaining == 0


def test_redis_two_limiters_and_asyncio_share_one_exact_limit(redis_url: str, namespace: str):
    one = sluice.Limiter(redis_url, redis_policies(namespace, "user:100/h"))
    two = sluice.Limiter(redis_url, redis_policies(namespace, "user:100/h"))

    async def main() -> list[sluice.Decision]:
        calls = [l.check_async("api", {"user": "u"}) for l in (one, two) for _ in range(90)]
        return await asyncio.gather(*calls)

    decisions = asyncio.run(main())
    assert sum(d.allowed for d in decisions) == 100
    denied = [d for d in decisions if not d.allowed]
    assert all(d.denial == "limited" and d.retry_after > 0 for d in denied)

    async def pardon() -> sluice.Decision:
        await one.reset_async("api", {"user": "u"})
        return await two.peek_async("api", {"user": "u"})

    after = asyncio.run(pardon())
    assert after.allowed and after.remaining == 99  # a peek answers as if it were hit


def test_a_lost_redis_falls_back_to_the_policys_failure_mode(namespace: str):
    with own_redis_server() as port:
        url = f"redis://127.0.0.1:{port}?timeout_ms=200"
        limiter = sluice.Limiter(
            url,
            {
                "closed": {"rule": "user:5/h", "failure": "closed", "namespace": namespace},
                "open": {"rule": "user:5/h", "failure": "open", "namespace": namespace},
            },
        )
        assert limiter.check("closed", {"user": "u"}).without_store is None
    closed = limiter.check("closed", {"user": "u"})
    assert (closed.allowed, closed.denial, closed.without_store) == (
        False,
        "store_unavailable",
        "closed",
    )
    assert closed.refusal()[0] == 503
    opened = limiter.check("open", {"user": "u"})
    assert (opened.allowed, opened.without_store) == (True, "open")
    assert limiter.stats()["failed_closed"] >= 1
