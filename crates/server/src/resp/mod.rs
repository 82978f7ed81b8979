//! The Redis protocol listener (`--resp-listen`): redis-cell's `CL.THROTTLE`, sluice's
//! `SLUICE.CHECK`, leases and reservations (`SLUICE.ACQUIRE` ...), and the handful of
//! commands clients send on connecting. Pipelined commands are answered in order with one write per batch. Unknown commands get
//! an error reply; only a stream that cannot be parsed further is closed (after a reply
//! saying why). Idle and half-sent commands time out, so slow clients cannot hold sockets.

pub(crate) mod command;
pub(crate) mod frame;
mod leases;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::listener::{Connection, Listener};
use crate::service::Service;
use command::After;
use frame::Parsed;

/// A connection with nothing to say for this long is closed (the listener's default
/// [`Limits::idle`](crate::Limits::idle)).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// A command begun must be complete within this time (slowloris).
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves the Redis protocol on `listener` until `shutdown` completes.
pub(crate) async fn serve(
    listener: Listener,
    service: Arc<Service>,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            () = &mut shutdown => return,
            c = listener.accept() => c,
        };
        let service = service.clone();
        tokio::spawn(async move { connection(stream, &service).await });
    }
}

/// Bytes read at once while a command is incomplete or commands are pipelined.
const READ_SIZE: usize = 16 * 1024;
/// Buffers grown past this by a burst are given back once the connection is idle again, so
/// ten thousand idle clients hold only what their last commands needed.
const KEEP_WHEN_IDLE: usize = 4 * 1024;

async fn connection(mut stream: Connection, service: &Service) {
    let mut buf: Vec<u8> = Vec::new();
    let mut out: Vec<u8> = Vec::new();
    // When the command now in `buf` began: it must complete within COMMAND_TIMEOUT.
    let mut begun: Option<tokio::time::Instant> = None;
    loop {
        // Answer every complete command already read, then write once.
        let mut consumed = 0;
        let mut close = false;
        loop {
            match frame::parse(&buf[consumed..]) {
                Parsed::Command(args, used) => {
                    consumed += used;
                    if command::run(service, &args, &mut out).await == After::Close {
                        close = true;
                        break;
                    }
                }
                Parsed::Incomplete => break,
                Parsed::Invalid(message) => {
                    out.extend_from_slice(format!("-ERR {message}\r\n").as_bytes());
                    close = true;
                    break;
                }
            }
        }
        buf.drain(..consumed);
        if !out.is_empty() {
            if stream.write_all(&out).await.is_err() {
                return;
            }
            out.clear();
        }
        if close {
            let _ = stream.shutdown().await;
            return;
        }
        let read = if buf.is_empty() {
            // Idle between commands: the listener's idle deadline closes the connection.
            // The wait holds no large buffer: the first bytes land on the task's own.
            begun = None;
            if buf.capacity() > KEEP_WHEN_IDLE {
                buf = Vec::new();
            }
            if out.capacity() > KEEP_WHEN_IDLE {
                out = Vec::new();
            }
            let mut first = [0u8; 512];
            let read = stream.read(&mut first).await;
            if let Ok(n) = read {
                buf.extend_from_slice(&first[..n]);
            }
            read
        } else {
            let deadline = *begun.get_or_insert_with(tokio::time::Instant::now) + COMMAND_TIMEOUT;
            buf.reserve(READ_SIZE);
            match tokio::time::timeout_at(deadline, stream.read_buf(&mut buf)).await {
                Ok(read) => read,
                Err(_) => return,
            }
        };
        if matches!(read, Ok(0) | Err(_)) {
            return;
        }
    }
}
