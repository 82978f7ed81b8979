//! The memcached text protocol: commands as bytes, replies read strictly.
//!
//! Only what the store uses: `get`/`gets` of several keys, `set`/`add`/`cas` with an expiry,
//! `incr`/`decr`, `delete`, `version` and `stats`. A reply that is not exactly what the
//! protocol allows for the command is a [`ProtocolError`], never a panic: the connection that
//! carried it is closed, since its stream can no longer be trusted.

use std::fmt;

/// Longest reply line accepted (a `VALUE` line holds a key of at most 250 bytes).
const MAX_LINE: usize = 4096;
/// Largest value accepted in a reply (memcached's default item limit is 1 MiB).
pub const MAX_VALUE: usize = 16 << 20;

/// A reply that breaks the protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtocolError(pub String);

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn bad(why: impl Into<String>) -> ProtocolError {
    ProtocolError(why.into())
}

/// The storage commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Set,
    Add,
    /// Store only if the item's CAS unique is still this one.
    Cas(u64),
}

/// `get <keys>` (or `gets` with CAS uniques).
pub fn get<K: AsRef<str>>(out: &mut Vec<u8>, keys: &[K], with_cas: bool) {
    out.extend_from_slice(if with_cas { b"gets" } else { b"get" });
    for key in keys {
        out.push(b' ');
        out.extend_from_slice(key.as_ref().as_bytes());
    }
    out.extend_from_slice(b"\r\n");
}

/// `set|add|cas <key> 0 <exptime> <bytes> [<cas>]` and the data block.
///
/// Numbers are written with `itoa` rather than `format!`: every decision sends one or two
/// such commands, and a formatted `String` each was about 2,500 instructions a decision
/// (callgrind, the throughput bench on 1,000,000 keys).
pub fn store(out: &mut Vec<u8>, verb: Verb, key: &str, exptime: u32, value: &[u8]) {
    out.extend_from_slice(match verb {
        Verb::Set => b"set ",
        Verb::Add => b"add ",
        Verb::Cas(_) => b"cas ",
    });
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(b" 0 ");
    push_number(out, exptime.into());
    out.push(b' ');
    push_number(out, value.len() as u64);
    if let Verb::Cas(unique) = verb {
        out.push(b' ');
        push_number(out, unique);
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// `incr <key> <by>` or `decr <key> <by>`.
pub fn incr(out: &mut Vec<u8>, key: &str, by: u64, up: bool) {
    out.extend_from_slice(if up { b"incr " } else { b"decr " });
    out.extend_from_slice(key.as_bytes());
    out.push(b' ');
    push_number(out, by);
    out.extend_from_slice(b"\r\n");
}

pub fn delete(out: &mut Vec<u8>, key: &str) {
    out.extend_from_slice(b"delete ");
    out.extend_from_slice(key.as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// `n` in decimal.
pub fn push_number(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
}

pub fn version(out: &mut Vec<u8>) {
    out.extend_from_slice(b"version\r\n");
}

pub fn stats(out: &mut Vec<u8>) {
    out.extend_from_slice(b"stats\r\n");
}

/// Requests sent one after the other in one call, pipelined: their bytes in one buffer,
/// and the reply each expects. One buffer rather than one per request: a decision's call
/// (a window's `get`, an `add`, a `set`) allocates once.
#[derive(Debug, Default)]
pub struct Requests {
    pub(crate) bytes: Vec<u8>,
    pub(crate) expects: smallvec::SmallVec<[Expect; 4]>,
}

impl Requests {
    /// No requests yet, with room for `bytes` of them.
    pub fn with_capacity(bytes: usize) -> Requests {
        Requests {
            bytes: Vec::with_capacity(bytes),
            expects: smallvec::SmallVec::new(),
        }
    }

    /// One request, written by `write`, expecting `expect`.
    pub fn one(bytes: usize, expect: Expect, write: impl FnOnce(&mut Vec<u8>)) -> Requests {
        let mut requests = Requests::with_capacity(bytes);
        requests.push(expect, write);
        requests
    }

    /// Adds a request, written by `write` after the others, expecting `expect`.
    pub fn push(&mut self, expect: Expect, write: impl FnOnce(&mut Vec<u8>)) {
        write(&mut self.bytes);
        self.expects.push(expect);
    }

    pub fn len(&self) -> usize {
        self.expects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.expects.is_empty()
    }
}

/// Which replies a command may get.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// `get`: `VALUE <key> <flags> <bytes>` blocks, then `END`.
    Values,
    /// `gets`: the same with a CAS unique on each `VALUE` line.
    ValuesWithCas,
    /// `set`/`add`/`cas`: `STORED`, `NOT_STORED`, `EXISTS` or `NOT_FOUND`.
    Stored,
    /// `incr`/`decr`: the new value or `NOT_FOUND`.
    Number,
    /// `delete`: `DELETED` or `NOT_FOUND`.
    Deleted,
    /// `version`: `VERSION <text>`.
    Version,
    /// `stats`: `STAT <name> <value>` lines, then `END`.
    Stats,
}

/// One item of a `get`/`gets` reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    pub key: String,
    pub value: Vec<u8>,
    /// The CAS unique (`gets` only).
    pub cas: Option<u64>,
}

/// A reply, read according to its [`Expect`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Values(Vec<Item>),
    Stored,
    NotStored,
    Exists,
    NotFound,
    Number(u64),
    Deleted,
    Version(String),
    Stats(Vec<(String, String)>),
    /// `SERVER_ERROR <message>`: the server failed (out of memory, say); the stream is intact.
    ServerError(String),
    /// `ERROR` or `CLIENT_ERROR <message>`: the server did not understand us.
    ClientError(String),
}

/// The next line of `buf` from `at` (without its CRLF) and where the following one starts;
/// `None` while the line is incomplete.
fn line(buf: &[u8], at: usize) -> Result<Option<(&[u8], usize)>, ProtocolError> {
    let rest = &buf[at..];
    // A line ends at its first CR LF, within MAX_LINE bytes; judged on those bytes alone, so
    // a reply reads the same however the stream is split (a lone LF is part of the line,
    // as it was before the fuzz target asked: refusing it made the answer depend on where
    // the stream was cut).
    let window = &rest[..rest.len().min(MAX_LINE + 2)];
    match window.windows(2).position(|w| w == b"\r\n") {
        Some(end) => Ok(Some((&rest[..end], at + end + 2))),
        None if window.len() == MAX_LINE + 2 => Err(bad("reply line longer than 4096 bytes")),
        None => Ok(None),
    }
}

/// A decimal `u64`: digits only, no sign, no overflow.
pub fn number(text: &[u8]) -> Option<u64> {
    if text.is_empty() || text.len() > 20 || !text.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(text).ok()?.parse().ok()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Replies any command may get instead of its own.
fn error_reply(line: &[u8]) -> Option<Reply> {
    if line == b"ERROR" {
        return Some(Reply::ClientError("ERROR".into()));
    }
    if let Some(message) = line.strip_prefix(b"CLIENT_ERROR ") {
        return Some(Reply::ClientError(text(message)));
    }
    if let Some(message) = line.strip_prefix(b"SERVER_ERROR ") {
        return Some(Reply::ServerError(text(message)));
    }
    None
}

/// Reads one reply from the start of `buf`: the reply and the bytes it took, `None` while it
/// is incomplete, or an error when it cannot be a reply to a command of kind `expect`.
pub fn parse(buf: &[u8], expect: Expect) -> Result<Option<(Reply, usize)>, ProtocolError> {
    let Some((first, mut at)) = line(buf, 0)? else {
        return Ok(None);
    };
    if let Some(reply) = error_reply(first) {
        return Ok(Some((reply, at)));
    }
    let reply = match expect {
        Expect::Stored => match first {
            b"STORED" => Reply::Stored,
            b"NOT_STORED" => Reply::NotStored,
            b"EXISTS" => Reply::Exists,
            b"NOT_FOUND" => Reply::NotFound,
            other => return Err(unexpected("a storage command", other)),
        },
        Expect::Number => match first {
            b"NOT_FOUND" => Reply::NotFound,
            digits => Reply::Number(number(digits).ok_or_else(|| unexpected("incr/decr", digits))?),
        },
        Expect::Deleted => match first {
            b"DELETED" => Reply::Deleted,
            b"NOT_FOUND" => Reply::NotFound,
            other => return Err(unexpected("delete", other)),
        },
        Expect::Version => match first.strip_prefix(b"VERSION ") {
            Some(version) => Reply::Version(text(version)),
            None => return Err(unexpected("version", first)),
        },
        Expect::Stats => {
            let mut stats = Vec::new();
            let mut current = first;
            loop {
                if current == b"END" {
                    break;
                }
                let fields: Vec<&[u8]> = current.splitn(3, |&b| b == b' ').collect();
                match fields[..] {
                    [b"STAT", name, value] if !name.is_empty() => {
                        stats.push((text(name), text(value)));
                    }
                    _ => return Err(unexpected("stats", current)),
                }
                let Some((next, after)) = line(buf, at)? else {
                    return Ok(None);
                };
                (current, at) = (next, after);
            }
            Reply::Stats(stats)
        }
        Expect::Values | Expect::ValuesWithCas => {
            let with_cas = expect == Expect::ValuesWithCas;
            let mut items = Vec::new();
            let mut current = first;
            loop {
                if current == b"END" {
                    break;
                }
                let (item_head, length) = value_line(current, with_cas)?;
                let end = at + length;
                if buf.len() < end + 2 {
                    return Ok(None);
                }
                if &buf[end..end + 2] != b"\r\n" {
                    return Err(bad("a value block does not end in CRLF"));
                }
                items.push(Item {
                    value: buf[at..end].to_vec(),
                    ..item_head
                });
                at = end + 2;
                let Some((next, after)) = line(buf, at)? else {
                    return Ok(None);
                };
                (current, at) = (next, after);
            }
            Reply::Values(items)
        }
    };
    Ok(Some((reply, at)))
}

/// `VALUE <key> <flags> <bytes> [<cas>]`: the item without its value, and the value's length.
fn value_line(line: &[u8], with_cas: bool) -> Result<(Item, usize), ProtocolError> {
    // Fields taken one by one rather than collected: a `Vec` per item was one more
    // allocation for every counter a window's read finds.
    let mut fields = line.split(|&b| b == b' ');
    let mut field = || fields.next().ok_or_else(|| unexpected("get", line));
    let (head, key, flags, length) = (field()?, field()?, field()?, field()?);
    let cas = if with_cas { Some(field()?) } else { None };
    if fields.next().is_some() || head != b"VALUE" || key.is_empty() {
        return Err(unexpected("get", line));
    }
    let key = std::str::from_utf8(key)
        .map_err(|_| bad("a VALUE line's key is not UTF-8"))?
        .to_owned();
    number(flags).ok_or_else(|| unexpected("get (flags)", line))?;
    let length = number(length)
        .filter(|&n| n as usize <= MAX_VALUE)
        .ok_or_else(|| unexpected("get (length)", line))? as usize;
    let cas = match cas {
        Some(cas) => Some(number(cas).ok_or_else(|| unexpected("gets (cas unique)", line))?),
        None => None,
    };
    Ok((
        Item {
            key,
            value: Vec::new(),
            cas,
        },
        length,
    ))
}

fn unexpected(command: &str, line: &[u8]) -> ProtocolError {
    let shown: String = text(line).chars().take(120).collect();
    bad(format!("unexpected reply to {command}: {shown:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn whole(buf: &[u8], expect: Expect) -> Reply {
        let (reply, used) = parse(buf, expect).unwrap().expect("complete");
        assert_eq!(used, buf.len(), "took the whole reply");
        reply
    }

    #[test]
    fn writes_commands() {
        let mut out = Vec::new();
        get(&mut out, &["a", "b"], true);
        store(&mut out, Verb::Cas(7), "k", 60, b"v1");
        store(&mut out, Verb::Add, "k", 1, b"");
        incr(&mut out, "c", 5, false);
        delete(&mut out, "k");
        assert_eq!(
            out,
            b"gets a b\r\ncas k 0 60 2 7\r\nv1\r\nadd k 0 1 0\r\n\r\ndecr c 5\r\ndelete k\r\n"
        );
        out.clear();
        store(&mut out, Verb::Cas(u64::MAX), "k", u32::MAX, b"0123456789");
        store(&mut out, Verb::Set, "s", 0, b"g 1");
        incr(&mut out, "c", u64::MAX, true);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "cas k 0 4294967295 10 18446744073709551615\r\n0123456789\r\n\
             set s 0 0 3\r\ng 1\r\nincr c 18446744073709551615\r\n"
        );
    }

    #[test]
    fn reads_values() {
        let buf = b"VALUE a 0 2 9\r\nxy\r\nVALUE b 3 0 10\r\n\r\nEND\r\n";
        let Reply::Values(items) = whole(buf, Expect::ValuesWithCas) else {
            panic!("values")
        };
        assert_eq!(items.len(), 2);
        assert_eq!(
            (items[0].key.as_str(), &items[0].value[..], items[0].cas),
            ("a", &b"xy"[..], Some(9))
        );
        assert_eq!((items[1].value.len(), items[1].cas), (0, Some(10)));
        assert_eq!(whole(b"END\r\n", Expect::Values), Reply::Values(vec![]));
        // A value may hold CRLF: its length, not a delimiter, ends it.
        let Reply::Values(items) = whole(b"VALUE a 0 4\r\n\r\n\r\n\r\nEND\r\n", Expect::Values)
        else {
            panic!("values")
        };
        assert_eq!(items[0].value, b"\r\n\r\n");
    }

    #[test]
    fn waits_for_the_whole_reply() {
        let full = b"VALUE a 0 2 9\r\nxy\r\nEND\r\n";
        for cut in 0..full.len() {
            assert_eq!(
                parse(&full[..cut], Expect::ValuesWithCas),
                Ok(None),
                "cut at {cut}"
            );
        }
        let stats = b"STAT pid 1\r\nSTAT version 1.6\r\nEND\r\n";
        for cut in 0..stats.len() {
            assert_eq!(
                parse(&stats[..cut], Expect::Stats),
                Ok(None),
                "cut at {cut}"
            );
        }
        assert_eq!(
            whole(stats, Expect::Stats),
            Reply::Stats(vec![
                ("pid".into(), "1".into()),
                ("version".into(), "1.6".into())
            ])
        );
    }

    #[test]
    fn reads_simple_replies() {
        assert_eq!(whole(b"STORED\r\n", Expect::Stored), Reply::Stored);
        assert_eq!(whole(b"EXISTS\r\n", Expect::Stored), Reply::Exists);
        assert_eq!(whole(b"NOT_STORED\r\n", Expect::Stored), Reply::NotStored);
        assert_eq!(whole(b"NOT_FOUND\r\n", Expect::Number), Reply::NotFound);
        assert_eq!(
            whole(b"18446744073709551615\r\n", Expect::Number),
            Reply::Number(u64::MAX)
        );
        assert_eq!(whole(b"DELETED\r\n", Expect::Deleted), Reply::Deleted);
        assert_eq!(
            whole(b"VERSION 1.6.18\r\n", Expect::Version),
            Reply::Version("1.6.18".into())
        );
        assert_eq!(
            whole(b"SERVER_ERROR out of memory\r\n", Expect::Stored),
            Reply::ServerError("out of memory".into())
        );
        assert_eq!(
            whole(b"CLIENT_ERROR bad data chunk\r\n", Expect::Values),
            Reply::ClientError("bad data chunk".into())
        );
        assert_eq!(
            whole(b"ERROR\r\n", Expect::Number),
            Reply::ClientError("ERROR".into())
        );
    }

    #[test]
    fn refuses_malformed_replies() {
        let cases: &[(&[u8], Expect)] = &[
            (b"STORED\r\n", Expect::Number),
            (b"18446744073709551616\r\n", Expect::Number),
            (b"-1\r\n", Expect::Number),
            (b"12 \r\n", Expect::Number),
            (b"HELLO\r\n", Expect::Stored),
            (b"DELETED\r\n", Expect::Stored),
            (b"VALUE a 0 2\r\nxy\r\nEND\r\n", Expect::ValuesWithCas),
            (b"VALUE a 0 2 9\r\nxy\r\nEND\r\n", Expect::Values),
            (b"VALUE a 0 2\r\nxyz\r\nEND\r\n", Expect::Values),
            (b"VALUE a x 2\r\nxy\r\nEND\r\n", Expect::Values),
            (b"VALUE  0 2\r\nxy\r\nEND\r\n", Expect::Values),
            (b"VALUE a 0 99999999999\r\n", Expect::Values),
            (b"STORED\r\n", Expect::Values),
            (b"STAT x\r\nEND\r\n", Expect::Stats),
            (b"VERSION\r\n", Expect::Version),
            (b"STORED\nX\r\n", Expect::Stored),
        ];
        for (reply, expect) in cases {
            assert!(
                parse(reply, *expect).is_err(),
                "{:?} accepted as {expect:?}",
                String::from_utf8_lossy(reply)
            );
        }
        let endless = vec![b'x'; MAX_LINE + 2];
        assert!(parse(&endless, Expect::Stored).is_err());
    }

    /// Found by the `memcached_reply` fuzz target: a bare LF inside a line was refused or
    /// accepted depending on whether the line's CR LF had arrived yet (it is now part of the
    /// line, always), and a line of exactly MAX_LINE bytes was refused while its CR was the
    /// last byte read.
    #[test]
    fn reads_the_same_however_the_stream_is_split() {
        let mut longest = vec![b'7'; MAX_LINE];
        longest.extend_from_slice(b"\r\n");
        let streams: &[(&[u8], Expect)] = &[
            (b"DELETED\r\nCLIENT_ERROR bad-\nERROR\r\n", Expect::Deleted),
            (b"DELETED-\nCLIENT_ERROR bad\r\n", Expect::Deleted),
            (b"STORED\r\r\n", Expect::Stored),
            (&longest, Expect::Version),
        ];
        for (stream, expect) in streams {
            let whole = parse(stream, *expect);
            for at in 0..stream.len() {
                let part = parse(&stream[..at], *expect);
                assert!(
                    part == Ok(None) || part == whole,
                    "{at} bytes of {:?}: {part:?}, whole: {whole:?}",
                    String::from_utf8_lossy(stream)
                );
            }
        }
        assert_eq!(
            whole(
                &b"DELETED\r\nCLIENT_ERROR bad-\nERROR\r\n"[9..],
                Expect::Deleted
            ),
            Reply::ClientError("bad-\nERROR".into())
        );
    }

    #[test]
    fn never_panics_on_garbage() {
        // Every prefix and every single-byte change of valid replies: an answer, never a panic.
        let valid: &[(&[u8], Expect)] = &[
            (b"VALUE ab 0 3 77\r\nxyz\r\nEND\r\n", Expect::ValuesWithCas),
            (b"STAT a b\r\nEND\r\n", Expect::Stats),
            (b"123\r\n", Expect::Number),
        ];
        for (reply, expect) in valid {
            for i in 0..reply.len() {
                for byte in [0u8, b' ', b'\r', b'\n', b'9', 0xff] {
                    let mut changed = reply.to_vec();
                    changed[i] = byte;
                    let _ = parse(&changed, *expect);
                    let _ = parse(&changed[..i], *expect);
                }
            }
        }
    }
}
