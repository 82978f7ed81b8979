"""Rate limiting for ASGI apps: a Starlette/FastAPI middleware and a FastAPI dependency.

Both wait on the store with ``await limiter.check_async(...)``, so a Redis round trip never
blocks the event loop.

The one-minute path, a middleware around the whole app (or a ``Mount``)::

    import sluice
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from sluice.asgi import RateLimitMiddleware

    limiter = sluice.Limiter("redis://127.0.0.1:6379", {"api": "ip:100/m"})
    app = Starlette(routes=..., middleware=[
        Middleware(RateLimitMiddleware, limiter=limiter, policy="api", key={"ip": "ip"}),
    ])

``FastAPI`` takes the same ``Middleware(...)`` list, or ``app.add_middleware(
RateLimitMiddleware, limiter=..., policy=...)``. The 101st request from one address within a
minute gets ``429 Too Many Requests`` with ``Retry-After``, the ``RateLimit-Policy`` and
``RateLimit`` fields and an ``application/problem+json`` body (``503`` when the store could
not decide and the policy's failure mode says so). Admitted responses carry the
``RateLimit`` fields too (``headers=False`` turns that off).

``RateLimitMiddleware(app, limiter, policy, key=None, method=None, paths=None,
trusted_proxies=(), headers=True, on_refused=None, cost=1)``:

- ``method="POST"`` (or a list) limits only those methods;
- ``paths`` limits only some paths: each entry is a path prefix (``"/api/"``) or a compiled
  regular expression matched at the start of the path (``re.compile(r"/users/\\d+/login$")``);
- ``on_refused(request, decision, selectors)`` returns the refusal response to send instead of
  the default (a Starlette ``Response``, or any ASGI app; it may be a coroutine function);
- only HTTP requests are limited; WebSocket and lifespan scopes pass through.

**Concurrency policies.** With a policy whose rule has a concurrency leaf (``"user:3
concurrent"``, ``"50 concurrent lease=30s"``) the middleware takes a lease per request and
holds it while the app answers: until the app returns, which for a streaming response is after
its last body message, or until it raises or is cancelled (the client went away). A request
finding every slot held gets the same ``429`` (denial ``occupied``, with ``Retry-After`` when
the earliest lease's expiry bounds the wait). ``cost`` must be 1. The FastAPI dependency
refuses such a policy (a dependency cannot hold a slot past its own return): use the
middleware, or ``async with await limiter.acquire_async(...)`` in the endpoint.

Add several middlewares for several policies. Starlette runs the first ``Middleware`` of the
list outermost: put ``AuthenticationMiddleware`` before this one so ``"user"`` is known.

**Keys.** ``key={selector: source}`` names where each selector of the policy's rule comes
from: ``"ip"`` (the ASGI ``client``; ``X-Forwarded-For`` believed only from
``trusted_proxies``), ``"user"`` (``scope["user"]`` set by Starlette's
``AuthenticationMiddleware``: its ``identity``, else its ``display_name``, when
``is_authenticated``), ``"header:NAME"``, ``"get:FIELD"``, ``"post:FIELD"`` (hashed before it
reaches the store), ``"const:VALUE"`` or a callable taking a Starlette ``Request``. A missing
value is the empty string, so leaving a field out is no way around the limit. Without
``key`` each selector of the rule named ``ip`` or ``user`` takes that source.

``"post:FIELD"`` reads the body of an ``application/x-www-form-urlencoded`` or
``multipart/form-data`` request (file parts are ignored): the middleware buffers it and
replays it, so the app still receives the body intact. At most 64 KiB is read
(`MAX_FORM_BYTES`); a larger body counts as one without the field, and still reaches the app
whole.

**FastAPI dependency.** ``RateLimit(limiter, policy, key=None, method=None, cost=1,
trusted_proxies=(), headers=True, block=True)`` limits one route, a router or the app::

    from fastapi import Depends, FastAPI
    from sluice.asgi import RateLimit, install

    app = FastAPI()
    install(app)  # refusals answered as problem+json
    login_limit = RateLimit(limiter, "login", key={"ip": "ip", "username": "post:username"})

    @app.post("/login", dependencies=[Depends(login_limit)])
    async def login(): ...

    @app.get("/search")
    async def search(decision: sluice.Decision = Depends(RateLimit(limiter, "api"))):
        ...

A refusal raises `RateLimited`, a Starlette ``HTTPException`` carrying ``.decision`` and
``.selectors``. ``install(app)`` registers `rate_limited_handler`, which answers the
decision's own problem+json refusal; without it FastAPI's default handler still answers the
right status and headers, with a ``{"detail": ...}`` body; register your own handler for
``RateLimited`` to answer something else. ``block=False`` never raises: the dependency
returns the decision (``decision.allowed`` says whether it was limited). The dependency adds
the ``RateLimit`` fields to the response FastAPI builds from the endpoint's return value; a
``Response`` the endpoint returns itself does not get them (FastAPI does not merge dependency
headers into it). In the dependency, ``"post:FIELD"`` reads a body whose declared
``Content-Length`` is at most 64 KiB (the endpoint can still read it); a larger or chunked
body counts as one without the field.
"""

# No `from __future__ import annotations` here: FastAPI reads the annotations of
# `RateLimit.__call__` at runtime to inject `Request` and `Response`, and a callable instance
# has no module globals to resolve string annotations with on older FastAPI versions.

import inspect
import re
from collections import deque
from email.parser import BytesParser
from email.policy import HTTP
from typing import (
    Any,
    Awaitable,
    Callable,
    Deque,
    Dict,
    Iterable,
    List,
    Mapping,
    MutableMapping,
    Optional,
    Sequence,
    Tuple,
    Union,
)
from urllib.parse import parse_qsl

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from ._errors import SluiceError
from ._keys import KeyMap, Source, methods
from ._leases import takes_leases
from ._sluice import ClientIp, Decision, Limiter

__all__ = [
    "MAX_FORM_BYTES",
    "RateLimit",
    "RateLimitMiddleware",
    "RateLimited",
    "install",
    "rate_limited_handler",
]

MAX_FORM_BYTES = 64 * 1024
"""The most body read to find a ``post:FIELD``; a larger body counts as missing the field."""

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
RefusalHandler = Callable[[Request, Decision, Dict[str, str]], Any]
PathRule = Union[str, re.Pattern[str]]

_FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


class RateLimited(HTTPException):
    """A refusal from the `RateLimit` dependency, carrying ``decision`` and ``selectors``.

    ``status_code`` is 429 (503 when the store could not decide); ``headers`` are the
    refusal's RateLimit and Retry-After fields; ``body`` is its problem+json document."""

    def __init__(self, decision: Decision, selectors: Mapping[str, str]):
        refusal = decision.refusal()
        if refusal is None:
            raise ValueError("RateLimited needs a denied decision")
        status, headers, body = refusal
        # The content type belongs to `body`; a handler answering something else sets its own.
        fields = {name: value for name, value in headers if name.lower() != "content-type"}
        super().__init__(status_code=status, headers=fields)
        self.decision = decision
        self.selectors = dict(selectors)
        self.body = body
        self.media_type = "application/problem+json"


async def rate_limited_handler(request: Request, exc: Exception) -> Response:
    """The exception handler `install` registers: the decision's own refusal."""
    assert isinstance(exc, RateLimited)
    return Response(exc.body, exc.status_code, headers=exc.headers, media_type=exc.media_type)


def install(app: Any) -> None:
    """Answer `RateLimited` on a FastAPI (or Starlette) app with the problem+json refusal."""
    app.add_exception_handler(RateLimited, rate_limited_handler)


class _ScopeView:
    """`sluice._keys.View` over an ASGI scope, with the form fields read beforehand (reading
    a body is asynchronous; the key map is not)."""

    def __init__(self, scope: Scope, form: Optional[Dict[str, str]]):
        self._scope = scope
        self._form = form
        self._query: Optional[Dict[str, str]] = None

    def peer(self) -> Optional[str]:
        client = self._scope.get("client")
        return client[0] if client else None

    def headers(self) -> Sequence[Tuple[str, str]]:
        return [(n.decode("latin-1"), v.decode("latin-1")) for n, v in self._scope["headers"]]

    def header(self, name: str) -> Optional[str]:
        return _header(self._scope, name.lower().encode("latin-1"))

    def query(self, name: str) -> Optional[str]:
        if self._query is None:
            self._query = _first_values(
                parse_qsl(self._scope.get("query_string", b"").decode("latin-1"),
                          keep_blank_values=True)
            )
        return self._query.get(name)

    def form(self, name: str) -> Optional[str]:
        return None if self._form is None else self._form.get(name)

    def user(self) -> Optional[str]:
        return _user_of(self._scope)


def _header(scope: Scope, name: bytes) -> Optional[str]:
    for key, value in scope["headers"]:
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def _first_values(pairs: Iterable[Tuple[str, str]]) -> Dict[str, str]:
    """A repeated field keys by its first value, as Werkzeug's and Django's ``.get`` do."""
    out: Dict[str, str] = {}
    for name, value in pairs:
        out.setdefault(name, value)
    return out


def _user_of(scope: Scope) -> Optional[str]:
    """The authenticated user of Starlette's ``AuthenticationMiddleware``, if any."""
    user = scope.get("user")
    if user is None or not getattr(user, "is_authenticated", False):
        return None
    try:
        identity = user.identity
    except (AttributeError, NotImplementedError):  # `BaseUser.identity` is optional
        identity = None
    if identity in (None, ""):
        identity = getattr(user, "display_name", None)
    return None if identity is None else str(identity)


def _is_form(scope: Scope) -> bool:
    content_type = (_header(scope, b"content-type") or "").lower()
    return content_type.startswith(_FORM_TYPES)


def _declared_length(scope: Scope) -> Optional[int]:
    value = _header(scope, b"content-length")
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


def _parse_form(body: bytes, content_type: str) -> Dict[str, str]:
    """The text fields of a form body (url-encoded or multipart; file parts are skipped)."""
    if content_type.lower().startswith("application/x-www-form-urlencoded"):
        pairs = parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True)
        return _first_values(pairs)
    # multipart/form-data is a MIME multipart message: the standard library reads it once the
    # request's content type is put in front as the message's own header.
    message = BytesParser(policy=HTTP).parsebytes(
        b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + body
    )
    fields: Dict[str, str] = {}
    if not message.is_multipart():
        return fields
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        if not isinstance(name, str) or part.get_filename() is not None:
            continue
        payload = part.get_payload(decode=True) or b""
        fields.setdefault(name, payload.decode(part.get_content_charset() or "utf-8", "replace"))
    return fields


async def _buffer_form(scope: Scope, receive: Receive) -> Tuple[Optional[Dict[str, str]],
                                                                List[Message]]:
    """Read up to `MAX_FORM_BYTES` of the body; returns the form (None when it could not be
    read whole) and every message received, for the app to receive again."""
    received: List[Message] = []
    declared = _declared_length(scope)
    if declared is not None and declared > MAX_FORM_BYTES:
        return None, received  # do not read what will not be used
    size = 0
    while True:
        message = await receive()
        received.append(message)
        if message["type"] != "http.request":  # the client went away
            return None, received
        size += len(message.get("body", b""))
        if size > MAX_FORM_BYTES:
            return None, received
        if not message.get("more_body", False):
            break
    body = b"".join(m.get("body", b"") for m in received)
    return _parse_form(body, _header(scope, b"content-type") or ""), received


def _replay(received: List[Message], receive: Receive) -> Receive:
    """A `receive` giving the buffered messages first, then the rest of the stream."""
    pending: Deque[Message] = deque(received)

    async def replayed() -> Message:
        if pending:
            return pending.popleft()
        return await receive()

    return replayed


def _encoded(fields: Iterable[Tuple[str, str]]) -> List[Tuple[bytes, bytes]]:
    return [(n.lower().encode("latin-1"), v.encode("latin-1")) for n, v in fields]


def _default_key(limiter: Limiter, policy: str, client_ip: ClientIp,
                 key: Optional[Mapping[str, Source]]) -> KeyMap:
    if key is None:
        key = {s: s for s in limiter.selectors(policy) if s in ("ip", "user")}
    return KeyMap(key, client_ip)


class RateLimitMiddleware:
    """Pure ASGI middleware counting each matching HTTP request against one policy."""

    def __init__(
        self,
        app: ASGIApp,
        limiter: Limiter,
        policy: str,
        key: Optional[Mapping[str, Source]] = None,
        method: Union[str, Sequence[str], None] = None,
        paths: Optional[Iterable[PathRule]] = None,
        trusted_proxies: Iterable[str] = (),
        headers: bool = True,
        on_refused: Optional[RefusalHandler] = None,
        cost: int = 1,
    ):
        self.app = app
        self.limiter = limiter
        self.policy = policy
        # Built now: an unknown policy or a bad key fails when the app starts.
        self.keymap = _default_key(limiter, policy, ClientIp(list(trusted_proxies)), key)
        self.methods = methods(method)
        self.paths: Optional[Tuple[PathRule, ...]] = None if paths is None else tuple(paths)
        self.headers = headers
        self.on_refused = on_refused
        self.cost = cost
        # A concurrency policy takes a lease per request, held while the app answers.
        self.concurrent = takes_leases(limiter, policy, cost)

    def applies(self, scope: Scope) -> bool:
        """Whether this request counts: an HTTP request of a limited method and path."""
        if scope["type"] != "http":
            return False
        if self.methods is not None and scope["method"] not in self.methods:
            return False
        if self.paths is None:
            return True
        path = scope["path"]
        return any(
            path.startswith(rule) if isinstance(rule, str) else rule.match(path)
            for rule in self.paths
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self.applies(scope):
            await self.app(scope, receive, send)
            return
        form = None
        if self.keymap.needs_form and _is_form(scope):
            form, received = await _buffer_form(scope, receive)
            receive = _replay(received, receive)
        request = Request(scope, receive)
        selectors = self.keymap.selectors(_ScopeView(scope, form), request)
        if self.concurrent:
            await self._hold(request, selectors, send)
            return
        decision = await self.limiter.check_async(self.policy, selectors, self.cost)
        if not decision.allowed:
            await self._refuse(request, decision, selectors, send)
            return
        if self.headers:
            send = _adding_headers(send, _encoded(decision.headers()))
        await self.app(scope, receive, send)

    async def _hold(self, request: Request, selectors: Dict[str, str], send: Send) -> None:
        """Answers a request under a concurrency policy: the app runs holding a slot, which
        goes back when the app returns (after the last body message of a streaming response
        is sent), raises, or is cancelled (the client went away)."""
        lease = await self.limiter.acquire_async(self.policy, selectors)
        if not lease:
            await self._refuse(request, lease.decision, selectors, send)
            return
        if self.headers:
            send = _adding_headers(send, _encoded(lease.decision.headers()))
        try:
            await self.app(request.scope, request.receive, send)
        finally:
            # A cancelled release leaves the lease to its background release.
            await lease.release_async()

    async def _refuse(self, request: Request, decision: Decision, selectors: Dict[str, str],
                      send: Send) -> None:
        if self.on_refused is not None:
            response = self.on_refused(request, decision, selectors)
            if inspect.isawaitable(response):
                response = await response
            await response(request.scope, request.receive, send)
            return
        refusal = decision.refusal()
        status, fields, body = refusal if refusal is not None else (429, [], b"")
        await send({"type": "http.response.start", "status": status,
                    "headers": _encoded(fields) + [(b"content-length", b"%d" % len(body))]})
        await send({"type": "http.response.body", "body": body})


def _adding_headers(send: Send, fields: List[Tuple[bytes, bytes]]) -> Send:
    """A `send` adding `fields` to the response start, unless the app set its own."""

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            present = message.get("headers", [])
            if not any(name.lower() == b"ratelimit" for name, _ in present):
                message = dict(message)
                message["headers"] = list(present) + fields
        await send(message)

    return sending


class RateLimit:
    """A FastAPI dependency counting each request of a route (or router) against a policy.

    ``Depends(RateLimit(...))`` returns the `Decision` (None when the method is not
    limited) and raises `RateLimited` on a refusal unless ``block=False``."""

    def __init__(
        self,
        limiter: Limiter,
        policy: str,
        key: Optional[Mapping[str, Source]] = None,
        method: Union[str, Sequence[str], None] = None,
        cost: int = 1,
        trusted_proxies: Iterable[str] = (),
        headers: bool = True,
        block: bool = True,
    ):
        if limiter.concurrent(policy):
            raise SluiceError(
                f"policy {policy!r} has a concurrency leaf, whose slot is held until the "
                "response ends: limit it with RateLimitMiddleware (or `async with "
                "limiter.acquire_async(...)` in the endpoint), not a dependency")
        self.limiter = limiter
        self.policy = policy
        self.keymap = _default_key(limiter, policy, ClientIp(list(trusted_proxies)), key)
        self.methods = methods(method)
        self.cost = cost
        self.headers = headers
        self.block = block

    async def __call__(self, request: Request, response: Response) -> Optional[Decision]:
        if self.methods is not None and request.method not in self.methods:
            return None
        form = None
        if self.keymap.needs_form and _is_form(request.scope):
            declared = _declared_length(request.scope)
            if declared is not None and declared <= MAX_FORM_BYTES:
                # `Request.body()` keeps the body, so the endpoint can still read it.
                form = _parse_form(await request.body(), request.headers["content-type"])
        selectors = self.keymap.selectors(_ScopeView(request.scope, form), request)
        decision = await self.limiter.check_async(self.policy, selectors, self.cost)
        if not decision.allowed and self.block:
            raise RateLimited(decision, selectors)
        if self.headers:
            for name, value in decision.headers(retry_after=False):
                response.headers[name] = value
        return decision
