//! Failure modes: what each policy does when its store cannot decide, and the return to the
//! store once it answers again. The store here is the memory store behind a switch that makes
//! it fail, so the limiter's own logic is tested alone; the Redis crate kills real servers.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sluice_core::Decision;
use sluice_limiter::failure::STORE_PAUSE;
use sluice_limiter::{
    Denial, FailureMode, Hit, Identifier, Limiter, ManualClock, MemoryStore, Policy, Store,
    StoreError,
};

#[derive(Clone)]
struct Switchable {
    inner: MemoryStore,
    down: Arc<AtomicBool>,
    /// Answers `try_decide_now` as an in-process store does (otherwise as a remote one).
    answers_now: bool,
}

impl Store for Switchable {
    async fn decide(&self, hit: &Hit<'_>) -> Result<Decision, StoreError> {
        if self.down.load(Ordering::SeqCst) {
            return Err(StoreError::Timeout(Duration::from_millis(250)));
        }
        self.inner.decide(hit).await
    }

    fn try_decide_now(&self, hit: &Hit<'_>) -> Option<Result<Decision, StoreError>> {
        if !self.answers_now {
            return None;
        }
        if self.down.load(Ordering::SeqCst) {
            return Some(Err(StoreError::Timeout(Duration::from_millis(250))));
        }
        self.inner.try_decide_now(hit)
    }

    async fn reset(&self, identifiers: &[Identifier]) -> Result<(), StoreError> {
        self.inner.reset(identifiers).await
    }
}

fn limiter(mode: FailureMode) -> (Limiter, Arc<AtomicBool>, ManualClock) {
    limiter_answering(mode, false)
}

fn limiter_answering(
    mode: FailureMode,
    answers_now: bool,
) -> (Limiter, Arc<AtomicBool>, ManualClock) {
    let clock = ManualClock::new(1_000_000_000_000);
    let down = Arc::new(AtomicBool::new(false));
    let store = Switchable {
        inner: MemoryStore::builder().clock(clock.clone()).build(),
        down: down.clone(),
        answers_now,
    };
    let limiter = Limiter::builder(store)
        .clock(clock.clone())
        .policy(Policy::new("p", "user:10/h").unwrap().failure(mode))
        .build()
        .unwrap();
    (limiter, down, clock)
}

async fn hit(limiter: &Limiter) -> sluice_limiter::Checked {
    limiter.check("p", &[("user", "u")], 1).await.unwrap()
}

#[tokio::test]
async fn open_admits_and_counts() {
    let (limiter, down, _) = limiter(FailureMode::Open);
    down.store(true, Ordering::SeqCst);
    for _ in 0..20 {
        let checked = hit(&limiter).await;
        assert!(checked.decision.allowed());
        assert_eq!(checked.without_store, Some(FailureMode::Open));
    }
    let stats = limiter.stats();
    assert_eq!(
        (stats.failed_open, stats.store_errors),
        (20, 1),
        "one error, then a pause"
    );
}

#[tokio::test]
async fn closed_denies_and_says_why() {
    let (limiter, down, _) = limiter(FailureMode::Closed);
    down.store(true, Ordering::SeqCst);
    let checked = hit(&limiter).await;
    assert!(!checked.decision.allowed());
    assert_eq!(checked.decision.denial, Some(Denial::StoreUnavailable));
    assert_eq!(limiter.stats().failed_closed, 1);
}

#[tokio::test]
async fn local_holds_its_share_of_the_limit() {
    let (limiter, down, _) = limiter(FailureMode::local(0.5).unwrap());
    down.store(true, Ordering::SeqCst);
    let admitted = {
        let mut n = 0;
        for _ in 0..20 {
            n += usize::from(hit(&limiter).await.decision.allowed());
        }
        n
    };
    assert_eq!(admitted, 5, "half of user:10/h");
    assert_eq!(limiter.stats().failed_local, 20);
    assert!(FailureMode::local(0.0).is_err() && FailureMode::local(1.5).is_err());
}

#[tokio::test]
async fn the_default_is_local_with_the_whole_limit() {
    let (limiter, down, _) = limiter(FailureMode::default());
    down.store(true, Ordering::SeqCst);
    let mut admitted = 0;
    for _ in 0..20 {
        admitted += usize::from(hit(&limiter).await.decision.allowed());
    }
    assert_eq!(admitted, 10);
}

#[tokio::test]
async fn decisions_return_to_the_store_by_themselves() {
    let (limiter, down, clock) = limiter(FailureMode::Open);
    assert!(hit(&limiter).await.without_store.is_none());
    down.store(true, Ordering::SeqCst);
    assert!(hit(&limiter).await.without_store.is_some());
    down.store(false, Ordering::SeqCst);
    // Within the pause the store is not asked yet...
    assert!(hit(&limiter).await.without_store.is_some());
    // ...and right after it, it is, with its counts intact (1 before the outage + this one).
    clock.advance(STORE_PAUSE);
    let checked = hit(&limiter).await;
    assert!(checked.without_store.is_none());
    assert_eq!(checked.decision.remaining, 8);
}

#[tokio::test]
async fn a_check_without_waiting_fails_over_and_returns_as_one_that_waits() {
    let (limiter, down, clock) = limiter_answering(FailureMode::Open, true);
    let now = |limiter: &Limiter| {
        let answered = limiter.try_check_now("p", &[("user", "u")], 1);
        answered.expect("the store answers at once").unwrap()
    };
    assert!(now(&limiter).without_store.is_none());
    down.store(true, Ordering::SeqCst);
    for _ in 0..3 {
        let checked = now(&limiter);
        assert!(checked.decision.allowed());
        assert_eq!(checked.without_store, Some(FailureMode::Open));
    }
    let stats = limiter.stats();
    assert_eq!((stats.failed_open, stats.store_errors), (3, 1));
    down.store(false, Ordering::SeqCst);
    assert!(now(&limiter).without_store.is_some(), "paused");
    clock.advance(STORE_PAUSE);
    let checked = now(&limiter);
    assert!(checked.without_store.is_none());
    assert_eq!(checked.decision.remaining, 8);
}

#[tokio::test]
async fn protocol_errors_are_not_hidden() {
    #[derive(Clone)]
    struct Broken;
    impl Store for Broken {
        async fn decide(&self, _: &Hit<'_>) -> Result<Decision, StoreError> {
            Err(StoreError::Protocol("bad reply".into()))
        }
        async fn reset(&self, _: &[Identifier]) -> Result<(), StoreError> {
            Ok(())
        }
    }
    let limiter = Limiter::builder(Broken)
        .policy(Policy::new("p", "10/s").unwrap().failure(FailureMode::Open))
        .build()
        .unwrap();
    let error = limiter.check("p", &[], 1).await.unwrap_err();
    assert!(!error.is_transient());
    assert_eq!(limiter.stats().failed_open, 0);
}

#[tokio::test]
async fn try_check_now_leaves_a_remote_store_alone_unless_the_failure_mode_decides() {
    let (limiter, down, clock) = limiter(FailureMode::Open);
    let selectors = &[("user", "u")];
    // A store that must be awaited: nothing decided, nothing recorded.
    assert!(limiter.try_check_now("p", selectors, 1).is_none());
    assert!(limiter.try_peek_now("p", selectors, 1).is_none());
    assert_eq!(hit(&limiter).await.decision.remaining, 9);
    // While the store rests after an error, the failure mode answers at once.
    down.store(true, Ordering::SeqCst);
    assert!(hit(&limiter).await.without_store.is_some());
    let now = limiter
        .try_check_now("p", selectors, 1)
        .expect("decided without the store");
    assert_eq!(now.unwrap().without_store, Some(FailureMode::Open));
    // Once the pause is over the store is to be asked again.
    down.store(false, Ordering::SeqCst);
    clock.advance(STORE_PAUSE);
    assert!(limiter.try_check_now("p", selectors, 1).is_none());
}
