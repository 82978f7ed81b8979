//! How a call names its policy: by name, or by a handle taken once.

use std::fmt;
use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::policy::CompiledPolicy;

/// A handle on a compiled policy: cheap to clone and to hold, and decided on without a
/// lookup. It keeps its definition: a reload that replaces or removes the policy leaves a
/// handle taken before it deciding as it did (on the same counters, when the leaves are
/// unchanged). Take a new one with [`Limiter::policy`](crate::Limiter::policy) to follow a
/// reload.
pub type PolicyRef = Arc<CompiledPolicy>;

/// The policy a call is about: `"login"` (looked up when the call is made), `&handle`, or
/// `&watch` (a name that follows reloads without a lookup per call).
#[derive(Debug, Clone, Copy)]
pub enum PolicyArg<'a> {
    Name(&'a str),
    Ref(&'a PolicyRef),
    Watch(&'a PolicyWatch),
}

/// A policy named once, for code that decides under one name on every call (a middleware
/// layer): it follows reloads as the name does, and looks the name up again only after the
/// policies changed. Between reloads a call reads the handle it found last (through
/// `arc-swap`, as the limiter reads its table: no write to memory other threads read), where a
/// call by name hashes the name and searches the table.
///
/// One watch may serve several limiters (it looks up again when the limiter differs), but
/// it is meant for one.
pub struct PolicyWatch {
    name: String,
    /// What [`Limiter::watch`](crate::Limiter::watch) found when it made the watch: read
    /// without any atomic operation until the policies change.
    first: Seen,
    seen: ArcSwap<Seen>,
}

/// What a watch found, and when: the limiter and its policies' generation.
#[derive(Clone)]
pub(crate) struct Seen {
    pub limiter: u64,
    pub generation: u64,
    pub policy: Option<PolicyRef>,
}

impl PolicyWatch {
    /// A watch of `name` that looks it up on its first use.
    /// [`Limiter::watch`](crate::Limiter::watch) makes one that has looked it up already.
    pub fn new(name: impl Into<String>) -> PolicyWatch {
        // Limiter ids start at 1: nothing matches before the first lookup.
        let nothing = Seen {
            limiter: 0,
            generation: 0,
            policy: None,
        };
        PolicyWatch::found(name.into(), nothing)
    }

    pub(crate) fn found(name: String, first: Seen) -> PolicyWatch {
        PolicyWatch {
            name,
            seen: ArcSwap::from_pointee(first.clone()),
            first,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The handle [`Limiter::watch`](crate::Limiter::watch) found, borrowed, if it was found
    /// for `limiter` at `generation` (`Some(None)`: the name was unknown then).
    pub(crate) fn first_seen(&self, limiter: u64, generation: u64) -> Option<Option<&PolicyRef>> {
        let first = &self.first;
        (first.limiter == limiter && first.generation == generation)
            .then_some(first.policy.as_ref())
    }

    /// The handle found for `limiter` at `generation`, if that is what was seen last
    /// (`Some(None)`: the name was unknown then).
    pub(crate) fn seen(&self, limiter: u64, generation: u64) -> Option<Option<PolicyRef>> {
        let first = &self.first;
        if first.limiter == limiter && first.generation == generation {
            return Some(first.policy.clone());
        }
        let seen = self.seen.load();
        (seen.limiter == limiter && seen.generation == generation).then(|| seen.policy.clone())
    }

    pub(crate) fn remember(&self, seen: Seen) {
        self.seen.store(Arc::new(seen));
    }
}

impl Clone for PolicyWatch {
    fn clone(&self) -> Self {
        PolicyWatch {
            name: self.name.clone(),
            first: self.first.clone(),
            seen: ArcSwap::new(self.seen.load_full()),
        }
    }
}

impl fmt::Debug for PolicyWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("PolicyWatch").field(&self.name).finish()
    }
}

impl fmt::Display for PolicyWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

impl<'a> From<&'a str> for PolicyArg<'a> {
    fn from(name: &'a str) -> Self {
        PolicyArg::Name(name)
    }
}

impl<'a> From<&'a String> for PolicyArg<'a> {
    fn from(name: &'a String) -> Self {
        PolicyArg::Name(name)
    }
}

impl<'a> From<&'a PolicyRef> for PolicyArg<'a> {
    fn from(policy: &'a PolicyRef) -> Self {
        PolicyArg::Ref(policy)
    }
}

impl<'a> From<&'a PolicyWatch> for PolicyArg<'a> {
    fn from(watch: &'a PolicyWatch) -> Self {
        PolicyArg::Watch(watch)
    }
}
