/* This Source Code Form is subject to the terms of the Mozilla Public
 * License, v. 2.0. If a copy of the MPL was not distributed with this
 * file, You can obtain one at https://mozilla.org/MPL/2.0/. */
use alloc::{
    collections::{BinaryHeap, VecDeque},
    vec::Vec,
};
use core::{
    cmp::Ordering,
    hash::{BuildHasher, Hash},
};

use bytes::BufMut;
use hashbrown::{DefaultHashBuilder, HashTable};

/// A type capable of decoding a (associated) broadcast from a buffer
/// and deciding whether to keep disseminating it for other members
/// of the cluster (when it's new information) or to discard it (when
/// its outdated/stale).
pub trait BroadcastHandler<T> {
    /// A unique identifier for the broadcasts this handler manages
    ///
    /// It should be able to compare itself against an arbitrary number
    /// of other [`Self::Key`] instances and decide wether it
    /// replaces it or not so conflicting/stale information isn't
    /// disseminated.
    type Key: Invalidates;

    /// The error type that `receive_item` may emit. Will be wrapped
    /// by [`crate::Error::CustomBroadcast`].
    type Error: core::error::Error + Send + Sync + 'static;

    /// Decodes a [`Self::Key`] from a buffer and either discards
    /// it or tells Foca to persist and disseminate it.
    ///
    /// `Sender` is `None` when you're adding broadcast data directly,
    /// via [`crate::Foca::add_broadcast`], otherwise it will be the
    /// address of the member that sent the data. Notice that Foca
    /// doesn't track the origin of packets- if you need it you
    /// have to add it to the data you're broadcasting.
    ///
    /// When you receive a broadcast you have to decide whether it's
    /// new information that needs to be disseminated (`Ok(Some(...))`)
    /// or not (`Ok(None)`).
    ///
    /// Always yielding `Some(...)` is wrong because Foca will never
    /// know when to stop sending this information to other members.
    ///
    /// Example: Assume your custom broadcast is a simple Set-Key-Value
    /// operation. When you receive it you should check if your map
    /// contains the Key-Value pair; If it didn't, you yield
    /// `Some`, otherwise the operation is stale, so you yield `None`.
    ///
    /// The `data` parameter is the exact data provided to
    /// [`crate::Foca::add_broadcast`]. When Foca receives N custom
    /// broadcasts at once, this gets called N times.
    fn receive_item(
        &mut self,
        data: &[u8],
        sender: Option<&T>,
    ) -> Result<Option<Self::Key>, Self::Error>;

    /// Decides whether Foca should add broadcast data to the message
    /// it's about to send to active member `T`.
    ///
    /// Normally when Foca sends a message it always tries to include
    /// custom broadcasts alongside the information it actually
    /// cares about; This allows implementations to override this
    /// logic with something else.
    ///
    /// Example: You are running a heterogeneous cluster and some nodes
    /// are always very busy and you'd rather they never have to deal
    /// with the extra cpu/bandwidth cost of receiving/sending
    /// your custom broadcasts.
    ///
    /// Returning `true` tells Foca to proceed as it would normally,
    /// including broadcasts in the messages it sends when it can.
    ///
    /// Returning `false` tells Foca to not include such broadcasts
    /// in the message. It does *not* prevent the message from being
    /// sent, just keeps Foca from attaching extra data to them.
    fn should_add_broadcast_data(&self, _member: &T) -> bool {
        true
    }
}

/// A type that's able to look at another and decide wether it's
/// newer/fresher (i.e. invalidates) than it.
///
/// As you send/receive broadcasts, Foca will hold them for a while
/// as it disseminates the data to other cluster members. This trait
/// helps with replacing data that hasn't been fully disseminated
/// yet but you already know it's stale.
///
/// Example: Assume a versioned broadcast like `{key,version,...}`;
/// After you receive `{K, 0, ...}` and keep it, Foca will be
/// disseminating it. Soon after you receive `{K, 1, ...}` which
/// is a newer version for this broadcast. This trait enables
/// Foca to immediately stop disseminating the previous version,
/// even if it hasn't sent it to everyone it can yet.
pub trait Invalidates {
    /// When `item.invalidates(&other)` it means that Foca will
    /// keep `item` and discard `other` from its dissemination
    /// backlog.
    fn invalidates(&self, other: &Self) -> bool;
}

impl Invalidates for &[u8] {
    fn invalidates(&self, other: &Self) -> bool {
        self.eq(other)
    }
}

/// How many items in a row `fill` may find too large for the room left
/// in the buffer before it stops looking: without a bound, once the
/// buffer is nearly full, filling it would pop every item of the backlog.
///
/// Items are popped largest first among those sent as many times, so
/// after a few misses the rest rarely fits: the bound costs little
/// packing and keeps a fill at O((items sent + `MAX_MISSES`) * log n).
const MAX_MISSES: usize = 8;

/// Broadcasts whose keys decide replacement via [`Invalidates`]: a new
/// item replaces every item it invalidates, so adding one is
/// O(backlog). See [`KeyedBroadcasts`] for the cheaper alternative.
pub(crate) struct Broadcasts<V> {
    flip: BinaryHeap<Entry<V>>,
    flop: BinaryHeap<Entry<V>>,
}

impl<T> Broadcasts<T>
where
    T: Invalidates,
{
    pub(crate) fn new() -> Self {
        Self {
            flip: Default::default(),
            flop: Default::default(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.flip.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.flip.is_empty()
    }

    pub(crate) fn add_or_replace(&mut self, item: T, data: Vec<u8>, max_tx: usize) {
        debug_assert!(max_tx > 0);
        self.flip.retain(|node| !item.invalidates(&node.item));
        self.flip.push(Entry {
            remaining_tx: max_tx,
            item,
            data,
        });
    }

    pub(crate) fn fill_with_len_prefix(
        &mut self,
        mut buffer: impl BufMut,
        max_items: usize,
    ) -> usize {
        if self.flip.is_empty() {
            return 0;
        }
        debug_assert!(self.flop.is_empty());

        let mut num_taken = 0;
        let mut remaining = max_items;
        let mut misses = 0;

        while buffer.has_remaining_mut() && remaining > 0 && misses < MAX_MISSES {
            let Some(mut node) = self.flip.pop() else {
                break;
            };
            debug_assert!(node.remaining_tx > 0);

            if buffer.remaining_mut() >= node.data.len() + 2 {
                num_taken += 1;
                remaining -= 1;
                misses = 0;

                debug_assert!(u16::try_from(node.data.len()).is_ok());
                buffer.put_u16(node.data.len() as u16);
                buffer.put_slice(&node.data);
                node.remaining_tx -= 1;
            } else {
                misses += 1;
            }

            if node.remaining_tx > 0 {
                self.flop.push(node);
            }
        }

        self.flip.append(&mut self.flop);

        num_taken
    }
}

/// Broadcasts where a new item replaces the one with an equal key
/// (the [`Invalidates`] of foca's own cluster updates, keyed by member
/// address): O(1) per item added and per item sent.
///
/// Each item lives in a slot of `slots`, found by key through `by_key`.
/// `queues[r]` holds, in the order they got there, `Ticket`s of the
/// items with `r` transmissions left: naming a slot and the generation
/// of the item they were issued for. Replacing an item only bumps its
/// slot's generation (and issues a new ticket), and a ticket whose
/// generation is not its slot's anymore is stale, dropped when met.
/// Stale tickets are counted and purged in bulk once they outnumber
/// the live ones, so the queues stay O(live items) at O(1) amortized
/// per replacement.
///
/// Sends items with the most transmissions left first (as
/// [`Broadcasts`]), and among those the one that got there first (where
/// [`Broadcasts`] sends the largest: foca's own updates are all about
/// the same size, and a queue per count is walked in order, where a
/// heap of thousands of items costs a dozen cache misses an item).
pub(crate) struct KeyedBroadcasts<K> {
    // `None`: free, listed in `free`
    slots: Vec<Option<Slot<K>>>,
    free: Vec<u32>,
    // The index in `slots` of every live item, hashed by its key
    by_key: HashTable<u32>,
    hasher: DefaultHashBuilder,
    queues: Vec<VecDeque<Ticket>>,
    num_stale: usize,
    next_generation: u32,
}

struct Slot<K> {
    key: K,
    data: Data,
    generation: u32,
}

/// Bytes this long or shorter are kept in the slot itself.
const INLINE: usize = 22;

/// An item's bytes: in place when they fit (a cluster update of a small
/// identity is a dozen bytes: an allocation of its own would cost more
/// than the bytes, in every backlog of every member), boxed otherwise.
enum Data {
    Inline { len: u8, buf: [u8; INLINE] },
    Boxed(alloc::boxed::Box<[u8]>),
}

impl Data {
    fn new(data: Vec<u8>) -> Self {
        if data.len() <= INLINE {
            let mut buf = [0; INLINE];
            buf[..data.len()].copy_from_slice(&data);
            Data::Inline {
                len: data.len() as u8,
                buf,
            }
        } else {
            Data::Boxed(data.into_boxed_slice())
        }
    }

    fn as_slice(&self) -> &[u8] {
        match self {
            Data::Inline { len, buf } => &buf[..usize::from(*len)],
            Data::Boxed(data) => data,
        }
    }
}

/// The only live ticket of an item is in the queue of its remaining
/// transmissions. Generations wrap: a stale ticket would pass for live
/// only if its slot saw 2^32 items since, while it waited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Ticket {
    generation: u32,
    slot: u32,
}

impl<K> KeyedBroadcasts<K>
where
    K: Hash + Eq,
{
    pub(crate) fn new() -> Self {
        Self {
            slots: Vec::new(),
            free: Vec::new(),
            by_key: HashTable::new(),
            hasher: DefaultHashBuilder::default(),
            queues: Vec::new(),
            num_stale: 0,
            next_generation: 0,
        }
    }

    /// Number of live items. Exact: stale tickets are not counted.
    pub(crate) fn len(&self) -> usize {
        self.by_key.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    pub(crate) fn add_or_replace(&mut self, key: K, data: Vec<u8>, max_tx: usize) {
        debug_assert!(max_tx > 0);
        let generation = self.next_generation;
        self.next_generation = self.next_generation.wrapping_add(1);
        let data = Data::new(data);

        let hash = self.hasher.hash_one(&key);
        let Self {
            slots,
            free,
            by_key,
            hasher,
            ..
        } = self;
        let found = by_key
            .find(hash, |&idx| slot_key(slots, idx as usize) == Some(&key))
            .copied();

        let slot = if let Some(idx) = found {
            // Replace: the item's previous ticket goes stale
            let previous = slots[idx as usize].replace(Slot {
                key,
                data,
                generation,
            });
            debug_assert!(previous.is_some());
            self.num_stale += 1;
            idx
        } else {
            let entry = Some(Slot {
                key,
                data,
                generation,
            });
            let idx = if let Some(idx) = free.pop() {
                debug_assert!(slots[idx as usize].is_none());
                slots[idx as usize] = entry;
                idx
            } else {
                slots.push(entry);
                (slots.len() - 1) as u32
            };
            by_key.insert_unique(hash, idx, |&idx| {
                slot_key(slots, idx as usize).map_or(0, |key| hasher.hash_one(key))
            });
            idx
        };

        if self.queues.len() <= max_tx {
            self.queues.resize_with(max_tx + 1, VecDeque::new);
        }
        self.queues[max_tx].push_back(Ticket { generation, slot });

        if self.num_stale > self.by_key.len().max(32) {
            self.purge_stale();
        }
    }

    fn is_live(slots: &[Option<Slot<K>>], ticket: &Ticket) -> bool {
        slots
            .get(ticket.slot as usize)
            .and_then(Option::as_ref)
            .is_some_and(|slot| slot.generation == ticket.generation)
    }

    // O(queue), amortized over the replacements that made the
    // tickets stale
    fn purge_stale(&mut self) {
        let slots = &self.slots;
        for queue in &mut self.queues {
            queue.retain(|ticket| Self::is_live(slots, ticket));
        }
        self.num_stale = 0;
        debug_assert_eq!(
            self.queues.iter().map(VecDeque::len).sum::<usize>(),
            self.by_key.len()
        );
    }

    // The item at `idx` was sent `max_tx` times: forget it
    fn remove(&mut self, idx: u32) {
        let slot = self.slots.get_mut(idx as usize).and_then(Option::take);
        debug_assert!(slot.is_some(), "removing a free slot");
        if let Some(slot) = slot {
            let hash = self.hasher.hash_one(&slot.key);
            if let Ok(entry) = self.by_key.find_entry(hash, |&other| other == idx) {
                entry.remove();
            }
            self.free.push(idx);
        }
    }

    pub(crate) fn fill(&mut self, mut buffer: impl BufMut, max_items: usize) -> usize {
        if self.by_key.is_empty() {
            // Only stale tickets left, if any
            self.release_if_empty();
            return 0;
        }

        let mut num_taken = 0;
        let mut misses = 0;
        // Sent: each goes down a queue once this fill is done (an item
        // goes at most once in a packet)
        let mut sent: Vec<(usize, Ticket)> = Vec::new();
        // Did not fit: back at the front of its queue, in order
        let mut skipped: Vec<Ticket> = Vec::new();

        'queues: for remaining in (1..self.queues.len()).rev() {
            skipped.clear();
            loop {
                if !(buffer.has_remaining_mut() && num_taken < max_items && misses < MAX_MISSES) {
                    for ticket in skipped.drain(..).rev() {
                        self.queues[remaining].push_front(ticket);
                    }
                    break 'queues;
                }
                let Some(ticket) = self.queues[remaining].pop_front() else {
                    break;
                };
                let Some(slot) = self
                    .slots
                    .get(ticket.slot as usize)
                    .and_then(Option::as_ref)
                    .filter(|slot| slot.generation == ticket.generation)
                else {
                    // Replaced since: drop it
                    self.num_stale = self.num_stale.saturating_sub(1);
                    continue;
                };

                if buffer.remaining_mut() >= slot.data.as_slice().len() {
                    num_taken += 1;
                    misses = 0;
                    buffer.put_slice(slot.data.as_slice());
                    if remaining == 1 {
                        self.remove(ticket.slot);
                    } else {
                        sent.push((remaining - 1, ticket));
                    }
                } else {
                    misses += 1;
                    skipped.push(ticket);
                }
            }
            for ticket in skipped.drain(..).rev() {
                self.queues[remaining].push_front(ticket);
            }
        }

        for (remaining, ticket) in sent {
            self.queues[remaining].push_back(ticket);
        }
        // Items pass down the queues, each swelling and draining in turn:
        // a queue holding a quarter of its room gives half of it back
        // (amortized O(1) per ticket), or every queue would keep the
        // room of the whole backlog.
        for queue in &mut self.queues {
            if queue.capacity() > 64 && queue.len() * 4 < queue.capacity() {
                queue.shrink_to(queue.len() * 2);
            }
        }
        self.release_if_empty();

        num_taken
    }

    // A backlog swells while a cluster forms (an update per member) and
    // then drains for good: once empty, its storage is given back rather
    // than kept at its largest for the life of the instance.
    fn release_if_empty(&mut self) {
        if self.by_key.is_empty() {
            for queue in &mut self.queues {
                queue.clear();
            }
            self.num_stale = 0;
            if self.slots.capacity() > 64 {
                self.slots = Vec::new();
                self.free = Vec::new();
                self.by_key = HashTable::new();
                for queue in &mut self.queues {
                    *queue = VecDeque::new();
                }
            }
        }
    }
}

fn slot_key<K>(slots: &[Option<Slot<K>>], idx: usize) -> Option<&K> {
    slots
        .get(idx)
        .and_then(Option::as_ref)
        .map(|slot| &slot.key)
}

#[derive(Debug, Clone)]
struct Entry<T> {
    remaining_tx: usize,
    // XXX could be Bytes, or keep a pool in parent
    data: Vec<u8>,
    // ignored for eq/ord. sorting is unstable
    item: T,
}

impl<T> PartialEq for Entry<T> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other).is_eq()
    }
}

impl<T> Eq for Entry<T> {}

impl<T> PartialOrd for Entry<T> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<T> Ord for Entry<T> {
    fn cmp(&self, other: &Self) -> Ordering {
        self.remaining_tx
            .cmp(&other.remaining_tx)
            .then_with(|| self.data.len().cmp(&other.data.len()))
    }
}

#[cfg(test)]
mod tests {

    use super::*;
    use alloc::vec;

    #[derive(Debug, PartialEq, Eq, Hash)]
    struct Key(&'static str);

    impl Invalidates for Key {
        fn invalidates(&self, other: &Self) -> bool {
            self.0 == other.0
        }
    }

    #[test]
    fn piggyback_behaviour() {
        let max_tx = 5;
        let mut piggyback = KeyedBroadcasts::new();

        assert!(piggyback.is_empty(), "Piggyback starts empty");

        piggyback.add_or_replace(Key("AA"), b"AAabc".to_vec(), max_tx);

        assert_eq!(1, piggyback.len());

        piggyback.add_or_replace(Key("AA"), b"AAcba".to_vec(), max_tx);

        assert_eq!(
            1,
            piggyback.len(),
            "add_or_replace with same key should replace"
        );

        let mut buf = Vec::new();

        for _i in 0..max_tx {
            buf.clear();
            let num_items = piggyback.fill(&mut buf, usize::MAX);
            assert_eq!(1, num_items);
            assert_eq!(
                b"AAcba",
                &buf[..],
                "Should transmit an item at most max_tx times"
            );
        }

        assert!(
            piggyback.is_empty(),
            "Should remove item after being used max_tx times"
        );
    }

    #[test]
    fn fill_does_nothing_if_buffer_full() {
        let mut piggyback = KeyedBroadcasts::new();
        piggyback.add_or_replace(Key("a "), b"a super long value".to_vec(), 1);

        let buf = bytes::BytesMut::new();
        let mut limited = buf.limit(5);

        let num_items = piggyback.fill(&mut limited, usize::MAX);

        assert_eq!(0, num_items);
        assert_eq!(5, limited.remaining_mut());
        assert_eq!(1, piggyback.len());
    }

    #[test]
    fn piggyback_consumes_oldest_first_among_equal_counts() {
        let max_tx = 10;
        let mut piggyback = KeyedBroadcasts::new();

        piggyback.add_or_replace(Key("00"), b"00hi".to_vec(), max_tx);
        piggyback.add_or_replace(Key("01"), b"01hello".to_vec(), max_tx);
        piggyback.add_or_replace(Key("02"), b"02hey".to_vec(), max_tx);

        let mut buf = Vec::new();
        let num_items = piggyback.fill(&mut buf, usize::MAX);

        assert_eq!(3, num_items);
        assert_eq!(b"00hi01hello02hey", &buf[..]);

        // Sent once each, in the order they were sent
        piggyback.add_or_replace(Key("03"), b"03yo".to_vec(), max_tx);
        buf.clear();
        piggyback.fill(&mut buf, usize::MAX);
        assert_eq!(b"03yo00hi01hello02hey", &buf[..]);
    }

    #[test]
    fn highest_max_tx_is_consumed_first() {
        let mut piggyback = KeyedBroadcasts::new();

        // 3 items, same byte size, distinct max_tx
        piggyback.add_or_replace(Key("10"), b"100".to_vec(), 1);
        piggyback.add_or_replace(Key("20"), b"200".to_vec(), 2);
        piggyback.add_or_replace(Key("30"), b"300".to_vec(), 3);

        let mut buf = Vec::new();
        piggyback.fill(&mut buf, usize::MAX);
        assert_eq!(b"300200100", &buf[..]);

        buf.clear();
        piggyback.fill(&mut buf, usize::MAX);
        assert_eq!(b"300200", &buf[..]);

        buf.clear();
        piggyback.fill(&mut buf, usize::MAX);
        assert_eq!(b"300", &buf[..]);

        assert_eq!(0, piggyback.len());
    }

    #[test]
    fn piggyback_respects_limit() {
        let max_tx = 10;
        let mut piggyback = KeyedBroadcasts::new();

        piggyback.add_or_replace(Key("fo"), b"foo".to_vec(), max_tx);
        piggyback.add_or_replace(Key("ba"), b"bar".to_vec(), max_tx);
        piggyback.add_or_replace(Key("ba"), b"baz".to_vec(), max_tx);

        let mut buf = Vec::new();
        let num_items = piggyback.fill(&mut buf, 0);

        assert_eq!(0, num_items);
        assert!(buf.is_empty());

        let num_items = piggyback.fill(&mut buf, 2);
        assert_eq!(2, num_items);
    }

    #[test]
    fn fill_with_len_prefix() {
        let mut bcs = Broadcasts::new();

        bcs.add_or_replace(Key("fo"), b"foo".to_vec(), 10);
        bcs.add_or_replace(Key("ba"), b"barr".to_vec(), 10);
        bcs.add_or_replace(Key("ba"), b"bazz".to_vec(), 10);

        let mut buf = Vec::new();
        let num_items = bcs.fill_with_len_prefix(&mut buf, 0);

        assert_eq!(0, num_items);
        assert!(buf.is_empty());

        let num_items = bcs.fill_with_len_prefix(&mut buf, 2);
        assert_eq!(2, num_items);

        use bytes::Buf;
        let mut buf = &buf[..];
        assert_eq!(4, buf.get_u16());
        assert_eq!(&b"bazz"[..], &buf[..4]);
        buf.advance(4);
        assert_eq!(3, buf.get_u16());
        assert_eq!(&b"foo"[..], &buf[..3]);
        buf.advance(3);
        assert!(buf.is_empty());
    }

    #[test]
    fn keyed_items_of_any_size_go_out_whole() {
        let mut bcs = KeyedBroadcasts::new();
        let small = vec![7; INLINE];
        let large = (0..200).map(|i| i as u8).collect::<Vec<_>>();
        bcs.add_or_replace(Key("small"), small.clone(), 1);
        bcs.add_or_replace(Key("large"), large.clone(), 1);
        let mut buf = Vec::new();
        assert_eq!(2, bcs.fill(&mut buf, usize::MAX));
        assert_eq!([small, large].concat(), buf);
    }

    #[test]
    fn keyed_len_counts_live_items_only() {
        let mut bcs = KeyedBroadcasts::new();
        for i in 0..100_u8 {
            bcs.add_or_replace(Key("a"), vec![i; 3], 2);
            bcs.add_or_replace(Key("b"), vec![i; 4], 2);
            assert_eq!(2, bcs.len());
        }
        // Stale tickets got purged along the way
        let tickets: usize = bcs.queues.iter().map(VecDeque::len).sum();
        assert!(tickets <= 2 + 2 * 32, "{tickets} tickets");

        let mut buf = Vec::new();
        assert_eq!(2, bcs.fill(&mut buf, usize::MAX));
        assert_eq!(
            [&[99; 3][..], &[99; 4][..]].concat(),
            buf,
            "only the latest"
        );
        assert_eq!(2, bcs.len());

        buf.clear();
        assert_eq!(2, bcs.fill(&mut buf, usize::MAX));
        assert!(bcs.is_empty());
        assert_eq!(0, bcs.fill(&mut buf, usize::MAX));
        assert!(bcs.queues.iter().all(VecDeque::is_empty));
    }

    #[test]
    fn fill_gives_up_after_max_misses() {
        const BIG: [&str; 8] = ["b0", "b1", "b2", "b3", "b4", "b5", "b6", "b7"];
        assert_eq!(BIG.len(), MAX_MISSES);
        // `num_big` items that don't fit come before one that would
        let setup = |num_big: usize| {
            let mut keyed = KeyedBroadcasts::new();
            let mut generic = Broadcasts::new();
            for key in &BIG[..num_big] {
                keyed.add_or_replace(Key(key), vec![0; 100], 1);
                generic.add_or_replace(Key(key), vec![0; 100], 1);
            }
            keyed.add_or_replace(Key("small"), vec![1; 10], 1);
            generic.add_or_replace(Key("small"), vec![1; 10], 1);
            (keyed, generic)
        };

        let (mut keyed, mut generic) = setup(MAX_MISSES);
        let mut buf = Vec::new();
        assert_eq!(0, keyed.fill((&mut buf).limit(50), usize::MAX));
        assert_eq!(
            0,
            generic.fill_with_len_prefix((&mut buf).limit(50), usize::MAX)
        );
        assert!(buf.is_empty());
        assert_eq!(MAX_MISSES + 1, keyed.len());
        assert_eq!(MAX_MISSES + 1, generic.len());

        // One less miss and the small one goes
        let (mut keyed, mut generic) = setup(MAX_MISSES - 1);
        assert_eq!(1, keyed.fill((&mut buf).limit(50), usize::MAX));
        assert_eq!(vec![1; 10], buf);
        buf.clear();
        assert_eq!(
            1,
            generic.fill_with_len_prefix((&mut buf).limit(50), usize::MAX)
        );
        assert_eq!([&[0, 10][..], &[1; 10][..]].concat(), buf);
        assert_eq!(MAX_MISSES - 1, keyed.len());
        assert_eq!(MAX_MISSES - 1, generic.len());
    }

    /// What `KeyedBroadcasts` should do, by brute force.
    #[derive(Default)]
    struct Model {
        // (key, data, remaining_tx, when it got its remaining_tx)
        items: Vec<(u8, Vec<u8>, usize, u64)>,
        clock: u64,
    }

    impl Model {
        fn add_or_replace(&mut self, key: u8, data: Vec<u8>, max_tx: usize) {
            self.items.retain(|item| item.0 != key);
            self.items.push((key, data, max_tx, self.clock));
            self.clock += 1;
        }

        fn fill(&mut self, mut buffer: impl BufMut, max_items: usize) -> usize {
            // Most remaining_tx, then first to get there
            self.items.sort_by(|a, b| (b.2, a.3).cmp(&(a.2, b.3)));
            let (mut taken, mut misses) = (0, 0);
            for item in &mut self.items {
                if !(buffer.has_remaining_mut() && taken < max_items && misses < MAX_MISSES) {
                    break;
                }
                if buffer.remaining_mut() >= item.1.len() {
                    buffer.put_slice(&item.1);
                    item.2 -= 1;
                    item.3 = self.clock;
                    self.clock += 1;
                    taken += 1;
                    misses = 0;
                } else {
                    misses += 1;
                }
            }
            self.items.retain(|item| item.2 > 0);
            taken
        }
    }

    #[test]
    fn keyed_broadcasts_agree_with_model() {
        use rand::{RngExt, SeedableRng, rngs::SmallRng};

        const KEYS: [&str; 12] = [
            "k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7", "k8", "k9", "k10", "k11",
        ];
        for seed in 0..64 {
            let mut rng = SmallRng::seed_from_u64(seed);
            let mut bcs = KeyedBroadcasts::new();
            let mut model = Model::default();
            let (mut got, mut want) = (Vec::new(), Vec::new());

            for step in 0..2_000 {
                if rng.random_bool(0.6) {
                    let key = rng.random_range(0..KEYS.len());
                    let data = vec![rng.random(); rng.random_range(1..20)];
                    let max_tx = rng.random_range(1..4);
                    bcs.add_or_replace(Key(KEYS[key]), data.clone(), max_tx);
                    model.add_or_replace(key as u8, data, max_tx);
                } else {
                    let room = rng.random_range(0..80);
                    let max_items = rng.random_range(0..6);
                    got.clear();
                    want.clear();
                    let n = bcs.fill((&mut got).limit(room), max_items);
                    assert_eq!(model.fill((&mut want).limit(room), max_items), n);
                    assert_eq!(want, got, "seed {seed} step {step}");
                }
                assert_eq!(model.items.len(), bcs.len(), "seed {seed} step {step}");
                let queued: usize = bcs.queues.iter().map(VecDeque::len).sum();
                assert_eq!(bcs.by_key.len(), queued - bcs.num_stale);
            }
        }
    }
}
