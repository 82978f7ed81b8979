//! What the stores' users and servers send: store URLs, memcached replies and values.

use sluice_memcached::fuzzing::{Expect, Stored, encode_penalty, encode_state, reply, value};

use crate::{Target, split_points};

const EXPECTS: [Expect; 7] = [
    Expect::Values,
    Expect::ValuesWithCas,
    Expect::Stored,
    Expect::Number,
    Expect::Deleted,
    Expect::Version,
    Expect::Stats,
];

/// Most replies read from one input.
const MAX_REPLIES: usize = 64;

/// The replies read from `chunks` arriving one after another, and how the stream ends.
fn replies(chunks: &[&[u8]], expect: Expect) -> (Vec<String>, String) {
    let mut buf = Vec::new();
    let mut read = Vec::new();
    for chunk in chunks {
        buf.extend_from_slice(chunk);
        while read.len() < MAX_REPLIES {
            match reply(&buf, expect) {
                Ok(Some((reply, used))) => {
                    assert!(used > 0 && used <= buf.len(), "a reply took {used} bytes");
                    read.push(format!("{reply:?}"));
                    buf.drain(..used);
                }
                Ok(None) => break,
                Err(e) => return (read, format!("error: {e}")),
            }
        }
    }
    (read, format!("{} bytes left", buf.len()))
}

/// `[kind][reply stream...]`: a memcached reply stream reads the same however it is split;
/// each value fetched decodes or says why not, and one that decodes encodes to a value that
/// decodes the same.
pub fn memcached_reply(data: &[u8]) {
    let [kind, stream @ ..] = data else {
        return;
    };
    let expect = EXPECTS[usize::from(*kind) % EXPECTS.len()];
    let whole = Target::MemcachedReply.hold(data.len(), || replies(&[stream], expect));
    for at in split_points(stream.len()) {
        let (a, b) = stream.split_at(at);
        assert_eq!(replies(&[a, b], expect), whole, "split at byte {at}");
    }
    // The stream itself as a value, as if a `get` had returned it.
    let Ok(stored) = Target::MemcachedReply.hold(data.len(), || value(stream)) else {
        return;
    };
    let encoded = match &stored {
        Stored::Leaf(state) => encode_state(state),
        Stored::Penalty(penalty) => encode_penalty(penalty),
    };
    let again = value(&encoded).unwrap_or_else(|e| {
        panic!(
            "{:?} decoded, encoded as {:?}, which does not decode: {e}",
            String::from_utf8_lossy(stream),
            String::from_utf8_lossy(&encoded)
        )
    });
    assert_eq!(
        format!("{again:?}"),
        format!("{stored:?}"),
        "a value changed on a round trip"
    );
}

/// A store URL is read or refused with a message; neither the message nor the redacted URL
/// shows the password.
pub fn url(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (redis, memcached) = Target::StoreUrl.hold(data.len(), || {
        (
            sluice_redis::fuzzing::url(text),
            sluice_memcached::fuzzing::url(text),
        )
    });
    drop(memcached);
    let Some(password) = password(text) else {
        return;
    };
    let redacted = sluice_redis::redact_url(text);
    assert!(
        !redacted.contains(password),
        "`{text}` redacted as `{redacted}`"
    );
    if let Err(e) = redis {
        let message = e.to_string();
        assert!(
            !message.contains(password),
            "`{text}` refused with `{message}`"
        );
    }
}

/// The password of `scheme://user:password@host`, when it is long enough and appears only
/// once in the URL (so finding it elsewhere in a message means it leaked).
fn password(url: &str) -> Option<&str> {
    let (_, rest) = url.split_once("://")?;
    let (auth, _) = rest.rsplit_once('@')?;
    let (_, password) = auth.split_once(':')?;
    let plain = password.len() >= 6 && password.bytes().all(|b| b.is_ascii_alphanumeric());
    (plain && url.matches(password).count() == 1).then_some(password)
}

/// `[encoding][numbers...]`: a reply of the decision script (seven integers), as a Redis
/// that misbehaves might send it. It is read or refused, and a decision read from it never
/// admits unless the reply said so in the one way the script says it (`allowed` 1, denial
/// code 0).
pub fn redis_reply(data: &[u8]) {
    let [encoding, rest @ ..] = data else {
        return;
    };
    // Small numbers byte by byte (so the fuzzer finds the codes the script uses), or whole
    // little-endian i64s (so it finds the extremes).
    let reply: Vec<i64> = if encoding & 1 == 0 {
        rest.iter().map(|&b| i64::from(b as i8)).take(16).collect()
    } else {
        rest.chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
            .take(16)
            .collect()
    };
    let Ok(decision) =
        Target::RedisReply.hold(data.len(), || sluice_redis::script::decision(&reply))
    else {
        return;
    };
    let said_allowed = reply.first() == Some(&1) && reply.get(5) == Some(&0);
    assert_eq!(
        decision.allowed(),
        said_allowed,
        "{reply:?} read as {decision:?}"
    );
}
