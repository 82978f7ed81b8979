"""Where each selector's value comes from in a web request: the one place every framework
integration reads its `key={...}` argument.

A source is one of:

- ``"ip"``: the client address, resolved with the tower layer's rules (`sluice.ClientIp`:
  forwarding headers believed only from trusted proxies; IPv6 keyed by its /64);
- ``"user"``: the authenticated user (its primary key or identity); anonymous requests share
  the empty value;
- ``"header:NAME"``: a request header;
- ``"get:FIELD"``: a query-string field;
- ``"post:FIELD"``: a submitted form field, hashed (`sluice.hashed`) so the store never holds
  a username or an e-mail address in clear;
- ``"const:VALUE"``: a fixed value;
- a callable taking the framework's own request object and returning a str (or None).

A value that is missing is the empty string: leaving a field out must not be a way around
the limit (every request without it shares one counter), as in the tower layer.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Protocol, Sequence, Union

from ._sluice import ClientIp, hashed

Source = Union[str, Callable[[Any], Optional[str]]]


class View(Protocol):
    """What a framework integration tells about one request."""

    def peer(self) -> Optional[str]:
        """The socket peer's address."""

    def headers(self) -> Sequence[tuple[str, str]]:
        """Every header as (name, value) pairs (only forwarding headers are read)."""

    def header(self, name: str) -> Optional[str]: ...

    def query(self, name: str) -> Optional[str]: ...

    def form(self, name: str) -> Optional[str]: ...

    def user(self) -> Optional[str]: ...


_KINDS = ("header", "get", "post", "const")


class KeyMap:
    """The parsed `key={...}` of a decorator or middleware: selector name to source."""

    def __init__(self, key: Mapping[str, Source], client_ip: Optional[ClientIp] = None):
        if not isinstance(key, Mapping):
            raise TypeError("key must be a dict of selector name to source")
        self.client_ip = client_ip or ClientIp()
        self._getters: list[tuple[str, Callable[[View, Any], Optional[str]]]] = []
        self.needs_form = False
        for selector, source in key.items():
            if not isinstance(selector, str) or not selector:
                raise TypeError("selector names must be non-empty str")
            self._getters.append((selector, self._getter(selector, source)))

    def _getter(self, selector: str, source: Source) -> Callable[[View, Any], Optional[str]]:
        if callable(source):
            return lambda view, request: _text(source(request))
        if not isinstance(source, str):
            raise TypeError(f"key[{selector!r}] must be a str source or a callable")
        if source == "ip":
            resolver = self.client_ip

            def ip(view: View, request: Any) -> Optional[str]:
                peer = view.peer()
                if not peer:
                    return None
                try:
                    return resolver.key(peer, list(view.headers()))
                except ValueError:  # a peer that is not an address (a Unix socket)
                    return peer
            return ip
        if source == "user":
            return lambda view, request: view.user()
        kind, sep, name = source.partition(":")
        if not sep or kind not in _KINDS or not name:
            raise ValueError(
                f"key[{selector!r}] = {source!r}: expected 'ip', 'user', 'header:NAME', "
                "'get:FIELD', 'post:FIELD', 'const:VALUE' or a callable"
            )
        if kind == "header":
            return lambda view, request: view.header(name)
        if kind == "get":
            return lambda view, request: view.query(name)
        if kind == "const":
            return lambda view, request: name
        self.needs_form = True

        def post(view: View, request: Any) -> Optional[str]:
            value = view.form(name)
            return None if value is None else hashed(value)
        return post

    def selectors(self, view: View, request: Any) -> dict[str, str]:
        """The selector values of one request; missing ones are empty."""
        out = {}
        for selector, getter in self._getters:
            value = getter(view, request)
            out[selector] = "" if value is None else value
        return out


def _text(value: Any) -> Optional[str]:
    if value is None:
        return None
    return value if isinstance(value, str) else str(value)


def methods(method: Union[str, Sequence[str], None]) -> Optional[frozenset[str]]:
    """`method="POST"` or `["POST", "PUT"]` as a set of upper-case names; None for all."""
    if method is None:
        return None
    if isinstance(method, str):
        method = [method]
    names = frozenset(m.upper() for m in method)
    if not names or "ALL" in names:
        return None
    return names
