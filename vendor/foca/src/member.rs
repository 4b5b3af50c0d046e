/* This Source Code Form is subject to the terms of the Mozilla Public
 * License, v. 2.0. If a copy of the MPL was not distributed with this
 * file, You can obtain one at https://mozilla.org/MPL/2.0/. */
extern crate alloc;
use alloc::vec::Vec;
use core::mem;

use core::hash::BuildHasher;

use hashbrown::{DefaultHashBuilder, HashTable};

use rand::{
    RngExt,
    prelude::{IteratorRandom, SliceRandom},
};

/// State describes how a Foca instance perceives a member of the cluster.
///
/// This is part of the Suspicion Mechanism described in section 4.2 of the
/// original SWIM paper.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum State {
    /// Member is active.
    Alive,
    /// Member is active, but at least one cluster member
    /// suspects its down. For all purposes, a `Suspect` member
    /// is treated as if it were `Alive` until either it
    /// refutes the suspicion (becoming `Alive`) or fails to
    /// do so (being declared `Down`).
    Suspect,
    /// Confirmed Down.
    /// A member that reaches this state can't join the cluster
    /// with the same identity until the cluster forgets
    /// this knowledge.
    Down,
}

/// Incarnation is a member-controlled cluster-global number attached
/// to a member identity.
/// A member M's incarnation starts with zero and can only be incremented
/// by said member M when refuting suspicion.
pub type Incarnation = u16;

/// A Cluster Member. Also often called "cluster update".
///
/// A [`Member`] represents Foca's snapshot knowledge about an
/// [`crate::Identity`]. An individual cluster update is simply a
/// serialized Member which other Foca instances receive and use to
/// update their own cluster state representation.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Member<T> {
    id: T,
    incarnation: Incarnation,
    state: State,
}

impl<T> Member<T> {
    /// Initializes a new member.
    ///
    /// `id` is an identity used to uniquely identify an individual
    /// cluster member (say, a primary key).
    pub const fn new(id: T, incarnation: Incarnation, state: State) -> Self {
        Self {
            id,
            incarnation,
            state,
        }
    }

    /// Shortcut for initializing a member as [`State::Alive`].
    pub fn alive(id: T) -> Self {
        Self::new(id, Incarnation::default(), State::Alive)
    }

    #[cfg(test)]
    pub(crate) fn suspect(id: T) -> Self {
        Self::new(id, Incarnation::default(), State::Suspect)
    }

    /// Shortcut for initializing a member as [`State::Down`].
    pub fn down(id: T) -> Self {
        Self::new(id, Incarnation::default(), State::Down)
    }

    /// Getter for the member's Incarnation
    pub const fn incarnation(&self) -> Incarnation {
        self.incarnation
    }

    /// Getter for the member's State
    pub const fn state(&self) -> State {
        self.state
    }

    /// Getter for the member's identity
    pub const fn id(&self) -> &T {
        &self.id
    }

    pub(crate) const fn is_active(&self) -> bool {
        match self.state {
            State::Alive | State::Suspect => true,
            State::Down => false,
        }
    }

    pub(crate) const fn change_state(&mut self, incarnation: Incarnation, state: State) -> bool {
        if self.can_change(incarnation, state) {
            self.state = state;
            self.incarnation = incarnation;
            true
        } else {
            false
        }
    }

    /// Whether applying `update` to this member would change nothing:
    /// the same identity, at a state and incarnation that do not win over
    /// this one's.
    pub(crate) fn takes_nothing_from(&self, update: &Member<T>) -> bool
    where
        T: PartialEq,
    {
        self.id == update.id && !self.can_change(update.incarnation, update.state)
    }

    const fn can_change(&self, other_incarnation: Incarnation, other: State) -> bool {
        // This implements the order of preference of the Suspicion subprotocol
        // outlined on section 4.2 of the paper.
        match self.state {
            State::Alive => match other {
                State::Alive => other_incarnation > self.incarnation,
                State::Suspect => other_incarnation >= self.incarnation,
                State::Down => true,
            },
            State::Suspect => match other {
                State::Alive | State::Suspect => other_incarnation > self.incarnation,
                State::Down => true,
            },
            State::Down => false,
        }
    }

    pub(crate) fn into_identity(self) -> T {
        self.id
    }
}

/// `Members::down_slot` value of a member that is active.
///
/// Positions are `u32`: a member costs its `Member<T>` and 4 bytes in
/// each index (a simulator holding thousands of `Foca`s of thousands of
/// members each pays that per pair).
const NOT_DOWN: u32 = u32::MAX;

/// The cluster members as a Foca instance knows them.
///
/// `inner` holds every member in a random order: `next()` walks it
/// round-robin and shuffles it after each full round, and a new member
/// is inserted at a random position.
///
/// Every operation on a single member is O(1) (expected) thanks to
/// two indices kept exact through every push, swap, `swap_remove` and
/// shuffle of `inner`:
///
/// * `index` maps each member's [`crate::Identity::Addr`] to its
///   position in `inner`: a table of positions, hashed by the address of
///   the member there (the address is not stored twice);
/// * `down` lists the positions of the members that are Down, and
///   `down_slot` (parallel to `inner`) where each one sits in `down`,
///   so that Down members can be sampled without scanning `inner`.
pub(crate) struct Members<T: crate::Identity> {
    inner: Vec<Member<T>>,
    index: HashTable<u32>,
    hasher: DefaultHashBuilder,
    down: Vec<u32>,
    down_slot: Vec<u32>,
    cursor: usize,
    // Scratch space for `choose_members`: the positions drawn so far
    drawn: Vec<usize>,
}

#[cfg(test)]
impl<T: crate::Identity> Members<T> {
    pub(crate) fn len(&self) -> usize {
        self.inner.len()
    }

    /// Panics unless the indices agree with a brute-force scan.
    pub(crate) fn check_invariants(&self) {
        assert_eq!(
            self.inner.len(),
            self.index.len(),
            "one index entry per member"
        );
        assert_eq!(self.inner.len(), self.down_slot.len());
        for (pos, member) in self.inner.iter().enumerate() {
            assert_eq!(
                Some(pos),
                self.position(&member.id.addr()),
                "index points at the member's position"
            );
            if member.is_active() {
                assert_eq!(NOT_DOWN, self.down_slot[pos], "active member in down list");
            } else {
                assert_eq!(
                    pos as u32, self.down[self.down_slot[pos] as usize],
                    "down list points back"
                );
            }
        }
        assert_eq!(
            self.inner.iter().filter(|m| !m.is_active()).count(),
            self.down.len(),
            "down list holds every down member once"
        );
    }
}

impl<T> Members<T>
where
    T: crate::Identity,
{
    pub(crate) const fn num_active(&self) -> usize {
        self.inner.len().saturating_sub(self.down.len())
    }

    pub(crate) fn new(inner: Vec<Member<T>>) -> Self {
        let mut members = Self {
            index: HashTable::with_capacity(inner.len()),
            hasher: DefaultHashBuilder::default(),
            down: Vec::new(),
            down_slot: Vec::with_capacity(inner.len()),
            cursor: 0,
            drawn: Vec::new(),
            inner,
        };
        members.reindex();
        // XXX This doesn't prevent someone initializing with
        //     duplicated members... Not a problem (yet?) since
        //     inner is always empty outside of tests
        debug_assert_eq!(
            members.inner.len(),
            members.index.len(),
            "duplicated member addresses"
        );
        members
    }

    /// Iterates over every member, in no particular order.
    pub(crate) fn iter(&self) -> core::slice::Iter<'_, Member<T>> {
        self.inner.iter()
    }

    // Rebuilds both indices from `inner`. O(members)
    fn reindex(&mut self) {
        self.down.clear();
        self.down_slot.clear();
        self.index.clear();
        for pos in 0..self.inner.len() {
            self.index_insert(pos);
            if self.inner[pos].is_active() {
                self.down_slot.push(NOT_DOWN);
            } else {
                self.down_slot.push(self.down.len() as u32);
                self.down.push(pos as u32);
            }
        }
    }

    fn hash(&self, addr: &T::Addr) -> u64 {
        self.hasher.hash_one(addr)
    }

    // Indexes the member at `pos`, whose address is not indexed yet
    fn index_insert(&mut self, pos: usize) {
        let Self {
            index,
            hasher,
            inner,
            ..
        } = self;
        let hash = hasher.hash_one(inner[pos].id.addr());
        index.insert_unique(hash, pos as u32, |&p| {
            hasher.hash_one(inner[p as usize].id.addr())
        });
    }

    // The index entry of `addr`, which is at position `at`
    fn index_entry(&mut self, addr: &T::Addr, at: usize) -> Option<&mut u32> {
        let hash = self.hash(addr);
        self.index.find_mut(hash, |&p| p as usize == at)
    }

    // The member at `pos` just went Down
    fn mark_down(&mut self, pos: usize) {
        debug_assert_eq!(NOT_DOWN, self.down_slot[pos]);
        self.down_slot[pos] = self.down.len() as u32;
        self.down.push(pos as u32);
    }

    // The member at `pos` is no longer Down (it was replaced by a
    // newer identity), or is about to be removed
    fn unmark_down(&mut self, pos: usize) {
        let slot = mem::replace(&mut self.down_slot[pos], NOT_DOWN);
        debug_assert_ne!(NOT_DOWN, slot);
        if slot != NOT_DOWN {
            self.down.swap_remove(slot as usize);
            if let Some(&moved) = self.down.get(slot as usize) {
                self.down_slot[moved as usize] = slot;
            }
        }
    }

    // Records that the member now at `pos` moved there from `from`
    fn moved_to(&mut self, pos: usize, from: usize) {
        let slot = self.down_slot[pos];
        if slot != NOT_DOWN {
            self.down[slot as usize] = pos as u32;
        }
        let addr = self.inner[pos].id.addr();
        let entry = self.index_entry(&addr, from);
        debug_assert!(entry.is_some(), "a member moves from where it was indexed");
        if let Some(p) = entry {
            *p = pos as u32;
        }
    }

    fn swap(&mut self, a: usize, b: usize) {
        if a != b {
            self.inner.swap(a, b);
            self.down_slot.swap(a, b);
            // Each entry is found by its old position: update the first
            // through a placeholder so the two cannot be confused.
            let tmp = u32::MAX as usize;
            let addr_a = self.inner[a].id.addr();
            if let Some(p) = self.index_entry(&addr_a, b) {
                *p = u32::MAX;
            }
            self.moved_to(b, a);
            self.moved_to(a, tmp);
        }
    }

    fn swap_remove(&mut self, pos: usize) -> Member<T> {
        if self.down_slot[pos] != NOT_DOWN {
            self.unmark_down(pos);
        }
        let addr = self.inner[pos].id.addr();
        let hash = self.hash(&addr);
        if let Ok(entry) = self.index.find_entry(hash, |&p| p as usize == pos) {
            entry.remove();
        }
        let removed = self.inner.swap_remove(pos);
        self.down_slot.swap_remove(pos);
        if pos < self.inner.len() {
            // The last member took its place
            self.moved_to(pos, self.inner.len());
        }
        // The shuffle in `next()` happens once the cursor walks past
        // the end, same as before this member was removed
        removed
    }

    fn position(&self, addr: &T::Addr) -> Option<usize> {
        let hash = self.hash(addr);
        self.index
            .find(hash, |&p| self.inner[p as usize].id.addr() == *addr)
            .map(|&p| p as usize)
    }

    // Next member that's considered active
    // Chosen at random (shuffle + round-robin)
    pub(crate) fn next(&mut self, mut rng: impl RngExt) -> Option<&Member<T>> {
        // Round-robin with a shuffle at the end
        if self.cursor >= self.inner.len() {
            self.inner.shuffle(&mut rng);
            // O(members), once every round of probes
            self.reindex();
            self.cursor = 0;
        }

        // Find an active member from cursor..len()
        let position = self
            .inner
            .iter()
            .skip(self.cursor)
            .position(|m| m.is_active())
            // Since we skip(), position() will start counting from zero
            // this ensures it's actually the index of the chosen member
            .map(|pos| pos + self.cursor);

        // And if we don't find any: try from 0..cursor
        let position = position.or_else(|| {
            self.inner
                .iter()
                .take(self.cursor)
                .position(|m| m.is_active())
        });

        if let Some(pos) = position {
            if pos < self.cursor {
                // We wrapped around the list to find a member. A shuffle
                // is needed, so we set it to MAX. Any other value could
                // cause the shuffle to not happen since members may join
                // in-between probes
                self.cursor = usize::MAX;
            } else {
                self.cursor = pos.saturating_add(1);
            }
            self.inner.get(pos)
        } else {
            None
        }
    }

    pub(crate) fn choose_down_members(
        &mut self,
        wanted: usize,
        output: &mut Vec<Member<T>>,
        rng: impl RngExt,
    ) {
        // Sampled from the list of down members: every candidate passes
        let Self {
            inner, down, drawn, ..
        } = self;
        let (inner, down) = (&*inner, &*down);
        choose_members(
            wanted,
            output,
            rng,
            drawn,
            Candidates {
                len: down.len(),
                passing: down.len(),
                get: |slot| &inner[down[slot] as usize],
            },
            |_member| true,
        );
    }

    pub(crate) fn choose_active_members<F>(
        &mut self,
        wanted: usize,
        output: &mut Vec<Member<T>>,
        rng: impl RngExt,
        picker: F,
    ) where
        F: Fn(&T) -> bool,
    {
        let passing = self.num_active();
        let Self { inner, drawn, .. } = self;
        let inner = &*inner;
        choose_members(
            wanted,
            output,
            rng,
            drawn,
            Candidates {
                len: inner.len(),
                // at most: the picker may reject some
                passing,
                get: |pos| &inner[pos],
            },
            |member| member.is_active() && picker(member.id()),
        );
    }

    pub(crate) fn remove_if_down(&mut self, id: &T) -> Option<Member<T>> {
        let pos = self.position(&id.addr())?;
        let member = &self.inner[pos];
        if &member.id == id && member.state == State::Down {
            Some(self.swap_remove(pos))
        } else {
            None
        }
    }

    pub(crate) fn iter_active(&self) -> impl Iterator<Item = &Member<T>> {
        self.inner.iter().filter(|m| m.is_active())
    }

    pub(crate) fn get(&self, addr: &T::Addr) -> Option<&Member<T>> {
        self.position(addr).map(|pos| &self.inner[pos])
    }

    pub(crate) fn is_active(&self, id: &T) -> bool {
        self.position(&id.addr()).is_some_and(|pos| {
            let member = &self.inner[pos];
            &member.id == id && member.is_active()
        })
    }

    pub(crate) fn apply_existing_if<F: Fn(&Member<T>) -> bool>(
        &mut self,
        update: &Member<T>,
        condition: F,
    ) -> Option<ApplySummary<T>> {
        let pos = self.position(&update.id().addr())?;
        Some(self.apply_at(pos, update, condition))
    }

    fn apply_at<F: Fn(&Member<T>) -> bool>(
        &mut self,
        pos: usize,
        update: &Member<T>,
        condition: F,
    ) -> ApplySummary<T> {
        let known_member = &mut self.inner[pos];
        let id_conflict = known_member.id != update.id;

        // If the update wins the conflict, the full member
        // state is replaced (it's essentially a rejoin)
        // If it doesn't, it gets discarded
        if id_conflict && known_member.id.win_addr_conflict(&update.id) {
            return ApplySummary {
                is_active_now: known_member.is_active(),
                apply_successful: false,
                changed_active_set: false,
                conflict: ConflictResult::Lost,
            };
        }

        if !condition(known_member) {
            return ApplySummary {
                is_active_now: known_member.is_active(),
                apply_successful: false,
                changed_active_set: false,
                conflict: if id_conflict {
                    ConflictResult::FailedCondition
                } else {
                    ConflictResult::NoConflict
                },
            };
        }
        let was_active = known_member.is_active();

        let (apply_successful, conflict) = if id_conflict {
            // Same addr, so `index` stays as is
            let previous = mem::replace(&mut known_member.id, update.id.clone());
            known_member.state = update.state;
            known_member.incarnation = update.incarnation;
            (true, ConflictResult::Replaced(previous))
        } else {
            (
                known_member.change_state(update.incarnation, update.state),
                ConflictResult::NoConflict,
            )
        };

        let is_active_now = known_member.is_active();
        let changed_active_set = is_active_now != was_active;

        if changed_active_set {
            if is_active_now {
                self.unmark_down(pos);
            } else {
                self.mark_down(pos);
            }
        }

        ApplySummary {
            is_active_now,
            apply_successful,
            changed_active_set,
            conflict,
        }
    }

    pub(crate) fn apply(&mut self, update: &Member<T>, mut rng: impl RngExt) -> ApplySummary<T> {
        let addr = update.id().addr();
        if let Some(pos) = self.position(&addr) {
            return self.apply_at(pos, update, |_member| true);
        }

        // Unknown member, we'll register it
        let is_active_now = update.is_active();

        // Insert at the end and swap with a random position.
        // Grown by an eighth at a time, not doubled: a member list is
        // held for long and rarely shrinks, and doubling leaves up to
        // half of it unused.
        if self.inner.len() == self.inner.capacity() {
            let more = (self.inner.len() / 8).max(4);
            self.inner.reserve_exact(more);
            self.down_slot.reserve_exact(more);
        }
        self.inner.push(update.clone());
        self.down_slot.push(NOT_DOWN);
        let inserted_at = self.inner.len() - 1;
        self.index_insert(inserted_at);
        if !is_active_now {
            self.mark_down(inserted_at);
        }

        let swap_idx = (0..self.inner.len())
            .choose(&mut rng)
            .unwrap_or(inserted_at);

        self.swap(swap_idx, inserted_at);

        ApplySummary {
            is_active_now,
            apply_successful: true,
            // Registering a new active member changes the active set
            changed_active_set: is_active_now,
            conflict: ConflictResult::NoConflict,
        }
    }
}

/// The members `choose_members` picks from: `get(0..len)`, of which
/// about `passing` pass the picker.
struct Candidates<G> {
    len: usize,
    passing: usize,
    get: G,
}

/// Pushes to `output` up to `wanted` distinct members, chosen uniformly
/// at random among the candidates that pass `picker`.
///
/// When enough candidates pass, draws random positions and keeps the
/// new ones that pass: O(wanted) expected. A bounded number of draws
/// (and falling back to reservoir sampling when they don't suffice)
/// keeps it O(candidates) in the worst case, which is also what it
/// costs to want most candidates, or when few of them pass.
fn choose_members<'a, T, G, F>(
    wanted: usize,
    output: &mut Vec<Member<T>>,
    mut rng: impl RngExt,
    drawn: &mut Vec<usize>,
    candidates: Candidates<G>,
    picker: F,
) where
    T: Clone + 'a,
    G: Fn(usize) -> &'a Member<T>,
    F: Fn(&Member<T>) -> bool,
{
    let Candidates { len, passing, get } = candidates;
    if wanted == 0 || passing == 0 || len == 0 {
        return;
    }
    let start = output.len();

    // Rejection sampling: each draw that yields a position not drawn
    // before is uniformly random among the candidates not drawn yet,
    // so the chosen ones are a uniformly random subset of those that
    // pass the picker.
    // Worth it when at least half the candidates pass (a draw fails
    // the picker at most half the time) and at most half of those
    // are wanted (a draw hits a chosen one at most half the time).
    if wanted.saturating_mul(2) <= passing && passing.saturating_mul(2) >= len {
        drawn.clear();
        let max_draws = wanted.saturating_mul(4).saturating_add(8);
        for _ in 0..max_draws {
            let pos = rng.random_range(0..len);
            // drawn.len() <= max_draws: O(wanted) per draw
            if drawn.contains(&pos) {
                continue;
            }
            drawn.push(pos);

            let member = get(pos);
            if picker(member) {
                output.push(member.clone());
                if output.len() - start == wanted {
                    return;
                }
            }
        }
        // Unlucky, or the picker rejects most: start over
        output.truncate(start);
    }

    // Basic reservoir sampling
    let mut num_chosen = 0;
    let mut num_seen = 0;

    for member in (0..len).map(get) {
        if !picker(member) {
            continue;
        }

        num_seen += 1;
        if num_chosen < wanted {
            num_chosen += 1;
            output.push(member.clone());
        } else {
            let replace_at = rng.random_range(0..num_seen);
            if replace_at < wanted {
                output[start + replace_at] = member.clone();
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
#[must_use]
pub(crate) struct ApplySummary<T> {
    pub(crate) is_active_now: bool,
    pub(crate) apply_successful: bool,
    pub(crate) changed_active_set: bool,
    pub(crate) conflict: ConflictResult<T>,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ConflictResult<T> {
    NoConflict,
    Replaced(T),
    Lost,
    FailedCondition,
}

#[cfg(test)]
mod tests {

    use crate::Identity;

    use super::*;

    use alloc::vec;
    use rand::{SeedableRng, rngs::SmallRng};

    #[derive(Clone, Debug, PartialEq, Eq, Copy, PartialOrd, Ord)]
    struct Id(&'static str);
    impl crate::Identity for Id {
        type Addr = &'static str;

        fn renew(&self) -> Option<Self> {
            None
        }

        fn addr(&self) -> Self::Addr {
            self.0
        }

        fn win_addr_conflict(&self, _adversary: &Self) -> bool {
            panic!("addr is self, there'll never be a conflict");
        }
    }

    use State::*;

    #[test]
    fn alive_transitions() {
        let mut member = Member::new(Id("a"), 0, Alive);

        // Alive => Alive
        assert!(
            member.change_state(member.incarnation + 1, Alive),
            "can transition to a higher incarnation"
        );

        assert_eq!(1, member.incarnation);
        assert_eq!(Alive, member.state);

        assert!(
            !member.change_state(member.incarnation - 1, Alive),
            "cannot transition to a lower incarnation"
        );

        assert!(
            !member.change_state(member.incarnation, Alive),
            "cannot transition to same state and incarnation {:?}",
            member
        );

        // Alive => Suspect
        assert!(
            !member.change_state(member.incarnation - 1, Suspect),
            "lower suspect incarnation shouldn't transition"
        );

        assert!(
            member.change_state(member.incarnation, Suspect),
            "transition to suspect with same incarnation"
        );
        assert_eq!(Suspect, member.state);

        member = Member::new(Id("b"), 0, Alive);
        assert!(
            member.change_state(member.incarnation + 1, Suspect),
            "transition to suspect with higher incarnation"
        );
        assert_eq!(1, member.incarnation);
        assert_eq!(Suspect, member.state);

        // Alive => Down, always works
        assert!(
            Member::new("c", 1, Alive).change_state(0, Down),
            "transitions to down on lower incarnation"
        );
        assert!(
            Member::new("c", 0, Alive).change_state(0, Down),
            "transitions to down on same incarnation"
        );
        assert!(
            Member::new("c", 0, Alive).change_state(1, Down),
            "transitions to down on higher incarnation"
        );
    }

    #[test]
    fn suspect_transitions() {
        let mut member = Member::new(Id("a"), 0, Suspect);

        // Suspect => Suspect
        assert!(
            member.change_state(member.incarnation + 1, Suspect),
            "can transition to a higher incarnation"
        );

        assert_eq!(1, member.incarnation);
        assert_eq!(Suspect, member.state);

        assert!(
            !member.change_state(member.incarnation - 1, Suspect),
            "cannot transition to a lower incarnation"
        );

        assert!(
            !member.change_state(member.incarnation, Suspect),
            "cannot transition to same state and incarnation {:?}",
            member
        );

        // Suspect => Alive
        assert!(
            !member.change_state(member.incarnation - 1, Alive),
            "lower alive incarnation shouldn't transition"
        );
        assert!(
            !member.change_state(member.incarnation, Alive),
            "same alive incarnation shouldn't transition"
        );

        assert!(
            member.change_state(member.incarnation + 1, Alive),
            "can transition to alive with higher incarnation"
        );
        assert_eq!(Alive, member.state);

        // Suspect => Down, always works
        assert!(
            Member::new("c", 1, Suspect).change_state(0, Down),
            "transitions to down on lower incarnation"
        );
        assert!(
            Member::new("c", 0, Suspect).change_state(0, Down),
            "transitions to down on same incarnation"
        );
        assert!(
            Member::new("c", 0, Suspect).change_state(1, Down),
            "transitions to down on higher incarnation"
        );
    }

    #[test]
    fn down_never_transitions() {
        let mut member = Member::new("dead", 1, Down);

        for incarnation in 0..=2 {
            assert!(!member.change_state(incarnation, Alive));
            assert!(!member.change_state(incarnation, Suspect));
            assert!(!member.change_state(incarnation, Down));
        }
    }

    #[test]
    fn next_walks_sequentially_then_shuffles() {
        let ordered_ids = vec![Id("1"), Id("2"), Id("3"), Id("4"), Id("5")];
        let mut members = Members::new(ordered_ids.iter().cloned().map(Member::alive).collect());

        let mut rng = SmallRng::seed_from_u64(0xF0CA);

        for wanted in ordered_ids.iter() {
            let got = members
                .next(&mut rng)
                .expect("Non-empty set of Alive members should always yield Some()")
                .id;
            assert_eq!(wanted, &got);
        }

        // By now we walked through all known live members so
        // the internal state should've shuffled.
        // We'll verify that by calling `next()` multiple
        // times and comparing with the original `ordered_ids`
        let mut after_shuffle = (0..ordered_ids.len())
            .map(|_| members.next(&mut rng).unwrap().id)
            .collect::<Vec<_>>();
        assert_ne!(ordered_ids, after_shuffle);

        // The shuffle only happens once the cursor walks
        // through the whole set, so `after_shuffle` should
        // contain every member, like `ordered_ids`, but in
        // a distinct order
        after_shuffle.sort_unstable();
        assert_eq!(ordered_ids, after_shuffle);
    }

    #[test]
    fn apply_existing_if_behaviour() {
        let mut members = Members::new(Vec::new());

        assert_eq!(
            None,
            members.apply_existing_if(&Member::alive(Id("1")), |_member| true),
            "Only yield None only if member is not found"
        );

        let mut rng = SmallRng::seed_from_u64(0xF0CA);
        let _ = members.apply(&Member::alive(Id("1")), &mut rng);

        assert_ne!(
            None,
            members.apply_existing_if(&Member::alive(Id("1")), |_member| true),
            "Must yield Some() if existing, regardless of condition"
        );

        assert_ne!(
            None,
            members.apply_existing_if(&Member::alive(Id("1")), |_member| false),
            "Must yield Some() if existing, regardless of condition"
        );
    }

    #[test]
    fn apply_summary_behaviour() {
        let mut members = Members::new(Vec::new());
        let mut rng = SmallRng::seed_from_u64(0xF0CA);

        // New and active member
        let res = members.apply(&Member::suspect(Id("1")), &mut rng);
        assert_eq!(
            ApplySummary {
                is_active_now: true,
                apply_successful: true,
                changed_active_set: true,
                conflict: ConflictResult::NoConflict,
            },
            res,
        );
        assert_eq!(1, members.len());
        assert_eq!(1, members.num_active());

        // Failed attempt to change member id=1 to alive
        // (since it's already suspect with same incarnation)
        let res = members.apply(&Member::alive(Id("1")), &mut rng);
        assert_eq!(
            ApplySummary {
                is_active_now: true,
                apply_successful: false,
                changed_active_set: false,
                conflict: ConflictResult::NoConflict,
            },
            res,
        );
        assert_eq!(1, members.len());

        // Successful attempt at changing member id=1 to
        // alive by using a higher incarnation
        let res = members.apply(&Member::new(Id("1"), 1, State::Alive), &mut rng);
        assert_eq!(
            ApplySummary {
                is_active_now: true,
                apply_successful: true,
                changed_active_set: false,
                conflict: ConflictResult::NoConflict,
            },
            res,
        );
        assert_eq!(1, members.len());

        // Change existing member to down
        let res = members.apply(&Member::down(Id("1")), &mut rng);
        assert_eq!(
            ApplySummary {
                is_active_now: false,
                apply_successful: true,
                changed_active_set: true,
                conflict: ConflictResult::NoConflict,
            },
            res,
        );
        assert_eq!(1, members.len());
        assert_eq!(0, members.num_active());

        // New and inactive member
        let res = members.apply(&Member::down(Id("2")), &mut rng);
        assert_eq!(
            ApplySummary {
                is_active_now: false,
                apply_successful: true,
                changed_active_set: false,
                conflict: ConflictResult::NoConflict,
            },
            res,
        );
        assert_eq!(2, members.len());
        assert_eq!(0, members.num_active());
    }

    #[test]
    fn remove_if_down_works() {
        let mut members = Members::new(Vec::new());
        let mut rng = SmallRng::seed_from_u64(0xF0CA);

        assert_eq!(
            None,
            members.remove_if_down(&Id("1")),
            "cant remove member that does not exist"
        );
        let _ = members.apply(&Member::alive(Id("1")), &mut rng);

        assert_eq!(
            None,
            members.remove_if_down(&Id("1")),
            "cant remove member that isnt down"
        );
        let _ = members.apply(&Member::down(Id("1")), &mut rng);

        assert_eq!(
            Some(Member::down(Id("1"))),
            members.remove_if_down(&Id("1")),
            "must return the removed member"
        );
    }

    #[test]
    fn next_yields_none_with_no_active_members() {
        let mut members = Members::new(Vec::new());
        let mut rng = SmallRng::seed_from_u64(0xF0CA);

        assert_eq!(
            None,
            members.next(&mut rng),
            "next() should yield None when there are no members"
        );

        let _ = members.apply(&Member::down(Id("-1")), &mut rng);
        let _ = members.apply(&Member::down(Id("-2")), &mut rng);
        let _ = members.apply(&Member::down(Id("-3")), &mut rng);

        assert_eq!(
            None,
            members.next(&mut rng),
            "next() should yield None when there are no active members"
        );

        let _ = members.apply(&Member::alive(Id("1")), &mut rng);

        for _i in 0..10 {
            assert_eq!(
                Some(Id("1")),
                members.next(&mut rng).map(|m| m.id),
                "next() should yield the same member if its the only active"
            );
        }
    }

    #[test]
    fn choose_active_members_behaviour() {
        let mut members = Members::new(Vec::from([
            // 5 active members
            Member::alive(Id("1")),
            Member::alive(Id("2")),
            Member::alive(Id("3")),
            Member::suspect(Id("4")),
            Member::suspect(Id("5")),
            // 2 down
            Member::down(Id("6")),
            Member::down(Id("7")),
        ]));

        assert_eq!(7, members.len());
        assert_eq!(5, members.num_active());

        let mut out = Vec::new();
        let mut rng = SmallRng::seed_from_u64(0xF0CA);

        out.clear();
        members.choose_active_members(0, &mut out, &mut rng, |_| true);
        assert_eq!(0, out.len(), "Can pointlessly choose 0 members");

        out.clear();
        members.choose_active_members(10, &mut out, &mut rng, |_| false);
        assert_eq!(0, out.len(), "Filtering works");

        out.clear();
        members.choose_active_members(members.len(), &mut out, &mut rng, |_| true);
        assert_eq!(
            members.num_active(),
            out.len(),
            "Only chooses active members"
        );

        out.clear();
        members.choose_active_members(2, &mut out, &mut rng, |_| true);
        assert_eq!(2, out.len(), "Respects `wanted` even if we have more");

        out.clear();
        members.choose_active_members(usize::MAX, &mut out, &mut rng, |&member_id| {
            member_id.0.parse::<usize>().expect("number") > 4
        });
        assert_eq!(vec![Member::suspect(Id("5"))], out);

        out.clear();
        members.choose_down_members(3, &mut out, &mut rng);
        assert_eq!(2, out.len());
        assert!(out.iter().any(|m| m.id == Id("7")));
        assert!(out.iter().any(|m| m.id == Id("6")));
    }

    #[test]
    fn sets_replaced_id_on_addr_conflict() {
        let id = crate::testing::ID::new(1).rejoinable();
        let mut members = Members::new(Vec::from([
            // 5 active members
            Member::alive(id),
        ]));

        let renewed = id.renew().unwrap();
        let summary = members
            .apply_existing_if(&Member::alive(renewed), |_| true)
            .expect("member found");

        assert!(summary.apply_successful);
        assert_eq!(ConflictResult::Replaced(id), summary.conflict);

        let another = renewed.renew().unwrap();
        let summary = members
            .apply_existing_if(&Member::alive(another), |_| false)
            .expect("member found");

        assert!(!summary.apply_successful);
        assert_eq!(
            ConflictResult::FailedCondition,
            summary.conflict,
            "must not apply if condition fails"
        );

        // trying to go back to the past leads to
        // conflict resolution failure
        let summary = members
            .apply_existing_if(&Member::alive(id), |_| true)
            .expect("member found");

        assert_eq!(ConflictResult::Lost, summary.conflict,);
        assert!(!summary.apply_successful, "must not apply if conflict lost");
    }

    /// Upstream's linear-scan bookkeeping, as a reference for
    /// `Members` and its indices.
    #[derive(Default)]
    struct Model {
        members: Vec<Member<crate::testing::ID>>,
    }

    impl Model {
        fn find(&self, addr: u8) -> Option<usize> {
            self.members.iter().position(|m| m.id.addr() == addr)
        }

        fn apply_existing_if(
            &mut self,
            update: &Member<crate::testing::ID>,
            condition: impl Fn(&Member<crate::testing::ID>) -> bool,
        ) -> Option<ApplySummary<crate::testing::ID>> {
            let pos = self.find(update.id.addr())?;
            let known = &mut self.members[pos];
            let id_conflict = known.id != update.id;
            if id_conflict && known.id.win_addr_conflict(&update.id) {
                return Some(ApplySummary {
                    is_active_now: known.is_active(),
                    apply_successful: false,
                    changed_active_set: false,
                    conflict: ConflictResult::Lost,
                });
            }
            if !condition(known) {
                return Some(ApplySummary {
                    is_active_now: known.is_active(),
                    apply_successful: false,
                    changed_active_set: false,
                    conflict: if id_conflict {
                        ConflictResult::FailedCondition
                    } else {
                        ConflictResult::NoConflict
                    },
                });
            }
            let was_active = known.is_active();
            let (apply_successful, conflict) = if id_conflict {
                let previous = mem::replace(&mut known.id, update.id);
                known.state = update.state;
                known.incarnation = update.incarnation;
                (true, ConflictResult::Replaced(previous))
            } else {
                (
                    known.change_state(update.incarnation, update.state),
                    ConflictResult::NoConflict,
                )
            };
            Some(ApplySummary {
                is_active_now: known.is_active(),
                apply_successful,
                changed_active_set: known.is_active() != was_active,
                conflict,
            })
        }

        fn apply(
            &mut self,
            update: &Member<crate::testing::ID>,
        ) -> ApplySummary<crate::testing::ID> {
            self.apply_existing_if(update, |_| true).unwrap_or_else(|| {
                self.members.push(update.clone());
                ApplySummary {
                    is_active_now: update.is_active(),
                    apply_successful: true,
                    changed_active_set: update.is_active(),
                    conflict: ConflictResult::NoConflict,
                }
            })
        }

        fn remove_if_down(
            &mut self,
            id: &crate::testing::ID,
        ) -> Option<Member<crate::testing::ID>> {
            let pos = self
                .members
                .iter()
                .position(|m| &m.id == id && m.state == State::Down)?;
            Some(self.members.swap_remove(pos))
        }

        fn get(&self, id: &crate::testing::ID) -> Option<&Member<crate::testing::ID>> {
            self.members.iter().find(|m| &m.id == id)
        }

        fn sorted(&self) -> Vec<Member<crate::testing::ID>> {
            let mut all = self.members.clone();
            all.sort_unstable_by_key(|m| *m.id());
            all
        }
    }

    fn sorted(members: &Members<crate::testing::ID>) -> Vec<Member<crate::testing::ID>> {
        let mut all = members.iter().cloned().collect::<Vec<_>>();
        all.sort_unstable_by_key(|m| *m.id());
        all
    }

    fn random_member(rng: &mut SmallRng) -> Member<crate::testing::ID> {
        let id = crate::testing::ID::new_with_bump(rng.random_range(0..24), rng.random_range(0..3));
        let state = match rng.random_range(0..5) {
            0 | 1 => Alive,
            2 | 3 => Suspect,
            _ => Down,
        };
        Member::new(id, rng.random_range(0..3), state)
    }

    fn assert_distinct(chosen: &[Member<crate::testing::ID>]) {
        for (i, member) in chosen.iter().enumerate() {
            assert!(
                chosen[..i]
                    .iter()
                    .all(|other| other.id.addr() != member.id.addr()),
                "chose {member:?} twice"
            );
        }
    }

    #[test]
    fn indices_agree_with_linear_scan() {
        for seed in 0..32 {
            let mut rng = SmallRng::seed_from_u64(seed);
            let mut members = Members::new(Vec::new());
            let mut model = Model::default();
            let mut out = Vec::new();

            for step in 0..1_500 {
                match rng.random_range(0..9) {
                    0..=2 => {
                        let update = random_member(&mut rng);
                        let got = members.apply(&update, &mut rng);
                        assert_eq!(model.apply(&update), got, "seed {seed} step {step}");
                    }
                    3 => {
                        let update = random_member(&mut rng);
                        let incarnation = rng.random_range(0..3);
                        let condition = |m: &Member<_>| m.incarnation() == incarnation;
                        let got = members.apply_existing_if(&update, condition);
                        assert_eq!(model.apply_existing_if(&update, condition), got);
                    }
                    4 => {
                        let id = *random_member(&mut rng).id();
                        assert_eq!(model.remove_if_down(&id), members.remove_if_down(&id));
                    }
                    5 => {
                        let id = *random_member(&mut rng).id();
                        let expected = model.get(&id).is_some_and(|m| m.is_active());
                        assert_eq!(expected, members.is_active(&id));
                    }
                    6 => {
                        let num_active = model.members.iter().filter(|m| m.is_active()).count();
                        match members.next(&mut rng) {
                            Some(member) => {
                                assert!(member.is_active());
                                assert_eq!(Some(member), model.get(member.id()));
                            }
                            None => assert_eq!(0, num_active),
                        }
                    }
                    7 => {
                        let wanted = rng.random_range(0..8);
                        let everyone = rng.random_bool(0.5);
                        let picker =
                            |id: &crate::testing::ID| everyone || !id.addr().is_multiple_of(3);
                        let passing = model
                            .members
                            .iter()
                            .filter(|m| m.is_active() && picker(m.id()))
                            .count();
                        out.clear();
                        members.choose_active_members(wanted, &mut out, &mut rng, picker);
                        assert_eq!(wanted.min(passing), out.len());
                        assert_distinct(&out);
                        for member in &out {
                            assert!(member.is_active() && picker(member.id()));
                            assert_eq!(Some(member), model.get(member.id()));
                        }
                    }
                    _ => {
                        let wanted = rng.random_range(0..5);
                        let num_down = model.members.iter().filter(|m| !m.is_active()).count();
                        out.clear();
                        members.choose_down_members(wanted, &mut out, &mut rng);
                        assert_eq!(wanted.min(num_down), out.len());
                        assert_distinct(&out);
                        for member in &out {
                            assert!(!member.is_active());
                            assert_eq!(Some(member), model.get(member.id()));
                        }
                    }
                }

                members.check_invariants();
                assert_eq!(model.sorted(), sorted(&members), "seed {seed} step {step}");
                assert_eq!(
                    model.members.iter().filter(|m| m.is_active()).count(),
                    members.num_active()
                );
            }
        }
    }

    #[test]
    fn next_walks_every_active_member_each_round() {
        let mut rng = SmallRng::seed_from_u64(0xF0CA);
        let mut members = Members::new(Vec::new());
        for addr in 0..50 {
            let id = crate::testing::ID::new(addr);
            let member = if addr.is_multiple_of(5) {
                Member::down(id)
            } else {
                Member::alive(id)
            };
            let _ = members.apply(&member, &mut rng);
        }

        // A round visits every active member once, and may visit one
        // more time the first of them when down members trail the last
        let rounds = 3;
        let mut visits = [0; 50];
        for _ in 0..rounds * members.num_active() {
            let member = members.next(&mut rng).expect("there are active members");
            assert!(member.is_active());
            visits[usize::from(member.id.addr())] += 1;
            members.check_invariants();
        }
        for (addr, &count) in visits.iter().enumerate() {
            if addr.is_multiple_of(5) {
                assert_eq!(0, count);
            } else {
                assert!((rounds - 1..=rounds + 1).contains(&count), "{visits:?}");
            }
        }
    }

    #[test]
    fn choosing_few_active_members_does_not_scan() {
        use core::cell::Cell;

        let mut rng = SmallRng::seed_from_u64(0xF0CA);
        let mut members = Members::new(
            (0..=255)
                .map(|addr| Member::alive(crate::testing::ID::new(addr)))
                .collect(),
        );
        let calls = Cell::new(0);
        let mut out = Vec::new();
        for _ in 0..100 {
            out.clear();
            members.choose_active_members(3, &mut out, &mut rng, |_| {
                calls.set(calls.get() + 1);
                true
            });
            assert_eq!(3, out.len());
        }
        assert!(
            calls.get() < 100 * 4,
            "picker called {} times for 100 choices of 3 in 256",
            calls.get()
        );
    }

    #[test]
    fn chosen_members_are_uniformly_random() {
        // (active, down): the first uses rejection sampling, the
        // second falls back to reservoir sampling (few active)
        for (num_active, num_down) in [(8, 4), (3, 9)] {
            let mut rng = SmallRng::seed_from_u64(0xF0CA);
            let mut members = Members::new(Vec::new());
            for addr in 0..num_active + num_down {
                let id = crate::testing::ID::new(addr);
                let member = if addr < num_active {
                    Member::alive(id)
                } else {
                    Member::down(id)
                };
                let _ = members.apply(&member, &mut rng);
            }

            let wanted = 2;
            let rounds = 40_000;
            let mut singles = [0_u32; 16];
            let mut pairs = [[0_u32; 16]; 16];
            let mut out = Vec::new();
            for _ in 0..rounds {
                out.clear();
                members.choose_active_members(wanted, &mut out, &mut rng, |_| true);
                assert_eq!(wanted, out.len());
                let (a, b) = (out[0].id.addr(), out[1].id.addr());
                assert!(a < num_active && b < num_active && a != b);
                singles[usize::from(a)] += 1;
                singles[usize::from(b)] += 1;
                pairs[usize::from(a.min(b))][usize::from(a.max(b))] += 1;
            }

            let n = f64::from(num_active);
            let expected_single = f64::from(rounds) * 2.0 / n;
            for &count in &singles[..usize::from(num_active)] {
                let error = (f64::from(count) - expected_single).abs() / expected_single;
                assert!(error < 0.05, "{singles:?}");
            }
            let expected_pair = f64::from(rounds) / (n * (n - 1.0) / 2.0);
            for a in 0..usize::from(num_active) {
                for b in a + 1..usize::from(num_active) {
                    let error = (f64::from(pairs[a][b]) - expected_pair).abs() / expected_pair;
                    assert!(error < 0.15, "{pairs:?}");
                }
            }
        }
    }
}
