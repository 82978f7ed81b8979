//! `sluice simulate --generate`: example traces for a user with none of their own.
//!
//! Each kind is a function of `(seconds, seed)` alone: integer milliseconds and a SplitMix64
//! generator written here (no floating point, no dependency whose stream may change between
//! versions), so a seed gives the same bytes on every machine and every release.

use std::fmt::Write;

/// The example traces, by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A few users, each at its own constant rate.
    Steady,
    /// A quiet base with bursts of one user doing many hits in a few seconds.
    Bursty,
    /// Normal traffic, then a password-guessing attack on a few accounts spread over many
    /// IPs, each IP trying only a few times.
    Attack,
}

impl Kind {
    pub const NAMES: &'static str = "steady, bursty or attack";

    pub fn from_name(name: &str) -> Option<Kind> {
        match name {
            "steady" => Some(Kind::Steady),
            "bursty" => Some(Kind::Bursty),
            "attack" => Some(Kind::Attack),
            _ => None,
        }
    }
}

/// Longest trace `--generate` makes, in seconds (a day).
pub const MAX_SECONDS: u64 = 86_400;

/// A CSV trace (`t,user,ip`) of `kind` lasting `seconds`.
pub fn generate(kind: Kind, seconds: u64, seed: u64) -> String {
    let mut rng = SplitMix64(seed);
    let end = seconds * 1000;
    let mut hits = match kind {
        Kind::Steady => steady(&mut rng, end),
        Kind::Bursty => bursty(&mut rng, end),
        Kind::Attack => attack(&mut rng, end),
    };
    // Stable: hits at the same millisecond keep the order they were made in.
    hits.sort_by_key(|hit| hit.ms);
    let mut csv = String::from("t,user,ip\n");
    for hit in hits.iter().filter(|hit| hit.ms < end) {
        let _ = writeln!(
            csv,
            "{}.{:03},{},{}",
            hit.ms / 1000,
            hit.ms % 1000,
            hit.user,
            hit.ip
        );
    }
    csv
}

struct Hit {
    ms: u64,
    user: String,
    ip: String,
}

const USERS: [&str; 8] = [
    "alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi",
];

/// The address a normal user comes from (the documentation range 192.0.2.0/24).
fn home(user: usize) -> String {
    format!("192.0.2.{}", 10 + user)
}

/// Hits from `user` from `start` to `end` with gaps of `gap` ms, each within `jitter` ms.
fn regular(rng: &mut SplitMix64, user: usize, gap: u64, jitter: u64, end: u64) -> Vec<Hit> {
    let mut hits = Vec::new();
    let mut ms = rng.below(gap);
    while ms < end {
        hits.push(Hit {
            ms,
            user: USERS[user].to_owned(),
            ip: home(user),
        });
        ms += gap - jitter + rng.below(2 * jitter + 1);
    }
    hits
}

/// Four users at 60, 40, 20 and 10 hits a minute.
fn steady(rng: &mut SplitMix64, end: u64) -> Vec<Hit> {
    [1_000, 1_500, 3_000, 6_000]
        .into_iter()
        .enumerate()
        .flat_map(|(user, gap)| regular(rng, user, gap, gap / 10, end))
        .collect()
}

/// Five users at about 10 hits a minute each, and every 45 to 120 s one of them sends 60 to
/// 150 hits within 3 to 10 s.
fn bursty(rng: &mut SplitMix64, end: u64) -> Vec<Hit> {
    let mut hits: Vec<Hit> = (0..5)
        .flat_map(|user| regular(rng, user, 6_000, 5_500, end))
        .collect();
    let mut start = rng.between(10_000, 30_000);
    while start < end {
        let user = rng.below(5) as usize;
        let count = rng.between(60, 150);
        let length = rng.between(3_000, 10_000);
        for _ in 0..count {
            hits.push(Hit {
                ms: start + rng.below(length),
                user: USERS[user].to_owned(),
                ip: home(user),
            });
        }
        start += rng.between(45_000, 120_000);
    }
    hits
}

/// Eight users at about 6 hits a minute each; from 20% to 80% of the trace, about 8 login
/// attempts a second on `admin`, `root` and `alice` from addresses of 100.64.0.0/10, each
/// address trying 1 to 3 times.
fn attack(rng: &mut SplitMix64, end: u64) -> Vec<Hit> {
    let mut hits: Vec<Hit> = (0..USERS.len())
        .flat_map(|user| regular(rng, user, 10_000, 9_000, end))
        .collect();
    let targets = ["admin", "root", "alice"];
    let (from, to) = (end / 5, end * 4 / 5);
    let mut ms = from;
    while ms < to {
        let ip = format!(
            "100.{}.{}.{}",
            64 + rng.below(64),
            rng.below(256),
            1 + rng.below(254)
        );
        let mut at = ms;
        for _ in 0..rng.between(1, 3) {
            hits.push(Hit {
                ms: at,
                user: targets[rng.below(3) as usize].to_owned(),
                ip: ip.clone(),
            });
            at += rng.between(1_000, 20_000);
        }
        // About 2 attempts per address, so a new address every 250 ms on average.
        ms += rng.below(501);
    }
    hits
}

/// SplitMix64 (Steele, Lea and Flood 2014): tiny, fast, and good enough for example traffic.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (Lemire's multiply-shift; the bias is below 2^-40 for these `n`).
    fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next()) * u128::from(n)) >> 64) as u64
    }

    /// Uniform in `low..=high`.
    fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.below(high - low + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splitmix_matches_the_reference_stream() {
        // First outputs for seed 0 of the reference implementation.
        let mut rng = SplitMix64(0);
        assert_eq!(rng.next(), 0xE220_A839_7B1D_CDAF);
        assert_eq!(rng.next(), 0x6E78_9E6A_A1B9_65F4);
    }

    #[test]
    fn kinds_have_their_shape() {
        let lines = |kind| generate(kind, 300, 1).lines().count() - 1;
        let steady = lines(Kind::Steady);
        assert!((500..=700).contains(&steady), "{steady}");
        assert!(lines(Kind::Bursty) > lines(Kind::Steady) / 2);
        let attack = generate(Kind::Attack, 300, 1);
        let addresses: std::collections::HashSet<&str> = attack
            .lines()
            .skip(1)
            .filter_map(|l| l.rsplit(',').next())
            .collect();
        assert!(addresses.len() > 500, "{}", addresses.len());
        assert_eq!(generate(Kind::Attack, 300, 1), attack);
        assert_ne!(generate(Kind::Attack, 300, 2), attack);
    }
}
