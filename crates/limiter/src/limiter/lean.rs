//! The lean path of a check: one leaf, no penalty, no near cache, a store answering in this
//! process (the usual check on the memory store). It writes its identifier into one buffer
//! per thread and goes straight to the store, without the general path's bookkeeping
//! (`Limiter::decide` and `Limiter::decide_now` try it first); a store error goes to
//! the same failure mode as theirs.

use std::sync::atomic::Ordering;

use sluice_core::Recording;

use super::decide::{Answer, hit};
use super::identify::write_leaf_again;
use super::{Error, Limiter, Selectors};
use crate::identifier::Identifier;
use crate::policy::CompiledPolicy;
use crate::store::Store;

thread_local! {
    /// The identifier of this thread's last lean check, rewritten in place by the next
    /// unless it names the same counter.
    static LEAN: std::cell::RefCell<Last> = std::cell::RefCell::new(Last {
        id: Identifier::with_capacity(64),
        leaf: 0,
    });
}

/// A thread's last lean identifier and the [`CompiledLeaf::uid`] it was written for (0:
/// none, or a write that failed).
///
/// Consecutive checks on a thread are often for one counter (a client's requests on one
/// keep-alive connection, a flood from one address). Measured with callgrind on
/// `vs_governor`'s `decision` path, a check of the same counter again costs 823
/// instructions instead of 986; one of another counter than the last, 989 (the value is
/// compared before it is written).
///
/// [`CompiledLeaf::uid`]: crate::policy::CompiledLeaf
struct Last {
    id: Identifier,
    leaf: u64,
}

impl Limiter {
    /// The usual check: one leaf, no penalty, no near cache, a store not resting after an
    /// error (the clock is read only once it has failed).
    fn is_lean(&self, policy: &CompiledPolicy) -> bool {
        let until = self.counters.store_paused_until.load(Ordering::Relaxed);
        policy.leaves.len() == 1
            && policy.policy.penalty.is_none()
            && !policy.concurrent
            && self.near_cache.is_none()
            && (until == 0 || until <= self.clock.now())
    }

    /// The lean path when `policy` can take it and the store answers at once; `None`, having
    /// recorded nothing, otherwise (and when this thread is already inside a check, a store
    /// calling a limiter: the general path then, with buffers of its own).
    pub(super) fn decide_lean(
        &self,
        policy: &CompiledPolicy,
        selectors: &Selectors<'_>,
        cost: u64,
        recording: Recording,
    ) -> Option<Result<Answer, Error>> {
        if !self.is_lean(policy) {
            return None;
        }
        LEAN.try_with(|last| {
            let mut last = last.try_borrow_mut().ok()?;
            self.decide_lean_now(policy, &mut last, selectors, cost, recording)
        })
        .ok()
        .flatten()
    }

    /// [`Limiter::decide_now`] for a policy [`Limiter::is_lean`] accepts, its identifier
    /// in `last` (this thread's): what `prepare` and `conclude` do, less what such a policy
    /// cannot need.
    fn decide_lean_now(
        &self,
        policy: &CompiledPolicy,
        last: &mut Last,
        selectors: &Selectors<'_>,
        cost: u64,
        recording: Recording,
    ) -> Option<Result<Answer, Error>> {
        let leaf = &policy.leaves[0];
        let written = last.leaf == leaf.uid;
        last.leaf = 0;
        if let Err(error) = write_leaf_again(&mut last.id, written, policy, leaf, selectors) {
            return Some(Err(error));
        }
        last.leaf = leaf.uid;
        let id = &last.id;
        let hit = hit(policy, std::slice::from_ref(id), cost, recording);
        Some(match self.store.try_decide_now(&hit)? {
            Ok(decision) => Ok(Answer {
                decision,
                without_store: None,
            }),
            Err(error) => self.failed(policy, &hit, error, false),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::identify::{write_leaf, write_leaf_again};
    use crate::identifier::Identifier;
    use crate::policy::{CompiledPolicy, Policy};

    /// The identifier kept or written again is the one written afresh, routing group
    /// included (the group places keys on a Cluster), for each kind of leaf and value.
    #[test]
    fn an_identifier_kept_or_rewritten_is_the_fresh_one() {
        // `and(user:10/m, ip:20/m)` shares no selector: its leaves route by the policy's group.
        let rules = [
            "user:10/m",
            "10/m",
            "user+ip:10/m",
            "and(user:10/m, ip:20/m)",
        ];
        let values = [
            "alice", "alice", "bob", "bob", "a b", "a b", "", "", "alice",
        ];
        for rule in rules {
            let policy = CompiledPolicy::compile(Policy::new("p", rule).unwrap()).unwrap();
            for leaf in &policy.leaves {
                let mut kept = Identifier::with_capacity(8);
                let mut written = false;
                let (mut last, mut kept_times) = (None, 0);
                for value in values {
                    let selectors = [("user", value), ("ip", value)];
                    let mut fresh = Identifier::with_capacity(8);
                    write_leaf(&mut fresh, &policy, leaf, &selectors).unwrap();
                    let same =
                        write_leaf_again(&mut kept, written, &policy, leaf, &selectors).unwrap();
                    written = true;
                    assert_eq!(kept.parts(), fresh.parts(), "{rule}: {value:?}");
                    // A lease keeps its token's bytes when its identifier is kept: only
                    // when the leaf's values are those it was written of.
                    let global = leaf.leaf.selector.names().is_empty();
                    assert!(!same || global || last == Some(value), "{rule}: {value:?}");
                    last = Some(value);
                    kept_times += usize::from(same);
                }
                if leaf.leaf.selector.names().len() < 2 {
                    assert!(kept_times >= 2, "{rule}: kept {kept_times} times");
                }
            }
        }
    }
}
