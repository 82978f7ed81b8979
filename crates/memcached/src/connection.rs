//! One pipelined connection to one server.
//!
//! memcached answers a connection's commands in the order it received them, so many callers
//! can share one socket: a writer task sends requests as they come (batching those that
//! queue up), a reader task reads replies and hands each to the oldest waiting caller. A
//! caller that gives up (a timeout) leaves its slot in the queue, and its reply is dropped
//! when it arrives. A reply that breaks the protocol closes the connection, since the stream
//! can no longer be trusted: every waiting caller gets an error and the pool opens a new
//! connection for the next call.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{mpsc, oneshot};
use tokio::task::AbortHandle;

use crate::MemcachedError;
use crate::protocol::{Expect, Reply, parse};

type Answer = oneshot::Sender<Result<Reply, MemcachedError>>;

struct Request {
    bytes: Vec<u8>,
    expect: Expect,
    answer: Answer,
}

struct Waiting {
    expect: Expect,
    answer: Answer,
}

/// Requests written and not yet answered, oldest first.
struct Queue {
    closed: Option<String>,
    waiting: VecDeque<Waiting>,
}

struct Shared {
    address: String,
    queue: Mutex<Queue>,
    alive: AtomicBool,
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
            std::mem::take(&mut queue.waiting)
        };
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

/// Stops the reader when the last handle on the connection goes.
struct Tasks(AbortHandle);

impl Drop for Tasks {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A pipelined connection. Cheap to clone; the connection closes when the last clone goes.
#[derive(Clone)]
pub struct Connection {
    requests: mpsc::Sender<Request>,
    shared: Arc<Shared>,
    _tasks: Arc<Tasks>,
}

/// Requests written in one `write` at most.
const BATCH: usize = 128;

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
                waiting: VecDeque::new(),
            }),
            alive: AtomicBool::new(true),
        });
        let (requests, receiver) = mpsc::channel(4 * BATCH);
        let reader = tokio::spawn(read_replies(read, shared.clone()));
        tokio::spawn(write_requests(receiver, write, shared.clone()));
        Ok(Connection {
            requests,
            shared,
            _tasks: Arc::new(Tasks(reader.abort_handle())),
        })
    }

    pub fn is_alive(&self) -> bool {
        self.shared.alive.load(Ordering::Acquire)
    }

    /// Sends `requests` one after the other on this connection (pipelined) and waits for
    /// their replies, in order.
    pub async fn call_many(
        &self,
        requests: Vec<(Vec<u8>, Expect)>,
    ) -> Result<Vec<Reply>, MemcachedError> {
        let mut pending = Vec::with_capacity(requests.len());
        for (bytes, expect) in requests {
            let (answer, reply) = oneshot::channel();
            let request = Request {
                bytes,
                expect,
                answer,
            };
            self.requests
                .send(request)
                .await
                .map_err(|_| self.shared.io("connection closed"))?;
            pending.push(reply);
        }
        let mut replies = Vec::with_capacity(pending.len());
        for reply in pending {
            let reply = reply
                .await
                .map_err(|_| self.shared.io("connection closed"))?;
            replies.push(reply?);
        }
        Ok(replies)
    }
}

async fn write_requests(
    mut receiver: mpsc::Receiver<Request>,
    mut write: OwnedWriteHalf,
    shared: Arc<Shared>,
) {
    let mut batch = Vec::with_capacity(16 << 10);
    while let Some(first) = receiver.recv().await {
        batch.clear();
        let mut next = Some(first);
        let mut taken = 0;
        while let Some(request) = next.take() {
            {
                let mut queue = shared.queue.lock();
                match &queue.closed {
                    Some(why) => {
                        let error = shared.io(why.clone());
                        drop(queue);
                        let _ = request.answer.send(Err(error));
                    }
                    None => {
                        // Queued before it is written, so its reply always finds it.
                        queue.waiting.push_back(Waiting {
                            expect: request.expect,
                            answer: request.answer,
                        });
                        batch.extend_from_slice(&request.bytes);
                    }
                }
            }
            taken += 1;
            if taken < BATCH && batch.len() < 64 << 10 {
                next = receiver.try_recv().ok();
            }
        }
        if batch.is_empty() {
            continue;
        }
        if let Err(e) = write.write_all(&batch).await {
            shared.close(&format!("write failed: {e}"), true);
            return;
        }
    }
}

async fn read_replies(mut read: OwnedReadHalf, shared: Arc<Shared>) {
    let mut buffer: Vec<u8> = Vec::with_capacity(16 << 10);
    let mut start = 0;
    loop {
        loop {
            let expect = match shared.queue.lock().waiting.front() {
                Some(waiting) => waiting.expect,
                None => break,
            };
            match parse(&buffer[start..], expect) {
                Ok(Some((reply, used))) => {
                    start += used;
                    // `ERROR` and `CLIENT_ERROR` are one line: the stream stays in step.
                    let waiting = shared.queue.lock().waiting.pop_front();
                    if let Some(waiting) = waiting {
                        let _ = waiting.answer.send(Ok(reply));
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    let waiting = shared.queue.lock().waiting.pop_front();
                    if let Some(waiting) = waiting {
                        let _ = waiting.answer.send(Err(MemcachedError::Protocol {
                            server: shared.address.clone(),
                            message: e.0,
                        }));
                    }
                    shared.close("connection closed after a malformed reply", false);
                    return;
                }
            }
        }
        if start == buffer.len() {
            buffer.clear();
            start = 0;
        } else if shared.queue.lock().waiting.is_empty() {
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
