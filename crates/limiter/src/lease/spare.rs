//! Spare lease parts, per thread: the boxed parts of dropped leases, kept for the next
//! acquires.

use super::LeaseParts;

thread_local! {
    /// The parts of leases dropped on this thread, for the next acquires' (see
    /// [`LeaseParts::spare`]). Boxes on purpose: a lease holds its parts boxed, and the box
    /// itself is what is kept for the next lease.
    #[allow(clippy::vec_box)]
    static SPARE_PARTS: std::cell::Cell<Vec<Box<LeaseParts>>> = const {
        std::cell::Cell::new(Vec::new())
    };
    /// The last parts kept, before the list: a thread that takes and drops one lease at a
    /// time (the usual holder) swaps one pointer instead of moving the list out and back.
    static LAST_PARTS: std::cell::Cell<Option<Box<LeaseParts>>> = const {
        std::cell::Cell::new(None)
    };
}

/// Most spare parts a thread keeps in its list (besides the last, kept apart), and the
/// longest identifier they keep room for.
const MAX_SPARE_PARTS: usize = 8;
const MAX_SPARE_IDENTIFIER: usize = 512;

impl LeaseParts {
    /// Parts to fill, from this thread's spares when it has some: their box, lists and
    /// identifiers keep their room, so an acquire and release on a warm thread allocate
    /// nothing (four allocations and frees were a sixth of their time). Their identifiers,
    /// token bytes, leaf and set handle are a dropped lease's: callers write what they need.
    pub(crate) fn spare() -> Box<LeaseParts> {
        if let Ok(Some(parts)) = LAST_PARTS.try_with(std::cell::Cell::take) {
            return parts;
        }
        let kept = SPARE_PARTS.try_with(|spare| {
            let mut list = spare.take();
            let parts = list.pop();
            spare.set(list);
            parts
        });
        kept.ok().flatten().unwrap_or_default()
    }

    /// Keeps these parts (a dropped lease's) in this thread's spares, if there is room.
    pub(crate) fn keep_spare(mut self: Box<Self>) {
        if self
            .identifiers
            .iter()
            .any(|id| id.capacity() > MAX_SPARE_IDENTIFIER)
            || self.selectors.capacity() > MAX_SPARE_IDENTIFIER
        {
            return;
        }
        // The identifiers and token bytes stay as they are, with the leaf they were
        // written for: the next acquire of that leaf with the same value keeps them.
        self.quotas.clear();
        // During thread teardown there is nowhere to keep them: they are freed.
        let Ok(Some(older)) = LAST_PARTS.try_with(|last| last.replace(Some(self))) else {
            return;
        };
        let _ = SPARE_PARTS.try_with(|spare| {
            let mut list = spare.take();
            if list.len() < MAX_SPARE_PARTS {
                list.push(older);
            }
            spare.set(list);
        });
    }
}
