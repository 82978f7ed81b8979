//! One pipelined connection to one server.
//!
//! memcached answers a connection's commands in the order it received them, so many callers
//! share one socket: a caller appends its requests to the connection's outgoing buffer and
//! takes its place in the queue of pending replies, both under one lock (so the order of
//! the queue is the order on the wire), and wakes the writer task; the writer sends all that
//! has gathered in one `write`, and the reader task hands each reply to the oldest waiting
//! caller. Under load many decisions thus share each system call, on our side and on
//! memcached's; a lone request still goes at once.
//!
//! The queue is bounded ([`MAX_PENDING`] requests): a caller waits for room (within its
//! deadline) rather than piling up work the server cannot keep up with. A caller that gives
//! up (a timeout) leaves its place in the queue, and its replies are dropped when they
//! arrive. A connection that fails (a write or read error, or the server closing it) fails
//! every pending caller with an I/O error, so none is left to guess (never a silent admit),
//! and the pool opens a new connection for the next call. A reply that breaks the protocol
//! closes the connection too, since the stream can no longer be trusted.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{Notify, Semaphore, oneshot};
use tokio::task::AbortHandle;

use crate::MemcachedError;
use smallvec::SmallVec;

use crate::protocol::{Expect, Reply, Requests, parse};

/// Requests written and not yet answered, at most, per connection.
pub const MAX_PENDING: usize = 1024;

/// Bytes the writer sends in one `write` at most.
const MAX_WRITE: usize = 256 << 10;

type Answer = oneshot::Sender<Result<Vec<Reply>, MemcachedError>>;

/// One caller's requests, written back to back, waiting for their replies.
struct Waiting {
    /// Room in the queue this caller holds, given back with its last reply.
    room: u32,
    expects: SmallVec<[Expect; 4]>,
    replies: Vec<Reply>,
    answer: Answer,
}

/// What callers hand to the writer and the reader, under one lock.
struct Queue {
    closed: Option<String>,
    /// Requests not yet written.
    outgoing: Vec<u8>,
    /// Callers whose requests are in `outgoing` (the last ones of `waiting`; after a
    /// partial write, an upper bound).
    unwritten: usize,
    /// Callers whose requests are written or in `outgoing`, oldest first.
    waiting: VecDeque<Waiting>,
}

struct Shared {
    address: String,
    queue: Mutex<Queue>,
    alive: AtomicBool,
    /// Room in the queue, in requests.
    room: Semaphore,
    /// Wakes the writer when `outgoing` has something.
    write: Notify,
}

impl Shared {
    fn io(&self, message: impl Into<String>) -> MemcachedError {
        MemcachedError::Io {
            server: self.address.clone(),
            message: message.into(),
        }
    }

    /// Closes the connection: every waiting caller, and every later one, gets an error.
    /// `failed`: the server failed (the pool marks it down), rather than one reply being
    /// unreadable (the callers caught in it may simply try again).
    fn close(&self, why: &str, failed: bool) {
        self.alive.store(false, Ordering::Release);
        let waiting = {
            let mut queue = self.queue.lock();
            queue.closed.get_or_insert_with(|| why.to_owned());
            queue.outgoing = Vec::new();
            queue.unwritten = 0;
            std::mem::take(&mut queue.waiting)
        };
        // Callers waiting for room give up at once.
        self.room.close();
        // The writer wakes and finds the connection closed.
        self.write.notify_one();
        for waiting in waiting {
            let error = if failed {
                self.io(why)
            } else {
                MemcachedError::Server {
                    server: self.address.clone(),
                    message: why.to_owned(),
                }
            };
            let _ = waiting.answer.send(Err(error));
        }
    }
}

/// Stops the reader and the writer when the last handle on the connection goes.
struct Tasks([AbortHandle; 2]);

impl Drop for Tasks {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// A pipelined connection. Cheap to clone; the connection closes when the last clone goes.
#[derive(Clone)]
pub struct Connection {
    shared: Arc<Shared>,
    _tasks: Arc<Tasks>,
}

impl Connection {
    /// Connects to `address` (`host:port`).
    pub async fn open(address: &str) -> Result<Connection, MemcachedError> {
        let io = |e: std::io::Error| MemcachedError::Io {
            server: address.to_owned(),
            message: e.to_string(),
        };
        let stream = TcpStream::connect(address).await.map_err(io)?;
        stream.set_nodelay(true).map_err(io)?;
        let (read, write) = stream.into_split();
        let shared = Arc::new(Shared {
            address: address.to_owned(),
            queue: Mutex::new(Queue {
                closed: None,
                outgoing: Vec::with_capacity(16 << 10),
                unwritten: 0,
                waiting: VecDeque::new(),
            }),
            alive: AtomicBool::new(true),
            room: Semaphore::new(MAX_PENDING),
            write: Notify::new(),
        });
        let reader = tokio::spawn(read_replies(read, shared.clone()));
        let writer = tokio::spawn(write_requests(write, shared.clone()));
        Ok(Connection {
            shared,
            _tasks: Arc::new(Tasks([reader.abort_handle(), writer.abort_handle()])),
        })
    }

    pub fn is_alive(&self) -> bool {
        self.shared.alive.load(Ordering::Acquire)
    }

    /// Sends `requests` one after the other on this connection (pipelined, behind those of
    /// other callers) and waits for their replies, in order.
    pub async fn call_many(&self, requests: Requests) -> Result<Vec<Reply>, MemcachedError> {
        let shared = &self.shared;
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        // A call longer than the queue takes all of it (and waits for it to empty).
        let room = requests.len().min(MAX_PENDING) as u32;
        // The room is given back by the reader as the replies arrive.
        shared
            .room
            .acquire_many(room)
            .await
            .map_err(|_| shared.io("connection closed"))?
            .forget();
        let (answer, replies) = oneshot::channel();
        let Requests { bytes, expects } = requests;
        let was_idle = {
            let mut queue = shared.queue.lock();
            if let Some(why) = &queue.closed {
                return Err(shared.io(why.clone()));
            }
            let was_idle = queue.outgoing.is_empty();
            queue.outgoing.extend_from_slice(&bytes);
            queue.unwritten += 1;
            queue.waiting.push_back(Waiting {
                room,
                replies: Vec::with_capacity(expects.len()),
                expects,
                answer,
            });
            was_idle
        };
        if was_idle {
            shared.write.notify_one();
        }
        replies.await.map_err(|_| shared.io("connection closed"))?
    }
}

async fn write_requests(mut write: OwnedWriteHalf, shared: Arc<Shared>) {
    let mut batch = Vec::with_capacity(16 << 10);
    loop {
        shared.write.notified().await;
        let busy = {
            let queue = shared.queue.lock();
            queue.waiting.len() > queue.unwritten
        };
        if busy {
            // Replies are on their way, so nothing waits on the wire: callers ready to run
            // now add their requests first, and one write carries them all. An idle
            // connection writes at once.
            tokio::task::yield_now().await;
        }
        loop {
            batch.clear();
            {
                let mut queue = shared.queue.lock();
                if queue.closed.is_some() {
                    return;
                }
                if queue.outgoing.len() <= MAX_WRITE {
                    // Swap rather than copy; the callers go on with the emptied buffer.
                    std::mem::swap(&mut batch, &mut queue.outgoing);
                    queue.unwritten = 0;
                } else {
                    batch.extend_from_slice(&queue.outgoing[..MAX_WRITE]);
                    queue.outgoing.drain(..MAX_WRITE);
                }
            }
            if batch.is_empty() {
                break;
            }
            if let Err(e) = write.write_all(&batch).await {
                shared.close(&format!("write failed: {e}"), true);
                return;
            }
        }
    }
}

/// Answers the oldest waiting caller from `buffer[*start..]` as far as its replies are
/// there; `Ok(false)` once no complete reply is left. A malformed reply fails that caller
/// and closes the connection.
fn answer_from(shared: &Shared, buffer: &[u8], start: &mut usize) -> Result<bool, ()> {
    let mut queue = shared.queue.lock();
    let mut room = 0;
    let outcome = loop {
        let Some(front) = queue.waiting.front_mut() else {
            break Ok(false);
        };
        let expect = front.expects[front.replies.len()];
        match parse(&buffer[*start..], expect) {
            Ok(Some((reply, used))) => {
                *start += used;
                // `ERROR` and `CLIENT_ERROR` are one line: the stream stays in step.
                front.replies.push(reply);
                if front.replies.len() == front.expects.len() {
                    let done = queue.waiting.pop_front().expect("front");
                    room += done.room as usize;
                    let _ = done.answer.send(Ok(done.replies));
                }
            }
            Ok(None) => break Ok(true),
            Err(e) => {
                let failed = queue.waiting.pop_front().expect("front");
                drop(queue);
                let _ = failed.answer.send(Err(MemcachedError::Protocol {
                    server: shared.address.clone(),
                    message: e.0,
                }));
                shared.close("connection closed after a malformed reply", false);
                return Err(());
            }
        }
    };
    drop(queue);
    if room > 0 {
        shared.room.add_permits(room);
    }
    outcome
}

async fn read_replies(mut read: OwnedReadHalf, shared: Arc<Shared>) {
    let mut buffer: Vec<u8> = Vec::with_capacity(16 << 10);
    let mut start = 0;
    loop {
        let Ok(waiting) = answer_from(&shared, &buffer, &mut start) else {
            return;
        };
        if start == buffer.len() {
            buffer.clear();
            start = 0;
        } else if !waiting {
            shared.close("the server sent a reply to no request", false);
            return;
        } else if start > 64 << 10 {
            buffer.drain(..start);
            start = 0;
        }
        match read.read_buf(&mut buffer).await {
            Ok(0) => {
                shared.close("connection closed by the server", true);
                return;
            }
            Ok(_) => {}
            Err(e) => {
                shared.close(&format!("read failed: {e}"), true);
                return;
            }
        }
    }
}
