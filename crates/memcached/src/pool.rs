//! The servers of a pool: pipelined connections (one each by default), routing by the ring,
//! servers marked down when they fail, and every call bounded by a deadline.
//!
//! A server that refuses a connection, drops one, or times out three calls in a row is
//! marked down for a while ([`PoolConfig::down_for`]): its keys go to the next live server
//! on the ring (no other key moves), and once the while is over it is tried again. A call
//! that could not even connect ran nowhere, so it moves on to the next live server at once;
//! a call that failed on an open connection may have run, so it fails (transiently) and the
//! limiter's failure policy decides that hit.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::{Instant, timeout_at};

use crate::MemcachedError;
use crate::connection::Connection;
use crate::protocol::{Reply, Requests};
use crate::ring::Ring;
use crate::stats::Counters;

/// How long one call may take: the store's timeout from the start of a decision.
#[derive(Debug, Clone, Copy)]
pub struct Deadline {
    pub at: Instant,
    pub budget: Duration,
}

impl Deadline {
    pub fn after(budget: Duration) -> Deadline {
        Deadline {
            at: Instant::now() + budget,
            budget,
        }
    }
}

/// Timeouts in a row after which a server is marked down.
const TIMEOUTS_BEFORE_DOWN: u32 = 3;

#[derive(Debug, Clone)]
pub struct PoolConfig {
    pub connections: usize,
    pub connect_timeout: Duration,
    pub down_for: Duration,
}

struct Slot {
    live: parking_lot::Mutex<Option<Connection>>,
    connecting: tokio::sync::Mutex<()>,
}

struct Server {
    address: String,
    slots: Box<[Slot]>,
    next: AtomicUsize,
    /// Pool-clock nanoseconds until which the server is skipped.
    down_until: AtomicU64,
    /// Marked down since its last good reply: its next good reply is logged as its return.
    was_down: AtomicBool,
    timeouts: AtomicU32,
}

pub struct Pool {
    servers: Vec<Server>,
    ring: Ring,
    started: std::time::Instant,
    config: PoolConfig,
    pub(crate) counters: Counters,
}

/// Why a connection could not be had.
enum Unreachable {
    /// Connecting failed: nothing was sent, the call may go elsewhere.
    Refused(MemcachedError),
    /// The deadline passed while waiting.
    Late,
}

impl Pool {
    pub fn new(addresses: Vec<String>, config: PoolConfig) -> Pool {
        let servers = addresses
            .iter()
            .map(|address| Server {
                address: address.clone(),
                slots: (0..config.connections.max(1))
                    .map(|_| Slot {
                        live: parking_lot::Mutex::new(None),
                        connecting: tokio::sync::Mutex::new(()),
                    })
                    .collect(),
                next: AtomicUsize::new(0),
                down_until: AtomicU64::new(0),
                was_down: AtomicBool::new(false),
                timeouts: AtomicU32::new(0),
            })
            .collect();
        Pool {
            ring: Ring::new(&addresses),
            servers,
            started: std::time::Instant::now(),
            config,
            counters: Counters::default(),
        }
    }

    pub fn addresses(&self) -> impl Iterator<Item = &str> {
        self.servers.iter().map(|s| s.address.as_str())
    }

    fn clock(&self) -> u64 {
        self.started.elapsed().as_nanos() as u64
    }

    fn is_down(&self, server: usize) -> bool {
        self.servers[server].down_until.load(Ordering::Relaxed) > self.clock()
    }

    /// Skips `server` for the configured while; logs it once per time it goes down (not for
    /// every call that finds it failing while it is already down).
    fn mark_down(&self, server: usize, reason: &dyn std::fmt::Display) {
        let until = self.clock() + self.config.down_for.as_nanos() as u64;
        let entry = &self.servers[server];
        let before = entry.down_until.swap(until, Ordering::Relaxed);
        if before <= self.clock() {
            Counters::bump(&self.counters.servers_marked_down);
            if !entry.was_down.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    server = %entry.address,
                    %reason,
                    skipped_for = ?self.config.down_for,
                    "memcached server marked down; its keys go to the next server"
                );
            }
        }
    }

    /// Notes a good reply from `server`: logs its return if it was marked down.
    fn mark_up(&self, server: usize) {
        let entry = &self.servers[server];
        if entry.was_down.load(Ordering::Relaxed) && entry.was_down.swap(false, Ordering::Relaxed) {
            tracing::info!(server = %entry.address, "memcached server answers again");
        }
    }

    /// Which server holds `route` now: `None` when every server is marked down.
    pub fn server_for(&self, route: &str) -> Option<usize> {
        self.ring.server(route, |s| self.is_down(s))
    }

    /// Which server holds `route` when all are up.
    pub fn owner_of(&self, route: &str) -> usize {
        self.ring.owner(route)
    }

    async fn connection(
        &self,
        server: usize,
        deadline: Deadline,
    ) -> Result<Connection, Unreachable> {
        let server = &self.servers[server];
        let slot = &server.slots[server.next.fetch_add(1, Ordering::Relaxed) % server.slots.len()];
        let live = || slot.live.lock().as_ref().filter(|c| c.is_alive()).cloned();
        if let Some(connection) = live() {
            return Ok(connection);
        }
        let _connecting = timeout_at(deadline.at, slot.connecting.lock())
            .await
            .map_err(|_| Unreachable::Late)?;
        if let Some(connection) = live() {
            return Ok(connection);
        }
        let until = deadline
            .at
            .min(Instant::now() + self.config.connect_timeout);
        let connection = match timeout_at(until, Connection::open(&server.address)).await {
            Ok(Ok(connection)) => connection,
            Ok(Err(e)) => return Err(Unreachable::Refused(e)),
            Err(_) => {
                return Err(Unreachable::Refused(MemcachedError::Io {
                    server: server.address.clone(),
                    message: "connect timed out".into(),
                }));
            }
        };
        *slot.live.lock() = Some(connection.clone());
        Ok(connection)
    }

    /// Sends `requests` (pipelined, in order) to the server holding `route` and returns the
    /// replies. `SERVER_ERROR`, `ERROR` and `CLIENT_ERROR` replies become errors.
    pub async fn call(
        &self,
        route: &str,
        requests: Requests,
        deadline: Deadline,
    ) -> Result<Vec<Reply>, MemcachedError> {
        for _ in 0..self.servers.len() {
            let server = self.server_for(route).ok_or(MemcachedError::NoServer)?;
            match self.connection(server, deadline).await {
                Ok(connection) => {
                    if server != self.owner_of(route) {
                        Counters::bump(&self.counters.rerouted);
                    }
                    return self.call_on(server, &connection, requests, deadline).await;
                }
                Err(Unreachable::Late) => return Err(MemcachedError::Timeout(deadline.budget)),
                Err(Unreachable::Refused(e)) => self.mark_down(server, &e),
            }
        }
        Err(MemcachedError::NoServer)
    }

    /// Sends `requests` to one server, whatever the ring says (stats, version).
    pub async fn call_server(
        &self,
        server: usize,
        requests: Requests,
        deadline: Deadline,
    ) -> Result<Vec<Reply>, MemcachedError> {
        match self.connection(server, deadline).await {
            Ok(connection) => self.call_on(server, &connection, requests, deadline).await,
            Err(Unreachable::Late) => Err(MemcachedError::Timeout(deadline.budget)),
            Err(Unreachable::Refused(e)) => {
                self.mark_down(server, &e);
                Err(e)
            }
        }
    }

    async fn call_on(
        &self,
        index: usize,
        connection: &Connection,
        requests: Requests,
        deadline: Deadline,
    ) -> Result<Vec<Reply>, MemcachedError> {
        let server = &self.servers[index];
        let replies = match timeout_at(deadline.at, connection.call_many(requests)).await {
            Err(_) => {
                if server.timeouts.fetch_add(1, Ordering::Relaxed) + 1 >= TIMEOUTS_BEFORE_DOWN {
                    self.mark_down(index, &"timed out repeatedly");
                }
                return Err(MemcachedError::Timeout(deadline.budget));
            }
            Ok(Err(e @ MemcachedError::Io { .. })) => {
                self.mark_down(index, &e);
                return Err(e);
            }
            Ok(Err(e)) => return Err(e),
            Ok(Ok(replies)) => replies,
        };
        server.timeouts.store(0, Ordering::Relaxed);
        self.mark_up(index);
        for reply in &replies {
            match reply {
                Reply::ServerError(message) => {
                    return Err(MemcachedError::Server {
                        server: server.address.clone(),
                        message: message.clone(),
                    });
                }
                Reply::ClientError(message) => {
                    return Err(MemcachedError::Protocol {
                        server: server.address.clone(),
                        message: message.clone(),
                    });
                }
                _ => {}
            }
        }
        Ok(replies)
    }

    pub fn len(&self) -> usize {
        self.servers.len()
    }
}
