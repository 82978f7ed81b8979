//! Where an identifier lives on Redis: its key, with the identifier's routing group as the
//! key's `{hash tag}`, and Redis Cluster's hash slot of it (CRC16/XMODEM of the key, or of its
//! first non-empty `{tag}`, modulo 16384), needed before sending to know whether a rule's
//! keys share a slot.

use sluice_limiter::Identifier;

/// The Redis key of `identifier`: its name with the routing group wrapped in braces, so
/// identifiers of one group share a cluster slot (`sluice:login:ip:{10.0.0.1}:5/m`). The
/// limiter never writes a brace before the group, so the group is always the key's tag.
pub fn key(identifier: &Identifier) -> String {
    let (before, group, after) = identifier.parts();
    let mut key = String::with_capacity(identifier.len() + 2);
    key.push_str(before);
    key.push('{');
    key.push_str(group);
    key.push('}');
    key.push_str(after);
    key
}

/// The hash slot of `identifier`'s key.
pub fn slot_of(identifier: &Identifier) -> u16 {
    let group = identifier.group();
    if group.is_empty() {
        // `{}` is no tag to Redis: the whole key is hashed.
        return slot(&key(identifier));
    }
    crc16(group.as_bytes()) % 16_384
}

/// The hash slot of `key`.
pub fn slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let hashed = match bytes.iter().position(|&b| b == b'{') {
        Some(open) => match bytes[open + 1..].iter().position(|&b| b == b'}') {
            Some(len) if len > 0 => &bytes[open + 1..open + 1 + len],
            _ => bytes,
        },
        None => bytes,
    };
    crc16(hashed) % 16_384
}

fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_redis() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(slot("foo"), 12_182);
        assert_eq!(slot("{user1000}.following"), slot("{user1000}.followers"));
        assert_eq!(slot("foo{}{bar}"), slot("foo{}{bar}"));
        assert_eq!(slot("foo{{bar}}zap"), slot("{bar"));
        assert_eq!(slot("foo{bar}{zap}"), slot("bar"));
    }

    #[test]
    fn keys_are_tagged_by_their_group() {
        let id = Identifier::grouped("ns:login:ip:", "10.0.0.1", ":5/m");
        assert_eq!(key(&id), "ns:login:ip:{10.0.0.1}:5/m");
        assert_eq!(slot_of(&id), slot(&key(&id)));
        assert_eq!(slot_of(&id), slot("10.0.0.1"));
    }
}
