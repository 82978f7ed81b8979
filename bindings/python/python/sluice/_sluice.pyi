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
        """`limited`, `penalized`, `cost_exceeds_capacity`, `occupied` (every concurrency slot
        held), `store_unavailable`, or None."""
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

class Lease:
    """`Limiter.acquire`'s answer: the decision and, while admitted and not released, the
    concurrency slot it holds. `bool(lease)` is `lease.allowed`. `with` and `async with`
    release it when the block ends; one dropped unreleased is released in the background."""

    @property
    def decision(self) -> Decision: ...
    @property
    def allowed(self) -> bool: ...
    @property
    def held(self) -> bool:
        """Whether it still holds a slot: admitted with one, not released yet."""
    @property
    def id(self) -> Optional[str]: ...
    @property
    def token(self) -> Optional[str]:
        """For `Limiter.release` and `Limiter.renew` in another process."""
    def release(self) -> str:
        """`released`, `expired` (the slot was free already) or `not_held`."""
    def release_async(self) -> Awaitable[str]: ...
    def renew(self) -> Optional[float]:
        """Seconds left after extending it by one lease time; None when expired or released."""
    def renew_async(self) -> Awaitable[Optional[float]]: ...
    def __bool__(self) -> bool: ...
    def __enter__(self) -> Lease: ...
    def __exit__(self, *exc: object) -> bool: ...
    def __aenter__(self) -> Awaitable[Lease]: ...
    def __aexit__(self, *exc: object) -> Awaitable[bool]: ...

class Reservation:
    """`Limiter.reserve`'s answer: the decision on the estimate and, when admitted, the charge
    to settle with the actual cost. `bool(reservation)` is `reservation.allowed`. One never
    settled keeps its estimate charged."""

    @property
    def decision(self) -> Decision: ...
    @property
    def allowed(self) -> bool: ...
    @property
    def estimate(self) -> int: ...
    @property
    def pending(self) -> bool:
        """Whether it still waits for `settle`."""
    @property
    def token(self) -> Optional[str]:
        """For `Limiter.settle` in another process."""
    def settle(self, actual: int) -> None:
        """Refunds or charges the difference from the estimate (an excess is debt, never
        refused); raises SluiceError when there is nothing to settle."""
    def settle_async(self, actual: int) -> Awaitable[None]: ...
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
    def acquire(self, policy: str, selectors: Optional[Selectors] = None) -> Lease: ...
    def acquire_async(
        self, policy: str, selectors: Optional[Selectors] = None
    ) -> Awaitable[Lease]: ...
    def reserve(
        self, policy: str, selectors: Optional[Selectors] = None, estimate: int = 1
    ) -> Reservation: ...
    def reserve_async(
        self, policy: str, selectors: Optional[Selectors] = None, estimate: int = 1
    ) -> Awaitable[Reservation]: ...
    def release(self, policy: str, token: str) -> str: ...
    def renew(self, policy: str, token: str) -> Optional[float]: ...
    def settle(self, policy: str, token: str, actual: int) -> None: ...
    @property
    def policies(self) -> dict[str, str]: ...
    def selectors(self, policy: str) -> list[str]: ...
    def concurrent(self, policy: str) -> bool:
        """Whether the policy's rule has a concurrency leaf (taken with `acquire`)."""
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
