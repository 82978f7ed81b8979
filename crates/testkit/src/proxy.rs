//! A TCP proxy between code under test and a store, with faults switched at run time:
//! added latency, jitter, a bandwidth cap, black-holing (connections accepted, bytes never
//! forwarded), replies cut off by a half-close, and resetting every connection. It runs on a
//! thread of its own and stops when dropped.

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};

/// What the proxy does to the traffic now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Forward everything as it comes.
    None,
    /// Hold each chunk this long before forwarding it.
    Latency(Duration),
    /// Hold each chunk a different time, from none to this long, one after the other (order
    /// is kept, as TCP keeps it, so under load the delays add up: a harsh jitter).
    Jitter(Duration),
    /// Forward at most this many bytes per second each way.
    Throttle(u64),
    /// Forward half of the next chunk from the server, then close the way to the client
    /// (a FIN: the client reads half a reply, then the end), still reading what the client
    /// sends: a server or middlebox dying mid-reply.
    HalfClose,
    /// Forward nothing until the fault changes: the store seems to hang, and what was sent
    /// meanwhile arrives late (as TCP delivers it once a partition heals), never lost.
    BlackHole,
    /// Close every connection, open or new, as soon as it is seen.
    Reset,
}

/// A running proxy to one upstream address; dropping it stops it and closes its
/// connections.
pub struct FaultProxy {
    address: SocketAddr,
    fault: watch::Sender<Fault>,
    connections: Arc<Mutex<usize>>,
    _stop: oneshot::Sender<()>,
}

impl FaultProxy {
    /// Starts a proxy on a free port of 127.0.0.1 to `upstream`, on a thread and runtime of
    /// its own (so it may be started and dropped inside a test's runtime).
    pub fn start(upstream: SocketAddr) -> io::Result<FaultProxy> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let address = listener.local_addr()?;
        let (fault, watched) = watch::channel(Fault::None);
        let (stop, stopped) = oneshot::channel::<()>();
        let connections = Arc::new(Mutex::new(0));
        let open = connections.clone();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        std::thread::spawn(move || {
            runtime.block_on(async move {
                let Ok(listener) = TcpListener::from_std(listener) else {
                    return;
                };
                tokio::pin!(stopped);
                loop {
                    let client = tokio::select! {
                        accepted = listener.accept() => match accepted {
                            Ok((client, _)) => client,
                            Err(_) => continue,
                        },
                        _ = &mut stopped => return,
                    };
                    let watched = watched.clone();
                    let open = open.clone();
                    tokio::spawn(async move {
                        *open.lock().unwrap() += 1;
                        let _ = relay(client, upstream, watched).await;
                        *open.lock().unwrap() -= 1;
                    });
                }
            });
        });
        Ok(FaultProxy {
            address,
            fault,
            connections,
            _stop: stop,
        })
    }

    /// Where clients connect.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Switches the fault for all traffic, open connections included.
    pub fn set(&self, fault: Fault) {
        self.fault.send_replace(fault);
    }

    /// Client connections the proxy holds now.
    pub fn connections(&self) -> usize {
        *self.connections.lock().unwrap()
    }
}

/// Relays one client connection to `upstream` both ways, applying the fault of the moment.
async fn relay(
    client: TcpStream,
    upstream: SocketAddr,
    fault: watch::Receiver<Fault>,
) -> io::Result<()> {
    if *fault.borrow() == Fault::Reset {
        return Ok(());
    }
    let server = TcpStream::connect(upstream).await?;
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let mut up = tokio::spawn(pipe(client_read, server_write, fault.clone(), false));
    let down = tokio::spawn(pipe(server_read, client_write, fault, true));
    // Either direction ending ends the connection (dropping both halves closes it), except
    // a half-close: then the client may still send, until it closes too.
    tokio::select! {
        _ = &mut up => {}
        ended = down => {
            if matches!(ended, Ok(Ok(Ended::HalfClosed))) {
                let _ = up.await;
            }
        }
    }
    Ok(())
}

/// How a direction of a relayed connection ended.
enum Ended {
    Closed,
    HalfClosed,
}

/// Copies `from` to `to` chunk by chunk under the fault of the moment; `downstream` is the
/// server-to-client direction (the one a half-close cuts).
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut fault: watch::Receiver<Fault>,
    downstream: bool,
) -> io::Result<Ended> {
    let mut buf = vec![0u8; 16 * 1024];
    // Jitter's delays: xorshift64, seeded per direction; all a test proxy needs.
    let mut state: u64 = if downstream { 0x9e37_79b9 } else { 0x85eb_ca6b };
    loop {
        let n = tokio::select! {
            read = from.read(&mut buf) => read?,
            // A switch to Reset closes open connections at once.
            changed = fault.changed() => {
                if changed.is_err() || *fault.borrow() == Fault::Reset {
                    return Ok(Ended::Closed);
                }
                continue;
            }
        };
        if n == 0 {
            return Ok(Ended::Closed);
        }
        loop {
            let now = *fault.borrow_and_update();
            match now {
                Fault::None => break,
                Fault::Latency(delay) => {
                    tokio::time::sleep(delay).await;
                    break;
                }
                Fault::Jitter(most) => {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    let nanos = most.as_nanos().max(1) as u64;
                    tokio::time::sleep(Duration::from_nanos(state % nanos)).await;
                    break;
                }
                Fault::Throttle(bytes_per_second) => {
                    let seconds = n as f64 / bytes_per_second.max(1) as f64;
                    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
                    break;
                }
                Fault::HalfClose if downstream => {
                    to.write_all(&buf[..n / 2]).await?;
                    to.shutdown().await?;
                    return Ok(Ended::HalfClosed);
                }
                Fault::HalfClose => break,
                Fault::BlackHole => {
                    if fault.changed().await.is_err() {
                        return Ok(Ended::Closed);
                    }
                }
                Fault::Reset => return Ok(Ended::Closed),
            }
        }
        to.write_all(&buf[..n]).await?;
    }
}
