//! The Redis protocol listener (`--resp-listen`): redis-cell's `CL.THROTTLE`, sluice's
//! `SLUICE.CHECK`, and the handful of commands clients send on connecting.
//! Pipelined commands are answered in order with one write per batch. Unknown commands get
//! an error reply; only a stream that cannot be parsed further is closed (after a reply
//! saying why). Idle and half-sent commands time out, so slow clients cannot hold sockets.

pub(crate) mod command;
pub(crate) mod frame;

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

async fn connection(mut stream: Connection, service: &Service) {
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    let mut out: Vec<u8> = Vec::with_capacity(4096);
    let mut chunk = vec![0u8; 16 * 1024];
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
        // Idle between commands: the listener's idle deadline closes the connection.
        let read = if buf.is_empty() {
            begun = None;
            stream.read(&mut chunk).await
        } else {
            let deadline = *begun.get_or_insert_with(tokio::time::Instant::now) + COMMAND_TIMEOUT;
            match tokio::time::timeout_at(deadline, stream.read(&mut chunk)).await {
                Ok(read) => read,
                Err(_) => return,
            }
        };
        match read {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}
