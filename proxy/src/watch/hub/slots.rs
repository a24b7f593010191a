//! The answers to a stream's creates waiting for their turn, with a running count of the responses they hold.

use std::collections::VecDeque;
use std::ops::{Deref, DerefMut};

use proto::etcdserverpb::WatchResponse;

/// The answer to one create, and what its watcher received before that answer could go out.
pub(super) struct Slot {
    pub(super) watch_id: Option<i64>,
    pub(super) waiting: bool,
    /// Only [`Slots`] changes it, so that its count stays true.
    responses: Vec<WatchResponse>,
}

impl Slot {
    /// The slot of a create whose answer is not known yet.
    pub(super) fn waiting(watch_id: Option<i64>) -> Self {
        Self {
            watch_id,
            waiting: true,
            responses: Vec::new(),
        }
    }

    /// The slot of a create answered at once with `answer`.
    pub(super) fn answered(answer: WatchResponse) -> Self {
        Self {
            watch_id: None,
            waiting: false,
            responses: vec![answer],
        }
    }

    /// What the slot held, to go out now.
    pub(super) fn into_responses(self) -> Vec<WatchResponse> {
        self.responses
    }
}

/// A stream's slots in create order. The stream's bound on held responses is checked on every response held
/// behind an unanswered create: summing over the slots there would cost O(slots) per response (quadratic in
/// the watchers of a stream), so the sum is kept as the slots change.
#[derive(Default)]
pub(super) struct Slots {
    queue: VecDeque<Slot>,
    /// Responses held in `queue`, all slots together.
    held: usize,
}

/// One slot, open for change through [`Slots`].
pub(super) struct SlotMut<'a> {
    slot: &'a mut Slot,
    held: &'a mut usize,
}

impl Slots {
    pub(super) fn push_back(&mut self, slot: Slot) {
        self.held += slot.responses.len();
        self.queue.push_back(slot);
    }

    /// The first slot that `pick` accepts.
    pub(super) fn find(&mut self, pick: impl Fn(&Slot) -> bool) -> Option<SlotMut<'_>> {
        let slot = self.queue.iter_mut().find(|slot| pick(slot))?;
        Some(SlotMut {
            slot,
            held: &mut self.held,
        })
    }

    /// The first slot, if its answer is known: its turn has come.
    pub(super) fn pop_answered(&mut self) -> Option<Slot> {
        if self.queue.front().is_none_or(|slot| slot.waiting) {
            return None;
        }
        let slot = self.queue.pop_front()?;
        self.held -= slot.responses.len();
        Some(slot)
    }

    /// Responses held in every slot.
    pub(super) fn held(&self) -> usize {
        self.held
    }

    /// `held`, counted anew (for tests of the running count).
    #[cfg(test)]
    pub(super) fn counted(&self) -> usize {
        self.queue.iter().map(|slot| slot.responses.len()).sum()
    }
}

impl SlotMut<'_> {
    /// Holds `response` after what the slot holds.
    pub(super) fn push(&mut self, response: WatchResponse) {
        self.slot.responses.push(response);
        *self.held += 1;
    }

    /// Holds `response` before what the slot holds (a create's answer precedes its watcher's events).
    pub(super) fn push_first(&mut self, response: WatchResponse) {
        self.slot.responses.insert(0, response);
        *self.held += 1;
    }
}

impl Deref for SlotMut<'_> {
    type Target = Slot;
    fn deref(&self) -> &Slot {
        self.slot
    }
}

impl DerefMut for SlotMut<'_> {
    fn deref_mut(&mut self) -> &mut Slot {
        self.slot
    }
}
