"""sluice.flask against Flask's own test client, on the memory store and a real Redis."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import pytest
from flask import Flask, g, jsonify

import sluice
from conftest import policy
from sluice.flask import RateLimited, Sluice, refused


def make_app(limiter: Optional[sluice.Limiter] = None, **options: Any) -> tuple[Flask, Sluice]:
    app = Flask(__name__)
    app.config["TESTING"] = True
    return app, Sluice(app, limiter, **options)


def test_limit_reached_at_n_plus_one(store, namespace):
    limiter = sluice.Limiter(store, {"login": policy("ip:3/h", namespace)})
    app, limits = make_app(limiter)

    @app.post("/login")
    @limits.limit("login", key={"ip": "ip"})
    def login():
        return "welcome"

    client = app.test_client()
    for remaining in (2, 1, 0):
        response = client.post("/login")
        assert response.status_code == 200
        assert response.text == "welcome"
        assert response.headers["RateLimit-Policy"] == '"login";q=3;w=3600'
        assert f'r={remaining}' in response.headers["RateLimit"]
        assert "Retry-After" not in response.headers

    refused_response = client.post("/login")
    assert refused_response.status_code == 429
    assert refused_response.content_type == "application/problem+json"
    assert int(refused_response.headers["Retry-After"]) > 0
    assert "r=0" in refused_response.headers["RateLimit"]
    problem = refused_response.get_json(force=True)
    assert problem["status"] == 429
    assert problem["policy"] == "login"
    assert problem["reason"] == "limited"

    # Another address has its own counter.
    other = client.post("/login", environ_base={"REMOTE_ADDR": "10.9.8.7"})
    assert other.status_code == 200


def test_forwarded_address_believed_only_from_trusted_proxies(namespace):
    limiter = sluice.Limiter(policies={"p": "ip:1/h"})
    app, limits = make_app(limiter, trusted_proxies=["10.0.0.0/8"])

    @app.get("/")
    @limits.limit("p", key={"ip": "ip"})
    def index():
        return "ok"

    client = app.test_client()
    via_proxy = {"REMOTE_ADDR": "10.0.0.1"}
    assert client.get("/", headers={"X-Forwarded-For": "203.0.113.5"},
                      environ_base=via_proxy).status_code == 200
    # A different client behind the same proxy is a different key...
    assert client.get("/", headers={"X-Forwarded-For": "203.0.113.6"},
                      environ_base=via_proxy).status_code == 200
    # ...and the first one is limited.
    assert client.get("/", headers={"X-Forwarded-For": "203.0.113.5"},
                      environ_base=via_proxy).status_code == 429
    # An untrusted peer cannot pick its key with the header.
    direct = {"REMOTE_ADDR": "198.51.100.1"}
    assert client.get("/", headers={"X-Forwarded-For": "1.1.1.1"},
                      environ_base=direct).status_code == 200
    assert client.get("/", headers={"X-Forwarded-For": "2.2.2.2"},
                      environ_base=direct).status_code == 429


def test_method_filter(store, namespace):
    limiter = sluice.Limiter(store, {"login": policy("ip:1/h", namespace)})
    app, limits = make_app(limiter)

    @app.route("/login", methods=["GET", "POST"])
    @limits.limit("login", key={"ip": "ip"}, method="POST")
    def login():
        return "form"

    client = app.test_client()
    for _ in range(3):
        response = client.get("/login")
        assert response.status_code == 200
        assert "RateLimit" not in response.headers  # never checked
    assert client.post("/login").status_code == 200
    assert client.post("/login").status_code == 429
    assert client.get("/login").status_code == 200


def test_post_field_key_is_hashed_and_form_still_reaches_the_view(store, namespace):
    limiter = sluice.Limiter(store, {"login": policy("username:2/h", namespace)})
    app, limits = make_app(limiter)
    seen = []

    @app.post("/login")
    @limits.limit("login", key={"username": "post:username"})
    def login():
        from flask import request
        seen.append(request.form["username"])
        return "ok"

    client = app.test_client()
    assert client.post("/login", data={"username": "alice"}).status_code == 200
    assert client.post("/login", data={"username": "alice"}).status_code == 200
    assert client.post("/login", data={"username": "alice"}).status_code == 429
    assert client.post("/login", data={"username": "bob"}).status_code == 200
    assert seen == ["alice", "alice", "bob"]
    # The store counts the hash of the field, never the name in clear.
    assert not limiter.peek("login", {"username": sluice.hashed("alice")}).allowed
    assert limiter.peek("login", {"username": "alice"}).allowed


def test_header_query_const_and_callable_sources():
    limiter = sluice.Limiter(policies={"api": "tenant+plan+token+agent:1/h"})
    app, limits = make_app(limiter)

    @app.get("/api")
    @limits.limit("api", key={
        "tenant": "header:X-Tenant",
        "plan": "const:free",
        "token": "get:token",
        "agent": lambda request: request.user_agent.string.split("/")[0],
    })
    def api():
        return "ok"

    client = app.test_client()
    headers = {"X-Tenant": "acme", "User-Agent": "probe/1"}
    assert client.get("/api?token=t1", headers=headers).status_code == 200
    assert client.get("/api?token=t1", headers=headers).status_code == 429
    assert client.get("/api?token=t2", headers=headers).status_code == 200
    assert limiter.peek("api", {"tenant": "acme", "plan": "free", "token": "t1",
                                "agent": "probe"}).remaining == 0


def test_missing_field_shares_one_counter():
    limiter = sluice.Limiter(policies={"api": "tenant:1/h"})
    app, limits = make_app(limiter)

    @app.get("/")
    @limits.limit("api", key={"tenant": "header:X-Tenant"})
    def index():
        return "ok"

    client = app.test_client()
    assert client.get("/").status_code == 200
    assert client.get("/", environ_base={"REMOTE_ADDR": "10.1.1.1"}).status_code == 429


def test_user_callable_and_default_key():
    limiter = sluice.Limiter(policies={"api": "user:1/h"})
    current = {"id": "alice"}
    app, limits = make_app(limiter, user=lambda: current["id"])

    @app.get("/")
    @limits.limit("api")  # no key: the rule's `user` selector takes the user source
    def index():
        return "ok"

    client = app.test_client()
    assert client.get("/").status_code == 200
    assert client.get("/").status_code == 429
    current["id"] = "bob"
    assert client.get("/").status_code == 200
    assert limiter.peek("api", {"user": "alice"}).remaining == 0


def test_async_view():
    pytest.importorskip("asgiref")  # Flask's async views need flask[async]
    app, limits = make_app(sluice.Limiter(policies={"api": "ip:1/h"}))

    @app.get("/")
    @limits.limit("api", key={"ip": "ip"})
    async def index():
        return "async ok"

    client = app.test_client()
    assert client.get("/").text == "async ok"
    assert client.get("/").status_code == 429


def test_block_false_sets_g_and_lets_the_view_decide(store, namespace):
    limiter = sluice.Limiter(store, {"api": policy("ip:1/h", namespace)})
    app, limits = make_app(limiter)

    @app.get("/")
    @limits.limit("api", key={"ip": "ip"}, block=False)
    def index():
        return jsonify(limited=g.limited, remaining=g.sluice_decision.remaining)

    client = app.test_client()
    first = client.get("/")
    assert first.status_code == 200
    assert first.get_json() == {"limited": False, "remaining": 0}
    second = client.get("/")
    assert second.status_code == 200
    assert second.get_json() == {"limited": True, "remaining": 0}
    assert "Retry-After" not in second.headers  # not on a success
    assert "r=0" in second.headers["RateLimit"]


def test_headers_can_be_turned_off():
    app, limits = make_app(sluice.Limiter(policies={"api": "ip:1/h"}), headers=False)

    @app.get("/")
    @limits.limit("api", key={"ip": "ip"})
    def index():
        return "ok"

    client = app.test_client()
    assert "RateLimit" not in client.get("/").headers
    refusal = client.get("/")
    assert refusal.status_code == 429  # the refusal keeps its own fields
    assert "Retry-After" in refusal.headers


def test_custom_on_refused():
    calls = []

    def on_refused(request, decision, selectors):
        calls.append((request.path, decision.policy, selectors))
        return "slow down", 429, {"X-Why": decision.leaf}

    app, limits = make_app(sluice.Limiter(policies={"api": "ip:1/h"}), on_refused=on_refused)

    @app.get("/x")
    @limits.limit("api", key={"ip": "ip"})
    def index():
        return "ok"

    client = app.test_client()
    assert client.get("/x").status_code == 200
    response = client.get("/x")
    assert response.status_code == 429
    assert response.text == "slow down"
    assert response.headers["X-Why"] == "ip:1/h"
    assert "RateLimit" in response.headers  # added to the handler's response
    assert calls == [("/x", "api", {"ip": "127.0.0.1"})]


def test_refused_signal_is_sent_for_each_denial():
    app, limits = make_app(sluice.Limiter(policies={"api": "ip:1/h", "soft": "ip:1/h"}))
    received = []

    @app.get("/hard")
    @limits.limit("api", key={"ip": "ip"})
    def hard():
        return "ok"

    @app.get("/soft")
    @limits.limit("soft", key={"ip": "ip"}, block=False)
    def soft():
        return "ok"

    def record(sender, request, decision, selectors, policy, blocked):
        received.append((sender, request.path, decision.allowed, selectors, policy, blocked))

    client = app.test_client()
    with refused.connected_to(record, app):
        client.get("/hard")
        client.get("/soft")
        assert received == []
        assert client.get("/hard").status_code == 429
        assert client.get("/soft").status_code == 200
    assert received == [
        (app, "/hard", False, {"ip": "127.0.0.1"}, "api", True),
        (app, "/soft", False, {"ip": "127.0.0.1"}, "soft", False),
    ]


def test_block_raise_reaches_errorhandler():
    app, limits = make_app(sluice.Limiter(policies={"api": "ip:1/h"}))

    @app.errorhandler(RateLimited)
    def limited(error: RateLimited):
        return {"error": "limited", "leaf": error.decision.leaf}, 429

    @app.get("/")
    @limits.limit("api", key={"ip": "ip"}, block="raise")
    def index():
        return "ok"

    client = app.test_client()
    assert client.get("/").status_code == 200
    response = client.get("/")
    assert response.status_code == 429
    assert response.get_json() == {"error": "limited", "leaf": "ip:1/h"}
    assert "Retry-After" in response.headers


def test_block_raise_unhandled_answers_problem_json():
    app, limits = make_app(sluice.Limiter(policies={"api": "ip:1/h"}))

    @app.get("/")
    @limits.limit("api", key={"ip": "ip"}, block="raise")
    def index():
        return "ok"

    client = app.test_client()
    client.get("/")
    response = client.get("/")
    assert response.status_code == 429
    assert response.content_type == "application/problem+json"
    assert json.loads(response.data)["policy"] == "api"


def test_stacked_limits_report_the_tightest():
    app, limits = make_app(sluice.Limiter(policies={"wide": "ip:10/h", "narrow": "ip:2/h"}))

    @app.get("/")
    @limits.limit("wide", key={"ip": "ip"})
    @limits.limit("narrow", key={"ip": "ip"})
    def index():
        return "ok"

    client = app.test_client()
    assert client.get("/").headers["RateLimit-Policy"] == '"narrow";q=2;w=3600'
    assert client.get("/").status_code == 200
    refusal = client.get("/")
    assert refusal.status_code == 429
    assert refusal.get_json(force=True)["policy"] == "narrow"


def test_init_app_reads_config(tmp_path: Path, redis_url, namespace):
    config = tmp_path / "sluice.toml"
    config.write_text(f'[policies.from_file]\nrule = "ip:1/h"\nnamespace = "{namespace}f"\n')
    limits = Sluice()

    app = Flask(__name__)
    app.config["SLUICE_STORE"] = redis_url
    app.config["SLUICE_POLICIES"] = {"inline": policy("ip:1/h", namespace)}
    app.config["SLUICE_CONFIG"] = str(config)
    limits.init_app(app)

    @app.get("/inline")
    @limits.limit("inline", key={"ip": "ip"})
    def inline():
        return "ok"

    @app.get("/file")
    @limits.limit("from_file", key={"ip": "ip"})
    def from_file():
        return "ok"

    client = app.test_client()
    assert [client.get("/inline").status_code for _ in range(2)] == [200, 429]
    assert [client.get("/file").status_code for _ in range(2)] == [200, 429]
    with app.app_context():
        assert limits.limiter.store.startswith("redis://")
        assert sorted(limits.limiter.policies) == ["from_file", "inline"]


def test_without_init_app_the_error_says_so():
    limits = Sluice(limiter=sluice.Limiter(policies={"api": "ip:1/h"}))
    app = Flask(__name__)
    app.config["TESTING"] = True  # let the exception reach the test

    @app.get("/")
    @limits.limit("api", key={"ip": "ip"})
    def index():
        return "ok"

    with pytest.raises(RuntimeError, match="init_app"):
        app.test_client().get("/")


def test_bad_key_fails_at_decoration():
    limits = Sluice(limiter=sluice.Limiter(policies={"api": "ip:1/h"}))
    with pytest.raises(ValueError, match="expected 'ip'"):
        limits.limit("api", key={"ip": "remote"})
    with pytest.raises(ValueError, match="block"):
        limits.limit("api", block="sometimes")


# --- concurrency policies ---------------------------------------------------------------------


def test_a_concurrency_policy_holds_its_slot_until_the_response_is_closed(store, namespace):
    limiter = sluice.Limiter(store, {"slots": policy("ip:1 concurrent", namespace)})
    app, limits = make_app(limiter)

    @app.get("/slot")
    @limits.limit("slots", key={"ip": "ip"})
    def slot():
        return "slot"

    @app.get("/stream")
    @limits.limit("slots", key={"ip": "ip"})
    def stream():
        return app.response_class(iter([b"first ", b"last"]), mimetype="text/plain")

    @app.get("/fails")
    @limits.limit("slots", key={"ip": "ip"})
    def fails():
        raise RuntimeError("the view failed")

    client = app.test_client()
    # A buffered answer is read and closed by the client, as a server closes a response
    # once sent (unbuffered, Werkzeug's client leaves closing to the caller).
    assert [client.get("/slot", buffered=True).status_code for _ in range(3)] == [200, 200, 200]
    streaming = client.get("/stream", buffered=False)
    assert streaming.status_code == 200 and "RateLimit" in streaming.headers
    refused_answer = client.get("/slot", buffered=True)  # the stream, not read yet, holds the slot
    assert refused_answer.status_code == 429
    assert refused_answer.get_json(force=True)["reason"] == "occupied"
    assert b"".join(streaming.response) == b"first last"
    streaming.close()
    assert client.get("/slot", buffered=True).status_code == 200
    with pytest.raises(RuntimeError):
        client.get("/fails")
    assert client.get("/slot", buffered=True).status_code == 200


def test_a_concurrency_policy_takes_one_slot_a_request(namespace):
    limiter = sluice.Limiter(policies={"slots": "ip:1 concurrent"})
    app, limits = make_app(limiter)

    @app.get("/")
    @limits.limit("slots", key={"ip": "ip"}, cost=2)
    def costly():
        return "ok"

    with pytest.raises(ValueError, match="cost must be 1"):
        app.test_client().get("/")
