-- sluice: the rule tree, penalties and the decision entry points (after algorithms.sql).

-- Whether retry `b` is strictly later than `a` (as `later` in evaluate.rs).
CREATE OR REPLACE FUNCTION __S__.later(a bigint, b bigint)
RETURNS boolean LANGUAGE sql IMMUTABLE AS $$
  SELECT CASE WHEN a = -2 THEN false WHEN b = -2 THEN true
              WHEN a >= 0 AND b >= 0 THEN b > a ELSE a = -1 END
$$;

-- The decision the tree makes from the leaves' verdicts (5 numbers per leaf, leaf order):
-- {allowed, limit, remaining, reset_after, retry_after (-1 none), denial, leaf}, denial
-- 0 none, 1 limited, 2 never (cost above capacity). `shape` is prefix tokens "o<n>",
-- "a<n>", "l<i>" (leaf indices from 0), folded right to left on a stack: a node pops its n
-- children, first child first.
CREATE OR REPLACE FUNCTION __S__.tree(shape text[], verdicts bigint[])
RETURNS bigint[] LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  reached boolean[] := '{}';
  retry bigint[] := '{}';
  retry_leaf int[] := '{}';
  remaining bigint[] := '{}';
  remaining_leaf int[] := '{}';
  top int := 0;
  token text;
  kind text;
  n int;
  at int;
  o_reached boolean;
  o_retry bigint;
  o_retry_leaf int;
  o_remaining bigint;
  o_remaining_leaf int;
  v int;
BEGIN
  FOR t IN REVERSE cardinality(shape) .. 1 LOOP
    token := shape[t];
    kind := left(token, 1);
    n := substr(token, 2)::int;
    IF kind = 'l' THEN
      top := top + 1;
      at := n * 5;
      reached[top] := verdicts[at + 1] = 0;
      retry[top] := verdicts[at + 5];
      retry_leaf[top] := n;
      remaining[top] := verdicts[at + 3];
      remaining_leaf[top] := n;
    ELSE
      -- Children at top, top - 1, ..., top - n + 1, first child on top.
      o_reached := kind = 'a';
      o_retry := CASE WHEN reached[top] THEN retry[top] ELSE -1 END;
      o_retry_leaf := retry_leaf[top];
      o_remaining := remaining[top];
      o_remaining_leaf := remaining_leaf[top];
      FOR c IN REVERSE top .. top - n + 1 LOOP
        IF kind = 'o' THEN
          IF reached[c] THEN o_reached := true; END IF;
          IF reached[c] AND (o_retry = -1 OR __S__.later(o_retry, retry[c])) THEN
            o_retry := retry[c];
            o_retry_leaf := retry_leaf[c];
          END IF;
          IF remaining[c] < o_remaining THEN
            o_remaining := remaining[c];
            o_remaining_leaf := remaining_leaf[c];
          END IF;
        ELSE
          IF NOT reached[c] THEN o_reached := false; END IF;
          IF __S__.later(retry[c], o_retry) THEN
            o_retry := retry[c];
            o_retry_leaf := retry_leaf[c];
          END IF;
          IF remaining[c] > o_remaining THEN
            o_remaining := remaining[c];
            o_remaining_leaf := remaining_leaf[c];
          END IF;
        END IF;
      END LOOP;
      top := top - n + 1;
      reached[top] := o_reached;
      retry[top] := o_retry;
      retry_leaf[top] := o_retry_leaf;
      remaining[top] := o_remaining;
      remaining_leaf[top] := o_remaining_leaf;
    END IF;
  END LOOP;
  IF reached[1] THEN
    v := retry_leaf[1] * 5;
    IF retry[1] = -2 THEN
      RETURN ARRAY[0, verdicts[v + 2], remaining[1], verdicts[v + 4], -1, 2, retry_leaf[1]];
    END IF;
    RETURN ARRAY[0, verdicts[v + 2], remaining[1], verdicts[v + 4], retry[1], 1, retry_leaf[1]];
  END IF;
  v := remaining_leaf[1] * 5;
  RETURN ARRAY[1, verdicts[v + 2], remaining[1], verdicts[v + 4], -1, 0, remaining_leaf[1]];
END $$;

-- The decision of a one-leaf tree from the leaf's verdict (as `tree` folds a leaf).
CREATE OR REPLACE FUNCTION __S__.leaf_decision(v bigint[])
RETURNS bigint[] LANGUAGE sql IMMUTABLE AS $$
  SELECT CASE WHEN v[1] = 1 THEN ARRAY[1, v[2], v[3], v[4], -1, 0, 0]
              WHEN v[5] = -2 THEN ARRAY[0, v[2], v[3], v[4], -1, 2, 0]
              ELSE ARRAY[0, v[2], v[3], v[4], v[5], 1, 0] END
$$;

-- `decide` for one leaf without a penalty: one row, locked with SELECT ... FOR UPDATE (or
-- created), no tree to fold. Arguments and reply as `decide`'s.
CREATE OR REPLACE FUNCTION __S__.decide_one(id_ text, params bigint[], at bigint)
RETURNS bigint[] LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  cost bigint := params[1];
  recording bigint := params[2];
  q bigint[] := params[4:9];
  st bigint[];
  expires bigint;
  now bigint;
  d bigint[];
  after bigint[];
BEGIN
  SELECT c.v, c.expires_at INTO st, expires FROM __S__.counters c WHERE c.id = id_ FOR UPDATE;
  IF NOT FOUND THEN
    -- Create the row, or lock the one a concurrent decision just created.
    INSERT INTO __S__.counters AS c (id, v, expires_at) VALUES (id_, '{}', 0)
      ON CONFLICT (id) DO UPDATE SET expires_at = c.expires_at WHERE false;
    SELECT c.v, c.expires_at INTO st, expires FROM __S__.counters c WHERE c.id = id_;
  END IF;
  now := coalesce(at, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint);
  IF expires <= now THEN st := '{}'; END IF;
  d := __S__.leaf_decision(__S__.verdict(q, st, now, cost));
  IF (recording = 0 AND d[1] = 1) OR (recording = 1 AND d[6] <> 2) THEN
    st := __S__.record(q, st, now, cost);
    expires := __S__.expires(q, st);
    IF expires <= now THEN
      DELETE FROM __S__.counters WHERE id = id_;
    ELSE
      UPDATE __S__.counters SET v = st, expires_at = expires WHERE id = id_;
    END IF;
    IF d[1] = 0 THEN
      -- A counted denial lengthens the wait: report the recorded state's wait.
      after := __S__.leaf_decision(__S__.verdict(q, st, now, cost));
      IF after[1] = 0 THEN d := after; END IF;
    END IF;
  END IF;
  RETURN d;
END $$;

-- Decides one hit atomically and records it as asked.
--
-- ids: the leaves' identifiers, in leaf order; penalty_id: the penalty record's, or NULL.
-- params: {cost, recording (0 admitted, 1 always, 2 never), leaf count, then six numbers per
-- leaf (algorithm, limit, window, interval, burst, windows), then, with a penalty, base,
-- factor, max, forget_after}. shape: as `tree` takes it. at: NULL in production (the time
-- is the database's clock, read once the rows are locked); the tests' `now`.
--
-- Rows are locked in the order of their identifiers (one INSERT ... ON CONFLICT that creates
-- missing rows and locks the others), so two decisions sharing identifiers never deadlock.
-- Returns {allowed, limit, remaining, reset_after, retry_after (-1 none), denial, leaf},
-- denial 3 being a penalty.
CREATE OR REPLACE FUNCTION __S__.decide(ids text[], penalty_id text, params bigint[],
                                        shape text, at bigint DEFAULT NULL)
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
  IF penalty_id IS NULL AND count = 1 THEN
    RETURN __S__.decide_one(ids[1], params, at);
  END IF;
  INSERT INTO __S__.counters AS c (id, v, expires_at)
    SELECT x, '{}', 0 FROM (SELECT DISTINCT x FROM unnest(ids || penalty_id) x
                            WHERE x IS NOT NULL) u ORDER BY x
  ON CONFLICT (id) DO UPDATE SET expires_at = c.expires_at WHERE false;
  now := coalesce(at, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint);

  -- Each leaf's state as a text literal of its array (states vary in length).
  FOR r IN SELECT c.id, c.v, c.expires_at FROM __S__.counters c
           WHERE c.id = ANY(ids || penalty_id) LOOP
    row_v := CASE WHEN r.expires_at > now THEN r.v ELSE '{}' END;
    FOR i IN 1 .. count LOOP
      IF ids[i] = r.id THEN loaded[i] := row_v::text; END IF;
    END LOOP;
    IF r.id = penalty_id THEN p_row := row_v; END IF;
  END LOOP;

  IF penalty_id IS NOT NULL THEN
    pen := params[p_at:p_at + 3];
    IF p_row IS NULL OR cardinality(p_row) <> 3 THEN p_row := ARRAY[0, 0, 0]; END IF;
    IF p_row[2] > now THEN
      wait := p_row[2] - now;
      d := __S__.verdict(params[4:9], coalesce(loaded[1], '{}')::bigint[], now, 0);
      RETURN ARRAY[0, d[2], 0, greatest(d[4], wait), wait, 3, 0];
    END IF;
  END IF;

  FOR i IN 1 .. count LOOP
    q := params[4 + (i - 1) * 6 : 3 + i * 6];
    vs := vs || __S__.verdict(q, coalesce(loaded[i], '{}')::bigint[], now, cost);
  END LOOP;
  d := __S__.tree(tokens, vs);

  IF (recording = 0 AND d[1] = 1) OR (recording = 1 AND d[6] <> 2) THEN
    vs := '{}';
    FOR i IN 1 .. count LOOP
      q := params[4 + (i - 1) * 6 : 3 + i * 6];
      row_v := __S__.record(q, coalesce(loaded[i], '{}')::bigint[], now, cost);
      loaded[i] := row_v::text;
      vs := vs || __S__.verdict(q, row_v, now, cost);
      expires := __S__.expires(q, row_v);
      IF expires <= now THEN
        DELETE FROM __S__.counters WHERE id = ids[i];
      ELSE
        UPDATE __S__.counters SET v = row_v, expires_at = expires WHERE id = ids[i];
      END IF;
    END LOOP;
    IF d[1] = 0 THEN
      -- A counted denial lengthens the wait: report the recorded states' wait.
      after := __S__.tree(tokens, vs);
      IF after[1] = 0 THEN d := after; END IF;
    END IF;
  END IF;

  IF penalty_id IS NOT NULL AND d[6] = 1 AND recording <> 2 THEN
    IF p_row[1] > 0 AND now - p_row[3] >= pen[4] THEN p_row[1] := 0; END IF;
    p_row[1] := p_row[1] + 1;
    -- factor^(strikes - 1) past 2^64 is above any max.
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
  RETURN d;
END $$;

-- The lean entry for the common hit, one GCRA leaf and no penalty: the decision of `decide`
-- for that shape (gcra_verdict, gcra_record and the fold of a single leaf), line for line,
-- checked against the same vectors, with one lookup and at most one write.
-- Arguments: the identifier, cost, recording, interval, burst, window (ticks), `at` as for
-- `decide`. Returns what `decide` returns.
CREATE OR REPLACE FUNCTION __S__.gcra_one(id_ text, cost bigint, recording bigint,
                                          interval_ bigint, burst bigint, window_ bigint,
                                          at bigint DEFAULT NULL)
RETURNS bigint[] LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  tat bigint;
  expires bigint;
  now bigint;
  tau bigint := burst * interval_;
  debt bigint;
  inc bigint;
  recorded bigint;
  remaining bigint;
BEGIN
  SELECT c.v[1], c.expires_at INTO tat, expires FROM __S__.counters c
    WHERE c.id = id_ FOR UPDATE;
  IF NOT FOUND THEN
    -- Create the row, or lock the one a concurrent decision just created.
    INSERT INTO __S__.counters AS c (id, v, expires_at) VALUES (id_, '{}', 0)
      ON CONFLICT (id) DO UPDATE SET expires_at = c.expires_at WHERE false;
    SELECT c.v[1], c.expires_at INTO tat, expires FROM __S__.counters c WHERE c.id = id_;
  END IF;
  now := coalesce(at, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint);
  IF expires IS NULL OR expires <= now THEN tat := 0; END IF;
  tat := coalesce(tat, 0);
  debt := greatest(tat, now) - now;
  IF cost > burst THEN
    -- Never admitted: not counted even when denials are.
    RETURN ARRAY[0, burst, greatest(tau - debt, 0) / interval_, debt, -1, 2, 0];
  END IF;
  inc := cost * interval_;
  IF debt <= tau - inc THEN
    IF recording <> 2 THEN
      recorded := greatest(least(greatest(tat, now) + inc, now + tau + window_), tat);
      IF recorded > now THEN
        UPDATE __S__.counters SET v = ARRAY[recorded], expires_at = recorded WHERE id = id_;
      ELSIF expires > 0 THEN
        DELETE FROM __S__.counters WHERE id = id_;
      END IF;
    END IF;
    RETURN ARRAY[1, burst, (tau - debt - inc) / interval_, debt + inc, -1, 0, 0];
  END IF;
  IF recording = 1 THEN
    -- A counted denial lengthens the wait: the recorded state's verdict is the answer.
    recorded := greatest(least(greatest(tat, now) + inc, now + tau + window_), tat);
    UPDATE __S__.counters SET v = ARRAY[recorded], expires_at = recorded WHERE id = id_;
    debt := greatest(recorded, now) - now;
    RETURN ARRAY[0, burst, greatest(tau - debt, 0) / interval_, debt, recorded + inc - tau - now,
                 1, 0];
  END IF;
  RETURN ARRAY[0, burst, greatest(tau - debt, 0) / interval_, debt, tat + inc - tau - now, 1, 0];
END $$;

-- Several lean decisions in one call and one transaction: for each, what `gcra_one` would
-- decide running them one after another in the order below; the i-th reply at elements
-- 7(i-1)+1 .. 7i of the result, in input order. The arrays are parallel, one element per
-- decision.
--
-- Set-based, so the work per decision is arithmetic, not statements: one INSERT locks every
-- row (creating the missing ones) in the order of their identifiers, the same order `decide`
-- locks in, so two batches, or a batch and `decide`, never deadlock; one SELECT reads them;
-- the decisions then run in identifier order (a repeated identifier's in input order, each
-- seeing the state the previous one left) on one clock reading; one UPDATE and at most one
-- DELETE write the final states back. The steps of each decision are `gcra_one`'s, line for
-- line, and the shared vectors check them through this function too.
CREATE OR REPLACE FUNCTION __S__.gcra_many(ids text[], costs bigint[], recordings bigint[],
                                           intervals bigint[], bursts bigint[],
                                           windows bigint[], at bigint DEFAULT NULL)
RETURNS bigint[] LANGUAGE plpgsql VOLATILE AS $$
DECLARE
  replies bigint[] := array_fill(0::bigint, ARRAY[7 * cardinality(ids)]);
  sorted int[];
  -- The distinct rows, in identifier order: their tat, and what to write back
  -- (0 nothing, 1 the tat, 2 delete the row).
  rows_ text[];
  tats bigint[];
  writes int[];
  k int := 1;
  i int;
  tat bigint;
  now bigint;
  cost bigint;
  interval_ bigint;
  burst bigint;
  tau bigint;
  debt bigint;
  inc bigint;
  recorded bigint;
BEGIN
  INSERT INTO __S__.counters AS c (id, v, expires_at)
    SELECT DISTINCT x, '{}'::bigint[], 0 FROM unnest(ids) AS u(x) ORDER BY x
    ON CONFLICT (id) DO UPDATE SET expires_at = c.expires_at WHERE false;
  now := coalesce(at, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint);
  -- An expired row counts as empty, as in gcra_one.
  SELECT array_agg(c.id ORDER BY c.id),
         array_agg(CASE WHEN c.expires_at <= now THEN 0 ELSE coalesce(c.v[1], 0) END
                   ORDER BY c.id)
    INTO rows_, tats
    FROM __S__.counters c WHERE c.id = ANY (ids);
  writes := array_fill(0, ARRAY[cardinality(rows_)]);
  SELECT array_agg(o::int ORDER BY x, o) INTO sorted
    FROM unnest(ids) WITH ORDINALITY AS u(x, o);
  FOREACH i IN ARRAY sorted LOOP
    WHILE rows_[k] IS DISTINCT FROM ids[i] LOOP
      k := k + 1;
      IF k > cardinality(rows_) THEN
        RAISE EXCEPTION 'gcra_many: no row for identifier %', ids[i];
      END IF;
    END LOOP;
    tat := tats[k];
    cost := costs[i];
    interval_ := intervals[i];
    burst := bursts[i];
    tau := burst * interval_;
    debt := greatest(tat, now) - now;
    IF cost > burst THEN
      replies[7 * i - 6 : 7 * i] :=
        ARRAY[0, burst, greatest(tau - debt, 0) / interval_, debt, -1, 2, 0];
      CONTINUE;
    END IF;
    inc := cost * interval_;
    IF debt <= tau - inc THEN
      IF recordings[i] <> 2 THEN
        recorded := greatest(least(greatest(tat, now) + inc, now + tau + windows[i]), tat);
        IF recorded > now THEN
          tats[k] := recorded;
          writes[k] := 1;
        ELSE
          tats[k] := 0;
          writes[k] := 2;
        END IF;
      END IF;
      replies[7 * i - 6 : 7 * i] := ARRAY[1, burst, (tau - debt - inc) / interval_, debt + inc,
                                          -1, 0, 0];
    ELSIF recordings[i] = 1 THEN
      recorded := greatest(least(greatest(tat, now) + inc, now + tau + windows[i]), tat);
      tats[k] := recorded;
      writes[k] := 1;
      debt := greatest(recorded, now) - now;
      replies[7 * i - 6 : 7 * i] := ARRAY[0, burst, greatest(tau - debt, 0) / interval_, debt,
                                          recorded + inc - tau - now, 1, 0];
    ELSE
      replies[7 * i - 6 : 7 * i] := ARRAY[0, burst, greatest(tau - debt, 0) / interval_, debt,
                                          tat + inc - tau - now, 1, 0];
    END IF;
  END LOOP;
  UPDATE __S__.counters c SET v = ARRAY[w.tat], expires_at = w.tat
    FROM unnest(rows_, tats, writes) AS w(id, tat, what)
    WHERE w.what = 1 AND c.id = w.id;
  DELETE FROM __S__.counters c
    USING unnest(rows_, writes) AS w(id, what)
    WHERE w.what = 2 AND c.id = w.id;
  RETURN replies;
END $$;
