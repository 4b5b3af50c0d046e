//! Resource vectors: named quantities (cpu, mem, gpu, or any label) in fixed point.
//!
//! Amounts are integers in thousandths of a unit so that fractional requests
//! (`gpu = 0.5`) add and subtract exactly: a counter that is charged and then
//! released returns to the same value, and can never drift below zero.

use std::fmt;

use compact_str::CompactString;
use serde::{Deserialize, Serialize};

/// Thousandths of a unit per unit.
pub const MILLI: u64 = 1000;

/// The resource whose amounts are bytes and are shown as sizes.
pub const MEM: &str = "mem";
/// The resource every task asks for unless it says otherwise.
pub const CPU: &str = "cpu";
/// The indexed resource: a node declares devices 0..n, a task gets concrete indices.
pub const GPU: &str = "gpu";

/// A quantity in thousandths of a unit (bytes for `mem`).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct Amount(pub u64);

impl Amount {
    /// Nothing of a resource.
    pub const ZERO: Amount = Amount(0);

    /// `n` whole units.
    pub fn units(n: u64) -> Amount {
        Amount(n.saturating_mul(MILLI))
    }

    /// Whole units, rounded down.
    pub fn whole(self) -> u64 {
        self.0 / MILLI
    }

    /// In units, fractions kept (`0.5` cores).
    pub fn as_f64(self) -> f64 {
        self.0 as f64 / MILLI as f64
    }

    /// True for nothing at all.
    pub fn is_zero(self) -> bool {
        self.0 == 0
    }

    /// The amount as a decimal string in the resource's own unit (`0.5`, `2`, `536870912`).
    pub fn to_plain(self) -> String {
        let whole = self.0 / MILLI;
        let frac = self.0 % MILLI;
        if frac == 0 {
            whole.to_string()
        } else {
            let s = format!("{whole}.{frac:03}");
            s.trim_end_matches('0').to_string()
        }
    }

    /// The amount for display, with byte units for `mem`.
    pub fn display(self, name: &str) -> String {
        if name == MEM {
            format_bytes(self.whole())
        } else {
            self.to_plain()
        }
    }
}

/// Why a quantity could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AmountError {
    /// Not a number (nor, for `mem`, a size).
    #[error("`{0}` is not a valid quantity, expected a number such as 2 or 0.5, or for mem a size such as 512MiB or 4G")]
    Malformed(String),
    /// Below zero.
    #[error("`{0}` is negative, expected zero or more")]
    Negative(String),
    /// More than three decimals: finer than a thousandth.
    #[error("`{0}` has more than three decimals, expected at most three")]
    TooPrecise(String),
    /// A `mem` size too large to hold in thousandths of a byte.
    #[error("`{0}` is too large")]
    TooLarge(String),
}

/// Parses a quantity for resource `name`: a decimal number with up to three
/// decimals, or for `mem` a size with an optional unit (B, K/KB/KiB, M, G, T;
/// K, M, G, T alone are binary, as SLURM and PBS read them).
pub fn parse_amount(name: &str, text: &str) -> Result<Amount, AmountError> {
    let t = text.trim();
    if t.starts_with('-') {
        return Err(AmountError::Negative(text.to_string()));
    }
    if name == MEM {
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kib" => 1 << 10,
            "kb" => 1_000,
            "m" | "mib" => 1 << 20,
            "mb" => 1_000_000,
            "g" | "gib" => 1 << 30,
            "gb" => 1_000_000_000,
            "t" | "tib" => 1 << 40,
            "tb" => 1_000_000_000_000,
            _ => return Err(AmountError::Malformed(text.to_string())),
        };
        let milli = parse_milli(num).ok_or_else(|| AmountError::Malformed(text.to_string()))?;
        // milli is thousandths of `unit`; bytes = milli * mult / 1000
        let bytes = (milli as u128 * mult as u128) / MILLI as u128;
        let stored = bytes
            .checked_mul(MILLI as u128)
            .filter(|b| *b <= u64::MAX as u128)
            .ok_or_else(|| AmountError::TooLarge(text.to_string()))?;
        return Ok(Amount(stored as u64));
    }
    match parse_milli(t) {
        Some(m) => Ok(Amount(m)),
        None => {
            let decimals = t.split_once('.').map(|(_, f)| f.len()).unwrap_or(0);
            if decimals > 3 && t.chars().all(|c| c.is_ascii_digit() || c == '.') {
                Err(AmountError::TooPrecise(text.to_string()))
            } else {
                Err(AmountError::Malformed(text.to_string()))
            }
        }
    }
}

/// Reads `12`, `0.5`, `1.250` as thousandths.
fn parse_milli(t: &str) -> Option<u64> {
    let (whole, frac) = match t.split_once('.') {
        Some((w, f)) => (w, f),
        None => (t, ""),
    };
    if whole.is_empty() && frac.is_empty() {
        return None;
    }
    if !whole.chars().all(|c| c.is_ascii_digit()) || !frac.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    if frac.len() > 3 {
        return None;
    }
    let w: u64 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let mut f: u64 = if frac.is_empty() {
        0
    } else {
        frac.parse().ok()?
    };
    for _ in frac.len()..3 {
        f *= 10;
    }
    w.checked_mul(MILLI)?.checked_add(f)
}

/// A stage's shortfall in words (`cpu=8 asked, 2 on the largest node`):
/// `have` says where (`here`, `on the largest node`). A name asked that no
/// machine offers is said so, with the offered name closest to it, as
/// names are case-sensitive (`TOKEN=1 asked, no node offers TOKEN: did
/// you mean token?`).
pub fn shortfall_words(
    shortfall: &[(String, Amount, Amount)],
    offered: &[String],
    have: &str,
) -> String {
    shortfall
        .iter()
        .map(|(k, want, got)| {
            if offered.iter().any(|o| o == k) || k == "cpu" || k == MEM {
                return format!("{k}={} asked, {} {have}", want.display(k), got.display(k));
            }
            let mut words = format!("{k}={} asked, no node offers {k}", want.display(k));
            let closest = offered
                .iter()
                .map(|o| {
                    (
                        strsim::normalized_damerau_levenshtein(
                            &k.to_lowercase(),
                            &o.to_lowercase(),
                        ),
                        o,
                    )
                })
                .filter(|(score, _)| *score >= 0.6)
                .max_by(|a, b| a.0.total_cmp(&b.0));
            if let Some((_, o)) = closest {
                words.push_str(&format!(": did you mean {o}?"));
            }
            words
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// A byte count in binary units, as people read it (`100B`, `512MiB`, `1.5GiB`).
pub fn format_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b}B")
    } else if v.fract() == 0.0 {
        format!("{v:.0}{}", UNITS[u])
    } else {
        format!("{v:.1}{}", UNITS[u])
    }
}

/// A resource vector: named amounts, sorted by name, no zero entries.
///
/// Names are stored inline (up to 24 bytes): the scheduler compares names
/// on every placement, and a name behind its own pointer made each compare
/// a likely cache miss. On the wire a name is a plain string.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Resources(Vec<(CompactString, Amount)>);

impl Resources {
    /// No resources; usable in constants.
    pub const EMPTY: Resources = Resources(Vec::new());

    /// No resources.
    pub fn new() -> Resources {
        Resources(Vec::new())
    }

    /// The vector of these named amounts: a later name overrides an earlier
    /// one, zeros are left out.
    pub fn from_pairs<I: IntoIterator<Item = (String, Amount)>>(pairs: I) -> Resources {
        let mut r = Resources::new();
        for (k, v) in pairs {
            r.set(&k, v);
        }
        r
    }

    /// Where `name` is, or where it would go. A vector has a handful of
    /// names, a few bytes each: a scan that compares bytes in place beats a
    /// binary search that calls memcmp for every probe (the scheduler and
    /// the simulator look names up several times per task).
    fn find(&self, name: &str) -> Result<usize, usize> {
        for (i, (k, _)) in self.0.iter().enumerate() {
            match k.bytes().cmp(name.bytes()) {
                std::cmp::Ordering::Less => {}
                std::cmp::Ordering::Equal => return Ok(i),
                std::cmp::Ordering::Greater => return Err(i),
            }
        }
        Err(self.0.len())
    }

    /// The amount of `name` (zero when it has none).
    pub fn get(&self, name: &str) -> Amount {
        match self.find(name) {
            Ok(i) => self.0[i].1,
            Err(_) => Amount::ZERO,
        }
    }

    /// Sets `name` to `amount`; zero removes it.
    pub fn set(&mut self, name: &str, amount: Amount) {
        match self.find(name) {
            Ok(i) if amount.is_zero() => {
                self.0.remove(i);
            }
            Ok(i) => self.0[i].1 = amount,
            Err(_) if amount.is_zero() => {}
            Err(i) => self.0.insert(i, (name.into(), amount)),
        }
    }

    /// Each name and its amount, in name order (never a zero).
    pub fn iter(&self) -> impl Iterator<Item = (&str, Amount)> {
        self.0.iter().map(|(k, v)| (k.as_str(), *v))
    }

    /// True when it has nothing of any resource.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// True when every amount asked for is available here.
    pub fn fits(&self, request: &Resources) -> bool {
        request.iter().all(|(k, v)| self.get(k) >= v)
    }

    /// The names whose request exceeds what is here, with both amounts.
    pub fn shortfall<'a>(&self, request: &'a Resources) -> Vec<(&'a str, Amount, Amount)> {
        request
            .iter()
            .filter(|(k, v)| self.get(k) < *v)
            .map(|(k, v)| (k, v, self.get(k)))
            .collect()
    }

    /// Takes `request` out of this vector. Returns false, changing nothing,
    /// when it does not fit: a counter never goes below zero.
    #[must_use]
    pub fn take(&mut self, request: &Resources) -> bool {
        if !self.fits(request) {
            return false;
        }
        for (k, v) in request.iter() {
            // Keep the name even at zero so the vector still says the resource exists.
            match self.find(k) {
                Ok(i) => self.0[i].1 = Amount(self.0[i].1 .0 - v.0),
                Err(_) => unreachable!("fits() checked every name"),
            }
        }
        true
    }

    /// Takes what it can of `request`, stopping each amount at zero: for
    /// bookkeeping of what was handed out, where an amount may already be gone.
    pub fn take_saturating(&mut self, request: &Resources) {
        for (k, v) in request.iter() {
            if let Ok(i) = self.find(k) {
                self.0[i].1 = Amount(self.0[i].1 .0.saturating_sub(v.0));
            }
        }
    }

    /// What `part` leaves of this vector, name by name (zeros left out):
    /// one walk down both, as both are sorted by name, where a lookup of
    /// each name (with an insertion for each result) was 3% of a
    /// simulated farm's beats. `part` holds no more of any name than this.
    pub fn less(&self, part: &Resources) -> Resources {
        let mut rest = Vec::with_capacity(self.0.len());
        let mut of = part.0.iter().peekable();
        for (k, v) in &self.0 {
            while of.next_if(|(p, _)| p < k).is_some() {}
            let taken = of.next_if(|(p, _)| p == k).map_or(0, |(_, a)| a.0);
            if v.0 != taken {
                rest.push((k.clone(), Amount(v.0 - taken)));
            }
        }
        Resources(rest)
    }

    /// Returns `request` to this vector.
    pub fn give(&mut self, request: &Resources) {
        for (k, v) in request.iter() {
            match self.find(k) {
                Ok(i) => self.0[i].1 = Amount(self.0[i].1 .0.saturating_add(v.0)),
                Err(i) => self.0.insert(i, (k.into(), v)),
            }
        }
    }
}

impl fmt::Display for Resources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (k, v)) in self.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{k}={}", v.display(k))?;
        }
        Ok(())
    }
}

/// Parses `cpu=4,mem=8GiB,gpu=2,token=1` (the `--resources` flag).
pub fn parse_resources(text: &str) -> Result<Resources, ResourceSpecError> {
    let mut r = Resources::new();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (k, v) = item
            .split_once('=')
            .ok_or_else(|| ResourceSpecError::NoValue(item.to_string()))?;
        let k = k.trim();
        if !valid_resource_name(k) {
            return Err(ResourceSpecError::BadName(k.to_string()));
        }
        let amount = parse_amount(k, v).map_err(|e| ResourceSpecError::Amount(k.to_string(), e))?;
        r.0.retain(|(n, _)| n != k);
        let pos = r.0.partition_point(|(n, _)| n.as_str() < k);
        r.0.insert(pos, (k.into(), amount));
    }
    Ok(r)
}

/// Resource names are short identifiers, so they can become environment variable names.
pub fn valid_resource_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        && name.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
}

/// Why a resource list (`cpu=4,mem=8GiB`) could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResourceSpecError {
    /// An item with no `=amount`.
    #[error("`{0}` has no value, expected name=amount, e.g. gpu=2")]
    NoValue(String),
    #[error(
        "`{0}` is not a valid resource name, expected a letter, then letters, digits, `_` and `-`"
    )]
    /// A name that is not a resource name (see [`valid_resource_name`]).
    BadName(String),
    /// The named resource's amount could not be read.
    #[error("resource `{0}`: {1}")]
    Amount(String, AmountError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shortfall_names_a_resource_no_node_offers_and_the_closest_one() {
        let offered = vec!["cpu".to_string(), "mem".to_string(), "token".to_string()];
        let short = |k: &str, want: u64, have: u64| {
            (k.to_string(), Amount::units(want), Amount::units(have))
        };
        assert_eq!(
            shortfall_words(&[short("cpu", 8, 2)], &offered, "on the largest node"),
            "cpu=8 asked, 2 on the largest node"
        );
        assert_eq!(
            shortfall_words(&[short("TOKEN", 1, 0)], &offered, "here"),
            "TOKEN=1 asked, no node offers TOKEN: did you mean token?"
        );
        // Nothing near: no guess.
        assert_eq!(
            shortfall_words(&[short("license", 1, 0)], &offered, "here"),
            "license=1 asked, no node offers license"
        );
    }

    #[test]
    fn amounts_parse_exactly() {
        assert_eq!(parse_amount("cpu", "2").unwrap(), Amount(2000));
        assert_eq!(parse_amount("gpu", "0.5").unwrap(), Amount(500));
        assert_eq!(parse_amount("gpu", ".25").unwrap(), Amount(250));
        assert_eq!(
            parse_amount("mem", "512MiB").unwrap(),
            Amount(512 * 1024 * 1024 * 1000)
        );
        assert_eq!(
            parse_amount("mem", "4G").unwrap(),
            Amount(4 << 30).0.checked_mul(1000).map(Amount).unwrap()
        );
        assert_eq!(parse_amount("mem", "1.5KiB").unwrap(), Amount(1536 * 1000));
        assert!(matches!(
            parse_amount("cpu", "-1"),
            Err(AmountError::Negative(_))
        ));
        assert!(matches!(
            parse_amount("cpu", "0.0001"),
            Err(AmountError::TooPrecise(_))
        ));
        assert!(matches!(
            parse_amount("cpu", "two"),
            Err(AmountError::Malformed(_))
        ));
        assert!(matches!(
            parse_amount("mem", "5 parsecs"),
            Err(AmountError::Malformed(_))
        ));
    }

    #[test]
    fn take_and_give_never_go_negative() {
        let mut node = parse_resources("cpu=2,gpu=1").unwrap();
        let half = parse_resources("gpu=0.5").unwrap();
        assert!(node.take(&half));
        assert!(node.take(&half));
        assert!(!node.take(&half), "a third half gpu does not fit");
        assert_eq!(node.get("gpu"), Amount::ZERO);
        node.give(&half);
        node.give(&half);
        assert_eq!(node.get("gpu"), Amount::units(1));
        let tokens = parse_resources("token=1").unwrap();
        assert!(!node.take(&tokens), "a resource the node lacks never fits");
    }

    #[test]
    fn display_round_trips() {
        let r = parse_resources("mem=512MiB,cpu=1.5,token=3").unwrap();
        assert_eq!(r.to_string(), "cpu=1.5,mem=512MiB,token=3");
        assert_eq!(parse_resources(&r.to_string()).unwrap(), r);
    }

    #[test]
    fn what_a_part_leaves_is_counted_name_by_name_without_zeros() {
        let total = parse_resources("cpu=8,gpu=2,mem=16GiB,token=3").unwrap();
        // A pool's free vector keeps names at zero; names may be missing too.
        let mut free = parse_resources("cpu=3,mem=16GiB").unwrap();
        free.0.insert(1, ("gpu".into(), Amount::ZERO));
        let used = total.less(&free);
        assert_eq!(used.to_string(), "cpu=5,gpu=2,token=3");
        let mut by_lookup = Resources::new();
        for (k, v) in total.iter() {
            by_lookup.set(k, Amount(v.0 - free.get(k).0));
        }
        assert_eq!(used, by_lookup);
        assert!(total.less(&total).is_empty());
        assert_eq!(total.less(&Resources::new()), total);
    }
}
