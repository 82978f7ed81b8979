//! GCRA states as bare atomic words, keyed by the identifier's bytes held in the slot itself.
//!
//! Identifiers as policies form them (`sluice:api:user:00001234:100/m`, 30 bytes) are longer
//! than the 24 bytes a `String`-sized key can hold inline, and a key on the heap costs an
//! allocation per new identifier and a second cache miss per hit (the slot, then the bytes).
//! So identifiers are sorted by length into tables whose slots hold them whole: up to 24,
//! 32 and 40 bytes, in slots of 32, 40 and 48 bytes with the state word. An identifier is
//! written into a fixed-size array once per hit and compared as one, without a call to
//! `memcmp`. Only identifiers longer than 40 bytes (a hashed selector value, a UUID) keep
//! their bytes on the heap, as exact-length boxes.
//!
//! Why these sizes: against governor's keyed limiter (a 32-byte slot, `String` and state
//! word, plus the key's heap copy), a slot of `N + 8` bytes holds an identifier of up to `N`
//! bytes in no more memory as long as the slot's extra bytes over 32, divided by the table's
//! load factor (7/16 to 7/8 over a doubling cycle), stay below the identifier's own length.
//! That holds at every load up to 32 bytes; from 33 to 40 bytes it holds but just after a
//! table doubles, where a 33-byte identifier costs up to 4 bytes more than governor's key
//! (and still less resident memory: the allocator adds a header and rounding to every heap
//! copy). Wider slots would cost more than a heap copy.

use std::sync::atomic::{AtomicU64, Ordering};

use hashbrown::HashTable;

/// An identifier of at most `8 * W` bytes (`W` ≤ 7), held whole in `W` little-endian words:
/// its bytes, zeros, and when shorter than `8 * W`, a length marker (`0xC0 | len`) in the
/// last byte. The last byte of a string of exactly `8 * W` bytes is never `0xC0` or above
/// (no UTF-8 sequence ends so), so two keys are equal exactly when the identifiers are.
/// Words, not bytes: building and comparing one is a few register moves, not calls to
/// `memset` and `memcmp`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Inline<const W: usize>([u64; W]);

impl<const W: usize> Inline<W> {
    const BYTES: usize = 8 * W;

    /// `id` held inline, if it fits.
    #[inline]
    fn new(id: &str) -> Option<Inline<W>> {
        const { assert!(W <= 7, "the length marker holds lengths below 64") };
        let bytes = id.as_bytes();
        if bytes.len() > Self::BYTES {
            return None;
        }
        let mut words = [0u64; W];
        let whole = bytes.len() / 8;
        // A loop of constant length, unrolled into loads (as a slice copy it calls `memcpy`).
        for (i, word) in words.iter_mut().enumerate() {
            if let Some(chunk) = bytes.get(8 * i..).and_then(<[u8]>::first_chunk::<8>) {
                *word = u64::from_le_bytes(*chunk);
            }
        }
        let rest = bytes.len() % 8;
        if rest > 0 {
            words[whole] = match bytes.last_chunk::<8>() {
                // The last eight bytes, shifted so the tail's come first: one load.
                Some(last) => u64::from_le_bytes(*last) >> (8 * (8 - rest)),
                None => bytes
                    .iter()
                    .rev()
                    .fold(0, |word, &b| (word << 8) | u64::from(b)),
            };
        }
        if bytes.len() < Self::BYTES {
            words[W - 1] |= u64::from(0xC0 | bytes.len() as u8) << 56;
        }
        Some(Inline(words))
    }

    /// Word by word without branching (`==` on the arrays calls `memcmp`).
    #[inline]
    fn matches(&self, other: &Inline<W>) -> bool {
        self.0
            .iter()
            .zip(&other.0)
            .fold(0, |differ, (a, b)| differ | (a ^ b))
            == 0
    }
}

/// Identifiers longer than the widest inline table.
type Boxed = Box<str>;

/// An identifier as the tables look it up: written once into the key of its length class.
#[derive(Clone, Copy)]
pub(crate) enum Probe<'a> {
    Short(Inline<3>),
    Medium(Inline<4>),
    Long(Inline<5>),
    Boxed(&'a str),
}

impl<'a> Probe<'a> {
    #[inline]
    pub(crate) fn new(id: &'a str) -> Probe<'a> {
        // Each class's `new` tests the length again: a compare the optimiser folds.
        if let Some(key) = Inline::new(id) {
            Probe::Short(key)
        } else if let Some(key) = Inline::new(id) {
            Probe::Medium(key)
        } else if let Some(key) = Inline::new(id) {
            Probe::Long(key)
        } else {
            Probe::Boxed(id)
        }
    }
}

/// Hashes identifiers: an inline key by folding its words two at a time (one 128-bit
/// multiply per pair, as foldhash does, with seeds random per store), a longer identifier
/// by foldhash over its bytes. Either way from what a table holds, so a growing table
/// rehashes without rebuilding a key. Like foldhash's fast hasher, this spreads keys well
/// but is no defence against an attacker who can learn the seeds; the bound on identifiers
/// (and its eviction) is what limits the damage of a flood.
pub(crate) struct KeyHasher {
    seeds: [u64; 2],
    bytes: foldhash::fast::RandomState,
}

/// foldhash's multiply-and-fold: the high and low halves of the 128-bit product, xored.
#[inline]
fn folded_multiply(a: u64, b: u64) -> u64 {
    let full = u128::from(a) * u128::from(b);
    (full as u64) ^ ((full >> 64) as u64)
}

impl KeyHasher {
    pub(crate) fn new() -> KeyHasher {
        use std::hash::BuildHasher;
        let bytes = foldhash::fast::RandomState::default();
        KeyHasher {
            // Random per store, as foldhash's own seed is.
            seeds: [bytes.hash_one(1u8), bytes.hash_one(2u8)],
            bytes,
        }
    }

    /// Each pair of words is multiplied together, each offset by a seed and the first by the
    /// hash so far: the chain of dependent multiplies is half the key's length.
    #[inline]
    fn inline<const W: usize>(&self, key: &Inline<W>) -> u64 {
        let [s0, s1] = self.seeds;
        key.0.chunks(2).fold(s0, |h, pair| {
            let second = pair.get(1).copied().unwrap_or(0);
            folded_multiply(pair[0] ^ h, second ^ s1)
        })
    }

    #[inline]
    fn boxed(&self, id: &str) -> u64 {
        use std::hash::BuildHasher;
        self.bytes.hash_one(id.as_bytes())
    }

    #[inline]
    pub(crate) fn probe(&self, probe: &Probe<'_>) -> u64 {
        match probe {
            Probe::Short(key) => self.inline(key),
            Probe::Medium(key) => self.inline(key),
            Probe::Long(key) => self.inline(key),
            Probe::Boxed(id) => self.boxed(id),
        }
    }
}

/// A key type the tables hold: its hash.
trait Key {
    fn hash_with(&self, hasher: &KeyHasher) -> u64;
}

impl<const W: usize> Key for Inline<W> {
    fn hash_with(&self, hasher: &KeyHasher) -> u64 {
        hasher.inline(self)
    }
}

impl Key for Boxed {
    fn hash_with(&self, hasher: &KeyHasher) -> u64 {
        hasher.boxed(self)
    }
}

/// The GCRA words of one shard, in one table per identifier length class.
#[derive(Default)]
pub(crate) struct Words {
    short: HashTable<(Inline<3>, AtomicU64)>,
    medium: HashTable<(Inline<4>, AtomicU64)>,
    long: HashTable<(Inline<5>, AtomicU64)>,
    boxed: HashTable<(Boxed, AtomicU64)>,
}

/// Calls `$body` once per table, with `$table` bound to it.
macro_rules! each_table {
    ($self:expr, |$table:ident| $body:expr) => {{
        {
            let $table = &mut $self.short;
            $body
        }
        {
            let $table = &mut $self.medium;
            $body
        }
        {
            let $table = &mut $self.long;
            $body
        }
        {
            let $table = &mut $self.boxed;
            $body
        }
    }};
}

fn find<K>(
    table: &HashTable<(K, AtomicU64)>,
    hash: u64,
    matches: impl Fn(&K) -> bool,
) -> Option<&AtomicU64> {
    table.find(hash, |(k, _)| matches(k)).map(|(_, w)| w)
}

fn remove<K>(
    table: &mut HashTable<(K, AtomicU64)>,
    hash: u64,
    matches: impl Fn(&K) -> bool,
) -> bool {
    table
        .find_entry(hash, |(k, _)| matches(k))
        .map(|e| e.remove())
        .is_ok()
}

fn insert<K: Key>(
    table: &mut HashTable<(K, AtomicU64)>,
    hash: u64,
    key: K,
    tat: u64,
    hasher: &KeyHasher,
) {
    table.insert_unique(hash, (key, AtomicU64::new(tat)), |(k, _)| {
        k.hash_with(hasher)
    });
}

impl Words {
    pub(crate) fn len(&self) -> usize {
        self.short.len() + self.medium.len() + self.long.len() + self.boxed.len()
    }

    /// The state word of `probe`, whose hash is `hash`.
    #[inline]
    pub(crate) fn get(&self, hash: u64, probe: &Probe<'_>) -> Option<&AtomicU64> {
        match probe {
            Probe::Short(key) => find(&self.short, hash, |k| k.matches(key)),
            Probe::Medium(key) => find(&self.medium, hash, |k| k.matches(key)),
            Probe::Long(key) => find(&self.long, hash, |k| k.matches(key)),
            Probe::Boxed(id) => find(&self.boxed, hash, |k| &**k == *id),
        }
    }

    /// Adds `probe` (absent) with the word `tat`.
    pub(crate) fn insert(&mut self, hash: u64, probe: &Probe<'_>, tat: u64, hasher: &KeyHasher) {
        match *probe {
            Probe::Short(key) => insert(&mut self.short, hash, key, tat, hasher),
            Probe::Medium(key) => insert(&mut self.medium, hash, key, tat, hasher),
            Probe::Long(key) => insert(&mut self.long, hash, key, tat, hasher),
            Probe::Boxed(id) => insert(&mut self.boxed, hash, Box::from(id), tat, hasher),
        }
    }

    /// Removes `probe`. Returns whether it was present.
    pub(crate) fn remove(&mut self, hash: u64, probe: &Probe<'_>) -> bool {
        match probe {
            Probe::Short(key) => remove(&mut self.short, hash, |k| k.matches(key)),
            Probe::Medium(key) => remove(&mut self.medium, hash, |k| k.matches(key)),
            Probe::Long(key) => remove(&mut self.long, hash, |k| k.matches(key)),
            Probe::Boxed(id) => remove(&mut self.boxed, hash, |k| &**k == *id),
        }
    }

    /// Keeps the words for which `keep(word)` holds.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(u64) -> bool) {
        each_table!(self, |table| table
            .retain(|(_, w)| keep(w.load(Ordering::Relaxed))));
    }

    /// Every word (each table's in turn).
    pub(crate) fn values(&self) -> impl Iterator<Item = u64> + '_ {
        fn load<K>((_, w): &(K, AtomicU64)) -> u64 {
            w.load(Ordering::Relaxed)
        }
        self.short
            .iter()
            .map(load)
            .chain(self.medium.iter().map(load))
            .chain(self.long.iter().map(load))
            .chain(self.boxed.iter().map(load))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl<const W: usize> Inline<W> {
        /// The identifier's bytes back from the words.
        fn bytes(&self) -> Vec<u8> {
            let mut bytes: Vec<u8> = self.0.iter().flat_map(|w| w.to_le_bytes()).collect();
            let last = bytes[Self::BYTES - 1];
            if last >= 0xC0 {
                bytes.truncate(usize::from(last & 0x3F));
            }
            bytes
        }
    }

    #[test]
    fn inline_keys_are_equal_exactly_when_identifiers_are() {
        let ids = [
            "",
            "a",
            "sluice:api:user:00001234:100/m",
            "sluice:api:user:00001234:100/h",
            "sluice:api:user:00001234:100/",
            // Exactly 32 bytes, and 31 bytes then a byte that could look like a marker.
            "sluice:api:user:000012345:100/mm",
            "sluice:api:user:000012345:100/m\u{0}",
            "sluice:api:user:0000123:100/m\u{e0}",
            "abcdefg",
            "abcdefh",
            "abcdefgh",
            "abcdefghi",
            "abcdefghj",
        ];
        for a in ids {
            for b in ids {
                if let (Some(x), Some(y)) = (Inline::<4>::new(a), Inline::<4>::new(b)) {
                    assert_eq!(x.matches(&y), a == b, "{a:?} {b:?}");
                    assert_eq!(x.bytes(), a.as_bytes());
                }
            }
        }
        assert!(Inline::<4>::new(&"x".repeat(33)).is_none());
        assert_eq!(Inline::<3>::new(&"x".repeat(24)).unwrap().bytes().len(), 24);
        assert_eq!(Inline::<5>::new("abc").unwrap().bytes(), b"abc");
    }

    #[test]
    fn every_length_class_finds_its_own_and_only_its_own() {
        let hasher = KeyHasher::new();
        let mut words = Words::default();
        let ids: Vec<String> = (1..=80).map(|len| "i".repeat(len)).collect();
        fn at<'a>(hasher: &KeyHasher, id: &'a str) -> (u64, Probe<'a>) {
            (hasher.probe(&Probe::new(id)), Probe::new(id))
        }
        for (tat, id) in ids.iter().enumerate() {
            let (hash, probe) = at(&hasher, id);
            words.insert(hash, &probe, tat as u64, &hasher);
        }
        assert_eq!(words.len(), ids.len());
        for (tat, id) in ids.iter().enumerate() {
            let (hash, probe) = at(&hasher, id);
            let word = words.get(hash, &probe).expect("held");
            assert_eq!(word.load(Ordering::Relaxed), tat as u64, "{}", id.len());
        }
        let (hash, probe) = at(&hasher, &ids[30]);
        assert!(words.remove(hash, &probe));
        assert!(!words.remove(hash, &probe));
        assert!(words.get(hash, &probe).is_none());
        words.retain(|tat| tat % 2 == 0);
        assert_eq!(words.len(), words.values().filter(|t| t % 2 == 0).count());
        assert_eq!(words.len(), 39);
    }
}
