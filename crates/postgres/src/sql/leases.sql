-- sluice: concurrency leases and reservations (after algorithms.sql and decide.sql).
--
-- A line-for-line translation of sluice-core's algorithm/concurrency.rs and settle.rs, and of
-- the memory store's steps around them (sluice-limiter's memory/leases.rs), checked against
-- crates/core/tests/concurrency_vectors.json and against the core's `Quota::settle`.
--
-- A concurrency leaf's row in __S__.counters holds its leases in v, as
--   concurrency     {id_1, expires_1, id_2, expires_2, ...}   in the order taken
-- (a lease id is the u64's bits as a bigint), and expires_at is the latest expiry, so the
-- cleaner deletes the row once every lease in it has expired. An expired lease lingers until
-- a step drops it (an acquire; a release or renew over several leaves drops a set whose
-- leases have all expired, as the memory store does) or the cleaner deletes the row: a
-- release meanwhile says "expired", as the core does. A concurrency quota is
-- q = {5, limit, lease time, interval, burst, windows}; the other algorithms' are as
-- algorithms.sql documents.

-- Concurrency -------------------------------------------------------------------------------

-- v as written, or no leases when it is not (id, expires_at) pairs.
CREATE OR REPLACE FUNCTION __S__.lease_fit(v bigint[])
RETURNS bigint[] LANGUAGE sql IMMUTABLE AS $$
  SELECT CASE WHEN coalesce(cardinality(v), 0) % 2 = 0 THEN coalesce(v, '{}') ELSE '{}' END
$$;

-- The leases not expired at `now`, in the order taken (Leases::drop_expired).
CREATE OR REPLACE FUNCTION __S__.lease_drop(v bigint[], now bigint)
RETURNS bigint[] LANGUAGE sql IMMUTABLE AS $$
  SELECT coalesce(array_agg(x ORDER BY k, j), '{}')
  FROM generate_series(1, coalesce(cardinality(v), 0) / 2) k,
       LATERAL (VALUES (1, v[2 * k - 1]), (2, v[2 * k])) p(j, x)
  WHERE v[2 * k] > now
$$;

-- When every lease has expired, 0 when none is held (Leases::expires_at).
CREATE OR REPLACE FUNCTION __S__.lease_expires(v bigint[])
RETURNS bigint LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  last bigint := 0;
BEGIN
  FOR k IN 1 .. coalesce(cardinality(v), 0) / 2 LOOP
    IF v[2 * k] > last THEN last := v[2 * k]; END IF;
  END LOOP;
  RETURN last;
END $$;

-- The pair number of lease `id` if it is held at `now` (not expired), else NULL.
CREATE OR REPLACE FUNCTION __S__.lease_find(v bigint[], id bigint, now bigint)
RETURNS int LANGUAGE sql IMMUTABLE AS $$
  SELECT k FROM generate_series(1, coalesce(cardinality(v), 0) / 2) k
  WHERE v[2 * k - 1] = id AND v[2 * k] > now ORDER BY k LIMIT 1
$$;

-- concurrency::verdict: a verdict as algorithms.sql's (remaining = free slots, reset = until
-- every lease has expired, retry = until enough of the held leases expire).
CREATE OR REPLACE FUNCTION __S__.lease_verdict(q bigint[], v bigint[], now bigint, cost bigint)
RETURNS bigint[] LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  held bigint;
  last bigint;
  at bigint;
BEGIN
  SELECT count(*) FILTER (WHERE v[2 * k] > now), greatest(coalesce(max(v[2 * k]), 0) - now, 0)
    INTO held, last FROM generate_series(1, coalesce(cardinality(v), 0) / 2) k;
  IF cost <= q[2] - held THEN
    RETURN ARRAY[1, q[2], q[2] - held - cost,
                 CASE WHEN cost > 0 THEN greatest(last, q[3]) ELSE last END, -1];
  END IF;
  IF cost > q[2] THEN
    RETURN ARRAY[0, q[2], greatest(q[2] - held, 0), last, -2];
  END IF;
  -- `cost` slots are free once the `held + cost - limit` earliest leases have expired.
  SELECT e INTO at FROM (SELECT v[2 * k] AS e FROM generate_series(1, cardinality(v) / 2) k
                         WHERE v[2 * k] > now) s
    ORDER BY e OFFSET held + cost - q[2] - 1 LIMIT 1;
  RETURN ARRAY[0, q[2], greatest(q[2] - held, 0), last, coalesce(at - now, 0)];
END $$;

-- The verdict of any leaf: concurrency here, the rate algorithms in algorithms.sql.
CREATE OR REPLACE FUNCTION __S__.leaf_verdict(q bigint[], v bigint[], now bigint, cost bigint)
RETURNS bigint[] LANGUAGE sql IMMUTABLE AS $$
  SELECT CASE WHEN q[1] = 5 THEN __S__.lease_verdict(q, v, now, cost)
              ELSE __S__.verdict(q, v, now, cost) END
$$;

-- concurrency::hold: lease `id` renewed if held, else added, one lease time past `now`.
CREATE OR REPLACE FUNCTION __S__.lease_hold(q bigint[], v bigint[], now bigint, id bigint)
RETURNS bigint[] LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  k int := __S__.lease_find(v, id, now);
BEGIN
  IF k IS NULL THEN
    RETURN v || ARRAY[id, now + q[3]];
  END IF;
  v[2 * k] := greatest(now + q[3], v[2 * k]);
  RETURN v;
END $$;

-- Writes a concurrency leaf's leases back. An emptied set stays, expired (as the memory
-- store keeps it), so the next acquire updates the row instead of inserting it again; the
-- cleaner deletes it if none comes.
CREATE OR REPLACE FUNCTION __S__.lease_store(id_ text, leases bigint[])
RETURNS void LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  UPDATE __S__.counters SET v = leases, expires_at = __S__.lease_expires(leases)
    WHERE id = id_;
END $$;

-- Locks (creating them if missing) the rows of `ids` in the order of their identifiers, as
-- `decide` does, so no two steps sharing rows deadlock.
CREATE OR REPLACE FUNCTION __S__.lock_rows(ids text[])
RETURNS void LANGUAGE sql VOLATILE AS $$
  INSERT INTO __S__.counters AS c (id, v, expires_at)
    SELECT x, '{}', 0 FROM (SELECT DISTINCT x FROM unnest(ids) x WHERE x IS NOT NULL) u
    ORDER BY x
  ON CONFLICT (id) DO UPDATE SET expires_at = c.expires_at WHERE false
$$;

-- A rule of one concurrency leaf, no penalty (MemoryStore::acquire_one): concurrency::acquire
-- on the row, one lease of cost 1; taking a lease already held renews it. Returns what
-- `decide` returns. The common acquire: one pass over the set, no query but the row's.
CREATE OR REPLACE FUNCTION __S__.acquire_one(id_ text, q bigint[], lease bigint,
                                             at bigint DEFAULT NULL)
RETURNS bigint[] LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  st bigint[];
  kept bigint[] := '{}';
  now bigint;
  held bigint := 0;
  last bigint := 0;
  mine bigint;
  cost bigint := 1;
  d bigint[];
BEGIN
  SELECT c.v INTO st FROM __S__.counters c WHERE c.id = id_ FOR UPDATE;
  IF NOT FOUND THEN
    PERFORM __S__.lock_rows(ARRAY[id_]);
    SELECT c.v INTO st FROM __S__.counters c WHERE c.id = id_;
  END IF;
  now := coalesce(at, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint);
  st := __S__.lease_fit(st);
  -- Drop the expired leases; find this one.
  FOR k IN 1 .. cardinality(st) / 2 LOOP
    IF st[2 * k] > now THEN
      kept := kept || ARRAY[st[2 * k - 1], st[2 * k]];
      held := held + 1;
      last := greatest(last, st[2 * k]);
      IF mine IS NULL AND st[2 * k - 1] = lease THEN mine := held; END IF;
    END IF;
  END LOOP;
  IF mine IS NOT NULL THEN
    -- Held already: renewed, and answered as a look that takes nothing.
    kept[2 * mine] := greatest(now + q[3], kept[2 * mine]);
    last := greatest(last, kept[2 * mine]);
    cost := 0;
  END IF;
  IF cost <= q[2] - held THEN
    d := ARRAY[1, q[2], q[2] - held - cost,
               CASE WHEN cost > 0 THEN greatest(last - now, q[3]) ELSE greatest(last - now, 0) END,
               -1, 0, 0];
    IF cost > 0 THEN kept := kept || ARRAY[lease, now + q[3]]; END IF;
  ELSE
    d := __S__.leaf_decision(__S__.lease_verdict(q, kept, now, cost));
  END IF;
  IF kept IS DISTINCT FROM st THEN PERFORM __S__.lease_store(id_, kept); END IF;
  RETURN d;
END $$;

-- Decides a hit as `decide` does and, when it is admitted, takes lease `lease` in every
-- concurrency leaf (algorithm 5) of the rule, in one step under the rows' locks
-- (MemoryStore::acquire_now). Arguments as `decide`'s, plus the lease id; returns what
-- `decide` returns (the caller turns a concurrency leaf's "limited" into "occupied").
CREATE OR REPLACE FUNCTION __S__.acquire(ids text[], penalty_id text, params bigint[],
                                         shape text, lease bigint, at bigint DEFAULT NULL)
RETURNS bigint[] LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  cost bigint := params[1];
  recording bigint := params[2];
  count int := params[3];
  tokens text[] := regexp_split_to_array(btrim(shape), '\s+');
  now bigint;
  q bigint[];
  loaded text[] := '{}';
  row_v bigint[];
  r record;
  vs bigint[] := '{}';
  d bigint[];
  after bigint[];
  pen bigint[];
  p_at int := 4 + count * 6;
  p_row bigint[];
  wait bigint;
  timeout bigint;
  expires bigint;
BEGIN
  IF penalty_id IS NULL AND count = 1 AND params[4] = 5 THEN
    RETURN __S__.acquire_one(ids[1], params[4:9], lease, at);
  END IF;
  PERFORM __S__.lock_rows(ids || penalty_id);
  now := coalesce(at, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint);

  FOR r IN SELECT c.id, c.v, c.expires_at FROM __S__.counters c
           WHERE c.id = ANY(ids || penalty_id) LOOP
    row_v := CASE WHEN r.expires_at > now THEN r.v ELSE '{}' END;
    FOR i IN 1 .. count LOOP
      IF ids[i] = r.id THEN loaded[i] := row_v::text; END IF;
    END LOOP;
    IF r.id = penalty_id THEN p_row := row_v; END IF;
  END LOOP;
  -- Concurrency leaves drop their expired leases first.
  FOR i IN 1 .. count LOOP
    IF params[4 + (i - 1) * 6] = 5 THEN
      loaded[i] := __S__.lease_drop(__S__.lease_fit(coalesce(loaded[i], '{}')::bigint[]),
                                    now)::text;
    END IF;
  END LOOP;

  IF penalty_id IS NOT NULL THEN
    pen := params[p_at:p_at + 3];
    IF p_row IS NULL OR cardinality(p_row) <> 3 THEN p_row := ARRAY[0, 0, 0]; END IF;
    IF p_row[2] > now THEN
      wait := p_row[2] - now;
      d := __S__.leaf_verdict(params[4:9], coalesce(loaded[1], '{}')::bigint[], now, 0);
      -- The expired leases dropped above stay dropped, as in the memory store.
      FOR i IN 1 .. count LOOP
        IF params[4 + (i - 1) * 6] = 5 THEN
          PERFORM __S__.lease_store(ids[i], coalesce(loaded[i], '{}')::bigint[]);
        END IF;
      END LOOP;
      RETURN ARRAY[0, d[2], 0, greatest(d[4], wait), wait, 3, 0];
    END IF;
  END IF;

  FOR i IN 1 .. count LOOP
    q := params[4 + (i - 1) * 6 : 3 + i * 6];
    vs := vs || __S__.leaf_verdict(q, coalesce(loaded[i], '{}')::bigint[], now, cost);
  END LOOP;
  d := __S__.tree(tokens, vs);

  IF (recording = 0 AND d[1] = 1) OR (recording = 1 AND d[6] <> 2) THEN
    vs := '{}';
    FOR i IN 1 .. count LOOP
      q := params[4 + (i - 1) * 6 : 3 + i * 6];
      row_v := coalesce(loaded[i], '{}')::bigint[];
      IF q[1] <> 5 THEN
        -- (A concurrency leaf's record only drops expired leases: done above.)
        row_v := __S__.record(q, row_v, now, cost);
        loaded[i] := row_v::text;
        expires := __S__.expires(q, row_v);
        IF expires <= now THEN
          DELETE FROM __S__.counters WHERE id = ids[i];
        ELSE
          UPDATE __S__.counters SET v = row_v, expires_at = expires WHERE id = ids[i];
        END IF;
      END IF;
      vs := vs || __S__.leaf_verdict(q, row_v, now, cost);
    END LOOP;
    IF d[1] = 0 THEN
      after := __S__.tree(tokens, vs);
      IF after[1] = 0 THEN d := after; END IF;
    END IF;
  END IF;

  IF penalty_id IS NOT NULL AND d[6] = 1 AND recording <> 2 THEN
    IF p_row[1] > 0 AND now - p_row[3] >= pen[4] THEN p_row[1] := 0; END IF;
    p_row[1] := p_row[1] + 1;
    timeout := least(pen[1] * power(pen[2]::numeric, least(p_row[1] - 1, 64)), pen[3]);
    p_row[2] := now + timeout;
    p_row[3] := now;
    IF d[5] < 0 OR d[5] < timeout THEN
      d[5] := timeout;
      d[4] := greatest(d[4], timeout);
      d[6] := 3;
    END IF;
    UPDATE __S__.counters SET v = p_row, expires_at = greatest(p_row[2], p_row[3] + pen[4])
      WHERE id = penalty_id;
  END IF;

  -- An admitted hit holds its lease in every concurrency leaf, even one an `and` let past
  -- its count (concurrency::hold).
  FOR i IN 1 .. count LOOP
    q := params[4 + (i - 1) * 6 : 3 + i * 6];
    IF q[1] = 5 THEN
      row_v := coalesce(loaded[i], '{}')::bigint[];
      IF d[1] = 1 THEN row_v := __S__.lease_hold(q, row_v, now, lease); END IF;
      PERFORM __S__.lease_store(ids[i], row_v);
    END IF;
  END LOOP;
  RETURN d;
END $$;

-- Writes back a lease set after a step on several rows, as the memory store's locked step
-- does: the row goes once every lease in it has expired (its expired leases with it).
CREATE OR REPLACE FUNCTION __S__.lease_put(id_ text, leases bigint[], now bigint)
RETURNS void LANGUAGE plpgsql VOLATILE AS $$
BEGIN
  IF __S__.lease_expires(leases) <= now THEN
    DELETE FROM __S__.counters WHERE id = id_;
  ELSE
    PERFORM __S__.lease_store(id_, leases);
  END IF;
END $$;

-- Releases lease `lease` in each row of `ids` (MemoryStore::release_now): 1 if any held it,
-- 2 if it had expired there (and none held it), 0 if none knew it. Releasing twice changes
-- nothing. Rows are locked in the order of their identifiers before the clock is read. On
-- one row the other leases stay as they are, expired ones too, until an acquire drops them
-- or the cleaner deletes the row (a release of one of them meanwhile says "expired"); rows
-- of several leaves are written back as `lease_put` does (the memory store's locked step).
CREATE OR REPLACE FUNCTION __S__.release(ids text[], lease bigint, at bigint DEFAULT NULL)
RETURNS int LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  now bigint;
  r record;
  st bigint[];
  k int;
  found int := 0;
BEGIN
  PERFORM 1 FROM __S__.counters c WHERE c.id = ANY(ids) ORDER BY c.id FOR UPDATE;
  now := coalesce(at, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint);
  FOR r IN SELECT c.id, c.v FROM __S__.counters c WHERE c.id = ANY(ids) LOOP
    st := __S__.lease_fit(r.v);
    k := NULL;
    FOR m IN 1 .. cardinality(st) / 2 LOOP
      IF st[2 * m - 1] = lease THEN k := m; EXIT; END IF;
    END LOOP;
    IF k IS NOT NULL THEN
      IF st[2 * k] > now THEN
        found := 1;
      ELSIF found = 0 THEN
        found := 2;
      END IF;
      st := st[1 : 2 * k - 2] || st[2 * k + 1 :];
    END IF;
    IF cardinality(ids) > 1 AND (k IS NOT NULL OR __S__.lease_expires(st) <= now) THEN
      PERFORM __S__.lease_put(r.id, st, now);
    ELSIF k IS NOT NULL THEN
      PERFORM __S__.lease_store(r.id, st);
    END IF;
  END LOOP;
  RETURN found;
END $$;

-- Renews lease `lease` in each row of `ids` that holds it, to one lease time past now
-- (`lease_times`, one per identifier): the shortest time it then has left, NULL if no row
-- holds it any more (an expired lease cannot come back). Rows are written back as
-- `release` writes them.
CREATE OR REPLACE FUNCTION __S__.renew(ids text[], lease_times bigint[], lease bigint,
                                       at bigint DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  now bigint;
  st bigint[];
  k int;
  left_ bigint;
BEGIN
  PERFORM 1 FROM __S__.counters c WHERE c.id = ANY(ids) ORDER BY c.id FOR UPDATE;
  now := coalesce(at, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint);
  FOR i IN 1 .. cardinality(ids) LOOP
    SELECT c.v INTO st FROM __S__.counters c WHERE c.id = ids[i];
    CONTINUE WHEN NOT FOUND;
    st := __S__.lease_fit(st);
    k := __S__.lease_find(st, lease, now);
    IF k IS NOT NULL THEN
      st[2 * k] := greatest(now + lease_times[i], st[2 * k]);
      left_ := least(coalesce(left_, st[2 * k] - now), st[2 * k] - now);
    END IF;
    IF cardinality(ids) > 1 AND (k IS NOT NULL OR __S__.lease_expires(st) <= now) THEN
      PERFORM __S__.lease_put(ids[i], st, now);
    ELSIF k IS NOT NULL THEN
      PERFORM __S__.lease_store(ids[i], st);
    END IF;
  END LOOP;
  RETURN left_;
END $$;

-- Reservations ----------------------------------------------------------------------------

-- `decide`, with the time it decided at: {the 7 numbers of `decide`, now}. The rows are
-- locked (in identifier order) before the clock is read, as `decide` does, then `decide`
-- runs at that time.
CREATE OR REPLACE FUNCTION __S__.reserve(ids text[], penalty_id text, params bigint[],
                                         shape text, at bigint DEFAULT NULL)
RETURNS bigint[] LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  now bigint;
BEGIN
  PERFORM __S__.lock_rows(ids || penalty_id);
  now := coalesce(at, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint);
  RETURN __S__.decide(ids, penalty_id, params, shape, now) || now;
END $$;

-- Quota::settle: the state after charging a reservation of `reserved` taken at `taken_at`
-- its `actual` cost at `now`, or NULL when nothing changes. Sums past a bigint stop at its
-- largest value (the core's stop at u64's: both mean "never again").
CREATE OR REPLACE FUNCTION __S__.settle_state(q bigint[], v bigint[], now bigint,
                                              taken_at bigint, reserved bigint, actual bigint)
RETURNS bigint[] LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  refund numeric := greatest(reserved::numeric - actual, 0);
  debt numeric := greatest(actual::numeric - reserved, 0);
  top numeric := 9223372036854775807;
  tat bigint;
  taken bigint;
  g bigint;
  sub bigint;
  number bigint;
  slot int;
  k int;
  c numeric;
BEGIN
  IF actual = reserved THEN RETURN NULL; END IF;
  IF q[1] = 1 THEN
    tat := coalesce(v[1], 0);
    IF refund > 0 THEN
      v := ARRAY[greatest(tat - refund * q[4], 0)::bigint];
    ELSE
      v := ARRAY[least(greatest(tat, now) + debt * q[4], top)::bigint];
    END IF;
    RETURN CASE WHEN v[1] <> tat THEN v END;
  ELSIF q[1] = 4 THEN
    -- The window the reservation was taken in, while it is still the one counted.
    taken := taken_at / q[3];
    IF coalesce(v[1], 0) <> taken OR now / q[3] <> taken THEN RETURN NULL; END IF;
    RETURN ARRAY[taken, least(greatest(coalesce(v[2], 0) - refund, 0) + debt, top)::bigint];
  ELSIF q[1] = 2 THEN
    g := q[6];
    sub := (q[3] + g - 1) / g;
    IF coalesce(cardinality(v), 0) = 0 THEN
      v := array_fill(0::bigint, ARRAY[g::int + 1]);
    ELSIF cardinality(v) <> g + 1 THEN
      RETURN NULL;
    END IF;
    -- The sub-window the reservation was taken in, while it is still counted.
    number := taken_at / sub;
    IF number + g <= now / sub OR number > v[1] OR number + g <= v[1] THEN RETURN NULL; END IF;
    slot := 2 + number % g;
    v[slot] := least(greatest(v[slot] - refund, 0) + debt, top)::bigint;
    RETURN v;
  ELSIF q[1] = 3 THEN
    -- The log's entry at `taken_at`, while it is in the window; refunded to nothing, it goes.
    IF coalesce(cardinality(v), 0) % 2 <> 0 OR taken_at + q[3] <= now THEN RETURN NULL; END IF;
    SELECT n INTO k FROM generate_series(1, coalesce(cardinality(v), 0) / 2) n
      WHERE v[2 * n - 1] = taken_at ORDER BY n LIMIT 1;
    IF k IS NULL THEN RETURN NULL; END IF;
    c := least(greatest(v[2 * k] - refund, 0) + debt, top);
    IF c = 0 THEN
      RETURN v[1 : 2 * k - 2] || v[2 * k + 1 :];
    END IF;
    v[2 * k] := c::bigint;
    RETURN v;
  END IF;
  -- Concurrency: a reservation holds no lease.
  RETURN NULL;
END $$;

-- Charges a reservation its actual cost in every leaf (MemoryStore::settle_now), never
-- refused. params: {leaf count, then six numbers per leaf as `decide`'s}; taken_at: the time
-- `reserve` answered. Rows are created if missing (a debt is charged to a fresh state) and
-- locked in identifier order before the clock is read.
CREATE OR REPLACE FUNCTION __S__.settle(ids text[], params bigint[], taken_at bigint,
                                        reserved bigint, actual bigint, at bigint DEFAULT NULL)
RETURNS void LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  now bigint;
  q bigint[];
  st bigint[];
  expires bigint;
BEGIN
  IF actual = reserved THEN RETURN; END IF;
  PERFORM __S__.lock_rows(ids);
  now := coalesce(at, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint);
  FOR i IN 1 .. params[1] LOOP
    q := params[2 + (i - 1) * 6 : 1 + i * 6];
    SELECT CASE WHEN c.expires_at > now THEN c.v ELSE '{}' END INTO st
      FROM __S__.counters c WHERE c.id = ids[i];
    st := __S__.settle_state(q, st, now, taken_at, reserved, actual);
    CONTINUE WHEN st IS NULL;
    expires := __S__.expires(q, st);
    IF expires <= now THEN
      DELETE FROM __S__.counters WHERE id = ids[i];
    ELSE
      UPDATE __S__.counters SET v = st, expires_at = expires WHERE id = ids[i];
    END IF;
  END LOOP;
END $$;
