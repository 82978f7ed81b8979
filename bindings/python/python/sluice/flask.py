"""Rate limiting for Flask views: an extension and a decorator.

The one-minute path::

    from flask import Flask
    import sluice
    from sluice.flask import Sluice

    app = Flask(__name__)
    limits = Sluice(app, sluice.Limiter(policies={"login": "ip:5/m"}))

    @app.post("/login")
    @limits.limit("login", key={"ip": "ip"})
    def login():
        ...

The sixth POST from one address within a minute gets ``429 Too Many Requests`` with
``Retry-After``, the ``RateLimit-Policy`` and ``RateLimit`` fields and an
``application/problem+json`` body (a ``503`` when the store could not decide and the
policy's failure mode says so). Admitted responses carry the ``RateLimit`` fields too
(``headers=False`` turns that off). Put ``@app.route`` outermost, so Flask registers the
limited view.

**Configuration.** Without a limiter the extension builds one in ``init_app`` from the app's
config, so the application-factory pattern works::

    limits = Sluice()

    def create_app():
        app = Flask(__name__)
        app.config["SLUICE_STORE"] = "redis://127.0.0.1:6379"   # default "memory://"
        app.config["SLUICE_POLICIES"] = {"login": "ip:5/m", "api": "user:100/m"}
        app.config["SLUICE_CONFIG"] = "sluice.toml"             # a `sluice serve` config
        limits.init_app(app)
        return app

``limits.limiter`` is the current app's `sluice.Limiter`.

**Keys.** ``key={selector: source}`` names where each selector of the policy's rule comes
from: ``"ip"`` (``request.remote_addr``; ``X-Forwarded-For`` believed only from
``trusted_proxies``), ``"user"``, ``"header:NAME"``, ``"get:FIELD"``, ``"post:FIELD"``
(hashed before it reaches the store), ``"const:VALUE"`` or a callable taking the request.
A missing value is the empty string, so leaving a field out is no way around the limit.
Without ``key`` each selector of the rule named ``ip`` or ``user`` takes that source.

Flask has no user of its own: ``Sluice(user=callable)`` returns the current user's id. When
``user`` is not given and Flask-Login is installed, an authenticated ``current_user``'s
``get_id()`` is used; anonymous requests share the empty value.

**Decorator.** ``limits.limit(policy, key=None, method=None, block=True, cost=1)``:

- ``method="POST"`` (or a list) limits only those methods; others pass unchecked;
- ``block=True`` answers refusals directly; ``block=False`` lets every request through and
  sets ``flask.g.sluice_decision`` (the tightest decision of the request) and
  ``flask.g.limited``, so the view decides; ``block="raise"`` raises `RateLimited` (a
  ``werkzeug.exceptions.TooManyRequests`` carrying ``.decision``), for apps that render
  errors with ``@app.errorhandler(429)`` / ``@app.errorhandler(RateLimited)``; unhandled,
  it answers the same problem+json response as ``block=True``;
- ``cost`` is how many hits the request counts for.

**Concurrency policies.** With a policy whose rule has a concurrency leaf (``"user:3
concurrent"``) the decorator takes a lease per request instead of a check and holds it until
the server closes the response: once it is sent, a streamed response after its last chunk.
A view that raises gives it back at once. A request finding every slot held is refused as for
a rate (429, denial ``occupied``); ``cost`` must be 1.

**Refusals.** ``Sluice(on_refused=fn)`` replaces the refusal response: ``fn(request,
decision, selectors)`` returns anything a view may return. The blinker signal `refused`
(``sluice.flask.refused``) is sent for every denied decision, blocking or not, with
``sender=app`` and ``request``, ``decision``, ``selectors``, ``policy`` and ``blocked``
keyword arguments::

    from sluice.flask import refused

    @refused.connect_via(app)
    def log_refusal(app, request, decision, selectors, policy, blocked):
        app.logger.warning("rate limited by %s: %s", policy, decision.leaf)
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence, Union

from blinker import Namespace
from flask import Flask, Request, Response, current_app, g, request
from werkzeug.exceptions import TooManyRequests

from ._keys import KeyMap, Source, methods
from ._leases import let_go, takes_leases
from ._sluice import ClientIp, Decision, Lease, Limiter

__all__ = ["RateLimited", "Sluice", "refused"]

_signals = Namespace()

refused = _signals.signal("sluice.flask.refused")
"""Sent for every denied decision (with ``block=False`` too; ``blocked`` says which)."""

RefusalHandler = Callable[[Request, Decision, "dict[str, str]"], Any]
Block = Union[bool, str]


class RateLimited(TooManyRequests):
    """A refusal raised instead of answered (``block="raise"``).

    ``decision`` and ``selectors`` say which limit refused; the response it renders when no
    error handler catches it is the decision's own refusal (429, or 503 when the store could
    not decide)."""

    def __init__(self, decision: Decision, selectors: Mapping[str, str]):
        refusal = decision.refusal()
        if refusal is None:
            raise ValueError("RateLimited needs a denied decision")
        status, headers, body = refusal
        super().__init__(
            description=f"rate limited by policy `{decision.policy}`",
            response=Response(body, status, headers),
        )
        self.code = status
        self.decision = decision
        self.selectors = dict(selectors)


class _AppState:
    """What one app needs at request time: its limiter, and the default key maps built for
    it (a default key depends on the policy's rule, so on the app's limiter)."""

    def __init__(self, limiter: Limiter):
        self.limiter = limiter
        self.default_keys: dict[str, KeyMap] = {}
        self._concurrent: dict[tuple[str, int], bool] = {}

    def concurrent(self, policy: str, cost: int) -> bool:
        """Whether `policy` takes a lease per request (its rule has a concurrency leaf)."""
        known = self._concurrent.get((policy, cost))
        if known is None:
            known = self._concurrent[(policy, cost)] = takes_leases(self.limiter, policy, cost)
        return known


class _FlaskView:
    """`sluice._keys.View` over Flask's request."""

    def __init__(self, req: Request, user: Callable[[], Optional[str]]):
        self._request = req
        self._user = user

    def peer(self) -> Optional[str]:
        return self._request.remote_addr

    def headers(self) -> Sequence[tuple[str, str]]:
        return list(self._request.headers.items())

    def header(self, name: str) -> Optional[str]:
        return self._request.headers.get(name)

    def query(self, name: str) -> Optional[str]:
        return self._request.args.get(name)

    def form(self, name: str) -> Optional[str]:
        return self._request.form.get(name)

    def user(self) -> Optional[str]:
        value = self._user()
        return None if value is None else str(value)


def _flask_login_user() -> Optional[str]:
    """Flask-Login's authenticated user id, when Flask-Login is installed and in use."""
    try:
        from flask_login import current_user
    except ImportError:
        return None
    try:
        if current_user and current_user.is_authenticated:
            return current_user.get_id()
    except Exception:  # no LoginManager on this app: there is no user to key by
        return None
    return None


class Sluice:
    """The Flask extension: one limiter per app, and the `limit` decorator."""

    def __init__(
        self,
        app: Optional[Flask] = None,
        limiter: Optional[Limiter] = None,
        *,
        trusted_proxies: Iterable[str] = (),
        user: Optional[Callable[[], Optional[str]]] = None,
        headers: bool = True,
        on_refused: Optional[RefusalHandler] = None,
    ):
        self._limiter = limiter
        self._client_ip = ClientIp(list(trusted_proxies))
        self._user = user or _flask_login_user
        self.headers = headers
        self.on_refused = on_refused
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Flask) -> None:
        """Attach to `app`: its limiter (given, or built from ``SLUICE_STORE``,
        ``SLUICE_POLICIES`` and ``SLUICE_CONFIG``) and the hook adding RateLimit fields."""
        limiter = self._limiter
        if limiter is None:
            limiter = Limiter(
                app.config.get("SLUICE_STORE", "memory://"),
                app.config.get("SLUICE_POLICIES"),
                config=app.config.get("SLUICE_CONFIG"),
            )
        app.extensions["sluice"] = _AppState(limiter)
        app.after_request(self._add_headers)

    @property
    def limiter(self) -> Limiter:
        """The current app's limiter."""
        return self._state().limiter

    def limit(
        self,
        policy: str,
        key: Optional[Mapping[str, Source]] = None,
        method: Union[str, Sequence[str], None] = None,
        block: Block = True,
        cost: int = 1,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorate a view so each request counts against `policy` (see the module doc)."""
        if block not in (True, False, "raise"):
            raise ValueError("block must be True, False or 'raise'")
        # Parsed now, so a bad key fails at import time rather than on the first request.
        keymap = None if key is None else KeyMap(key, self._client_ip)
        limited_methods = methods(method)

        def refusal() -> tuple[Any, Optional[Lease]]:
            """Counts the request: (None, the lease it holds, if any) lets the view run,
            anything else first is the answer."""
            if limited_methods is not None and request.method not in limited_methods:
                return None, None
            state = self._state()
            selectors = self._keymap(state, policy, keymap).selectors(
                _FlaskView(request, self._user), request
            )
            if state.concurrent(policy, cost):
                lease = state.limiter.acquire(policy, selectors)
                decision = lease.decision
                _remember(decision)
                if decision.allowed:
                    return None, lease
            else:
                decision = state.limiter.check(policy, selectors, cost)
                _remember(decision)
                if decision.allowed:
                    return None, None
            refused.send(
                current_app._get_current_object(),
                request=request._get_current_object(),
                decision=decision,
                selectors=selectors,
                policy=policy,
                blocked=bool(block),
            )
            if block is False:
                return None, None
            if block == "raise":
                raise RateLimited(decision, selectors)
            return self._refuse(decision, selectors), None

        def decorate(view: Callable[..., Any]) -> Callable[..., Any]:
            if inspect.iscoroutinefunction(view):
                # Flask runs an async view in an event loop of its own per request, so the
                # blocking check holds up only this request.
                @functools.wraps(view)
                async def limited_async_view(*args: Any, **kwargs: Any) -> Any:
                    answer, lease = refusal()
                    if answer is not None:
                        return answer
                    if lease is None:
                        return await view(*args, **kwargs)
                    try:
                        answer = await view(*args, **kwargs)
                    except BaseException:
                        let_go(lease)
                        raise
                    return _hold_until_closed(answer, lease)

                return limited_async_view

            @functools.wraps(view)
            def limited_view(*args: Any, **kwargs: Any) -> Any:
                answer, lease = refusal()
                if answer is not None:
                    return answer
                if lease is None:
                    return view(*args, **kwargs)
                try:
                    answer = view(*args, **kwargs)
                except BaseException:
                    let_go(lease)
                    raise
                return _hold_until_closed(answer, lease)

            return limited_view

        return decorate

    def _refuse(self, decision: Decision, selectors: dict[str, str]) -> Any:
        if self.on_refused is not None:
            return self.on_refused(request._get_current_object(), decision, selectors)
        refusal = decision.refusal()
        if refusal is None:  # only a denied decision reaches here; kept total for safety
            return Response(status=429)
        status, headers, body = refusal
        return Response(body, status, headers)

    def _keymap(self, state: _AppState, policy: str, keymap: Optional[KeyMap]) -> KeyMap:
        if keymap is not None:
            return keymap
        default = state.default_keys.get(policy)
        if default is None:
            needed = state.limiter.selectors(policy)
            default = KeyMap({s: s for s in needed if s in ("ip", "user")}, self._client_ip)
            state.default_keys[policy] = default
        return default

    def _add_headers(self, response: Response) -> Response:
        decision: Optional[Decision] = g.get("sluice_decision")
        if not self.headers or decision is None or "RateLimit" in response.headers:
            return response
        # Retry-After on a success would tell a client to wait for nothing.
        refusing = response.status_code in (429, 503)
        for name, value in decision.headers(retry_after=refusing):
            response.headers[name] = value
        return response

    @staticmethod
    def _state() -> _AppState:
        state = current_app.extensions.get("sluice")
        if state is None:
            raise RuntimeError("sluice.flask.Sluice.init_app(app) was not called for this app")
        return state


def _hold_until_closed(answer: Any, lease: Lease) -> Response:
    """The view's answer as a response that releases `lease` when the server closes it: once
    sent, a streamed response after its last chunk."""
    response = current_app.make_response(answer)
    response.call_on_close(functools.partial(let_go, lease))
    return response


def _remember(decision: Decision) -> None:
    """Keep the tightest decision of the request in `g` (stacked limits check twice)."""
    current: Optional[Decision] = g.get("sluice_decision")
    g.limited = g.get("limited", False) or not decision.allowed
    if current is None or _tighter(decision, current):
        g.sluice_decision = decision


def _tighter(a: Decision, b: Decision) -> bool:
    if a.allowed != b.allowed:
        return not a.allowed
    return a.remaining < b.remaining
