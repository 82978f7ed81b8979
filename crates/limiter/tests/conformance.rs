//! The store conformance suite on the memory store, on the real clock: every case gets
//! clones of one shared store, as app servers share one Redis.

use std::sync::LazyLock;

use sluice_limiter::MemoryStore;
use sluice_limiter::conformance::StoreFactory;

static SHARED: LazyLock<MemoryStore> = LazyLock::new(MemoryStore::new);

struct MemoryFactory;

impl StoreFactory for MemoryFactory {
    type Store = MemoryStore;

    fn store(&self) -> MemoryStore {
        SHARED.clone()
    }
}

sluice_limiter::conformance_tests!(MemoryFactory);

/// Leases: the memory store is the only one that takes them in this phase.
mod leases {
    sluice_limiter::concurrency_conformance_tests!(super::MemoryFactory);
}

/// The whole suite in one test, through a closure factory on a store of its own.
#[test]
fn run_all_with_a_closure_factory() {
    let own = MemoryStore::new();
    sluice_limiter::conformance::block_on("run_all", async move {
        sluice_limiter::conformance::run_all(&move || own.clone()).await;
    });
}

/// `run_all` and `run_all_concurrency` (what the Redis Cluster and memcached pool suites
/// run) name the same cases as the macros that write one test per case: a case added to
/// one list only was once left out of the Cluster's run, unnoticed.
#[test]
fn the_run_alls_name_every_case_of_the_macros() {
    let source = include_str!("../src/conformance.rs");
    for (run_all, macro_name) in [
        ("pub async fn run_all<", "macro_rules! conformance_tests"),
        (
            "pub async fn run_all_concurrency<",
            "macro_rules! concurrency_conformance_tests",
        ),
    ] {
        let body = block_after(source, run_all);
        let mut run: Vec<&str> = body
            .lines()
            .filter_map(|line| line.trim().strip_suffix("(factory).await;"))
            .collect();
        let from = source.find(macro_name).expect("the macro");
        let cases = block_after(&source[from..], "@cases ($factory)\n");
        let mut listed: Vec<&str> = cases
            .split_whitespace()
            .filter(|word| word.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
            .collect();
        assert!(
            !run.is_empty() && !listed.is_empty(),
            "{run_all}: nothing read"
        );
        run.sort_unstable();
        listed.sort_unstable();
        assert_eq!(run, listed, "{run_all} against {macro_name}");
    }
}

/// The text after `start` up to the end of the first line holding only `}` at
/// `start`'s indentation or less: a function's body, or a block of the macro.
fn block_after<'s>(source: &'s str, start: &str) -> &'s str {
    let at = source
        .find(start)
        .unwrap_or_else(|| panic!("`{start}` not found"));
    let rest = &source[at + start.len()..];
    let end = rest
        .lines()
        .scan(0, |offset, line| {
            let here = *offset;
            *offset += line.len() + 1;
            Some((here, line))
        })
        .find(|(_, line)| line.trim() == "}" || line.trim() == "};")
        .map_or(rest.len(), |(here, _)| here);
    &rest[..end]
}
