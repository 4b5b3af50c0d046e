//! The one rule of how much a node may hold: the coordinator's placement and a victim's answer to a thief both ask it.

use crate::engine;
use crate::pool::Pool;
use crate::resources::{Resources, CPU};

/// A thief asks for what fits its free resources with this prefetch (and
/// one task beyond full), whatever `Config::prefetch_percent` says: that
/// knob shapes the coordinator's placement (tests raise it to place work
/// badly on purpose), while a steal should move only what the thief will
/// start soon, leaving the rest for other thieves.
pub(super) const STEAL_PREFETCH_PERCENT: u64 = 110;

/// At most this many tasks claimed by one node at once: bounds a node's queue
/// even for tasks that ask for no resources.
pub(super) fn claims_cap(total: &Resources) -> usize {
    (total.get(CPU).whole() as usize * 2).max(1) + 2
}

/// How far beyond its capacity a node may be handed tasks.
#[derive(Clone, Copy, Debug)]
pub(super) enum Prefetch {
    /// Only what fits what is free (the end of some work).
    None,
    /// Up to this percentage of each resource, and always one task beyond
    /// a full node (`--prefetch-percent`, and what a thief may take).
    Percent(u64),
    /// This many tasks beyond those that run at once (the node's measured
    /// depth, see the `pace` module).
    Depth(u64),
}

/// May a node with `total`, already holding `load`, be given one more task
/// asking for `req`, with this much `prefetch`?
pub(super) fn room(
    total: &Resources,
    load: &Resources,
    req: &Resources,
    prefetch: Prefetch,
) -> bool {
    if !Pool::ever_fits(total, req) {
        return false;
    }
    // For a depth: the node runs `slots` such tasks at once, and may hold
    // `slots + depth` of them, on every resource they use.
    let slots = match prefetch {
        Prefetch::Depth(_) => engine::copies(total, req).max(1),
        _ => 1,
    };
    req.iter().all(|(k, v)| {
        let t = total.get(k).0;
        let l = load.get(k).0;
        match prefetch {
            Prefetch::None => l + v.0 <= t,
            Prefetch::Percent(pct) => l + v.0 <= t * pct / 100 || l <= t,
            Prefetch::Depth(d) => {
                l + v.0 <= (t as u128 * (slots + d) as u128 / slots as u128) as u64
            }
        }
    })
}
