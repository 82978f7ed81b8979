//! Spare lease parts, per thread: the lists of dropped leases, kept for the next acquires.

use super::LeaseParts;

thread_local! {
    /// The lists of leases dropped on this thread, for the next acquires' (see
    /// [`LeaseParts::spare`]).
    static SPARE_PARTS: std::cell::Cell<Vec<LeaseParts>> = const {
        std::cell::Cell::new(Vec::new())
    };
}

/// Most spare parts a thread keeps, and the longest identifier they keep room for.
const MAX_SPARE_PARTS: usize = 8;
const MAX_SPARE_IDENTIFIER: usize = 512;

impl LeaseParts {
    /// Empty parts to fill, from this thread's spares when it has some: their lists and
    /// identifiers keep their room, so an acquire and release on a warm thread allocate
    /// nothing (four allocations and frees were a sixth of their time).
    pub(crate) fn spare() -> LeaseParts {
        let kept = SPARE_PARTS.try_with(|spare| {
            let mut list = spare.take();
            let parts = list.pop();
            spare.set(list);
            parts
        });
        kept.ok().flatten().unwrap_or_default()
    }

    /// Moves these parts' lists to this thread's spares (a dropped lease's), if there is room.
    pub(crate) fn keep_spare(&mut self) {
        // Parts a release in the background took have no room to keep.
        let roomless = self.identifiers.capacity() == 0;
        if roomless
            || self
                .identifiers
                .iter()
                .any(|id| id.capacity() > MAX_SPARE_IDENTIFIER)
            || self.selectors.capacity() > MAX_SPARE_IDENTIFIER
        {
            return;
        }
        // The identifiers and token bytes stay as they are, with the leaf they were
        // written for: the next acquire of that leaf with the same value keeps them.
        let mut parts = std::mem::take(self);
        parts.quotas.clear();
        // During thread teardown there is nowhere to keep them: they are freed.
        let _ = SPARE_PARTS.try_with(|spare| {
            let mut list = spare.take();
            if list.len() < MAX_SPARE_PARTS {
                list.push(parts);
            }
            spare.set(list);
        });
    }
}
