//! What identifies a heavy hitter: the selector values a policy counts by, hashed without
//! allocating on every hit, and written as `name=value,name=value` only when an item enters
//! a sketch. Values are chosen by clients, so each is cut to [`MAX_VALUE`] bytes and the
//! label to [`MAX_LABEL`]: a sketch's memory is bounded whatever they send.

use std::hash::BuildHasher;

use sluice_limiter::Selectors;
use sluice_limiter::policy::CompiledPolicy;

/// Longest selector name or value kept, in bytes (cut on a character boundary).
pub const MAX_VALUE: usize = 128;
/// Longest label kept, in bytes.
pub const MAX_LABEL: usize = 256;

/// `text` cut to at most `max` bytes, on a character boundary.
pub(crate) fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// The pairs of `selectors` that `policy` counts by: names its leaves use, the first pair
/// of each name (as the limiter reads them), cut to [`MAX_VALUE`]. Requests may carry
/// selectors the policy ignores; they would split one client into many items.
pub(crate) fn counted<'a>(
    policy: &'a CompiledPolicy,
    selectors: &'a Selectors<'a>,
) -> impl Iterator<Item = (&'a str, &'a str)> + Clone {
    selectors
        .iter()
        .enumerate()
        .filter(move |(i, (name, _))| {
            uses(policy, name) && !selectors[..*i].iter().any(|(other, _)| other == name)
        })
        .map(|(_, (name, value))| (cut(name, MAX_VALUE), cut(value, MAX_VALUE)))
}

fn uses(policy: &CompiledPolicy, name: &str) -> bool {
    policy
        .leaves
        .iter()
        .any(|l| l.leaf.selector.names().iter().any(|n| n == name))
}

/// One hash for a set of pairs, whatever their order (pairs are hashed alone and summed),
/// so `ip, user` and `user, ip` are one item without sorting on the hot path.
pub(crate) fn hash<'a>(
    hasher: &impl BuildHasher,
    pairs: impl Iterator<Item = (&'a str, &'a str)>,
) -> u64 {
    pairs
        .map(|pair| hasher.hash_one(pair))
        .fold(0, u64::wrapping_add)
}

/// Appends the pairs to `out` as `name=value` by name, joined by `,`, cut to
/// [`MAX_LABEL`]. Sorts by picking the next name each time: no allocation, and the pairs
/// are few (one per selector name the policy uses).
pub(crate) fn write<'a>(out: &mut String, pairs: impl Iterator<Item = (&'a str, &'a str)> + Clone) {
    let start = out.len();
    let mut last: Option<&str> = None;
    while let Some((name, value)) = pairs
        .clone()
        .filter(|(name, _)| last.is_none_or(|l| *name > l))
        .min_by_key(|(name, _)| *name)
    {
        if out.len() > start {
            out.push(',');
        }
        out.push_str(name);
        out.push('=');
        out.push_str(value);
        last = Some(name);
        if out.len() - start > MAX_LABEL {
            break;
        }
    }
    let keep = cut(&out[start..], MAX_LABEL).len();
    out.truncate(start + keep);
}

#[cfg(test)]
mod tests {
    use sluice_limiter::Policy;

    use super::*;

    fn compiled(rule: &str) -> CompiledPolicy {
        CompiledPolicy::compile(Policy::new("p", rule).unwrap()).unwrap()
    }

    fn label(policy: &CompiledPolicy, selectors: &Selectors) -> String {
        let mut out = String::new();
        write(&mut out, counted(policy, selectors));
        out
    }

    #[test]
    fn counts_by_the_policys_names_in_one_order() {
        let policy = compiled("or(ip+user:5/m, user:100/h)");
        let hasher = foldhash::quality::RandomState::default();
        let a: &Selectors = &[("user", "alice"), ("trace", "x1"), ("ip", "203.0.113.9")];
        let b: &Selectors = &[("ip", "203.0.113.9"), ("user", "alice"), ("trace", "x2")];
        assert_eq!(label(&policy, a), "ip=203.0.113.9,user=alice");
        assert_eq!(label(&policy, b), label(&policy, a));
        assert_eq!(
            hash(&hasher, counted(&policy, a)),
            hash(&hasher, counted(&policy, b))
        );
        let c: &Selectors = &[("ip", "203.0.113.9"), ("user", "bob")];
        assert_ne!(
            hash(&hasher, counted(&policy, a)),
            hash(&hasher, counted(&policy, c))
        );
        // A name given twice counts by its first value, as the limiter does.
        let twice: &Selectors = &[("user", "alice"), ("ip", "1"), ("user", "mallory")];
        assert_eq!(label(&policy, twice), "ip=1,user=alice");
        assert_eq!(label(&compiled("10/s"), a), "");
    }

    #[test]
    fn long_values_are_cut_on_a_character_boundary() {
        let policy = compiled("user:5/m");
        let long = "é".repeat(100); // 200 bytes
        let text = label(&policy, &[("user", long.as_str())]);
        assert_eq!(text, format!("user={}", "é".repeat(64)));
        let policy = compiled("a+b+c:5/m");
        let v = "x".repeat(1_000);
        let text = label(&policy, &[("a", &v), ("b", &v), ("c", &v)]);
        assert_eq!(text.len(), MAX_LABEL);
        assert!(text.starts_with(&format!("a={},b=", "x".repeat(128))));
        assert_eq!(cut("aé", 2), "a");
    }
}
