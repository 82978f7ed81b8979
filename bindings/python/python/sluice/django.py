"""Rate limiting for Django: a view decorator, a middleware and a signal.

The one-minute path. In ``settings.py``::

    SLUICE = {
        "STORE": "redis://127.0.0.1:6379",      # default "memory://" (one process only)
        "POLICIES": {"login": "ip+user:5/m", "api": {"rule": "ip:100/m", "namespace": "shop"}},
    }

and in ``views.py``::

    from sluice.django import ratelimit

    @ratelimit("api", key={"ip": "ip"})
    def search(request):
        ...

The 101st request from one address within a minute gets ``429 Too Many Requests`` with
``Retry-After``, the ``RateLimit-Policy`` and ``RateLimit`` fields and an
``application/problem+json`` body (``503`` when the store could not decide and the policy's
failure mode says to refuse). Admitted responses carry the ``RateLimit`` fields too.

**Settings.** Everything lives in one ``SLUICE`` dict; every key is optional:

- ``"STORE"``: ``"memory://"`` (default) or a ``redis://`` URL (any store URL sluice takes);
- ``"POLICIES"``: policy name to rule text, or to a dict of policy fields (``rule``,
  ``namespace``, ``key``, ``count_denied``, ``penalty``, ``failure``, ...);
- ``"CONFIG"``: the path of a ``sluice serve`` TOML config, whose policies are loaded too;
- ``"TRUSTED_PROXIES"``: addresses or networks (``["10.0.0.0/8"]``) whose
  ``X-Forwarded-For`` is believed; from anyone else it is ignored, so a client cannot pick
  its own key;
- ``"REFUSAL_VIEW"``: a callable or a dotted path, ``(request, decision) -> HttpResponse``,
  answering refusals instead of `refusal_response`;
- ``"HEADERS"``: ``{"admitted": True, "retry_after": True, "ietf": True, "x_ratelimit":
  False}``: ``admitted`` puts the RateLimit fields on admitted responses, the others choose
  the fields (``x_ratelimit`` adds the ``X-RateLimit-*`` trio);
- ``"MIDDLEWARE"``: the rules `RateLimitMiddleware` applies (below).

The limiter is built once, on first use, and rebuilt when the ``SLUICE`` setting changes
(``override_settings`` in tests). `get_limiter()` returns it, e.g. to ``reset`` (pardon) a
key from an admin action.

**The decorator.** ``ratelimit(policy, key=None, *, method=None, block=True, limiter=None,
cost=1, count="all", failed=None)``:

- ``key={selector: source}`` says where each selector of the policy's rule comes from:
  ``"ip"`` (``REMOTE_ADDR``, or the forwarded address when the peer is a trusted proxy;
  IPv6 keyed by its /64), ``"user"`` (``request.user.pk`` when authenticated; anonymous
  requests share the empty value), ``"header:NAME"``, ``"get:FIELD"`` (``request.GET``),
  ``"post:FIELD"`` (``request.POST``, hashed before it reaches the store),
  ``"const:VALUE"``, or a callable taking the request. A missing value is the empty string,
  so leaving a field out is no way around the limit. Without ``key``, each selector of the
  rule named ``ip`` or ``user`` takes that source.
- ``method="POST"`` (or a list, or `UNSAFE`) limits only those methods; others pass
  unchecked and uncounted.
- ``block=True`` answers refusals with the refusal view. ``block=False`` runs the view
  anyway and sets ``request.limited`` (True once any limit of the request refused) and
  ``request.sluice_decision`` (the tightest decision), so the view decides.
- ``limiter`` uses that `sluice.Limiter` instead of the one built from settings.
- ``cost`` is how many hits the request counts for.

Class-based views take it through ``method_decorator``::

    from django.utils.decorators import method_decorator

    @method_decorator(ratelimit("api", key={"user": "user"}), name="dispatch")
    class ReportView(View):
        ...

``method_decorator`` decorates anew on each call, so a class-based view's `refused` signal
has no stable ``sender``: tell its refusals apart by ``policy`` or ``request.path``.

Async views are decorated the same way; the wrapper is then a coroutine function and asks
the store without blocking the event loop.

**Refusals.** The default refusal view is `refusal_response`; ``SLUICE["REFUSAL_VIEW"]``
replaces it, e.g. to render a template. The limit's headers (``Retry-After``, ``RateLimit``)
are added to a custom refusal when it does not set them. The signal `refused`
(``sluice.django.refused``) is sent for every denied decision, with ``sender`` the
decorated view (or `RateLimitMiddleware`) and the keyword arguments ``request``,
``policy``, ``decision``, ``selectors`` and ``blocked`` (False under ``block=False``)::

    from django.dispatch import receiver
    from sluice.django import refused

    @receiver(refused)
    def audit(sender, request, policy, decision, selectors, blocked, **kwargs):
        logger.warning("%s refused by %s (%s)", request.path, policy, decision.leaf)

**The middleware.** Add ``"sluice.django.RateLimitMiddleware"`` to ``MIDDLEWARE`` (after
``AuthenticationMiddleware`` if a rule keys by ``"user"``) and list its rules::

    SLUICE = {
        ...,
        "MIDDLEWARE": [
            {"policy": "api", "key": {"ip": "ip"}, "paths": ["/api/"]},
            {"policy": "writes", "key": {"user": "user"}, "method": ["POST", "PUT"]},
        ],
    }

A rule takes the decorator's options (``key``, ``method``, ``block``, ``cost``,
``count``, ``failed``) plus ``paths``, prefixes of ``request.path_info`` (default: every
path). Every matching rule counts the request; the first that refuses answers it.

**Concurrency policies.** A policy whose rule has a concurrency leaf (``"user:3
concurrent"``: at most 3 exports running per user) takes a lease per request instead of a
check, in the decorator and in middleware rules alike. The slot is held until Django closes
the response, which it does once the response is sent: a ``StreamingHttpResponse`` keeps it
until its last chunk. A view that raises, or a later limit that refuses, gives it back at
once. A request finding every slot held is refused as for a rate (429, denial
``occupied``). Such a policy takes neither ``count="failures"`` nor a ``cost`` other than 1
(``ImproperlyConfigured`` on the first request).

**Logins: a success does not count.** ``count="failures"`` counts only the requests whose
response is a failure (status >= 400, or ``failed(request, response)`` returns True)::

    @ratelimit("login", key={"ip": "ip", "user": "post:username"}, method="POST",
               count="failures")
    def login(request):
        ...

Before the view, the limit is peeked (nothing recorded): a key already over it is refused.
After the view, a failure is charged. Failures of one key that run at the same moment can
all pass the peek, so a burst of N concurrent attempts can run the view up to N - 1 times
past the limit (each is still counted, so the next attempt is refused). Use ``count="all"``
where that matters more than letting successes through.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Awaitable, Callable, Mapping, Optional, Sequence, Union

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import Signal
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.utils.module_loading import import_string

from ._keys import KeyMap, Source, methods
from ._leases import let_go, let_go_async, takes_leases
from ._sluice import ClientIp, Decision, Lease, Limiter

try:  # Django >= 5.0 marks async views this way too; inspect's check misses those.
    from asgiref.sync import iscoroutinefunction
except ImportError:  # asgiref < 3.7
    from inspect import iscoroutinefunction

__all__ = [
    "UNSAFE",
    "RateLimitMiddleware",
    "get_limiter",
    "ratelimit",
    "refusal_response",
    "refused",
]

refused = Signal()
"""Sent for every denied decision: ``sender`` (the decorated view, or
`RateLimitMiddleware`), ``request``, ``policy``, ``decision``, ``selectors``, ``blocked``."""

UNSAFE = ("DELETE", "PATCH", "POST", "PUT")
"""The methods that change state: ``method=UNSAFE``."""

Method = Union[str, Sequence[str], None]
Failed = Callable[[HttpRequest, HttpResponseBase], bool]
RefusalView = Callable[[HttpRequest, Decision], HttpResponseBase]

_SETTINGS = frozenset(
    {"STORE", "POLICIES", "CONFIG", "TRUSTED_PROXIES", "REFUSAL_VIEW", "HEADERS", "MIDDLEWARE"}
)
_HEADER_DEFAULTS = {"admitted": True, "retry_after": True, "ietf": True, "x_ratelimit": False}
_RULE_FIELDS = frozenset({"policy", "key", "method", "block", "cost", "count", "failed", "paths"})


def refusal_response(request: HttpRequest, decision: Decision) -> HttpResponse:
    """The default refusal: the decision's own status (429, or 503 when the store could not
    decide), headers and problem+json body."""
    refusal = decision.refusal(**_current().header_options)
    if refusal is None:
        raise ValueError("refusal_response needs a denied decision")
    status, headers, body = refusal
    return HttpResponse(body, status=status, headers=dict(headers))


def get_limiter() -> Limiter:
    """The limiter built from ``settings.SLUICE`` (the same one until the setting changes)."""
    return _current().limiter()


class _Settings:
    """One reading of ``settings.SLUICE``, validated, so a typo fails loudly once rather than
    silently on every request. The limiter is built on first use: a view given its own
    ``limiter=`` must not need the settings' store to be reachable."""

    def __init__(self, raw: Mapping[str, Any]):
        if not isinstance(raw, Mapping):
            raise ImproperlyConfigured("SLUICE must be a dict")
        unknown = set(raw) - _SETTINGS
        if unknown:
            raise ImproperlyConfigured(
                f"SLUICE has unknown keys {sorted(unknown)}; expected some of {sorted(_SETTINGS)}"
            )
        self._raw = raw
        self.client_ip = ClientIp(list(raw.get("TRUSTED_PROXIES", ())))
        headers = {**_HEADER_DEFAULTS, **raw.get("HEADERS", {})}
        if set(headers) != set(_HEADER_DEFAULTS):
            raise ImproperlyConfigured(
                f"SLUICE['HEADERS'] takes the keys {sorted(_HEADER_DEFAULTS)}"
            )
        self.admitted_headers = bool(headers.pop("admitted"))
        self.header_options = {name: bool(value) for name, value in headers.items()}
        refusal = raw.get("REFUSAL_VIEW")
        self.refusal_view: RefusalView = (
            import_string(refusal) if isinstance(refusal, str) else refusal or refusal_response
        )
        self.middleware_rules = [_middleware_rule(rule) for rule in raw.get("MIDDLEWARE", ())]
        self._limiter: Optional[Limiter] = None
        self._building = threading.Lock()

    def limiter(self) -> Limiter:
        if self._limiter is None:
            # Two limiters over a memory store would be two sets of counters: build one.
            with self._building:
                if self._limiter is None:
                    self._limiter = Limiter(
                        self._raw.get("STORE", "memory://"),
                        self._raw.get("POLICIES"),
                        config=self._raw.get("CONFIG"),
                    )
        return self._limiter


_settings: Optional[_Settings] = None
_reading = threading.Lock()


def _current() -> _Settings:
    global _settings
    current = _settings
    if current is None:
        with _reading:
            if _settings is None:
                _settings = _Settings(getattr(settings, "SLUICE", {}))
            current = _settings
    return current


def _forget_settings(*, setting: str, **kwargs: Any) -> None:
    global _settings
    if setting == "SLUICE":
        with _reading:
            _settings = None


setting_changed.connect(_forget_settings, dispatch_uid="sluice.django.forget_settings")


class _RequestView:
    """`sluice._keys.View` over a Django request. ``user`` is given when it was already
    resolved (an async view awaits ``request.auser()``: reading ``request.user`` there could
    query the database from the event loop)."""

    _UNRESOLVED = object()

    def __init__(self, request: HttpRequest, user: Any = _UNRESOLVED):
        self._request = request
        self._user = user

    def peer(self) -> Optional[str]:
        return self._request.META.get("REMOTE_ADDR")

    def headers(self) -> Sequence[tuple[str, str]]:
        return list(self._request.headers.items())

    def header(self, name: str) -> Optional[str]:
        return self._request.headers.get(name)

    def query(self, name: str) -> Optional[str]:
        return self._request.GET.get(name)

    def form(self, name: str) -> Optional[str]:
        return self._request.POST.get(name)

    def user(self) -> Optional[str]:
        user = self._user
        if user is self._UNRESOLVED:
            user = getattr(self._request, "user", None)
        if user is None or not user.is_authenticated:
            return None
        return str(user.pk)


def _failed_by_status(request: HttpRequest, response: HttpResponseBase) -> bool:
    return response.status_code >= 400


class _Guard:
    """One limit applied to requests: the options of one decorator or middleware rule."""

    def __init__(
        self,
        policy: str,
        key: Optional[Mapping[str, Source]],
        method: Method,
        block: bool,
        limiter: Optional[Limiter],
        cost: int,
        count: str,
        failed: Optional[Failed],
    ):
        if not isinstance(policy, str) or not policy:
            raise TypeError("policy must be a policy name")
        if count not in ("all", "failures"):
            raise ValueError("count must be 'all' or 'failures'")
        if failed is not None and count != "failures":
            raise ValueError("failed= only applies with count='failures'")
        self.policy = policy
        # Parsed now, so a bad source fails at import time rather than on the first request.
        self._key = None if key is None else dict(key)
        if self._key is not None:
            KeyMap(self._key)
        self._methods = methods(method)
        self.block = bool(block)
        self._limiter = limiter
        self.cost = cost
        self.count_failures = count == "failures"
        self.failed: Failed = failed or _failed_by_status
        # The key map holds the settings' ClientIp, so it is rebuilt with the settings.
        self._keymap: Optional[tuple[_Settings, KeyMap]] = None

    def applies(self, request: HttpRequest) -> bool:
        return self._methods is None or request.method in self._methods

    def limiter(self, current: _Settings) -> Limiter:
        return self._limiter or current.limiter()

    def wants_user(self, current: _Settings) -> bool:
        return any(source == "user" for source in self._keys(current).values())

    def selectors(
        self, current: _Settings, request: HttpRequest, view: _RequestView
    ) -> dict[str, str]:
        cached = self._keymap
        if cached is None or cached[0] is not current:
            cached = (current, KeyMap(self._keys(current), current.client_ip))
            self._keymap = cached
        return cached[1].selectors(view, request)

    def _keys(self, current: _Settings) -> Mapping[str, Source]:
        if self._key is not None:
            return self._key
        needed = self.limiter(current).selectors(self.policy)
        return {selector: selector for selector in needed if selector in ("ip", "user")}


def _middleware_rule(rule: Mapping[str, Any]) -> tuple[_Guard, tuple[str, ...]]:
    if not isinstance(rule, Mapping) or "policy" not in rule:
        raise ImproperlyConfigured("each SLUICE['MIDDLEWARE'] rule is a dict with a 'policy'")
    unknown = set(rule) - _RULE_FIELDS
    if unknown:
        raise ImproperlyConfigured(
            f"SLUICE['MIDDLEWARE'] rule for {rule['policy']!r} has unknown keys {sorted(unknown)}"
        )
    failed = rule.get("failed")
    guard = _Guard(
        rule["policy"],
        rule.get("key"),
        rule.get("method"),
        rule.get("block", True),
        None,
        rule.get("cost", 1),
        rule.get("count", "all"),
        import_string(failed) if isinstance(failed, str) else failed,
    )
    paths = rule.get("paths") or ("",)
    if isinstance(paths, str):
        paths = (paths,)
    return guard, tuple(paths)


# The guards that let a request through: what charging a failure and the headers need.
Passed = list[tuple[_Guard, Limiter, dict[str, str], Decision]]


def _remember(request: HttpRequest, decision: Decision) -> None:
    """Keep ``request.limited`` and the tightest ``request.sluice_decision``: stacked limits
    (decorators, middleware rules) each check once."""
    request.limited = getattr(request, "limited", False) or not decision.allowed
    current: Optional[Decision] = getattr(request, "sluice_decision", None)
    if current is None or _tighter(decision, current):
        request.sluice_decision = decision


def _tighter(a: Decision, b: Decision) -> bool:
    if a.allowed != b.allowed:
        return not a.allowed
    return a.remaining < b.remaining


def _refused_arguments(
    sender: Any, request: HttpRequest, guard: _Guard, selectors: dict[str, str], decision: Decision
) -> dict[str, Any]:
    return {
        "sender": sender,
        "request": request,
        "policy": guard.policy,
        "decision": decision,
        "selectors": selectors,
        "blocked": guard.block,
    }


def _refusal(current: _Settings, request: HttpRequest, decision: Decision) -> HttpResponseBase:
    response = current.refusal_view(request, decision)
    if current.refusal_view is not refusal_response:
        _add_headers(response, decision.headers(**current.header_options))
    return response


def _add_headers(response: HttpResponseBase, headers: list[tuple[str, str]]) -> None:
    # A field the view (or an inner limit) set already is left as it is.
    for name, value in headers:
        if not response.has_header(name):
            response[name] = value


def _finish(
    current: _Settings, response: HttpResponseBase, decisions: list[Decision]
) -> HttpResponseBase:
    """Add the RateLimit fields of the tightest admitting decision."""
    admitted = [decision for decision in decisions if decision.allowed]
    if current.admitted_headers and admitted:
        tightest = min(admitted, key=lambda decision: decision.remaining)
        _add_headers(response, tightest.headers(**current.header_options))
    return response


# The request's path through the guards, once synchronous and once asynchronous: the two
# differ only in awaiting the store (and the user, and the view).
#
# With count="failures" the limit is peeked before the view and charged after a failure.
# That is two store calls, so failures of one key in flight at once can all pass the peek:
# the view may run up to (in flight - 1) times past the limit; each failure is still
# charged, so the next attempt is refused. The exact alternative is to charge first and
# give the hit back on success, which needs a refund the limiter does not offer (`reset`
# would forget the key's other failures too, and a multi-leaf rule's shared leaves). A
# per-key lock would be exact only within one process and would queue a user's logins
# behind a slow one; the race is bounded by concurrency, which login forms rarely see
# from a legitimate client, so the simple way was chosen.


# A guard whose policy has a concurrency leaf takes a lease instead of a check, held until
# the response is closed: Django closes it once the server has sent it, a streaming
# response after its last chunk (`HttpResponseBase.close` runs the closers added here). A
# view that raises, and a later guard that refuses, give the leases taken back at once.


def _concurrent(guard: _Guard, limiter: Limiter) -> bool:
    try:
        leases = takes_leases(limiter, guard.policy, guard.cost)
    except ValueError as error:
        raise ImproperlyConfigured(str(error)) from None
    if leases and guard.count_failures:
        raise ImproperlyConfigured(
            f"policy {guard.policy!r} has a concurrency leaf: a request holds one slot, so "
            "it takes no count='failures'"
        )
    return leases


def _hold_until_closed(response: HttpResponseBase, leases: list[Lease]) -> HttpResponseBase:
    for lease in leases:
        response._resource_closers.append(functools.partial(let_go, lease))
    return response


def _guarded(
    guards: Sequence[_Guard],
    sender: Any,
    request: HttpRequest,
    call: Callable[[], HttpResponseBase],
) -> HttpResponseBase:
    current = _current()
    passed: Passed = []
    leases: list[Lease] = []
    view = _RequestView(request)
    try:
        for guard in guards:
            limiter = guard.limiter(current)
            selectors = guard.selectors(current, request, view)
            if _concurrent(guard, limiter):
                lease = limiter.acquire(guard.policy, selectors)
                leases.append(lease)
                decision = lease.decision
            else:
                ask = limiter.peek if guard.count_failures else limiter.check
                decision = ask(guard.policy, selectors, guard.cost)
            _remember(request, decision)
            if not decision.allowed:
                refused.send(**_refused_arguments(sender, request, guard, selectors, decision))
                if guard.block:
                    for lease in leases:
                        let_go(lease)
                    return _refusal(current, request, decision)
            passed.append((guard, limiter, selectors, decision))
        response = call()
    except BaseException:
        for lease in leases:
            let_go(lease)
        raise
    decisions = []
    for guard, limiter, selectors, decision in passed:
        if guard.count_failures and guard.failed(request, response):
            decision = limiter.check(guard.policy, selectors, guard.cost)
        decisions.append(decision)
    return _hold_until_closed(_finish(current, response, decisions), leases)


async def _guarded_async(
    guards: Sequence[_Guard],
    sender: Any,
    request: HttpRequest,
    call: Callable[[], Awaitable[HttpResponseBase]],
) -> HttpResponseBase:
    current = _current()
    passed: Passed = []
    user: Any = _RequestView._UNRESOLVED
    if hasattr(request, "auser") and any(guard.wants_user(current) for guard in guards):
        user = await request.auser()
    view = _RequestView(request, user)
    leases: list[Lease] = []
    try:
        for guard in guards:
            limiter = guard.limiter(current)
            selectors = guard.selectors(current, request, view)
            if _concurrent(guard, limiter):
                lease = await limiter.acquire_async(guard.policy, selectors)
                leases.append(lease)
                decision = lease.decision
            else:
                ask = limiter.peek_async if guard.count_failures else limiter.check_async
                decision = await ask(guard.policy, selectors, guard.cost)
            _remember(request, decision)
            if not decision.allowed:
                # `asend` (Django >= 5.0) also runs async receivers; `send` cannot from a loop.
                arguments = _refused_arguments(sender, request, guard, selectors, decision)
                if hasattr(refused, "asend"):
                    await refused.asend(**arguments)
                else:
                    refused.send(**arguments)
                if guard.block:
                    for lease in leases:
                        await let_go_async(lease)
                    return _refusal(current, request, decision)
            passed.append((guard, limiter, selectors, decision))
        response = await call()
    except BaseException:
        for lease in leases:
            await let_go_async(lease)
        raise
    decisions = []
    for guard, limiter, selectors, decision in passed:
        if guard.count_failures and guard.failed(request, response):
            decision = await limiter.check_async(guard.policy, selectors, guard.cost)
        decisions.append(decision)
    # Django closes the response from a thread (`sync_to_async`), where a sync release is
    # right.
    return _hold_until_closed(_finish(current, response, decisions), leases)



def ratelimit(
    policy: str,
    key: Optional[Mapping[str, Source]] = None,
    *,
    method: Method = None,
    block: bool = True,
    limiter: Optional[Limiter] = None,
    cost: int = 1,
    count: str = "all",
    failed: Optional[Failed] = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Limit a view by `policy` (see the module doc for every option)."""
    guard = _Guard(policy, key, method, block, limiter, cost, count, failed)

    def decorate(view: Callable[..., Any]) -> Callable[..., Any]:
        if iscoroutinefunction(view):
            async def limited_async(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
                if not guard.applies(request):
                    return await view(request, *args, **kwargs)
                return await _guarded_async(
                    (guard,), limited, request, lambda: view(request, *args, **kwargs)
                )

            limited: Callable[..., Any] = functools.wraps(view)(limited_async)
        else:
            def limited_sync(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
                if not guard.applies(request):
                    return view(request, *args, **kwargs)
                return _guarded((guard,), limited, request, lambda: view(request, *args, **kwargs))

            limited = functools.wraps(view)(limited_sync)
        return limited

    return decorate


class RateLimitMiddleware:
    """Applies ``SLUICE["MIDDLEWARE"]`` rules to every request whose path starts with one of
    a rule's ``paths`` (see the module doc). Synchronous: under ASGI, Django runs it in a
    thread like any other sync middleware."""

    sync_capable = True
    async_capable = False

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        path = request.path_info
        guards = [
            guard
            for guard, prefixes in _current().middleware_rules
            if guard.applies(request) and path.startswith(prefixes)
        ]
        if not guards:
            return self.get_response(request)
        return _guarded(guards, RateLimitMiddleware, request, lambda: self.get_response(request))
