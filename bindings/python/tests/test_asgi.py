"""sluice.asgi under Starlette's and FastAPI's own test clients (and httpx's ASGI transport for
concurrent requests), on the memory store and a real Redis."""

from __future__ import annotations

import asyncio
import re
from typing import Any, Optional

import httpx
import pytest
from fastapi import APIRouter, Depends, FastAPI
from starlette.applications import Starlette
from starlette.authentication import AuthCredentials, AuthenticationBackend, SimpleUser
from starlette.middleware import Middleware
from starlette.middleware.authentication import AuthenticationMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.testclient import TestClient

import sluice
from conftest import policy
from sluice.asgi import MAX_FORM_BYTES, RateLimit, RateLimited, RateLimitMiddleware, install

CLIENT = ("203.0.113.5", 50000)


async def echo(request: Request) -> Response:
    """Answers the body it received, so a test sees it arrived intact."""
    return Response(await request.body(), media_type="application/octet-stream")


ROUTES = [
    Route("/api/items", echo, methods=["GET", "POST"]),
    Route("/users/{id}/login", echo, methods=["GET", "POST"]),
    Route("/public", echo, methods=["GET", "POST"]),
]


def limited_app(limiter: sluice.Limiter, policy_name: str, **options: Any) -> Starlette:
    return Starlette(routes=ROUTES, middleware=[
        Middleware(RateLimitMiddleware, limiter=limiter, policy=policy_name, **options),
    ])


def statuses(client: TestClient, count: int, method: str = "GET", path: str = "/api/items",
             **kwargs: Any) -> list[int]:
    return [client.request(method, path, **kwargs).status_code for _ in range(count)]


# --- the middleware ---------------------------------------------------------------------------


def test_limit_reached_at_n_plus_one(store, namespace):
    limiter = sluice.Limiter(store, {"api": policy("ip:3/h", namespace)})
    client = TestClient(limited_app(limiter, "api", key={"ip": "ip"}), client=CLIENT)

    for remaining in (2, 1, 0):
        response = client.get("/api/items")
        assert response.status_code == 200
        assert response.headers["ratelimit-policy"] == '"api";q=3;w=3600'
        assert f"r={remaining}" in response.headers["ratelimit"]
        assert "retry-after" not in response.headers

    refusal = client.get("/api/items")
    assert refusal.status_code == 429
    assert refusal.headers["content-type"] == "application/problem+json"
    assert int(refusal.headers["retry-after"]) > 0
    assert "r=0" in refusal.headers["ratelimit"]
    problem = refusal.json()
    assert (problem["status"], problem["policy"], problem["reason"]) == (429, "api", "limited")

    other = TestClient(client.app, client=("198.51.100.7", 1))
    assert other.get("/api/items").status_code == 200


def test_default_key_and_trusted_proxies():
    limiter = sluice.Limiter(policies={"api": "ip:1/h"})
    app = limited_app(limiter, "api", trusted_proxies=["10.0.0.0/8"])  # key from the rule
    via_proxy = TestClient(app, client=("10.1.2.3", 1))
    assert via_proxy.get("/public", headers={"x-forwarded-for": "192.0.2.1"}).status_code == 200
    assert via_proxy.get("/public", headers={"x-forwarded-for": "192.0.2.2"}).status_code == 200
    assert via_proxy.get("/public", headers={"x-forwarded-for": "192.0.2.1"}).status_code == 429
    direct = TestClient(app, client=("198.51.100.1", 1))
    assert direct.get("/public", headers={"x-forwarded-for": "1.1.1.1"}).status_code == 200
    assert direct.get("/public", headers={"x-forwarded-for": "2.2.2.2"}).status_code == 429


def test_method_filter(store, namespace):
    limiter = sluice.Limiter(store, {"writes": policy("ip:1/h", namespace)})
    client = TestClient(limited_app(limiter, "writes", key={"ip": "ip"}, method="POST"),
                        client=CLIENT)
    assert statuses(client, 3, "GET") == [200, 200, 200]
    assert "ratelimit" not in client.get("/api/items").headers  # never checked
    assert statuses(client, 2, "POST") == [200, 429]
    assert client.get("/api/items").status_code == 200


def test_paths_filter(store, namespace):
    limiter = sluice.Limiter(store, {"api": policy("ip:1/h", namespace)})
    paths = ["/api/", re.compile(r"/users/\d+/login$")]
    client = TestClient(limited_app(limiter, "api", key={"ip": "ip"}, paths=paths),
                        client=CLIENT)
    assert statuses(client, 3, path="/public") == [200, 200, 200]
    assert statuses(client, 2, path="/api/items") == [200, 429]
    assert client.get("/users/7/login").status_code == 429  # the same counter
    assert client.get("/users/me/login").status_code == 200  # the regex does not match


def test_post_field_keys_urlencoded_and_multipart_and_body_arrives_intact(store, namespace):
    limiter = sluice.Limiter(store, {"login": policy("username:2/h", namespace)})
    client = TestClient(limited_app(limiter, "login", key={"username": "post:username"}),
                        client=CLIENT)

    first = client.post("/public", data={"username": "alice", "password": "s3cret"})
    assert first.status_code == 200
    assert first.content == b"username=alice&password=s3cret"
    multipart = client.post("/public", data={"username": "alice"},
                            files={"avatar": ("a.png", b"\x89PNG-bytes", "image/png")})
    assert multipart.status_code == 200
    assert b"\x89PNG-bytes" in multipart.content and b'name="username"' in multipart.content
    assert client.post("/public", data={"username": "alice"}).status_code == 429
    assert client.post("/public", data={"username": "bob"}).status_code == 200
    # The store counts the hash of the field, never the name in clear.
    assert not limiter.peek("login", {"username": sluice.hashed("alice")}).allowed
    assert limiter.peek("login", {"username": "alice"}).allowed


def test_oversized_body_counts_as_missing_field_and_still_reaches_the_app():
    limiter = sluice.Limiter(policies={"login": "username:2/h"})
    client = TestClient(limited_app(limiter, "login", key={"username": "post:username"}),
                        client=CLIENT)
    big = b"username=alice&pad=" + b"x" * MAX_FORM_BYTES
    response = client.post("/public", content=big,
                           headers={"content-type": "application/x-www-form-urlencoded"})
    assert response.status_code == 200
    assert response.content == big
    # The big body was keyed as "no username": a request without the field is the second hit.
    assert client.post("/public", data={"other": "1"}).status_code == 200
    assert client.post("/public", data={"other": "2"}).status_code == 429
    assert limiter.peek("login", {"username": sluice.hashed("alice")}).remaining == 1


async def call_asgi(app, chunks: list[bytes], headers: list[tuple[bytes, bytes]]) -> list[dict]:
    """Sends one POST as several body messages straight through the ASGI interface; returns
    the messages sent back."""
    incoming = [{"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1}
                for i, chunk in enumerate(chunks)]
    sent: list[dict] = []

    async def receive() -> dict:
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
             "scheme": "http", "path": "/", "raw_path": b"/", "query_string": b"",
             "root_path": "", "headers": headers, "client": CLIENT, "server": ("test", 80)}
    await app(scope, receive, send)
    return sent


def test_streamed_body_is_buffered_bounded_and_replayed():
    limiter = sluice.Limiter(policies={"login": "username:5/h"})
    received: list[bytes] = []

    async def inner(scope, receive, send):
        while True:
            message = await receive()
            received.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    middleware = RateLimitMiddleware(inner, limiter, "login", key={"username": "post:username"})
    form = [(b"content-type", b"application/x-www-form-urlencoded")]

    sent = asyncio.run(call_asgi(middleware, [b"user", b"name=al", b"ice&x=1"], form))
    assert sent[0]["status"] == 204
    assert b"".join(received) == b"username=alice&x=1"
    assert limiter.peek("login", {"username": sluice.hashed("alice")}).remaining == 3

    # No content-length and more than the bound: read no further than needed, keyed as missing,
    # and every byte still reaches the app.
    received.clear()
    chunks = [b"username=bob&pad="] + [b"y" * 40_000] * 3
    sent = asyncio.run(call_asgi(middleware, chunks, form))
    assert sent[0]["status"] == 204
    assert b"".join(received) == b"".join(chunks)
    assert limiter.peek("login", {"username": ""}).remaining == 3
    assert limiter.peek("login", {"username": sluice.hashed("bob")}).remaining == 4


def test_header_query_const_and_callable_sources():
    limiter = sluice.Limiter(policies={"api": "tenant+plan+token+agent:1/h"})
    key = {
        "tenant": "header:X-Tenant",
        "plan": "const:free",
        "token": "get:token",
        "agent": lambda request: request.headers["user-agent"].split("/")[0],
    }
    client = TestClient(limited_app(limiter, "api", key=key), client=CLIENT)
    headers = {"x-tenant": "acme", "user-agent": "probe/1"}
    assert client.get("/public?token=t1", headers=headers).status_code == 200
    assert client.get("/public?token=t1", headers=headers).status_code == 429
    assert client.get("/public?token=t2", headers=headers).status_code == 200
    assert not limiter.peek("api", {"tenant": "acme", "plan": "free", "token": "t1",
                                    "agent": "probe"}).allowed


class HeaderAuth(AuthenticationBackend):
    """Authenticates whoever names themselves in X-User: enough to give Starlette a user."""

    async def authenticate(self, conn):
        name = conn.headers.get("x-user")
        if name is None:
            return None
        return AuthCredentials(["authenticated"]), SimpleUser(name)


def test_user_from_authentication_middleware():
    limiter = sluice.Limiter(policies={"api": "user:1/h"})
    app = Starlette(routes=ROUTES, middleware=[
        Middleware(AuthenticationMiddleware, backend=HeaderAuth()),
        Middleware(RateLimitMiddleware, limiter=limiter, policy="api"),
    ])
    client = TestClient(app, client=CLIENT)
    assert client.get("/public", headers={"x-user": "alice"}).status_code == 200
    assert client.get("/public", headers={"x-user": "alice"}).status_code == 429
    assert client.get("/public", headers={"x-user": "bob"}).status_code == 200
    assert client.get("/public").status_code == 200  # anonymous: the empty user
    assert client.get("/public").status_code == 429
    assert not limiter.peek("api", {"user": "alice"}).allowed


def test_custom_on_refused_sync_and_async():
    limiter = sluice.Limiter(policies={"a": "ip:1/h", "b": "ip:1/h"})
    calls = []

    def plain(request, decision, selectors):
        calls.append((request.url.path, decision.policy, selectors))
        return PlainTextResponse("slow down", status_code=429)

    async def json_answer(request, decision, selectors):
        return JSONResponse({"leaf": decision.leaf}, status_code=429)

    app = Starlette(routes=ROUTES, middleware=[
        Middleware(RateLimitMiddleware, limiter=limiter, policy="a", key={"ip": "ip"},
                   paths=["/public"], on_refused=plain),
        Middleware(RateLimitMiddleware, limiter=limiter, policy="b", key={"ip": "ip"},
                   paths=["/api/"], on_refused=json_answer),
    ])
    client = TestClient(app, client=CLIENT)
    assert statuses(client, 1, path="/public") == [200]
    refusal = client.get("/public")
    assert (refusal.status_code, refusal.text) == (429, "slow down")
    assert calls == [("/public", "a", {"ip": "203.0.113.5"})]
    assert statuses(client, 1) == [200]
    assert client.get("/api/items").json() == {"leaf": "ip:1/h"}


def test_headers_can_be_turned_off_and_lifespan_passes_through():
    limiter = sluice.Limiter(policies={"api": "ip:1/h"})
    with TestClient(limited_app(limiter, "api", key={"ip": "ip"}, headers=False),
                    client=CLIENT) as client:
        assert "ratelimit" not in client.get("/public").headers
        refusal = client.get("/public")
        assert refusal.status_code == 429
        assert "retry-after" in refusal.headers  # a refusal keeps its own fields


def test_unknown_policy_and_bad_key_fail_at_startup():
    limiter = sluice.Limiter(policies={"api": "ip:1/h"})
    with pytest.raises(sluice.UnknownPolicy):
        RateLimitMiddleware(echo, limiter, "nope")
    with pytest.raises(ValueError, match="expected 'ip'"):
        RateLimitMiddleware(echo, limiter, "api", key={"ip": "remote_addr"})


def test_concurrent_requests_await_the_store_and_count_exactly(redis_url, namespace):
    """Twelve requests at once against Redis: exactly five admitted, with distinct remaining
    counts; and while the first waits for Redis, the others enter (the loop is not blocked)."""
    limiter = sluice.Limiter(redis_url, {"api": policy("ip:5/h", namespace)})
    events: list[str] = []

    async def endpoint(request: Request) -> Response:
        events.append("endpoint")
        return PlainTextResponse("ok")

    limited = RateLimitMiddleware(Starlette(routes=[Route("/", endpoint)]), limiter, "api",
                                  key={"ip": "ip"})

    async def recording(scope, receive, send):
        if scope["type"] == "http":
            events.append("enter")
        await limited(scope, receive, send)

    async def burst() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=recording, client=CLIENT)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await asyncio.gather(*(client.get("/") for _ in range(12)))

    responses = asyncio.run(burst())
    assert sorted(r.status_code for r in responses) == [200] * 5 + [429] * 7
    remaining = sorted(int(re.search(r"r=(\d+)", r.headers["ratelimit"]).group(1))
                       for r in responses if r.status_code == 200)
    assert remaining == [0, 1, 2, 3, 4]
    # A blocking check would run each request to its endpoint before the next one entered.
    assert events.index("endpoint") > 1
    assert not limiter.peek("api", {"ip": CLIENT[0]}).allowed


# --- the FastAPI dependency -------------------------------------------------------------------


def fastapi_app(limiter: sluice.Limiter, policy_name: str, installed: bool = True,
                **options: Any) -> FastAPI:
    app = FastAPI()
    if installed:
        install(app)
    limit = RateLimit(limiter, policy_name, **options)

    @app.get("/items", dependencies=[Depends(limit)])
    async def items() -> dict:
        return {"items": []}

    @app.post("/login")
    async def login(request: Request,
                    decision: Optional[sluice.Decision] = Depends(limit)) -> dict:
        body = await request.body()
        return {"body": body.decode(), "remaining": None if decision is None
                else decision.remaining}

    return app


def test_dependency_limits_and_answers_problem_json(store, namespace):
    limiter = sluice.Limiter(store, {"api": policy("ip:2/h", namespace)})
    client = TestClient(fastapi_app(limiter, "api", key={"ip": "ip"}), client=CLIENT)
    first = client.get("/items")
    assert first.status_code == 200
    assert first.json() == {"items": []}
    assert first.headers["ratelimit-policy"] == '"api";q=2;w=3600'
    assert "r=1" in first.headers["ratelimit"]
    assert client.get("/items").status_code == 200
    refusal = client.get("/items")
    assert refusal.status_code == 429
    assert refusal.headers["content-type"] == "application/problem+json"
    assert int(refusal.headers["retry-after"]) > 0
    assert refusal.json()["policy"] == "api"


def test_dependency_without_install_uses_fastapi_default_handler():
    limiter = sluice.Limiter(policies={"api": "ip:1/h"})
    client = TestClient(fastapi_app(limiter, "api", installed=False), client=CLIENT)
    client.get("/items")
    refusal = client.get("/items")
    assert refusal.status_code == 429
    assert refusal.json() == {"detail": "Too Many Requests"}
    assert "retry-after" in refusal.headers and "ratelimit" in refusal.headers


def test_dependency_custom_handler_sees_the_decision():
    limiter = sluice.Limiter(policies={"api": "ip:1/h"})
    app = fastapi_app(limiter, "api", installed=False)

    @app.exception_handler(RateLimited)
    async def limited(request, exc: RateLimited):
        return JSONResponse({"leaf": exc.decision.leaf, "who": exc.selectors},
                            status_code=exc.status_code, headers=exc.headers)

    client = TestClient(app, client=CLIENT)
    client.get("/items")
    refusal = client.get("/items")
    assert refusal.status_code == 429
    assert refusal.json() == {"leaf": "ip:1/h", "who": {"ip": "203.0.113.5"}}


def test_dependency_post_field_method_filter_and_body_still_readable(store, namespace):
    limiter = sluice.Limiter(store, {"login": policy("username:1/h", namespace)})
    client = TestClient(
        fastapi_app(limiter, "login", key={"username": "post:username"}, method="POST"),
        client=CLIENT)
    assert [client.get("/items").status_code for _ in range(3)] == [200, 200, 200]
    first = client.post("/login", data={"username": "alice"})
    assert first.json() == {"body": "username=alice", "remaining": 0}
    assert client.post("/login", data={"username": "alice"}).status_code == 429
    assert client.post("/login", data={"username": "bob"}).status_code == 200
    assert not limiter.peek("login", {"username": sluice.hashed("alice")}).allowed


def test_dependency_block_false_returns_the_decision():
    limiter = sluice.Limiter(policies={"api": "ip:1/h"})
    client = TestClient(fastapi_app(limiter, "api", block=False), client=CLIENT)
    assert client.post("/login").json()["remaining"] == 0
    second = client.post("/login")
    assert second.status_code == 200
    assert second.json()["remaining"] == 0
    assert "retry-after" not in second.headers


def test_dependency_on_a_router_and_user_from_scope():
    limiter = sluice.Limiter(policies={"api": "user:1/h"})
    router = APIRouter(dependencies=[Depends(RateLimit(limiter, "api"))])

    @router.get("/me")
    async def me() -> dict:
        return {}

    app = FastAPI(middleware=[Middleware(AuthenticationMiddleware, backend=HeaderAuth())])
    app.include_router(router)
    install(app)
    client = TestClient(app, client=CLIENT)
    assert client.get("/me", headers={"x-user": "alice"}).status_code == 200
    assert client.get("/me", headers={"x-user": "alice"}).status_code == 429
    assert client.get("/me", headers={"x-user": "carol"}).status_code == 200


# --- concurrency policies -------------------------------------------------------------------


def streaming_app(limiter: sluice.Limiter, started: asyncio.Event, finish: asyncio.Event,
                  **options: Any) -> Starlette:
    """`/download` streams a first chunk, tells `started`, and ends when `finish` is set;
    `/quick` answers at once; `/fails` raises."""
    from starlette.responses import StreamingResponse

    async def chunks():
        yield b"first "
        started.set()
        await finish.wait()
        yield b"last"

    async def download(request: Request) -> Response:
        return StreamingResponse(chunks(), media_type="text/plain")

    async def quick(request: Request) -> Response:
        return PlainTextResponse("ok")

    async def fails(request: Request) -> Response:
        raise RuntimeError("the endpoint failed")

    routes = [Route("/download", download), Route("/quick", quick), Route("/fails", fails)]
    return Starlette(routes=routes, middleware=[
        Middleware(RateLimitMiddleware, limiter=limiter, **options),
    ])


def test_a_streaming_response_keeps_its_slot_until_its_last_chunk(store, namespace):
    limiter = sluice.Limiter(store, {"downloads": policy("ip:1 concurrent", namespace)})

    async def main() -> None:
        started, finish = asyncio.Event(), asyncio.Event()
        app = streaming_app(limiter, started, finish, policy="downloads", key={"ip": "ip"})
        transport = httpx.ASGITransport(app=app, client=CLIENT)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            download = asyncio.create_task(client.get("/download"))
            await started.wait()  # the first chunk is out: the stream holds the slot
            refused = await client.get("/quick")
            assert refused.status_code == 429
            assert refused.json()["reason"] == "occupied"
            assert "retry-after" in refused.headers
            finish.set()
            done = await download
            assert (done.status_code, done.text) == (200, "first last")
            assert "ratelimit" in done.headers
            # The stream ended: its slot is free.
            assert (await client.get("/quick")).status_code == 200
            # An endpoint that raises gives its slot back too.
            with pytest.raises(RuntimeError):
                await client.get("/fails")
            assert (await client.get("/quick")).status_code == 200

    asyncio.run(main())


def test_concurrent_requests_never_hold_more_than_the_limit(store, namespace):
    limiter = sluice.Limiter(store, {"upstream": policy("3 concurrent", namespace)})
    holding, most, served = 0, 0, 0
    everyone_tried = asyncio.Event()

    async def work(request: Request) -> Response:
        nonlocal holding, most, served
        holding += 1
        most = max(most, holding)
        # Hold the slot until every request has been refused or is being served.
        await everyone_tried.wait()
        holding -= 1
        served += 1
        return PlainTextResponse("ok")

    app = Starlette(routes=[Route("/work", work)], middleware=[
        Middleware(RateLimitMiddleware, limiter=limiter, policy="upstream"),
    ])

    async def main() -> list[int]:
        transport = httpx.ASGITransport(app=app, client=CLIENT)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            requests = [asyncio.create_task(client.get("/work")) for _ in range(12)]
            # Until every request is answered (refused) or being served: a condition
            # checked at each turn of the loop, not a timed wait.
            while sum(r.done() for r in requests) + holding < 12:
                await asyncio.sleep(0)
            everyone_tried.set()
            return [r.status_code for r in await asyncio.gather(*requests)]

    codes = asyncio.run(main())
    assert sorted(codes) == [200] * 3 + [429] * 9
    assert (most, served) == (3, 3)


def test_concurrency_policies_refuse_what_cannot_hold_a_slot():
    limiter = sluice.Limiter(policies={"slots": "user:2 concurrent"})
    with pytest.raises(sluice.SluiceError, match="RateLimitMiddleware"):
        RateLimit(limiter, "slots")
    with pytest.raises(ValueError, match="cost must be 1"):
        RateLimitMiddleware(echo, limiter, "slots", cost=2)
    assert limiter.concurrent("slots") and not sluice.Limiter(
        policies={"api": "1/s"}).concurrent("api")
    with pytest.raises(sluice.UnknownPolicy):
        limiter.concurrent("nope")
