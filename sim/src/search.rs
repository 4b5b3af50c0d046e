//! The fewest node counts that meet a deadline, searched from a guess and several counts at a time.
//!
//! Each count is a simulation that may take minutes, so the search asks
//! as few as it can: it starts at a guess (where greedy list scheduling
//! meets the deadline, which the mesh comes within a few percent of),
//! confirms the count below it, and walks away from the guess only as
//! far as the answers push it. Counts asked together (one per core) cost
//! the time of one. A count whose simulation could not finish in the time
//! given stops the search where it stands, with what it knows.

use std::collections::BTreeMap;

/// What one count's simulation said.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Its farm ended by the deadline.
    Meets,
    /// Its farm ended later (or was still running at the deadline).
    Misses,
    /// Its simulation ran out of time: not known.
    Unknown,
}

/// Where a search ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    /// The fewest count that met the deadline of those tried; when
    /// `unknown` is not empty, the fewest known so far.
    pub nodes: Option<usize>,
    /// The most nodes below `nodes` known to miss it (`from - 1` when
    /// none tried did: fewer could not hold the work).
    pub misses: usize,
    /// Counts whose simulation did not finish in the time given: the
    /// search stopped with them.
    pub unknown: Vec<usize>,
}

/// The fewest counts from `from` to `most` that meet, starting at
/// `guess`, asking `ask` for up to `width` counts at a time (it answers a
/// verdict for each, in order). `from - 1` is taken to miss unasked.
/// Makespans shrink with nodes roughly but not strictly, so the answer
/// is the fewest that met among those tried, with the count below it
/// tried and missed (or under `from`).
pub fn fewest_near<E>(
    from: usize,
    most: usize,
    guess: usize,
    width: usize,
    mut ask: impl FnMut(&[usize]) -> Result<Vec<Verdict>, E>,
) -> Result<Found, E> {
    let from = from.max(1);
    let most = most.max(from);
    let width = width.max(1);
    let guess = guess.clamp(from, most);
    let mut tried: BTreeMap<usize, bool> = BTreeMap::new();
    // How far above the highest miss the next counts go while none met,
    // and below the fewest that met while nothing under it was asked:
    // doubled with each count asked, so a bad guess costs a logarithm.
    let mut up = (guess / 32).max(1);
    let mut down = 1usize;
    loop {
        let hi = tried.iter().find(|(_, &met)| met).map(|(&n, _)| n);
        // The most that missed below the fewest that met; whether it was asked.
        let below = |h: usize| tried.range(..h).rev().find(|(_, &met)| !met);
        let (lo, asked) = match hi.map_or_else(|| tried.iter().next_back(), below) {
            Some((&n, _)) => (n, true),
            None => (from - 1, false),
        };
        let mut counts: Vec<usize> = match hi {
            _ if tried.is_empty() => {
                // The guess, then alternately below and above it.
                (0..width)
                    .map(|i| {
                        let d = i.div_ceil(2);
                        if i % 2 == 1 {
                            guess.saturating_sub(d)
                        } else {
                            guess + d
                        }
                    })
                    .filter(|&n| n >= from && n <= most)
                    .collect()
            }
            Some(h) if h == lo + 1 => break,
            // Nothing below the fewest that met was asked: down from it by
            // doubling steps, since the guess is usually close.
            Some(h) if !asked => {
                let counts = (0..width)
                    .map(|i| h.saturating_sub(down.saturating_mul(1 << i.min(60))))
                    .filter(|&n| n > lo)
                    .collect();
                down = down.saturating_mul(1 << width.min(60));
                counts
            }
            // Between a miss and a meet: split evenly.
            Some(h) => (1..=width)
                .map(|i| lo + (h - lo) * i / (width + 1))
                .filter(|&n| n > lo && n < h)
                .collect(),
            None if lo >= most => break,
            None => {
                let counts = (0..width)
                    .map(|i| (lo + up.saturating_mul(1 << i.min(60))).min(most))
                    .collect();
                up = up.saturating_mul(1 << width.min(60));
                counts
            }
        };
        counts.sort_unstable();
        counts.dedup();
        counts.retain(|n| !tried.contains_key(n));
        if counts.is_empty() {
            // Split points that all fell on counts already asked: the one
            // just above the miss settles it.
            match hi {
                Some(_) => counts.push(lo + 1),
                None => break,
            }
        }
        let verdicts = ask(&counts)?;
        let mut unknown = Vec::new();
        for (&n, v) in counts.iter().zip(verdicts) {
            match v {
                Verdict::Meets => {
                    tried.insert(n, true);
                }
                Verdict::Misses => {
                    tried.insert(n, false);
                }
                Verdict::Unknown => unknown.push(n),
            }
        }
        if !unknown.is_empty() {
            let nodes = tried.iter().find(|(_, &met)| met).map(|(&n, _)| n);
            let misses = match nodes {
                Some(h) => tried.range(..h).rev().find(|(_, &met)| !met),
                None => tried.iter().next_back(),
            }
            .map_or(from - 1, |(&n, _)| n);
            return Ok(Found {
                nodes,
                misses,
                unknown,
            });
        }
    }
    let nodes = tried.iter().find(|(_, &met)| met).map(|(&n, _)| n);
    let misses = match nodes {
        Some(h) => tried.range(..h).rev().find(|(_, &met)| !met),
        None => tried.iter().next_back(),
    }
    .map_or(from - 1, |(&n, _)| n);
    Ok(Found {
        nodes,
        misses,
        unknown: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A search over counts where `n` meets from `need` up, with the
    /// counts asked in each round.
    fn search(
        from: usize,
        most: usize,
        guess: usize,
        width: usize,
        need: usize,
    ) -> (Found, Vec<Vec<usize>>) {
        let mut rounds = Vec::new();
        let found = fewest_near::<()>(from, most, guess, width, |counts| {
            assert!(counts.len() <= width, "{counts:?} asked at once");
            rounds.push(counts.to_vec());
            Ok(counts
                .iter()
                .map(|&n| {
                    if n >= need {
                        Verdict::Meets
                    } else {
                        Verdict::Misses
                    }
                })
                .collect())
        })
        .unwrap();
        (found, rounds)
    }

    #[test]
    fn a_right_guess_costs_two_counts_and_one_round_on_two_cores() {
        let (f, rounds) = search(51, 100_000, 55, 1, 55);
        assert_eq!(f.nodes, Some(55));
        assert_eq!(f.misses, 54);
        assert_eq!(rounds, vec![vec![55], vec![54]]);
        let (f, rounds) = search(51, 100_000, 55, 2, 55);
        assert_eq!((f.nodes, f.misses), (Some(55), 54));
        assert_eq!(rounds, vec![vec![54, 55]]);
    }

    #[test]
    fn every_guess_and_width_finds_the_fewest_that_meet() {
        for need in [1, 2, 7, 50, 55, 63, 200, 999] {
            for guess in [1, 10, 50, 54, 55, 56, 90, 400, 1000] {
                for width in [1, 2, 3, 8] {
                    let (f, rounds) = search(1, 1000, guess, width, need);
                    assert_eq!(
                        f.nodes,
                        Some(need),
                        "need {need} guess {guess} width {width}"
                    );
                    assert_eq!(f.misses, need - 1);
                    let asked: usize = rounds.iter().map(Vec::len).sum();
                    assert!(asked <= 40, "{asked} counts for need {need} guess {guess}");
                    let mut all: Vec<usize> = rounds.concat();
                    all.sort_unstable();
                    let n = all.len();
                    all.dedup();
                    assert_eq!(all.len(), n, "a count asked twice: {rounds:?}");
                }
            }
        }
    }

    #[test]
    fn the_bound_below_counts_as_a_miss_and_most_that_misses_is_none() {
        let (f, rounds) = search(40, 1000, 40, 1, 10);
        assert_eq!((f.nodes, f.misses), (Some(40), 39));
        assert_eq!(rounds, vec![vec![40]]);
        let (f, _) = search(1, 30, 5, 2, 31);
        assert_eq!((f.nodes, f.misses), (None, 30));
    }

    #[test]
    fn a_count_not_finished_stops_the_search_with_what_it_knows() {
        let mut rounds = 0;
        let f = fewest_near::<()>(1, 1000, 55, 2, |counts| {
            rounds += 1;
            Ok(counts
                .iter()
                .map(|&n| match n {
                    55 => Verdict::Meets,
                    _ => Verdict::Unknown,
                })
                .collect())
        })
        .unwrap();
        assert_eq!(rounds, 1);
        assert_eq!(f.nodes, Some(55));
        assert_eq!(f.misses, 0);
        assert_eq!(f.unknown, vec![54]);
    }
}
