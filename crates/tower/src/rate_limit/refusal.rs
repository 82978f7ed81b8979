//! A layer's refusal, pre-rendered: under a flood most requests are refused, so the 429 a
//! refused client gets must be the cheapest answer the server makes.
//!
//! Everything in the default problem+json body that does not change from one refusal to the
//! next (the policy's name, escaped; the title; the sentence of each reason) is written
//! once, when the layer is built. A refusal then copies a few slices and formats its four
//! or five numbers into a buffer of the exact size: no escaping, no `String` growing, no
//! policy name cloned. Its header fields go into the refused request's own header map,
//! emptied: hyper hands each connection's last response map back as the next request's, so
//! on a keep-alive connection the refusal allocates no map at all. A client refused again
//! with the same numbers (within the same second, on the same thread) gets the body and
//! `RateLimit` value of the last refusal again, shared. The bytes are those of
//! [`crate::denied::problem`] and [`PolicyFields::apply`] (tests compare the two across
//! reasons, waits and policies); anything else (a render hook, a gRPC request, a challenge,
//! the ceiling, the deny list) takes that general path.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response, StatusCode};
use sluice_core::{Decision, whole_seconds};

use crate::denied::{self, PROBLEM_JSON, Reason};
use crate::headers::{Headers, PolicyFields};

/// The fixed parts of one reason's body: `head` runs up to where the wait goes in the
/// detail sentence, `middle` from the end of the sentence to the first number (the limit).
#[derive(Debug)]
struct Text {
    head: Box<[u8]>,
    /// What comes before the wait in the sentence (`; retry after `), when it tells one.
    wait: Option<&'static [u8]>,
    middle: Box<[u8]>,
}

/// One layer's pre-rendered refusals.
#[derive(Debug)]
pub(crate) struct Refusal {
    /// Tells this layer's refusals from other layers' in a thread's last refusal.
    id: u64,
    limited: Text,
    penalized: Text,
    cost_exceeds_capacity: Text,
    occupied: Text,
}

/// A refusal this layer renders, to be answered once the request's header map is free.
pub(crate) struct Refused {
    pub reason: Reason,
    pub decision: Decision,
}

impl Refusal {
    pub(crate) fn new(policy: &str) -> Refusal {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        Refusal {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            limited: text(policy, Reason::Limited),
            penalized: text(policy, Reason::Penalized),
            cost_exceeds_capacity: text(policy, Reason::CostExceedsCapacity),
            occupied: text(policy, Reason::Occupied),
        }
    }

    fn text(&self, reason: Reason) -> Option<&Text> {
        match reason {
            Reason::Limited => Some(&self.limited),
            Reason::Penalized => Some(&self.penalized),
            Reason::CostExceedsCapacity => Some(&self.cost_exceeds_capacity),
            Reason::Occupied => Some(&self.occupied),
            Reason::DenyListed | Reason::Ceiling => None,
        }
    }

    /// Whether [`Refusal::response`] answers a refusal for `reason`.
    pub(crate) fn renders(&self, reason: Reason) -> bool {
        self.text(reason).is_some()
    }

    /// The 429 for `refused`, with the header fields `which` enables, written into
    /// `headers` (the refused request's map, emptied here), as the general path writes
    /// them: `Content-Type` first, then [`PolicyFields::apply`]'s.
    pub(crate) fn response(
        &self,
        refused: &Refused,
        fields: &PolicyFields,
        which: Headers,
        mut headers: HeaderMap,
    ) -> Response<Bytes> {
        let Refused { reason, decision } = refused;
        let text = self.text(*reason).expect("a reason the layer renders");
        let render = || {
            (
                body(text, decision),
                which.ietf.then(|| fields.ratelimit(decision)),
            )
        };
        let (body, ratelimit) = self.last_or(Numbers::of(*reason, decision), render);
        let mut response = Response::new(body);
        *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        headers.clear();
        headers.insert(http::header::CONTENT_TYPE, PROBLEM_JSON);
        fields.apply_with(&mut headers, decision, true, which, ratelimit);
        *response.headers_mut() = headers;
        response
    }

    /// The body and `RateLimit` value of this thread's last refusal when it was this layer's
    /// with the same numbers, else `render`'s. They are kept from the second refusal with
    /// the same numbers on: a kept buffer costs an allocation (the first clone shares it),
    /// which a flood of refusals that all differ should not pay.
    fn last_or(
        &self,
        numbers: Numbers,
        render: impl Fn() -> (Bytes, Option<HeaderValue>),
    ) -> (Bytes, Option<HeaderValue>) {
        let cached = LAST.try_with(|last| {
            let mut last = last.try_borrow_mut().ok()?;
            match &mut *last {
                Some(last) if last.refusal == self.id && last.numbers == numbers => {
                    if let Some((body, ratelimit)) = &last.rendered {
                        return Some((body.clone(), ratelimit.clone()));
                    }
                    let (body, ratelimit) = render();
                    last.rendered = Some((body.clone(), ratelimit.clone()));
                    Some((body, ratelimit))
                }
                _ => {
                    *last = Some(Last {
                        refusal: self.id,
                        numbers,
                        rendered: None,
                    });
                    Some(render())
                }
            }
        });
        match cached {
            Ok(Some(rendered)) => rendered,
            // The thread is exiting, or (never expected) a refusal inside a refusal.
            _ => render(),
        }
    }
}

/// What a refusal's body and `RateLimit` value depend on, besides the layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Numbers {
    reason: Reason,
    leaf: usize,
    limit: u64,
    remaining: u64,
    reset: u64,
    wait: Option<u64>,
}

impl Numbers {
    fn of(reason: Reason, decision: &Decision) -> Numbers {
        Numbers {
            reason,
            leaf: decision.leaf,
            limit: decision.limit,
            remaining: decision.remaining,
            reset: whole_seconds(decision.reset_after),
            wait: decision.retry_after().map(whole_seconds),
        }
    }
}

/// A thread's last refusal. Under a flood one client is refused again and again with the
/// same numbers (they change once a second): its answer is then two reference counts
/// bumped instead of a body and a field written. Refusals that all differ only compare
/// and note their numbers.
struct Last {
    refusal: u64,
    numbers: Numbers,
    /// The body and `RateLimit` value, once a second refusal had the same numbers.
    rendered: Option<(Bytes, Option<HeaderValue>)>,
}

thread_local! {
    static LAST: RefCell<Option<Last>> = const { RefCell::new(None) };
}

/// The body: the fixed slices with the numbers between them, in one buffer of the exact
/// size (so `Bytes` takes it without another allocation). The constant pieces are written
/// one by one, so each is a copy of known length rather than a call.
fn body(text: &Text, decision: &Decision) -> Bytes {
    const REMAINING: &[u8] = br#","remaining":"#;
    const RESET_AFTER: &[u8] = br#","reset_after":"#;
    const RETRY_AFTER: &[u8] = br#","retry_after":"#;
    let (mut w, mut l, mut r, mut t) = (
        itoa::Buffer::new(),
        itoa::Buffer::new(),
        itoa::Buffer::new(),
        itoa::Buffer::new(),
    );
    let wait = decision
        .retry_after()
        .map(|wait| w.format(whole_seconds(wait)).as_bytes());
    let sentence_wait = text.wait.zip(wait);
    let limit = l.format(decision.limit).as_bytes();
    let remaining = r.format(decision.remaining).as_bytes();
    let reset = t.format(whole_seconds(decision.reset_after)).as_bytes();
    let retry_after = wait.unwrap_or(b"null");
    let len = text.head.len()
        + sentence_wait.map_or(0, |(before, wait)| before.len() + wait.len() + 2)
        + text.middle.len()
        + limit.len()
        + REMAINING.len()
        + remaining.len()
        + RESET_AFTER.len()
        + reset.len()
        + RETRY_AFTER.len()
        + retry_after.len()
        + 1;
    let mut out = Vec::with_capacity(len);
    out.extend_from_slice(&text.head);
    if let Some((before, wait)) = sentence_wait {
        out.extend_from_slice(before);
        out.extend_from_slice(wait);
        out.extend_from_slice(b" s");
    }
    out.extend_from_slice(&text.middle);
    out.extend_from_slice(limit);
    out.extend_from_slice(REMAINING);
    out.extend_from_slice(remaining);
    out.extend_from_slice(RESET_AFTER);
    out.extend_from_slice(reset);
    out.extend_from_slice(RETRY_AFTER);
    out.extend_from_slice(retry_after);
    out.push(b'}');
    debug_assert_eq!(out.len(), len);
    Bytes::from(out)
}

/// The fixed text of `reason`'s body for `policy`, cut from the general path's own output:
/// one source for the wording, so the two cannot drift apart.
fn text(policy: &str, reason: Reason) -> Text {
    // Numbers that appear nowhere else in the text mark where the cuts go.
    const MARK: &str = "31415926535897932";
    let mark: u64 = MARK.parse().expect("digits");
    let with_wait = Decision {
        denial: Some(match reason {
            Reason::Penalized => sluice_core::Denial::Penalized {
                retry_after: std::time::Duration::from_secs(mark),
            },
            Reason::Occupied => sluice_core::Denial::Occupied {
                retry_after: std::time::Duration::from_secs(mark),
            },
            Reason::CostExceedsCapacity => sluice_core::Denial::CostExceedsCapacity,
            _ => sluice_core::Denial::Limited {
                retry_after: std::time::Duration::from_secs(mark),
            },
        }),
        limit: mark,
        remaining: mark,
        reset_after: std::time::Duration::from_secs(mark),
        leaf: 0,
    };
    let full = denied::problem_text(policy, reason, &with_wait);
    let full = full.as_bytes();
    // The numbers start after `,"limit":`: the last occurrence, after any policy name.
    const LIMIT: &[u8] = br#","limit":"#;
    let numbers = rfind(full, LIMIT).expect("the body has its numbers") + LIMIT.len();
    let sentence_end = rfind(&full[..numbers], br#"","policy":"#).expect("the body has a policy");
    // What follows is what `body` writes.
    let tail = format!(
        r#"{MARK},"remaining":{MARK},"reset_after":{MARK},"retry_after":{}}}"#,
        if with_wait.retry_after().is_some() {
            MARK
        } else {
            "null"
        }
    );
    assert_eq!(&full[numbers..], tail.as_bytes(), "the numbers");
    // The sentence ends with the wait, for the reasons that tell one.
    let wait: Option<&'static [u8]> = match reason {
        Reason::Limited | Reason::Penalized => Some(b"; retry after "),
        Reason::Occupied => Some(b"; one frees within "),
        _ => None,
    };
    let head_end = match wait {
        Some(before) => {
            let told = [before, MARK.as_bytes(), b" s"].concat();
            assert!(full[..sentence_end].ends_with(&told), "the sentence's wait");
            sentence_end - told.len()
        }
        None => sentence_end,
    };
    Text {
        head: full[..head_end].into(),
        wait,
        middle: full[sentence_end..numbers].into(),
    }
}

fn rfind(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).rposition(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use http::HeaderName;
    use sluice_core::Denial;
    use sluice_limiter::{Limiter, MemoryStore, Policy};

    use super::*;
    use crate::denied::Denied;

    /// What the general path answers: `denied::problem` and the policy's fields.
    fn general(
        policy: &str,
        fields: &PolicyFields,
        refused: &Refused,
        which: Headers,
    ) -> Response<Bytes> {
        let parts = http::Request::new(()).into_parts().0;
        let denied = Denied::bare(policy, refused.reason, &refused.decision, &parts);
        let mut response = denied::problem(&denied);
        fields.apply(response.headers_mut(), &refused.decision, true, which);
        response
    }

    /// A request's header map, as hyper hands it over, that the refusal reuses.
    fn request_headers() -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(http::header::HOST, "example.com".parse().unwrap());
        headers.insert(http::header::ACCEPT, "*/*".parse().unwrap());
        headers.append(http::header::ACCEPT, "text/html".parse().unwrap());
        headers.insert(http::header::CONTENT_TYPE, "text/plain".parse().unwrap());
        headers
    }

    fn fields_of(response: &Response<Bytes>) -> Vec<(HeaderName, http::HeaderValue)> {
        let headers = response.headers();
        headers
            .iter()
            .map(|(n, v)| (n.clone(), v.clone()))
            .collect()
    }

    fn decisions() -> Vec<(Reason, Decision)> {
        let decision = |denial, limit, remaining, reset_ms, leaf| Decision {
            denial: Some(denial),
            limit,
            remaining,
            reset_after: Duration::from_millis(reset_ms),
            leaf,
        };
        let limited = |ms| Denial::Limited {
            retry_after: Duration::from_millis(ms),
        };
        let mut out = Vec::new();
        for (ms, reset) in [
            (1, 1),
            (1500, 60_000),
            (59_000, 3_599_001),
            (86_400_000, 86_400_000),
        ] {
            out.push((Reason::Limited, decision(limited(ms), 5, 0, reset, 0)));
        }
        // Each differs from the one before in one number only (the thread's last refusal
        // must not answer for it).
        out.push((Reason::Limited, decision(limited(2_000), 7, 0, 9_000, 1)));
        out.push((Reason::Limited, decision(limited(2_000), 7, 3, 9_000, 1)));
        out.push((Reason::Limited, decision(limited(2_000), 8, 3, 9_000, 1)));
        out.push((Reason::Limited, decision(limited(2_000), 8, 3, 10_000, 1)));
        out.push((Reason::Limited, decision(limited(3_000), 8, 3, 10_000, 1)));
        out.push((Reason::Limited, decision(limited(3_000), 8, 3, 10_000, 0)));
        let penalized = |ms| Denial::Penalized {
            retry_after: Duration::from_millis(ms),
        };
        out.push((
            Reason::Penalized,
            decision(penalized(3_000), 8, 3, 10_000, 0),
        ));
        out.push((
            Reason::Limited,
            decision(limited(u64::MAX / 4), u64::MAX, 0, 1, 0),
        ));
        out.push((
            Reason::Penalized,
            decision(penalized(640_000), 5, 0, 60_000, 0),
        ));
        let occupied = Denial::Occupied {
            retry_after: Duration::from_millis(29_001),
        };
        out.push((Reason::Occupied, decision(occupied, 3, 0, 600_000, 0)));
        out.push((
            Reason::CostExceedsCapacity,
            decision(Denial::CostExceedsCapacity, 5, 5, 0, 0),
        ));
        out
    }

    #[test]
    fn the_prerendered_refusal_is_the_general_one_byte_for_byte() {
        let names = ["login", "api-v2", r#"a"b\é31415926535897932"#];
        let mut limiter = Limiter::builder(MemoryStore::new());
        for name in names {
            limiter = limiter.policy(Policy::new(name, "ip:5/m; ip:7/10s").unwrap());
        }
        let limiter = limiter.build().unwrap();
        let which_ones = [
            Headers::default(),
            Headers::ALL,
            Headers::NONE,
            Headers {
                retry_after: false,
                ietf: true,
                x_ratelimit: true,
            },
        ];
        let layers: Vec<_> = names
            .iter()
            .flat_map(|name| {
                let fields = PolicyFields::new(&limiter.policy(name).unwrap());
                which_ones.map(|which| (*name, fields.clone(), which, Refusal::new(name)))
            })
            .collect();
        let mut compared = 0;
        let mut compare =
            |(name, fields, which, refusal): &(&str, PolicyFields, Headers, Refusal),
             refused: &Refused| {
                assert!(refusal.renders(refused.reason));
                let expected = general(name, fields, refused, *which);
                // Three times in a row: the second is kept as the thread's last refusal, the
                // third comes from it.
                for _ in 0..3 {
                    let got = refusal.response(refused, fields, *which, request_headers());
                    let reason = refused.reason;
                    assert_eq!(got.status(), expected.status());
                    assert_eq!(fields_of(&got), fields_of(&expected), "{name} {reason:?}");
                    assert_eq!(got.body(), expected.body(), "{name} {reason:?}");
                    compared += 1;
                }
            };
        // One layer's refusals one after another, then every layer's in turn for each.
        for layer in &layers {
            for (reason, decision) in decisions() {
                compare(layer, &Refused { reason, decision });
            }
        }
        for (reason, decision) in decisions() {
            let refused = Refused { reason, decision };
            for layer in &layers {
                compare(layer, &refused);
            }
        }
        assert_eq!(compared, 2 * decisions().len() * layers.len() * 3);
    }

    #[test]
    fn the_ceiling_and_the_deny_list_take_the_general_path() {
        let refusal = Refusal::new("login");
        assert!(!refusal.renders(Reason::Ceiling));
        assert!(!refusal.renders(Reason::DenyListed));
    }
}
