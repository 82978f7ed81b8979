//! What the lean scripts' batch tests share: the test entry, and one call of a batch (with
//! what it left, read in the same transaction).

/// The lean script's test entry: `now` from the last argument instead of Redis's clock,
/// taken off `ARGV` so the script sees the arguments the store sends.
const TEST_ENTRY: &str = "local now = tonumber(table.remove(ARGV))\n";

/// A lean script's body (a `*_LUA` constant) behind the test entry, as text for `EVAL`.
pub fn source(body: &str) -> String {
    format!("{TEST_ENTRY}{body}")
}

/// Runs one batch (`keys` and `args` as the store would send them, decided at `now`, through
/// the script of `source`), then reads each of `watched` with `read`, then its `PTTL`, all
/// in one transaction: Redis's clock stands still inside it, so a key the batch wrote with
/// an expiry of a millisecond is still there to be read on a loaded machine. Each watched
/// key is then made persistent in the same transaction: the test's time is not Redis's, and
/// a key kept for the next batch must not expire by Redis's clock meanwhile (its expiry was
/// read here). Returns the batch's reply and each watched key's value and PTTL.
#[allow(dead_code)] // Not every test that includes this file reads keys back this way.
pub fn run_and_read(
    con: &mut redis::Connection,
    source: &str,
    (keys, args, now): (&[&str], &[u64], u64),
    watched: &[&str],
    read: impl Fn(&str) -> redis::Cmd,
) -> (Vec<i64>, Vec<(redis::Value, i64)>) {
    let mut pipe = redis::pipe();
    pipe.atomic()
        .cmd("EVAL")
        .arg(source)
        .arg(keys.len())
        .arg(keys);
    pipe.arg(args).arg(now);
    for key in watched {
        pipe.add_command(read(key)).cmd("PTTL").arg(*key);
        pipe.cmd("PERSIST").arg(*key).ignore();
    }
    let replies: Vec<redis::Value> = pipe.query(con).expect("the batch runs");
    let mut replies = replies.into_iter();
    let reply = redis::from_redis_value(replies.next().expect("the batch's reply"));
    let stored = watched
        .iter()
        .map(|_| {
            let value = replies.next().expect("a read");
            let ttl = redis::from_redis_value(replies.next().expect("a PTTL"));
            (value, ttl.expect("PTTL is an integer"))
        })
        .collect();
    (reply.expect("the batch's reply is integers"), stored)
}

/// Verdicts (remaining, reset_after, retry) no quota of a limit of 5 can give: more than the
/// limit remaining, a negative count or time, an unknown retry code.
#[allow(dead_code)] // Only the tests of scripts answering a verdict.
pub const WRONG_VERDICTS: [[i64; 3]; 5] = [
    [6, 0, -1],
    [-1, 0, -1],
    [0, -5, 100],
    [0, 0, -3],
    [0, 0, i64::MIN],
];
