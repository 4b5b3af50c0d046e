//! The order a stage's tasks are handed out in: fronts that each walk the stage's indices one way.

use serde::{Deserialize, Serialize};

/// A walk over a stage's indices, taken as a ring, from `start` one way;
/// it hands out its turn of tasks in proportion to `weight` among the
/// stage's fronts. Mapping a position to an index is a few operations,
/// so a stage of a million tasks needs no list of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Front {
    /// An index of the stage (taken modulo its length).
    pub start: u32,
    pub way: Way,
    pub weight: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Way {
    /// From the start up: the first index up when the start is 0.
    Up,
    /// From just below the start down: the last index down when it is 0.
    Down,
}

impl Front {
    /// The first index up: every farm's order until a partition.
    pub const ASCENDING: Front = Front {
        start: 0,
        way: Way::Up,
        weight: 1,
    };

    /// The index at position `pos` (below `len`) of a stage of `len` tasks.
    pub fn at(self, pos: u32, len: u32) -> u32 {
        debug_assert!(pos < len);
        let (len, pos) = (u64::from(len), u64::from(pos));
        let start = u64::from(self.start) % len;
        let i = match self.way {
            Way::Up => start + pos,
            Way::Down => start + len - 1 - pos,
        };
        (i % len) as u32
    }

    /// The position of `index` on this walk: the inverse of [`Front::at`].
    pub fn rank(self, index: u32, len: u32) -> u32 {
        debug_assert!(index < len);
        let len = u64::from(len);
        let up = (u64::from(index) + len - u64::from(self.start) % len) % len;
        match self.way {
            Way::Up => up as u32,
            Way::Down => (len - 1 - up) as u32,
        }
    }
}

/// The order of one stage: its fronts (none: the first index up).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Order {
    pub fronts: Vec<Front>,
}

impl Order {
    pub fn fronts(&self) -> &[Front] {
        if self.fronts.is_empty() {
            std::slice::from_ref(&Front::ASCENDING)
        } else {
            &self.fronts
        }
    }

    /// Where `index` comes in this order, about: its position on the front
    /// that reaches it first, counted in that front's share of the turns.
    /// For tasks that become ready together.
    pub fn rank(&self, index: u32, len: u32) -> u64 {
        let fronts = self.fronts();
        let total: u64 = fronts.iter().map(|f| u64::from(f.weight.max(1))).sum();
        fronts
            .iter()
            .map(|f| u64::from(f.rank(index, len)) * total / u64::from(f.weight.max(1)))
            .min()
            .unwrap_or(u64::from(index))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bases(len: u32) -> Vec<Front> {
        let starts = [0, 1, len / 2, len / 3, len - 1];
        let ways = [Way::Up, Way::Down];
        starts
            .iter()
            .flat_map(|&start| {
                ways.iter().map(move |&way| Front {
                    start,
                    way,
                    weight: 1,
                })
            })
            .collect()
    }

    #[test]
    fn every_front_walks_each_index_once_and_rank_inverts_it() {
        for len in 1..40 {
            for f in bases(len) {
                let mut seen = vec![false; len as usize];
                for pos in 0..len {
                    let i = f.at(pos, len);
                    assert!(!seen[i as usize], "{f:?} len {len}: {i} twice");
                    seen[i as usize] = true;
                    assert_eq!(f.rank(i, len), pos, "{f:?} len {len}");
                }
            }
        }
    }
}
