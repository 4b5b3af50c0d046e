//! The simulator's event queue: events in (time, key, order of scheduling), in constant time per event.
//!
//! Nearly every event of a run lands within a few seconds of virtual time
//! (message latencies, task ends, heartbeats), and the clock only moves
//! forward, so a timing wheel of one bucket per millisecond serves them
//! with a push and a pop from a deque; the rare event further out waits in
//! a heap and moves into the wheel as the clock comes within reach. The
//! order is exactly that of a heap keyed by (time, key, sequence number):
//! the simulator's runs replay the same with either.
//!
//! The key orders the events of one millisecond by what they are (the
//! simulator's: the node an event is for, then its kind, then its
//! sender), not by when they were scheduled, so that a run that leaves
//! out a wake which does nothing (a skipped quiet stretch) takes every
//! other event of that millisecond in the same order as a run that steps
//! it. Events of equal keys keep the order they were scheduled in.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

/// Virtual milliseconds the wheel covers ahead of the clock.
const SPAN: u64 = 4096;

pub(crate) struct Calendar<T> {
    /// Bucket `t % SPAN` holds the events at time `t`, for `now <= t < now + SPAN`,
    /// with their keys; the bucket at `now` in key order once `sorted` says so.
    wheel: Vec<VecDeque<(u64, T)>>,
    /// The clock's bucket is in key order: sorted when the clock reached
    /// it, and what is scheduled into it meanwhile goes in its place.
    sorted: bool,
    in_wheel: usize,
    /// A bit per bucket, set while it may hold events: a farm of long
    /// tasks on a few nodes has an event every few milliseconds, and the
    /// clock moves to the next bucket set rather than one at a time.
    occupied: Vec<u64>,
    /// The time being drained; no event is earlier.
    now: u64,
    /// Events at `now + SPAN` or later, by (time, key, sequence number).
    far: BinaryHeap<Reverse<Far<T>>>,
    seq: u64,
    /// Buffers of drained buckets, for the next bucket to fill. Only the
    /// few buckets just ahead of the clock hold events at once; were each
    /// to keep its buffer, every one would grow to the busiest
    /// millisecond's size (170 MB at 1,000 nodes, all of it fresh pages).
    spare: Vec<VecDeque<(u64, T)>>,
}

/// A far event: its time, key and sequence number, and the event.
type Far<T> = (u64, u64, u64, Slot<T>);

/// Carries a value through the heap without ordering by it.
struct Slot<T>(T);

impl<T> PartialEq for Slot<T> {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl<T> Eq for Slot<T> {}
impl<T> PartialOrd for Slot<T> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl<T> Ord for Slot<T> {
    fn cmp(&self, _: &Self) -> std::cmp::Ordering {
        std::cmp::Ordering::Equal
    }
}

impl<T> Calendar<T> {
    pub(crate) fn new() -> Calendar<T> {
        Calendar {
            wheel: (0..SPAN).map(|_| VecDeque::new()).collect(),
            sorted: false,
            in_wheel: 0,
            occupied: vec![0; SPAN as usize / 64],
            now: 0,
            far: BinaryHeap::new(),
            seq: 0,
            spare: Vec::new(),
        }
    }

    /// Schedules `v` at `at` with `key`; a time before the clock counts as now.
    pub(crate) fn push(&mut self, at: u64, key: u64, v: T) {
        let at = at.max(self.now);
        if at == self.now && self.sorted {
            // Into the bucket being drained, after every event of a key
            // up to its own.
            let bucket = &mut self.wheel[(at % SPAN) as usize];
            let i = bucket.partition_point(|(k, _)| *k <= key);
            bucket.insert(i, (key, v));
            self.occupied[(at % SPAN) as usize / 64] |= 1 << (at % SPAN % 64);
            self.in_wheel += 1;
        } else if at < self.now + SPAN {
            self.bucket_push(at, key, v);
        } else {
            self.seq += 1;
            self.far.push(Reverse((at, key, self.seq, Slot(v))));
        }
    }

    /// The earliest event and its time; among events at one time, the
    /// lowest key, and among equal keys the first scheduled.
    pub(crate) fn pop(&mut self) -> Option<(u64, T)> {
        loop {
            if self.in_wheel == 0 {
                let Reverse((at, ..)) = self.far.peek()?;
                self.now = *at;
                self.sorted = false;
                self.pull_far();
            }
            let slot = (self.now % SPAN) as usize;
            let bucket = &mut self.wheel[slot];
            if !self.sorted {
                // Stable: equal keys stay in the order they came.
                if bucket.len() > 1 {
                    bucket.make_contiguous().sort_by_key(|(k, _)| *k);
                }
                self.sorted = true;
            }
            if let Some((_, v)) = bucket.pop_front() {
                self.in_wheel -= 1;
                return Some((self.now, v));
            }
            if bucket.capacity() > 0 {
                self.spare.push(std::mem::take(bucket));
            }
            self.occupied[slot / 64] &= !(1 << (slot % 64));
            if self.in_wheel == 0 {
                continue;
            }
            // Far events pulled after the jump land at or past
            // `now + SPAN`, beyond every bucket skipped.
            self.now += self.to_next_occupied(slot);
            self.sorted = false;
            self.pull_far();
        }
    }

    /// How far past bucket `slot` (itself empty) the next one holding
    /// events is, going round the wheel: some bucket does.
    fn to_next_occupied(&self, slot: usize) -> u64 {
        let span = SPAN as usize;
        let words = self.occupied.len();
        let start = (slot + 1) % span;
        let mut w = start / 64;
        let mut bits = self.occupied[w] & (!0u64 << (start % 64));
        // One more word than the wheel has: the first one's low bits last.
        for _ in 0..=words {
            if bits != 0 {
                let at = w * 64 + bits.trailing_zeros() as usize;
                return ((at + span - slot) % span) as u64;
            }
            w = (w + 1) % words;
            bits = self.occupied[w];
        }
        unreachable!("events in the wheel, and no bucket holds them")
    }

    /// Moves the far events that came within the wheel's reach into it,
    /// before anything can be scheduled directly at their times.
    fn pull_far(&mut self) {
        while self
            .far
            .peek()
            .is_some_and(|Reverse((at, ..))| *at < self.now + SPAN)
        {
            let Reverse((at, key, _, Slot(v))) = self.far.pop().expect("peeked");
            self.bucket_push(at, key, v);
        }
    }

    fn bucket_push(&mut self, at: u64, key: u64, v: T) {
        let slot = (at % SPAN) as usize;
        self.occupied[slot / 64] |= 1 << (slot % 64);
        let bucket = &mut self.wheel[slot];
        if bucket.capacity() == 0 {
            if let Some(b) = self.spare.pop() {
                *bucket = b;
            }
        }
        bucket.push_back((key, v));
        self.in_wheel += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::{RngExt, SeedableRng};

    /// A calendar and the heap it must agree with, fed the same events.
    struct Twins {
        cal: Calendar<u64>,
        heap: BinaryHeap<Reverse<(u64, u64, u64)>>,
        seq: u64,
    }

    impl Twins {
        fn new() -> Twins {
            Twins {
                cal: Calendar::new(),
                heap: BinaryHeap::new(),
                seq: 0,
            }
        }

        /// An event of a key among a few, so that many share one.
        fn push(&mut self, at: u64, key: u64) {
            self.seq += 1;
            self.cal.push(at, key, self.seq);
            self.heap.push(Reverse((at, key, self.seq)));
        }

        /// The next event's time, the calendar's pop checked against the
        /// heap's; None once both are empty.
        fn pop(&mut self, seed: u64) -> Option<u64> {
            let Some(Reverse((at, _, id))) = self.heap.pop() else {
                assert_eq!(self.cal.pop(), None, "seed {seed}");
                return None;
            };
            assert_eq!(self.cal.pop(), Some((at, id)), "seed {seed}");
            Some(at)
        }
    }

    #[test]
    fn pops_in_the_order_of_a_heap_keyed_by_time_key_and_sequence() {
        for seed in 0..20 {
            let mut rng = SmallRng::seed_from_u64(seed);
            let mut twins = Twins::new();
            let mut now = 0u64;
            for _ in 0..50 {
                twins.push(rng.random_range(0..20_000), rng.random_range(0..4));
            }
            for _ in 0..5000 {
                let Some(at) = twins.pop(seed) else {
                    break;
                };
                now = now.max(at);
                // As in a run: a few new events, mostly soon, some far, some now.
                for _ in 0..rng.random_range(0..3) {
                    let d = match rng.random_range(0..10) {
                        0 => 0,
                        1 => rng.random_range(SPAN - 2..SPAN + 2),
                        2 => rng.random_range(0..3 * SPAN),
                        _ => rng.random_range(0..1000),
                    };
                    twins.push(now + d, rng.random_range(0..4));
                }
            }
        }
    }

    #[test]
    fn sparse_events_pop_in_order_across_turns_of_the_wheel() {
        // One event every few hundred milliseconds, as a farm of long
        // tasks on few nodes has: the clock jumps between buckets, past
        // the wheel's end and round, and far events come in on the way.
        for seed in 0..20 {
            let mut rng = SmallRng::seed_from_u64(seed);
            let mut twins = Twins::new();
            let mut now = 0u64;
            for _ in 0..3000 {
                for _ in 0..rng.random_range(0..3) {
                    let d = match rng.random_range(0..4) {
                        0 => rng.random_range(0..2),
                        1 => rng.random_range(SPAN - 70..SPAN + 70),
                        _ => rng.random_range(1..SPAN / 3),
                    };
                    twins.push(now + d, rng.random_range(0..4));
                }
                if let Some(at) = twins.pop(seed) {
                    now = at;
                }
            }
        }
    }

    #[test]
    fn an_empty_calendar_pops_nothing() {
        let mut cal: Calendar<()> = Calendar::new();
        assert_eq!(cal.pop(), None);
        cal.push(10 * SPAN, 0, ());
        assert_eq!(cal.pop(), Some((10 * SPAN, ())));
        assert_eq!(cal.pop(), None);
    }
}
