"""Concurrency leases and reservations from Python: `Limiter.acquire` and `Limiter.reserve`,
sync and async, on memory and on a real redis-server (the `store` fixture runs each test on
both). Holders count themselves: the tests sample the holders' own count, never the store's."""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import sluice
from conftest import own_redis_server, policy


def served_by_threads(acquire, limit: int, threads: int, rounds: int) -> tuple[int, int]:
    """`threads` holders, each taking a slot `rounds` times (trying again while refused) and
    releasing it once `limit` holders hold one, or once no other holder is seeking one. The
    most holders seen at once, and how many rounds were served."""
    changed = threading.Condition()
    holding, most, seeking = 0, 0, threads

    def holder(_: int) -> int:
        nonlocal holding, most, seeking
        mine = 0
        for round in range(rounds):
            if round > 0:
                with changed:
                    seeking += 1
            for _attempt in range(100_000):
                lease = acquire()
                if lease:
                    break
                assert lease.decision.denial == "occupied"
                time.sleep(0)  # give the holders the GIL; not a stand-in for a sync
            else:
                raise AssertionError("never served")
            with changed:
                seeking -= 1
                holding += 1
                most = max(most, holding)
                changed.notify_all()
                # Hold until the limit is reached, or nobody else wants a slot.
                assert changed.wait_for(lambda: holding >= limit or seeking == 0, timeout=30)
                holding -= 1
            assert lease.release() == "released"
            mine += 1
        return mine

    with ThreadPoolExecutor(threads) as pool:
        served = sum(pool.map(holder, range(threads)))
    return most, served


def test_threads_never_hold_more_than_the_limit(store: str, namespace: str):
    limiter = sluice.Limiter(store, {"exports": policy("user:3 concurrent", namespace)})
    most, served = served_by_threads(
        lambda: limiter.acquire("exports", {"user": "u"}), limit=3, threads=8, rounds=20
    )
    assert served == 8 * 20
    # The holders waited for the limit, so it was reached; it was never passed.
    assert most == 3


def test_two_limiters_and_asyncio_share_the_slots(redis_url: str, namespace: str):
    """As two processes would: two limiters on one store, each through asyncio."""
    store = redis_url
    rules = {"upstream": policy("5 concurrent", namespace)}
    one, two = sluice.Limiter(store, rules), sluice.Limiter(store, rules)
    holding, most, seeking = 0, 0, 40

    async def holder(limiter: sluice.Limiter) -> None:
        nonlocal holding, most, seeking
        while True:
            lease = await limiter.acquire_async("upstream")
            if lease:
                break
            await asyncio.sleep(0)  # let the holders run; not a stand-in for a sync
        seeking -= 1
        async with lease:
            holding += 1
            most = max(most, holding)
            # Hold until the limit is reached, or nobody else wants a slot.
            while holding < 5 and seeking > 0:
                await asyncio.sleep(0)
            holding -= 1
        assert not lease.held

    async def main() -> None:
        await asyncio.gather(*(holder(l) for l in (one, two) for _ in range(20)))

    asyncio.run(main())
    assert most == 5
    for limiter in (one, two):
        with limiter.acquire("upstream") as lease:
            assert lease and lease.decision.remaining == 4


def test_a_lease_answers_and_releases_once(store: str, namespace: str):
    limiter = sluice.Limiter(store, {"logins": policy("account:2 concurrent lease=30s", namespace)})
    first = limiter.acquire("logins", {"account": "a"})
    second = limiter.acquire("logins", {"account": "a"})
    third = limiter.acquire("logins", {"account": "a"})
    assert first and second and not third
    assert (first.held, third.held) == (True, False)
    assert third.id is None and third.token is None
    assert third.decision.denial == "occupied" and third.decision.retry_after is not None
    assert 29 < third.decision.retry_after <= 30  # until the earliest lease expires
    assert first.decision.remaining == 1 and second.decision.remaining == 0
    left = first.renew()
    assert left is not None and 29 < left <= 30
    assert first.release() == "released"
    assert first.release() == "not_held"
    assert first.renew() is None
    assert third.release() == "not_held"
    # The slot is free at once.
    with limiter.acquire("logins", {"account": "a"}) as again:
        assert again and again.decision.remaining == 0
    assert not again.held


def test_a_with_block_releases_on_an_exception(store: str, namespace: str):
    limiter = sluice.Limiter(store, {"exports": policy("user:1 concurrent", namespace)})
    with pytest.raises(KeyError):
        with limiter.acquire("exports", {"user": "u"}) as lease:
            assert lease
            raise KeyError("work failed")
    assert not lease.held
    assert limiter.acquire("exports", {"user": "u"}).release() == "released"


def test_a_lease_dropped_unreleased_gives_its_slot_back(store: str, namespace: str):
    limiter = sluice.Limiter(store, {"exports": policy("user:1 concurrent", namespace)})
    async def by_awaitable() -> sluice.Lease:
        return await limiter.acquire_async("exports", {"user": "u"})

    for side in ("thread", "awaitable"):
        if side == "thread":
            lease = limiter.acquire("exports", {"user": "u"})
        else:
            lease = asyncio.run(by_awaitable())
        assert lease
        del lease
        gc.collect()
        # On memory at once; on a remote store by a background task: poll the real store.
        for _ in range(500):
            again = limiter.acquire("exports", {"user": "u"})
            if again:
                break
            time.sleep(0.01)  # polling a real server, not standing in for a sync
        assert again, f"the {side}'s dropped lease never gave its slot back"
        assert again.release() == "released"


def test_a_lease_is_released_by_its_token_elsewhere(store: str, namespace: str):
    rules = {"exports": policy("user:1 concurrent", namespace)}
    here = sluice.Limiter(store, rules)
    lease = here.acquire("exports", {"user": "u"})
    elsewhere = here if store == "memory://" else sluice.Limiter(store, rules)
    left = elsewhere.renew("exports", lease.token)
    assert left is not None and 59 < left <= 60
    assert elsewhere.release("exports", lease.token) == "released"
    assert elsewhere.release("exports", lease.token) == "not_held"
    assert here.acquire("exports", {"user": "u"}).release() == "released"
    with pytest.raises(sluice.SluiceError, match="not a lease token"):
        elsewhere.release("exports", "garbage")
    with pytest.raises(sluice.UnknownPolicy):
        elsewhere.release("nope", lease.token)


def test_sync_leases_release_through_asyncio_and_back(store: str, namespace: str):
    """A lease taken by a thread, released by an awaitable (and one taken by an awaitable,
    released by a thread): each goes through the side of the limiter that took it."""
    limiter = sluice.Limiter(store, {"exports": policy("user:1 concurrent", namespace)})
    by_thread = limiter.acquire("exports", {"user": "u"})
    assert by_thread

    async def release_and_take() -> sluice.Lease:
        assert await by_thread.renew_async() is not None
        assert await by_thread.release_async() == "released"
        return await limiter.acquire_async("exports", {"user": "u"})

    by_awaitable = asyncio.run(release_and_take())
    assert by_awaitable
    assert by_awaitable.release() == "released"


def test_async_acquires_are_exact_on_one_key(store: str, namespace: str):
    limiter = sluice.Limiter(store, {"exports": policy("user:4 concurrent", namespace)})

    async def main() -> list[sluice.Lease]:
        return await asyncio.gather(
            *(limiter.acquire_async("exports", {"user": "u"}) for _ in range(30))
        )

    leases = asyncio.run(main())
    assert sum(bool(l) for l in leases) == 4
    assert sorted(l.release() for l in leases).count("released") == 4


def test_a_reservation_charges_the_actual_cost(store: str, namespace: str):
    limiter = sluice.Limiter(store, {"tokens": policy("user:1000/h", namespace)})
    user = {"user": "u"}
    reservation = limiter.reserve("tokens", user, 600)
    assert reservation and reservation.pending and reservation.estimate == 600
    assert not limiter.reserve("tokens", user, 500)  # 400 left on the estimate
    reservation.settle(100)  # 500 refunded
    assert not reservation.pending
    with pytest.raises(sluice.SluiceError, match="nothing to settle"):
        reservation.settle(100)
    assert limiter.check("tokens", user, 900).allowed
    # More than the estimate: the excess is debt, and the next admissions wait for it.
    small = limiter.reserve("tokens", user)
    assert not small  # 1000 of 1000 spent
    assert small.token is None
    with pytest.raises(sluice.SluiceError, match="nothing to settle"):
        small.settle(1)
    limiter.reset("tokens", user)
    big = limiter.reserve("tokens", user, 10)
    big.settle(1_500)
    later = limiter.check("tokens", user)
    assert not later.allowed and later.retry_after > 0


def test_a_reservation_settles_by_token_and_asynchronously(store: str, namespace: str):
    rules = {"tokens": policy("user:1000/h", namespace)}
    here = sluice.Limiter(store, rules)
    elsewhere = here if store == "memory://" else sluice.Limiter(store, rules)
    user = {"user": "u"}

    async def main() -> None:
        first = await here.reserve_async("tokens", user, 800)
        assert first
        elsewhere.settle("tokens", first.token, 200)
        second = await here.reserve_async("tokens", user, 800)
        assert second  # 200 + 800 fit once the first settled at 200
        await second.settle_async(800)

    asyncio.run(main())
    assert not here.check("tokens", user).allowed


def test_leases_and_reservations_refuse_what_they_cannot_do(store: str, namespace: str):
    limiter = sluice.Limiter(
        store,
        {
            "exports": policy("user:1 concurrent", namespace),
            "tokens": policy("user:1000/h", namespace),
        },
    )
    with pytest.raises(sluice.SluiceError, match="take a lease with `acquire`"):
        limiter.check("exports", {"user": "u"})
    with pytest.raises(sluice.SluiceError, match="no concurrency leaf"):
        limiter.acquire("tokens", {"user": "u"})
    with pytest.raises(sluice.SluiceError):
        limiter.reserve("exports", {"user": "u"}, 5)
    with pytest.raises(sluice.MissingSelector):
        limiter.acquire("exports", {})
    with pytest.raises(sluice.UnknownPolicy):
        limiter.acquire("nope", {"user": "u"})
    with pytest.raises(OverflowError):
        limiter.reserve("tokens", {"user": "u"}, -1)
    with pytest.raises(sluice.SluiceError, match="not a reservation token"):
        limiter.settle("tokens", "garbage", 1)
    # Nothing above took a slot or charged a token.
    assert limiter.acquire("exports", {"user": "u"}).release() == "released"
    assert limiter.check("tokens", {"user": "u"}, 1000).allowed


def test_a_with_block_keeps_its_own_exception_when_the_store_is_lost(namespace: str):
    with own_redis_server() as port:
        limiter = sluice.Limiter(
            f"redis://127.0.0.1:{port}?timeout_ms=200",
            {"exports": policy("user:2 concurrent", namespace)},
        )
        failing = limiter.acquire("exports", {"user": "u"})
        quiet = limiter.acquire("exports", {"user": "u"})
        assert failing and quiet
    # The block's own exception goes on; the slot would free itself at the lease time.
    with pytest.raises(KeyError):
        with failing:
            raise KeyError("work failed")
    # A block that ended well hears that its release failed.
    with pytest.raises(sluice.StoreError):
        with quiet:
            pass
