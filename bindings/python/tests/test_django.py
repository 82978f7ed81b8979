"""`sluice.django` through Django's own test client and request factory, against the
memory store and a real Redis, and side by side with a real `sluice serve`.

Django is configured here with `settings.configure` (the values of `djangoapp.settings`),
not through DJANGO_SETTINGS_MODULE, so the other frameworks' test files never see it.
Every policy spans an hour: no test depends on the clock."""

from __future__ import annotations

import json
import threading
import urllib.request
from typing import Any, Iterator

import django
import pytest
from asgiref.sync import async_to_sync
from django.conf import settings

if not settings.configured:
    from djangoapp import settings as djangoapp_settings

    settings.configure(
        **{name: value for name, value in vars(djangoapp_settings).items() if name.isupper()}
    )
    django.setup()

from django.contrib.auth.models import AnonymousUser, User  # noqa: E402 (needs settings)
from django.core.exceptions import ImproperlyConfigured  # noqa: E402
from django.http import HttpResponse  # noqa: E402
from django.test import AsyncRequestFactory, Client, RequestFactory, override_settings  # noqa: E402

import sluice  # noqa: E402
from djangoapp import views  # noqa: E402
from sluice.django import RateLimitMiddleware, get_limiter, ratelimit, refused  # noqa: E402


@pytest.fixture(params=["memory", "redis"])
def store(request: pytest.FixtureRequest) -> str:
    """Each test that takes `store` runs once per store."""
    if request.param == "memory":
        return "memory://"
    return request.getfixturevalue("redis_url")


def sluice_setting(store: str, namespace: str, policies: dict[str, str], **extra: Any) -> dict:
    """A SLUICE setting whose policies live in this test's own namespace."""
    return {
        "STORE": store,
        "POLICIES": {
            name: {"rule": rule, "namespace": namespace} for name, rule in policies.items()
        },
        **extra,
    }


@pytest.fixture
def configure(store: str, namespace: str) -> Iterator[Any]:
    """`configure(policies, **extra)` applies a SLUICE setting until the test ends."""
    overrides: list[override_settings] = []

    def apply(policies: dict[str, str], **extra: Any) -> None:
        override = override_settings(SLUICE=sluice_setting(store, namespace, policies, **extra))
        override.enable()
        overrides.append(override)

    yield apply
    for override in reversed(overrides):
        override.disable()


@pytest.fixture
def signals() -> Iterator[list[dict[str, Any]]]:
    """Every `refused` signal sent during the test, as its keyword arguments."""
    sent: list[dict[str, Any]] = []

    def receive(**kwargs: Any) -> None:
        sent.append(kwargs)

    refused.connect(receive, dispatch_uid="test_django.signals")
    yield sent
    refused.disconnect(dispatch_uid="test_django.signals")


def test_refused_after_the_limit_with_429_retry_after_and_problem_json(configure):
    configure({"hourly": "ip:3/h"})
    client = Client()
    admitted = [client.get("/hourly/") for _ in range(3)]
    assert [r.status_code for r in admitted] == [200, 200, 200]
    assert [r["RateLimit"] for r in admitted] == [
        '"hourly";r=2;t=1200', '"hourly";r=1;t=2400', '"hourly";r=0;t=3600'
    ]
    assert admitted[0]["RateLimit-Policy"] == '"hourly";q=3;w=3600'
    assert not admitted[0].has_header("Retry-After")

    refusal = client.get("/hourly/")
    assert refusal.status_code == 429
    assert refusal["Content-Type"] == "application/problem+json"
    assert 1190 <= int(refusal["Retry-After"]) <= 1200
    assert refusal["RateLimit"].startswith('"hourly";r=0;')
    body = json.loads(refusal.content)
    assert body["status"] == 429
    assert body["policy"] == "hourly"
    assert body["reason"] == "limited"

    # Another address has its own counter.
    assert client.get("/hourly/", REMOTE_ADDR="192.0.2.7").status_code == 200


def test_method_limits_only_those_methods(configure):
    configure({"hourly": "ip:1/h"})
    client = Client()
    gets = [client.get("/posts-only/") for _ in range(4)]
    assert [r.status_code for r in gets] == [200] * 4
    assert not gets[0].has_header("RateLimit")  # not even counted
    assert [client.post("/posts-only/").status_code for _ in range(2)] == [200, 429]
    assert client.get("/posts-only/").status_code == 200


def test_block_false_sets_request_limited_and_runs_the_view(configure, signals):
    configure({"hourly": "ip:2/h"})
    client = Client()
    answers = [client.get("/soft/") for _ in range(3)]
    assert [r.status_code for r in answers] == [200, 200, 200]
    assert [r.json() for r in answers] == [
        {"limited": False, "remaining": 1},
        {"limited": False, "remaining": 0},
        {"limited": True, "remaining": 0},
    ]
    assert not answers[2].has_header("Retry-After")
    assert [s["blocked"] for s in signals] == [False]


@pytest.mark.parametrize("refusal_view", ["djangoapp.views.polite_refusal", views.polite_refusal])
def test_refusal_view_setting_replaces_the_default(configure, refusal_view):
    configure({"hourly": "ip:1/h"}, REFUSAL_VIEW=refusal_view)
    client = Client()
    assert client.get("/hourly/").status_code == 200
    refusal = client.get("/hourly/")
    assert refusal.status_code == 429
    assert refusal.content == b"slow down (hourly)"
    assert refusal["Content-Type"] == "text/plain"
    # The limit's own fields are added to the application's page.
    assert refusal.has_header("Retry-After")
    assert refusal["RateLimit"].startswith('"hourly";r=0;')


def test_refused_signal_names_view_request_policy_decision_and_selectors(configure, signals):
    configure({"hourly": "ip:1/h"})
    client = Client()
    client.get("/hourly/", REMOTE_ADDR="198.51.100.4")
    assert signals == []
    refusal = client.get("/hourly/", REMOTE_ADDR="198.51.100.4")
    assert refusal.status_code == 429
    [sent] = signals
    assert sent["sender"] is views.hourly  # the decorated view, as urls.py routes to it
    assert sent["signal"] is refused
    assert sent["request"].path == "/hourly/"
    assert sent["request"].META["REMOTE_ADDR"] == "198.51.100.4"
    assert sent["policy"] == "hourly"
    assert sent["selectors"] == {"ip": "198.51.100.4"}
    assert sent["blocked"] is True
    decision = sent["decision"]
    assert isinstance(decision, sluice.Decision)
    assert not decision.allowed and decision.policy == "hourly" and decision.leaf == "ip:1/h"


def test_middleware_limits_only_its_path_prefixes(configure, signals):
    configure(
        {"api": "ip:2/h"},
        MIDDLEWARE=[{"policy": "api", "key": {"ip": "ip"}, "paths": ["/api/"]}],
    )
    with override_settings(MIDDLEWARE=["sluice.django.RateLimitMiddleware"]):
        client = Client()
        assert [client.get("/open/ping/").status_code for _ in range(4)] == [200] * 4
        api = [client.get("/api/ping/") for _ in range(3)]
        assert [r.status_code for r in api] == [200, 200, 429]
        assert api[0]["RateLimit"] == '"api";r=1;t=1800'
        assert api[2]["Content-Type"] == "application/problem+json"
        assert api[2].has_header("Retry-After")
        assert client.get("/open/ping/").status_code == 200
    [sent] = signals
    assert sent["sender"] is RateLimitMiddleware
    assert sent["policy"] == "api" and sent["request"].path == "/api/ping/"


def test_middleware_rule_with_a_method_and_every_path(configure):
    configure(
        {"writes": "ip:1/h"},
        MIDDLEWARE=[{"policy": "writes", "key": {"ip": "ip"}, "method": "POST"}],
    )
    with override_settings(MIDDLEWARE=["sluice.django.RateLimitMiddleware"]):
        client = Client()
        assert [client.get("/open/ping/").status_code for _ in range(3)] == [200] * 3
        assert [client.post("/open/ping/").status_code for _ in range(2)] == [200, 429]
        assert client.post("/api/ping/").status_code == 429  # one counter per address


def test_login_failures_per_user_and_ip_and_successes_do_not_count(configure, signals):
    """The scenario of django-ratelimit's docs: failed logins of one user from one address
    are refused after the limit; another user from that address is not; a success is free."""
    configure({"login": "ip+user:3/h"})
    client = Client()

    def attempt(username: str, password: str, ip: str = "203.0.113.9") -> int:
        response = client.post(
            "/login/", {"username": username, "password": password}, REMOTE_ADDR=ip
        )
        return response.status_code

    # Successes do not count: many of them, then still three failures before a refusal.
    assert [attempt("carol", "right") for _ in range(5)] == [200] * 5
    assert [attempt("carol", "wrong") for _ in range(3)] == [401] * 3
    assert attempt("carol", "wrong") == 429

    assert [attempt("alice", "wrong") for _ in range(3)] == [401] * 3
    assert attempt("alice", "wrong") == 429
    assert attempt("alice", "right") == 429  # over the limit, even the right password waits
    assert attempt("bob", "wrong") == 401  # another user from the same address
    assert attempt("alice", "wrong", ip="198.51.100.1") == 401  # alice from elsewhere

    # Refusals said whom they refused: the username is hashed, never stored in clear.
    assert [s["selectors"]["user"] for s in signals] == [sluice.hashed("carol")] + [
        sluice.hashed("alice")
    ] * 2
    assert all(s["selectors"]["ip"] == "203.0.113.9" for s in signals)
    assert all(s["request"].path == "/login/" for s in signals)


def test_login_failed_callable_decides_what_a_failure_is(configure):
    configure({"login": "ip+user:2/h"})
    client = Client()

    def attempt(password: str) -> HttpResponse:
        return client.post("/login-form/", {"username": "dave", "password": password})

    assert [attempt("right").status_code for _ in range(4)] == [200] * 4
    failures = [attempt("wrong") for _ in range(2)]
    assert [r.status_code for r in failures] == [200, 200]
    assert [r["RateLimit"] for r in failures] == ['"login";r=1;t=1800', '"login";r=0;t=3600']
    assert attempt("wrong").status_code == 429
    assert attempt("right").status_code == 429


def test_class_based_view_through_method_decorator(configure):
    configure({"hourly": "ip:2/h"})
    client = Client()
    assert [client.get("/report/").status_code for _ in range(3)] == [200, 200, 429]


def test_async_view(configure, signals):
    configure({"hourly": "ip:2/h"})
    heard_async: list[str] = []

    async def async_receiver(sender, policy, **kwargs):
        heard_async.append(policy)

    refused.connect(async_receiver)
    try:
        client = Client()
        answers = [client.get("/async/") for _ in range(3)]
    finally:
        refused.disconnect(async_receiver)
    assert [r.status_code for r in answers] == [200, 200, 429]
    assert answers[0].content == b"async ok"
    assert answers[1]["RateLimit"] == '"hourly";r=0;t=3600'
    assert answers[2]["Content-Type"] == "application/problem+json"
    assert [s["sender"] for s in signals] == [views.async_hourly]
    assert heard_async == ["hourly"]


def test_async_view_keyed_by_user_awaits_auser(configure):
    configure({"per-user": "user:1/h"})

    @ratelimit("per-user", key={"user": "user"})
    async def view(request):
        return HttpResponse("ok")

    def request_of(user):
        request = AsyncRequestFactory().get("/")

        async def auser():
            return user

        request.auser = auser  # what AuthenticationMiddleware sets; request.user is not read
        return request

    frank, grace = User(pk=21), User(pk=22)
    statuses = [async_to_sync(view)(request_of(u)).status_code for u in (frank, frank, grace)]
    assert statuses == [200, 429, 200]


def test_admitted_headers_can_be_switched_off(configure):
    configure({"hourly": "ip:1/h"}, HEADERS={"admitted": False, "x_ratelimit": True})
    client = Client()
    admitted = client.get("/hourly/")
    assert admitted.status_code == 200
    assert not admitted.has_header("RateLimit")
    refusal = client.get("/hourly/")
    assert refusal.status_code == 429
    assert refusal["X-RateLimit-Limit"] == "1"
    assert refusal.has_header("RateLimit")


def test_trusted_proxies_setting_decides_whether_forwarded_addresses_count(configure):
    forwarded = {"HTTP_X_FORWARDED_FOR": "203.0.113.50", "REMOTE_ADDR": "10.0.0.2"}
    other = {"HTTP_X_FORWARDED_FOR": "203.0.113.51", "REMOTE_ADDR": "10.0.0.2"}

    configure({"hourly": "ip:1/h"})  # no trusted proxy: the header is anyone's to write
    client = Client()
    assert client.get("/hourly/", **forwarded).status_code == 200
    assert client.get("/hourly/", **other).status_code == 429

    configure({"hourly": "ip:1/h"}, TRUSTED_PROXIES=["10.0.0.0/8"])
    assert client.get("/hourly/", **forwarded).status_code == 200
    assert client.get("/hourly/", **other).status_code == 200
    assert client.get("/hourly/", **forwarded).status_code == 429


def test_changed_settings_rebuild_the_limiter(configure):
    configure({"hourly": "ip:1/h"})
    first = get_limiter()
    assert get_limiter() is first  # built once
    client = Client()
    assert [client.get("/hourly/").status_code for _ in range(2)] == [200, 429]
    configure({"hourly": "ip:3/h"})
    assert get_limiter() is not first
    assert get_limiter().policies["hourly"] == "ip:3/h"


def test_user_source_is_the_authenticated_users_pk(configure):
    configure({"per-user": "user:1/h"})
    factory = RequestFactory()

    @ratelimit("per-user", key={"user": "user"})
    def view(request):
        return HttpResponse("ok")

    def as_user(user) -> int:
        request = factory.get("/")
        request.user = user
        return view(request).status_code

    alice, bob = User(pk=7, username="alice"), User(pk=8, username="bob")
    assert [as_user(alice), as_user(alice), as_user(bob)] == [200, 429, 200]
    # Anonymous requests share one counter (the empty value), as do requests with no user.
    assert as_user(AnonymousUser()) == 200
    assert as_user(AnonymousUser()) == 429
    assert view(factory.get("/")).status_code == 429


def test_key_defaults_to_the_rules_ip_and_user_selectors(configure):
    configure({"both": "ip+user:1/h"})

    @ratelimit("both")
    def view(request):
        return HttpResponse("ok")

    factory = RequestFactory()

    def hit(user, ip: str = "192.0.2.1") -> int:
        request = factory.get("/", REMOTE_ADDR=ip)
        request.user = user
        return view(request).status_code

    erin = User(pk=11)
    assert [hit(erin), hit(erin), hit(User(pk=12)), hit(erin, "192.0.2.2")] == [200, 429, 200, 200]


@override_settings(SLUICE={"STORE": "redis://127.0.0.1:1"})  # nothing listens there
def test_explicit_limiter_is_used_instead_of_the_settings():
    own = sluice.Limiter(policies={"own": "apikey:1/h"})

    @ratelimit("own", key={"apikey": "header:X-Api-Key"}, limiter=own)
    def view(request):
        return HttpResponse("ok")

    factory = RequestFactory()
    statuses = [view(factory.get("/", HTTP_X_API_KEY=k)).status_code for k in ("a", "a", "b")]
    assert statuses == [200, 429, 200]
    assert not own.peek("own", {"apikey": "a"}).allowed
    with pytest.raises(sluice.StoreError):
        get_limiter()  # the settings' limiter was never needed


@pytest.mark.parametrize("store", ["memory"], indirect=True)
def test_misconfiguration_fails_loudly(configure):
    with pytest.raises(ValueError, match="expected 'ip'"):
        ratelimit("hourly", key={"ip": "address"})
    with pytest.raises(ValueError, match="count"):
        ratelimit("hourly", key={"ip": "ip"}, count="successes")
    configure({"hourly": "ip:1/h"}, STORES="redis://typo")
    with pytest.raises(ImproperlyConfigured, match="STORES"):
        get_limiter()


def test_django_and_sluice_serve_share_one_exact_limit(redis_url, namespace, sluice_serve):
    """100 hits through Django and 100 through `sluice serve`, all at once, on one Redis, for
    one user of `user:100/h`: exactly 100 are admitted between them."""
    base = sluice_serve(
        f'[policies.shared]\nrule = "user:100/h"\nnamespace = "{namespace}"\n', redis_url
    )
    threads_per_side, hits_per_side = 16, 100
    barrier = threading.Barrier(2 * threads_per_side)
    admitted: list[bool] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def share(index: int) -> int:
        return hits_per_side // threads_per_side + (index < hits_per_side % threads_per_side)

    def through_django(index: int) -> None:
        client = Client()
        barrier.wait()
        for _ in range(share(index)):
            status = client.get("/shared/", {"user": "alice"}).status_code
            assert status in (200, 429), status
            with lock:
                admitted.append(status == 200)

    def through_serve(index: int) -> None:
        body = json.dumps({"policy": "shared", "selectors": {"user": "alice"}}).encode()
        barrier.wait()
        for _ in range(share(index)):
            request = urllib.request.Request(
                f"{base}/v1/check", body, {"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(request, timeout=10) as response:
                decision = json.load(response)
            with lock:
                admitted.append(decision["allowed"])

    def run(target: Any, index: int) -> None:
        try:
            target(index)
        except BaseException as error:  # reported below, with the thread's own traceback
            errors.append(error)
            barrier.abort()

    setting = sluice_setting(redis_url, namespace, {"shared": "user:100/h"})
    with override_settings(SLUICE=setting):
        threads = [
            threading.Thread(target=run, args=(target, index))
            for target in (through_django, through_serve)
            for index in range(threads_per_side)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        assert len(admitted) == 2 * hits_per_side
        assert sum(admitted) == 100
        # One counter, whichever side asks: another user still has the whole limit.
        assert Client().get("/shared/", {"user": "alice"}).status_code == 429
        assert Client().get("/shared/", {"user": "bob"}).status_code == 200


# --- concurrency policies ---------------------------------------------------------------------


def test_a_concurrency_policy_holds_its_slot_until_the_response_is_closed(configure, signals):
    configure({"slots": "ip:1 concurrent"})
    client = Client()
    # Each answered response is closed by the client, as a server closes it once sent.
    assert [client.get("/slot/").status_code for _ in range(3)] == [200, 200, 200]
    streaming = client.get("/stream/")
    assert streaming.status_code == 200 and "RateLimit" in streaming
    # Not read yet: the stream holds the slot.
    refused_answer = client.get("/slot/")
    assert refused_answer.status_code == 429
    assert refused_answer.json()["reason"] == "occupied"
    assert [s["policy"] for s in signals] == ["slots"]
    assert b"".join(streaming.streaming_content) == b"first last"  # read, then closed
    assert client.get("/slot/").status_code == 200


def test_a_view_that_raises_gives_its_slot_back(configure):
    configure({"slots": "ip:1 concurrent"})
    client = Client()
    with pytest.raises(RuntimeError):
        client.get("/fails/")
    assert client.get("/slot/").status_code == 200


def test_an_async_view_holds_a_slot_as_a_sync_one(configure):
    configure({"slots": "ip:1 concurrent"})
    factory = AsyncRequestFactory()
    first = async_to_sync(views.async_slot)(factory.get("/async-slot/"))
    assert first.status_code == 200 and first.content == b"async slot"
    second = async_to_sync(views.async_slot)(factory.get("/async-slot/"))
    assert second.status_code == 429  # the first response is not closed yet
    first.close()
    assert async_to_sync(views.async_slot)(factory.get("/async-slot/")).status_code == 200


def test_middleware_rules_take_leases_too(configure):
    configure(
        {"slots": "ip:1 concurrent", "hourly": "ip:5/h"},
        MIDDLEWARE=[{"policy": "hourly", "paths": ["/api/"]},
                    {"policy": "slots", "paths": ["/api/"]}],
    )
    with override_settings(MIDDLEWARE=["sluice.django.RateLimitMiddleware"]):
        factory = RequestFactory()
        middleware = RateLimitMiddleware(lambda request: HttpResponse("ok"))
        held = middleware(factory.get("/api/ping/"))
        assert held.status_code == 200
        assert middleware(factory.get("/api/ping/")).status_code == 429  # slot held
        held.close()
        assert middleware(factory.get("/api/ping/")).status_code == 200


def test_a_concurrency_policy_takes_no_failure_counting(configure):
    configure({"slots": "ip:1 concurrent"})

    @ratelimit("slots", key={"ip": "ip"}, count="failures")
    def counted(request):
        return HttpResponse("ok")

    with pytest.raises(ImproperlyConfigured, match="count='failures'"):
        counted(RequestFactory().get("/"))
