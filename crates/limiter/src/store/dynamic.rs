//! [`DynStore`]: any [`Store`] behind one type.
//!
//! `Store` is written with `async fn`, so it cannot be a trait object as it is. The erased
//! form boxes the future of a store in another process (one allocation beside a network
//! round trip), and keeps the memory store as a variant of its own, called directly: the
//! in-process hot path pays one predictable branch, no allocation and no indirect call.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use std::time::Duration;

use sluice_core::Decision;
use sluice_core::algorithm::concurrency::Released;

use super::{Hit, Identifier, LeaseKeys, Settlement, Store, StoreError};
use crate::memory::MemoryStore;

type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Any store, chosen at run time: the memory store, Redis, memcached, or one of your own.
/// Cheap to clone (clones share the store). Build one with [`DynStore::new`]; a
/// [`Limiter`](crate::Limiter) does it for you.
#[derive(Clone)]
pub struct DynStore(Kind);

#[derive(Clone)]
enum Kind {
    Memory(MemoryStore),
    Other(Arc<dyn Erased>),
}

/// The object-safe face of a [`Store`].
trait Erased: Send + Sync + 'static {
    fn decide<'a>(&'a self, hit: &'a Hit<'a>) -> BoxFuture<'a, Result<Decision, StoreError>>;
    fn try_decide_now(&self, hit: &Hit<'_>) -> Option<Result<Decision, StoreError>>;
    fn reset<'a>(&'a self, identifiers: &'a [Identifier]) -> BoxFuture<'a, Result<(), StoreError>>;
    fn is_remote(&self) -> bool;
    fn as_any(&self) -> &dyn Any;
    fn acquire<'a>(
        &'a self,
        hit: &'a Hit<'a>,
        lease: u64,
    ) -> BoxFuture<'a, Result<Decision, StoreError>>;
    fn release<'a>(
        &'a self,
        leases: &'a LeaseKeys<'a>,
        lease: u64,
    ) -> BoxFuture<'a, Result<Released, StoreError>>;
    fn renew<'a>(
        &'a self,
        leases: &'a LeaseKeys<'a>,
        lease: u64,
    ) -> BoxFuture<'a, Result<Option<Duration>, StoreError>>;
    fn reserve<'a>(
        &'a self,
        hit: &'a Hit<'a>,
    ) -> BoxFuture<'a, Result<(Decision, u64), StoreError>>;
    fn settle<'a>(
        &'a self,
        settlement: &'a Settlement<'a>,
    ) -> BoxFuture<'a, Result<(), StoreError>>;
}

impl<S: Store> Erased for S {
    fn decide<'a>(&'a self, hit: &'a Hit<'a>) -> BoxFuture<'a, Result<Decision, StoreError>> {
        Box::pin(Store::decide(self, hit))
    }

    fn try_decide_now(&self, hit: &Hit<'_>) -> Option<Result<Decision, StoreError>> {
        Store::try_decide_now(self, hit)
    }

    fn reset<'a>(&'a self, identifiers: &'a [Identifier]) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(Store::reset(self, identifiers))
    }

    fn is_remote(&self) -> bool {
        Store::is_remote(self)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn acquire<'a>(
        &'a self,
        hit: &'a Hit<'a>,
        lease: u64,
    ) -> BoxFuture<'a, Result<Decision, StoreError>> {
        Box::pin(Store::acquire(self, hit, lease))
    }

    fn release<'a>(
        &'a self,
        leases: &'a LeaseKeys<'a>,
        lease: u64,
    ) -> BoxFuture<'a, Result<Released, StoreError>> {
        Box::pin(Store::release(self, leases, lease))
    }

    fn renew<'a>(
        &'a self,
        leases: &'a LeaseKeys<'a>,
        lease: u64,
    ) -> BoxFuture<'a, Result<Option<Duration>, StoreError>> {
        Box::pin(Store::renew(self, leases, lease))
    }

    fn reserve<'a>(
        &'a self,
        hit: &'a Hit<'a>,
    ) -> BoxFuture<'a, Result<(Decision, u64), StoreError>> {
        Box::pin(Store::reserve(self, hit))
    }

    fn settle<'a>(
        &'a self,
        settlement: &'a Settlement<'a>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(Store::settle(self, settlement))
    }
}

impl DynStore {
    /// `store`, erased. A `DynStore` given here is returned as it is, not wrapped again.
    pub fn new<S: Store>(store: S) -> DynStore {
        let any: &dyn Any = &store;
        if let Some(erased) = any.downcast_ref::<DynStore>() {
            return erased.clone();
        }
        if let Some(memory) = any.downcast_ref::<MemoryStore>() {
            return DynStore(Kind::Memory(memory.clone()));
        }
        DynStore(Kind::Other(Arc::new(store)))
    }

    /// The memory store, when that is the store.
    pub fn as_memory(&self) -> Option<&MemoryStore> {
        match &self.0 {
            Kind::Memory(memory) => Some(memory),
            Kind::Other(_) => None,
        }
    }

    /// The store as its own type, when it is an `S` (for its own statistics, say).
    pub fn downcast_ref<S: Store>(&self) -> Option<&S> {
        match &self.0 {
            Kind::Memory(memory) => (memory as &dyn Any).downcast_ref(),
            Kind::Other(store) => store.as_any().downcast_ref(),
        }
    }
}

impl fmt::Debug for DynStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Kind::Memory(_) => f.write_str("DynStore(memory)"),
            Kind::Other(_) => f.write_str("DynStore(..)"),
        }
    }
}

impl Store for DynStore {
    async fn decide(&self, hit: &Hit<'_>) -> Result<Decision, StoreError> {
        match &self.0 {
            Kind::Memory(memory) => Ok(memory.decide_now(hit)),
            Kind::Other(store) => store.decide(hit).await,
        }
    }

    fn try_decide_now(&self, hit: &Hit<'_>) -> Option<Result<Decision, StoreError>> {
        match &self.0 {
            Kind::Memory(memory) => Some(Ok(memory.decide_now(hit))),
            Kind::Other(store) => store.try_decide_now(hit),
        }
    }

    async fn reset(&self, identifiers: &[Identifier]) -> Result<(), StoreError> {
        match &self.0 {
            Kind::Memory(memory) => Store::reset(memory, identifiers).await,
            Kind::Other(store) => store.reset(identifiers).await,
        }
    }

    fn is_remote(&self) -> bool {
        match &self.0 {
            Kind::Memory(_) => false,
            Kind::Other(store) => store.is_remote(),
        }
    }

    async fn acquire(&self, hit: &Hit<'_>, lease: u64) -> Result<Decision, StoreError> {
        match &self.0 {
            Kind::Memory(memory) => Ok(memory.acquire_now(hit, lease)),
            Kind::Other(store) => store.acquire(hit, lease).await,
        }
    }

    async fn release(&self, leases: &LeaseKeys<'_>, lease: u64) -> Result<Released, StoreError> {
        match &self.0 {
            Kind::Memory(memory) => Ok(memory.release_now(leases, lease)),
            Kind::Other(store) => store.release(leases, lease).await,
        }
    }

    async fn renew(
        &self,
        leases: &LeaseKeys<'_>,
        lease: u64,
    ) -> Result<Option<Duration>, StoreError> {
        match &self.0 {
            Kind::Memory(memory) => Ok(memory.renew_now(leases, lease)),
            Kind::Other(store) => store.renew(leases, lease).await,
        }
    }

    async fn reserve(&self, hit: &Hit<'_>) -> Result<(Decision, u64), StoreError> {
        match &self.0 {
            Kind::Memory(memory) => Ok(memory.reserve_now(hit)),
            Kind::Other(store) => store.reserve(hit).await,
        }
    }

    async fn settle(&self, settlement: &Settlement<'_>) -> Result<(), StoreError> {
        match &self.0 {
            Kind::Memory(memory) => {
                memory.settle_now(settlement);
                Ok(())
            }
            Kind::Other(store) => store.settle(settlement).await,
        }
    }
}
