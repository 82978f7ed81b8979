"""Type stubs of the native module (built from bindings/python/src/lib.rs)."""

from __future__ import annotations

import datetime
import os
from typing import Awaitable, Mapping, Optional, Union

__version__: str

PolicyFields = Mapping[str, Union[str, int, float, bool, datetime.timedelta, Mapping[str, Union[str, int, float, datetime.timedelta]]]]
Selectors = Mapping[str, Union[str, int]]

class Decision:
    """One hit's answer. `bool(decision)` is `decision.allowed`."""

    @property
    def allowed(self) -> bool: ...
    @property
    def remaining(self) -> int: ...
    @property
    def limit(self) -> int: ...
    @property
    def retry_after(self) -> Optional[float]:
        """Seconds until the same hit would pass; None when admitted or not known."""
    @property
    def reset_after(self) -> float: ...
    @property
    def leaf(self) -> str:
        """The deciding leaf as rule text, e.g. `ip+user:5/m`."""
    @property
    def denial(self) -> Optional[str]:
        """`limited`, `penalized`, `cost_exceeds_capacity`, `store_unavailable`, or None."""
    @property
    def shadow_denied(self) -> bool: ...
    @property
    def cached(self) -> bool: ...
    @property
    def without_store(self) -> Optional[str]:
        """The failure mode that decided because the store could not: `open`, `closed` or
        `local`; None when the store decided."""
    @property
    def policy(self) -> str: ...
    def headers(
        self, *, retry_after: bool = True, ietf: bool = True, x_ratelimit: bool = False
    ) -> list[tuple[str, str]]: ...
    def refusal(
        self, *, retry_after: bool = True, ietf: bool = True, x_ratelimit: bool = False
    ) -> Optional[tuple[int, list[tuple[str, str]], bytes]]: ...
    def __bool__(self) -> bool: ...

class Limiter:
    def __init__(
        self,
        store: str = "memory://",
        policies: Optional[Mapping[str, Union[str, PolicyFields]]] = None,
        *,
        config: Optional[Union[str, os.PathLike[str]]] = None,
        near_cache: Optional[tuple[int, float]] = None,
    ) -> None: ...
    @staticmethod
    def from_config(
        path: Union[str, os.PathLike[str]],
        store: str = "memory://",
        *,
        near_cache: Optional[tuple[int, float]] = None,
    ) -> Limiter: ...
    def check(self, policy: str, selectors: Optional[Selectors] = None, cost: int = 1) -> Decision: ...
    def peek(self, policy: str, selectors: Optional[Selectors] = None, cost: int = 1) -> Decision: ...
    def reset(self, policy: str, selectors: Optional[Selectors] = None) -> None: ...
    def check_async(
        self, policy: str, selectors: Optional[Selectors] = None, cost: int = 1
    ) -> Awaitable[Decision]: ...
    def peek_async(
        self, policy: str, selectors: Optional[Selectors] = None, cost: int = 1
    ) -> Awaitable[Decision]: ...
    def reset_async(self, policy: str, selectors: Optional[Selectors] = None) -> Awaitable[None]: ...
    @property
    def policies(self) -> dict[str, str]: ...
    def selectors(self, policy: str) -> list[str]: ...
    @property
    def store(self) -> str: ...
    def stats(self) -> dict[str, int]: ...

class ClientIp:
    def __init__(
        self,
        trusted: list[str] = ...,
        *,
        header: str = "x-forwarded-for",
        ipv4_prefix: int = 32,
        ipv6_prefix: int = 64,
    ) -> None: ...
    def resolve(self, peer: str, headers: list[tuple[str, str]] = ...) -> str: ...
    def key(self, peer: str, headers: list[tuple[str, str]] = ...) -> str: ...

def hashed(value: str) -> str: ...
def parse_rule(rule: str) -> str: ...
