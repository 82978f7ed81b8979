//! `--store URL`: which store `sluice serve` runs on.

use sluice_limiter::MemoryStore;
use sluice_limiter::memory::DEFAULT_MAX_IDENTIFIERS;

/// A store chosen by URL.
pub enum StoreChoice {
    /// `memory://` or `memory://?max_identifiers=N`.
    Memory(MemoryStore),
}

/// Reads a store URL.
pub fn open(url: &str) -> Result<StoreChoice, String> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| format!("`{url}` is not a store URL (expected e.g. `memory://`)"))?;
    match scheme {
        "memory" => {
            let mut max = DEFAULT_MAX_IDENTIFIERS;
            let query = rest.trim_start_matches('/').trim_start_matches('?');
            for pair in query.split('&').filter(|p| !p.is_empty()) {
                match pair.split_once('=') {
                    Some(("max_identifiers", v)) => {
                        max = v.parse().ok().filter(|&n: &usize| n > 0).ok_or_else(|| {
                            format!("max_identifiers `{v}` is not a positive number")
                        })?;
                    }
                    _ => {
                        return Err(format!(
                            "unknown memory store option `{pair}` (known: max_identifiers)"
                        ));
                    }
                }
            }
            Ok(StoreChoice::Memory(
                MemoryStore::builder().max_identifiers(max).build(),
            ))
        }
        "redis" | "rediss" | "redis+cluster" | "memcached" => Err(format!(
            "the `{scheme}` store is not built yet; this sluice supports `memory://`"
        )),
        other => Err(format!(
            "unknown store scheme `{other}` (expected memory://)"
        )),
    }
}
