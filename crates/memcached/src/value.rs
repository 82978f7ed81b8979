//! Values under `<base>|s` keys: a leaf's state or a penalty record, as short ASCII text.
//!
//! | value | meaning |
//! |---|---|
//! | `g <tat>` | GCRA: the theoretical arrival time, ns |
//! | `f <window> <count>` | fixed window: the window number and its count |
//! | `l <d1>[*<c1>] <d2>[*<c2>] ...` | sliding log: each hit's time as the gap from the one before (the first from 0), ns, and its cost when above 1 |
//! | `p <strikes> <until> <last strike>` | penalty record, ns |
//! | `c <id>:<expires at> <id>:<expires at> ...` | concurrency: the leases held (`c` alone when none), in the order taken, ns |
//!
//! Times are nanoseconds of the callers' clocks. Reading is strict: anything else is
//! [`Corrupt`](crate::MemcachedError::Corrupt).

use sluice_core::algorithm::concurrency::Leases;
use sluice_core::algorithm::sliding_log::Log;
use sluice_core::{PenaltyState, State};

use crate::MemcachedError;
use crate::protocol::number;

/// Most entries a sliding log may hold on memcached: at most 42 bytes each, a full log stays
/// well under memcached's default 1 MiB item size.
pub const MAX_LOG_LIMIT: u64 = 10_000;

/// Most slots a concurrency leaf may have on memcached (`user:N concurrent`, N at most
/// this): at most 42 bytes per lease, a full set stays well under memcached's default 1 MiB
/// item size, and every acquire and release reads and rewrites the whole set.
pub const MAX_LEASES: u64 = 10_000;

/// Most leases a set may hold: twice [`MAX_LEASES`], for an `and` rule that admits past a
/// full concurrency leaf (every leaf of an admitted hit holds its lease).
pub const MAX_LEASE_ENTRIES: usize = 2 * MAX_LEASES as usize;

/// What a `|s` key holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stored {
    Leaf(State),
    Penalty(PenaltyState),
}

pub fn encode_state(state: &State) -> Vec<u8> {
    let text = match state {
        State::Gcra { tat } => {
            // The most common value: no `format!` (see `protocol::store`).
            let mut text = Vec::with_capacity(22);
            text.extend_from_slice(b"g ");
            crate::protocol::push_number(&mut text, *tat);
            return text;
        }
        State::FixedWindow { window, count } => format!("f {window} {count}"),
        State::SlidingLog(log) => {
            let mut text = String::from("l");
            let mut previous = 0;
            for (at, cost) in log.hits() {
                // Logs are kept in time order (see `leaf::settle`); never panic if not.
                text.push_str(&format!(" {}", at.saturating_sub(previous)));
                if cost != 1 {
                    text.push_str(&format!("*{cost}"));
                }
                previous = at;
            }
            text
        }
        State::Concurrency(leases) => return encode_leases(leases),
        State::SlidingWindow(_) => unreachable!("sliding-window counters have keys of their own"),
        _ => unreachable!("every algorithm is handled"),
    };
    text.into_bytes()
}

/// A concurrency leaf's lease set: `c`, then ` <id>:<expires at>` per lease. Written and
/// read byte by byte (every acquire and release rewrites the whole set).
pub fn encode_leases(leases: &Leases) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + 42 * leases.len());
    out.push(b'c');
    for (id, expires_at) in leases.leases() {
        out.push(b' ');
        push_number(&mut out, id);
        out.push(b':');
        push_number(&mut out, expires_at);
    }
    out
}

fn push_number(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

/// A decimal number of 1 to 20 digits that fits 64 bits: [`number`], without its checks
/// for text (the lease set is read on every step).
fn digits(text: &[u8]) -> Option<u64> {
    if text.is_empty() || text.len() > 20 {
        return None;
    }
    text.iter().try_fold(0u64, |n, &b| {
        let digit = b.wrapping_sub(b'0');
        if digit > 9 {
            return None;
        }
        n.checked_mul(10)?.checked_add(u64::from(digit))
    })
}

/// The leases after `c` (`rest` is empty or starts with a space).
fn decode_leases(rest: &[u8]) -> Result<Stored, String> {
    let mut held = Vec::with_capacity(rest.len() / 24);
    if !rest.is_empty() {
        for field in rest[1..].split(|&b| b == b' ') {
            if held.len() == MAX_LEASE_ENTRIES {
                return Err("a lease set longer than any limit allows".into());
            }
            let colon = field.iter().position(|&b| b == b':');
            let lease = colon.and_then(|at| {
                let (id, expires_at) = (&field[..at], &field[at + 1..]);
                Some((digits(id)?, digits(expires_at)?))
            });
            let Some(lease) = lease else {
                let field = String::from_utf8_lossy(field);
                return Err(format!("`{field}` is not a lease"));
            };
            held.push(lease);
        }
    }
    Ok(Stored::Leaf(State::Concurrency(Leases::from_leases(held))))
}

pub fn encode_penalty(record: &PenaltyState) -> Vec<u8> {
    format!(
        "p {} {} {}",
        record.strikes, record.until, record.last_strike
    )
    .into_bytes()
}

/// Reads a `|s` value; the error says why it is not one.
pub fn decode(value: &[u8]) -> Result<Stored, String> {
    if let Some(rest) = value.strip_prefix(b"c")
        && (rest.is_empty() || rest[0] == b' ')
    {
        return decode_leases(rest);
    }
    let text = std::str::from_utf8(value).map_err(|_| "not UTF-8".to_owned())?;
    let mut fields = text.split(' ');
    let kind = fields.next().unwrap_or("");
    let fields: Vec<&str> = fields.collect();
    let numbers = |n: usize| -> Result<Vec<u64>, String> {
        if fields.len() != n {
            return Err(format!(
                "`{kind}` takes {n} numbers, found {}",
                fields.len()
            ));
        }
        fields
            .iter()
            .map(|f| number(f.as_bytes()).ok_or_else(|| format!("`{f}` is not a number")))
            .collect()
    };
    match kind {
        "g" => Ok(Stored::Leaf(State::Gcra {
            tat: numbers(1)?[0],
        })),
        "f" => {
            let n = numbers(2)?;
            Ok(Stored::Leaf(State::FixedWindow {
                window: n[0],
                count: n[1],
            }))
        }
        "p" => {
            let n = numbers(3)?;
            let strikes = u32::try_from(n[0]).map_err(|_| "too many strikes".to_owned())?;
            Ok(Stored::Penalty(PenaltyState {
                strikes,
                until: n[1],
                last_strike: n[2],
            }))
        }
        "l" => {
            if fields.len() as u64 > MAX_LOG_LIMIT {
                return Err("a sliding log longer than any limit allows".into());
            }
            let mut hits = Vec::with_capacity(fields.len());
            let mut at = 0u64;
            for field in &fields {
                let (gap, cost) = match field.split_once('*') {
                    Some((gap, cost)) => (gap, number(cost.as_bytes()).filter(|&c| c > 1)),
                    None => (*field, Some(1)),
                };
                let gap = number(gap.as_bytes());
                let (Some(gap), Some(cost)) = (gap, cost) else {
                    return Err(format!("`{field}` is not a log entry"));
                };
                at = at
                    .checked_add(gap)
                    .ok_or_else(|| "log times overflow".to_owned())?;
                hits.push((at, cost));
            }
            Ok(Stored::Leaf(State::SlidingLog(Log::from_hits(hits))))
        }
        other => Err(format!("unknown kind `{other}`")),
    }
}

/// A counter's value: decimal, maybe space-padded at the end (memcached pads after `decr`).
pub(crate) fn count(key: &str, value: &[u8]) -> Result<u64, MemcachedError> {
    count_named(value, || key.to_owned())
}

/// [`count`], the key named only if the value is not a count.
pub(crate) fn count_named(
    value: &[u8],
    key: impl FnOnce() -> String,
) -> Result<u64, MemcachedError> {
    let end = value.iter().rposition(|&b| b != b' ').map_or(0, |i| i + 1);
    number(&value[..end]).ok_or_else(|| MemcachedError::Corrupt {
        key: key(),
        why: format!("{:?} is not a count", String::from_utf8_lossy(value)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(state: State) {
        let bytes = encode_state(&state);
        assert_eq!(decode(&bytes), Ok(Stored::Leaf(state)), "{bytes:?}");
    }

    #[test]
    fn states_round_trip() {
        round_trip(State::Gcra { tat: 0 });
        round_trip(State::Gcra { tat: u64::MAX });
        round_trip(State::FixedWindow {
            window: 5,
            count: 99,
        });
        round_trip(State::SlidingLog(Log::default()));
        round_trip(State::SlidingLog(Log::from_hits([
            (1_700_000_000_000_000_000, 1),
            (1_700_000_000_000_000_000 + 5, 3),
            (u64::MAX, 1),
        ])));
        round_trip(State::Concurrency(Leases::default()));
        round_trip(State::Concurrency(Leases::from_leases([
            (u64::MAX, 1_700_000_000_000_000_000),
            (0, u64::MAX),
            (7, 7),
        ])));
        let record = PenaltyState {
            strikes: 3,
            until: 10,
            last_strike: 7,
        };
        assert_eq!(
            decode(&encode_penalty(&record)),
            Ok(Stored::Penalty(record))
        );
    }

    #[test]
    fn refuses_what_it_did_not_write() {
        for bad in [
            &b""[..],
            b"g",
            b"g 1 2",
            b"g -1",
            b"g  1",
            b"x 1",
            b"f 1",
            b"p 1 2",
            b"p 99999999999 1 1",
            b"l 1*1",
            b"l 1*",
            b"l a",
            b"l 18446744073709551615 1",
            b"\xff",
            b"l ",
            b"c ",
            b"c 1",
            b"c 1:",
            b"c :1",
            b"c 1:2:3",
            b"c 1:2  3:4",
            b"c -1:2",
            b"c 18446744073709551616:1",
            b"c 1:+2",
            b"c 1:2 ",
        ] {
            assert!(decode(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn a_full_log_fits_one_item() {
        let hits = (0..MAX_LOG_LIMIT).map(|i| (u64::MAX - MAX_LOG_LIMIT + i, 1));
        let log = State::SlidingLog(Log::from_hits(hits));
        assert!(encode_state(&log).len() < 1 << 20);
        let held = (0..MAX_LEASE_ENTRIES as u64).map(|i| (u64::MAX - i, u64::MAX - i));
        let full = encode_leases(&Leases::from_leases(held));
        assert!(full.len() < 1 << 20, "{}", full.len());
        assert!(decode(&full).is_ok());
        let over = format!("{} 1:1", String::from_utf8(full).unwrap());
        assert!(decode(over.as_bytes()).is_err());
    }
}
