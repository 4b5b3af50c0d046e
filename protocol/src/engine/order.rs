//! The order a stage's tasks are handed out in: fronts that each walk the stage's indices one way, and the fronts the sides of a partition take to keep apart.

use serde::{Deserialize, Serialize};

/// A walk over a stage's indices, taken as a ring, from `start` one way;
/// it hands out its turn of tasks in proportion to `weight` among the
/// stage's fronts. Mapping a position to an index is a few operations,
/// so a stage of a million tasks needs no list of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Front {
    /// An index of the stage (taken modulo its length).
    pub start: u32,
    /// Which way it walks.
    pub way: Way,
    /// Its share of the stage's turns, against the other fronts' (0 counts as 1).
    pub weight: u32,
}

/// Which way a [`Front`] walks a stage's indices.
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
    /// The walks the stage is handed out along, taking turns; none: the first index up.
    pub fronts: Vec<Front>,
}

impl Order {
    /// The fronts it hands out along: [`Front::ASCENDING`] alone when it has none.
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

    /// The order of a side of a partition that keeps `owned` of the
    /// places of a stage of `len` tasks.
    ///
    /// A farm's copies are kept by its coordinator (the writer) and `k`
    /// other nodes, each of which may end up on a side of its own. The
    /// writer had handed the stage out along `base` (its first front), and
    /// had `done` of it done, as far as the copy taken over knows. Place 0
    /// is the writer's front, where its work stops; places 1 to `k`, one
    /// for each of the other copies in id order, are spread evenly over
    /// what is left after it, place `k` at the far end. A side keeps the
    /// place of each copy it has (the writer's side also place 0), so the
    /// sides' places never meet, and it works each run of its places from
    /// where it is farthest from the places of others: towards its
    /// neighbours, a run at the far end from the far end back, the
    /// writer's run from its front on, a run between others from its
    /// middle both ways. Every stretch between two sides is then worked
    /// from its two ends, and they meet (run a task twice) only once it is
    /// done. A side gives each of its fronts turns in proportion to the
    /// room it has up to the next place of another side.
    ///
    /// With one copy besides the writer's (two replicas) that is the two
    /// sides working from the two ends of the stage; with more, a side
    /// that has all the other copies (a coordinator cut off alone) still
    /// works from the far end.
    pub fn apart(base: Front, done: u32, len: u32, k: u32, owned: &[u32]) -> Order {
        let k = k.max(1);
        if len == 0 || done >= len || owned.is_empty() {
            return Order { fronts: vec![base] };
        }
        let rest = u64::from(len - done);
        // The position of place `j` along `base`.
        let q = |j: u32| u64::from(done) + u64::from(j) * rest / u64::from(k);
        let along = |pos: u64, room: u64| Front {
            start: base_at(base, pos, len),
            way: base.way,
            weight: room.clamp(1, u64::from(u32::MAX)) as u32,
        };
        let against = |pos: u64, room: u64| Front {
            start: base_at(base, pos, len),
            way: match base.way {
                Way::Up => Way::Down,
                Way::Down => Way::Up,
            },
            weight: room.clamp(1, u64::from(u32::MAX)) as u32,
        };
        let mut owned: Vec<u32> = owned.iter().copied().filter(|&j| j <= k).collect();
        owned.sort_unstable();
        owned.dedup();
        let mut fronts = Vec::new();
        let mut i = 0;
        while i < owned.len() {
            let (a, mut b) = (owned[i], owned[i]);
            while owned.get(i + 1) == Some(&(b + 1)) {
                i += 1;
                b += 1;
            }
            i += 1;
            match (a, b) {
                (0, b) if b == k => return Order { fronts: vec![base] },
                (0, b) => fronts.push(along(q(0), q(b + 1) - q(0))),
                (a, b) if b == k => fronts.push(against(q(k), q(k) - q(a - 1))),
                (a, b) => {
                    let m = (q(a) + q(b)) / 2;
                    fronts.push(along(m, q(b + 1) - m));
                    fronts.push(against(m, m - q(a - 1)));
                }
            }
        }
        Order { fronts }
    }
}

/// Where the walk `base` is at `pos` (up to `len`, the far end, which is
/// its start again).
fn base_at(base: Front, pos: u64, len: u32) -> u32 {
    let len64 = u64::from(len);
    let start = u64::from(base.start) % len64;
    let i = match base.way {
        Way::Up => start + pos,
        Way::Down => start + 2 * len64 - pos,
    };
    (i % len64) as u32
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

    /// Each side of `sides` (the places it keeps, and its speed in tasks
    /// per round) hands out tasks in its order, knowing only its own: how
    /// many distinct tasks are done, `done` included, before one is done
    /// twice. The writer (the side with place 0) had done `done` along
    /// `base`.
    fn until_met(base: Front, done: u32, len: u32, k: u32, sides: &[(&[u32], u32)]) -> u32 {
        let mut seen = vec![false; len as usize];
        for pos in 0..done {
            seen[base.at(pos, len) as usize] = true;
        }
        // Per side, its fronts: each with how far it went and how many it handed out.
        let mut walks: Vec<Vec<(Front, u32, u64)>> = sides
            .iter()
            .map(|(owned, _)| {
                let o = Order::apart(base, done, len, k, owned);
                o.fronts().iter().map(|&f| (f, 0, 0)).collect()
            })
            .collect();
        // Each side's own view: what it handed out itself.
        let mut mine = vec![vec![false; len as usize]; sides.len()];
        for m in &mut mine {
            for pos in 0..done {
                m[base.at(pos, len) as usize] = true;
            }
        }
        let mut n = done;
        for _round in 0..len {
            for (s, fronts) in walks.iter_mut().enumerate() {
                for _ in 0..sides[s].1 {
                    // The front least served for its weight, as the engine picks.
                    let Some(f) = fronts
                        .iter_mut()
                        .filter(|f| f.1 < len)
                        .min_by_key(|f| (f.2 * 1_000_000) / u64::from(f.0.weight))
                    else {
                        break;
                    };
                    while f.1 < len && mine[s][f.0.at(f.1, len) as usize] {
                        f.1 += 1;
                    }
                    if f.1 == len {
                        continue;
                    }
                    let i = f.0.at(f.1, len) as usize;
                    f.1 += 1;
                    f.2 += 1;
                    mine[s][i] = true;
                    if std::mem::replace(&mut seen[i], true) {
                        return n;
                    }
                    n += 1;
                }
            }
        }
        n
    }

    #[test]
    fn one_copy_besides_the_writers_works_from_the_other_end() {
        let list = |o: &Order| (0..5).map(|p| o.fronts()[0].at(p, 5)).collect::<Vec<_>>();
        let w = Front::ASCENDING;
        assert_eq!(list(&Order::apart(w, 2, 5, 1, &[1])), [4, 3, 2, 1, 0]);
        // The writer goes on from where its work stopped.
        assert_eq!(list(&Order::apart(w, 2, 5, 1, &[0])), [2, 3, 4, 0, 1]);
        let down = Order::apart(w, 2, 5, 1, &[1]).fronts[0];
        assert_eq!(list(&Order::apart(down, 2, 5, 1, &[1])), [0, 1, 2, 3, 4]);
        // A stage all done keeps its order.
        assert_eq!(Order::apart(w, 5, 5, 1, &[1]).fronts, [w]);
    }

    /// Sides apart meet only once they have done (nearly) all of a stage
    /// between them, from whatever front the writer had and however far it
    /// got: two sides whatever their speeds, and with three copies besides
    /// the writer's, every way they may be split in sides of one or two
    /// nodes each (a copy on each, the writer's side twice as fast as a
    /// side of one).
    #[test]
    fn sides_apart_meet_only_near_the_end() {
        let len = 3000;
        for w in bases(len) {
            for done in [0, 400, 2900] {
                let rest = len - done;
                for speeds in [[1, 1], [4, 1], [1, 3]] {
                    let met = until_met(w, done, len, 1, &[(&[0], speeds[0]), (&[1], speeds[1])]);
                    assert!(met >= len - 2, "{w:?} {done} {speeds:?}: met after {met}");
                }
                let splits: [&[(&[u32], u32)]; 6] = [
                    &[(&[0, 1], 2), (&[2], 1), (&[3], 1)],
                    &[(&[0, 3], 2), (&[1], 1), (&[2], 1)],
                    &[(&[0], 1), (&[1, 2, 3], 3)],
                    &[(&[0, 2], 2), (&[1, 3], 2)],
                    &[(&[0, 1, 3], 3), (&[2], 1)],
                    &[(&[0], 1), (&[1], 1), (&[2], 1), (&[3], 1)],
                ];
                for sides in splits {
                    let met = until_met(w, done, len, 3, sides) - done;
                    assert!(
                        met >= rest * 3 / 4,
                        "{w:?} {done} {sides:?}: met after {met} of {rest}"
                    );
                }
            }
        }
    }
}
