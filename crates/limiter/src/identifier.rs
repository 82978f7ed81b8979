//! Identifiers: `namespace:key:selector:value:leaf`, the name of one counter.
//!
//! Selector values are written as they are when short and plain. A value that is long
//! (over 64 bytes), empty, or holds a character that means something in an identifier
//! (`:`, `+`, `{`, `}`, `#`, whitespace or a control character) is replaced by `#` and the
//! first 128 bits of its SHA-256, in hex: identifiers stay short, unambiguous, and free of
//! sensitive values such as long tokens. The hash is stable, so every process sharing a
//! store names a counter alike.

use std::fmt::Write;

use sha2::{Digest, Sha256};

/// Longest selector value kept as it is.
pub const MAX_PLAIN_VALUE: usize = 64;

/// Appends `value` to `out` as it appears in an identifier.
pub fn push_value(out: &mut String, value: &str) {
    let plain = !value.is_empty()
        && value.len() <= MAX_PLAIN_VALUE
        && !value.chars().any(|c| {
            matches!(c, ':' | '+' | '{' | '}' | '#') || c.is_whitespace() || c.is_control()
        });
    if plain {
        out.push_str(value);
    } else {
        push_hashed(out, value);
    }
}

/// Appends `#` and the hex of the first 16 bytes of SHA-256(`value`).
pub fn push_hashed(out: &mut String, value: &str) {
    let digest = Sha256::digest(value.as_bytes());
    out.push('#');
    for byte in &digest[..16] {
        let _ = write!(out, "{byte:02x}");
    }
}
