"""What the framework integrations share to hold a lease per request under a concurrency
policy: whether a policy takes leases, and letting a lease go without raising."""

from __future__ import annotations

from ._errors import SluiceError
from ._sluice import Lease, Limiter


def takes_leases(limiter: Limiter, policy: str, cost: int) -> bool:
    """Whether `policy` takes a lease per request (its rule has a concurrency leaf) instead of
    a check; a request holds one slot, so `cost` must be 1 then (ValueError otherwise)."""
    if not limiter.concurrent(policy):
        return False
    if cost != 1:
        raise ValueError(f"policy {policy!r} has a concurrency leaf: a request takes one "
                         f"slot, so cost must be 1 (got {cost})")
    return True


def let_go(lease: Lease) -> None:
    """Releases `lease`; a store that cannot answer leaves it to expire at its lease time."""
    try:
        lease.release()
    except SluiceError:
        pass


async def let_go_async(lease: Lease) -> None:
    """`let_go`, awaited."""
    try:
        await lease.release_async()
    except SluiceError:
        pass
