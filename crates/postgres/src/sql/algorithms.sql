-- sluice: the rate-limiting algorithms and the rule-tree evaluation, in PL/pgSQL.
--
-- A line-for-line translation of sluice-core (crates/core/src/algorithm/*.rs, evaluate.rs,
-- penalty.rs), as crates/redis/src/lua/algorithms.lua is, checked against the same vectors.
-- Times are integer microseconds ("ticks") in bigint. __S__ is the schema, quoted.
--
-- One row per identifier in __S__.counters (id, v bigint[], expires_at): v's layout
--   gcra            {tat}                        theoretical arrival time
--   fixed-window    {window, count}              window number (now / span) and count
--   sliding-window  {newest, c_0 .. c_{G-1}}     counts by sub-window number mod G
--   sliding-log     {t_1, c_1, t_2, c_2, ...}    admitted (time, cost), oldest first
--   penalty         {strikes, until, last}
-- A row whose expires_at <= now holds a state equivalent to a fresh one: it is read as
-- fresh, and the cleaner deletes it.
--
-- A quota q is bigint[6]: {algorithm, limit, window, interval, burst, windows}, algorithm
-- 1 gcra, 2 sliding window, 3 sliding log, 4 fixed window. A verdict is bigint[5]:
-- {allowed (0/1), limit, remaining, reset_after, retry}, retry -1 now, -2 never, else ticks.
--
-- Overflow: a cost above a leaf's capacity never multiplies (the never branch comes first),
-- and recording clamps the cost where the result cannot change, so no bigint overflows for
-- quotas the core accepts and costs below 2^63.

-- GCRA ----------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION __S__.gcra_verdict(q bigint[], v bigint[], now bigint, cost bigint)
RETURNS bigint[] LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  tat bigint := coalesce(v[1], 0);
  tau bigint := q[5] * q[4];
  debt bigint := greatest(tat, now) - now;
  inc bigint;
BEGIN
  IF cost <= q[5] THEN
    inc := cost * q[4];
    IF debt <= tau - inc THEN
      RETURN ARRAY[1, q[5], (tau - debt - inc) / q[4], debt + inc, -1];
    END IF;
    RETURN ARRAY[0, q[5], greatest(tau - debt, 0) / q[4], debt, tat + inc - tau - now];
  END IF;
  RETURN ARRAY[0, q[5], greatest(tau - debt, 0) / q[4], debt, -2];
END $$;

CREATE OR REPLACE FUNCTION __S__.gcra_record(q bigint[], v bigint[], now bigint, cost bigint)
RETURNS bigint[] LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  tat bigint := coalesce(v[1], 0);
  tau bigint := q[5] * q[4];
  ceiling bigint := now + tau + q[3];
BEGIN
  -- Past (tau + window) / interval + 1 units the sum is above the ceiling anyway.
  cost := least(cost, (tau + q[3]) / q[4] + 1);
  RETURN ARRAY[greatest(least(greatest(tat, now) + cost * q[4], ceiling), tat)];
END $$;

-- Fixed window ----------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION __S__.fixed_verdict(q bigint[], v bigint[], now bigint, cost bigint)
RETURNS bigint[] LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  current bigint := now / q[3];
  used bigint := CASE WHEN v[1] = current THEN v[2] ELSE 0 END;
  window_end bigint := (current + 1) * q[3];
  total bigint;
BEGIN
  IF cost <= q[2] - used THEN
    total := used + cost;
    RETURN ARRAY[1, q[2], q[2] - total,
                 CASE WHEN total > 0 THEN window_end - now ELSE 0 END, -1];
  END IF;
  RETURN ARRAY[0, q[2], greatest(q[2] - used, 0),
               CASE WHEN used > 0 THEN window_end - now ELSE 0 END,
               CASE WHEN cost > q[2] THEN -2 ELSE window_end - now END];
END $$;

CREATE OR REPLACE FUNCTION __S__.fixed_record(q bigint[], v bigint[], now bigint, cost bigint)
RETURNS bigint[] LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  current bigint := now / q[3];
  used bigint := CASE WHEN v[1] = current THEN v[2] ELSE 0 END;
BEGIN
  RETURN ARRAY[current, least(used + least(cost, q[2] * 2), q[2] * 2)];
END $$;

-- Sliding window counter ------------------------------------------------------------------

-- Count of sub-window `number` as of the newest sub-window written (v well formed).
CREATE OR REPLACE FUNCTION __S__.sw_count(g bigint, v bigint[], number bigint)
RETURNS bigint LANGUAGE sql IMMUTABLE AS $$
  SELECT CASE WHEN number > v[1] OR number + g <= v[1] THEN 0 ELSE v[2 + number % g] END
$$;

-- v as written, or the fresh state when it does not fit the quota.
CREATE OR REPLACE FUNCTION __S__.sw_fit(q bigint[], v bigint[])
RETURNS bigint[] LANGUAGE sql IMMUTABLE AS $$
  SELECT CASE WHEN cardinality(v) = q[6] + 1 THEN v
              ELSE array_fill(0::bigint, ARRAY[q[6]::int + 1]) END
$$;

CREATE OR REPLACE FUNCTION __S__.sliding_verdict(q bigint[], v bigint[], now bigint, cost bigint)
RETURNS bigint[] LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  g bigint := q[6];
  sub bigint := (q[3] + q[6] - 1) / q[6];
  current bigint := now / sub;
  oldest bigint := greatest(current + 1 - g, 0);
  used bigint := 0;
  last bigint;
  n bigint;
  c bigint;
  reset_at bigint;
  retry bigint := -2;
  left_ bigint;
  retry_at bigint;
BEGIN
  v := __S__.sw_fit(q, v);
  -- Loop variables are int4: count offsets, not sub-window numbers.
  FOR k IN 0 .. current - oldest LOOP
    n := oldest + k;
    c := __S__.sw_count(g, v, n);
    used := used + c;
    IF c > 0 THEN last := n; END IF;
  END LOOP;
  IF cost <= q[2] - used THEN
    IF cost > 0 THEN last := current; END IF;
    reset_at := CASE WHEN last IS NULL THEN now ELSE (last + g) * sub END;
    RETURN ARRAY[1, q[2], q[2] - used - cost, reset_at - now, -1];
  END IF;
  IF cost <= q[2] THEN
    left_ := used;
    retry_at := now;
    FOR k IN 0 .. current - oldest LOOP
      n := oldest + k;
      EXIT WHEN left_ + cost <= q[2];
      c := __S__.sw_count(g, v, n);
      IF c > 0 THEN
        left_ := left_ - c;
        retry_at := (n + g) * sub;
      END IF;
    END LOOP;
    retry := retry_at - now;
  END IF;
  reset_at := CASE WHEN last IS NULL THEN now ELSE (last + g) * sub END;
  RETURN ARRAY[0, q[2], greatest(q[2] - used, 0), reset_at - now, retry];
END $$;

CREATE OR REPLACE FUNCTION __S__.sliding_record(q bigint[], v bigint[], now bigint, cost bigint)
RETURNS bigint[] LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  g bigint := q[6];
  current bigint := now / ((q[3] + q[6] - 1) / q[6]);
  stale bigint;
  slot int;
BEGIN
  v := __S__.sw_fit(q, v);
  IF current > v[1] THEN
    stale := least(current - v[1], g);
    FOR k IN 1 .. stale LOOP
      v[2 + (current + k - stale) % g] := 0;
    END LOOP;
    v[1] := current;
  END IF;
  slot := 2 + v[1] % g;
  v[slot] := least(v[slot] + least(cost, q[2] * 2), q[2] * 2);
  RETURN v;
END $$;

CREATE OR REPLACE FUNCTION __S__.sliding_expires(q bigint[], v bigint[])
RETURNS bigint LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  g bigint := q[6];
  n bigint;
BEGIN
  v := __S__.sw_fit(q, v);
  FOR back IN 0 .. g - 1 LOOP
    n := v[1] - back;
    EXIT WHEN n < 0;
    IF __S__.sw_count(g, v, n) > 0 THEN
      RETURN (n + g) * ((q[3] + q[6] - 1) / q[6]);
    END IF;
  END LOOP;
  RETURN 0;
END $$;

-- Sliding log -------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION __S__.log_verdict(q bigint[], v bigint[], now bigint, cost bigint)
RETURNS bigint[] LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  pairs int := coalesce(cardinality(v), 0) / 2;
  used bigint := 0;
  newest bigint;
  reset_at bigint;
  retry bigint := -2;
  left_ bigint;
  retry_at bigint;
BEGIN
  FOR i IN 1 .. pairs LOOP
    IF v[2 * i - 1] + q[3] > now THEN
      used := used + v[2 * i];
      newest := v[2 * i - 1];
    END IF;
  END LOOP;
  IF cost <= q[2] - used THEN
    reset_at := CASE WHEN cost > 0 THEN now + q[3] ELSE coalesce(newest + q[3], now) END;
    RETURN ARRAY[1, q[2], q[2] - used - cost, reset_at - now, -1];
  END IF;
  IF cost <= q[2] THEN
    -- The hit fits once enough of the oldest hits have left the window.
    left_ := used;
    retry_at := now;
    FOR i IN 1 .. pairs LOOP
      CONTINUE WHEN v[2 * i - 1] + q[3] <= now;
      EXIT WHEN left_ + cost <= q[2];
      left_ := left_ - v[2 * i];
      retry_at := v[2 * i - 1] + q[3];
    END LOOP;
    retry := retry_at - now;
  END IF;
  RETURN ARRAY[0, q[2], greatest(q[2] - used, 0), coalesce(newest + q[3], now) - now, retry];
END $$;

CREATE OR REPLACE FUNCTION __S__.log_record(q bigint[], v bigint[], now bigint, cost bigint)
RETURNS bigint[] LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
  n int;
  total bigint := 0;
  cut bigint;
BEGIN
  v := coalesce(v, '{}');
  IF cardinality(v) % 2 <> 0 THEN v := '{}'; END IF;
  n := 1;
  WHILE n < cardinality(v) AND v[n] + q[3] <= now LOOP
    n := n + 2;
  END LOOP;
  v := v[n:];
  IF cost = 0 THEN RETURN v; END IF;
  n := cardinality(v);
  IF n > 0 AND v[n - 1] = now THEN
    v[n] := least(v[n] + least(cost, q[2]), q[2]);
  ELSE
    v := v || ARRAY[now, least(cost, q[2])];
  END IF;
  -- A denied hit recorded anyway pushes the oldest ones out, so the log never holds more
  -- than `limit` in cost.
  FOR i IN 1 .. cardinality(v) / 2 LOOP
    total := total + v[2 * i];
  END LOOP;
  WHILE total > q[2] LOOP
    cut := least(total - q[2], v[2]);
    v[2] := v[2] - cut;
    total := total - cut;
    IF v[2] = 0 THEN v := v[3:]; END IF;
  END LOOP;
  RETURN v;
END $$;

-- Dispatch ------------------------------------------------------------------------------------

CREATE OR REPLACE FUNCTION __S__.verdict(q bigint[], v bigint[], now bigint, cost bigint)
RETURNS bigint[] LANGUAGE sql IMMUTABLE AS $$
  SELECT CASE q[1]
    WHEN 1 THEN __S__.gcra_verdict(q, v, now, cost)
    WHEN 2 THEN __S__.sliding_verdict(q, v, now, cost)
    WHEN 3 THEN __S__.log_verdict(q, v, now, cost)
    ELSE __S__.fixed_verdict(q, v, now, cost) END
$$;

CREATE OR REPLACE FUNCTION __S__.record(q bigint[], v bigint[], now bigint, cost bigint)
RETURNS bigint[] LANGUAGE sql IMMUTABLE AS $$
  SELECT CASE q[1]
    WHEN 1 THEN __S__.gcra_record(q, v, now, cost)
    WHEN 2 THEN __S__.sliding_record(q, v, now, cost)
    WHEN 3 THEN __S__.log_record(q, v, now, cost)
    ELSE __S__.fixed_record(q, v, now, cost) END
$$;

-- When the state becomes equivalent to a fresh one (0: it is).
CREATE OR REPLACE FUNCTION __S__.expires(q bigint[], v bigint[])
RETURNS bigint LANGUAGE sql IMMUTABLE AS $$
  SELECT CASE q[1]
    WHEN 1 THEN coalesce(v[1], 0)
    WHEN 2 THEN __S__.sliding_expires(q, v)
    WHEN 3 THEN CASE WHEN cardinality(v) >= 2 THEN v[cardinality(v) - 1] + q[3] ELSE 0 END
    ELSE CASE WHEN coalesce(v[2], 0) = 0 THEN 0 ELSE (v[1] + 1) * q[3] END END
$$;
