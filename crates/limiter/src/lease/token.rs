//! Leases and reservations as text: the tokens [`Lease::token`](super::Lease::token) and
//! [`Reservation::token`](super::Reservation::token) write and
//! [`Limiter::lease`](crate::Limiter::lease) and
//! [`Limiter::reservation`](crate::Limiter::reservation) read, so that another process on
//! the same store can release, renew or settle what this one took.

use super::LeaseId;
use crate::limiter::Error;

/// Why a token does not name a lease or reservation of a policy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TokenError {
    /// Not a token [`Lease::token`](super::Lease::token) or
    /// [`Reservation::token`](super::Reservation::token) writes. `token` is cut to
    /// 32 characters.
    #[error("`{token}` is not a {kind} token: {reason}")]
    Malformed {
        kind: &'static str,
        token: String,
        reason: &'static str,
    },
    /// A well-formed token whose selectors are not those of the policy named with it: it
    /// was taken under another policy, and names nothing under this one.
    #[error("this {kind} token was not taken under policy `{policy}`")]
    OtherPolicy { kind: &'static str, policy: String },
    /// The policy cannot hold it: unknown, or of the other kind.
    #[error(transparent)]
    Limiter(#[from] Error),
}

/// The selector values a token carries: `(name, value)` pairs sorted by name, each string
/// preceded by its length in LEB128 (written in base64url without padding in the token).
/// Kept raw: an acquire pays for a token only when asked for one. A dropped lease's bytes
/// are kept for the next acquire on its thread (see `spare.rs`), so writing them allocates
/// nothing once warm.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TokenSelectors(Vec<u8>);

impl TokenSelectors {
    /// No values.
    pub(crate) const EMPTY: TokenSelectors = TokenSelectors(Vec::new());

    /// The values of `names` (sorted, each once) in `selectors`; a name `selectors` lacks is
    /// left out (callers made identifiers of them all, so none is).
    pub(crate) fn new<'a>(
        names: impl IntoIterator<Item = &'a str>,
        selectors: &crate::Selectors<'_>,
    ) -> TokenSelectors {
        let mut raw = TokenSelectors::default();
        raw.write(names, selectors);
        raw
    }

    /// [`TokenSelectors::new`] in the room these bytes already have.
    pub(crate) fn write<'a>(
        &mut self,
        names: impl IntoIterator<Item = &'a str>,
        selectors: &crate::Selectors<'_>,
    ) {
        self.0.clear();
        for name in names {
            if let Some((_, value)) = selectors.iter().find(|(n, _)| *n == name) {
                push_text(&mut self.0, name);
                push_text(&mut self.0, value);
            }
        }
    }

    pub(crate) fn capacity(&self) -> usize {
        self.0.capacity()
    }
}

/// Appends `text`'s length in LEB128, then `text`.
fn push_text(out: &mut Vec<u8>, text: &str) {
    let mut n = text.len();
    while n >= 0x80 {
        out.push((n as u8 & 0x7f) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
    out.extend_from_slice(text.as_bytes());
}

/// A lease token taken apart: the id and the selector pairs.
pub(crate) fn parse_lease_token(
    token: &str,
) -> Result<(LeaseId, Vec<(String, String)>), TokenError> {
    let bad = |reason| malformed("lease", token, reason);
    let (id, selectors) = token.split_once('.').unwrap_or((token, ""));
    let id = id
        .parse::<LeaseId>()
        .map_err(|_| bad("it must begin with 16 hex digits"))?;
    Ok((id, parse_selectors(selectors).map_err(bad)?))
}

/// A reservation token taken apart: taken_at, the estimate and the selector pairs.
#[allow(clippy::type_complexity)]
pub(crate) fn parse_reservation_token(
    token: &str,
) -> Result<(u64, u64, Vec<(String, String)>), TokenError> {
    let bad = |reason| malformed("reservation", token, reason);
    let mut parts = token.splitn(3, '.');
    let mut number = || {
        let text = parts.next().unwrap_or("");
        text.parse::<LeaseId>()
            .map(|n| n.0)
            .map_err(|_| bad("it must begin with two groups of 16 hex digits"))
    };
    let (taken_at, estimate) = (number()?, number()?);
    let selectors = parse_selectors(parts.next().unwrap_or("")).map_err(bad)?;
    Ok((taken_at, estimate, selectors))
}

/// Checks that `pairs` name exactly `names` (sorted, each once), as a token taken under
/// this policy does, and lends them as the limiter takes selectors.
pub(crate) fn token_selectors<'a>(
    kind: &'static str,
    policy: &str,
    names: &[&str],
    pairs: &'a [(String, String)],
) -> Result<Vec<(&'a str, &'a str)>, TokenError> {
    let same = pairs.len() == names.len() && pairs.iter().zip(names).all(|((n, _), m)| n == m);
    if !same {
        return Err(TokenError::OtherPolicy {
            kind,
            policy: policy.to_owned(),
        });
    }
    Ok(pairs
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .collect())
}

fn malformed(kind: &'static str, token: &str, reason: &'static str) -> TokenError {
    TokenError::Malformed {
        kind,
        token: token.chars().take(32).collect(),
        reason,
    }
}

pub(crate) fn hex16(n: u64) -> String {
    format!("{n:016x}")
}

/// `parts` joined by `.`, then the selectors after one more `.` when there are any.
pub(crate) fn join_token(parts: &[&str], selectors: &TokenSelectors) -> String {
    let mut out = parts.join(".");
    if !selectors.0.is_empty() {
        out.push('.');
        out.push_str(&base64url(&selectors.0));
    }
    out
}

fn parse_selectors(text: &str) -> Result<Vec<(String, String)>, &'static str> {
    let raw = from_base64url(text).ok_or("its selectors are not base64url")?;
    let mut rest = &raw[..];
    let mut pairs: Vec<(String, String)> = Vec::new();
    while !rest.is_empty() {
        let mut pair = [String::new(), String::new()];
        for slot in &mut pair {
            let len = take_length(&mut rest).ok_or("its selectors are cut short")?;
            if len > rest.len() {
                return Err("its selectors are cut short");
            }
            let (text, after) = rest.split_at(len);
            *slot = String::from_utf8(text.to_vec()).map_err(|_| "a selector is not UTF-8")?;
            rest = after;
        }
        let [name, value] = pair;
        if pairs.last().is_some_and(|(last, _)| *last >= name) {
            return Err("its selector names are not sorted and distinct");
        }
        pairs.push((name, value));
    }
    Ok(pairs)
}

fn take_length(rest: &mut &[u8]) -> Option<usize> {
    let mut n: usize = 0;
    for shift in (0..28).step_by(7) {
        let (&byte, after) = rest.split_first()?;
        *rest = after;
        n |= usize::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(n);
        }
    }
    None // longer than any selector could be
}

const BASE64URL: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

fn base64url(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..=chunk.len() {
            out.push(BASE64URL[(n >> (18 - 6 * i)) as usize & 63] as char);
        }
    }
    out
}

/// Base64url without padding, canonical only (unused bits zero), or `None`.
fn from_base64url(text: &str) -> Option<Vec<u8>> {
    if text.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(text.len() / 4 * 3 + 2);
    for chunk in text.as_bytes().chunks(4) {
        let mut n = 0u32;
        for (i, c) in chunk.iter().enumerate() {
            let digit = BASE64URL.iter().position(|d| d == c)? as u32;
            n |= digit << (18 - 6 * i);
        }
        let bytes = chunk.len() - 1;
        if n & (0xff_ffff >> (8 * bytes)) != 0 {
            return None; // bits beyond the last byte: not what `base64url` writes
        }
        out.extend((0..bytes).map(|i| (n >> (16 - 8 * i)) as u8));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::Released;

    #[test]
    fn base64url_round_trips_every_length() {
        for len in 0..40 {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 37 + 11) as u8).collect();
            let text = base64url(&bytes);
            assert!(!text.contains('='));
            assert_eq!(from_base64url(&text).as_deref(), Some(&bytes[..]), "{text}");
        }
        assert_eq!(base64url(b"\xfb\xff"), "-_8");
        assert_eq!(from_base64url("-_9"), None); // unused bits set
        assert_eq!(from_base64url("A"), None);
        assert_eq!(from_base64url("ab+/"), None);
    }

    #[test]
    fn lease_tokens_round_trip_and_refuse_garbage() {
        let selectors = TokenSelectors::new(["ip", "user"], &[("user", "alice:é"), ("ip", "1")]);
        let token = join_token(&["00000000000000ff"], &selectors);
        let (id, pairs) = parse_lease_token(&token).unwrap();
        assert_eq!(id, LeaseId(255));
        let expected = [("ip".into(), "1".into()), ("user".into(), "alice:é".into())];
        assert_eq!(pairs, expected);
        assert_eq!(parse_lease_token("00000000000000ff").unwrap().1, []);
        for garbage in [
            "",
            "xyz",
            "00000000000000ff.!!",
            "00000000000000ff.AQ",
            "0000000000000ff.AA",
            "+0000000000000ff",
        ] {
            let error = parse_lease_token(garbage).unwrap_err();
            assert!(matches!(error, TokenError::Malformed { .. }), "{garbage}");
        }
        // Names out of order are refused: a token never carries them so.
        let raw = [1, b'u', 1, b'a', 1, b'i', 1, b'b'];
        assert!(parse_lease_token(&format!("00000000000000ff.{}", base64url(&raw))).is_err());
    }

    #[test]
    fn reservation_tokens_round_trip() {
        let selectors = TokenSelectors::new(["user"], &[("user", "bob")]);
        let token = join_token(&[&hex16(7), &hex16(4000)], &selectors);
        let (taken_at, estimate, pairs) = parse_reservation_token(&token).unwrap();
        assert_eq!((taken_at, estimate), (7, 4000));
        assert_eq!(pairs, [("user".to_owned(), "bob".to_owned())]);
        assert!(parse_reservation_token("0000000000000007").is_err());
        assert!(parse_reservation_token("0000000000000007.zz").is_err());
    }

    #[tokio::test]
    async fn tokens_rebuild_only_under_their_policy() {
        use crate::{Limiter, MemoryStore, Policy};
        let limiter = Limiter::builder(MemoryStore::new())
            .policy(Policy::new("a", "user:1 concurrent").unwrap())
            .policy(Policy::new("b", "user:1 concurrent").unwrap())
            .policy(Policy::new("c", "ip:1 concurrent").unwrap())
            .policy(Policy::new("tokens", "user:100/m").unwrap())
            .build()
            .unwrap();
        let alice = &[("user", "alice")];
        let lease = limiter.acquire("a", alice).await.unwrap().lease.unwrap();
        let token = lease.forget().to_string();
        // The bare id names no selectors: not a's lease.
        assert!(matches!(
            limiter.lease("a", &token),
            Err(TokenError::OtherPolicy { .. })
        ));
        let lease = limiter.acquire("b", alice).await.unwrap().lease.unwrap();
        let token = lease.token();
        lease.forget();
        assert!(matches!(
            limiter.lease("c", &token),
            Err(TokenError::OtherPolicy { .. })
        ));
        assert!(matches!(
            limiter.lease("tokens", &token),
            Err(TokenError::Limiter(Error::NoConcurrencyLeaf(_)))
        ));
        // The same selector names under another policy: another lease, not held.
        let elsewhere = limiter.lease("a", &token).unwrap();
        assert_eq!(elsewhere.release().await.unwrap(), Released::NotHeld);
        assert!(limiter.acquire("b", alice).await.unwrap().lease.is_none());
        // Dropping a rebuilt lease releases nothing; releasing it does.
        drop(limiter.lease("b", &token).unwrap());
        assert!(limiter.acquire("b", alice).await.unwrap().lease.is_none());
        let rebuilt = limiter.lease("b", &token).unwrap();
        assert_eq!(rebuilt.token(), token);
        assert_eq!(rebuilt.release().await.unwrap(), Released::Released);
        assert!(limiter.acquire("b", alice).await.unwrap().lease.is_some());

        let reserved = limiter.reserve("tokens", alice, 40).await.unwrap();
        let token = reserved.reservation.unwrap().token();
        let reservation = limiter.reservation("tokens", &token).unwrap();
        assert_eq!(reservation.estimate(), 40);
        assert_eq!(reservation.token(), token);
        reservation.settle(10).await.unwrap();
        let peek = limiter.peek("tokens", alice, 1).await.unwrap();
        assert_eq!(peek.decision.remaining, 89);
        assert!(matches!(
            limiter.reservation("b", &token),
            Err(TokenError::Limiter(Error::ReserveConcurrency(_)))
        ));
    }
}
