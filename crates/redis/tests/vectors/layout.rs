//! Redis's layout of each algorithm's state and of a penalty record (see the header of
//! algorithms.lua): written before a vector runs, read back after.

use std::collections::BTreeMap;

use redis::Value;
use serde_json::Value as Json;
use sluice_core::algorithm::sliding_log::Log;
use sluice_core::algorithm::sliding_window::Counters;
use sluice_core::{Algorithm, PenaltyState, Quota, State};

use crate::UNTOUCHED_EXPIRY_MS;

pub(super) fn write_state(pipe: &mut redis::Pipeline, key: &str, state: &State) {
    match state {
        State::Gcra { tat } => {
            pipe.cmd("SET").arg(key).arg(tat.to_string());
        }
        State::FixedWindow { window, count } => {
            pipe.cmd("SET").arg(key).arg(format!("{window}:{count}"));
        }
        State::SlidingWindow(counters) => {
            let (newest, by_slot) = ring(counters);
            let mut items = vec![newest];
            items.extend(by_slot);
            pipe.cmd("SET").arg(key).arg(msgpack::pack(&items));
        }
        State::SlidingLog(log) => {
            let mut members = Vec::new();
            for (t, cost) in log.hits() {
                for n in 1..=cost {
                    members.push((t, format!("{t}:init:{key}:{n}")));
                }
            }
            if members.is_empty() {
                return;
            }
            pipe.cmd("ZADD").arg(key).arg(members);
        }
        other => panic!("no Redis layout for {other:?}"),
    }
    pipe.cmd("PEXPIREAT").arg(key).arg(UNTOUCHED_EXPIRY_MS);
}

/// The newest sub-window number and the counts by sub-window number mod G.
pub(super) fn ring(counters: &Counters) -> (u64, Vec<u64>) {
    let g = u64::from(counters.len());
    let newest = counters.newest();
    let mut slots = vec![0; g as usize];
    for back in 0..g.min(newest + 1) {
        let number = newest - back;
        slots[(number % g) as usize] = counters.count(number);
    }
    (newest, slots)
}

/// A leaf's key as the core's state; `None` when there is no key.
pub(super) fn read_state(quota: &Quota, raw: &Value) -> Result<Option<State>, String> {
    if matches!(raw, Value::Nil) {
        return Ok(None);
    }
    let text = || match raw {
        Value::BulkString(bytes) => Ok(bytes.clone()),
        other => Err(format!("unexpected reply {other:?}")),
    };
    let number = |s: &str| {
        s.parse::<u64>()
            .map_err(|_| format!("`{s}` is not an integer"))
    };
    let state = match quota.algorithm() {
        Algorithm::Gcra => State::Gcra {
            tat: number(&String::from_utf8_lossy(&text()?))?,
        },
        Algorithm::FixedWindow => {
            let text = String::from_utf8_lossy(&text()?).into_owned();
            let (window, count) = text
                .split_once(':')
                .ok_or(format!("`{text}` is not <window>:<count>"))?;
            State::FixedWindow {
                window: number(window)?,
                count: number(count)?,
            }
        }
        Algorithm::SlidingWindow => {
            let items = msgpack::unpack(&text()?)?;
            let g = u64::from(quota.windows());
            if items.len() as u64 != g + 1 {
                return Err(format!("{} items, expected {}", items.len(), g + 1));
            }
            let newest = items[0];
            let oldest_first: Vec<u64> = (0..g)
                .map(|offset| {
                    let number = newest + 1 + offset; // + G: sub-window newest - G + 1 + offset
                    if number < g {
                        0
                    } else {
                        items[1 + (number % g) as usize]
                    }
                })
                .collect();
            State::SlidingWindow(Counters::from_parts(newest, &oldest_first))
        }
        Algorithm::SlidingLog => {
            let Value::Array(flat) = raw else {
                return Err(format!("unexpected reply {raw:?}"));
            };
            if flat.is_empty() {
                return Ok(None);
            }
            let mut merged: BTreeMap<u64, u64> = BTreeMap::new();
            for pair in flat.chunks(2) {
                let score = match &pair[1] {
                    Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                    Value::Double(d) => d.to_string(),
                    other => return Err(format!("unexpected score {other:?}")),
                };
                let t: f64 = score.parse().map_err(|_| format!("bad score {score}"))?;
                if t.fract() != 0.0 || t < 0.0 {
                    return Err(format!("score {score} is not a whole tick"));
                }
                *merged.entry(t as u64).or_default() += 1;
            }
            State::SlidingLog(Log::from_hits(merged))
        }
        other => return Err(format!("no Redis layout for {other}")),
    };
    Ok(Some(state))
}

pub(super) fn read_penalty(raw: &Value) -> Result<Option<PenaltyState>, String> {
    let text = match raw {
        Value::Nil => return Ok(None),
        Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        other => return Err(format!("unexpected reply {other:?}")),
    };
    let parts: Vec<&str> = text.split(':').collect();
    let bad = || format!("`{text}` is not <strikes>:<until>:<last_strike>");
    let [strikes, until, last] = parts[..] else {
        return Err(bad());
    };
    Ok(Some(PenaltyState {
        strikes: strikes.parse().map_err(|_| bad())?,
        until: until.parse().map_err(|_| bad())?,
        last_strike: last.parse().map_err(|_| bad())?,
    }))
}

pub(super) fn int(v: &Value) -> i64 {
    match v {
        Value::Int(n) => *n,
        other => panic!("expected an integer reply, got {other:?}"),
    }
}

pub(super) fn ints(v: &Value) -> Vec<i64> {
    match v {
        Value::Array(items) => items.iter().map(int).collect(),
        other => panic!("expected an array reply, got {other:?}"),
    }
}

/// The seven integers algorithms.lua replies with.
pub(super) fn expected_reply(d: &Json) -> Vec<i64> {
    let i = |v: &Json| v.as_i64().unwrap();
    vec![
        i64::from(d["allowed"].as_bool().unwrap()),
        i(&d["limit"]),
        i(&d["remaining"]),
        i(&d["reset_after_ticks"]),
        i(&d["retry_after_ticks"]),
        i(&d["denial"]),
        i(&d["leaf"]),
    ]
}

/// The few MessagePack encodings a sliding-window key uses: arrays of non-negative integers.
mod msgpack {
    pub fn pack(items: &[u64]) -> Vec<u8> {
        let mut out = Vec::new();
        match items.len() {
            n @ 0..=15 => out.push(0x90 | n as u8),
            n @ 16..=0xffff => {
                out.push(0xdc);
                out.extend((n as u16).to_be_bytes());
            }
            n => {
                out.push(0xdd);
                out.extend((n as u32).to_be_bytes());
            }
        }
        for &n in items {
            match n {
                0..=0x7f => out.push(n as u8),
                0x80..=0xff => out.extend([0xcc, n as u8]),
                0x100..=0xffff => {
                    out.push(0xcd);
                    out.extend((n as u16).to_be_bytes());
                }
                0x1_0000..=0xffff_ffff => {
                    out.push(0xce);
                    out.extend((n as u32).to_be_bytes());
                }
                _ => {
                    out.push(0xcf);
                    out.extend(n.to_be_bytes());
                }
            }
        }
        out
    }

    /// Reads an array of non-negative integers (doubles must hold whole numbers).
    pub fn unpack(bytes: &[u8]) -> Result<Vec<u64>, String> {
        let mut at = 0;
        let mut take = |n: usize| -> Result<u64, String> {
            let chunk = bytes.get(at..at + n).ok_or("truncated msgpack")?;
            at += n;
            Ok(chunk.iter().fold(0u64, |acc, &b| acc << 8 | u64::from(b)))
        };
        let len = match take(1)? as u8 {
            b @ 0x90..=0x9f => u64::from(b & 0x0f),
            0xdc => take(2)?,
            0xdd => take(4)?,
            b => return Err(format!("expected an array, found byte {b:#x}")),
        };
        (0..len)
            .map(|_| match take(1)? as u8 {
                b @ 0..=0x7f => Ok(u64::from(b)),
                0xcc => take(1),
                0xcd => take(2),
                0xce => take(4),
                0xcf => take(8),
                0xcb => {
                    let d = f64::from_bits(take(8)?);
                    if d.fract() == 0.0 && d >= 0.0 {
                        Ok(d as u64)
                    } else {
                        Err(format!("count {d} is not a whole non-negative number"))
                    }
                }
                b => Err(format!("unexpected msgpack byte {b:#x} in a counter")),
            })
            .collect()
    }
}
