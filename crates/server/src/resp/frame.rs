//! Reading commands in the Redis protocol: arrays of bulk strings (what clients send) and
//! inline commands (what a person types over telnet), with bounds on every size.

/// Most arguments one command may carry.
pub const MAX_ARGS: usize = 64;
/// Longest bulk string, and longest inline command line.
pub const MAX_BULK: usize = 64 * 1024;

/// The outcome of looking for one command at the start of a buffer.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    /// A command and how many bytes it took.
    Command(Vec<Vec<u8>>, usize),
    /// More bytes are needed.
    Incomplete,
    /// The stream cannot be read further (the reply says why; the connection closes).
    Invalid(&'static str),
}

fn line(buf: &[u8], from: usize, max: usize) -> Result<Option<(&[u8], usize)>, &'static str> {
    let window = &buf[from..buf.len().min(from + max + 2)];
    match window.windows(2).position(|w| w == b"\r\n") {
        Some(i) => Ok(Some((&window[..i], from + i + 2))),
        None if window.len() >= max + 2 => Err("Protocol error: line too long"),
        None => Ok(None),
    }
}

fn number(text: &[u8]) -> Option<i64> {
    std::str::from_utf8(text).ok()?.parse().ok()
}

/// Parses one command from the start of `buf`.
pub fn parse(buf: &[u8]) -> Parsed {
    if buf.is_empty() {
        return Parsed::Incomplete;
    }
    if buf[0] != b'*' {
        return inline(buf);
    }
    let (header, mut at) = match line(buf, 1, 32) {
        Ok(Some(l)) => l,
        Ok(None) => return Parsed::Incomplete,
        Err(e) => return Parsed::Invalid(e),
    };
    let count = match number(header) {
        Some(n) if (0..=MAX_ARGS as i64).contains(&n) => n as usize,
        Some(n) if n > MAX_ARGS as i64 => {
            return Parsed::Invalid("Protocol error: too many arguments");
        }
        _ => return Parsed::Invalid("Protocol error: invalid multibulk length"),
    };
    let mut args = Vec::with_capacity(count);
    for _ in 0..count {
        if at >= buf.len() {
            return Parsed::Incomplete;
        }
        if buf[at] != b'$' {
            return Parsed::Invalid("Protocol error: expected '$'");
        }
        let (len, next) = match line(buf, at + 1, 32) {
            Ok(Some(l)) => l,
            Ok(None) => return Parsed::Incomplete,
            Err(e) => return Parsed::Invalid(e),
        };
        let len = match number(len) {
            Some(n) if (0..=MAX_BULK as i64).contains(&n) => n as usize,
            Some(n) if n > MAX_BULK as i64 => {
                return Parsed::Invalid("Protocol error: bulk string too long");
            }
            _ => return Parsed::Invalid("Protocol error: invalid bulk length"),
        };
        if buf.len() < next + len + 2 {
            return Parsed::Incomplete;
        }
        if &buf[next + len..next + len + 2] != b"\r\n" {
            return Parsed::Invalid("Protocol error: bulk string not terminated");
        }
        args.push(buf[next..next + len].to_vec());
        at = next + len + 2;
    }
    Parsed::Command(args, at)
}

fn inline(buf: &[u8]) -> Parsed {
    let end = match buf.iter().take(MAX_BULK + 1).position(|&b| b == b'\n') {
        Some(i) => i,
        None if buf.len() > MAX_BULK => return Parsed::Invalid("Protocol error: line too long"),
        None => return Parsed::Incomplete,
    };
    let text = buf[..end].strip_suffix(b"\r").unwrap_or(&buf[..end]);
    let args: Vec<Vec<u8>> = text
        .split(|b| b.is_ascii_whitespace())
        .filter(|a| !a.is_empty())
        .map(<[u8]>::to_vec)
        .collect();
    if args.len() > MAX_ARGS {
        return Parsed::Invalid("Protocol error: too many arguments");
    }
    Parsed::Command(args, end + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_arrays_inline_and_partial_frames() {
        let frame = b"*2\r\n$4\r\nPING\r\n$2\r\nhi\r\n";
        assert_eq!(
            parse(frame),
            Parsed::Command(vec![b"PING".to_vec(), b"hi".to_vec()], frame.len())
        );
        for cut in 0..frame.len() {
            assert_eq!(parse(&frame[..cut]), Parsed::Incomplete, "cut at {cut}");
        }
        assert_eq!(
            parse(b"PING  x\r\n"),
            Parsed::Command(vec![b"PING".to_vec(), b"x".to_vec()], 9)
        );
    }

    #[test]
    fn rejects_absurd_sizes_without_allocating() {
        assert!(matches!(parse(b"*99999999\r\n"), Parsed::Invalid(_)));
        assert!(matches!(parse(b"*1\r\n$999999999\r\n"), Parsed::Invalid(_)));
        assert!(matches!(parse(b"*1\r\n$-5\r\n"), Parsed::Invalid(_)));
        assert!(matches!(parse(b"*x\r\n"), Parsed::Invalid(_)));
        assert!(matches!(parse(b"*1\r\n$1\r\nab\r\n"), Parsed::Invalid(_)));
    }
}
