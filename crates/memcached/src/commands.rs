//! Typed commands over the pool: each sends one or a few pipelined requests to the server
//! holding a route and checks that the replies are the ones the command can get.

use std::collections::{HashMap, HashSet};

use crate::MemcachedError;
use crate::pool::{Deadline, Pool};
use crate::protocol::{self, Expect, Reply, Requests, Verb};
use crate::stats::ServerStats;

/// Keys per `get` request: a sliding window of many sub-windows reads in several pipelined
/// requests rather than one very long line.
const KEYS_PER_GET: usize = 100;

/// Keys asked for in order, as a multi-key `get` writes them and its replies name them.
pub(crate) trait KeyList {
    fn count(&self) -> usize;
    /// About how many bytes the keys take, each with a space.
    fn bytes(&self) -> usize;
    /// Writes key `i`.
    fn write(&self, i: usize, out: &mut Vec<u8>);
    /// Where `key` stands among keys `from..`, if it is one of them.
    fn find(&self, from: usize, key: &str) -> Option<usize>;
}

impl KeyList for [String] {
    fn count(&self) -> usize {
        self.len()
    }

    fn bytes(&self) -> usize {
        self.iter().map(|key| key.len() + 1).sum()
    }

    fn write(&self, i: usize, out: &mut Vec<u8>) {
        out.extend_from_slice(self[i].as_bytes());
    }

    fn find(&self, from: usize, key: &str) -> Option<usize> {
        Some(from + self[from..].iter().position(|k| k == key)?)
    }
}

/// How a storage command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreReply {
    Stored,
    /// `add` of a key that exists.
    NotStored,
    /// `cas` after another client changed the key.
    Exists,
    /// `cas` of a key that is gone.
    NotFound,
}

fn protocol(pool: &Pool, route: &str, message: String) -> MemcachedError {
    let server = pool
        .server_for(route)
        .and_then(|s| pool.addresses().nth(s))
        .unwrap_or("?")
        .to_owned();
    MemcachedError::Protocol { server, message }
}

fn wrong(pool: &Pool, route: &str, command: &str, reply: &Reply) -> MemcachedError {
    protocol(
        pool,
        route,
        format!("unexpected reply to {command}: {reply:?}"),
    )
}

impl Pool {
    /// `get` of `keys` (all routed by `route`): the values found, by key.
    pub async fn get(
        &self,
        route: &str,
        keys: &[String],
        deadline: Deadline,
    ) -> Result<HashMap<String, Vec<u8>>, MemcachedError> {
        let replies = self.call(route, get_requests(keys), deadline).await?;
        self.found(route, keys, replies)
    }

    /// The values of `get` replies, by key, each asked for and given once.
    fn found(
        &self,
        route: &str,
        keys: &[String],
        replies: Vec<Reply>,
    ) -> Result<HashMap<String, Vec<u8>>, MemcachedError> {
        let asked: HashSet<&str> = keys.iter().map(String::as_str).collect();
        let mut found = HashMap::new();
        for reply in replies {
            let Reply::Values(items) = reply else {
                return Err(wrong(self, route, "get", &reply));
            };
            for item in items {
                if !asked.contains(item.key.as_str()) || found.contains_key(&item.key) {
                    let message = format!("get answered key {} unasked or twice", item.key);
                    return Err(protocol(self, route, message));
                }
                found.insert(item.key, item.value);
            }
        }
        Ok(found)
    }

    /// `get` of `keys` (all routed by `route`): the value of each, in the order asked.
    pub async fn get_in_order(
        &self,
        route: &str,
        keys: &(impl KeyList + ?Sized),
        deadline: Deadline,
    ) -> Result<Vec<Option<Vec<u8>>>, MemcachedError> {
        let replies = self.call(route, get_requests(keys), deadline).await?;
        self.found_in_order(route, keys, replies)
    }

    /// The values of `get` replies, in the order of `keys`: memcached answers the keys of a
    /// `get` in the order asked (skipping those it lacks), so no key needs hashing.
    fn found_in_order(
        &self,
        route: &str,
        keys: &(impl KeyList + ?Sized),
        replies: Vec<Reply>,
    ) -> Result<Vec<Option<Vec<u8>>>, MemcachedError> {
        let mut found = vec![None; keys.count()];
        let mut next = 0;
        for reply in replies {
            let Reply::Values(items) = reply else {
                return Err(wrong(self, route, "get", &reply));
            };
            for item in items {
                let Some(at) = keys.find(next, &item.key) else {
                    let message = format!(
                        "get answered key {} unasked, twice or out of order",
                        item.key
                    );
                    return Err(protocol(self, route, message));
                };
                found[at] = Some(item.value);
                next = at + 1;
            }
        }
        Ok(found)
    }

    /// `gets` of one key: its value and CAS unique, if it exists.
    pub async fn gets(
        &self,
        route: &str,
        key: &str,
        deadline: Deadline,
    ) -> Result<Option<(Vec<u8>, u64)>, MemcachedError> {
        let requests = Requests::one(key.len() + 8, Expect::ValuesWithCas, |out| {
            protocol::get(out, &[key], true)
        });
        let reply = self.one(route, requests, deadline).await?;
        self.cas_item(route, key, reply)
    }

    /// `gets` of `key` and `add` of `value` under it, pipelined in one round trip: what
    /// `gets` found, and how the `add` ended (stored only if the key was absent when it came).
    pub async fn gets_and_add(
        &self,
        route: &str,
        key: &str,
        exptime: u32,
        value: &[u8],
        deadline: Deadline,
    ) -> Result<(Option<(Vec<u8>, u64)>, StoreReply), MemcachedError> {
        let mut requests = Requests::with_capacity(2 * key.len() + value.len() + 48);
        requests.push(Expect::ValuesWithCas, |out| {
            protocol::get(out, &[key], true)
        });
        requests.push(Expect::Stored, |out| {
            protocol::store(out, Verb::Add, key, exptime, value)
        });
        let mut replies = self.call(route, requests, deadline).await?;
        let (Some(added), Some(read), true) = (replies.pop(), replies.pop(), replies.is_empty())
        else {
            return Err(protocol(
                self,
                route,
                "two requests, not two replies".into(),
            ));
        };
        let added = stored(self, route, Verb::Add, &added)?;
        Ok((self.cas_item(route, key, read)?, added))
    }

    /// The one item of a `gets` reply for `key`, if any.
    fn cas_item(
        &self,
        route: &str,
        key: &str,
        reply: Reply,
    ) -> Result<Option<(Vec<u8>, u64)>, MemcachedError> {
        let Reply::Values(mut items) = reply else {
            return Err(wrong(self, route, "gets", &reply));
        };
        match items.pop() {
            None => Ok(None),
            Some(item) if items.is_empty() && item.key == key && item.cas.is_some() => {
                Ok(item.cas.map(|unique| (item.value, unique)))
            }
            Some(item) => Err(protocol(
                self,
                route,
                format!(
                    "gets {key} answered {} items, key {}",
                    items.len() + 1,
                    item.key
                ),
            )),
        }
    }

    /// `set`, `add` or `cas` of one key.
    pub async fn store(
        &self,
        route: &str,
        verb: Verb,
        key: &str,
        exptime: u32,
        value: &[u8],
        deadline: Deadline,
    ) -> Result<StoreReply, MemcachedError> {
        let requests = Requests::one(key.len() + value.len() + 40, Expect::Stored, |out| {
            protocol::store(out, verb, key, exptime, value)
        });
        let reply = self.one(route, requests, deadline).await?;
        stored(self, route, verb, &reply)
    }

    /// `add` of a counter, with a `set` of another key in the same round trip.
    pub async fn add_with(
        &self,
        route: &str,
        (key, value): (&str, &[u8]),
        (other, other_value): (&str, &[u8]),
        exptime: u32,
        deadline: Deadline,
    ) -> Result<StoreReply, MemcachedError> {
        let mut requests = Requests::default();
        add_with_requests(&mut requests, (key, value), (other, other_value), exptime);
        let mut replies = self.call(route, requests, deadline).await?;
        let added = self.added_with(route, &mut replies)?;
        if !replies.is_empty() {
            return Err(protocol(self, route, "more replies than requests".into()));
        }
        Ok(added)
    }

    /// How an `add` and `set` from [`add_with_requests`] ended, from the last two of
    /// `replies` (taken off): the `add`'s reply, once the `set` is known stored.
    fn added_with(
        &self,
        route: &str,
        replies: &mut Vec<Reply>,
    ) -> Result<StoreReply, MemcachedError> {
        let (Some(set), Some(added)) = (replies.pop(), replies.pop()) else {
            return Err(protocol(self, route, "fewer replies than requests".into()));
        };
        stored(self, route, Verb::Set, &set)?;
        stored(self, route, Verb::Add, &added)
    }

    /// `get` of `keys`, then `add` of a counter and `set` of another key (as
    /// [`Pool::add_with`]), pipelined in one round trip: the value of each key read, in the
    /// order asked, and how the `add` ended (stored only if the counter was absent when it
    /// came, after the `get`).
    pub async fn get_and_add_with(
        &self,
        route: &str,
        keys: &(impl KeyList + ?Sized),
        (key, value): (&str, &[u8]),
        (other, other_value): (&str, &[u8]),
        exptime: u32,
        deadline: Deadline,
    ) -> Result<(Vec<Option<Vec<u8>>>, StoreReply), MemcachedError> {
        let mut requests = get_requests(keys);
        add_with_requests(&mut requests, (key, value), (other, other_value), exptime);
        let mut replies = self.call(route, requests, deadline).await?;
        let added = self.added_with(route, &mut replies)?;
        Ok((self.found_in_order(route, keys, replies)?, added))
    }

    /// `get` of `keys` and `incr` of `key` by `by`, pipelined in one round trip: the value
    /// of each key, in the order asked, and the new count (`None` if `key` is absent).
    pub async fn get_and_incr(
        &self,
        route: &str,
        keys: &[String],
        key: &str,
        by: u64,
        deadline: Deadline,
    ) -> Result<(Vec<Option<Vec<u8>>>, Option<u64>), MemcachedError> {
        let mut requests = get_requests(keys);
        requests.push(Expect::Number, |out| protocol::incr(out, key, by, true));
        let mut replies = self.call(route, requests, deadline).await?;
        let counted = match replies.pop() {
            Some(Reply::Number(value)) => Some(value),
            Some(Reply::NotFound) => None,
            other => {
                let message = format!("unexpected reply to incr: {other:?}");
                return Err(protocol(self, route, message));
            }
        };
        Ok((self.found_in_order(route, keys, replies)?, counted))
    }

    /// `incr` (`up`) or `decr` by `by`: the new value, or `None` if the key is gone.
    pub async fn incr(
        &self,
        route: &str,
        key: &str,
        by: u64,
        up: bool,
        deadline: Deadline,
    ) -> Result<Option<u64>, MemcachedError> {
        let requests = Requests::one(key.len() + 28, Expect::Number, |out| {
            protocol::incr(out, key, by, up)
        });
        match self.one(route, requests, deadline).await? {
            Reply::Number(value) => Ok(Some(value)),
            Reply::NotFound => Ok(None),
            other => Err(wrong(self, route, "incr", &other)),
        }
    }

    /// `delete` of `keys` (pipelined); missing keys are fine.
    pub async fn delete(
        &self,
        route: &str,
        keys: &[String],
        deadline: Deadline,
    ) -> Result<(), MemcachedError> {
        let mut requests = Requests::default();
        for key in keys {
            requests.push(Expect::Deleted, |out| protocol::delete(out, key));
        }
        for reply in self.call(route, requests, deadline).await? {
            if !matches!(reply, Reply::Deleted | Reply::NotFound) {
                return Err(wrong(self, route, "delete", &reply));
            }
        }
        Ok(())
    }

    /// `version` and `stats` of server `index`.
    pub async fn server_stats(
        &self,
        index: usize,
        deadline: Deadline,
    ) -> Result<ServerStats, MemcachedError> {
        let requests = Requests::one(16, Expect::Stats, protocol::stats);
        let replies = self.call_server(index, requests, deadline).await?;
        let address = self.addresses().nth(index).unwrap_or("?").to_owned();
        let Some(Reply::Stats(stats)) = replies.into_iter().next() else {
            return Err(MemcachedError::Protocol {
                server: address,
                message: "stats answered something else".into(),
            });
        };
        let find = |name: &str| stats.iter().find(|(n, _)| n == name).map(|(_, v)| v);
        let count = |name: &str| {
            find(name)
                .and_then(|v| protocol::number(v.as_bytes()))
                .unwrap_or(0)
        };
        Ok(ServerStats {
            evictions: count("evictions"),
            curr_items: count("curr_items"),
            uptime_seconds: count("uptime"),
            version: find("version").cloned().unwrap_or_default(),
            address,
        })
    }

    /// `version` of server `index`: whether it answers.
    pub async fn version(
        &self,
        index: usize,
        deadline: Deadline,
    ) -> Result<String, MemcachedError> {
        let requests = Requests::one(16, Expect::Version, protocol::version);
        let replies = self.call_server(index, requests, deadline).await?;
        match replies.into_iter().next() {
            Some(Reply::Version(version)) => Ok(version),
            other => Err(MemcachedError::Protocol {
                server: self.addresses().nth(index).unwrap_or("?").to_owned(),
                message: format!("version answered {other:?}"),
            }),
        }
    }

    async fn one(
        &self,
        route: &str,
        requests: Requests,
        deadline: Deadline,
    ) -> Result<Reply, MemcachedError> {
        let mut replies = self.call(route, requests, deadline).await?;
        match (replies.pop(), replies.is_empty()) {
            (Some(reply), true) => Ok(reply),
            _ => Err(protocol(self, route, "one request, not one reply".into())),
        }
    }
}

/// The `add` of `key` and the `set` of `other`, both expiring at `exptime`.
fn add_with_requests(
    requests: &mut Requests,
    (key, value): (&str, &[u8]),
    (other, other_value): (&str, &[u8]),
    exptime: u32,
) {
    let len = key.len() + value.len() + other.len() + other_value.len() + 80;
    requests.bytes.reserve(len);
    requests.push(Expect::Stored, |out| {
        protocol::store(out, Verb::Add, key, exptime, value)
    });
    requests.push(Expect::Stored, |out| {
        protocol::store(out, Verb::Set, other, exptime, other_value)
    });
}

/// `get` requests for `keys`, at most [`KEYS_PER_GET`] keys each, with room for a few
/// more requests after them (an `add` and a `set`, or an `incr`).
fn get_requests(keys: &(impl KeyList + ?Sized)) -> Requests {
    let n = keys.count();
    let mut requests = Requests::with_capacity(keys.bytes() + 8 * n.div_ceil(KEYS_PER_GET) + 160);
    for start in (0..n).step_by(KEYS_PER_GET) {
        requests.push(Expect::Values, |out| {
            out.extend_from_slice(b"get");
            for i in start..n.min(start + KEYS_PER_GET) {
                out.push(b' ');
                keys.write(i, out);
            }
            out.extend_from_slice(b"\r\n");
        });
    }
    requests
}

fn stored(
    pool: &Pool,
    route: &str,
    verb: Verb,
    reply: &Reply,
) -> Result<StoreReply, MemcachedError> {
    match (verb, reply) {
        (_, Reply::Stored) => Ok(StoreReply::Stored),
        (Verb::Add, Reply::NotStored) => Ok(StoreReply::NotStored),
        (Verb::Cas(_), Reply::Exists) => Ok(StoreReply::Exists),
        (Verb::Cas(_), Reply::NotFound) => Ok(StoreReply::NotFound),
        (_, other) => Err(wrong(pool, route, "a storage command", other)),
    }
}
