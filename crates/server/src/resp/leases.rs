//! Leases and reservations over the Redis protocol:
//!
//! - `SLUICE.ACQUIRE policy [selector value]...`: `SLUICE.CHECK`'s five integers, then the
//!   lease's token (a bulk string), or nil when denied.
//! - `SLUICE.RELEASE policy lease`: `+released`, `+expired` (held past its lease time) or
//!   `+not_held`.
//! - `SLUICE.RENEW policy lease`: the seconds the lease has left (rounded up), or nil when
//!   it had expired.
//! - `SLUICE.RESERVE policy estimate [selector value]...`: the five integers, then the
//!   reservation's token, or nil when denied.
//! - `SLUICE.SETTLE policy reservation actual`: `+OK`.
//!
//! Bad arguments and tokens get `-ERR` replies; the store is not asked.

use sluice_limiter::Checked;
use sluice_limiter::lease::TokenError;

use super::command::{bulk, ceil_secs, decision_reply, error, integer};
use crate::http::leases as calls;
use crate::service::Service;

/// The arguments as text, or an error reply saying they must be UTF-8.
fn texts<'a>(args: &'a [Vec<u8>], out: &mut Vec<u8>) -> Option<Vec<&'a str>> {
    let texts: Option<Vec<&str>> = args.iter().map(|a| std::str::from_utf8(a).ok()).collect();
    if texts.is_none() {
        error(out, "ERR arguments must be UTF-8");
    }
    texts
}

fn arity(out: &mut Vec<u8>, command: &str) {
    error(
        out,
        &format!("ERR wrong number of arguments for '{command}' command"),
    );
}

/// Selector pairs, or an error reply when one lacks its value.
fn selectors<'a>(
    pairs: &[&'a str],
    command: &str,
    out: &mut Vec<u8>,
) -> Option<Vec<(&'a str, &'a str)>> {
    if pairs.len() % 2 == 1 {
        arity(out, command);
        return None;
    }
    Some(pairs.chunks(2).map(|c| (c[0], c[1])).collect())
}

/// The five integers of a decision, then `token` (nil when absent).
fn decision_with_token(out: &mut Vec<u8>, checked: &Checked, token: Option<String>) {
    let start = out.len();
    decision_reply(out, checked);
    // `*5` becomes `*6`: the token is the sixth element.
    out[start + 1] = b'6';
    match token {
        Some(token) => bulk(out, token.as_bytes()),
        None => out.extend_from_slice(b"$-1\r\n"),
    }
}

fn token_error(out: &mut Vec<u8>, e: &TokenError) {
    error(out, &format!("ERR {e}"));
}

pub(super) async fn acquire(service: &Service, args: &[Vec<u8>], out: &mut Vec<u8>) {
    let Some(args) = texts(args, out) else { return };
    let Some((policy, rest)) = args.split_first() else {
        return arity(out, "sluice.acquire");
    };
    let Some(selectors) = selectors(rest, "sluice.acquire", out) else {
        return;
    };
    match calls::acquire(service, policy, &selectors).await {
        Ok(acquired) => {
            let token = acquired.lease.map(|lease| {
                let token = lease.token();
                lease.forget(); // the client holds it by its token now
                token
            });
            decision_with_token(out, &acquired.checked, token);
        }
        Err(e) => error(out, &format!("ERR {e}")),
    }
}

pub(super) async fn release(service: &Service, args: &[Vec<u8>], out: &mut Vec<u8>) {
    let Some(args) = texts(args, out) else { return };
    let [policy, token] = args[..] else {
        return arity(out, "sluice.release");
    };
    match calls::release(service, policy, token).await {
        Ok(released) => {
            out.push(b'+');
            out.extend_from_slice(released.name().as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        Err(e) => token_error(out, &e),
    }
}

pub(super) async fn renew(service: &Service, args: &[Vec<u8>], out: &mut Vec<u8>) {
    let Some(args) = texts(args, out) else { return };
    let [policy, token] = args[..] else {
        return arity(out, "sluice.renew");
    };
    match calls::renew(service, policy, token).await {
        Ok(Some(left)) => out.extend_from_slice(format!(":{}\r\n", ceil_secs(left)).as_bytes()),
        Ok(None) => out.extend_from_slice(b"$-1\r\n"),
        Err(e) => token_error(out, &e),
    }
}

pub(super) async fn reserve(service: &Service, args: &[Vec<u8>], out: &mut Vec<u8>) {
    let Some(args) = texts(args, out) else { return };
    let [policy, estimate, rest @ ..] = &args[..] else {
        return arity(out, "sluice.reserve");
    };
    let estimate = match integer(estimate.as_bytes()) {
        Some(e) if e >= 0 => e as u64,
        _ => return error(out, "ERR estimate is not a non-negative integer"),
    };
    let Some(selectors) = selectors(rest, "sluice.reserve", out) else {
        return;
    };
    match calls::reserve(service, policy, &selectors, estimate).await {
        Ok(reserved) => {
            let token = reserved.reservation.as_ref().map(|r| r.token());
            decision_with_token(out, &reserved.checked, token);
        }
        Err(e) => error(out, &format!("ERR {e}")),
    }
}

pub(super) async fn settle(service: &Service, args: &[Vec<u8>], out: &mut Vec<u8>) {
    let Some(args) = texts(args, out) else { return };
    let [policy, token, actual] = args[..] else {
        return arity(out, "sluice.settle");
    };
    let Some(actual) = integer(actual.as_bytes()).filter(|a| *a >= 0) else {
        return error(out, "ERR actual is not a non-negative integer");
    };
    match calls::settle(service, policy, token, actual as u64).await {
        Ok(()) => out.extend_from_slice(b"+OK\r\n"),
        Err(e) => token_error(out, &e),
    }
}
