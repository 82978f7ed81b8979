"""`sluice.tornado` through Tornado's own test machinery (`AsyncHTTPTestCase`, `gen_test`), on
the memory store and on a real Redis.

The same cases run against both stores: `Cases` holds them and each `Test*` class picks the
store in an autouse fixture (pytest runs it before `setUp`, so `get_app` sees it). Every policy
spans an hour, so no test depends on time passing.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any, Optional
from urllib.parse import urlencode

import pytest
import redis
from tornado.httpclient import HTTPResponse
from tornado.testing import AsyncHTTPTestCase, gen_test
from tornado.web import Application, RequestHandler

import sluice
from sluice.tornado import RateLimited, RefusalMixin, limited, ratelimit

POLICIES = {
    "page": "ip:3/h",
    "page_async": "ip:3/h",
    "login": "username:3/h",
    "user": "user:2/h",
    "override": "ip:1/h",
    "soft": "ip:2/h",
    "proxied": "ip:2/h",
    "context": "username:10/h",
    "slots": "ip:1 concurrent",
}


def make_limiter(store: str, namespace: str) -> sluice.Limiter:
    return sluice.Limiter(
        store, {name: {"rule": rule, "namespace": namespace} for name, rule in POLICIES.items()}
    )


def count_run(handler: RequestHandler) -> None:
    """Counts the handler bodies that ran, to prove a refusal never reaches them."""
    handler.settings["runs"][type(handler).__name__] += 1


class Page(RequestHandler):
    @ratelimit("page", key={"ip": "ip"})
    def get(self) -> None:
        count_run(self)
        self.write("ok")


class AsyncPage(RequestHandler):
    @ratelimit("page_async", key={"ip": "ip"})
    async def get(self) -> None:
        await asyncio.sleep(0)  # a real suspension: the method is a coroutine the IOLoop drives
        count_run(self)
        self.write("ok")


class Login(RequestHandler):
    """Limited on POST only: the decorator sits on `prepare`, which runs for every method."""

    @ratelimit("login", key={"username": "post:username"}, method="POST")
    def prepare(self) -> None:
        pass

    def get(self) -> None:
        self.write("form")

    def post(self) -> None:
        count_run(self)
        self.write("welcome " + self.get_body_argument("username"))


class Account:
    def __init__(self, id: int):
        self.id = id


class Profile(RequestHandler):
    def get_current_user(self) -> Optional[Account]:
        # Stands in for a session lookup: the test names the user in a header.
        user = self.request.headers.get("X-Test-User")
        return Account(int(user)) if user else None

    @ratelimit("user", key={"user": "user"})
    def get(self) -> None:
        self.write(f"profile {self.current_user.id if self.current_user else 'anonymous'}")


class Override(RequestHandler):
    @ratelimit("override", key={"ip": "ip"})
    def get(self) -> None:
        self.write("ok")

    async def on_rate_limited(self, decision: sluice.Decision) -> None:
        await asyncio.sleep(0)
        self.set_status(429)
        self.write({"error": "slow down", "policy": decision.policy,
                    "wait": round(decision.retry_after)})
        # Not finishing on purpose: sluice must finish it.


class Soft(RequestHandler):
    @ratelimit("soft", key={"ip": "ip"}, block=False)
    def get(self) -> None:
        self.write("limited" if not self.sluice_decision.allowed else "ok")


class Proxied(RequestHandler):
    @ratelimit("proxied", key={"ip": "ip"})
    def get(self) -> None:
        self.write("ok")


class Context(RefusalMixin, RequestHandler):
    async def get(self) -> None:
        username = self.get_query_argument("username")
        async with limited(self.settings["sluice_limiter"], "context", {"username": username}):
            self.write("ok")


class SlotStream(RequestHandler):
    """Streams a first chunk, tells the test, and ends when the test says: its slot is held
    all along."""

    @ratelimit("slots", key={"ip": "ip"})
    async def get(self) -> None:
        self.write("first ")
        await self.flush()
        self.settings["started"].set()
        await self.settings["finish"].wait()
        self.write("last")


class SlotQuick(RequestHandler):
    @ratelimit("slots", key={"ip": "ip"})
    def get(self) -> None:
        self.write("ok")


class SlotFails(RequestHandler):
    @ratelimit("slots", key={"ip": "ip"})
    def get(self) -> None:
        raise RuntimeError("the method failed")


ROUTES = [
    (r"/page", Page),
    (r"/async", AsyncPage),
    (r"/login", Login),
    (r"/profile", Profile),
    (r"/override", Override),
    (r"/soft", Soft),
    (r"/proxied", Proxied),
    (r"/context", Context),
    (r"/slot-stream", SlotStream),
    (r"/slot-quick", SlotQuick),
    (r"/slot-fails", SlotFails),
]


def problem(response: HTTPResponse) -> dict[str, Any]:
    assert response.headers["Content-Type"] == "application/problem+json"
    return json.loads(response.body)


class Cases:
    """The tests every store runs. `store` and `namespace` are set by the subclass's fixture."""

    store: str
    namespace: str

    def get_app(self) -> Application:
        self.runs: Counter[str] = Counter()
        self.limiter = make_limiter(self.store, self.namespace)
        return Application(
            ROUTES,
            sluice_limiter=self.limiter,
            sluice_trusted_proxies=["127.0.0.1/32"],
            runs=self.runs,
            started=asyncio.Event(),
            finish=asyncio.Event(),
        )

    def post_login(self, username: str) -> HTTPResponse:
        return self.fetch("/login", method="POST", body=urlencode({"username": username}))

    def test_limit_reached_at_n_plus_one(self) -> None:
        for remaining in (2, 1, 0):
            response = self.fetch("/page")
            assert response.code == 200
            assert response.body == b"ok"
            assert response.headers["RateLimit-Policy"] == '"page";q=3;w=3600'
            assert f'"page";r={remaining};' in response.headers["RateLimit"]
            assert "Retry-After" not in response.headers
        refused = self.fetch("/page")
        assert refused.code == 429
        # A token comes back every hour / 3.
        assert 1190 <= int(refused.headers["Retry-After"]) <= 1200
        assert '"page";r=0;' in refused.headers["RateLimit"]
        assert refused.headers["RateLimit-Policy"] == '"page";q=3;w=3600'
        body = problem(refused)
        assert body["status"] == 429
        assert body["policy"] == "page"
        assert body["reason"] == "limited"
        assert self.runs["Page"] == 3

    def test_async_method(self) -> None:
        assert [self.fetch("/async").code for _ in range(4)] == [200, 200, 200, 429]
        assert self.runs["AsyncPage"] == 3

    def test_method_filter_on_prepare(self) -> None:
        for _ in range(3):
            assert self.post_login("alice").code == 200
        refused = self.post_login("alice")
        assert refused.code == 429
        assert problem(refused)["policy"] == "login"
        # GET is not limited, even for a client whose POSTs are refused.
        for _ in range(5):
            response = self.fetch("/login")
            assert response.code == 200
            assert "RateLimit" not in response.headers
        # Another username has its own counter.
        assert self.post_login("bob").body == b"welcome bob"
        assert self.runs["Login"] == 4

    def test_user_from_current_user(self) -> None:
        def as_user(user: str) -> int:
            return self.fetch("/profile", headers={"X-Test-User": user}).code

        assert [as_user("7") for _ in range(3)] == [200, 200, 429]
        assert as_user("8") == 200
        # Anonymous requests share one counter rather than escaping the limit.
        assert [self.fetch("/profile").code for _ in range(3)] == [200, 200, 429]

    def test_on_rate_limited_override(self) -> None:
        assert self.fetch("/override").code == 200
        refused = self.fetch("/override")
        assert refused.code == 429
        assert refused.headers["Content-Type"].startswith("application/json")
        assert json.loads(refused.body) == {"error": "slow down", "policy": "override",
                                            "wait": 3600}  # ip:1/h
        assert "Retry-After" not in refused.headers

    def test_block_false_lets_the_handler_decide(self) -> None:
        assert [self.fetch("/soft").body for _ in range(3)] == [b"ok", b"ok", b"limited"]
        third = self.fetch("/soft")
        assert third.code == 200
        assert '"soft";r=0;' in third.headers["RateLimit"]
        assert "Retry-After" not in third.headers

    def test_trusted_proxy_forwarding(self) -> None:
        def from_client(forwarded_for: str) -> int:
            return self.fetch("/proxied", headers={"X-Forwarded-For": forwarded_for}).code

        assert [from_client("198.51.100.7") for _ in range(3)] == [200, 200, 429]
        assert from_client("198.51.100.8") == 200
        # The address the trusted proxy saw decides; what the client claimed before it does not.
        assert from_client("203.0.113.1, 198.51.100.8") == 200
        assert from_client("203.0.113.2, 198.51.100.8") == 429

    def test_context_manager_in_handler(self) -> None:
        def attempt(username: str) -> HTTPResponse:
            return self.fetch("/context?" + urlencode({"username": username}))

        assert all(attempt("erin").code == 200 for _ in range(10))
        refused = attempt("erin")
        assert refused.code == 429
        assert int(refused.headers["Retry-After"]) > 0
        assert problem(refused)["policy"] == "context"
        assert attempt("frank").code == 200

    @gen_test
    async def test_limited_raises_after_n(self) -> None:
        for used in range(10):
            async with limited(self.limiter, "context", {"username": "carol"}) as decision:
                assert decision.allowed
                assert decision.remaining == 9 - used
        body_ran = False
        with pytest.raises(RateLimited) as refused:
            async with limited(self.limiter, "context", {"username": "carol"}):
                body_ran = True
        assert not body_ran
        assert refused.value.decision.denial == "limited"
        assert refused.value.policy == "context"
        assert refused.value.status_code == 429
        assert 350 < refused.value.retry_after <= 360  # hour / 10
        async with limited(self.limiter, "context", {"username": "dave"}) as decision:
            assert decision.remaining == 9

    @gen_test
    async def test_a_concurrency_policy_holds_its_slot_until_the_response_finishes(self) -> None:
        settings = self._app.settings
        stream = asyncio.ensure_future(self.http_client.fetch(self.get_url("/slot-stream")))
        await settings["started"].wait()  # the first chunk is out: the stream holds the slot
        refused = await self.http_client.fetch(self.get_url("/slot-quick"), raise_error=False)
        assert refused.code == 429
        assert problem(refused)["reason"] == "occupied"
        settings["finish"].set()
        done = await stream
        assert (done.code, done.body) == (200, b"first last")
        assert await self.admitted_once_released("/slot-quick")
        # A method that raises gives its slot back too (Tornado finishes with a 500).
        failed = await self.http_client.fetch(self.get_url("/slot-fails"), raise_error=False)
        assert failed.code == 500
        assert await self.admitted_once_released("/slot-quick")

    async def admitted_once_released(self, path: str) -> bool:
        """The slot goes back in the background once the response has finished: polls the
        real handler until it is admitted (a few tries at most)."""
        for _ in range(100):
            answer = await self.http_client.fetch(self.get_url(path), raise_error=False)
            if answer.code == 200:
                return True
            await asyncio.sleep(0.01)  # polling a real server, not standing in for a sync
        return False

    @gen_test
    async def test_limited_holds_a_lease_under_a_concurrency_policy(self) -> None:
        async with limited(self.limiter, "slots", {"ip": "a"}) as decision:
            assert decision.allowed and decision.remaining == 0
            with pytest.raises(RateLimited) as refused:
                async with limited(self.limiter, "slots", {"ip": "a"}):
                    pass
            assert refused.value.decision.denial == "occupied"
        with limited(self.limiter, "slots", {"ip": "a"}) as decision:  # released on exit
            assert decision.allowed
        with pytest.raises(ValueError, match="cost must be 1"):
            async with limited(self.limiter, "slots", {"ip": "a"}, cost=2):
                pass

    def test_sync_limited(self) -> None:
        for _ in range(10):
            with limited(self.limiter, "context", {"username": "grace"}):
                pass
        with pytest.raises(RateLimited) as refused:
            with limited(self.limiter, "context", {"username": "grace"}):
                pass
        assert refused.value.retry_after > 0
        assert "context" in str(refused.value)


class TestMemory(Cases, AsyncHTTPTestCase):
    @pytest.fixture(autouse=True)
    def _memory_store(self, namespace: str) -> None:
        self.store = "memory://"
        self.namespace = namespace


class TestRedis(Cases, AsyncHTTPTestCase):
    @pytest.fixture(autouse=True)
    def _redis_store(self, redis_url: str, namespace: str) -> None:
        self.store = redis_url
        self.namespace = namespace

    def test_posted_fields_are_hashed_in_the_store(self) -> None:
        username = "mallory-the-login-name"
        assert self.post_login(username).code == 200
        client = redis.Redis.from_url(self.store)
        keys = [key.decode() for key in client.scan_iter(f"*{self.namespace}*")]
        assert keys, "the hit was not stored in this test's namespace"
        assert not [key for key in keys if username in key]


class TestWithoutTrustedProxies(AsyncHTTPTestCase):
    """No `sluice_trusted_proxies`, no xheaders: forwarding headers are nobody's word."""

    def get_app(self) -> Application:
        self.limiter = make_limiter("memory://", "untrusted")
        return Application(ROUTES, sluice_limiter=self.limiter)

    def test_forwarded_for_is_ignored(self) -> None:
        codes = [
            self.fetch("/proxied", headers={"X-Forwarded-For": f"198.51.100.{n}"}).code
            for n in range(3)
        ]
        assert codes == [200, 200, 429]


class TestXheadersWithTrustedProxies(AsyncHTTPTestCase):
    """xheaders on, but the app gives sluice its own (empty) list of trusted proxies: sluice
    keys by the socket's peer, not by the `remote_ip` Tornado rewrote from a client's header."""

    def get_app(self) -> Application:
        self.limiter = make_limiter("memory://", "xheaders")
        return Application(ROUTES, sluice_limiter=self.limiter, sluice_trusted_proxies=[])

    def get_httpserver_options(self) -> dict[str, Any]:
        return {"xheaders": True}

    def test_spoofed_real_ip_is_ignored(self) -> None:
        codes = [
            self.fetch("/proxied", headers={"X-Real-Ip": f"198.51.100.{n}"}).code
            for n in range(3)
        ]
        assert codes == [200, 200, 429]


class TestXheadersAlone(AsyncHTTPTestCase):
    """xheaders on and no `sluice_trusted_proxies`: sluice follows Tornado's `remote_ip`."""

    def get_app(self) -> Application:
        self.limiter = make_limiter("memory://", "xheaders-alone")
        return Application(ROUTES, sluice_limiter=self.limiter)

    def get_httpserver_options(self) -> dict[str, Any]:
        return {"xheaders": True}

    def test_remote_ip_decides(self) -> None:
        codes = [
            self.fetch("/proxied", headers={"X-Real-Ip": f"198.51.100.{n}"}).code
            for n in range(3)
        ]
        assert codes == [200, 200, 200]


@pytest.mark.parametrize("store", ["memory", "redis"])
def test_limited_in_plain_asyncio(store: str, request: pytest.FixtureRequest,
                                  namespace: str) -> None:
    """`limited` needs no Tornado: any running asyncio loop will do."""
    url = "memory://" if store == "memory" else request.getfixturevalue("redis_url")
    limiter = sluice.Limiter(url, {"login": {"rule": "username:10/h", "namespace": namespace}})

    async def attempts() -> int:
        admitted = 0
        try:
            for _ in range(20):
                async with limited(limiter, "login", {"username": "heidi"}):
                    admitted += 1
        except RateLimited as refused:
            assert refused.retry_after is not None and refused.retry_after > 0
        return admitted

    assert asyncio.run(attempts()) == 10


def test_bad_key_source_fails_at_decoration() -> None:
    with pytest.raises(ValueError, match="header:NAME"):
        ratelimit("page", key={"ip": "remote_addr"})


def test_missing_selector_fails_at_decoration_with_a_limiter() -> None:
    limiter = sluice.Limiter(policies={"both": "ip+user:5/h"})
    with pytest.raises(sluice.MissingSelector) as missing:
        ratelimit("both", key={"ip": "ip"}, limiter=limiter)
    assert missing.value.selector == "user"
    with pytest.raises(sluice.UnknownPolicy):
        ratelimit("nope", key={"ip": "ip"}, limiter=limiter)
