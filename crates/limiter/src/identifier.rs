//! Identifiers: `namespace:key:selector:value:leaf`, the name of one counter, with its
//! routing group; how selector values are written into them; and the per-thread buffers a
//! check writes them into.
//!
//! Selector values are written as they are when short and plain. A value that is long
//! (over 64 bytes), empty, or holds a character that means something in an identifier
//! (`:`, `+`, `{`, `}`, `#`, whitespace or a control character) is replaced by `#` and the
//! first 128 bits of its SHA-256, in hex: identifiers stay short, unambiguous, and free of
//! sensitive values such as long tokens. The hash is stable, so every process sharing a
//! store names a counter alike.

use std::fmt::{self, Write};
use std::ops::{Deref, Range};

use sha2::{Digest, Sha256};

/// The name of one counter or penalty record (`namespace:key:selector:value:rate`), and its
/// *routing group*: the part of the name that says which identifiers must live together.
/// Identifiers of one hit with equal groups can be decided in one atomic step wherever a
/// store spreads its keys; a store maps the group to its own placement (the Redis store
/// makes it the key's `{hash tag}`; a store in one place ignores it).
///
/// Dereferences to the name.
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct Identifier {
    name: String,
    group: Range<usize>,
}

impl Identifier {
    /// An identifier that is its own group.
    pub fn new(name: impl Into<String>) -> Identifier {
        let name = name.into();
        let group = 0..name.len();
        Identifier { name, group }
    }

    /// The identifier `before + group + after`, routed by `group`.
    pub fn grouped(before: &str, group: &str, after: &str) -> Identifier {
        let name = format!("{before}{group}{after}");
        let group = before.len()..before.len() + group.len();
        Identifier { name, group }
    }

    pub fn as_str(&self) -> &str {
        &self.name
    }

    /// The routing group (a part of the name).
    pub fn group(&self) -> &str {
        &self.name[self.group.clone()]
    }

    /// The name split around its group: `(before, group, after)`.
    pub fn parts(&self) -> (&str, &str, &str) {
        let Range { start, end } = self.group;
        (
            &self.name[..start],
            &self.name[start..end],
            &self.name[end..],
        )
    }

    /// Empties the identifier for reuse, keeping its allocation.
    pub(crate) fn clear(&mut self) {
        self.name.clear();
        self.group = 0..0;
    }

    pub(crate) fn name_mut(&mut self) -> &mut String {
        &mut self.name
    }

    /// Routes by the bytes `group` of the name (whole characters: the limiter only marks
    /// spans it has just written).
    pub(crate) fn set_group(&mut self, group: Range<usize>) {
        debug_assert!(self.name.get(group.clone()).is_some(), "a span of the name");
        self.group = group;
    }

    pub(crate) fn capacity(&self) -> usize {
        self.name.capacity()
    }

    pub(crate) fn with_capacity(capacity: usize) -> Identifier {
        Identifier {
            name: String::with_capacity(capacity),
            group: 0..0,
        }
    }
}

impl Deref for Identifier {
    type Target = str;

    fn deref(&self) -> &str {
        &self.name
    }
}

impl AsRef<str> for Identifier {
    fn as_ref(&self) -> &str {
        &self.name
    }
}

impl PartialEq<str> for Identifier {
    fn eq(&self, other: &str) -> bool {
        self.name == other
    }
}

impl PartialEq<&str> for Identifier {
    fn eq(&self, other: &&str) -> bool {
        self.name == *other
    }
}

impl fmt::Display for Identifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

impl fmt::Debug for Identifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (before, group, after) = self.parts();
        write!(f, "\"{before}[{group}]{after}\"")
    }
}

/// Longest selector value kept as it is.
pub(crate) const MAX_PLAIN_VALUE: usize = 64;

/// Bytes a plain value may hold as they are: visible ASCII but the five that mean
/// something in an identifier.
const PLAIN: [bool; 256] = {
    let mut plain = [false; 256];
    let mut b = b'!';
    while b <= b'~' {
        plain[b as usize] = !matches!(b, b':' | b'+' | b'{' | b'}' | b'#');
        b += 1;
    }
    plain
};

/// `value` as identifiers hold it: as it is when short and plain, otherwise `#` and the
/// hex of 128 bits of its SHA-256, as in an [`Identifier`]. What a log of refusals
/// may show of a client's value without holding long tokens or sensitive text.
///
/// ```
/// assert_eq!(sluice_limiter::selector_value("203.0.113.9"), "203.0.113.9");
/// assert_eq!(sluice_limiter::selector_value("a b").len(), 33);
/// ```
pub fn selector_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len().min(MAX_PLAIN_VALUE + 1));
    push_value(&mut out, value);
    out
}

/// `a == b`, without a call to `memcmp` for strings of up to 16 bytes (a selector's name, a
/// user id, an address): a check compares its selector names and its value with what it
/// holds, and for such short strings the call costs more than the comparison. Measured with
/// callgrind on `vs_governor`'s `decision` path, the two comparisons cost about 100
/// instructions a check through `==`. Longer strings compare as `==` does.
#[inline(always)]
pub(crate) fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let n = a.len();
    if n != b.len() {
        return false;
    }
    // Two loads from each, one from the start and one from the end, overlapping when the
    // length is not twice the load's: every byte is covered, none read out of bounds.
    if let (Some(a0), Some(a1), Some(b0), Some(b1)) = (
        a.first_chunk::<8>(),
        a.last_chunk::<8>(),
        b.first_chunk::<8>(),
        b.last_chunk::<8>(),
    ) {
        if n <= 16 {
            let word = |c: &[u8; 8]| u64::from_le_bytes(*c);
            return (word(a0) ^ word(b0)) | (word(a1) ^ word(b1)) == 0;
        }
        return a == b;
    }
    if let (Some(a0), Some(a1), Some(b0), Some(b1)) = (
        a.first_chunk::<4>(),
        a.last_chunk::<4>(),
        b.first_chunk::<4>(),
        b.last_chunk::<4>(),
    ) {
        let word = |c: &[u8; 4]| u32::from_le_bytes(*c);
        return (word(a0) ^ word(b0)) | (word(a1) ^ word(b1)) == 0;
    }
    a.iter().zip(b).all(|(x, y)| x == y)
}

/// Appends `value` to `out` as it appears in an identifier.
pub(crate) fn push_value(out: &mut String, value: &str) {
    let plain = !value.is_empty()
        && value.len() <= MAX_PLAIN_VALUE
        // One table lookup per byte for the usual ASCII value; characters only when the
        // value holds more than ASCII.
        && (value.bytes().all(|b| PLAIN[b as usize])
            || !value.is_ascii()
                && !value.chars().any(|c| {
                    matches!(c, ':' | '+' | '{' | '}' | '#') || c.is_whitespace() || c.is_control()
                }));
    if plain {
        out.push_str(value);
    } else {
        push_hashed(out, value);
    }
}

/// Appends `#` and the hex of the first 16 bytes of SHA-256(`value`).
pub(crate) fn push_hashed(out: &mut String, value: &str) {
    let digest = Sha256::digest(value.as_bytes());
    out.push('#');
    for byte in &digest[..16] {
        let _ = write!(out, "{byte:02x}");
    }
}

/// The identifiers of one check, in strings reused from one check to the next on the same
/// thread: a check on a hot path allocates nothing for its identifiers once warm.
#[derive(Default)]
pub(crate) struct Identifiers {
    strings: Vec<Identifier>,
    used: usize,
}

/// Strings longer than this are not kept for reuse, nor more than this many of them.
const MAX_KEPT_CAPACITY: usize = 512;
const MAX_KEPT_STRINGS: usize = 16;

thread_local! {
    /// Plain identifiers, not `Identifiers`: putting one back must not run its `Drop` again.
    static SPARE: std::cell::Cell<Vec<Identifier>> = const { std::cell::Cell::new(Vec::new()) };
}

impl Identifiers {
    /// This thread's spare buffer, or a new one.
    pub(crate) fn take() -> Identifiers {
        let strings = SPARE.try_with(|spare| spare.take()).unwrap_or_default();
        Identifiers { strings, used: 0 }
    }

    /// A cleared identifier to write the next one into.
    pub(crate) fn next(&mut self) -> &mut Identifier {
        if self.used == self.strings.len() {
            self.strings.push(Identifier::with_capacity(64));
        }
        let id = &mut self.strings[self.used];
        id.clear();
        self.used += 1;
        id
    }

    pub(crate) fn as_slice(&self) -> &[Identifier] {
        &self.strings[..self.used]
    }

    /// Trades the written identifier `i` for `other`, whose room the next check reuses:
    /// how a lease keeps its identifiers without copying them.
    pub(crate) fn swap(&mut self, i: usize, other: &mut Identifier) {
        std::mem::swap(&mut self.strings[..self.used][i], other);
    }
}

impl Drop for Identifiers {
    fn drop(&mut self) {
        let mut strings = std::mem::take(&mut self.strings);
        if strings.is_empty() {
            return;
        }
        strings.truncate(MAX_KEPT_STRINGS);
        strings.retain(|s| s.capacity() <= MAX_KEPT_CAPACITY);
        // During thread teardown there is nowhere to keep them: they are freed.
        let _ = SPARE.try_with(|spare| spare.set(strings));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifier_buffers_are_reused_and_may_overlap() {
        let mut outer = Identifiers::take();
        outer.next().name_mut().push_str("a:1");
        {
            // A second check on the same thread while the first is alive (nested limiters).
            let mut inner = Identifiers::take();
            inner.next().name_mut().push_str("b:2");
            inner.next().name_mut().push_str("b:3");
            assert_eq!(inner.as_slice(), ["b:2", "b:3"]);
        }
        assert_eq!(outer.as_slice(), ["a:1"]);
        drop(outer);
        // The next check starts from cleared strings, whichever buffer it gets.
        let mut next = Identifiers::take();
        assert!(next.as_slice().is_empty());
        assert_eq!(next.next().as_str(), "");
    }

    /// `same` agrees with `==` on every pair of short strings that differ in one byte, at
    /// every length a branch of it covers, and on strings past 16 bytes.
    #[test]
    fn same_is_equality() {
        let base = "abcdefghijklmnopqrstuvwxyz0123";
        for n in 0..=base.len() {
            let a = &base[..n];
            // Equal text in another allocation.
            let copy: String = a.chars().collect();
            assert!(same(a, a) && same(a, &copy), "{a:?}");
            for i in 0..n {
                let mut b = a.as_bytes().to_vec();
                b[i] = b'_';
                let b = String::from_utf8(b).unwrap();
                assert!(!same(a, &b) && !same(&b, a), "{a:?} {b:?}");
            }
            if n > 0 {
                assert!(!same(a, &base[..n - 1]), "{a:?}");
            }
        }
        assert!(same("é", "é") && !same("é", "è"));
    }

    #[test]
    fn plain_and_hashed_values() {
        for (value, plain) in [
            ("alice", true),
            ("10.0.0.1", true),
            ("", false),
            ("a b", false),
            ("a:b", false),
            ("a\u{7f}", false),
            ("tab\there", false),
            ("é", true),
            ("no\u{a0}break", false),
            ("a+b", false),
            ("{a}", false),
            ("#a", false),
            ("é:", false),
            (&"x".repeat(MAX_PLAIN_VALUE), true),
            (&"x".repeat(MAX_PLAIN_VALUE + 1), false),
        ] {
            let mut out = String::new();
            push_value(&mut out, value);
            assert_eq!(out == value, plain, "{value:?} -> {out}");
        }
    }

    #[test]
    fn parts_and_groups() {
        let id = Identifier::grouped("ns:k:ip:", "10.0.0.1", ":5/m");
        assert_eq!(id.as_str(), "ns:k:ip:10.0.0.1:5/m");
        assert_eq!(id.group(), "10.0.0.1");
        assert_eq!(id.parts(), ("ns:k:ip:", "10.0.0.1", ":5/m"));
        assert_eq!(format!("{id:?}"), "\"ns:k:ip:[10.0.0.1]:5/m\"");
        let whole = Identifier::new("abc");
        assert_eq!(whole.group(), "abc");
        assert_eq!(whole, "abc");
    }
}
