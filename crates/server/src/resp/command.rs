//! The commands the Redis protocol listener answers.
//!
//! - `CL.THROTTLE key max_burst count period [quantity]`: redis-cell's command and reply,
//!   `[limited, limit, remaining, retry_after, reset_after]` (seconds, rounded up;
//!   retry_after is -1 when allowed). GCRA with a capacity of `max_burst + 1` and a rate of
//!   `count` per `period` seconds.
//! - `SLUICE.CHECK policy [cost] [selector value]...`: a configured policy, same reply.
//! - `SLUICE.ACQUIRE`, `SLUICE.RELEASE`, `SLUICE.RENEW`, `SLUICE.RESERVE`, `SLUICE.SETTLE`:
//!   concurrency leases and reservations (see [`super::leases`]).
//! - `PING [msg]`, `ECHO msg`, `COMMAND ...` (an empty list), `QUIT`, `SELECT`, `CLIENT ...`,
//!   `HELLO 2|3`, `INFO`: enough for redis-cli and client libraries to connect.

use std::fmt::Write;
use std::time::Duration;

use sluice_core::{Leaf, LeafOptions, Rate, Rule, Selector, Span, Unit, whole_seconds};
use sluice_limiter::{Algorithm, Checked, Policy};

use super::leases;
use crate::service::{Dynamic, Service};

/// What to do after replying.
#[derive(Debug, PartialEq, Eq)]
pub enum After {
    Continue,
    Close,
}

pub(super) fn error(out: &mut Vec<u8>, message: &str) {
    out.extend_from_slice(b"-");
    // A reply line must not hold CR or LF.
    out.extend(
        message
            .bytes()
            .map(|b| if b == b'\r' || b == b'\n' { b' ' } else { b }),
    );
    out.extend_from_slice(b"\r\n");
}

pub(super) fn bulk(out: &mut Vec<u8>, bytes: &[u8]) {
    let _ = write!(Sink(out), "${}\r\n", bytes.len());
    out.extend_from_slice(bytes);
    out.extend_from_slice(b"\r\n");
}

/// `write!` into a byte vector.
struct Sink<'a>(&'a mut Vec<u8>);

impl std::fmt::Write for Sink<'_> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

pub(super) fn integer(text: &[u8]) -> Option<i64> {
    std::str::from_utf8(text).ok()?.parse().ok()
}

/// Whole seconds, rounded up (as redis-cell does, so no caller retries too early).
pub(super) fn ceil_secs(d: Duration) -> i64 {
    i64::try_from(whole_seconds(d)).unwrap_or(i64::MAX)
}

pub(super) fn decision_reply(out: &mut Vec<u8>, checked: &Checked) {
    let d = &checked.decision;
    let retry = match d.retry_after() {
        Some(r) if !d.allowed() => ceil_secs(r),
        _ => -1,
    };
    let _ = write!(
        Sink(out),
        "*5\r\n:{}\r\n:{}\r\n:{}\r\n:{}\r\n:{}\r\n",
        i64::from(!d.allowed()),
        d.limit,
        d.remaining,
        retry,
        ceil_secs(d.reset_after)
    );
}

/// The rate of `CL.THROTTLE` parameters, or why they make none. Cheap: checked on every
/// call, while the policy is built only when first needed.
fn cell_rate(burst: u64, count: u64, period: u64) -> Result<Rate, String> {
    let span = Span::new(period, Unit::Second).map_err(|e| e.to_string())?;
    if burst > sluice_core::rate::MAX_COUNT {
        return Err(format!("max_burst above {}", sluice_core::rate::MAX_COUNT));
    }
    Rate::new(count, span).map_err(|e| e.to_string())
}

fn cell_policy(name: &str, burst: u64, rate: Rate) -> Policy {
    let leaf = Leaf {
        selector: Selector::new(["key"]).expect("a valid name"),
        rate,
        options: LeafOptions {
            algorithm: Some(Algorithm::Gcra),
            burst: Some(burst),
            ..LeafOptions::default()
        },
    };
    Policy::from_rule(name, Rule::Leaf(leaf)).key("cell")
}

/// Runs `args` and appends the reply to `out`.
pub async fn run(service: &Service, args: &[Vec<u8>], out: &mut Vec<u8>) -> After {
    let Some(name) = args.first() else {
        return After::Continue; // an empty inline line: Redis ignores it too
    };
    let mut upper = [0u8; 16];
    let name: &str = if name.len() <= upper.len() {
        upper[..name.len()].copy_from_slice(name);
        upper[..name.len()].make_ascii_uppercase();
        std::str::from_utf8(&upper[..name.len()]).unwrap_or("")
    } else {
        "" // longer than any command here
    };
    let rest = &args[1..];
    match name {
        "PING" => match rest {
            [] => out.extend_from_slice(b"+PONG\r\n"),
            [message] => bulk(out, message),
            _ => error(out, "ERR wrong number of arguments for 'ping' command"),
        },
        "ECHO" => match rest {
            [message] => bulk(out, message),
            _ => error(out, "ERR wrong number of arguments for 'echo' command"),
        },
        "QUIT" => {
            out.extend_from_slice(b"+OK\r\n");
            return After::Close;
        }
        "COMMAND" => out.extend_from_slice(b"*0\r\n"),
        "SELECT" | "CLIENT" | "READONLY" | "RESET" => out.extend_from_slice(b"+OK\r\n"),
        // Every reply here is valid in RESP2 and RESP3 alike, so both versions are accepted;
        // only the HELLO reply itself differs (an array in RESP2, a map in RESP3).
        "HELLO" => match rest.first().and_then(|v| integer(v)) {
            None | Some(2) => out.extend_from_slice(
                b"*6\r\n$6\r\nserver\r\n$6\r\nsluice\r\n$5\r\nproto\r\n:2\r\n$4\r\nmode\r\n$10\r\nstandalone\r\n",
            ),
            Some(3) => out.extend_from_slice(
                b"%3\r\n$6\r\nserver\r\n$6\r\nsluice\r\n$5\r\nproto\r\n:3\r\n$4\r\nmode\r\n$10\r\nstandalone\r\n",
            ),
            Some(_) => error(out, "NOPROTO sorry, this protocol version is not supported"),
        },
        "INFO" => bulk(
            out,
            format!(
                "# Server\r\nredis_version:7.0.0\r\nsluice_version:{}\r\n",
                env!("CARGO_PKG_VERSION")
            )
            .as_bytes(),
        ),
        "CL.THROTTLE" => throttle(service, rest, out).await,
        "SLUICE.CHECK" => sluice_check(service, rest, out).await,
        "SLUICE.ACQUIRE" => leases::acquire(service, rest, out).await,
        "SLUICE.RELEASE" => leases::release(service, rest, out).await,
        "SLUICE.RENEW" => leases::renew(service, rest, out).await,
        "SLUICE.RESERVE" => leases::reserve(service, rest, out).await,
        "SLUICE.SETTLE" => leases::settle(service, rest, out).await,
        _ => {
            let shown: String = String::from_utf8_lossy(&args[0]).chars().take(64).collect();
            error(out, &format!("ERR unknown command '{shown}'"));
        }
    }
    After::Continue
}

async fn throttle(service: &Service, args: &[Vec<u8>], out: &mut Vec<u8>) {
    if !(4..=5).contains(&args.len()) {
        return error(
            out,
            "ERR wrong number of arguments for 'cl.throttle' command",
        );
    }
    let numbers: Option<Vec<i64>> = args[1..].iter().map(|a| integer(a)).collect();
    let Some(numbers) = numbers else {
        return error(out, "ERR value is not an integer or out of range");
    };
    let (max_burst, count, period) = (numbers[0], numbers[1], numbers[2]);
    let quantity = numbers.get(3).copied().unwrap_or(1);
    if max_burst < 0 || count < 1 || period < 1 || quantity < 0 {
        return error(
            out,
            "ERR max_burst and quantity must be >= 0, count and period >= 1",
        );
    }
    let Ok(key) = std::str::from_utf8(&args[0]) else {
        return error(out, "ERR key must be UTF-8");
    };
    let burst = max_burst as u64 + 1;
    let name = format!("cell.{burst}.{count}.{period}");
    let rate = match cell_rate(burst, count as u64, period as u64) {
        Ok(rate) => rate,
        Err(message) => return error(out, &format!("ERR {message}")),
    };
    match service
        .check_dynamic(
            Dynamic::ClThrottle,
            &name,
            || cell_policy(&name, burst, rate),
            &[("key", key)],
            quantity as u64,
        )
        .await
    {
        Ok(checked) => decision_reply(out, &checked),
        Err(e) => error(out, &format!("ERR {e}")),
    }
}

async fn sluice_check(service: &Service, args: &[Vec<u8>], out: &mut Vec<u8>) {
    let Some((policy, rest)) = args.split_first() else {
        return error(
            out,
            "ERR wrong number of arguments for 'sluice.check' command",
        );
    };
    let (cost, pairs) = if rest.len() % 2 == 1 {
        match integer(&rest[0]) {
            Some(c) if c >= 0 => (c as u64, &rest[1..]),
            _ => return error(out, "ERR cost is not a non-negative integer"),
        }
    } else {
        (1, rest)
    };
    let texts: Option<Vec<&str>> = std::iter::once(policy)
        .chain(pairs)
        .map(|a| std::str::from_utf8(a).ok())
        .collect();
    let Some(texts) = texts else {
        return error(out, "ERR arguments must be UTF-8");
    };
    let selectors: Vec<(&str, &str)> = texts[1..].chunks(2).map(|c| (c[0], c[1])).collect();
    match service.check(texts[0], &selectors, cost).await {
        Ok(checked) => decision_reply(out, &checked),
        Err(e) => error(out, &format!("ERR {e}")),
    }
}
