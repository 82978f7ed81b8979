//! Memcached keys for sluice identifiers.
//!
//! Every key of one identifier starts with the identifier's *base* and is routed by it, so
//! all of an identifier's state lives on one server:
//!
//! | key | holds |
//! |---|---|
//! | `<base>\|s` | the state of a GCRA, fixed-window or sliding-log leaf, or a penalty record, updated with `gets`/`cas` |
//! | `<base>\|w<n>` | the count of sub-window `n` (`now / sub-window length`) of a sliding-window leaf, a decimal number for `incr`/`decr` |
//! | `<base>\|m` | `<sub-window ns> <sub-windows>` of a sliding-window leaf, so a reset can find its counters |
//!
//! The base is the identifier itself when it is short (at most [`MAX_PLAIN`] bytes) and made
//! only of printable ASCII without `|` (memcached keys allow no whitespace or control
//! characters, and at most 250 bytes); otherwise it is `#` and the hex SHA-256 of the
//! identifier. A plain base never starts with `#` and holds no `|`, so no two identifiers,
//! and no two kinds of key, can share a key.

use std::fmt::Write;
use std::sync::Arc;

use sha2::{Digest, Sha256};

use crate::commands::KeyList;
use crate::protocol::number;

/// Longest identifier used as it is: with `|w` and a 20-digit sub-window number, a key
/// stays within memcached's 250 bytes.
pub const MAX_PLAIN: usize = 200;

/// The keys of one identifier. The base is shared (`Arc`), so a copy (a batch's, the
/// combiner's map key) allocates nothing.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Keys {
    base: Arc<str>,
}

impl Keys {
    pub fn new(identifier: &str) -> Keys {
        let plain = !identifier.is_empty()
            && identifier.len() <= MAX_PLAIN
            && !identifier.starts_with('#')
            // Every byte looked at, with no early exit, so the loop vectorises: it runs on
            // every hit, and `all` took about 250 instructions on a 50-byte identifier.
            && identifier
                .bytes()
                .fold(true, |ok, b| ok & b.is_ascii_graphic() & (b != b'|'));
        let base = if plain {
            Arc::from(identifier)
        } else {
            let mut base = String::with_capacity(65);
            base.push('#');
            for byte in Sha256::digest(identifier.as_bytes()) {
                let _ = write!(base, "{byte:02x}");
            }
            Arc::from(base)
        };
        Keys { base }
    }

    /// What picks the server: every key of the identifier goes where its base goes.
    pub fn route(&self) -> &str {
        &self.base
    }

    pub fn state(&self) -> String {
        self.with_suffix("|s")
    }

    pub fn meta(&self) -> String {
        self.with_suffix("|m")
    }

    pub fn window(&self, number: u64) -> String {
        let mut key = self.with_suffix("|w");
        key.push_str(itoa::Buffer::new().format(number));
        key
    }

    /// The counters of sub-windows `first..=last` (at least one).
    pub(crate) fn windows(&self, first: u64, last: u64) -> WindowKeys<'_> {
        WindowKeys {
            keys: self,
            first,
            count: (last - first) as usize + 1,
        }
    }

    /// The base and `suffix`, in one allocation with room for a number after it.
    fn with_suffix(&self, suffix: &str) -> String {
        let mut key = String::with_capacity(self.base.len() + suffix.len() + 20);
        key.push_str(&self.base);
        key.push_str(suffix);
        key
    }
}

/// The counters of consecutive sub-windows of one identifier, as a `get` asks for them: each
/// key is written straight into the request and a reply's key is matched by its number, so
/// reading a window makes no `String` per sub-window (up to eleven on a new identifier's
/// first hit, at about 350 instructions each in the throughput bench).
pub(crate) struct WindowKeys<'a> {
    keys: &'a Keys,
    first: u64,
    count: usize,
}

impl WindowKeys<'_> {
    /// The key of the `i`th counter, for messages.
    pub(crate) fn name(&self, i: usize) -> String {
        self.keys.window(self.first + i as u64)
    }
}

impl KeyList for WindowKeys<'_> {
    fn count(&self) -> usize {
        self.count
    }

    fn bytes(&self) -> usize {
        // `|w`, at most 20 digits and a space.
        (self.keys.base.len() + 23) * self.count
    }

    fn write(&self, i: usize, out: &mut Vec<u8>) {
        out.extend_from_slice(self.keys.base.as_bytes());
        out.extend_from_slice(b"|w");
        out.extend_from_slice(itoa::Buffer::new().format(self.first + i as u64).as_bytes());
    }

    fn find(&self, from: usize, key: &str) -> Option<usize> {
        let digits = key.strip_prefix(&*self.keys.base)?.strip_prefix("|w")?;
        // Written without leading zeros: `|w07` is not the key of sub-window 7.
        if digits.len() > 1 && digits.starts_with('0') {
            return None;
        }
        let i = usize::try_from(number(digits.as_bytes())?.checked_sub(self.first)?).ok()?;
        (from..self.count).contains(&i).then_some(i)
    }
}

/// The text of an `|m` record, `<sub-window ns> <sub-windows>`, written without `format!`
/// or an allocation (most hits on a million identifiers make a counter, and so a record).
pub(crate) struct Record {
    text: [u8; 41],
    len: usize,
}

impl Record {
    pub(crate) fn new(sub: u64, g: u64) -> Record {
        let mut record = Record {
            text: [0; 41],
            len: 0,
        };
        for part in [
            itoa::Buffer::new().format(sub).as_bytes(),
            b" ",
            itoa::Buffer::new().format(g).as_bytes(),
        ] {
            record.text[record.len..record.len + part.len()].copy_from_slice(part);
            record.len += part.len();
        }
        record
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.text[..self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn valid(key: &str) -> bool {
        key.len() <= 250 && key.bytes().all(|b| b.is_ascii_graphic())
    }

    /// The `|m` record a reset reads: the sub-window's length and count, as text, for a
    /// counter's quota and for the widest numbers.
    #[test]
    fn a_record_is_the_sub_window_and_the_count() {
        use sluice_core::{Algorithm, Leaf, Quota, Rate, Span, Unit};
        let rate = Rate::new(10, Span::new(1, Unit::Hour).unwrap()).unwrap();
        let q = Quota::from_leaf(&Leaf::new(rate), Algorithm::SlidingWindow).unwrap();
        let (_, record) = crate::leaf::counter_record(&q, 7, 1_700_000_000_000_000_000);
        let expected = format!("{} {}", q.sub_window_ticks(), q.windows());
        assert_eq!(record.as_bytes(), expected.as_bytes());
        let widest = Record::new(u64::MAX, u64::MAX);
        assert_eq!(
            widest.as_bytes(),
            format!("{} {}", u64::MAX, u64::MAX).as_bytes()
        );
    }

    #[test]
    fn plain_identifiers_stay_readable() {
        let keys = Keys::new("ns:login:user:alice:5/m");
        assert_eq!(keys.state(), "ns:login:user:alice:5/m|s");
        assert_eq!(keys.window(42), "ns:login:user:alice:5/m|w42");
        assert_eq!(keys.route(), "ns:login:user:alice:5/m");
    }

    #[test]
    fn awkward_identifiers_are_hashed_into_valid_keys() {
        let long = format!("ns:k:user:{}:5/m", "x".repeat(300));
        let at_limit = "y".repeat(MAX_PLAIN);
        for id in [
            long.as_str(),
            "ns:k:user:a b:5/m",
            "ns:k:user:a\nb:5/m",
            "ns:k:user:ünï:5/m",
            "a|w1",
            "#abc",
            "",
            at_limit.as_str(),
        ] {
            let keys = Keys::new(id);
            for key in [keys.state(), keys.meta(), keys.window(u64::MAX)] {
                assert!(valid(&key), "{key:?} for {id:?}");
            }
        }
        assert!(Keys::new(&long).route().starts_with('#'));
        assert_eq!(Keys::new(&at_limit).route(), at_limit);
        let over = "y".repeat(MAX_PLAIN + 1);
        assert_ne!(Keys::new(&over).route(), over);
    }

    /// A window's keys are written as [`Keys::window`] names them, and a reply's key is found
    /// only if it is exactly one of them, at or after where the search starts.
    #[test]
    fn window_keys_write_and_find_exactly_their_own() {
        let keys = Keys::new("ns:u:alice:5/m");
        let window = keys.windows(9, 11);
        let mut out = Vec::new();
        for i in 0..window.count() {
            window.write(i, &mut out);
            out.push(b' ');
        }
        assert_eq!(
            out,
            b"ns:u:alice:5/m|w9 ns:u:alice:5/m|w10 ns:u:alice:5/m|w11 "
        );
        assert_eq!(window.name(1), "ns:u:alice:5/m|w10");
        assert_eq!(window.find(0, "ns:u:alice:5/m|w10"), Some(1));
        assert_eq!(window.find(2, "ns:u:alice:5/m|w10"), None, "before `from`");
        assert_eq!(window.find(0, "ns:u:alice:5/m|w11"), Some(2));
        for other in [
            "ns:u:alice:5/m|w8",
            "ns:u:alice:5/m|w12",
            "ns:u:alice:5/m|w010",
            "ns:u:alice:5/m|w",
            "ns:u:alice:5/m|w+9",
            "ns:u:alice:5/m|s",
            "ns:u:alice:5/m|m",
            "ns:u:bob:5/m|w10",
            "ns:u:alice:5/mm|w10",
        ] {
            assert_eq!(window.find(0, other), None, "{other}");
        }
        assert_eq!(keys.windows(0, 0).find(0, "ns:u:alice:5/m|w0"), Some(0));
    }

    #[test]
    fn no_two_identifiers_share_a_key() {
        let ids = ["a", "a|s", "a|w1", "#a", "a b", "a  b", "b"];
        let mut seen = std::collections::HashSet::new();
        for id in ids {
            let keys = Keys::new(id);
            for key in [keys.state(), keys.meta(), keys.window(1), keys.window(11)] {
                assert!(seen.insert(key.clone()), "{key} twice");
            }
        }
    }
}
