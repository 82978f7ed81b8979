"""Rate limiting for Tornado: a decorator for `RequestHandler` methods and a context manager.

The one-minute path: put a limiter in the application settings and decorate the methods to
limit.

    import sluice
    from sluice.tornado import ratelimit
    from tornado.web import Application, RequestHandler

    class Login(RequestHandler):
        @ratelimit("login", key={"ip": "ip", "username": "post:username"}, method="POST")
        async def post(self):
            ...

    app = Application(
        [(r"/login", Login)],
        sluice_limiter=sluice.Limiter(
            "redis://127.0.0.1:6379", {"login": "ip:20/m; username:10/h"}
        ),
    )

A hit that is admitted runs the method, and its response carries the `RateLimit-Policy` and
`RateLimit` header fields. A hit that is refused does not run the method: the response is 429
with `Retry-After`, the same fields and an RFC 9457 `application/problem+json` body (503 when
the store could not decide and the policy fails closed), exactly as the tower layer and
`sluice serve` answer.

`ratelimit(policy, key, *, method=None, block=True, cost=1, limiter=None)`:

- `key` maps each selector of the policy's rule to where its value comes from (see
  `sluice._keys`): ``"ip"``, ``"user"`` (`handler.current_user`: its ``id`` attribute, or the
  user itself as text), ``"header:NAME"``, ``"get:FIELD"`` (`get_query_argument`),
  ``"post:FIELD"`` (`get_body_argument`, hashed before it reaches the store),
  ``"const:VALUE"``, or a callable taking the handler.
- `method` limits only those HTTP methods (``"POST"`` or ``["POST", "PUT"]``); useful when
  decorating `prepare`, which runs for every method.
- `block=False` never refuses: the method runs and finds the decision in
  ``self.sluice_decision`` (with several non-blocking decorators, a denial is not replaced by
  a later admission).
- `limiter` defaults to ``application.settings["sluice_limiter"]``.
- A handler that defines ``on_rate_limited(self, decision)`` (plain or ``async``) answers
  refusals itself: write a response, redirect, or raise `tornado.web.HTTPError`. If it does not
  finish the response, sluice does.

Concurrency policies. With a policy whose rule has a concurrency leaf (``"ip:3
concurrent"``) the decorator takes a lease per request instead of a check and releases it
when the handler finishes its response (Tornado's `on_finish`, after the last byte, an error
page included), in the background; a request finding every slot held is refused as for a rate
(429, denial ``occupied``). `limited` holds a lease for the length of its block. ``cost`` must
be 1.

The decision is awaited (`Limiter.check_async`), so the IOLoop is never blocked, whether the
decorated method is plain or ``async def``. Decorators apply outside in: put
``@tornado.web.authenticated`` above ``@ratelimit`` so anonymous requests are redirected
before they count. A ``"user"`` key reads `current_user` when the hit is decided, so a user
loaded asynchronously must be set in `prepare` (and the decorator then not put on `prepare`).

Client addresses. By default ``"ip"`` is `request.remote_ip`: what Tornado reports, which
with ``xheaders=True`` is already rewritten from ``X-Real-Ip`` / ``X-Forwarded-For`` as sent by
anyone. Prefer giving sluice the proxies you trust and leaving ``xheaders`` off:

    Application(handlers, sluice_limiter=limiter, sluice_trusted_proxies=["10.0.0.0/8"])

Then ``"ip"`` starts from the socket's peer address and walks ``X-Forwarded-For`` believing
only those proxies, with IPv6 clients keyed by their /64 (the tower layer's rules). The
setting may also be a `sluice.ClientIp` (another header, other prefixes).

The context manager, in the style of the original Tornado limiter, works in any asyncio code,
not only in handlers:

    from sluice.tornado import RateLimited, limited

    try:
        async with limited(limiter, "login", {"username": name}) as decision:
            ...  # admitted; `decision.remaining` hits are left
    except RateLimited as refused:
        print(f"try again in {refused.retry_after:.0f} s")

``with limited(...)`` decides synchronously (blocking the thread while Redis answers).
`RateLimited` is a `tornado.web.HTTPError` (429, or 503 when the store could not decide), so
one that escapes a handler still answers with that status; mix `RefusalMixin` into the handler
to answer it with the decision's header fields and problem+json body as well.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import socket
import weakref
from typing import Any, Awaitable, Callable, Mapping, Optional, Sequence, TypeVar, Union

from tornado.web import Application, HTTPError, RequestHandler

from ._errors import MissingSelector, SluiceError
from ._keys import KeyMap, Source, methods
from ._leases import let_go_async, takes_leases
from ._sluice import ClientIp, Decision, Lease, Limiter

__all__ = ["RateLimited", "RefusalMixin", "limited", "ratelimit", "write_refusal"]

Method = TypeVar("Method", bound=Callable[..., Any])
TrustedProxies = Union[Sequence[str], ClientIp, None]

_SOCKET_FAMILIES = (socket.AF_INET, socket.AF_INET6)


class RateLimited(SluiceError, HTTPError):
    """A hit `limited` refused. `decision` is the whole answer; `retry_after` is seconds until
    the same hit would pass (None when not known)."""

    def __init__(self, decision: Decision):
        refusal = decision.refusal()
        # An admitted decision has no refusal; 429 keeps the exception meaningful anyway.
        status = refusal[0] if refusal is not None else 429
        HTTPError.__init__(self, status)
        self.decision = decision

    @property
    def retry_after(self) -> Optional[float]:
        return self.decision.retry_after

    @property
    def policy(self) -> str:
        return self.decision.policy

    def __repr__(self) -> str:
        return f"RateLimited({self.decision!r})"

    def __str__(self) -> str:
        text = f"rate limited by policy {self.decision.policy!r} ({self.decision.leaf})"
        if self.decision.retry_after is not None:
            text += f"; retry after {self.decision.retry_after:.3g} s"
        return text


class limited:
    """`async with limited(limiter, policy, selectors, cost=1) as decision:` decides one hit and
    raises `RateLimited` when it is refused; `with` does the same synchronously.

    Nothing happens on exit: the hit is recorded whether the block succeeds or not, as a
    login attempt counts whether the password was right. Under a concurrency policy the block
    holds a lease instead, released when it ends (however it ends)."""

    def __init__(
        self,
        limiter: Limiter,
        policy: str,
        selectors: Optional[Mapping[str, Union[str, int]]] = None,
        cost: int = 1,
    ):
        self.limiter = limiter
        self.policy = policy
        self.selectors = selectors
        self.cost = cost
        self._lease: Optional[Lease] = None

    async def __aenter__(self) -> Decision:
        if takes_leases(self.limiter, self.policy, self.cost):
            self._lease = await self.limiter.acquire_async(self.policy, self.selectors)
            return _admitted(self._lease.decision)
        return _admitted(await self.limiter.check_async(self.policy, self.selectors, self.cost))

    async def __aexit__(self, *exc_info: Any) -> None:
        lease, self._lease = self._lease, None
        if lease is not None:
            await lease.__aexit__(*exc_info)
        return None

    def __enter__(self) -> Decision:
        if takes_leases(self.limiter, self.policy, self.cost):
            self._lease = self.limiter.acquire(self.policy, self.selectors)
            return _admitted(self._lease.decision)
        return _admitted(self.limiter.check(self.policy, self.selectors, self.cost))

    def __exit__(self, *exc_info: Any) -> None:
        lease, self._lease = self._lease, None
        if lease is not None:
            lease.__exit__(*exc_info)
        return None


def _admitted(decision: Decision) -> Decision:
    if not decision.allowed:
        raise RateLimited(decision)
    return decision


def write_refusal(handler: RequestHandler, decision: Decision) -> None:
    """Writes the default refusal of `decision` (status, header fields, problem+json body)
    into `handler`'s response without finishing it: for `on_rate_limited` overrides that only
    add to it, and for `write_error`."""
    refusal = decision.refusal()
    if refusal is None:
        raise ValueError("an admitted decision has no refusal")
    status, headers, body = refusal
    handler.set_status(status)
    for name, value in headers:
        handler.set_header(name, value)
    handler.write(body)


class RefusalMixin:
    """Mix into a `RequestHandler` so that a `RateLimited` escaping it (from `limited` inside
    the handler) is answered like the decorator's refusals, not with Tornado's HTML error
    page."""

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc_info = kwargs.get("exc_info")
        if exc_info is not None and isinstance(exc_info[1], RateLimited):
            write_refusal(self, exc_info[1].decision)  # type: ignore[arg-type]
            return
        super().write_error(status_code, **kwargs)  # type: ignore[misc]


def ratelimit(
    policy: str,
    key: Mapping[str, Source],
    *,
    method: Union[str, Sequence[str], None] = None,
    block: bool = True,
    cost: int = 1,
    limiter: Optional[Limiter] = None,
) -> Callable[[Method], Method]:
    """Limits a `RequestHandler` method (`get`, `post`, ..., or `prepare`) by `policy`; see the
    module documentation."""
    keys = _KeysByApplication(key)
    only = methods(method)
    if limiter is not None:
        _check_selectors(limiter, policy, key)

    def decorate(handler_method: Method) -> Method:
        @functools.wraps(handler_method)
        async def limited_method(self: RequestHandler, *args: Any, **kwargs: Any) -> Any:
            if only is None or self.request.method in only:
                decision, lease = await _decide(self, policy, keys, cost, limiter)
                if not decision.allowed and block:
                    await _refuse(self, decision)
                    return None
                _note(self, decision, block)
                if lease is not None:
                    _release_on_finish(self, lease)
            elif not block and not hasattr(self, "sluice_decision"):
                self.sluice_decision = None  # type: ignore[attr-defined]
            result = handler_method(self, *args, **kwargs)
            if inspect.isawaitable(result):
                result = await result
            return result

        return limited_method  # type: ignore[return-value]

    return decorate


async def _decide(
    handler: RequestHandler,
    policy: str,
    keys: _KeysByApplication,
    cost: int,
    limiter: Optional[Limiter],
) -> tuple[Decision, Optional[Lease]]:
    """The decision on the request, and the lease it holds under a concurrency policy."""
    if limiter is None:
        limiter = handler.settings.get("sluice_limiter")
        if limiter is None:
            raise RuntimeError(
                "sluice.tornado.ratelimit: no limiter; pass limiter= or set the "
                "application setting sluice_limiter"
            )
    key_map, trusting = keys.for_application(handler.application)
    selectors = key_map.selectors(_View(handler, trusting), handler)
    if takes_leases(limiter, policy, cost):
        lease = await limiter.acquire_async(policy, selectors)
        return lease.decision, (lease if lease else None)
    return await limiter.check_async(policy, selectors, cost), None


def _release_on_finish(handler: RequestHandler, lease: Lease) -> None:
    """Releases `lease` when `handler` finishes its response (Tornado's `on_finish`: after the
    last byte, an error page included), in the background so the IOLoop never waits."""
    finishing = handler.on_finish

    def on_finish() -> None:
        try:
            finishing()
        finally:
            asyncio.ensure_future(let_go_async(lease))

    handler.on_finish = on_finish  # type: ignore[method-assign]


def _note(handler: RequestHandler, decision: Decision, block: bool) -> None:
    if decision.allowed:
        fields = decision.headers()
    else:
        # Not a refusal (block=False): the state, but no Retry-After on a response that passes.
        fields = decision.headers(retry_after=False)
    for name, value in fields:
        handler.set_header(name, value)
    if not block:
        previous = getattr(handler, "sluice_decision", None)
        if previous is None or previous.allowed:
            handler.sluice_decision = decision  # type: ignore[attr-defined]


async def _refuse(handler: RequestHandler, decision: Decision) -> None:
    override: Optional[Callable[[Decision], Optional[Awaitable[None]]]] = getattr(
        handler, "on_rate_limited", None
    )
    if override is None:
        write_refusal(handler, decision)
    else:
        result = override(decision)
        if inspect.isawaitable(result):
            await result
    # Finishing here is what stops Tornado from running the method when `prepare` refused.
    # `_finished` is private but has no public twin; Tornado's `_execute` tests it the same way.
    if not handler._finished:
        handler.finish()


def _check_selectors(limiter: Limiter, policy: str, key: Mapping[str, Source]) -> None:
    """With the limiter known at import time, a policy or selector mistake fails there rather
    than on the first request."""
    for selector in limiter.selectors(policy):
        if selector not in key:
            raise MissingSelector(
                f"policy {policy!r} needs the selector {selector!r}; add it to key=",
                policy,
                selector,
            )


class _KeysByApplication:
    """The decorator's `KeyMap`, built once per application: the client address rules come
    from its settings, which are known only when a request arrives."""

    def __init__(self, key: Mapping[str, Source]):
        self._key = key
        self._untrusting = KeyMap(key)  # also rejects a bad `key=` at import time
        self._built: weakref.WeakKeyDictionary[Application, tuple[KeyMap, bool]] = (
            weakref.WeakKeyDictionary()
        )

    def for_application(self, application: Application) -> tuple[KeyMap, bool]:
        """The key map and whether it resolves forwarding headers itself (then the peer is
        the socket's, not Tornado's possibly rewritten `remote_ip`)."""
        built = self._built.get(application)
        if built is None:
            trusted: TrustedProxies = application.settings.get("sluice_trusted_proxies")
            if trusted is None:
                built = (self._untrusting, False)
            else:
                client_ip = trusted if isinstance(trusted, ClientIp) else ClientIp(list(trusted))
                built = (KeyMap(self._key, client_ip), True)
            self._built[application] = built
        return built


class _View:
    """What `KeyMap` reads from one Tornado request."""

    def __init__(self, handler: RequestHandler, trusting: bool):
        self._handler = handler
        self._request = handler.request
        self._trusting = trusting

    def peer(self) -> Optional[str]:
        if self._trusting:
            context = getattr(self._request.connection, "context", None)
            if getattr(context, "address_family", None) in _SOCKET_FAMILIES:
                return str(context.address[0])  # type: ignore[union-attr]
        return self._request.remote_ip

    def headers(self) -> Sequence[tuple[str, str]]:
        return list(self._request.headers.get_all())

    def header(self, name: str) -> Optional[str]:
        return self._request.headers.get(name)

    def query(self, name: str) -> Optional[str]:
        return self._handler.get_query_argument(name, None)

    def form(self, name: str) -> Optional[str]:
        return self._handler.get_body_argument(name, None)

    def user(self) -> Optional[str]:
        return _user_identity(self._handler.current_user)


def _user_identity(user: Any) -> Optional[str]:
    """`current_user` as a key: its `id` (an ORM object, a dict with an "id"), else the value
    itself as text (a signed cookie's bytes, a name)."""
    if user is None:
        return None
    identity = getattr(user, "id", None)
    if identity is None and isinstance(user, Mapping):
        identity = user.get("id")
    if identity is None:
        identity = user
    if isinstance(identity, bytes):
        return identity.decode("utf-8", "surrogateescape")
    return str(identity)
