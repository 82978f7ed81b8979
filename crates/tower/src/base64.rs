//! Base64 without padding: the standard alphabet for gRPC `-bin` metadata, the URL-safe one
//! for challenge nonces (which travel in headers and JSON unescaped).

const STANDARD: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
#[cfg(feature = "pow")]
const URL_SAFE: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

fn encode_with(bytes: &[u8], alphabet: &[u8; 64]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | (u32::from(b) << (16 - 8 * i)));
        for i in 0..=chunk.len() {
            out.push(alphabet[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out
}

pub(crate) fn encode(bytes: &[u8]) -> String {
    encode_with(bytes, STANDARD)
}

#[cfg(feature = "pow")]
pub(crate) fn encode_url(bytes: &[u8]) -> String {
    encode_with(bytes, URL_SAFE)
}

/// Decodes unpadded URL-safe base64; `None` on any other character or a dangling symbol.
#[cfg(feature = "pow")]
pub(crate) fn decode_url(text: &str) -> Option<Vec<u8>> {
    let value = |c: u8| URL_SAFE.iter().position(|&a| a == c).map(|v| v as u32);
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    for chunk in text.as_bytes().chunks(4) {
        if chunk.len() == 1 {
            return None;
        }
        let mut n = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            n |= value(c)? << (18 - 6 * i);
        }
        for i in 0..chunk.len() - 1 {
            out.push((n >> (16 - 8 * i)) as u8);
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KNOWN: [(&str, &str); 5] = [
        ("", ""),
        ("f", "Zg"),
        ("fo", "Zm8"),
        ("foo", "Zm9v"),
        ("foobar", "Zm9vYmFy"),
    ];

    #[test]
    fn known_vectors() {
        for (plain, coded) in KNOWN {
            assert_eq!(encode(plain.as_bytes()), coded);
        }
    }

    #[test]
    #[cfg(feature = "pow")]
    fn url_safe_round_trips() {
        for (plain, coded) in KNOWN {
            assert_eq!(decode_url(coded).unwrap(), plain.as_bytes());
        }
        let bytes: Vec<u8> = (0..=255).collect();
        assert_eq!(decode_url(&encode_url(&bytes)).unwrap(), bytes);
        assert_eq!(encode_url(&[0xfb, 0xff]), "-_8");
        assert_eq!(decode_url("Zm9v!"), None);
        assert_eq!(decode_url("Zm9vY"), None);
    }
}
