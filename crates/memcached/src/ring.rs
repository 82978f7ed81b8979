//! Consistent hashing: which server of the pool holds a key.
//!
//! A ketama-style ring: each server gets [`POINTS_PER_SERVER`] points, the first 32 bits of
//! SHA-256 over `"<address>-<i>"` (8 points per digest); a key goes to the server of the first
//! point at or after the first 32 bits of its own SHA-256, wrapping around. Adding or removing
//! a server moves only the keys between its points and their predecessors (about `1/N` of
//! them), and every process that lists the same addresses computes the same ring, whatever
//! their order. A server marked down is skipped: its keys go to the next live server on the
//! ring, and no other key moves.

use sha2::{Digest, Sha256};

pub const POINTS_PER_SERVER: usize = 160;

/// The ring over a pool's servers (by index into the pool's address list).
#[derive(Debug, Clone)]
pub struct Ring {
    points: Vec<(u32, usize)>,
    servers: usize,
}

fn hash32(bytes: &[u8]) -> [u32; 8] {
    let digest = Sha256::digest(bytes);
    let mut out = [0u32; 8];
    for (i, chunk) in digest.chunks_exact(4).enumerate() {
        out[i] = u32::from_be_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
    }
    out
}

impl Ring {
    pub fn new(addresses: &[String]) -> Ring {
        let mut points = Vec::with_capacity(addresses.len() * POINTS_PER_SERVER);
        for (server, address) in addresses.iter().enumerate() {
            for i in 0..POINTS_PER_SERVER / 8 {
                for point in hash32(format!("{address}-{i}").as_bytes()) {
                    points.push((point, server));
                }
            }
        }
        // Ties (vanishingly rare) go to the lower address, the same in every process.
        points.sort_by(|a, b| (a.0, &addresses[a.1]).cmp(&(b.0, &addresses[b.1])));
        Ring {
            points,
            servers: addresses.len(),
        }
    }

    /// The server for `route`, skipping those `down` says are down; `None` when all are.
    pub fn server(&self, route: &str, down: impl Fn(usize) -> bool) -> Option<usize> {
        if self.servers == 1 {
            return (!down(0)).then_some(0);
        }
        let hash = hash32(route.as_bytes())[0];
        let start = self.points.partition_point(|&(point, _)| point < hash);
        (0..self.points.len())
            .map(|i| self.points[(start + i) % self.points.len()].1)
            .find(|&server| !down(server))
    }

    /// The server for `route` when every server is up.
    pub fn owner(&self, route: &str) -> usize {
        self.server(route, |_| false).expect("a ring has servers")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addresses(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("10.0.0.{i}:11211")).collect()
    }

    #[test]
    fn spreads_keys_evenly_and_stably() {
        let ring = Ring::new(&addresses(3));
        let mut counts = [0usize; 3];
        for i in 0..30_000 {
            counts[ring.owner(&format!("key-{i}"))] += 1;
        }
        for count in counts {
            assert!((7_000..13_000).contains(&count), "{counts:?}");
        }
        // The order addresses are listed in does not change where a key goes.
        let mut reversed = addresses(3);
        reversed.reverse();
        let other = Ring::new(&reversed);
        for i in 0..1_000 {
            let key = format!("key-{i}");
            let a = &addresses(3)[ring.owner(&key)];
            let b = &reversed[other.owner(&key)];
            assert_eq!(a, b, "{key}");
        }
    }

    #[test]
    fn adding_a_server_moves_only_its_share() {
        let three = Ring::new(&addresses(3));
        let four = Ring::new(&addresses(4));
        let mut moved = 0;
        for i in 0..20_000 {
            let key = format!("key-{i}");
            let (before, after) = (three.owner(&key), four.owner(&key));
            if before != after {
                assert_eq!(after, 3, "{key} moved between old servers");
                moved += 1;
            }
        }
        assert!((3_000..7_000).contains(&moved), "{moved} of 20000 moved");
    }

    #[test]
    fn a_down_server_hands_over_only_its_keys() {
        let ring = Ring::new(&addresses(3));
        for i in 0..5_000 {
            let key = format!("key-{i}");
            let owner = ring.owner(&key);
            let with_1_down = ring.server(&key, |s| s == 1).unwrap();
            if owner == 1 {
                assert_ne!(with_1_down, 1);
            } else {
                assert_eq!(with_1_down, owner, "{key} moved");
            }
        }
        assert_eq!(ring.server("k", |_| true), None);
        let single = Ring::new(&addresses(1));
        assert_eq!(single.server("k", |_| false), Some(0));
    }
}
