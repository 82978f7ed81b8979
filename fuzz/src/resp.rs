//! Streams sent to the Redis protocol listener.

use sluice_server::fuzzing::{After, Parsed, resp_command, resp_frame};

use crate::http::{runtime, service};
use crate::{Target, split_points};

/// Most commands one input runs: enough for any path through a command, few enough that a
/// long pipeline of `PING`s does not slow the fuzzer down.
const MAX_COMMANDS: usize = 32;

/// What reading a stream gives: its commands in order, and how it ends (more bytes wanted,
/// or the error that closes the connection).
#[derive(Debug, PartialEq, Eq)]
struct Reading {
    commands: Vec<Vec<Vec<u8>>>,
    end: End,
}

#[derive(Debug, PartialEq, Eq)]
enum End {
    /// The rest (how many bytes) waits for more.
    Incomplete(usize),
    Invalid(&'static str),
}

/// Reads `chunks` as the listener does: append what arrives, take every complete command.
fn read(chunks: &[&[u8]]) -> Reading {
    let mut buf = Vec::new();
    let mut commands = Vec::new();
    for chunk in chunks {
        buf.extend_from_slice(chunk);
        loop {
            match resp_frame(&buf) {
                Parsed::Command(args, used) => {
                    assert!(used > 0 && used <= buf.len(), "a command took {used} bytes");
                    commands.push(args);
                    buf.drain(..used);
                }
                Parsed::Incomplete => break,
                Parsed::Invalid(message) => {
                    return Reading {
                        commands,
                        end: End::Invalid(message),
                    };
                }
            }
        }
    }
    Reading {
        commands,
        end: End::Incomplete(buf.len()),
    }
}

/// A stream reads the same whole as split in two at any byte; each command's arguments
/// are within the documented bounds; every command run gets exactly one well-formed reply
/// (or none, for an empty inline line), and nothing after `QUIT` runs.
pub fn stream(data: &[u8]) {
    let whole = Target::Resp.hold(data.len(), || read(&[data]));
    for at in split_points(data.len()) {
        let (a, b) = data.split_at(at);
        assert_eq!(read(&[a, b]), whole, "split at byte {at}");
    }
    for args in &whole.commands {
        assert!(args.len() <= sluice_server::fuzzing::MAX_ARGS);
        assert!(
            args.iter()
                .all(|a| a.len() <= sluice_server::fuzzing::MAX_BULK)
        );
    }

    let service = service();
    let commands = &whole.commands[..whole.commands.len().min(MAX_COMMANDS)];
    Target::Resp.hold(data.len(), || {
        runtime().block_on(async {
            let mut out = Vec::new();
            for args in commands {
                let before = out.len();
                let after = resp_command(&service, args, &mut out).await;
                let reply = &out[before..];
                if args.is_empty() {
                    assert!(reply.is_empty(), "an empty line got a reply");
                } else {
                    one_reply(args, reply);
                }
                if after == After::Close {
                    break;
                }
            }
        });
    });
}

/// `reply` is one whole reply, as the redis crate (a real client's parser) reads it.
fn one_reply(args: &[Vec<u8>], reply: &[u8]) {
    let shown = || {
        let args: Vec<_> = args.iter().map(|a| String::from_utf8_lossy(a)).collect();
        format!("{args:?} got {:?}", String::from_utf8_lossy(reply))
    };
    // Fed one byte at a time, the parser reads no further than the reply's end, so what is
    // left over is exactly what followed it.
    let mut rest = OneByte(reply);
    if let Err(e) = redis::Parser::new().parse_value(&mut rest) {
        panic!("not a reply ({e}): {}", shown());
    }
    assert!(rest.0.is_empty(), "more than one reply: {}", shown());
}

/// A reader that hands out one byte per read.
struct OneByte<'a>(&'a [u8]);

impl std::io::Read for OneByte<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match (self.0.split_first(), buf.first_mut()) {
            (Some((&b, rest)), Some(slot)) => {
                *slot = b;
                self.0 = rest;
                Ok(1)
            }
            _ => Ok(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_is_one_whole_reply() {
        one_reply(&[b"PING".to_vec()], b"+PONG\r\n");
        one_reply(&[b"X".to_vec()], b"-ERR unknown command\r\n");
        one_reply(&[b"X".to_vec()], b"*2\r\n:1\r\n$1\r\na\r\n");
        for bad in [
            &b"+PONG\r\n+PONG\r\n"[..],
            b"+PONG",
            b"$5\r\nab\r\n",
            b"PONG\r\n",
        ] {
            let result = std::panic::catch_unwind(|| one_reply(&[b"PING".to_vec()], bad));
            assert!(result.is_err(), "{:?} passed", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn a_stream_reads_the_same_split_anywhere() {
        let stream = b"*1\r\n$4\r\nPING\r\nECHO a\r\n*1\r\n$2\r\nab";
        let whole = read(&[stream]);
        assert_eq!(whole.commands.len(), 2);
        assert_eq!(whole.end, End::Incomplete(10));
        for at in split_points(stream.len()) {
            let (a, b) = stream.split_at(at);
            assert_eq!(read(&[a, b]), whole, "split at {at}");
        }
    }
}
