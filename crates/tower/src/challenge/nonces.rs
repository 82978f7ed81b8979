//! The bounded set of nonces already spent, each kept until its challenge expires (after
//! that the nonce is refused as expired anyway).

use std::collections::HashMap;
use std::sync::Mutex;

/// Identifies one nonce (its MAC, which no client can forge).
pub(crate) type NonceId = [u8; 16];

#[derive(Debug)]
pub(crate) struct SpentNonces {
    max: usize,
    /// Nonce -> expiry (seconds since the epoch).
    spent: Mutex<HashMap<NonceId, u64>>,
}

/// Why a nonce cannot be spent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SpendError {
    AlreadySpent,
    /// The set is full of unexpired nonces. Refusing is the safe side: forgetting one
    /// would let its solution be replayed.
    Full,
}

impl SpentNonces {
    pub(crate) fn new(max: usize) -> SpentNonces {
        SpentNonces {
            max: max.max(1),
            spent: Mutex::new(HashMap::new()),
        }
    }

    /// Marks `id` (valid until `expires`) as spent at `now`, unless it already is.
    pub(crate) fn spend(&self, id: NonceId, expires: u64, now: u64) -> Result<(), SpendError> {
        let mut spent = self.spent.lock().unwrap_or_else(|e| e.into_inner());
        if spent.contains_key(&id) {
            return Err(SpendError::AlreadySpent);
        }
        if spent.len() >= self.max {
            spent.retain(|_, &mut until| until > now);
            if spent.len() >= self.max {
                return Err(SpendError::Full);
            }
        }
        spent.insert(id, expires);
        Ok(())
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.spent.lock().unwrap().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nonce_is_spent_once_and_the_set_stays_bounded() {
        let set = SpentNonces::new(2);
        assert_eq!(set.spend([1; 16], 100, 0), Ok(()));
        assert_eq!(set.spend([1; 16], 100, 0), Err(SpendError::AlreadySpent));
        assert_eq!(set.spend([2; 16], 50, 0), Ok(()));
        assert_eq!(set.spend([3; 16], 100, 10), Err(SpendError::Full));
        // Once [2] has expired there is room again, and [1] is still remembered.
        assert_eq!(set.spend([3; 16], 100, 60), Ok(()));
        assert_eq!(set.spend([1; 16], 100, 60), Err(SpendError::AlreadySpent));
        assert_eq!(set.len(), 2);
    }
}
