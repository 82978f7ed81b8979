"""Drives one of sluice's batched Lua scripts on a redis-server for lua_instructions.sh.

Usage: lua_drive.py PORT SCENARIO CALLS DIR. Loads the script as the store does (the
redis_now.lua entry, and decimal.lua where the script uses it, before the script's text),
warms up, writes DIR/ready, waits for DIR/go, makes CALLS calls of 16 steps each, and
writes DIR/done. Scenarios:
  rate-1     16 GCRA hits per call on one key (sent as the key once and a count)
  rate-many  16 GCRA hits per call, each on a random one of 1,000,000 keys
  lease-1    8 acquires of new lease ids and 8 releases of the last call's, one set
  lease-many the same, each acquire on a random one of 1,000,000 sets
  lease-floor-1  lease-1's commands only, batched as no script on sorted sets could beat:
             ZCARD, one ZREM of 8, one ZADD of 8 and PEXPIRE a call, nothing decided
             (SLUICE_BENCH_FLOOR_READS=1 adds ZREMRANGEBYSCORE and ZRANGE -1 -1 WITHSCORES)
  lease-hash-floor-1  the same on a hash (field the lease id, value its expiry), the
             layout with the cheapest insert and removal: HLEN, one HDEL of 8, one HSET of 8
             and PEXPIRE a call (SLUICE_BENCH_FLOOR_READS=1 adds an HMGET of the 8 released:
             whether each was held, which every release answers)
  (releases are sent as a `Lease` sends them while far from expiry, kind 0;
  SLUICE_BENCH_RELEASE_KIND=2 sends the release that asks the lease's expiry first)
  cell-1     16 redis-cell CL.THROTTLE commands per call, pipelined, on one key (the
             server must have loaded redis-cell)
  cell-many  the same, each on a random one of 1,000,000 keys
  fixed-1    16 fixed-window hits per call through the lean fixed-window script, one key
             (sent as the key once and a count)
  fixed-many the same, each on a random one of 1,000,000 keys
  full-fixed-1    16 fixed-window decisions per call through the whole decision script, as
                  the store runs every rule but the lean shapes: a Redis Function (FCALL,
                  the library loaded once as src/script.rs assembles it), one decision per
                  FCALL, 16 pipelined; on one key
  full-fixed-many the same, each on a random one of 1,000,000 keys
  full-gcra-many  single-leaf GCRA through the whole script, 1,000,000 keys (what the
                  lean script spares)
  sliding-1  16 sliding-window hits per call (10 sub-windows) through the lean
             sliding-window script, one key (sent as the key once and a count)
  sliding-many the same, each on a random one of 1,000,000 keys
  full-sliding-1, full-sliding-many  the same sliding window through the whole script
  or-shared  16 hits per call of a rule of two GCRA leaves joined by `;` (`user:...;
             ...`), through the lean rule script: each hit a random one of 1,000,000 users'
             keys and one key every hit shares
  full-or-shared  the same rule through the whole script
  and-shared the or-shared rule's two GCRA leaves joined by `and` instead, through the lean
             rule script
  fixed-or-shared, full-fixed-or-shared  the same with two fixed-window leaves (1,000,000,000
             a minute), through the lean rule script and the whole script
  sliding-or-shared, full-sliding-or-shared  the same with two sliding-window leaves (10
             sub-windows)
  login-flood  16 hits per call of one GCRA leaf with a penalty (a login form's, 1 a
             minute, counting denials, boxed 1 s doubling up to 15 min), all on one address
             that is boxed: what a credential-stuffing flood costs, through the lean rule
             script
  full-login-flood  the same through the whole script
  log-1      16 sliding-log hits per call (100,000 a minute) through the lean sliding-log
             script, one key (sent as the key once and a count): every hit admitted, the
             log growing to the tens of thousands of members a busy key holds
  log-many   the same at 100 a minute, each hit on a random one of 1,000,000 keys
  full-log-1, full-log-many  the same sliding log through the whole script
  log-or-shared, full-log-or-shared  16 hits per call of a rule of two sliding-log leaves
             joined by `;`, a user's (100 a minute, a random one of 1,000,000 users) and one
             every hit shares (100,000 a minute), through the lean rule script and the
             whole script
"""

import os
import random
import sys

import redis

port, scenario, calls, where = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
lua = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src", "lua")
client = redis.Redis(port=port)
random.seed(1)


def load(name, parts=("redis_now.lua", "decimal.lua")):
    text = ""
    for part in [*parts, name]:
        with open(os.path.join(lua, part)) as f:
            text += f.read()
    return client.script_load(text)


# The sliding log's limit, window, interval, burst and sub-windows (the whole script's six
# numbers after the algorithm): 100,000 a minute on one key, 100 on many.
LOG = [100_000 if scenario.endswith("-1") else 100, 60_000_000, 600, 100_000, 1]


def key(many, prefix):
    return f"{prefix}:{random.randrange(1_000_000)}" if many else prefix


if scenario.startswith("cell"):
    many = scenario == "cell-many"
    # A burst and rate so large that every command is admitted and written, as in `rate`.
    pipe = client.pipeline(transaction=False)

    def call():
        for _ in range(16):
            pipe.execute_command("CL.THROTTLE", key(many, "bench:cell"), 1_000_000, 1_000_000, 1)
        return pipe.execute()

elif scenario.startswith("full"):
    # The library as src/script.rs's LIBRARY assembles it, with the decision entry alone.
    body = ""
    for part in ["algorithms.lua", "lease_string.lua", "leases.lua", "reservations.lua"]:
        with open(os.path.join(lua, part)) as f:
            body += f.read()
    with open(os.path.join(lua, "decide.lua")) as f:
        entry = f.read()
    client.function_load(
        "#!lua name=sluice_bench\nlocal KEYS, ARGV\n" + body
        + "\nredis.register_function('sluice_bench_decide', function(keys, args)\n"
        + "KEYS, ARGV = keys, args\n" + entry + "\nend)\n",
        replace=True,
    )
    many = scenario.endswith("-many")
    pipe = client.pipeline(transaction=False)
    token = [0]
    # As src/script.rs's `arguments` sends a rule: cost 1, recording admitted, the shape
    # ("l0 ", or "o2 l0 l1 " for two leaves joined by `;`), a token, the number of leaves
    # and six numbers each (algorithm: 1 GCRA, 2 sliding window, 4 fixed window; limit;
    # window; interval; burst; sub-windows), counted in microseconds; every decision
    # admitted and written.
    gcra = [1, 1_000_000_000, 60_000_000, 1, 1_000_000_000, 1]
    fixed = [4, 1_000_000_000, 60_000_000, 1, 1_000_000_000, 1]
    sliding = [2, 1_000_000_000, 60_000_000, 1, 1_000_000_000, 10]
    if scenario == "full-login-flood":
        # One leaf of 1 a minute, recording always, then the penalty (base, factor, max,
        # forget_after); the address's key and its penalty record's.
        def names():
            return [2, "bench:login", "bench:login:penalty", 1, 1, "l0 "]

        quotas = [1, 1, 1, 60_000_000, 60_000_000, 1, 1, 1_000_000, 2, 900_000_000,
                  3_600_000_000]
    elif scenario in ("full-or-shared", "full-fixed-or-shared", "full-sliding-or-shared",
                      "full-log-or-shared"):
        # The user's leaf, then the one every hit shares.
        def names():
            return [2, key(True, "bench:or"), "bench:or:shared", 1, 0, "o2 l0 l1 "]

        if scenario == "full-or-shared":
            quotas = [2, *gcra, *gcra]
        elif scenario == "full-log-or-shared":
            quotas = [2, 3, 100, *LOG[1:], 3, 100_000, *LOG[1:]]
        elif scenario == "full-sliding-or-shared":
            quotas = [2, *sliding, *sliding]
        else:
            quotas = [2, *fixed, *fixed]
    else:
        def names():
            return [1, key(many, "bench:full"), 1, 0, "l0 "]

        if "gcra" in scenario:
            quotas = [1, *gcra]
        elif "log" in scenario:
            quotas = [1, 3, *LOG]
        elif "sliding" in scenario:
            quotas = [1, 2, 1_000_000_000, 60_000_000, 1, 1_000_000_000, 10]
        else:
            quotas = [1, 4, 1_000_000_000, 60_000_000, 1, 1_000_000_000, 1]

    def call():
        for _ in range(16):
            token[0] += 1
            pipe.execute_command(
                "FCALL", "sluice_bench_decide", *names(), format(token[0], "x"), *quotas,
            )
        return pipe.execute()

elif scenario == "login-flood":
    sha = load("rule_batch.lua")
    # Cost 1, recording always, one GCRA leaf (kind 1) of 1 a minute (interval 60 s, burst
    # 1, window 60 s), no tree (0), then the penalty: base 1 s, factor 2, max 15 min,
    # forget after an hour.
    params = [1, 1, 1, 1, 1, 60_000_000, 1, 60_000_000, 0, 1, 1_000_000, 2, 900_000_000,
              3_600_000_000]

    token = [0]

    def call():
        keys = ["bench:login", "bench:login:penalty"] * 16
        token[0] += 1
        return client.evalsha(sha, 32, *keys, *params, token[0])

elif scenario in ("or-shared", "fixed-or-shared", "and-shared", "sliding-or-shared",
                  "log-or-shared"):
    sha = load("rule_batch.lua")
    # One parameter set (no per-hit set numbers): cost 1, recorded when admitted, two
    # leaves so large that every hit is admitted and written (GCRA, kind 1: 1 µs interval,
    # burst and window 1,000,000; fixed window, kind 4: 1,000,000,000 a minute); each hit
    # names a random user's key, then the shared key.
    if scenario == "fixed-or-shared":
        leaf = [4, 1_000_000_000, 60_000_000, 0]
    elif scenario == "sliding-or-shared":
        # Kind 2: 1,000,000,000 a minute in 10 sub-windows of 6 s.
        leaf = [2, 1_000_000_000, 6_000_000, 10]
    else:
        leaf = [1, 1, 1_000_000, 1_000_000]
    leaves = [*leaf, *leaf]
    if scenario == "log-or-shared":
        # Kind 3: the user's log 100 a minute, the shared one 100,000.
        leaves = [3, 100, 60_000_000, 0, 3, 100_000, 60_000_000, 0]
    # No tree (0: an `or` of every leaf), or for `and-shared` the tree and(leaf 1, leaf 2)
    # (3 numbers: 202, 1, 2); no penalty (0).
    tree = [3, 202, 1, 2] if scenario == "and-shared" else [0]
    params = [1, 1, 0, 2, *leaves, *tree, 0]
    token = [0]

    def call():
        keys = []
        for _ in range(16):
            keys += [key(True, "bench:or"), "bench:or:shared"]
        # Last, the call's token (a counter, as the store's).
        token[0] += 1
        return client.evalsha(sha, 32, *keys, *params, token[0])

elif scenario.startswith("fixed"):
    sha = load("fixed_batch.lua", ("redis_now.lua",))
    many = scenario in ("fixed-many", "fixed-many-general")
    # One parameter set (no per-hit set numbers): cost 1, recorded when admitted, a limit
    # and a window (60 s) so large that every hit is admitted and written.
    params = [1, 1, 0, 1_000_000_000, 60_000_000]

    def call():
        if not many:
            # The hits of one key and one set go as the key once and their number.
            return client.evalsha(sha, 1, "bench:fixed", *params, 16)
        keys = [key(many, "bench:fixed") for _ in range(16)]
        if scenario == "fixed-many" and len(set(keys)) == 16:
            # Distinct keys of one set, as the store sends them (src/lean.rs).
            return client.evalsha(sha, 16, *keys, 0, *params[1:])
        return client.evalsha(sha, 16, *keys, *params)

elif scenario.startswith("sliding"):
    sha = load("sliding_batch.lua", ("redis_now.lua",))
    many = scenario in ("sliding-many", "sliding-many-general")
    # One parameter set: cost 1, recorded when admitted, a limit so large that every hit
    # is admitted and written, 10 sub-windows of 6 s (a 60 s window).
    params = [1, 1, 0, 1_000_000_000, 6_000_000, 10]

    def call():
        if not many:
            return client.evalsha(sha, 1, "bench:sliding", *params, 16)
        keys = [key(many, "bench:sliding") for _ in range(16)]
        if scenario == "sliding-many" and len(set(keys)) == 16:
            # Distinct keys of one set, as the store sends them (src/lean.rs).
            return client.evalsha(sha, 16, *keys, 0, *params[1:])
        return client.evalsha(sha, 16, *keys, *params)

elif scenario.startswith("log"):
    sha = load("log_batch.lua", ("redis_now.lua",))
    many = scenario in ("log-many", "log-many-general")
    # One parameter set: cost 1, recorded when admitted, the limit, a 60 s window; last, the
    # call's token (a counter, as the store's).
    params = [1, 1, 0, LOG[0], 60_000_000]
    token = [0]

    def call():
        token[0] += 1
        if not many:
            return client.evalsha(sha, 1, "bench:log", *params, 16, token[0])
        keys = [key(many, "bench:log") for _ in range(16)]
        if scenario == "log-many" and len(set(keys)) == 16:
            # Distinct keys of one set, as the store sends them (src/lean.rs).
            return client.evalsha(sha, 16, *keys, 0, *params[1:], token[0])
        return client.evalsha(sha, 16, *keys, *params, token[0])

elif scenario == "floor-many":
    # What a batched GCRA hit cannot do without on 1,000,000 keys: each key's share of one
    # MGET and its PSETEX (a SET with an expiry), nothing decided, the same value for every key.
    sha = client.script_load(
        "redis.call('MGET', unpack(KEYS))\n"
        "for i = 1, #KEYS do redis.call('PSETEX', KEYS[i], '1', '1700000000000001') end\n"
        "return 0"
    )

    def call():
        keys = [key(True, "bench:rate") for _ in range(16)]
        return client.evalsha(sha, 16, *keys)

elif scenario in ("lease-floor-1", "lease-hash-floor-1"):
    # What lease-1's 8 acquires and 8 releases on one set cannot do without, in the fewest
    # commands: the set's size, one removal of the last call's 8 leases, one insert of 8 new
    # ones (one expiry for all) and the key's expiry; nothing decided, nothing answered per
    # lease. The floor of any script on the layout, however it batches.
    # On a sorted set (lease-floor-1), SLUICE_BENCH_FLOOR_READS=1 adds the two reads a
    # decision needs besides the size: the drop of expired leases and the latest expiry.
    # On a hash (lease-hash-floor-1: no order to keep, so the cheapest insert and removal a
    # set of leases can have in Redis, and no way to find the expired leases but reading
    # them all, left out), it adds the read that tells each release whether its lease was
    # held, which a batched HDEL does not answer.
    reads = os.environ.get("SLUICE_BENCH_FLOOR_READS", "0") == "1"
    expiry = "'1700000060000000'"
    if scenario == "lease-floor-1":
        size, remove, insert, pair = "ZCARD", "ZREM", "ZADD", (expiry, "ARGV[i]")
        read = (
            "redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '1700000000000000')\n"
            "redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')\n"
        )
    else:
        size, remove, insert, pair = "HLEN", "HDEL", "HSET", ("ARGV[i]", expiry)
        read = "redis.call('HMGET', KEYS[1], unpack(ARGV, 1, 8))\n"
    sha = client.script_load(
        f"redis.call('{size}', KEYS[1])\n"
        + (read if reads else "")
        + f"redis.call('{remove}', KEYS[1], unpack(ARGV, 1, 8))\n"
        "local adds = {}\n"
        f"for i = 9, 16 do adds[#adds + 1] = {pair[0]}; adds[#adds + 1] = {pair[1]} end\n"
        f"redis.call('{insert}', KEYS[1], unpack(adds))\n"
        "redis.call('PEXPIRE', KEYS[1], '60000')\n"
        "return 0"
    )
    held = [str(i) for i in range(1, 9)]
    next_id = [9]

    def call():
        taken = [str(next_id[0] + i) for i in range(8)]
        next_id[0] += 8
        answer = client.evalsha(sha, 1, "bench:lease", *held, *taken)
        held[:] = taken
        return answer

elif scenario.startswith("rate"):
    sha = load("gcra_batch.lua")
    many = scenario in ("rate-many", "rate-many-general")
    # One parameter set (so no per-hit set numbers, as the store sends it): cost 1, recorded
    # when admitted, 1 µs interval, a burst and window so large that every hit is admitted
    # and written.
    params = [1, 1, 0, 1, 1_000_000, 1_000_000]

    def call():
        if not many:
            # The hits of one key and one set go as the key once and their number.
            return client.evalsha(sha, 1, "bench:rate", *params, 16)
        keys = [key(many, "bench:rate") for _ in range(16)]
        if scenario == "rate-many" and len(set(keys)) == 16:
            # Distinct keys of one set, as the store sends them (src/lean.rs,
            # distinct_batch_call): 0 sets, then the set. rate-many-general sends the same
            # hits through the script's general loop, as every batch went before.
            return client.evalsha(sha, 16, *keys, 0, *params[1:])
        return client.evalsha(sha, 16, *keys, *params)

else:
    sha = load("lease_batch.lua", ("redis_now.lua", "decimal.lua", "lease_string.lua"))
    many = scenario == "lease-many"
    held, next_id = [], [1]

    def call():
        # One quota set: 64 slots, leases of 60 s in microseconds, packed as the store packs
        # them (src/lease_batch.rs): each set's key once, then the steps, each its kind,
        # quota set, key's place in KEYS, the id's length, then the id. An acquire is kind 1 of set 1; a release kind
        # 0, the release of a lease its holder knows unexpired, as a `Lease` held for less
        # than its lease time sends it (kind 2 asks the lease's expiry first), set 0. As the
        # store does, an acquire or release alone on its key is kind 4, 5 or 6, its id
        # followed by ':' for 5 and 6 (most of lease-many's; SLUICE_BENCH_ACQUIRE_ONCE=0
        # sends kinds 1, 0 and 2, the script's loop on sorted sets).
        packed, taken = [], []
        release_kind = int(os.environ.get("SLUICE_BENCH_RELEASE_KIND", "0"))
        once = os.environ.get("SLUICE_BENCH_ACQUIRE_ONCE", "1") != "0"
        for i in range(8):
            set_key, lease = key(many, "bench:lease"), next_id[0]
            next_id[0] += 1
            packed.append((1, 1, set_key, str(lease).encode()))
            taken.append((set_key, lease))
            if held:
                packed.append((release_kind, 0, held[i][0], str(held[i][1]).encode()))
        held[:] = taken
        named = {}
        for _, _, k, _ in packed:
            named[k] = named.get(k, 0) + 1
        alone = {k for k in named if once and named[k] == 1}
        keys = list(named)
        places = {k: i + 1 for i, k in enumerate(keys)}

        def pack(kind, s, k, d):
            if k in alone:
                kind = {1: 4, 0: 5, 2: 6}[kind]
            if kind in (5, 6):
                d += b":"
            return bytes([kind, s, places[k], len(d)]) + d

        steps = b"".join(pack(*step) for step in packed)
        return client.evalsha(sha, len(keys), *keys, 1, 64, 60_000_000, steps)


for _ in range(50):
    call()
open(os.path.join(where, "ready"), "w").close()
while not os.path.exists(os.path.join(where, "go")):
    pass
for _ in range(calls):
    call()
open(os.path.join(where, "done"), "w").close()
