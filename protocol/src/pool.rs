//! One machine's resources: what is free, and which GPU devices hold how much.
//!
//! Both the single-machine engine and a mesh worker hand out resources
//! through a `Pool`, so the rules (counters never negative, fractions of a
//! GPU packed onto one device, whole GPUs only on whole devices) live once.

use std::sync::Arc;

use crate::resources::{Amount, Resources, GPU, MILLI};

/// Resources handed to one running task.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Grant {
    /// What the task asked for, all of it held while it runs.
    pub resources: Resources,
    /// Device indices of the `gpu` resource, when it asked for any.
    pub gpus: Vec<u32>,
}

/// One machine's resources and GPU devices, handed out as grants that
/// never drive a counter negative.
#[derive(Clone, Debug)]
pub struct Pool {
    /// Shared: a worker's every beat carries it (`Beat::total`).
    total: Arc<Resources>,
    free: Resources,
    /// Remaining thousandths per gpu device.
    gpus: Vec<u64>,
}

/// A GPU request some placement makes sense of: a part of one device, or
/// whole devices (more than one device but not whole ones fits nowhere).
fn placeable_gpus(g: Amount) -> bool {
    g.0 <= MILLI || g.0.is_multiple_of(MILLI)
}

impl Pool {
    /// A pool of these resources; `gpu = n` declares devices `0..n`.
    pub fn new(total: Resources) -> Pool {
        let ngpu = total.get(GPU).whole() as usize;
        Pool {
            free: total.clone(),
            total: Arc::new(total),
            gpus: vec![MILLI; ngpu],
        }
    }

    /// Everything the machine offers.
    pub fn total(&self) -> &Resources {
        &self.total
    }

    /// [`total`](Self::total), shared rather than copied.
    pub fn total_shared(&self) -> Arc<Resources> {
        self.total.clone()
    }

    /// What no grant holds now.
    pub fn free(&self) -> &Resources {
        &self.free
    }

    /// Resources held by grants.
    pub fn used(&self) -> Resources {
        self.total.less(&self.free)
    }

    /// Why a request can never be granted here, even when everything is free.
    pub fn never_fits(total: &Resources, request: &Resources) -> Vec<(String, Amount, Amount)> {
        let mut shortfall: Vec<(String, Amount, Amount)> = total
            .shortfall(request)
            .into_iter()
            .map(|(k, a, b)| (k.to_string(), a, b))
            .collect();
        let g = request.get(GPU);
        if shortfall.is_empty() && !placeable_gpus(g) {
            shortfall.push((GPU.to_string(), g, total.get(GPU)));
        }
        shortfall
    }

    /// Whether a request can be granted here at all, when everything is
    /// free: [`Pool::never_fits`] finds no reason, without naming any
    /// (asked for every node at every placement).
    pub fn ever_fits(total: &Resources, request: &Resources) -> bool {
        placeable_gpus(request.get(GPU)) && total.fits(request)
    }

    /// Whether `request` fits now: in the free counters and, for GPUs, in
    /// the room left on the devices.
    pub fn can_grant(&self, request: &Resources) -> bool {
        if !self.free.fits(request) {
            return false;
        }
        let g = request.get(GPU).0;
        if g == 0 {
            return true;
        }
        if g < MILLI {
            self.gpus.iter().any(|&left| left >= g)
        } else {
            let whole = (g / MILLI) as usize;
            self.gpus.iter().filter(|&&left| left == MILLI).count() >= whole
        }
    }

    /// Takes `request`, or returns `None` (changing nothing) when it does not fit now.
    pub fn grant(&mut self, request: &Resources) -> Option<Grant> {
        if !self.can_grant(request) {
            return None;
        }
        let took = self.free.take(request);
        debug_assert!(took, "can_grant() checked the counters");
        let g = request.get(GPU).0;
        let mut gpus = Vec::new();
        if g > 0 && g < MILLI {
            // Best fit: the device with the least room that still fits, so
            // fractions pack and whole devices stay free for whole requests.
            if let Some((d, _)) = self
                .gpus
                .iter()
                .enumerate()
                .filter(|(_, &left)| left >= g)
                .min_by_key(|(_, &left)| left)
            {
                self.gpus[d] -= g;
                gpus.push(d as u32);
            }
        } else if g >= MILLI {
            let mut want = (g / MILLI) as usize;
            for (d, left) in self.gpus.iter_mut().enumerate() {
                if want == 0 {
                    break;
                }
                if *left == MILLI {
                    *left = 0;
                    gpus.push(d as u32);
                    want -= 1;
                }
            }
        }
        Some(Grant {
            resources: request.clone(),
            gpus,
        })
    }

    /// Gives back what a grant held, counters and devices both.
    pub fn release(&mut self, grant: &Grant) {
        self.free.give(&grant.resources);
        let g = grant.resources.get(GPU).0;
        let per_device = if g < MILLI { g } else { MILLI };
        for &d in &grant.gpus {
            self.gpus[d as usize] += per_device;
        }
    }

    /// The part of [`Pool::check`] that needs no grants, for every step of
    /// the simulator: nothing is free beyond the total (a release of more
    /// than was granted), no device has more than one device of room.
    pub fn check_bounds(&self) -> Result<(), String> {
        for (k, v) in self.free.iter() {
            let total = self.total.get(k);
            if v > total {
                return Err(format!("resource {k}: {v:?} free of {total:?}"));
            }
        }
        self.check_devices()
    }

    fn check_devices(&self) -> Result<(), String> {
        if self.gpus.iter().any(|&g| g > MILLI) {
            return Err(format!(
                "a gpu has more than one device of room: {:?}",
                self.gpus
            ));
        }
        Ok(())
    }

    /// What is free plus `lent` (what the grants hold, as their holder
    /// counts it) is the total, for every resource: [`Pool::check`] without
    /// a pass over the grants.
    pub fn check_lent(&self, lent: &Resources) -> Result<(), String> {
        for (k, v) in self.total.iter() {
            let sum = Amount(self.free.get(k).0 + lent.get(k).0);
            if sum != v {
                return Err(format!(
                    "resource {k}: free + in use = {sum:?}, total {v:?}"
                ));
            }
        }
        if let Some((k, v)) = lent
            .iter()
            .find(|(k, v)| !v.is_zero() && self.total.get(k).is_zero())
        {
            return Err(format!("resource {k}: {v:?} in use of none"));
        }
        self.check_devices()
    }

    /// What is free plus what `grants` hold is the total, for every resource.
    pub fn check<'a>(&self, grants: impl Iterator<Item = &'a Grant>) -> Result<(), String> {
        let mut lent = Resources::new();
        for g in grants {
            lent.give(&g.resources);
        }
        self.check_lent(&lent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::parse_resources;

    #[test]
    fn what_a_holder_counts_as_lent_is_held_against_the_pool() {
        let r = |s: &str| parse_resources(s).unwrap();
        let mut pool = Pool::new(r("cpu=8,mem=16GiB,gpu=2"));
        let a = pool.grant(&r("cpu=2,mem=4GiB")).unwrap();
        let b = pool.grant(&r("cpu=1,gpu=1")).unwrap();
        let mut lent = Resources::new();
        lent.give(&a.resources);
        lent.give(&b.resources);
        assert_eq!(pool.check_lent(&lent), Ok(()));
        // One the pool never gave, or of a resource the node does not have.
        let mut extra = lent.clone();
        extra.give(&r("cpu=1"));
        assert!(pool.check_lent(&extra).is_err());
        assert!(pool.check_lent(&r("cpu=3,mem=4GiB,gpu=1,fpga=1")).is_err());
        pool.release(&b);
        lent.take_saturating(&b.resources);
        assert_eq!(pool.check_lent(&lent), Ok(()));
    }

    #[test]
    fn a_request_ever_fits_exactly_where_no_reason_says_it_never_does() {
        let r = |s: &str| parse_resources(s).unwrap();
        let cases = [
            ("cpu=4,gpu=2", "cpu=1", true),
            ("cpu=4,gpu=2", "cpu=4,gpu=2", true),
            ("cpu=4,gpu=2", "cpu=5", false),
            ("cpu=4", "cpu=1,gpu=1", false),
            ("cpu=4,gpu=4", "gpu=0.5", true),
            // More than one device but not whole ones: placed nowhere.
            ("cpu=4,gpu=4", "gpu=1.5", false),
            ("cpu=4,mem=8GiB", "mem=16GiB", false),
        ];
        for (total, req, fits) in cases {
            let (t, q) = (r(total), r(req));
            assert_eq!(Pool::ever_fits(&t, &q), fits, "{req} on {total}");
            assert_eq!(
                Pool::never_fits(&t, &q).is_empty(),
                fits,
                "{req} on {total}"
            );
        }
    }

    #[test]
    fn checks_catch_a_grant_released_twice_or_forgotten() {
        let mut pool = Pool::new(parse_resources("cpu=4,gpu=2").unwrap());
        let a = pool
            .grant(&parse_resources("cpu=1,gpu=1").unwrap())
            .unwrap();
        let b = pool.grant(&parse_resources("cpu=2").unwrap()).unwrap();
        pool.check_bounds().unwrap();
        pool.check([&a, &b].into_iter()).unwrap();
        // A run the caller forgot about: what is lent no longer adds up.
        let err = pool.check([&a].into_iter()).unwrap_err();
        assert!(err.contains("cpu"), "{err}");
        pool.release(&b);
        pool.check([&a].into_iter()).unwrap();
        // Released twice: more free than the node has, and a device with
        // more than one device of room.
        pool.release(&a);
        pool.release(&a);
        assert!(pool.check_bounds().is_err());
        assert!(pool.check(std::iter::empty()).is_err());
    }
}
