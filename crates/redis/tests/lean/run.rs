//! What the lean scripts' batch tests share: the test entry, and one call of a batch.

/// The lean script's test entry: `now` from the last argument instead of Redis's clock,
/// taken off `ARGV` so the script sees the arguments the store sends.
const TEST_ENTRY: &str = "local now = tonumber(table.remove(ARGV))\n";

/// A lean script's body (a `*_LUA` constant) behind the test entry, as text for `EVAL`.
#[allow(dead_code)] // Not every test that includes this file sends the text itself.
pub fn source(body: &str) -> String {
    format!("{TEST_ENTRY}{body}")
}

/// A lean script's body (a `*_LUA` constant) behind the test entry.
#[allow(dead_code)]
pub fn script(body: &str) -> redis::Script {
    redis::Script::new(&source(body))
}

/// Runs one batch: `keys` and `args` as the store would send them, decided at `now`.
#[allow(dead_code)]
pub fn run(
    con: &mut redis::Connection,
    script: &redis::Script,
    keys: &[&str],
    args: &[u64],
    now: u64,
) -> Vec<i64> {
    let mut invocation = script.prepare_invoke();
    for key in keys {
        invocation.key(*key);
    }
    for arg in args {
        invocation.arg(*arg);
    }
    invocation.arg(now);
    invocation.invoke(con).expect("the batch runs")
}
